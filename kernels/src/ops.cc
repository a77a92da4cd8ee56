// Element-wise decoder ops: scalar reference and dispatch to the AVX2 variants.
#include "polykv/kernels/ops.h"

#include <cmath>

#include "ops_internal.h"
#include "polykv/kernels/cpu.h"
#include "polykv/kernels/ops_math.h"

namespace polykv::kernels {
namespace ops {

void SiluMulScalar(const float* gate, const float* up, int64_t count, float* out) {
  for (int64_t i = 0; i < count; ++i) out[i] = opmath::SiluMulValue(gate[i], up[i]);
}

}  // namespace ops

void RmsNormRows(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double{xr[i]} * xr[i];
    const float inv = opmath::RmsNormInverse(ss, dim, eps);
    float* o = out + r * dim;
    for (int64_t i = 0; i < dim; ++i) o[i] = opmath::RmsNormValue(xr[i], inv, w[i]);
  }
}

void SiluMul(const float* gate, const float* up, int64_t count, float* out) {
#ifdef POLYKV_HAVE_AVX2_KERNELS
  if (BestIsa() >= Isa::kAvx2) {
    ops::SiluMulAvx2(gate, up, count, out);
    return;
  }
#endif
  ops::SiluMulScalar(gate, up, count, out);
}

void RopeHeads(float* x, int32_t heads, int32_t head_dim, const float* cos, const float* sin) {
  const int32_t half = head_dim / 2;
  for (int32_t h = 0; h < heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    for (int32_t i = 0; i < half; ++i) {
      opmath::RopePair(v[i], v[i + half], cos[i], sin[i], cos[i + half], sin[i + half], &v[i],
                       &v[i + half]);
    }
  }
}

}  // namespace polykv::kernels
