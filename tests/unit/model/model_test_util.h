// Helpers of the model tests: loading, expected config sizes, comparisons of plain f32 buffers
// and K/V rows of a KvCache.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "polykv/model/llama.h"

namespace polykv::model::testing {

/// $POLYKV_SMOLLM2_GGUF when it names an existing file, else "" (the SmolLM2 cases skip).
inline std::string SmolLM2Path() {
  const char* p = std::getenv("POLYKV_SMOLLM2_GGUF");
  return p != nullptr && std::filesystem::exists(p) ? p : "";
}

/// The model at `path` loaded with `threads` compute threads (the other options default).
inline StatusOr<std::unique_ptr<LlamaModel>> LoadModel(const std::string& path, int threads) {
  LoadOptions o;
  o.threads = threads;
  return LlamaModel::Load(path, o);
}

/// The sizes and special ids a test expects of a ModelConfig; a field left at -1 is not
/// checked.
struct ExpectedDims {
  int32_t layers = -1, hidden = -1, heads = -1, kv_heads = -1, head_dim = -1, ffn = -1, vocab = -1,
          bos_id = -1, eos_id = -1;
};

/// EXPECT_EQ of each checked field of `want` against `c` (a failure names the field).
inline void ExpectDims(const ModelConfig& c, const ExpectedDims& want) {
  const struct {
    const char* name;
    int32_t got, want;
  } fields[] = {{"layers", c.layers, want.layers},       {"hidden", c.hidden, want.hidden},
                {"heads", c.heads, want.heads},          {"kv_heads", c.kv_heads, want.kv_heads},
                {"head_dim", c.head_dim, want.head_dim}, {"ffn", c.ffn, want.ffn},
                {"vocab", c.vocab, want.vocab},          {"bos_id", c.bos_id, want.bos_id},
                {"eos_id", c.eos_id, want.eos_id}};
  for (const auto& f : fields) {
    if (f.want != -1) {
      EXPECT_EQ(f.got, f.want) << f.name;
    }
  }
}

/// n deterministic token ids in [0, vocab): (i * 7919 + seed * 104729 + 13) % vocab.
inline std::vector<int32_t> Tokens(int64_t n, int32_t vocab, int32_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + seed * 104729 + 13) % vocab);
  return ids;
}

/// max |a_i - b_i|; +inf when the sizes differ (so a size mismatch fails any tolerance).
inline float MaxAbsDiff(absl::Span<const float> a, absl::Span<const float> b) {
  if (a.size() != b.size()) return std::numeric_limits<float>::infinity();
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

/// Suffix slots [0, n) of a cache buffer [kv_heads][capacity][head_dim] as
/// [kv_heads][n][head_dim].
inline std::vector<float> CacheRows(const KvCache& c, const std::vector<float>& buf,
                                    int64_t kv_heads, int64_t head_dim, int64_t n) {
  std::vector<float> out(static_cast<size_t>(kv_heads * n * head_dim));
  for (int64_t h = 0; h < kv_heads; ++h)
    std::copy_n(buf.begin() + h * c.capacity * head_dim, n * head_dim,
                out.begin() + h * n * head_dim);
  return out;
}

/// Copies suffix positions [0, n) of every layer of `from` into `to` (both
/// [kv_heads][capacity][head_dim], capacities may differ).
inline void CopyCacheRows(const KvCache& from, KvCache& to, int64_t kv_heads, int64_t head_dim,
                          int64_t n) {
  for (size_t l = 0; l < from.k.size(); ++l) {
    for (int64_t h = 0; h < kv_heads; ++h) {
      std::copy_n(from.k[l].begin() + h * from.capacity * head_dim, n * head_dim,
                  to.k[l].begin() + h * to.capacity * head_dim);
      std::copy_n(from.v[l].begin() + h * from.capacity * head_dim, n * head_dim,
                  to.v[l].begin() + h * to.capacity * head_dim);
    }
  }
}

/// Positions [p0, p0 + n) of a [kv_heads][tokens][head_dim] buffer as [kv_heads][n][head_dim].
inline std::vector<float> Positions(const std::vector<float>& buf, int64_t kv_heads, int64_t tokens,
                                    int64_t head_dim, int64_t p0, int64_t n) {
  std::vector<float> out(static_cast<size_t>(kv_heads * n * head_dim));
  for (int64_t h = 0; h < kv_heads; ++h)
    std::copy_n(buf.begin() + (h * tokens + p0) * head_dim, n * head_dim,
                out.begin() + h * n * head_dim);
  return out;
}

/// log softmax(row)[target] entirely in f64 (an independent reference for LogProb).
inline double LogSoftmaxF64(absl::Span<const float> row, int32_t target) {
  double mx = -std::numeric_limits<double>::infinity();
  for (float x : row) mx = std::max(mx, static_cast<double>(x));
  double sum = 0;
  for (float x : row) sum += std::exp(static_cast<double>(x) - mx);
  return static_cast<double>(row[static_cast<size_t>(target)]) - mx - std::log(sum);
}

}  // namespace polykv::model::testing
