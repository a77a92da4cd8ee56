// Internal pieces of the Llama runtime shared by the loaders (llama_loader_*.cc) and the
// forward pass (llama.cc): fused weight layout, the loader interface, error conversion.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "polykv/kernels/matmul.h"
#include "polykv/model/llama.h"
#include "polykv/model/tokenizer.h"
#include "polykv/status.h"

namespace polykv::model::internal {

/// A weight matrix where it lies in the mapped model file.
struct MappedMatrix {
  kernels::WeightView w;
  /// > 0 for GGUF Q/K projections: the rows of each of these heads are in llama.cpp's
  /// interleaved-pair order (row 2j + s of a head is HF row s * head_dim / 2 + j); the
  /// runtime de-interleaves each head's output instead of permuting the weights.
  int32_t interleaved_heads = 0;
};

/// One decoder layer of mapped weights.
struct MappedLayer {
  MappedMatrix q, k, v, o, gate, up, down;
  const float* attn_norm = nullptr;  ///< [hidden] f32
  const float* ffn_norm = nullptr;   ///< [hidden] f32
  /// Projection biases, f32, in the row order of the matrix they follow (GGUF Llama q/k
  /// biases are interleaved like their rows); nullptr without qkv_bias / o_bias.
  const float* bq = nullptr;  ///< [heads*head_dim]
  const float* bk = nullptr;  ///< [kv_heads*head_dim]
  const float* bv = nullptr;  ///< [kv_heads*head_dim]
  const float* bo = nullptr;  ///< [hidden]
};

/// All weights of a mapped model: views into read-only file mappings, no private copies
/// except the RMSNorm and bias vectors of files that store them in f16/bf16.
struct MappedWeights {
  MappedMatrix embed;  ///< [vocab][hidden]
  std::vector<MappedLayer> layers;
  const float* norm = nullptr;                     ///< [hidden] f32
  MappedMatrix lm_head;                            ///< [vocab][hidden] (the embedding when tied)
  std::vector<std::vector<float>> converted;       ///< f32 copies of non-f32 norm/bias vectors
  std::vector<std::shared_ptr<const void>> files;  ///< the mappings (kept alive)
  std::string layout = "blocks";                   ///< LlamaModel::weights_layout()
};

/// A tensor as it lies in a mapped file: ggml type number, bytes, PyTorch-order shape.
struct RawTensor {
  uint32_t type = 0;  ///< a kernels::WeightType / ggml type number
  const void* data = nullptr;
  uint64_t bytes = 0;
  bool interleaved_qk = false;  ///< GGUF q/k rows in llama.cpp's RoPE order
};

/// What a loader produces.
struct LoadedModel {
  ModelConfig config;
  std::unique_ptr<MappedWeights> mapped;  ///< views of the weights where they lie
  std::unique_ptr<Tokenizer> tokenizer;   ///< may be null
  std::string fingerprint;
};

/// Source of weights in HF layout: `role` is one of embed, attn_norm, q, k, v, o, q_bias,
/// k_bias, v_bias, o_bias, ffn_norm, gate, up, down, norm, output; `layer` is -1 for the
/// non-layer tensors. GetRaw gives the file's own bytes and order (GGUF Llama q/k rows and
/// biases in llama.cpp's interleaved order, flagged by RawTensor::interleaved_qk).
class WeightReader {
 public:
  virtual ~WeightReader() = default;
  /// Whether a separate output (lm_head) tensor exists.
  virtual bool HasOutput() = 0;
  /// The tensor where it lies in the mapping (no copy), checked to be shaped `shape`.
  /// kInvalidArgument naming the tensor when missing or shaped differently.
  [[nodiscard]] virtual StatusOr<RawTensor> GetRaw(const std::string& role, int layer,
                                                   const std::vector<int64_t>& shape) = 0;
  /// The file mappings GetRaw points into (kept alive by the model).
  virtual std::vector<std::shared_ptr<const void>> Mappings() = 0;
  /// After the weights were built: kUnimplemented naming the first tensor of the file(s)
  /// that no role read (e.g. a Qwen3 q_norm, an MLP bias): a tensor PolyKV does not
  /// compute with is refused, never ignored.
  [[nodiscard]] virtual Status CheckAllTensorsUsed() const = 0;
};

/// Builds views of every weight through `reader` (GetRaw) and checks each against the
/// matrix kernels' formats: kUnimplemented naming a tensor whose type has no kernels,
/// kInvalidArgument / kDataLoss for shapes the format cannot hold.
[[nodiscard]] Status BuildMappedWeights(const ModelConfig& config, WeightReader& reader,
                                        MappedWeights* out);

/// The mapped runtime (mapped_llama.cc).
std::unique_ptr<LlamaModel> MakeMappedLlama(LoadedModel m, const LoadOptions& options);

/// Checks hyper-parameters for consistency (positive sizes, heads % kv_heads, even
/// head_dim). kInvalidArgument naming `source` and the field.
[[nodiscard]] Status ValidateConfig(const ModelConfig& config, const std::string& source);

/// HF folder: config.json + model.safetensors or model.safetensors.index.json.
[[nodiscard]] StatusOr<LoadedModel> LoadHfFolder(const std::string& dir,
                                                 const LoadOptions& options);
/// A GGUF file of general.architecture llama or qwen2.
[[nodiscard]] StatusOr<LoadedModel> LoadGgufModel(const std::string& path,
                                                  const LoadOptions& options);

/// A model folder or file, as LlamaModel::Load takes it (kNotFound when missing), with its
/// weights mapped.
[[nodiscard]] StatusOr<LoadedModel> LoadModelFiles(const std::string& path,
                                                   const LoadOptions& options);

/// A per-user cache folder of PolyKV: $`env` when set ("0" = none: ""), else
/// $XDG_CACHE_HOME/polykv/`name`, else $HOME/.cache/polykv/`name`; "" when neither is an
/// absolute path. Used for the model fingerprints and the packed weights.
std::string UserCacheDir(const char* env, const char* name);

/// Hex SHA-256 of `prefix` followed by the bytes of each file in order, remembered per user
/// in $POLYKV_FINGERPRINT_CACHE (default $XDG_CACHE_HOME/polykv/fingerprints, else
/// ~/.cache/polykv/fingerprints; "0" turns the cache off). An entry is named by a hash of
/// the prefix and each file's canonical path, device, inode, size, mtime and ctime (both in
/// ns): any write to a file changes its ctime, and replacing it (rename) its inode, so a
/// stale digest is never read. Hashing a 92 MiB model is ~100 ms of every agent's start; a
/// cache hit is a stat and a small read. A cache that cannot be read or written is skipped.
[[nodiscard]] StatusOr<std::string> Sha256OfFiles(const std::string& prefix,
                                                  const std::vector<std::string>& paths);

/// Converts an exception's message to a Status (kResourceExhausted for
/// allocation failures, else kInternal).
[[nodiscard]] Status StatusFromException(const std::exception& e, const std::string& context);

/// Checks SamplingOptions: max_new_tokens >= 0 and, unless greedy, a finite temperature > 0
/// and top_p in (0, 1]. Errors: kInvalidArgument naming the field, after `context` (e.g.
/// "Generate: "; may be empty).
[[nodiscard]] Status CheckSamplingOptions(const SamplingOptions& o, const char* context);

/// Logits of `rows` rows of `vocab` values, zeroed. Errors: kResourceExhausted naming
/// `context` when they cannot be allocated.
[[nodiscard]] StatusOr<Logits> NewLogits(int64_t rows, int32_t vocab, const std::string& context);

}  // namespace polykv::model::internal
