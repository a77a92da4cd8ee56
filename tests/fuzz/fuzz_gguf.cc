// libFuzzer target: the GGUF reader (model files polykvd opens for operators): validation,
// every metadata getter, dequantization of every small tensor of a known type, and the
// tokenizer built from GGUF metadata (which then encodes and decodes a sample).
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "polykv/model/gguf.h"
#include "polykv/model/tokenizer.h"

namespace pm = polykv::model;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static polykv::fuzz::MemFile file;
  auto gguf = pm::GgufFile::Open(file.Write(data, size));
  if (!gguf.ok()) return 0;
  const pm::GgufFile& g = **gguf;
  for (const std::string& key : g.Keys()) {
    POLYKV_FUZZ_CHECK(g.Has(key), "listed key %s not found", key.c_str());
    (void)g.GetString(key);
    (void)g.GetInt(key);
    (void)g.GetFloat(key);
    (void)g.GetBool(key);
    (void)g.GetStringArray(key);
    (void)g.GetFloatArray(key);
    (void)g.GetIntArray(key);
  }
  std::vector<float> out;
  for (const pm::GgufTensorInfo& t : g.tensors()) {
    POLYKV_FUZZ_CHECK(g.FindTensor(t.name) != nullptr, "listed tensor not found");
    auto bytes = g.TensorData(t);
    POLYKV_FUZZ_CHECK(bytes.size() == t.nbytes, "tensor data size %zu != nbytes %llu", bytes.size(),
                      static_cast<unsigned long long>(t.nbytes));
    const int64_t n = t.elements();
    if (n <= 0 || n > (1 << 16)) continue;
    out.resize(static_cast<size_t>(n));
    (void)pm::DequantizeToF32(t.type, bytes.data(), bytes.size(), n, out.data());
  }
  auto tok = pm::TokenizerFromGguf(g);
  if (tok.ok()) {
    auto ids = (*tok)->Encode("Hello world! <|im_start|>user 123 caf\xc3\xa9", true);
    if (ids.ok()) (void)(*tok)->Decode(*ids);
    (void)(*tok)->Fingerprint();
  }
  return 0;
}
