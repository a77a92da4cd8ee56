// Per-element and per-vector math of the PolyKV codec, written once for g++ and nvcc.
//
// Every function here is `POLYKV_HD inline` (= `__host__ __device__` under nvcc, plain
// inline otherwise). The CPU path (kernels/src/codec_cpu.cc) loops over them, the CUDA
// kernels (kernels/cuda/codec_kernels.cu) call them per thread, so CI without a GPU tests
// the same arithmetic the GPU runs. Bit-exact agreement of host and device relies on plain
// IEEE f32 operations in the same order: the CUDA sources are compiled with -fmad=false
// (no FMA contraction) and IEEE division/sqrt; the host build uses no -ffast-math.
//
// Nothing in this header allocates, throws or touches global state.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// POLYKV_HD (= __host__ __device__ under nvcc), POLYKV_HD_RESTRICT and the f16/bf16 <-> f32
// conversions (re-exported below as math::F16ToFloat, ...).
#include "polykv/kernels/dtype_convert.h"

#if defined(__SSE2__) && !defined(__CUDACC__)
#include <emmintrin.h>
#endif

/// The one dispatch of a value-code width (bits 1..4) to a compile-time constant: runs
/// `...` with `constexpr int kBits` equal to `bits` (FlashInfer's DISPATCH_* style). Widths
/// are validated where they enter (ValidateCodecConfig, the pool header reader), so another
/// width here is a broken invariant: it stops the process loudly (host: a message and
/// abort(); device: __trap()), never a silent default.
#define POLYKV_DISPATCH_VALUE_BITS(bits, kBits, ...)  \
  switch (bits) {                                     \
    POLYKV_VALUE_BITS_CASE(1, kBits, __VA_ARGS__)     \
    POLYKV_VALUE_BITS_CASE(2, kBits, __VA_ARGS__)     \
    POLYKV_VALUE_BITS_CASE(3, kBits, __VA_ARGS__)     \
    POLYKV_VALUE_BITS_CASE(4, kBits, __VA_ARGS__)     \
    default:                                          \
      ::polykv::kernels::math::UnsupportedBits(bits); \
  }
/// One case of POLYKV_DISPATCH_VALUE_BITS: `b` bits as `constexpr int kBits`.
#define POLYKV_VALUE_BITS_CASE(b, kBits, ...) \
  case b: {                                   \
    constexpr int kBits = b;                  \
    __VA_ARGS__;                              \
    break;                                    \
  }

namespace polykv::kernels::math {

/// Stops the process: a value-code width outside 1..4 reached a kernel (see
/// POLYKV_DISPATCH_VALUE_BITS).
POLYKV_HD inline void UnsupportedBits(int bits) {
#if defined(__CUDA_ARCH__)
  (void)bits;
  __trap();
#else
  std::fprintf(stderr, "polykv: internal error: %d-bit value codes reached a kernel (1..4)\n",
               bits);
  std::abort();
#endif
}

/// Largest head_dim the CUDA kernels accept (one thread keeps a vector in local memory).
constexpr int kMaxCudaHeadDim = 512;
/// Largest value bit width (codebook of 2^4 = 16 levels).
constexpr int kMaxValueBits = 4;
constexpr int kMaxLevels = 1 << kMaxValueBits;

// ---------------------------------------------------------------------------------------
// Bit casts and dtype conversions (bit-exact, round-to-nearest-even, host == device).
// ---------------------------------------------------------------------------------------

// Defined once in dtype_convert.h (also used outside the codec: matrix kernels, pool format).
using dtype::BitsFloat;
using dtype::FloatBits;

/// True for NaN and +-Inf (exponent bits all ones); exact for every input bit pattern.
POLYKV_HD inline bool IsNonFinite(float f) { return (FloatBits(f) & 0x7F800000u) == 0x7F800000u; }

using dtype::Bf16ToFloat;
using dtype::F16ToFloat;
using dtype::FloatToBf16;
using dtype::FloatToF16;

/// Loads element `i` of a tensor of dtype code `dtype` (0 f32, 1 f16, 2 bf16) as f32.
POLYKV_HD inline float LoadF32(const void* p, int dtype, int64_t i) {
  if (dtype == 0) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  return dtype == 1 ? F16ToFloat(h) : Bf16ToFloat(h);
}

/// Stores f32 `x` as element `i` of a tensor of dtype code `dtype` (0 f32, 1 f16, 2 bf16).
POLYKV_HD inline void StoreF32(void* p, int dtype, int64_t i, float x) {
  if (dtype == 0) {
    static_cast<float*>(p)[i] = x;
  } else {
    static_cast<uint16_t*>(p)[i] = dtype == 1 ? FloatToF16(x) : FloatToBf16(x);
  }
}

// ---------------------------------------------------------------------------------------
// Keys: int8 symmetric quantization.
// ---------------------------------------------------------------------------------------

/// Scale of a key group from its absmax: absmax / 127, or 1 for an all-zero group.
POLYKV_HD inline float KeyScaleFromAbsmax(float absmax) {
  return absmax > 0.0f ? absmax / 127.0f : 1.0f;
}

/// q = rne(x / scale) clamped to [-127, 127]. Rounding is to nearest, ties to EVEN: the
/// quotient is clamped first, then rounded with the 1.5 * 2^23 magic constant (exact RNE
/// for |v| <= 2^22 under the default rounding mode; vectorizes without SSE4.1, same on the
/// device, where -fmad=false keeps the add and subtract separate).
POLYKV_HD inline int8_t QuantizeKey(float x, float scale) {
  float v = x / scale;
  v = v < 127.0f ? v : 127.0f;    // minps form
  v = v > -127.0f ? v : -127.0f;  // maxps form
  const float r = (v + 12582912.0f) - 12582912.0f;
  return static_cast<int8_t>(static_cast<int>(r));
}

/// x_hat = q * scale.
POLYKV_HD inline float DequantizeKey(int8_t q, float scale) {
  return static_cast<float>(q) * scale;
}

/// Largest |q| of a `bits`-bit key (4..8): 2^(bits-1) - 1 (127 for int8).
POLYKV_HD inline int KeyQMax(int bits) { return (1 << (bits - 1)) - 1; }

/// Scale of a key group of `bits` bits from its absmax: absmax / KeyQMax(bits), or 1 for an
/// all-zero group (bits 8: KeyScaleFromAbsmax).
POLYKV_HD inline float KeyScaleFromAbsmaxBits(float absmax, int bits) {
  return absmax > 0.0f ? absmax / static_cast<float>(KeyQMax(bits)) : 1.0f;
}

/// Packs n signed key values (|q| <= KeyQMax(bits), bits 4..7) as unsigned codes
/// q + 2^(bits-1) into the dense LSB-first bit stream of PackCodes (codec.h): groups of 8
/// codes fill exactly `bits` bytes. Writes PackedBytes(n, bits) bytes.
POLYKV_HD inline void PackKeyCodes(const int8_t* POLYKV_HD_RESTRICT q, int n, int bits,
                                   uint8_t* POLYKV_HD_RESTRICT out) {
  const int off = 1 << (bits - 1);
  for (int i = 0; i < n; i += 8) {
    const int cnt = n - i < 8 ? n - i : 8;
    uint64_t w = 0;
    for (int k = 0; k < cnt; ++k)
      w |= static_cast<uint64_t>(static_cast<uint32_t>(q[i + k] + off)) << (k * bits);
    uint8_t* o = out + (i / 8) * bits;
    const int nb = (cnt * bits + 7) / 8;
    for (int b = 0; b < nb; ++b) o[b] = static_cast<uint8_t>(w >> (8 * b));
  }
}

/// Inverse of PackKeyCodes: n signed key values from PackedBytes(n, bits) bytes.
POLYKV_HD inline void UnpackKeyCodes(const uint8_t* POLYKV_HD_RESTRICT in, int n, int bits,
                                     int8_t* POLYKV_HD_RESTRICT q) {
  const int off = 1 << (bits - 1);
  const uint64_t mask = (uint64_t{1} << bits) - 1u;
  for (int i = 0; i < n; i += 8) {
    const int cnt = n - i < 8 ? n - i : 8;
    const uint8_t* p = in + (i / 8) * bits;
    const int nb = (cnt * bits + 7) / 8;
    uint64_t w = 0;
    for (int b = 0; b < nb; ++b) w |= static_cast<uint64_t>(p[b]) << (8 * b);
    for (int k = 0; k < cnt; ++k)
      q[i + k] = static_cast<int8_t>(static_cast<int>((w >> (k * bits)) & mask) - off);
  }
}

// ---------------------------------------------------------------------------------------
// Values: TurboQuant-MSE.
// ---------------------------------------------------------------------------------------

/// splitmix64 finalizer (Steele, Lea & Flood 2014): a bijective 64-bit mixer.
POLYKV_HD inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Random sign D_i of coordinate `i` for `seed`: counter-based, so no table is stored and
/// host and device agree: D_i = -1 if the top bit of Mix64(seed + (i + 1) * 0x9E3779B97F4A7C15)
/// is set, else +1 (the top bit of the i-th output of a splitmix64 stream seeded with `seed`;
/// the top bit, because the low bit of a multiply-mix is poorly mixed). Same D for every vector.
POLYKV_HD inline float RotationSign(uint64_t seed, int i) {
  const uint64_t z = seed + (static_cast<uint64_t>(i) + 1ull) * 0x9E3779B97F4A7C15ull;
  return (Mix64(z) >> 63) ? -1.0f : 1.0f;
}

/// Size of the Hadamard blocks for `head_dim`: the largest power of two dividing it
/// (64 -> 64, 48 -> 16, 80 -> 16, 96 -> 32, 8 -> 8, odd -> 1 = no rotation).
/// The rotation is block-diagonal: head_dim / block independent orthonormal WHTs. This
/// is exact for power-of-two head_dims; for others the rotation mixes only within a block,
/// so energy concentrated in one block is not spread across the whole vector (see the
/// measured relative MSE per head_dim in codec.h).
POLYKV_HD inline int HadamardBlock(int head_dim) { return head_dim & (-head_dim); }

/// Sum of squares of x[0..d) in a FIXED order, so host and device agree bit for bit:
/// lane j (0..7) accumulates x[i]^2 for i = j, j + 8, j + 16, ... in increasing i; then
/// t_j = lane_j + lane_{j+4}; result = (t_0 + t_2) + (t_1 + t_3). (Eight independent
/// lanes let the host compiler vectorize without reassociating.)
POLYKV_HD inline float SumSquares(const float* POLYKV_HD_RESTRICT x, int d) {
  float lane[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  int i = 0;
  for (; i + 8 <= d; i += 8) {
    for (int j = 0; j < 8; ++j) lane[j] += x[i + j] * x[i + j];
  }
  for (int j = 0; i + j < d; ++j) lane[j] += x[i + j] * x[i + j];
  const float t0 = lane[0] + lane[4], t1 = lane[1] + lane[5];
  const float t2 = lane[2] + lane[6], t3 = lane[3] + lane[7];
  return (t0 + t2) + (t1 + t3);
}

/// One butterfly stage of the unnormalized Walsh-Hadamard transform on a block of B:
/// for every pair (j, j + H) inside each 2H group: (a, b) -> (a + b, a - b).
template <int B, int H>
POLYKV_HD inline void FwhtStage(float* POLYKV_HD_RESTRICT x) {
  for (int i = 0; i < B; i += 2 * H) {
    for (int j = i; j < i + H; ++j) {
      const float a = x[j];
      const float b = x[j + H];
      x[j] = a + b;
      x[j + H] = a - b;
    }
  }
}

template <int B, int H>
POLYKV_HD inline void FwhtStagesFrom(float* POLYKV_HD_RESTRICT x) {
  if constexpr (H < B) {
    FwhtStage<B, H>(x);
    FwhtStagesFrom<B, 2 * H>(x);
  }
}

/// Runtime-size unnormalized WHT (stages h = 1, 2, 4, ...): the reference butterfly network.
/// Every implementation below computes exactly these a + b / a - b expressions, so all
/// of them (host SIMD, fixed-size, device) give bit-identical results.
POLYKV_HD inline void FwhtRuntime(float* POLYKV_HD_RESTRICT x, int block) {
  for (int h = 1; h < block; h *= 2) {
    for (int i = 0; i < block; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const float a = x[j];
        const float b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}

#if defined(__SSE2__) && !defined(__CUDACC__)
/// Host SIMD for the first four stages (h = 1, 2, 4, 8) of every 16-element group, kept in
/// four SSE registers (one load and one store instead of four passes). Same butterflies.
inline void FwhtFirst16Sse(float* POLYKV_HD_RESTRICT x, int n) {
  for (int g = 0; g < n; g += 16) {
    __m128 r[4];
    for (int k = 0; k < 4; ++k) {
      __m128 v = _mm_loadu_ps(x + g + 4 * k);  // [a b c d]
      // h = 1: [a+b, a-b, c+d, c-d]  (p - v at odd lanes: a - b, c - d)
      __m128 p = _mm_shuffle_ps(v, v, _MM_SHUFFLE(2, 3, 0, 1));  // [b a d c]
      __m128 s = _mm_add_ps(v, p);                               // [a+b b+a c+d d+c]
      __m128 t = _mm_sub_ps(p, v);                               // [b-a a-b d-c c-d]
      __m128 m = _mm_shuffle_ps(s, t, _MM_SHUFFLE(3, 1, 2, 0));  // [s0 s2 t1 t3]
      v = _mm_shuffle_ps(m, m, _MM_SHUFFLE(3, 1, 2, 0));         // [s0 t1 s2 t3]
      // h = 2: [A+C, B+D, A-C, B-D]
      p = _mm_shuffle_ps(v, v, _MM_SHUFFLE(1, 0, 3, 2));  // [C D A B]
      s = _mm_add_ps(v, p);                               // [A+C B+D C+A D+B]
      t = _mm_sub_ps(p, v);                               // [C-A D-B A-C B-D]
      r[k] = _mm_shuffle_ps(s, t, _MM_SHUFFLE(3, 2, 1, 0));
    }
    // h = 4: (r0, r1), (r2, r3); h = 8: (r0, r2), (r1, r3).
    __m128 a0 = _mm_add_ps(r[0], r[1]), a1 = _mm_sub_ps(r[0], r[1]);
    __m128 a2 = _mm_add_ps(r[2], r[3]), a3 = _mm_sub_ps(r[2], r[3]);
    _mm_storeu_ps(x + g + 0, _mm_add_ps(a0, a2));
    _mm_storeu_ps(x + g + 4, _mm_add_ps(a1, a3));
    _mm_storeu_ps(x + g + 8, _mm_sub_ps(a0, a2));
    _mm_storeu_ps(x + g + 12, _mm_sub_ps(a1, a3));
  }
}
#endif

/// Unnormalized WHT of one block of compile-time size B (a power of two): the Sylvester
/// H_B with entries +-1 (H_B * H_B = B * I).
template <int B>
POLYKV_HD inline void FwhtFixed(float* POLYKV_HD_RESTRICT x) {
#if defined(__SSE2__) && !defined(__CUDACC__)
  if constexpr (B >= 16) {
    FwhtFirst16Sse(x, B);
    FwhtStagesFrom<B, 16>(x);
    return;
  }
#endif
  FwhtStagesFrom<B, 1>(x);
}

/// BlockFwht for a runtime `block`, dispatched once per call: FwhtFixed<block> for the
/// powers of two B..256, FwhtRuntime otherwise.
template <int B>
POLYKV_HD inline void BlockFwhtFrom(float* POLYKV_HD_RESTRICT x, int d, int block) {
  if constexpr (B <= 256) {
    if (block != B) return BlockFwhtFrom<2 * B>(x, d, block);
    for (int off = 0; off < d; off += B) FwhtFixed<B>(x + off);
  } else {
    for (int off = 0; off < d; off += block) FwhtRuntime(x + off, block);
  }
}

/// Block-diagonal unnormalized WHT of x[0..d) with blocks of `block` (HadamardBlock(d)).
POLYKV_HD inline void BlockFwht(float* POLYKV_HD_RESTRICT x, int d, int block) {
  if (block == 1) return;  // H_1 = [1]
  BlockFwhtFrom<2>(x, d, block);
}

/// Codebook handed to the per-vector functions (and by value to CUDA kernels): the
/// 2^bits ascending Lloyd-Max levels and the 2^bits - 1 decision thresholds (midpoints).
struct ValueCodebook {
  int bits = 3;
  float levels[kMaxLevels] = {};
  float thresholds[kMaxLevels - 1] = {};
};

/// Index of the nearest level: the number of thresholds strictly below z (a tie on a
/// midpoint picks the lower level). Branch-free.
POLYKV_HD inline uint32_t NearestLevel(float z, const ValueCodebook& cb) {
  const int n = (1 << cb.bits) - 1;
  uint32_t c = 0;
  for (int k = 0; k < n; ++k) c += z > cb.thresholds[k] ? 1u : 0u;
  return c;
}

/// Code written for every coordinate of a zero vector: the level nearest 0 on the positive
/// side (index 2^(bits-1)); its norm 0 makes it decode to exact zeros.
POLYKV_HD inline uint32_t ZeroVectorCode(int bits) { return 1u << (bits - 1); }

/// Bytes of one packed vector of n codes at `bits`: ceil(bits * n / 8).
POLYKV_HD inline int64_t PackedBytes(int64_t n, int bits) { return (n * bits + 7) / 8; }

/// PackCodes for a compile-time bit width (constant shifts).
template <int kBits>
POLYKV_HD inline void PackCodesT(const uint8_t* POLYKV_HD_RESTRICT codes, int n,
                                 uint8_t* POLYKV_HD_RESTRICT out) {
  int i = 0;
  // Groups of 8 codes fill exactly kBits bytes.
  for (; i + 8 <= n; i += 8) {
    uint32_t w = 0;
    for (int k = 0; k < 8; ++k) w |= uint32_t{codes[i + k]} << (k * kBits);
    uint8_t* o = out + (i / 8) * kBits;
    for (int b = 0; b < kBits; ++b) o[b] = static_cast<uint8_t>(w >> (8 * b));
  }
  if (i < n) {
    uint32_t w = 0;
    const int rest = n - i;
    for (int k = 0; k < rest; ++k) w |= uint32_t{codes[i + k]} << (k * kBits);
    uint8_t* o = out + (i / 8) * kBits;
    const int nb = (rest * kBits + 7) / 8;
    for (int b = 0; b < nb; ++b) o[b] = static_cast<uint8_t>(w >> (8 * b));
  }
}

/// Packs n codes (each < 2^bits, bits 1..4) densely, LSB-first: code i occupies stream bits
/// [i*bits, (i+1)*bits), stream bit k being bit (k % 8) of byte k / 8 (see codec.h).
/// Writes exactly PackedBytes(n, bits) bytes; unused high bits of the last byte are 0.
POLYKV_HD inline void PackCodes(const uint8_t* POLYKV_HD_RESTRICT codes, int n, int bits,
                                uint8_t* POLYKV_HD_RESTRICT out) {
  POLYKV_DISPATCH_VALUE_BITS(bits, kBits, PackCodesT<kBits>(codes, n, out));
}

/// Inverse of PackCodes: reads n codes of `bits` bits from PackedBytes(n, bits) bytes.
/// No per-code branch; never reads past the packed vector.
POLYKV_HD inline void UnpackCodes(const uint8_t* POLYKV_HD_RESTRICT in, int n, int bits,
                                  uint8_t* POLYKV_HD_RESTRICT codes) {
  const uint32_t mask = (1u << bits) - 1u;
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint8_t* p = in + (i / 8) * bits;
    uint32_t w = 0;
    for (int b = 0; b < bits; ++b) w |= uint32_t{p[b]} << (8 * b);
    for (int k = 0; k < 8; ++k) codes[i + k] = static_cast<uint8_t>((w >> (k * bits)) & mask);
  }
  if (i < n) {
    const uint8_t* p = in + (i / 8) * bits;
    const int rest = n - i;
    const int nb = (rest * bits + 7) / 8;
    uint32_t w = 0;
    for (int b = 0; b < nb; ++b) w |= uint32_t{p[b]} << (8 * b);
    for (int k = 0; k < rest; ++k) codes[i + k] = static_cast<uint8_t>((w >> (k * bits)) & mask);
  }
}

/// code_i = NearestLevel(x[i] * scale, cb) for i < d, with the thresholds a compile-time
/// count so that the host compiler vectorizes the compares.
template <int kBits>
POLYKV_HD inline void QuantizeToCodes(const float* POLYKV_HD_RESTRICT x, int d, float scale,
                                      const ValueCodebook& cb, uint8_t* POLYKV_HD_RESTRICT codes) {
  constexpr int kN = (1 << kBits) - 1;
  float thr[kN];
  for (int k = 0; k < kN; ++k) thr[k] = cb.thresholds[k];
  for (int i = 0; i < d; ++i) {
    const float z = x[i] * scale;
    int c = 0;
    for (int k = 0; k < kN; ++k) c += z > thr[k] ? 1 : 0;
    codes[i] = static_cast<uint8_t>(c);
  }
}

/// out[i] = levels[code_i] for the d codes packed in `in` (layout of PackCodes).
template <int kBits>
POLYKV_HD inline void UnpackLevels(const uint8_t* POLYKV_HD_RESTRICT in, int d,
                                   const ValueCodebook& cb, float* POLYKV_HD_RESTRICT out) {
  constexpr uint32_t kMask = (1u << kBits) - 1u;
  float lv[1 << kBits];
  for (int k = 0; k < (1 << kBits); ++k) lv[k] = cb.levels[k];
  int i = 0;
  for (; i + 8 <= d; i += 8) {
    const uint8_t* p = in + (i / 8) * kBits;
    uint32_t w = 0;
    for (int b = 0; b < kBits; ++b) w |= uint32_t{p[b]} << (8 * b);
    for (int k = 0; k < 8; ++k) out[i + k] = lv[(w >> (k * kBits)) & kMask];
  }
  if (i < d) {
    const uint8_t* p = in + (i / 8) * kBits;
    const int rest = d - i;
    const int nb = (rest * kBits + 7) / 8;
    uint32_t w = 0;
    for (int b = 0; b < nb; ++b) w |= uint32_t{p[b]} << (8 * b);
    for (int k = 0; k < rest; ++k) out[i + k] = lv[(w >> (k * kBits)) & kMask];
  }
}

/// Encodes one value vector with TurboQuant-MSE. `x` holds v[0..d) as f32 on entry and is
/// overwritten (scratch):
///   norm = ||v||_2 (SumSquares order); u = v / norm; y = H D u (H block-diagonal
///   orthonormal WHT, blocks of HadamardBlock(d)); z = sqrt(d) y; code_i = NearestLevel(z_i).
/// Implemented as z = WHT_unnorm(D v) * (sqrt(d / block) / norm) (same math, one scale).
/// `signs` holds D (d entries, RotationSign); `codes` is d bytes of scratch. Writes
/// PackedBytes(d, bits) bytes to `packed` and returns the value to store as the vector's
/// norm: ||v||, or with `norm_correction` ||v|| / ||u_hat|| where u_hat is the decoded unit
/// vector (||u_hat|| = ||levels[code]|| / sqrt(d) because H is orthonormal).
/// A zero vector gets ZeroVectorCode everywhere and norm 0. Non-finite input is the
/// caller's to reject first (the result is then unspecified, never a crash).
POLYKV_HD inline float EncodeValueVector(float* POLYKV_HD_RESTRICT x, int d,
                                         const float* POLYKV_HD_RESTRICT signs,
                                         const ValueCodebook& cb, bool norm_correction,
                                         uint8_t* POLYKV_HD_RESTRICT codes,
                                         uint8_t* POLYKV_HD_RESTRICT packed) {
  const float norm = sqrtf(SumSquares(x, d));
  if (!(norm > 0.0f)) {
    const uint8_t zc = static_cast<uint8_t>(ZeroVectorCode(cb.bits));
    for (int i = 0; i < d; ++i) codes[i] = zc;
    PackCodes(codes, d, cb.bits, packed);
    return 0.0f;
  }
  const int block = HadamardBlock(d);
  for (int i = 0; i < d; ++i) x[i] = x[i] * signs[i];
  BlockFwht(x, d, block);
  const float scale = sqrtf(static_cast<float>(d) / static_cast<float>(block)) / norm;
  POLYKV_DISPATCH_VALUE_BITS(cb.bits, kBits, QuantizeToCodes<kBits>(x, d, scale, cb, codes));
  PackCodes(codes, d, cb.bits, packed);
  if (!norm_correction) return norm;
  for (int i = 0; i < d; ++i) x[i] = cb.levels[codes[i]];
  // ||u_hat|| = sqrt(sum levels^2 / d); stored = norm / ||u_hat||.
  return norm / sqrtf(SumSquares(x, d) / static_cast<float>(d));
}

/// Decodes one packed vector to out[0..d) (f32):
///   z_hat_i = levels[code_i]; u_hat = D H^T (z_hat / sqrt(d)); x_hat = norm * u_hat.
/// Implemented as x_hat_i = (WHT_unnorm(z_hat)_i * D_i) * (norm / sqrt(d * block)).
POLYKV_HD inline void DecodeValueVector(const uint8_t* POLYKV_HD_RESTRICT packed, float norm, int d,
                                        const float* POLYKV_HD_RESTRICT signs,
                                        const ValueCodebook& cb, float* POLYKV_HD_RESTRICT out) {
  POLYKV_DISPATCH_VALUE_BITS(cb.bits, kBits, UnpackLevels<kBits>(packed, d, cb, out));
  const int block = HadamardBlock(d);
  BlockFwht(out, d, block);
  const float scale = norm / sqrtf(static_cast<float>(d) * static_cast<float>(block));
  for (int i = 0; i < d; ++i) out[i] = out[i] * signs[i] * scale;
}

}  // namespace polykv::kernels::math
