// Llama-family decoder runtime: load (HF safetensors folder or GGUF), prefill, decode from a
// caller-supplied KV cache, sampling, perplexity.
//
// This header, like every public header of polykv/model, speaks in plain types (f32 spans and
// buffers, kernels::DType): no framework type reaches a caller (as llama.cpp's llama.h).
//
// The runtime (LlamaModel::Load) keeps the model file mapped read-only and runs every matrix
// product on its own tensor format (kernels/matmul.h), so all processes on a host share the
// same page-cache pages and none holds converted weights. Decode and short prompts
// (<= LoadOptions::quantized_rows rows) use the quantized kernels; longer forwards
// dequantize one weight tile at a time into a small scratch buffer and multiply with CBLAS
// sgemm (OpenBLAS). Attention runs on kernels/attention.h, which also attends in place to a
// read-only shared prefix (a compressed pool) with an exact log-sum-exp merge; a long
// prefill without a prefix runs its attention as sgemm too. Those sgemms run one per task
// on the kernels' thread pool, each single-threaded (OpenBLAS's own threads stay off).
// A libtorch f32 reference runtime (private dequantized copies, every op on libtorch) lives
// in the optional target polykv_model_torch (polykv/model/torch_reference.h): tests and
// benchmarks compare against it; no product binary links it.
//
// Architecture: RMSNorm, RoPE (rope_theta from the model, HF rotate_half layout; linear,
// Llama 3.1 ("llama3"), YaRN or file-given per-frequency scaling), SwiGLU MLP, grouped-query
// attention with optional q/k/v and output-projection biases, tied or separate output
// embeddings: Llama 2/3/3.1/3.2, SmolLM/SmolLM2, TinyLlama, Qwen2/Qwen2.5 (GGUF `qwen2`, HF
// Qwen2ForCausalLM) and Mistral. Sliding-window attention is not implemented: a model with
// a window (Mistral 7B v0.1's 4096) runs while every query sees the whole window, and a
// step that would reach past it is refused (kOutOfRange) instead of computing full
// attention.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "polykv/kernels/attention.h"
#include "polykv/kernels/codec.h"
#include "polykv/model/tokenizer.h"
#include "polykv/status.h"

namespace polykv::model {

/// How RoPE frequencies are scaled (HF config.json `rope_scaling` / `rope_parameters`; GGUF
/// {arch}.rope.scaling.* and the `rope_freqs.weight` tensor).
enum class RopeScalingType : uint8_t {
  kNone = 0,
  kLinear = 1,       ///< positions divided by ModelConfig::rope_linear_scale (HF/GGUF "linear")
  kLlama3 = 2,       ///< Llama 3.1: per-frequency smooth interpolation (HF rope_type "llama3")
  kYarn = 3,         ///< YaRN (Peng et al. 2023, arXiv:2309.00071): ramp + attention factor
  kFreqFactors = 4,  ///< frequencies divided by per-frequency factors stored in the file
                     ///< (GGUF `rope_freqs.weight`: how llama.cpp stores Llama 3.1 scaling)
};

/// "none", "linear", "llama3", "yarn", "freq_factors".
const char* RopeScalingName(RopeScalingType t);

/// Parameters of RoPE scaling; only those of `type` are meaningful. The frequencies are
/// inv_freq_j = theta^(-2j/head_dim) for j < head_dim/2 before scaling.
struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  /// llama3, yarn: context extension factor s (linear keeps its factor in
  /// ModelConfig::rope_linear_scale).
  double factor = 1;
  /// llama3: wavelengths 2 pi / inv_freq above original_max_positions / low_freq_factor are
  /// divided by `factor`, below original_max_positions / high_freq_factor kept, and in
  /// between interpolated with smooth = (original / wavelen - low) / (high - low):
  /// inv_freq' = (1 - smooth) inv_freq / factor + smooth inv_freq (HF
  /// _compute_llama3_parameters).
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  /// llama3, yarn: the context length of pre-training.
  int32_t original_max_positions = 0;
  /// yarn: correction range [lo, hi], where dimension d(r) = head_dim ln(original / (2 pi r))
  /// / (2 ln theta) makes r rotations over the original context: lo = d(beta_fast), hi =
  /// d(beta_slow), floor/ceil'ed when `truncate`, clamped to [0, head_dim - 1] (hi += 0.001
  /// when equal); ramp_j = clamp((j - lo) / (hi - lo), 0, 1) and
  /// inv_freq'_j = inv_freq_j / factor * ramp_j + inv_freq_j * (1 - ramp_j)
  /// (HF _compute_yarn_parameters; llama.cpp's ggml_rope_yarn_corr_dims with ext_factor 1).
  double beta_fast = 32;
  double beta_slow = 1;
  bool truncate = true;
  /// yarn: cos and sin are multiplied by this (so attention logits by its square): the
  /// file's explicit value, else 0.1 ln(factor) + 1 (with HF mscale / mscale_all_dim, the
  /// ratio of those terms).
  double attention_factor = 1;
  /// freq_factors: [head_dim/2] divisors, inv_freq'_j = inv_freq_j / freq_factors[j].
  std::vector<float> freq_factors;
};

/// Hyper-parameters read from config.json or GGUF {arch}.* metadata: the source of truth
/// for both runtimes.
struct ModelConfig {
  /// "llama", "mistral" or "qwen2" (HF model_type; GGUF general.architecture, where
  /// Mistral models are "llama").
  std::string architecture;
  int32_t layers = 0;
  int32_t hidden = 0;
  int32_t heads = 0;     ///< query heads
  int32_t kv_heads = 0;  ///< GQA: KV heads (divides heads)
  int32_t head_dim = 0;  ///< hidden / heads unless the model says otherwise
  int32_t ffn = 0;       ///< SwiGLU intermediate size
  int32_t vocab = 0;
  int32_t max_positions = 0;  ///< context length the model was trained for
  float rope_theta = 10000.f;
  /// Linear RoPE scaling (HF rope_scaling {type: linear, factor}): positions are divided
  /// by this factor; 1 = none.
  float rope_linear_scale = 1.f;
  /// Every other RoPE scaling (rope_scaling.type kLinear mirrors rope_linear_scale).
  RopeScaling rope_scaling;
  float rms_eps = 1e-5f;
  bool tied_embeddings = false;
  /// Biases added after the q, k and v projections ([heads*head_dim], [kv_heads*head_dim]
  /// x2): Qwen2 always, Llama with attention_bias.
  bool qkv_bias = false;
  /// Bias added after the output projection ([hidden]): Llama with attention_bias.
  bool o_bias = false;
  /// > 0: the model uses sliding-window attention over this many positions (query p sees
  /// keys p - W < j <= p). PolyKV computes full causal attention, identical while the
  /// sequence holds at most W positions, and refuses (kOutOfRange) any step past that.
  int32_t sliding_window = 0;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
};

/// Where the weights live and which runtime computes with them.
enum class WeightStorage : uint8_t {
  kAuto = 0,    ///< kMapped
  kMapped = 1,  ///< file mapped read-only; kernels over its blocks (CPU, f32 compute)
  kCopy = 2,    ///< private dequantized libtorch tensors: only the reference runtime of
                ///< polykv_model_torch (LoadTorchReference); LlamaModel::Load refuses it
};

/// "auto", "mapped" or "copy".
const char* WeightStorageName(WeightStorage w);

/// Rows up to which the mapped runtime multiplies with the quantized kernels; longer
/// forwards (prefill) dequantize weight tiles and use CBLAS sgemm (bench_model measures
/// both; see README).
inline constexpr int64_t kMappedGemmRows = 48;

/// How to load a model.
struct LoadOptions {
  /// Compute threads (the kernels' pool: matrix and attention kernels, and the long
  /// prefill's single-threaded sgemm tasks); 0 = all cores.
  int threads = 0;
  /// kAuto / kMapped; kCopy is kInvalidArgument here (see LoadTorchReference).
  WeightStorage weights = WeightStorage::kAuto;
  /// Mapped runtime: forwards of up to this many rows multiply on the quantized kernels
  /// (8-bit activations for quantized weights), and so do longer ones over the weight types
  /// of the AMX-INT8 tiles where the CPU has them (kernels::MatMulUsesTiles: faster than GEMM
  /// at every size); the rest, and all of them when 0, use f32 products on dequantized
  /// weight tiles (exact f32 activations, slower for few rows).
  int64_t quantized_rows = kMappedGemmRows;
  /// Mapped runtime on CPUs with the avx512 kernels: Q4_0/Q4_1/Q8_0 matrices are also read
  /// in the kernels' decode panel layout (kernels::PackWeights; 1-row products ~1.2-1.8x
  /// faster), from one file per model and user in the packed-weights folder
  /// ($POLYKV_PACKED_CACHE, else $XDG_CACHE_HOME or ~/.cache + /polykv/packed; "0" = off)
  /// that every process maps read-only and shares. Written once (atomically) by the first
  /// process that needs it. false: the blocks only. Where the file cannot be used the model
  /// runs from the blocks and LlamaModel::weights_layout() says why.
  bool packed_weights = true;
};

/// A read-only shared prefix of a KV cache: positions [0, view.tokens) of the document,
/// attended to where they lie (a mapped pool, or K/V the process prefilled itself), never
/// copied. Only the mapped runtime attends to prefixes.
struct KvPrefix {
  kernels::PrefixView view;
  /// Further read-only segments after `view`, in position order (a pool tree: the root
  /// pool's tokens in `view`, then each child pool's): attended to as one prefix
  /// (kernels::AttentionArgs::prefix_tail). Each must match the model as `view` does.
  std::vector<kernels::PrefixView> tail;
  /// Positions of all segments.
  int64_t tokens() const {
    int64_t n = view.tokens;
    for (const kernels::PrefixView& t : tail) n += t.tokens;
    return n;
  }
  /// Called after every forward step that read the prefix; a non-OK status fails the step
  /// (e.g. the pool's lease expired or it was evicted), and its results are discarded.
  std::function<Status()> check;
  /// Keeps the memory behind `view` alive (an attached pool, or the tensors of a prefill).
  std::shared_ptr<const void> owner;
};

/// A KV cache: an optional read-only shared `prefix` (positions [0, P)) followed by the
/// private suffix: per layer K and V, each f32 [kv_heads][capacity][head_dim], K stored
/// after RoPE; suffix slot i holds position P + i. The first `length` positions (prefix
/// included) are valid; `tokens` holds their ids (size == length). Plain host buffers owned
/// by the cache (LlamaModel::NewCache sizes them).
struct KvCache {
  std::vector<std::vector<float>> k;       ///< [layers] x f32 [kv_heads][capacity][head_dim]
  std::vector<std::vector<float>> v;       ///< [layers] x f32 [kv_heads][capacity][head_dim]
  int64_t capacity = 0;                    ///< suffix slots allocated in every k[l] / v[l]
  std::vector<int32_t> tokens;             ///< ids of the cached positions (prefix and suffix)
  int64_t length = 0;                      ///< valid positions, prefix included
  std::shared_ptr<const KvPrefix> prefix;  ///< null: no shared prefix
  /// Positions held by the shared prefix (0 without one).
  int64_t prefix_length() const { return prefix ? prefix->tokens() : 0; }
  /// Valid positions held privately.
  int64_t suffix_length() const { return length - prefix_length(); }
  /// Bytes of the private buffers (capacity, K and V, every layer).
  uint64_t bytes() const {
    uint64_t b = 0;
    for (const auto& t : k) b += t.size() * sizeof(float);
    for (const auto& t : v) b += t.size() * sizeof(float);
    return b;
  }
};

/// Logits of some positions: f32 [rows][vocab], row-major.
struct Logits {
  int64_t rows = 0;
  int32_t vocab = 0;
  std::vector<float> values;  ///< rows * vocab
  /// Row i (i < rows).
  absl::Span<const float> row(int64_t i) const {
    return absl::MakeConstSpan(values.data() + i * vocab, static_cast<size_t>(vocab));
  }
};

/// Result of Prefill: the document's K/V per layer and the last position's logits.
struct PrefillResult {
  int64_t tokens = 0;                 ///< positions prefilled
  std::vector<std::vector<float>> k;  ///< [layers] x f32 [kv_heads][tokens][head_dim], after RoPE
  std::vector<std::vector<float>> v;  ///< [layers] x f32 [kv_heads][tokens][head_dim]
  std::vector<float> last_logits;     ///< f32 [vocab] (empty for PrefillAfterPrefix)
  /// A prefill on a CUDA device that kept its K/V there (CudaLlama::Prefill with
  /// keep_on_device): per layer device pointers to f32 [kv_heads][tokens][head_dim] (k and v
  /// above stay empty), valid while `device_kv` lives. Null: the K/V are the host vectors.
  std::vector<const float*> device_k, device_v;
  std::shared_ptr<const void> device_kv;
  int64_t device_layer_elements = 0;  ///< kv_heads * tokens * head_dim of each device layer
};

/// Sampling settings for Generate.
struct SamplingOptions {
  int32_t max_new_tokens = 64;
  bool greedy = true;  ///< argmax; otherwise temperature + top-p
  float temperature = 0.8f;
  float top_p = 0.95f;
  uint64_t seed = 0;
  bool stop_at_eos = true;  ///< stop on Tokenizer::IsEndOfGeneration / config eos_id
  /// Optional: called on the Generate thread with each new token as soon as it is sampled
  /// (streaming). Returning false stops the generation (cancellation, stop strings): that
  /// token is still returned but not fed to the cache. Empty: no call.
  std::function<bool(int32_t token)> on_token;
};

/// Output of Generate.
struct GenerateResult {
  std::vector<int32_t> tokens;  ///< new tokens (without the prompt)
  double first_token_ms = 0;    ///< time from call to the first new token (TTFT)
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
  [[nodiscard]] static StatusOr<std::unique_ptr<LlamaModel>> Load(const std::string& path,
                                                                  const LoadOptions& options = {});
  virtual ~LlamaModel() = default;

  virtual const ModelConfig& config() const = 0;
  /// nullptr when the model ships no tokenizer (e.g. stories260K: use token ids).
  virtual const Tokenizer* tokenizer() const = 0;
  /// Hex SHA-256 identifying the weights and config: part of a pool id.
  virtual const std::string& fingerprint() const = 0;
  /// Element type of the K/V the runtime computes (KvCache, PrefillResult): kF32.
  virtual kernels::DType dtype() const = 0;

  /// An empty cache with room for `capacity` positions.
  virtual KvCache NewCache(int64_t capacity) const = 0;

  /// A cache whose first prefix->tokens() positions are the read-only `prefix` (all its
  /// segments; ids `tokens`), with room for `capacity` private positions after it. Errors:
  /// kInvalidArgument when a segment does not match the model (layers, kv_heads, head_dim)
  /// or tokens.size() != its length; kFailedPrecondition for a runtime that cannot attend
  /// to a prefix in place (the libtorch reference runtime).
  [[nodiscard]] virtual StatusOr<KvCache> NewCacheWithPrefix(std::shared_ptr<const KvPrefix> prefix,
                                                             std::vector<int32_t> tokens,
                                                             int64_t capacity) const = 0;

  /// Turns what `cache` holds privately (it must have no prefix yet) into a read-only raw
  /// prefix of a new cache with room for `capacity` more positions: the same K/V bytes,
  /// attended to with the same split as a pool of codec none, so a process that prefilled a
  /// document itself computes exactly what an agent of a codec-none pool does. The buffers
  /// move into the prefix's owner. Errors: kInvalidArgument for an empty cache or one that
  /// already has a prefix; kFailedPrecondition as NewCacheWithPrefix.
  [[nodiscard]] virtual StatusOr<KvCache> FreezeAsPrefix(KvCache&& cache,
                                                         int64_t capacity) const = 0;

  /// How the weights are held (kMapped or kCopy, never kAuto).
  virtual WeightStorage weight_storage() const = 0;

  /// Bytes of weights read per decoded token (every matrix once, in its stored format).
  virtual int64_t WeightBytesPerToken() const = 0;

  /// Where 1-row products read the weights: "packed: <file>" (LoadOptions::packed_weights)
  /// or "blocks[: why not packed]".
  virtual std::string weights_layout() const { return "blocks"; }

  /// Runs `tokens` at positions cache.length .. cache.length+n-1, appending their K/V
  /// (grows capacity if needed: reallocation to max(needed, 2 x capacity), so pointers into
  /// the old buffers become invalid). A default-constructed (empty) KvCache is allocated
  /// on first use. The cache must match the model: [layers] tensors of
  /// [kv_heads][capacity][head_dim] in dtype()/device(), tokens.size() == length. Returns logits
  /// f32 [n][vocab] when `all_logits`, else [1][vocab] for the last position. Errors:
  /// kInvalidArgument for ids outside the vocab or an empty `tokens`; kResourceExhausted when out
  /// of memory.
  [[nodiscard]] virtual StatusOr<Logits> Forward(absl::Span<const int32_t> tokens, KvCache& cache,
                                                 bool all_logits = false) = 0;

  /// Batched decode: one new token per session, S = caches.size() sessions in one step.
  /// Session i feeds tokens[i] at position caches[i]->length (appending its K/V to that
  /// cache, growing it as Forward does) and gets the next-token logits in row i of the
  /// result, f32 [S][vocab]. All caches must share ONE prefix (the same KvPrefix object) or
  /// all have none. The mapped runtime computes every weight product once for all S rows
  /// (kernels::MatMul of S rows), the prefix attention as one kernels::AttentionForwardBatch
  /// pass (each prefix block read and decoded once per step for every session's queries),
  /// merged by log-sum-exp with each session's private suffix. Compared with S Forward
  /// calls: attention is bit-identical; the products differ only by the float reassociation
  /// of the many-row matrix kernels (max |dlogit| measured 1.3e-5 on stories260K, 3.6e-3 on
  /// SmolLM2 Q4_1 with |logit| <= 40; tests/unit/model/batch_decode_test.cc asserts 1e-4 and
  /// 1e-2), so greedy tokens agree except on near-ties; one session (S = 1) runs the same
  /// kernels as Forward and is bit-identical. The prefix
  /// `check` runs once per step. A failed step leaves every cache as it was. Errors:
  /// kInvalidArgument for an empty batch, sizes that differ, a null cache, the same cache
  /// twice, ids outside the vocab, caches with different prefixes or a malformed cache;
  /// kOutOfRange past a sliding window; the prefix check's error; kResourceExhausted when
  /// out of memory.
  [[nodiscard]] virtual StatusOr<Logits> ForwardBatch(absl::Span<KvCache* const> caches,
                                                      absl::Span<const int32_t> tokens) = 0;

  /// Batched prompts: S = caches.size() sessions join at once. Session i feeds prompts[i]
  /// (non-empty) at positions caches[i]->length.. (appending its K/V, growing the cache as
  /// Forward does) and gets the logits of its LAST prompt row in row i of the result, f32
  /// [S][vocab]. All caches share ONE prefix (the same KvPrefix object) or all have none. The
  /// mapped runtime runs ONE forward over every session's rows concatenated: each weight
  /// product once over all sum(|prompts[i]|) rows, each session's attention over the prefix
  /// and its own rows (causal) in one kernels::AttentionForwardBatch pass; so S joining
  /// sessions read the weights once instead of S times. Compared with S Forward calls:
  /// attention is bit-identical; the products differ by float reassociation and, where the
  /// total row count crosses LoadOptions::quantized_rows, by the quantized vs f32 kernels
  /// (tests/unit/model/batch_decode_test.cc states the bounds). This default runs one
  /// Forward per session. On error no cache's length or tokens changed. Errors: as
  /// ForwardBatch, and kInvalidArgument for an empty prompt.
  [[nodiscard]] virtual StatusOr<Logits> ForwardPrompts(
      absl::Span<KvCache* const> caches, absl::Span<const absl::Span<const int32_t>> prompts);

  /// Prefills a document from scratch in chunks of `chunk` tokens, calling
  /// `progress(done, total)` after each. Returns K/V f32 [kv_heads][tokens][head_dim] per layer.
  [[nodiscard]] virtual StatusOr<PrefillResult> Prefill(
      absl::Span<const int32_t> tokens, int64_t chunk = 512,
      const std::function<void(int64_t, int64_t)>& progress = nullptr) = 0;

  /// Continues from `cache` (e.g. decompressed from a pool): feeds `prompt` at positions
  /// cache.length.. (no gap), then samples up to max_new_tokens. An empty `prompt`
  /// recomputes the last cached token (cache.length - 1) to get its logits.
  /// On return the cache holds the prompt and every returned token (ready for the next
  /// turn); an end-of-generation token stops the loop and is neither returned nor cached. Sampling:
  /// greedy = argmax (lowest id on ties); otherwise softmax(logits / T), the smallest set of most
  /// likely tokens whose mass reaches top_p, and a draw from a std::mt19937_64 seeded with `seed`:
  /// the same seed gives the same tokens. options.on_token (when set) sees every returned token
  /// in order and may stop the loop early. Errors: kInvalidArgument for an empty cache with an
  /// empty prompt, max_new_tokens < 0, temperature <= 0 or top_p outside (0, 1] when sampling, a
  /// malformed cache.
  [[nodiscard]] virtual StatusOr<GenerateResult> Generate(KvCache& cache,
                                                          absl::Span<const int32_t> prompt,
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
  [[nodiscard]] virtual StatusOr<PerplexityResult> Perplexity(absl::Span<const int32_t> tokens,
                                                              int64_t context, int64_t stride) = 0;
};

/// Sets the compute threads of the kernels' pool (which also runs the long prefill's
/// single-threaded sgemm tasks): n > 0, or all cores when n == 0. Returns the count set.
int SetComputeThreads(int n);

/// Greedy choice: the index of the largest logit (the lowest index on ties).
/// kInvalidArgument for an empty span.
[[nodiscard]] StatusOr<int32_t> Argmax(absl::Span<const float> logits);

/// Samples one id (SamplingOptions' rule: argmax when greedy; otherwise softmax(logits / T)
/// in f64, the smallest set of most likely ids whose mass reaches top_p, a draw u in [0, 1)
/// from the top 53 bits of rng() scaled by that mass). Errors: kInvalidArgument for an
/// empty span.
[[nodiscard]] StatusOr<int32_t> SampleToken(absl::Span<const float> logits,
                                            const SamplingOptions& options, std::mt19937_64& rng);

/// log p(target) under softmax(logits) as llama.cpp computes it (tools/perplexity): the
/// maximum in f32, sum of exp(x - max) in f64, logits[target] - max - log(sum). The one
/// scoring formula of PolyKV (perplexity, agent scoring, eval). `target` must be in range.
double LogProb(absl::Span<const float> logits, int32_t target);

}  // namespace polykv::model
