// Internal pieces of the Llama runtime shared by the loaders (llama_loader_*.cc) and the
// forward pass (llama.cc): fused weight layout, the loader interface, error conversion.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "polykv/model/llama.h"
#include "polykv/model/tokenizer.h"
#include "polykv/status.h"

namespace polykv::model::internal {

/// One decoder layer, weights in HF [out][in] layout, model dtype/device.
struct LayerWeights {
  torch::Tensor attn_norm;  ///< [hidden]
  torch::Tensor wqkv;       ///< [(heads + 2*kv_heads)*head_dim][hidden]: q, k, v rows
  torch::Tensor wo;         ///< [hidden][heads*head_dim]
  torch::Tensor ffn_norm;   ///< [hidden]
  torch::Tensor wgate_up;   ///< [2*ffn][hidden]: gate rows then up rows
  torch::Tensor wdown;      ///< [hidden][ffn]
};

/// All weights of a model.
struct LlamaWeights {
  torch::Tensor embed;    ///< [vocab][hidden]
  std::vector<LayerWeights> layers;
  torch::Tensor norm;     ///< [hidden]
  torch::Tensor lm_head;  ///< [vocab][hidden] (aliases embed when tied)
};

/// What a loader produces.
struct LoadedModel {
  ModelConfig config;
  LlamaWeights weights;
  std::unique_ptr<Tokenizer> tokenizer;  ///< may be null
  std::string fingerprint;
};

/// Source of weights in HF layout: `role` is one of embed, attn_norm, q, k, v, o, ffn_norm,
/// gate, up, down, norm, output; `layer` is -1 for the non-layer tensors.
class WeightReader {
 public:
  virtual ~WeightReader() = default;
  /// A CPU floating tensor shaped `shape` (HF [out][in]); kInvalidArgument naming the
  /// tensor when missing or shaped differently.
  virtual StatusOr<torch::Tensor> Get(const std::string& role, int layer,
                                      const std::vector<int64_t>& shape) = 0;
  /// Whether a separate output (lm_head) tensor exists.
  virtual bool HasOutput() = 0;
};

/// Reads every tensor through `reader`, fuses q/k/v and gate/up, converts to the target
/// dtype/device one tensor at a time.
Status BuildWeights(const ModelConfig& config, WeightReader& reader, const LoadOptions& options,
                    LlamaWeights* out);

/// Checks hyper-parameters for consistency (positive sizes, heads % kv_heads, even
/// head_dim). kInvalidArgument naming `source` and the field.
Status ValidateConfig(const ModelConfig& config, const std::string& source);

/// HF folder: config.json + model.safetensors or model.safetensors.index.json.
StatusOr<LoadedModel> LoadHfFolder(const std::string& dir, const LoadOptions& options);
/// A llama-architecture GGUF file.
StatusOr<LoadedModel> LoadGgufModel(const std::string& path, const LoadOptions& options);

/// Hex SHA-256 of `prefix` followed by the bytes of each file in order.
StatusOr<std::string> Sha256OfFiles(const std::string& prefix,
                                    const std::vector<std::string>& paths);

/// Converts a libtorch / std exception message to a Status (kResourceExhausted for
/// allocation failures, else kInternal).
Status StatusFromException(const std::exception& e, const std::string& context);

}  // namespace polykv::model::internal
