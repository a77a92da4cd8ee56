// The part of a LlamaModel that both runtimes share (llama.cc): configuration, cache
// checks, Prefill, Generate, Perplexity and sampling, all on top of one ForwardImpl that
// each runtime (mapped kernels in mapped_llama.cc; the libtorch reference of the optional
// polykv_model_torch target in torch/) provides.
#pragma once

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "polykv/model/llama.h"

namespace polykv::model::internal {

class LlamaBase : public LlamaModel {
 public:
  LlamaBase(ModelConfig config, std::unique_ptr<Tokenizer> tokenizer, std::string fingerprint);

  const ModelConfig& config() const override { return config_; }
  const Tokenizer* tokenizer() const override { return tokenizer_.get(); }
  const std::string& fingerprint() const override { return fingerprint_; }
  kernels::DType dtype() const override { return kernels::DType::kF32; }

  KvCache NewCache(int64_t capacity) const override;
  [[nodiscard]] StatusOr<Logits> Forward(absl::Span<const int32_t> tokens, KvCache& cache,
                                         bool all_logits) override;
  [[nodiscard]] StatusOr<PrefillResult> Prefill(
      absl::Span<const int32_t> tokens, int64_t chunk,
      const std::function<void(int64_t, int64_t)>& progress) override;
  [[nodiscard]] StatusOr<GenerateResult> Generate(KvCache& cache, absl::Span<const int32_t> prompt,
                                                  const SamplingOptions& options) override;
  [[nodiscard]] StatusOr<PerplexityResult> Perplexity(absl::Span<const int32_t> tokens,
                                                      int64_t context, int64_t stride) override;
  [[nodiscard]] StatusOr<Logits> ForwardBatch(absl::Span<KvCache* const> caches,
                                              absl::Span<const int32_t> tokens) override;
  [[nodiscard]] StatusOr<Logits> ForwardPrompts(
      absl::Span<KvCache* const> caches,
      absl::Span<const absl::Span<const int32_t>> prompts) override;

 protected:
  /// Runs `tokens` at positions cache.length.., appends their K/V to the suffix, returns f32
  /// logits for positions >= logits_from (relative to the first new token):
  /// [n - logits_from][vocab] (logits_from == n: no logits, no lm_head work). Validates ids
  /// and the cache itself.
  [[nodiscard]] virtual StatusOr<Logits> ForwardImpl(absl::Span<const int32_t> tokens,
                                                     KvCache& cache, int64_t logits_from) = 0;

  /// ForwardBatch after its checks (sizes, distinct caches, one shared prefix, windows):
  /// one new token per cache, logits f32 [S][vocab]; on error no cache's length or tokens
  /// changed. This default runs one ForwardImpl per session (the reference runtime); the
  /// mapped runtime batches the step.
  [[nodiscard]] virtual StatusOr<Logits> ForwardBatchImpl(absl::Span<KvCache* const> caches,
                                                          absl::Span<const int32_t> tokens);

  /// ForwardPrompts after its checks (as ForwardBatch's, and no empty prompt): logits f32
  /// [S][vocab] of each session's last prompt row; on error no cache's length or tokens
  /// changed. This default runs one ForwardImpl per session; the mapped runtime runs one
  /// forward over all sessions' rows.
  [[nodiscard]] virtual StatusOr<Logits> ForwardPromptsImpl(
      absl::Span<KvCache* const> caches, absl::Span<const absl::Span<const int32_t>> prompts);

  /// The checks of a batch (ForwardBatch, ForwardPrompts, named `what` in errors): at least one
  /// cache, one per input, none null or twice, one shared prefix, rows[i] > 0 new positions
  /// for cache i within the sliding window.
  [[nodiscard]] Status CheckBatch(absl::Span<KvCache* const> caches, absl::Span<const int64_t> rows,
                                  const char* what) const;

  /// ForwardImpl after CheckWindow: every forward pass of LlamaBase goes through here.
  [[nodiscard]] StatusOr<Logits> Step(absl::Span<const int32_t> tokens, KvCache& cache,
                                      int64_t logits_from);
  /// kOutOfRange when a model with a sliding window (ModelConfig::sliding_window) would hold
  /// more than that many positions after `n` more at `past` (full attention would differ).
  [[nodiscard]] Status CheckWindow(int64_t past, int64_t n) const;
  /// Checks the cache's tensors (suffix) and prefix against the model.
  [[nodiscard]] Status CheckCache(const KvCache& c) const;
  /// Grows the suffix to hold `needed` positions (reallocation to max(needed, 2 x capacity)).
  /// kResourceExhausted when the allocation fails.
  [[nodiscard]] Status EnsureCapacity(KvCache& c, int64_t needed) const;
  /// Checks token ids against the vocabulary.
  [[nodiscard]] Status CheckTokens(absl::Span<const int32_t> tokens) const;
  /// RoPE angles' cos and sin for positions [past, past + n): [n][head_dim] each (HF layout:
  /// the head_dim/2 frequencies twice), computed in f64 and rounded to f32; both times
  /// rope_attention_factor_ (YaRN).
  void RopeTables(int64_t past, int64_t n, float* cos, float* sin) const;

  bool IsEos(int32_t id) const;

  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::string fingerprint_;
  std::vector<double> inv_freq_;      // [head_dim/2], after ScaleRopeFrequencies
  double rope_attention_factor_ = 1;  // YaRN's cos/sin multiplier (1 otherwise)
};

/// Applies config.rope_scaling (llama3, yarn, freq_factors; none and linear leave them) to
/// the head_dim/2 RoPE frequencies f[j] = theta^(-2j/head_dim), in place.
void ScaleRopeFrequencies(const ModelConfig& config, double* f);

}  // namespace polykv::model::internal
