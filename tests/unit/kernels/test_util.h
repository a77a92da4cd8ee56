// Helpers shared by the codec tests: deterministic inputs and small reductions.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "polykv/kernels/codec.h"
#include "polykv/kernels/codec_math.h"

namespace polykv::kernels::testing {

/// n i.i.d. N(0, sigma^2) floats from a fixed seed.
inline std::vector<float> Gaussian(size_t n, uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

/// Relative MSE sum|a-b|^2 / sum|b|^2 (in double).
inline double RelMse(const std::vector<float>& approx, const std::vector<float>& exact) {
  double num = 0, den = 0;
  for (size_t i = 0; i < exact.size(); ++i) {
    const double e = double{approx[i]} - double{exact[i]};
    num += e * e;
    den += double{exact[i]} * double{exact[i]};
  }
  return num / den;
}

/// f32 -> dtype bytes (as uint16 for f16/bf16; f32 kept as raw bits in a float vector).
inline std::vector<uint16_t> ToHalf(const std::vector<float>& v, DType t) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out[i] = t == DType::kF16 ? math::FloatToF16(v[i]) : math::FloatToBf16(v[i]);
  }
  return out;
}

inline std::vector<float> FromHalf(const std::vector<uint16_t>& v, DType t) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out[i] = t == DType::kF16 ? math::F16ToFloat(v[i]) : math::Bf16ToFloat(v[i]);
  }
  return out;
}

/// Codes of vector `vi` unpacked from a packed V buffer.
inline std::vector<uint8_t> CodesOf(const std::vector<uint8_t>& packed, int64_t vi, int d,
                                    int bits) {
  std::vector<uint8_t> codes(d);
  math::UnpackCodes(packed.data() + vi * PackedVectorBytes(d, bits), d, bits, codes.data());
  return codes;
}

}  // namespace polykv::kernels::testing
