// The AVX2 table of the matrix kernels (this file is compiled with -mavx2 -mfma -mf16c; the
// dispatcher calls it only on CPUs with those features).
#include "matmul_avx2_impl.h"

namespace polykv::kernels::mm {

const DotTable& Avx2Table() {
  static const DotTable t = [] {
    DotTable d;
    d.isa = "avx2";
    FillAvx2(&d);
    return d;
  }();
  return t;
}

}  // namespace polykv::kernels::mm

namespace polykv::kernels::mm {

// The bytes of QuantizeActQ8 (matmul_scalar.cc), 8 lanes at a time: the same absmax (exact),
// the same scalar d = absmax / 127 and id = 127 / absmax, q1 = rint(x * id) by vcvtps2dq
// (round to nearest even, as rintf), the residual q2 = rint(256 (f - q1)) clamped to
// [-127, 127], exact integer sums.
namespace {
// 32 int32 in value order -> 32 int8 (packs work per 128-bit lane: fixed with a permute).
inline __m256i Pack32(const __m256i* q) {
  const __m256i p01 = _mm256_packs_epi32(q[0], q[1]);
  const __m256i p23 = _mm256_packs_epi32(q[2], q[3]);
  return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23),
                                     _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
inline int32_t Sum8(__m256i v) {
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
  return _mm_cvtsi128_si32(s4);
}
inline void Store32(uint8_t* base, bool permuted, int64_t nb, int64_t b, __m256i b8) {
  if (!permuted || b >= nb / 4 * 4) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(base + 32 * b), b8);
  } else {
    const int64_t g = b / 4, r = b % 4;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(base + 128 * g + 16 * r),
                     _mm256_castsi256_si128(b8));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(base + 128 * g + 64 + 16 * r),
                     _mm256_extracti128_si256(b8, 1));
  }
}
}  // namespace

void QuantizeActQ8Avx2(const float* x, int64_t cols, bool permuted, uint8_t* row) {
  const int64_t nb = cols / 32;
  uint8_t* res = ActQ8Residual(row, nb);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + 32 * b;
    __m256 v[4];
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(xb + 8 * k);
      m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[k]));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float amax = _mm_cvtss_f32(h);
    const float d = amax / 127.0f;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const __m256 idv = _mm256_set1_ps(id);
    __m256i q[4], r[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 f = _mm256_mul_ps(v[k], idv);
      q[k] = _mm256_cvtps_epi32(f);
      const __m256 frac = _mm256_sub_ps(f, _mm256_cvtepi32_ps(q[k]));
      r[k] = _mm256_cvtps_epi32(_mm256_mul_ps(frac, _mm256_set1_ps(256.0f)));
      r[k] = _mm256_max_epi32(_mm256_min_epi32(r[k], lim), nlim);
    }
    const int32_t s1 =
        Sum8(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    const int32_t s2 =
        Sum8(_mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3])));
    Store32(row, permuted, nb, b, Pack32(q));
    Store32(res, permuted, nb, b, Pack32(r));
    SetActQ8Scales(row, nb, b, d, 256 * s1 + s2);
  }
}

}  // namespace polykv::kernels::mm

namespace polykv::kernels::mm {

// Dequantization of Q4_0 / Q4_1 / Q8_0 blocks with the scalar reference's exact arithmetic
// (separate multiply and add, no FMA: the same f32 roundings), 8 values per instruction.
bool DequantizeBlocksAvx2(int type_index, const uint8_t* src, int64_t nb, float* out) {
  const __m128i m4 = _mm_set1_epi8(0x0f);
  switch (type_index) {
    case kTQ4_0:
    case kTQ4_1: {
      const bool has_min = type_index == kTQ4_1;
      const int kB = has_min ? 20 : 18;
      for (int64_t b = 0; b < nb; ++b, src += kB, out += 32) {
        const __m256 d = _mm256_set1_ps(H16(src));
        const __m256 m = has_min ? _mm256_set1_ps(H16(src + 2)) : _mm256_setzero_ps();
        const __m128i raw =
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + (has_min ? 4 : 2)));
        const __m128i lo = _mm_and_si128(raw, m4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
        const __m128i parts[2] = {lo, hi};
        for (int p = 0; p < 2; ++p) {
          for (int h = 0; h < 2; ++h) {
            const __m128i bytes = h == 0 ? parts[p] : _mm_srli_si128(parts[p], 8);
            __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
            if (!has_min) q = _mm256_sub_ps(q, _mm256_set1_ps(8.0f));
            __m256 y = _mm256_mul_ps(q, d);
            if (has_min) y = _mm256_add_ps(y, m);
            _mm256_storeu_ps(out + 16 * p + 8 * h, y);
          }
        }
      }
      return true;
    }
    case kTQ8_0:
      for (int64_t b = 0; b < nb; ++b, src += 34, out += 32) {
        const __m256 d = _mm256_set1_ps(H16(src));
        for (int k = 0; k < 4; ++k) {
          const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + 2 + 8 * k));
          _mm256_storeu_ps(out + 8 * k,
                           _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), d));
        }
      }
      return true;
    default:
      return false;
  }
}

}  // namespace polykv::kernels::mm
