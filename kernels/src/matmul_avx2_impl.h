// AVX2 + FMA + F16C dot-product kernels of the matrix products, in an anonymous namespace:
// included by matmul_avx2.cc (compiled with -mavx2 -mfma -mf16c) and by matmul_avx512.cc
// (compiled with AVX-512 flags, which reuses them for the types it has no wider kernel for).
// Each function computes, per activation row, exactly the arithmetic of the scalar reference
// (matmul_scalar.cc): exact integer block dot products, then f32 scaling, accumulated in a
// different (vector lane) order.
//
// Integer ranges (no saturation of vpmaddubsw, whose i16 result must stay within +-32767):
// weight codes are unsigned (Q4: 0..15, Q5: 0..31, Q6: 0..63, |Q8| <= 128 after vpsignb)
// and activations are within [-127, 127]: 2 * 63 * 127 = 16002 at most.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "avx2_math.h"  // internal linkage only, like everything in this header
#include "matmul_internal.h"

namespace polykv::kernels::mm {
namespace {

using simd::Hsum8;

// Zeroes every register of the per-activation-row accumulator arrays (kNx each; __m256 or
// __m512).
template <int kNx, class... T>
inline void ZeroAccumulators(T (&... arrays)[kNx]) {
#pragma GCC unroll 8
  for (int j = 0; j < kNx; ++j) ((arrays[j] = T{}), ...);
}

inline float H16(const uint8_t* p) {
  uint16_t h;
  __builtin_memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 8 x i32 sums of u8 x s8 products, 4 neighbours each (vpmaddubsw + vpmaddwd).
inline __m256i DotU8S8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// 256 dot(q, q1) + dot(q, q2): u8 weight codes against a block's codes and residual codes
// (8 x i32 partial sums).
inline __m256i Dot16(__m256i q, const uint8_t* c1, const uint8_t* c2) {
  const __m256i a = DotU8S8(q, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c1)));
  const __m256i b = DotU8S8(q, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c2)));
  return _mm256_add_epi32(_mm256_slli_epi32(a, 8), b);
}

// 32 nibbles of 16 bytes as 32 bytes: low nibbles in bytes 0..15, high in 16..31.
inline __m256i Nibbles32(const uint8_t* qs) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

// Byte i = 0x10 when bit i of the 32-bit qh is set, else 0.
inline __m256i HighBits32(const uint8_t* qhp) {
  uint32_t qh;
  __builtin_memcpy(&qh, qhp, 4);
  const __m256i v = _mm256_set1_epi32(static_cast<int32_t>(qh));
  const __m256i shuf =
      _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL);
  const __m256i bytes = _mm256_shuffle_epi8(v, shuf);
  const __m256i mask = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, mask), mask);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// ---- 32-value block families ----------------------------------------------------------
// Activation rows as in matmul_internal.h: codes, then dx[nb], ds[nb].

inline uint16_t U16(const uint8_t* p) {
  uint16_t h;
  __builtin_memcpy(&h, p, 2);
  return h;
}

// Lanes k < cnt all ones (for vmaskmovps).
inline __m256i LaneMask8(int cnt) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// For blocks [b, b + cnt) (cnt <= 8) of kB bytes (f16 d at +0, f16 m at +2 with kMin): writes
// s[j][k] = d_k dx_j[b + k] for every activation row j and adds sum_k f_k ds_j[b + k] to
// corr[j] (f = m with kMin, else d). The halves are read with scalar loads (no vpgatherdd:
// slow on CPUs with the Gather Data Sampling mitigation) and converted 8 at a time.
template <int kB, bool kMin, int kNx>
inline void Scales8(const uint8_t* w, int64_t b, int cnt, const uint8_t* x, int64_t xrb, int64_t nb,
                    float (*s)[16], __m256* corr) {
  const uint8_t* p = w + b * kB;
  __m128i hd, hm = _mm_setzero_si128();
  if (cnt == 8) {
    hd = _mm_setr_epi16(U16(p), U16(p + kB), U16(p + 2 * kB), U16(p + 3 * kB), U16(p + 4 * kB),
                        U16(p + 5 * kB), U16(p + 6 * kB), U16(p + 7 * kB));
    if constexpr (kMin)
      hm = _mm_setr_epi16(U16(p + 2), U16(p + kB + 2), U16(p + 2 * kB + 2), U16(p + 3 * kB + 2),
                          U16(p + 4 * kB + 2), U16(p + 5 * kB + 2), U16(p + 6 * kB + 2),
                          U16(p + 7 * kB + 2));
  } else {
    alignas(16) uint16_t td[8] = {}, tm[8] = {};
    for (int k = 0; k < cnt; ++k) {
      td[k] = U16(p + k * kB);
      if constexpr (kMin) tm[k] = U16(p + k * kB + 2);
    }
    hd = _mm_load_si128(reinterpret_cast<const __m128i*>(td));
    hm = _mm_load_si128(reinterpret_cast<const __m128i*>(tm));
  }
  const __m256 dv = _mm256_cvtph_ps(hd);
  const __m256 fv = kMin ? _mm256_cvtph_ps(hm) : dv;
  const __m256i lanes = LaneMask8(cnt);
#pragma GCC unroll 8
  for (int j = 0; j < kNx; ++j) {
    const uint8_t* xr = x + j * xrb;
    const __m256 dx = _mm256_maskload_ps(ActQ8Dx(xr, nb) + b, lanes);
    _mm256_storeu_ps(s[j], _mm256_mul_ps(dv, dx));
    corr[j] = _mm256_fmadd_ps(fv, _mm256_maskload_ps(ActQ8Ds(xr, nb) + b, lanes), corr[j]);
  }
}

// Q4_0 (kMin = false, w = (q - 8) d) and Q4_1 (kMin = true, w = q d + m) against kQ8P rows.
template <bool kMin, int kNx>
void DotQ4N(const uint8_t* w, int64_t nb, const uint8_t* x, int64_t xrb, float* out) {
  constexpr int kB = kMin ? 20 : 18, kQs = kMin ? 4 : 2;
  const int64_t full = nb / 4 * 4;
  __m256 acc0[kNx], acc1[kNx], corr[kNx];
  ZeroAccumulators(acc0, acc1, corr);
  const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  const __m256i idx01 = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  const __m256i idx23 = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
  alignas(32) float s[kNx][16];
  for (int64_t b0 = 0; b0 < nb; b0 += 8) {
    const int cnt = static_cast<int>(nb - b0 < 8 ? nb - b0 : 8);
    Scales8<kB, kMin, kNx>(w, b0, cnt, x, xrb, nb, s, corr);
    int k = 0;
    for (; k + 4 <= cnt && b0 + k + 4 <= full; k += 4) {
      const uint8_t* wb = w + (b0 + k) * kB + kQs;
      const __m256i r01 = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + kB)), 1);
      const __m256i r23 = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 2 * kB))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 3 * kB)), 1);
      const __m256i lo01 = _mm256_and_si256(r01, m4),
                    hi01 = _mm256_and_si256(_mm256_srli_epi16(r01, 4), m4);
      const __m256i lo23 = _mm256_and_si256(r23, m4),
                    hi23 = _mm256_and_si256(_mm256_srli_epi16(r23, 4), m4);
      const int64_t g = (b0 + k) / 4;
#pragma GCC unroll 8
      for (int j = 0; j < kNx; ++j) {
        const uint8_t* xg = x + j * xrb + 128 * g;
        const uint8_t* xr = xg + 32 * nb;  // residual codes
        const auto pair = [&](const __m256i lo, const __m256i hi, const uint8_t* c, int off) {
          return _mm256_madd_epi16(
              _mm256_add_epi16(
                  _mm256_maddubs_epi16(
                      lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + off))),
                  _mm256_maddubs_epi16(
                      hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + off + 64)))),
              ones);
        };
        const __m256i i01 = _mm256_add_epi32(_mm256_slli_epi32(pair(lo01, hi01, xg, 0), 8),
                                             pair(lo01, hi01, xr, 0));
        const __m256i i23 = _mm256_add_epi32(_mm256_slli_epi32(pair(lo23, hi23, xg, 32), 8),
                                             pair(lo23, hi23, xr, 32));
        const __m256 sv = _mm256_castps128_ps256(_mm_loadu_ps(s[j] + k));
        acc0[j] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(i01), _mm256_permutevar8x32_ps(sv, idx01), acc0[j]);
        acc1[j] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(i23), _mm256_permutevar8x32_ps(sv, idx23), acc1[j]);
      }
    }
    for (; k < cnt; ++k) {  // blocks after the last full group: natural code order
      const int64_t b = b0 + k;
      const __m256i q = Nibbles32(w + b * kB + kQs);
#pragma GCC unroll 8
      for (int j = 0; j < kNx; ++j) {
        const uint8_t* xb = x + j * xrb + 32 * b;
        const __m256i i = Dot16(q, xb, xb + 32 * nb);
        acc0[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(s[j][k]), acc0[j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < kNx; ++j) {
    const float main = Hsum8(_mm256_add_ps(acc0[j], acc1[j]));
    out[j] = kMin ? main + Hsum8(corr[j]) : main - 8.0f * Hsum8(corr[j]);
  }
}

// Q5_0 (kMin = false, w = (q5 - 16) d) and Q5_1 (kMin = true, w = q5 d + m), kQ8 rows.
template <bool kMin, int kNx>
void DotQ5N(const uint8_t* w, int64_t nb, const uint8_t* x, int64_t xrb, float* out) {
  constexpr int kB = kMin ? 24 : 22, kQh = kMin ? 4 : 2;
  __m256 acc[kNx], corr[kNx];
  ZeroAccumulators(acc, corr);
  alignas(32) float s[kNx][16];
  for (int64_t b0 = 0; b0 < nb; b0 += 8) {
    const int cnt = static_cast<int>(nb - b0 < 8 ? nb - b0 : 8);
    Scales8<kB, kMin, kNx>(w, b0, cnt, x, xrb, nb, s, corr);
    for (int k = 0; k < cnt; ++k) {
      const uint8_t* wb = w + (b0 + k) * kB;
      const __m256i q = _mm256_or_si256(Nibbles32(wb + kQh + 4), HighBits32(wb + kQh));
#pragma GCC unroll 8
      for (int j = 0; j < kNx; ++j) {
        const uint8_t* xb = x + j * xrb + 32 * (b0 + k);
        const __m256i i = Dot16(q, xb, xb + 32 * nb);
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(s[j][k]), acc[j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < kNx; ++j)
    out[j] = kMin ? Hsum8(acc[j]) + Hsum8(corr[j]) : Hsum8(acc[j]) - 16.0f * Hsum8(corr[j]);
}

// Q8_0 against kQ8 rows (sign trick: |w| x sign(x, w) as u8 x s8).
template <int kNx>
void DotQ8_0N(const uint8_t* w, int64_t nb, const uint8_t* x, int64_t xrb, float* out) {
  __m256 acc[kNx], corr[kNx];
  ZeroAccumulators(acc, corr);
  alignas(32) float s[kNx][16];
  for (int64_t b0 = 0; b0 < nb; b0 += 8) {
    const int cnt = static_cast<int>(nb - b0 < 8 ? nb - b0 : 8);
    Scales8<34, false, kNx>(w, b0, cnt, x, xrb, nb, s, corr);
    for (int k = 0; k < cnt; ++k) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (b0 + k) * 34 + 2));
      const __m256i aq = _mm256_sign_epi8(q, q);
#pragma GCC unroll 8
      for (int j = 0; j < kNx; ++j) {
        const uint8_t* xb = x + j * xrb + 32 * (b0 + k);
        const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb));
        const __m256i x2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 32 * nb));
        const __m256i i =
            _mm256_add_epi32(_mm256_slli_epi32(DotU8S8(aq, _mm256_sign_epi8(x1, q)), 8),
                             DotU8S8(aq, _mm256_sign_epi8(x2, q)));
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(s[j][k]), acc[j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < kNx; ++j) out[j] = Hsum8(acc[j]);
}

// ---- K-quants (super-blocks of 256) ------------------------------------------------------

template <bool kQ5, int kNx>
void DotQ45_KN(const uint8_t* w, int64_t nb, const uint8_t* x, int64_t xrb, float* out) {
  constexpr int kBytes = kQ5 ? 176 : 144;
  __m256 acc[kNx];
  float corr[kNx];
  const ActQ8K* xs[kNx];
#pragma GCC unroll 8
  for (int j = 0; j < kNx; ++j) {
    acc[j] = _mm256_setzero_ps();
    corr[j] = 0.0f;
    xs[j] = reinterpret_cast<const ActQ8K*>(x + j * xrb);
  }
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  for (int64_t b = 0; b < nb; ++b, w += kBytes) {
    const float d = H16(w), dmin = H16(w + 2);
    uint8_t sc[8], mn[8];
    for (int s = 0; s < 8; ++s) ScaleMinK4(s, w + 4, &sc[s], &mn[s]);
    const uint8_t* qs = w + (kQ5 ? 48 : 16);
    __m256i q[8];
    __m256i hbits = _mm256_setzero_si256();
    if constexpr (kQ5) hbits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16));
    const __m256i one = _mm256_set1_epi8(1);
    for (int i = 0; i < 4; ++i) {
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * i));
      q[2 * i] = _mm256_and_si256(bytes, m4);
      q[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), m4);
      if constexpr (kQ5) {
        const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(hbits, 2 * i), one);
        const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(hbits, 2 * i + 1), one);
        q[2 * i] = _mm256_or_si256(q[2 * i], _mm256_slli_epi16(h0, 4));
        q[2 * i + 1] = _mm256_or_si256(q[2 * i + 1], _mm256_slli_epi16(h1, 4));
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < kNx; ++j) {
      const ActQ8K& a = xs[j][b];
      __m256i s1 = _mm256_setzero_si256(), s2 = _mm256_setzero_si256();
      int32_t smin = 0;
      for (int s = 0; s < 8; ++s) {
        const __m256i scv = _mm256_set1_epi16(sc[s]);
        const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + 32 * s));
        const __m256i x2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.r + 32 * s));
        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_maddubs_epi16(q[s], x1), scv));
        s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(_mm256_maddubs_epi16(q[s], x2), scv));
        smin += mn[s] * (a.bsums[2 * s] + a.bsums[2 * s + 1]);
      }
      const float dd = d * a.d;
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_set1_ps(256.0f * dd),
                               _mm256_fmadd_ps(_mm256_cvtepi32_ps(s2), _mm256_set1_ps(dd), acc[j]));
      corr[j] += dmin * a.d * static_cast<float>(smin);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < kNx; ++j) out[j] = Hsum8(acc[j]) - corr[j];
}

template <int kNx>
void DotQ6_KN(const uint8_t* w, int64_t nb, const uint8_t* x, int64_t xrb, float* out) {
  __m256 acc[kNx];
  const ActQ8K* xs[kNx];
#pragma GCC unroll 8
  for (int j = 0; j < kNx; ++j) {
    acc[j] = _mm256_setzero_ps();
    xs[j] = reinterpret_cast<const ActQ8K*>(x + j * xrb);
  }
  const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x03);
  for (int64_t b = 0; b < nb; ++b, w += 210) {
    const float d = H16(w + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(w + 192);
    __m256i q[8];    // 8 vectors of 32 values: value order 0..255
    __m256i scv[8];  // i16 scales of the two sub-blocks of 16 in each vector
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = w + 64 * h;
      const uint8_t* qh = w + 128 + 32 * h;
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
      q[4 * h + 0] =
          _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
      q[4 * h + 1] =
          _mm256_or_si256(_mm256_and_si256(l1, m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4));
      q[4 * h + 2] =
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4));
      q[4 * h + 3] =
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4));
      for (int k = 0; k < 4; ++k) {
        const int s0 = sc[8 * h + 2 * k], s1 = sc[8 * h + 2 * k + 1];
        scv[4 * h + k] = _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(s1)),
                                          _mm_set1_epi16(static_cast<int16_t>(s0)));
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < kNx; ++j) {
      const ActQ8K& a = xs[j][b];
      __m256i s1 = _mm256_setzero_si256(), s2 = _mm256_setzero_si256();
      for (int k = 0; k < 8; ++k) {
        const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + 32 * k));
        const __m256i x2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.r + 32 * k));
        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], x1), scv[k]));
        s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], x2), scv[k]));
      }
      int64_t corr = 0;  // 32 sum_j sc_j bsums_j: exceeds int32
      for (int t = 0; t < 16; ++t) corr += int64_t{sc[t]} * a.bsums[t];
      const float dd = d * a.d;
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_set1_ps(256.0f * dd),
                               _mm256_fmadd_ps(_mm256_cvtepi32_ps(s2), _mm256_set1_ps(dd), acc[j]));
      acc[j] = _mm256_add_ps(
          acc[j], _mm256_setr_ps(-32.0f * dd * static_cast<float>(corr), 0, 0, 0, 0, 0, 0, 0));
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < kNx; ++j) out[j] = Hsum8(acc[j]);
}

// ---- f32 / f16 / bf16 weights (f32 activations) -------------------------------------------
// Kind 0: f32, 1: f16, 2: bf16.
template <int kKind>
inline __m256 Load8(const uint8_t* w, int64_t i) {
  if constexpr (kKind == 0) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(w) + i);
  } else if constexpr (kKind == 1) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * i)));
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <int kKind>
inline float Load1(const uint8_t* w, int64_t i) {
  if constexpr (kKind == 0) {
    float f;
    __builtin_memcpy(&f, w + 4 * i, 4);
    return f;
  } else if constexpr (kKind == 1) {
    return H16(w + 2 * i);
  } else {
    return dtype::LoadBf16(w + 2 * i);
  }
}

// 8 f32 lanes for DotFloatRows (AVX-512's 16-lane F32x16 is in matmul_avx512.cc).
struct F32x8 {
  using T = __m256;
  static constexpr int W = 8;
  static T Zero() { return _mm256_setzero_ps(); }
  static T Load(const float* p) { return _mm256_loadu_ps(p); }
  template <int kKind>
  static T LoadW(const uint8_t* w, int64_t i) {
    return Load8<kKind>(w, i);
  }
  static T Fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static float Sum(T a, T b) { return Hsum8(_mm256_add_ps(a, b)); }
};

// f32 / f16 / bf16 weights (kKind) against kNx f32 activation rows in the lanes of V: two
// accumulators per row over 2 W values at a time, then W, then the scalar tail.
template <class V, int kKind, int kNx>
void DotFloatRows(const uint8_t* w, int64_t n, const uint8_t* x, int64_t xrb, float* out) {
  using T = typename V::T;
  constexpr int W = V::W;
  T acc[kNx][2];
  const float* xs[kNx];
#pragma GCC unroll 8
  for (int j = 0; j < kNx; ++j) {
    acc[j][0] = acc[j][1] = V::Zero();
    xs[j] = reinterpret_cast<const float*>(x + j * xrb);
  }
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    const T w0 = V::template LoadW<kKind>(w, i), w1 = V::template LoadW<kKind>(w, i + W);
#pragma GCC unroll 8
    for (int j = 0; j < kNx; ++j) {
      acc[j][0] = V::Fma(w0, V::Load(xs[j] + i), acc[j][0]);
      acc[j][1] = V::Fma(w1, V::Load(xs[j] + i + W), acc[j][1]);
    }
  }
  for (; i + W <= n; i += W) {
    const T w0 = V::template LoadW<kKind>(w, i);
#pragma GCC unroll 8
    for (int j = 0; j < kNx; ++j) acc[j][0] = V::Fma(w0, V::Load(xs[j] + i), acc[j][0]);
  }
#pragma GCC unroll 8
  for (int j = 0; j < kNx; ++j) {
    float s = V::Sum(acc[j][0], acc[j][1]);
    for (int64_t t = i; t < n; ++t) s += Load1<kKind>(w, t) * xs[j][t];
    out[j] = s;
  }
}

// Kernel signature for a fixed number of activation rows.
using FixedFn = void (*)(const uint8_t*, int64_t, const uint8_t*, int64_t, float*);

// nx (1..8) -> the template instance; F5..F8 may be null for kernels of at most 4 rows,
// which then take rows 5.. in a second call.
template <FixedFn F1, FixedFn F2, FixedFn F3, FixedFn F4, FixedFn F5, FixedFn F6, FixedFn F7,
          FixedFn F8>
void ByRows(const uint8_t* w, int64_t nb, const uint8_t* x, int64_t xrb, int nx, float* out) {
  switch (nx) {
    case 1:
      F1(w, nb, x, xrb, out);
      return;
    case 2:
      F2(w, nb, x, xrb, out);
      return;
    case 3:
      F3(w, nb, x, xrb, out);
      return;
    case 4:
      F4(w, nb, x, xrb, out);
      return;
    default:
      break;
  }
  if constexpr (F5 == nullptr) {
    F4(w, nb, x, xrb, out);
    ByRows<F1, F2, F3, F4, F5, F6, F7, F8>(w, nb, x + 4 * xrb, xrb, nx - 4, out + 4);
  } else {
    switch (nx) {
      case 5:
        F5(w, nb, x, xrb, out);
        break;
      case 6:
        F6(w, nb, x, xrb, out);
        break;
      case 7:
        F7(w, nb, x, xrb, out);
        break;
      default:
        F8(w, nb, x, xrb, out);
        break;
    }
  }
}

#define POLYKV_MM_ROWS(fn, ...)                                                                   \
  ByRows<fn<__VA_ARGS__, 1>, fn<__VA_ARGS__, 2>, fn<__VA_ARGS__, 3>, fn<__VA_ARGS__, 4>, nullptr, \
         nullptr, nullptr, nullptr>
#define POLYKV_MM_ROWS0(fn) ByRows<fn<1>, fn<2>, fn<3>, fn<4>, nullptr, nullptr, nullptr, nullptr>
#define POLYKV_MM_ROWS8(fn, ...)                                                         \
  ByRows<fn<__VA_ARGS__, 1>, fn<__VA_ARGS__, 2>, fn<__VA_ARGS__, 3>, fn<__VA_ARGS__, 4>, \
         fn<__VA_ARGS__, 5>, fn<__VA_ARGS__, 6>, fn<__VA_ARGS__, 7>, fn<__VA_ARGS__, 8>>
#define POLYKV_MM_ROWS8_0(fn) ByRows<fn<1>, fn<2>, fn<3>, fn<4>, fn<5>, fn<6>, fn<7>, fn<8>>

// The AVX2 table (used as the base of the AVX-512 one).
inline void FillAvx2(DotTable* t) {
  t->dot[kTF32] = POLYKV_MM_ROWS(DotFloatRows, F32x8, 0);
  t->dot[kTF16] = POLYKV_MM_ROWS(DotFloatRows, F32x8, 1);
  t->dot[kTBF16] = POLYKV_MM_ROWS(DotFloatRows, F32x8, 2);
  t->dot[kTQ4_0] = POLYKV_MM_ROWS(DotQ4N, false);
  t->dot[kTQ4_1] = POLYKV_MM_ROWS(DotQ4N, true);
  t->dot[kTQ5_0] = POLYKV_MM_ROWS(DotQ5N, false);
  t->dot[kTQ5_1] = POLYKV_MM_ROWS(DotQ5N, true);
  t->dot[kTQ8_0] = POLYKV_MM_ROWS0(DotQ8_0N);
  t->dot[kTQ4_K] = POLYKV_MM_ROWS(DotQ45_KN, false);
  t->dot[kTQ5_K] = POLYKV_MM_ROWS(DotQ45_KN, true);
  t->dot[kTQ6_K] = POLYKV_MM_ROWS0(DotQ6_KN);
}

}  // namespace
}  // namespace polykv::kernels::mm
