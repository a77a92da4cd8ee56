// Internal declarations of the element-wise ops' variants (no inline code: included by the
// AVX2 source too).
#pragma once

#include <cstdint>

namespace polykv::kernels::ops {

void SiluMulScalar(const float* gate, const float* up, int64_t count, float* out);
void SiluMulAvx2(const float* gate, const float* up, int64_t count, float* out);

}  // namespace polykv::kernels::ops
