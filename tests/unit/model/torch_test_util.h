// Helpers of the model tests that compare against the libtorch reference runtime
// (polykv_model_torch; built only with POLYKV_HAVE_TORCH).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>

#include "polykv/model/llama.h"
#include "polykv/model/torch_reference.h"

namespace polykv::model::testing {

/// Logits f32 [rows][vocab] as a tensor (a copy).
inline torch::Tensor T(const Logits& l) {
  return torch::from_blob(const_cast<float*>(l.values.data()), {l.rows, l.vocab}, torch::kFloat32)
      .clone();
}

/// A buffer [kv_heads][capacity][head_dim] as a tensor (a copy).
inline torch::Tensor T(const std::vector<float>& b, int64_t kv_heads, int64_t capacity,
                       int64_t head_dim) {
  return torch::from_blob(const_cast<float*>(b.data()), {kv_heads, capacity, head_dim},
                          torch::kFloat32)
      .clone();
}

/// LlamaModel::Load, or LoadTorchReference for WeightStorage::kCopy.
inline StatusOr<std::unique_ptr<LlamaModel>> LoadRuntime(const std::string& path, LoadOptions o) {
  if (o.weights == WeightStorage::kCopy) return LoadTorchReference(path, o);
  return LlamaModel::Load(path, o);
}

}  // namespace polykv::model::testing
