// The benchmarks' model and document: a model loaded for a benchmark, and the daemon
// benchmarks' CREATE_POOL request for the demo article with SmolLM2-135M when
// $POLYKV_SMOLLM2_GGUF names it, else 256 token ids for stories260K.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "polykv/ipc/protocol.h"
#include "polykv/model/llama.h"

namespace polykv::bench {

/// The source tree (for data/ and tests/data/): $POLYKV_SOURCE_DIR, else from this file.
inline std::string SourceDir() {
  const char* env = std::getenv("POLYKV_SOURCE_DIR");
  return env != nullptr ? std::string(env)
                        : std::filesystem::path(__FILE__).parent_path().parent_path().string();
}

/// `path` loaded with `threads` compute threads (0 = all cores); nullptr after printing
/// "<what>: <status>" on stderr.
inline std::unique_ptr<model::LlamaModel> LoadModel(const std::string& path, int threads,
                                                    const char* what) {
  model::LoadOptions lo;
  lo.threads = threads;
  auto m = model::LlamaModel::Load(path, lo);
  if (!m.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, m.status().ToString().c_str());
    return nullptr;
  }
  return *std::move(m);
}

/// A CREATE_POOL request with `codec` for the benchmark document; `label` says which.
inline ipc::Request DocumentCreateRequest(const std::string& codec, std::string* label) {
  const std::string src = SourceDir();
  ipc::Request create;
  create.type = ipc::MessageType::kCreatePool;
  create.codec = codec;
  const char* gguf = std::getenv("POLYKV_SMOLLM2_GGUF");
  if (gguf != nullptr && std::filesystem::exists(gguf)) {
    create.model = gguf;
    std::ifstream f(src + "/data/wikitext-2/robert_boulter.txt");
    std::stringstream ss;
    ss << f.rdbuf();
    create.document = ss.str();
    *label = "SmolLM2-135M Q4_1, robert_boulter.txt";
  } else {
    create.model = src + "/tests/data/models/stories260K";
    for (int i = 0; i < 256; ++i) create.token_ids.push_back(i == 0 ? 1 : (i * 37 + 5) % 500 + 3);
    *label = "stories260K, 256 token ids (set POLYKV_SMOLLM2_GGUF for SmolLM2)";
  }
  return create;
}

}  // namespace polykv::bench
