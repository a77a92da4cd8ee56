// AVX2 (+FMA, F16C) body of one attention chunk, in an anonymous namespace: included by
// attention_avx2.cc and attention_avx512.cc, each compiled with its ISA flags. Same math as
// attention_scalar.cc; exp is a polynomial (Cephes expf coefficients, |rel err| < 2e-7).
//
// Per chunk: keys of the chunk converted once to f32 (int8 codes, f16, bf16; f32 used in
// place), values decoded once (packed codes -> norm * level through vpermps on the 8 (or
// 16) Lloyd-Max levels), then for each query: 8 scores at a time (8 FMA chains reduced by
// a transpose-add), max, exp, sum, and the weighted value sum in 64-float slices.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "attention_internal.h"
#include "avx2_math.h"

namespace polykv::kernels::attn {
namespace {

using simd::Exp1;
using simd::Exp8;
using simd::Hmax8;
using simd::Hsum8;

// 8 dot-product accumulators -> one vector of their 8 sums.
inline __m256 Reduce8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5,
                      __m256 a6, __m256 a7) {
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

inline __m256 LoadKey8(int kind, const void* base, int64_t idx) {
  switch (kind) {
    case kKeyF16:
      return _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + idx)));
    case kKeyBf16: {
      const __m128i h =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + idx));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    case kKeyI8: {
      const __m128i b = _mm_loadl_epi64(
          reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(base) + idx));
      return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    }
    default:
      return _mm256_loadu_ps(static_cast<const float*>(base) + idx);
  }
}

// Decodes packed value codes of token vector `p` to norm * levels[code] (hd values).
template <int kBits>
inline void DecodePacked(const uint8_t* p, float norm, int hd, const float* levels, float* out) {
  const __m256i shifts = _mm256_setr_epi32(0, kBits, 2 * kBits, 3 * kBits, 4 * kBits, 5 * kBits,
                                           6 * kBits, 7 * kBits);
  const __m256i mask = _mm256_set1_epi32((1 << kBits) - 1);
  __m256 lv0, lv1 = _mm256_setzero_ps();
  if constexpr (kBits == 2) {
    lv0 = _mm256_setr_ps(levels[0], levels[1], levels[2], levels[3], 0, 0, 0, 0);
  } else {
    lv0 = _mm256_loadu_ps(levels);
    if constexpr (kBits == 4) lv1 = _mm256_loadu_ps(levels + 8);
  }
  const __m256 nv = _mm256_set1_ps(norm);
  for (int g = 0; g < hd / 8; ++g) {
    const uint8_t* b = p + g * kBits;
    uint32_t w = b[0];
    for (int k = 1; k < kBits; ++k) w |= static_cast<uint32_t>(b[k]) << (8 * k);
    const __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)), shifts), mask);
    __m256 v = _mm256_permutevar8x32_ps(lv0, idx);
    if constexpr (kBits == 4) {
      const __m256 hi = _mm256_permutevar8x32_ps(lv1, idx);
      const __m256 sel = _mm256_castsi256_ps(_mm256_cmpgt_epi32(idx, _mm256_set1_epi32(7)));
      v = _mm256_blendv_ps(v, hi, sel);
    }
    _mm256_storeu_ps(out + 8 * g, _mm256_mul_ps(v, nv));
  }
}

void ChunkSimd(const ChunkArgs& a) {
  const int hd = a.hd;
  if (hd % 8 != 0 || (a.value_kind == kValPacked && (a.bits < 2 || a.bits > 4))) {
    ChunkScalar(a);
    return;
  }
  const int64_t T = a.t1 - a.t0;
  float* kbuf = a.scratch;
  float* vbuf = a.scratch + T * hd;
  float* sbuf = a.scratch + 2 * T * hd;

  // Keys of the chunk as f32 [T][hd].
  const float* kf;
  if (a.key_kind == kKeyF32) {
    kf = static_cast<const float*>(a.k) + a.t0 * hd;
  } else {
    for (int64_t t = 0; t < T; ++t)
      for (int i = 0; i < hd; i += 8)
        _mm256_storeu_ps(kbuf + t * hd + i, LoadKey8(a.key_kind, a.k, (a.t0 + t) * hd + i));
    kf = kbuf;
  }
  // Values of the chunk as f32 [T][hd].
  const float* vf;
  if (a.value_kind == kValF32) {
    vf = static_cast<const float*>(a.v) + a.t0 * hd;
  } else if (a.value_kind == kValPacked) {
    const uint8_t* base = static_cast<const uint8_t*>(a.v);
    for (int64_t t = 0; t < T; ++t) {
      const uint8_t* p = base + (a.t0 + t) * a.v_bytes;
      const float nrm = a.v_norms[a.t0 + t];
      if (a.bits == 3) {
        DecodePacked<3>(p, nrm, hd, a.levels, vbuf + t * hd);
      } else if (a.bits == 4) {
        DecodePacked<4>(p, nrm, hd, a.levels, vbuf + t * hd);
      } else {
        DecodePacked<2>(p, nrm, hd, a.levels, vbuf + t * hd);
      }
    }
    vf = vbuf;
  } else {
    const int kk = a.value_kind == kValF16 ? kKeyF16 : kKeyBf16;
    for (int64_t t = 0; t < T; ++t)
      for (int i = 0; i < hd; i += 8)
        _mm256_storeu_ps(vbuf + t * hd + i, LoadKey8(kk, a.v, (a.t0 + t) * hd + i));
    vf = vbuf;
  }

  for (int j = 0; j < a.nq; ++j) {
    float* o = a.o + static_cast<int64_t>(j) * hd;
    const int64_t end = (a.limit[j] < a.t1 ? a.limit[j] : a.t1) - a.t0;
    if (end <= 0) {
      for (int i = 0; i < hd; ++i) o[i] = 0.0f;
      a.m[j] = -__builtin_inff();
      a.l[j] = 0.0f;
      continue;
    }
    const float* q = a.q + static_cast<int64_t>(j) * hd;
    float* s = sbuf + static_cast<int64_t>(j) * T;
    // Scores.
    int64_t t = 0;
    __m256 mv = _mm256_set1_ps(-__builtin_inff());
    for (; t + 8 <= end; t += 8) {
      __m256 acc[8];
      for (int u = 0; u < 8; ++u) acc[u] = _mm256_setzero_ps();
      for (int i = 0; i < hd; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
        for (int u = 0; u < 8; ++u)
          acc[u] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kf + (t + u) * hd + i), acc[u]);
      }
      const __m256 sv = Reduce8(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]);
      _mm256_storeu_ps(s + t, sv);
      mv = _mm256_max_ps(mv, sv);
    }
    float m = Hmax8(mv);
    for (; t < end; ++t) {
      __m256 acc = _mm256_setzero_ps();
      for (int i = 0; i < hd; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(kf + t * hd + i), acc);
      s[t] = Hsum8(acc);
      m = s[t] > m ? s[t] : m;
    }
    // p = exp(s - m), l = sum p.
    const __m256 mb = _mm256_set1_ps(m);
    __m256 lv = _mm256_setzero_ps();
    t = 0;
    for (; t + 8 <= end; t += 8) {
      const __m256 p = Exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), mb));
      _mm256_storeu_ps(s + t, p);
      lv = _mm256_add_ps(lv, p);
    }
    float l = Hsum8(lv);
    for (; t < end; ++t) {
      s[t] = Exp1(s[t] - m);
      l += s[t];
    }
    // o = sum p_t v_t / l, in slices of 64 values (8 accumulators).
    const __m256 inv = _mm256_set1_ps(1.0f / l);
    for (int base = 0; base < hd; base += 64) {
      const int w = hd - base < 64 ? hd - base : 64;
      __m256 acc[8];
      for (int k = 0; k < 8; ++k) acc[k] = _mm256_setzero_ps();
      for (int64_t u = 0; u < end; ++u) {
        const __m256 p = _mm256_set1_ps(s[u]);
        const float* vr = vf + u * hd + base;
        for (int k = 0; k < w / 8; ++k) acc[k] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vr + 8 * k), acc[k]);
      }
      for (int k = 0; k < w / 8; ++k) _mm256_storeu_ps(o + base + 8 * k, _mm256_mul_ps(acc[k], inv));
    }
    a.m[j] = m;
    a.l[j] = l;
  }
}

}  // namespace
}  // namespace polykv::kernels::attn
