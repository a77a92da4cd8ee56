// f16 / bf16 <-> f32 conversions and f32 bit casts: the one definition for the whole
// project, written once for g++ and nvcc (codec_math.h includes it; the matrix kernels'
// scalar loads, the attention kernels and the pool format's codec-none dtype copies call it).
//
// All conversions are exact or round to nearest, ties to even, and give the same bits on the
// host and the device. NaN: f16/bf16 -> f32 keep the payload bits as they are (a signalling
// NaN stays signalling; the hardware converters _cvtsh_ss / vcvtph2ps set the quiet bit
// instead, see dtype_convert_test.cc); f32 -> bf16 keeps the top 7 payload bits and sets the
// quiet bit; f32 -> f16 gives the canonical quiet NaN 0x7E00 with the sign.
//
// Every function is forced inline (POLYKV_DTYPE_INLINE): the SIMD sources compiled with ISA
// flags (matmul_avx2.cc, matmul_avx512.cc, matmul_amx.cc) call them through
// matmul_internal.h, and an out-of-line copy emitted there with AVX instructions could be the
// one the linker keeps for scalar code (see matmul_internal.h). Inlined at every call, no
// such copy is emitted; do not take their address in those sources.
//
// Nothing in this header allocates, throws or touches global state.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define POLYKV_HD __host__ __device__
#define POLYKV_HD_RESTRICT __restrict__
#define POLYKV_DTYPE_INLINE __host__ __device__ __forceinline__
#else
#define POLYKV_HD
#define POLYKV_HD_RESTRICT __restrict__
#define POLYKV_DTYPE_INLINE inline __attribute__((always_inline))
#endif

namespace polykv::kernels::dtype {

/// Reinterprets the bits of an f32 as uint32.
POLYKV_DTYPE_INLINE uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

/// Reinterprets uint32 bits as an f32.
POLYKV_DTYPE_INLINE float BitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

/// bf16 bits -> f32 (exact: bf16 is the upper half of an f32; NaN payloads kept).
POLYKV_DTYPE_INLINE float Bf16ToFloat(uint16_t h) { return BitsFloat(uint32_t{h} << 16); }

/// f32 -> bf16 bits, round to nearest, ties to even. NaN -> quiet NaN ((bits >> 16) | 0x0040:
/// sign and top payload bits kept); values above the bf16 range round to +-Inf as IEEE
/// requires.
POLYKV_DTYPE_INLINE uint16_t FloatToBf16(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;
  // Branch-free select (vectorizes); the magnitude fits a signed compare.
  return static_cast<uint16_t>(static_cast<int32_t>(u & 0x7FFFFFFFu) > 0x7F800000 ? quiet_nan
                                                                                  : rounded);
}

/// IEEE binary16 bits -> f32 (exact for all 65536 inputs; subnormals included; NaN payloads
/// kept: mantissa << 13, the quiet bit as it was).
POLYKV_DTYPE_INLINE float F16ToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0) {
    // Subnormal or zero: mant * 2^-24, exact in f32.
    const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return BitsFloat(FloatBits(mag) | sign);
  }
  if (exp == 31) return BitsFloat(sign | 0x7F800000u | (mant << 13));
  return BitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

/// f32 -> IEEE binary16 bits, round to nearest, ties to even; overflow -> +-Inf,
/// NaN -> quiet NaN (0x7E00 | sign), results below 2^-14 become correctly rounded subnormals.
POLYKV_DTYPE_INLINE uint16_t FloatToF16(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) return static_cast<uint16_t>(sign | (a > 0x7F800000u ? 0x7E00u : 0x7C00u));
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 -> Inf
  if (a < 0x38800000u) {
    // |f| < 2^-14: subnormal half m * 2^-24 with m = rne(|f| * 2^24) in [0, 1024]
    // (1024 is the encoding of the smallest normal, 0x0400). |f| * 2^24 is exact.
    const float m = rintf(BitsFloat(a) * 16777216.0f);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(m));
  }
  a += 0x0FFFu + ((a >> 13) & 1u);  // round the 13 dropped mantissa bits, ties to even
  return static_cast<uint16_t>(sign | ((a - 0x38000000u) >> 13));
}

#if !defined(__CUDACC__)
// Host only: loads from weight blocks at any byte offset (the matrix kernels).

/// f16 at a possibly unaligned address.
POLYKV_DTYPE_INLINE float LoadF16(const void* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return F16ToFloat(h);
}

/// bf16 at a possibly unaligned address.
POLYKV_DTYPE_INLINE float LoadBf16(const void* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return Bf16ToFloat(h);
}
#endif  // !defined(__CUDACC__)

}  // namespace polykv::kernels::dtype
