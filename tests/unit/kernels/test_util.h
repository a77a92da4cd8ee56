// Helpers shared by the codec and attention tests (CPU, and tests/kernels for CUDA):
// deterministic inputs, small reductions and the arguments of an attention call.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "polykv/kernels/attention.h"
#include "polykv/kernels/codec.h"
#include "polykv/kernels/codec_math.h"
#include "support/random.h"

namespace polykv::kernels::testing {

/// The key-scale modes, for tests that run every one.
inline constexpr KeyScaleMode kKeyScaleModes[] = {KeyScaleMode::kPerTensor, KeyScaleMode::kPerHead,
                                                  KeyScaleMode::kPerChannel};

using support::Gaussian;  // n i.i.d. N(0, sigma^2) floats from a fixed seed

/// max |approx - exact| (in double).
template <typename T>
double MaxAbsError(const std::vector<float>& approx, const std::vector<T>& exact) {
  double max_err = 0;
  for (size_t i = 0; i < exact.size(); ++i)
    max_err = std::max(max_err, std::fabs(double{approx[i]} - double{exact[i]}));
  return max_err;
}

/// The sizes of an attention call: the suffix cache's capacity and valid length (rows per KV
/// head), the query rows, the query and KV heads and the head size.
struct AttentionDims {
  int64_t capacity, length, n;
  int heads, kv_heads, head_dim;
};

/// AttentionArgs of `d` over the f32 suffix K/V `k`, `v` ([kv_heads][capacity][head_dim]) and
/// the queries `q` ([n][heads][head_dim]) into `out`; the prefix is the caller's to set.
inline AttentionArgs SuffixArgs(const AttentionDims& d, const float* k, const float* v,
                                const float* q, float* out = nullptr) {
  AttentionArgs a;
  a.k_suffix = k;
  a.v_suffix = v;
  a.suffix_capacity = d.capacity;
  a.suffix_length = d.length;
  a.n = d.n;
  a.heads = d.heads;
  a.kv_heads = d.kv_heads;
  a.head_dim = d.head_dim;
  a.q = q;
  a.out = out;
  return a;
}

/// BatchAttentionArgs of `sessions` with `heads`, `kv_heads` and `head_dim`; the prefix (and
/// its tail) is the caller's to set.
inline BatchAttentionArgs BatchArgs(int heads, int kv_heads, int head_dim,
                                    absl::Span<const AttentionSession> sessions) {
  BatchAttentionArgs b;
  b.heads = heads;
  b.kv_heads = kv_heads;
  b.head_dim = head_dim;
  b.sessions = sessions;
  return b;
}

/// SlotAttentionArgs of `rows` decode rows over a slab of `slots` slots of `capacity`
/// positions (`k`, `v`; max_length = capacity), rows' slots and lengths `slot`, `len`, the
/// queries `q` ([rows][heads][head_dim]) into `out`; the prefix is the caller's to set.
inline SlotAttentionArgs SlotArgs(int heads, int kv_heads, int head_dim, const float* k,
                                  const float* v, int64_t slots, int64_t capacity, int64_t rows,
                                  const int32_t* slot, const int64_t* len, const float* q,
                                  float* out) {
  SlotAttentionArgs a;
  a.k_slab = k;
  a.v_slab = v;
  a.slots = slots;
  a.capacity = capacity;
  a.rows = rows;
  a.row_slot = slot;
  a.row_length = len;
  a.max_length = capacity;
  a.heads = heads;
  a.kv_heads = kv_heads;
  a.head_dim = head_dim;
  a.q = q;
  a.out = out;
  return a;
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
