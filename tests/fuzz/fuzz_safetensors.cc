// libFuzzer target: the safetensors reader (HF model folders polykvd opens for operators):
// header validation and reads of every small tensor (F32/F16/BF16 into libtorch tensors).
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "safetensors.h"

namespace pm = polykv::model;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static polykv::fuzz::MemFile file;
  auto st = pm::SafetensorsFile::Open(file.Write(data, size));
  if (!st.ok()) return 0;
  for (const pm::SafetensorsEntry& e : (*st)->entries()) {
    POLYKV_FUZZ_CHECK((*st)->Find(e.name) == &e || (*st)->Find(e.name) != nullptr,
                      "listed entry not found");
    if (e.nbytes > (1u << 20)) continue;
    auto t = (*st)->Read(e);
    if (t.ok()) {
      POLYKV_FUZZ_CHECK(static_cast<uint64_t>(t->numel() * t->element_size()) == e.nbytes,
                        "tensor of %lld bytes for an entry of %llu",
                        static_cast<long long>(t->numel() * t->element_size()),
                        static_cast<unsigned long long>(e.nbytes));
    }
  }
  return 0;
}
