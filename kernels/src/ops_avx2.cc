// AVX2 variants of the element-wise ops (compiled with -mavx2 -mfma -mf16c).
#include "avx2_math.h"
#include "ops_internal.h"

namespace polykv::kernels::ops {

void SiluMulAvx2(const float* gate, const float* up, int64_t count, float* out) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= count; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    // exp(-g) for any sign: exp(-|g|) then the reciprocal where g < 0.
    const __m256 neg_abs =
        _mm256_sub_ps(_mm256_setzero_ps(), _mm256_andnot_ps(_mm256_set1_ps(-0.0f), g));
    const __m256 e = simd::Exp8(neg_abs);  // exp(-|g|) in (0, 1]
    const __m256 pos = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_GE_OQ);
    // sigmoid(g) = 1 / (1 + exp(-g)): for g >= 0 that is 1 / (1 + e), for g < 0 e / (1 + e).
    const __m256 den = _mm256_add_ps(one, e);
    const __m256 sig = _mm256_div_ps(_mm256_blendv_ps(e, one, pos), den);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sig), _mm256_loadu_ps(up + i)));
  }
  if (i < count) SiluMulScalar(gate + i, up + i, count - i, out + i);
}

}  // namespace polykv::kernels::ops
