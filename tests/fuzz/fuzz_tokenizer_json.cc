// libFuzzer target: HF tokenizer.json parsing (tokenizer folders polykvd loads with a model),
// then a short encode/decode with whatever loaded.
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "polykv/model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = polykv::fuzz::TempFolder() + "/tokenizer.json";
  polykv::fuzz::WriteNamed(path, data, size);
  auto tok = polykv::model::LoadTokenizer(path);
  if (!tok.ok()) return 0;
  auto ids = (*tok)->Encode("Hello world! 123 <|endoftext|> caf\xc3\xa9", true);
  if (ids.ok()) (void)(*tok)->Decode(*ids);
  (void)(*tok)->Fingerprint();
  return 0;
}
