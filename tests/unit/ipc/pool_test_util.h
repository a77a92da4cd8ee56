// Helpers shared by the pool tests (pool_layout_test.cc, pool_file_test.cc, cuda_ipc_test.cc):
// the parameters of a small test pool, token ids and random K/V layers.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "polykv/ipc/pool_layout.h"

namespace polykv::ipc::testing {

/// A pool of `layers` x `kv_heads` x `head_dim` over `tokens` tokens with `codec` (3 value
/// bits) and tokenizer fingerprint "none"; the model fingerprint is the caller's.
inline PoolParams TestPoolParams(uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
                                 uint64_t tokens, PoolCodec codec = PoolCodec::kK8V) {
  PoolParams p;
  p.layers = layers;
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.tokens = tokens;
  p.codec = codec;
  p.codec_config.value_bits = 3;
  p.tokenizer_fingerprint = "none";
  return p;
}

/// The token ids 0, 1, ..., n - 1.
inline std::vector<int32_t> Iota(uint64_t n) {
  std::vector<int32_t> ids(n);
  for (uint64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(i);
  return ids;
}

/// One layer's K or V of `p` ([kv_heads][tokens][head_dim]): i.i.d. N(0, sigma^2) values
/// from std::mt19937(seed).
inline std::vector<float> RandomKv(const PoolParams& p, uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, sigma);
  std::vector<float> v(size_t{p.kv_heads} * p.tokens * p.head_dim);
  for (auto& x : v) x = n(rng);
  return v;
}

}  // namespace polykv::ipc::testing
