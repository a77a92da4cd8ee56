// Reproducible random inputs for tests and benchmarks: splitmix64 bytes and N(0, sigma^2)
// floats from a fixed seed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace polykv::support {

/// Fills p[0, n) with splitmix64 words (Steele, Lea & Flood 2014) from `seed`, little-endian,
/// the last word cut to fit.
inline void FillSplitMix64(uint8_t* p, uint64_t n, uint64_t seed) {
  uint64_t x = seed;
  for (uint64_t i = 0; i < n; i += 8) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(p + i, &z, std::min<uint64_t>(8, n - i));
  }
}

/// n bytes of FillSplitMix64 from `seed`.
inline std::vector<uint8_t> SplitMix64Bytes(uint64_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  FillSplitMix64(v.data(), n, seed);
  return v;
}

/// n i.i.d. N(0, sigma^2) floats (std::normal_distribution over std::mt19937_64(seed)).
inline std::vector<float> Gaussian(size_t n, uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

}  // namespace polykv::support
