// Llama-family decoder runtime on libtorch: load (HF safetensors folder or GGUF), prefill,
// decode from a caller-supplied KV cache, sampling, perplexity.
//
// Architecture: RMSNorm, RoPE (rope_theta from the model, HF rotate_half layout),
// SwiGLU MLP, grouped-query attention, tied or separate output embeddings
// (Llama 2/3, SmolLM/SmolLM2, TinyLlama, Mistral without sliding window).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/types/span.h"
#include "polykv/model/tokenizer.h"
#include "polykv/status.h"

namespace polykv::model {

/// Hyper-parameters read from config.json or GGUF llama.* metadata.
struct ModelConfig {
  std::string architecture;   ///< "llama"
  int32_t layers = 0;
  int32_t hidden = 0;
  int32_t heads = 0;          ///< query heads
  int32_t kv_heads = 0;       ///< GQA: KV heads (divides heads)
  int32_t head_dim = 0;       ///< hidden / heads
  int32_t ffn = 0;            ///< SwiGLU intermediate size
  int32_t vocab = 0;
  int32_t max_positions = 0;  ///< context length the model was trained for
  float rope_theta = 10000.f;
  /// Linear RoPE scaling (HF rope_scaling {type: linear, factor}): positions are divided
  /// by this factor; 1 = none.
  float rope_linear_scale = 1.f;
  float rms_eps = 1e-5f;
  bool tied_embeddings = false;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
};

/// How to load a model.
struct LoadOptions {
  /// libtorch intra-op threads; 0 = all cores (std::thread::hardware_concurrency()).
  int threads = 0;
  /// Compute device; CUDA when available and requested.
  torch::Device device = torch::kCPU;
  /// Compute dtype of weights and the KV cache: kFloat32 on CPU, kBFloat16 on GPU.
  torch::ScalarType dtype = torch::kFloat32;
};

/// A KV cache: per layer K and V, each [kv_heads][capacity][head_dim] in the model's
/// dtype/device, K stored after RoPE. The first `length` positions are valid; `tokens`
/// holds their ids (size == length).
struct KvCache {
  std::vector<torch::Tensor> k;  ///< [layers] x [kv_heads][capacity][head_dim]
  std::vector<torch::Tensor> v;  ///< [layers] x [kv_heads][capacity][head_dim]
  std::vector<int32_t> tokens;   ///< ids of the cached positions
  int64_t length = 0;            ///< valid positions
  int64_t capacity() const { return k.empty() ? 0 : k[0].size(1); }
};

/// Result of Prefill: the document's K/V per layer and the last position's logits.
struct PrefillResult {
  std::vector<torch::Tensor> k;  ///< [layers] x [kv_heads][tokens][head_dim], after RoPE
  std::vector<torch::Tensor> v;  ///< [layers] x [kv_heads][tokens][head_dim]
  torch::Tensor last_logits;     ///< [vocab] f32
};

/// Sampling settings for Generate.
struct SamplingOptions {
  int32_t max_new_tokens = 64;
  bool greedy = true;         ///< argmax; otherwise temperature + top-p
  float temperature = 0.8f;
  float top_p = 0.95f;
  uint64_t seed = 0;
  bool stop_at_eos = true;    ///< stop on Tokenizer::IsEndOfGeneration / config eos_id
};

/// Output of Generate.
struct GenerateResult {
  std::vector<int32_t> tokens;     ///< new tokens (without the prompt)
  double first_token_ms = 0;       ///< time from call to the first new token (TTFT)
  double total_ms = 0;
};

/// Output of Perplexity.
struct PerplexityResult {
  int64_t tokens_scored = 0;
  double mean_nll = 0;    ///< nats per token
  double perplexity = 0;  ///< exp(mean_nll)
};

/// A loaded model. Forward passes are not reentrant: one thread at a time per model.
class LlamaModel {
 public:
  /// Loads a HF folder (config.json + model.safetensors or sharded index) or a .gguf file.
  /// Errors: kNotFound for a missing path; kInvalidArgument / kDataLoss for malformed files;
  /// kUnimplemented naming an unsupported architecture field or tensor type.
  static StatusOr<std::unique_ptr<LlamaModel>> Load(const std::string& path,
                                                    const LoadOptions& options = {});
  virtual ~LlamaModel() = default;

  virtual const ModelConfig& config() const = 0;
  /// nullptr when the model ships no tokenizer (e.g. stories260K: use token ids).
  virtual const Tokenizer* tokenizer() const = 0;
  /// Hex SHA-256 identifying the weights and config: part of a pool id.
  virtual const std::string& fingerprint() const = 0;
  virtual torch::Device device() const = 0;
  virtual torch::ScalarType dtype() const = 0;

  /// An empty cache with room for `capacity` positions.
  virtual KvCache NewCache(int64_t capacity) const = 0;

  /// Runs `tokens` at positions cache.length .. cache.length+n-1, appending their K/V
  /// (grows capacity if needed: reallocation to max(needed, 2 x capacity), so tensors held
  /// elsewhere stop aliasing the cache). A default-constructed (empty) KvCache is allocated
  /// on first use. The cache must match the model: [layers] tensors of
  /// [kv_heads][capacity][head_dim] in dtype()/device(), tokens.size() == length. Returns logits f32 [n][vocab] when `all_logits`, else
  /// [1][vocab] for the last position. Errors: kInvalidArgument for ids outside the vocab
  /// or an empty `tokens`; kResourceExhausted when out of memory.
  virtual StatusOr<torch::Tensor> Forward(absl::Span<const int32_t> tokens, KvCache& cache,
                                          bool all_logits = false) = 0;

  /// Prefills a document from scratch in chunks of `chunk` tokens, calling
  /// `progress(done, total)` after each. Returns K/V [kv_heads][tokens][head_dim] per layer.
  virtual StatusOr<PrefillResult> Prefill(
      absl::Span<const int32_t> tokens, int64_t chunk = 512,
      const std::function<void(int64_t, int64_t)>& progress = nullptr) = 0;

  /// Continues from `cache` (e.g. decompressed from a pool): feeds `prompt` at positions
  /// cache.length.. (no gap), then samples up to max_new_tokens. An empty `prompt`
  /// recomputes the last cached token (cache.length - 1) to get its logits.
  /// On return the cache holds the prompt and every returned token (ready for the next
  /// turn); an end-of-generation token stops the loop and is neither returned nor cached. Sampling: greedy = argmax (lowest id on ties); otherwise softmax(logits / T),
  /// the smallest set of most likely tokens whose mass reaches top_p, and a draw from a
  /// std::mt19937_64 seeded with `seed`: the same seed gives the same tokens.
  /// Errors: kInvalidArgument for an empty cache with an empty prompt, max_new_tokens < 0,
  /// temperature <= 0 or top_p outside (0, 1] when sampling, a malformed cache.
  virtual StatusOr<GenerateResult> Generate(KvCache& cache, absl::Span<const int32_t> prompt,
                                            const SamplingOptions& options) = 0;

  /// Sliding-window perplexity: windows of `context` tokens advancing by `stride`; every
  /// target token is scored exactly once (the first window scores all its positions, later
  /// windows only their last `stride`). Each window starts without BOS (as HF's recipe).
  /// Precisely: position p predicts token p+1, for p in [0, n-1). Window w feeds tokens
  /// [b, e) with b = w*stride, e = min(b + context, n-1), on a fresh cache (positions
  /// restart at 0), and scores positions [max(b, e_prev), e). So tokens_scored == n-1 for
  /// any context/stride, and token 0 is only ever context. Windows stop once e == n-1.
  /// Errors: kInvalidArgument for fewer than 2 tokens, context < 1, stride outside
  /// [1, context].
  virtual StatusOr<PerplexityResult> Perplexity(absl::Span<const int32_t> tokens,
                                                int64_t context, int64_t stride) = 0;
};

/// Sets libtorch intra-op threads: n > 0, or all cores when n == 0. Returns the count set.
int SetComputeThreads(int n);

}  // namespace polykv::model
