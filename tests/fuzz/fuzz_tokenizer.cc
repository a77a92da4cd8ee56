// libFuzzer target: the tokenizers on arbitrary text and ids — byte-level BPE (GPT-2
// vocabulary) and SentencePiece BPE (llama vocabulary), both from tests/data/tokenizer.
// Properties: Encode never fails on valid UTF-8 and BPE round-trips it exactly
// (Decode(Encode(t)) == t); Decode of any ids either succeeds or names an id out of range.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "polykv/ipc/protocol.h"
#include "polykv/model/tokenizer.h"

namespace pm = polykv::model;

namespace {

std::unique_ptr<pm::Tokenizer> Load(const char* name) {
  auto t = pm::LoadTokenizer(std::string(POLYKV_TEST_DATA_DIR) + "/tokenizer/" + name);
  if (!t.ok()) {
    std::fprintf(stderr, "cannot load %s: %s\n", name, std::string(t.status().message()).c_str());
    std::abort();
  }
  return *std::move(t);
}

const pm::Tokenizer& Bpe() {
  static auto t = Load("ggml-vocab-gpt-2.gguf");
  return *t;
}
const pm::Tokenizer& Spm() {
  static auto t = Load("ggml-vocab-llama-spm.gguf");
  return *t;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)Bpe();
  (void)Spm();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const bool utf8 = polykv::ipc::ValidateUtf8(text, "text").ok();
  for (const pm::Tokenizer* tok : {&Bpe(), &Spm()}) {
    for (bool bos : {false, true}) {
      auto ids = tok->Encode(text, bos);
      if (utf8) {
        POLYKV_FUZZ_CHECK(ids.ok(), "Encode failed on valid UTF-8: %s",
                          std::string(ids.status().message()).c_str());
      }
      if (!ids.ok()) continue;
      for (int32_t id : *ids) {
        POLYKV_FUZZ_CHECK(id >= 0 && id < tok->vocab_size(), "id %d outside the vocabulary", id);
      }
      auto back = tok->Decode(*ids);
      POLYKV_FUZZ_CHECK(back.ok(), "Decode of Encode failed");
      if (tok == &Bpe() && utf8 && !bos) {
        POLYKV_FUZZ_CHECK(*back == text, "byte-level BPE did not round-trip %zu bytes", size);
      }
    }
  }
  // The same bytes as token ids (some out of range on purpose).
  std::vector<int32_t> ids(size / 4);
  if (!ids.empty()) std::memcpy(ids.data(), data, ids.size() * 4);
  for (int32_t& id : ids) id = static_cast<int32_t>(static_cast<uint32_t>(id) % 70000u) - 100;
  for (const pm::Tokenizer* tok : {&Bpe(), &Spm()}) {
    auto text_back = tok->Decode(ids);
    bool in_range = true;
    for (int32_t id : ids) in_range = in_range && id >= 0 && id < tok->vocab_size();
    POLYKV_FUZZ_CHECK(text_back.ok() == in_range, "Decode status does not match the id range");
  }
  return 0;
}
