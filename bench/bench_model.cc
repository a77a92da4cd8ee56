// bench_model: SmolLM2-135M (or any model) prefill tokens/s at 512 and 2048 tokens and decode
// tokens/s, with 1 thread (baseline) and all cores; plus load time and resident memory.
// Usage: bench_model [--model PATH] (default: env POLYKV_SMOLLM2_GGUF) [--decode-tokens N]
//                    [--text FILE]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "polykv/model/llama.h"

namespace {

using polykv::model::KvCache;
using polykv::model::LlamaModel;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// VmRSS / VmHWM of this process in MiB.
double ProcStatusMiB(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::atof(line.c_str() + std::string(key).size()) / 1024.0;
  return 0;
}

struct Figures {
  double prefill512 = 0, prefill2048 = 0, decode = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_model: prefill / decode throughput of the libtorch Llama runtime"};
  std::string model_path = std::getenv("POLYKV_SMOLLM2_GGUF") ? std::getenv("POLYKV_SMOLLM2_GGUF") : "";
  int decode_tokens = 64;
  std::string text_path = "data/wikitext-2/wiki.test.raw";
  app.add_option("--model", model_path, "Model (.gguf or HF folder); default $POLYKV_SMOLLM2_GGUF");
  app.add_option("--decode-tokens", decode_tokens, "Tokens to decode after a 512-token prefill");
  app.add_option("--text", text_path, "Document text to tokenize (default: WikiText-2 test, "
                 "relative to the repository root)");
  CLI11_PARSE(app, argc, argv);
  if (model_path.empty()) {
    std::fprintf(stderr, "error: no model: pass --model or set POLYKV_SMOLLM2_GGUF\n");
    return 1;
  }
  const int all = std::max(1u, std::thread::hardware_concurrency());
  polykv::model::LoadOptions opts;
  opts.threads = all;
  const double t0 = Now();
  auto loaded = LlamaModel::Load(model_path, opts);
  const double load_s = Now() - t0;
  if (!loaded.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(loaded.status().message()).c_str());
    return 1;
  }
  const double rss = ProcStatusMiB("VmRSS:"), peak = ProcStatusMiB("VmHWM:");
  LlamaModel& m = **loaded;

  // Document tokens: WikiText-2 through the model's tokenizer, else a fixed id pattern.
  std::vector<int32_t> doc;
  if (m.tokenizer() != nullptr) {
    std::ifstream in(text_path, std::ios::binary);
    std::string text(40000, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in.gcount()));
    auto ids = m.tokenizer()->Encode(text, false);
    if (ids.ok()) doc = *ids;
  }
  for (int64_t i = static_cast<int64_t>(doc.size()); i < 2048; ++i)
    doc.push_back(static_cast<int32_t>((i * 7919 + 13) % m.config().vocab));
  doc.resize(2048);

  auto run = [&](int threads) -> Figures {
    polykv::model::SetComputeThreads(threads);
    Figures f;
    for (int64_t n : {512, 2048}) {
      const double s = Now();
      auto r = m.Prefill(absl::MakeConstSpan(doc.data(), n), 512);
      const double dt = Now() - s;
      if (!r.ok()) {
        std::fprintf(stderr, "error: %s\n", std::string(r.status().message()).c_str());
        std::exit(1);
      }
      (n == 512 ? f.prefill512 : f.prefill2048) = n / dt;
    }
    KvCache cache = m.NewCache(512 + decode_tokens);
    if (!m.Forward(absl::MakeConstSpan(doc.data(), 512), cache).ok()) std::exit(1);
    polykv::model::SamplingOptions so;
    so.max_new_tokens = decode_tokens;
    so.stop_at_eos = false;
    auto g = m.Generate(cache, {}, so);
    if (!g.ok()) std::exit(1);
    // After the first token (which includes recomputing the last cached token) each returned
    // token costs one decode step (its K/V are appended to the cache).
    const double decode_ms = g->total_ms - g->first_token_ms;
    f.decode = g->tokens.size() * 1000.0 / decode_ms;
    return f;
  };
  const Figures one = run(1);
  const Figures many = run(all);

  const auto& c = m.config();
  std::printf("model: %s\n  %d layers, hidden %d, heads %d/%d kv, vocab %d, dtype %s, device %s\n",
              model_path.c_str(), c.layers, c.hidden, c.heads, c.kv_heads, c.vocab,
              c10::toString(m.dtype()), m.device().str().c_str());
  std::printf("load: %.2f s; RSS after load %.0f MiB (peak during load %.0f MiB)\n\n", load_s, rss, peak);
  std::printf("%-32s %-10s %14s %14s %8s\n", "figure", "unit", "1 thread", "all threads", "ratio");
  std::printf("%-32s %-10s %14s %14d %8s\n", "threads", "", "1", all, "");
  const auto row = [](const char* name, double base, double v) {
    std::printf("%-32s %-10s %14.1f %14.1f %7.2fx\n", name, "tokens/s", base, v, v / base);
  };
  row("prefill 512 tokens", one.prefill512, many.prefill512);
  row("prefill 2048 tokens", one.prefill2048, many.prefill2048);
  char name[64];
  std::snprintf(name, sizeof name, "decode %d tokens after 512", decode_tokens);
  row(name, one.decode, many.decode);
  std::printf("\nprefill 2048 tokens wall time: %.2f s (1 thread), %.2f s (%d threads)\n",
              2048 / one.prefill2048, 2048 / many.prefill2048, all);
  return 0;
}
