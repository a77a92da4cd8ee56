// The libtorch f32 reference runtime (optional target polykv_model_torch): the weights
// dequantized into private libtorch tensors (GGUF Llama q/k rows put back in HF order) and
// every op of the forward pass as libtorch ops (RMSNorm, RoPE rotate_half, GQA attention
// with a causal mask, SwiGLU). Tests and benchmarks compare the mapped runtime against it;
// no product binary links it. It speaks the same torch-free LlamaModel interface; it cannot
// attend to a shared prefix in place (NewCacheWithPrefix / FreezeAsPrefix:
// kFailedPrecondition).
#pragma once

#include <memory>
#include <string>

#include "polykv/model/llama.h"
#include "polykv/status.h"

namespace polykv::model {

/// Loads `path` (a .gguf file or an HF folder, as LlamaModel::Load) as the reference runtime:
/// weight_storage() == WeightStorage::kCopy, f32, CPU. `options.weights` is ignored;
/// `options.threads` sets libtorch's intra-op threads too. Errors: those of
/// LlamaModel::Load; kResourceExhausted when the f32 copy does not fit in memory.
[[nodiscard]] StatusOr<std::unique_ptr<LlamaModel>> LoadTorchReference(
    const std::string& path, const LoadOptions& options = {});

}  // namespace polykv::model
