// Element-wise operations of a decoder layer on f32 rows (RMSNorm, SwiGLU's SiLU-and-multiply,
// rotary position embedding), with a scalar reference and AVX2 variants chosen from CPUID.
#pragma once

#include <cstdint>

namespace polykv::kernels {

/// out[r][i] = x[r][i] * w[i] / sqrt(mean_i(x[r][i]^2) + eps) for r < rows (RMSNorm, Zhang &
/// Sennrich 2019; the mean of squares accumulated in f64). `out` may alias `x`.
void RmsNormRows(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* out);

/// out[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i] (SwiGLU, Shazeer
/// 2020). The AVX2 variant uses a polynomial exp (relative error < 2e-7). `out` may alias.
void SiluMul(const float* gate, const float* up, int64_t count, float* out);

/// Rotary position embedding in the HF rotate_half layout on `heads` vectors of head_dim
/// (x[h][i], i < head_dim): x_i' = x_i cos_i - x_{i+d/2} sin_i, x_{i+d/2}' = x_{i+d/2} cos_i +
/// x_i sin_i, with cos/sin [head_dim] (the d/2 angles twice, as RopeTables writes them).
void RopeHeads(float* x, int32_t heads, int32_t head_dim, const float* cos, const float* sin);

}  // namespace polykv::kernels
