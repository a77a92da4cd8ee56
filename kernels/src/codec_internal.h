// Internal declarations of the codec's SIMD variants (no inline code: included by the AVX2
// source too, see matmul_internal.h for why).
#pragma once

#include <cstdint>

namespace polykv::kernels::codec {

/// UnpackKeyVectors for bits 4..7 with BMI2 PDEP: each group of 8 values (bits bytes) is
/// read as one 64-bit word when 8 bytes lie inside [codes, codes + n * vector bytes), its
/// codes deposited one per byte and offset to signed (code + 128 - 2^(bits-1), then the sign
/// bit flipped); other groups as the scalar reference. The same bytes as math::UnpackKeyCodes.
/// Only on CPUs with BMI2 (every Isa::kAvx2 CPU).
void UnpackKeyVectorsBmi2(const uint8_t* codes, int64_t n, int32_t head_dim, int32_t bits,
                          int8_t* q);

}  // namespace polykv::kernels::codec
