// AVX-512 helpers shared by the SIMD sources compiled with AVX-512 flags (the attention
// chunk's AVX-512 build and the AMX attention scores). Internal linkage only.
#pragma once

#include <immintrin.h>

namespace polykv::kernels::simd {
namespace {

// 16 x 16 f32 transpose in registers: r[i] = row i on entry, column i on return.
inline void Transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512d a = _mm512_castps_pd(t[4 * k]), b = _mm512_castps_pd(t[4 * k + 1]),
                  c = _mm512_castps_pd(t[4 * k + 2]), d = _mm512_castps_pd(t[4 * k + 3]);
    r[4 * k + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int k = 0; k < 2; ++k)
    for (int c = 0; c < 4; ++c) {
      t[8 * k + c] = _mm512_shuffle_f32x4(r[8 * k + c], r[8 * k + 4 + c], 0x88);
      t[8 * k + 4 + c] = _mm512_shuffle_f32x4(r[8 * k + c], r[8 * k + 4 + c], 0xdd);
    }
  for (int c = 0; c < 8; ++c) {
    r[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
    r[8 + c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xdd);
  }
}

}  // namespace
}  // namespace polykv::kernels::simd
