// Inputs shared by the matrix and device-kernel tests (CPU: matmul_test.cc,
// device_ops_test.cc; CUDA: tests/kernels/device_ops_cuda_test.cc): random but valid weight
// blocks and activations.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "polykv/kernels/dtype_convert.h"
#include "polykv/kernels/matmul.h"

namespace polykv::kernels::testing {

/// The weight types with device kernels.
inline constexpr WeightType kDeviceTypes[] = {
    WeightType::kF32,  WeightType::kF16,  WeightType::kBF16, WeightType::kQ4_0,
    WeightType::kQ4_1, WeightType::kQ5_0, WeightType::kQ5_1, WeightType::kQ8_0};

inline void PutF16(uint8_t* p, float v) {
  const uint16_t h = dtype::FloatToF16(v);
  std::memcpy(p, &h, 2);
}

/// Random blocks of `type` for [rows][cols]: random code bytes, finite f16 scales and mins,
/// F32/F16/BF16 values in [-1, 1]. K-quant super-blocks get small super-scales, so their
/// 6-bit sub-scales keep the values in range.
inline std::vector<uint8_t> RandomWeightBytes(WeightType type, int64_t rows, int64_t cols,
                                              uint64_t seed) {
  const BlockFormat f = WeightBlockFormat(type).value();
  const int64_t nb = rows * cols / f.values;
  std::vector<uint8_t> w(static_cast<size_t>(nb * f.bytes));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.002f, 0.05f), sym(-1.0f, 1.0f);
  for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* p = w.data() + b * f.bytes;
    switch (type) {
      case WeightType::kF32: {
        const float v = sym(rng);
        std::memcpy(p, &v, 4);
        break;
      }
      case WeightType::kF16:
        PutF16(p, sym(rng));
        break;
      case WeightType::kBF16: {
        const uint16_t h = dtype::FloatToBf16(sym(rng));
        std::memcpy(p, &h, 2);
        break;
      }
      case WeightType::kQ4_1:
      case WeightType::kQ5_1:
        PutF16(p, scale(rng));
        PutF16(p + 2, -8 * scale(rng));
        break;
      case WeightType::kQ4_0:
      case WeightType::kQ5_0:
      case WeightType::kQ8_0:
        PutF16(p, scale(rng));
        break;
      case WeightType::kQ4_K:
      case WeightType::kQ5_K:
        PutF16(p, scale(rng) * 0.1f);
        PutF16(p + 2, scale(rng) * 0.1f);
        break;
      case WeightType::kQ6_K:
        PutF16(p + 208, scale(rng) * 0.05f);
        break;
    }
  }
  return w;
}

/// n x cols activations, N(0, 1).
inline std::vector<float> RandomRows(int64_t n, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g;
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (auto& v : x) v = g(rng);
  return x;
}

/// gamma(k) = k u / (1 - k u), u = 2^-24: the bound of a k-term f32 sum's relative error
/// (Higham, Accuracy and Stability of Numerical Algorithms, eq. 3.4), for any summation order.
inline double Gamma(int64_t k) {
  const double u = 0x1.0p-24;
  return k * u / (1 - k * u);
}

}  // namespace polykv::kernels::testing
