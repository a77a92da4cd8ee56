// Per-element math of the decoder's element-wise ops and of greedy sampling, written once
// for g++ and nvcc: the CPU ops (kernels/src/ops.cc, sampling.cc) and the CUDA kernels
// (kernels/cuda/ops_kernels.cu) call these functions, so CI without a GPU tests the GPU's
// arithmetic. With -ffp-contract=off (host) and -fmad=false (device) RoPE, residual adds and
// the RMSNorm scaling are bit-identical on both; SiLU calls expf (host libm: < 1 ulp; CUDA:
// <= 2 ulp), so SiLU-gate results agree to a few ulp.
#pragma once

#include <cmath>
#include <cstdint>

#include "polykv/kernels/dtype_convert.h"

namespace polykv::kernels::opmath {

/// RMSNorm's 1 / sqrt(mean of squares + eps) from the sum of squares (accumulated in f64 by
/// the caller, in its own order): f32(1 / sqrt(sum_sq / dim + eps)) computed in f64.
POLYKV_HD inline float RmsNormInverse(double sum_sq, int64_t dim, float eps) {
  return static_cast<float>(1.0 / sqrt(sum_sq / static_cast<double>(dim) + eps));
}

/// One output of RMSNorm: x * inv * w (in that order).
POLYKV_HD inline float RmsNormValue(float x, float inv, float w) { return x * inv * w; }

/// silu(g) * u = g / (1 + exp(-g)) * u.
POLYKV_HD inline float SiluMulValue(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/// One rotary pair of the HF rotate_half layout: (a, b) = (x_i, x_{i+d/2}) with the tables'
/// entries i (c0, s0) and i + d/2 (c1, s1): a' = a c0 - b s0, b' = b c1 + a s1.
POLYKV_HD inline void RopePair(float a, float b, float c0, float s0, float c1, float s1, float* oa,
                               float* ob) {
  *oa = a * c0 - b * s0;
  *ob = b * c1 + a * s1;
}

/// Whether logit (v, i) beats the best so far (best, bi) for greedy decoding: the larger
/// value wins, NaN counting as larger than every number (as torch.argmax and numpy.argmax
/// do), and equal values (or two NaNs) go to the lower id.
POLYKV_HD inline bool LogitBeats(float v, int64_t i, float best, int64_t bi) {
  const bool vn = v != v, bn = best != best;
  if (vn || bn) return vn && (!bn || i < bi);
  return v > best || (v == best && i < bi);
}

}  // namespace polykv::kernels::opmath
