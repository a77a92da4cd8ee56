// The codec's BMI2 variant (compiled with -mavx2 -mfma -mf16c -mbmi2; called only on CPUs
// with them): packed key codes unpacked with PDEP, 8 values per instruction.
#include <immintrin.h>

#include <cstring>

#include "codec_internal.h"

namespace polykv::kernels::codec {
namespace {

// n (< 8 or a group near the end of the buffer) values as math::UnpackKeyCodes does: a local
// copy, so that no inline function compiled with BMI2 is shared with scalar code.
void UnpackFew(const uint8_t* in, int n, int bits, int8_t* q) {
  const int off = 1 << (bits - 1);
  const uint64_t mask = (uint64_t{1} << bits) - 1u;
  const int nb = (n * bits + 7) / 8;
  uint64_t w = 0;
  for (int b = 0; b < nb; ++b) w |= static_cast<uint64_t>(in[b]) << (8 * b);
  for (int k = 0; k < n; ++k)
    q[k] = static_cast<int8_t>(static_cast<int>((w >> (k * bits)) & mask) - off);
}

}  // namespace

void UnpackKeyVectorsBmi2(const uint8_t* codes, int64_t n, int32_t head_dim, int32_t bits,
                          int8_t* q) {
  const int64_t vb = (static_cast<int64_t>(head_dim) * bits + 7) / 8;
  const uint8_t* end = codes + n * vb;
  const uint64_t ones = 0x0101010101010101ull;
  const uint64_t mask = ones * ((1ull << bits) - 1);
  const uint64_t bias = ones * static_cast<uint64_t>(128 - (1 << (bits - 1)));
  const uint64_t sign = ones * 0x80ull;
  const int groups = head_dim / 8, tail = head_dim % 8;
  for (int64_t v = 0; v < n; ++v) {
    const uint8_t* in = codes + v * vb;
    int8_t* out = q + v * head_dim;
    for (int g = 0; g < groups; ++g) {
      const uint8_t* p = in + g * bits;
      if (p + 8 <= end) {
        uint64_t w;
        std::memcpy(&w, p, 8);
        const uint64_t r = ((_pdep_u64(w, mask) + bias) ^ sign);
        std::memcpy(out + 8 * g, &r, 8);
      } else {
        UnpackFew(p, 8, bits, out + 8 * g);
      }
    }
    if (tail > 0) UnpackFew(in + groups * bits, tail, bits, out + 8 * groups);
  }
}

}  // namespace polykv::kernels::codec
