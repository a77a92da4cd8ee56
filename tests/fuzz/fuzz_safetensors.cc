// libFuzzer target: the safetensors reader (HF model folders polykvd opens for operators):
// header validation and reads of every small tensor (F32/F16/BF16 converted to f32).
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
    auto t = (*st)->ReadF32(e);
    if (t.ok()) {
      const uint64_t elem = e.dtype == "F32" ? 4 : 2;
      POLYKV_FUZZ_CHECK(static_cast<uint64_t>(t->size()) * elem == e.nbytes,
                        "%llu values for an entry of %llu bytes",
                        static_cast<unsigned long long>(t->size()),
                        static_cast<unsigned long long>(e.nbytes));
    }
  }
  return 0;
}
