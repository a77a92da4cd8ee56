// A prefill's K/V as a pool writer takes it (the daemon, the CLI): one layer as plain
// contiguous buffers in the pool's element type, the K/V element type of a model, and a child
// prefill that attends to a read-only prefix in place (a pool tree's child pool).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "polykv/kernels/attention.h"
#include "polykv/kernels/codec.h"
#include "polykv/status.h"

namespace polykv::model {

class LlamaModel;
struct KvPrefix;
struct ModelConfig;
struct PrefillResult;

/// One layer of a prefill's K and V as plain contiguous buffers, each
/// [kv_heads][tokens][head_dim] of dtype() on device(), K after RoPE. It keeps its own
/// reference to the storage, so it stays valid after the PrefillResult is freed.
class PrefilledLayer {
 public:
  const void* k() const { return k_; }
  const void* v() const { return v_; }
  kernels::DType dtype() const { return dtype_; }
  kernels::Device device() const { return device_; }
  /// Elements in each of k() and v() (kv_heads * tokens * head_dim).
  int64_t elements() const { return elements_; }

 private:
  friend StatusOr<PrefilledLayer> ExportPrefilledLayer(const PrefillResult&, size_t, bool,
                                                       std::optional<kernels::DType>);
  std::shared_ptr<const void> keep_;  // the buffers behind k_ and v_
  const void* k_ = nullptr;
  const void* v_ = nullptr;
  kernels::DType dtype_ = kernels::DType::kF32;
  kernels::Device device_ = kernels::Device::kCpu;
  int64_t elements_ = 0;
};

/// Layers held by `prefill` (PrefillResult::k.size()).
size_t PrefilledLayerCount(const PrefillResult& prefill);

/// Layer `layer` of `prefill` as contiguous buffers that outlive `prefill`: a host prefill's
/// as host copies, converted from f32 to `dtype` when one is given (round to nearest even); a
/// device prefill's (PrefillResult::device_kv) in place on the device, f32, sharing its
/// ownership. `to_host` asks for host memory: kFailedPrecondition for a device prefill (its
/// pool is written on the device). Errors: kOutOfRange (no such layer); kInvalidArgument (K
/// and V differ in element count); kUnimplemented (another dtype of a device prefill);
/// kResourceExhausted (out of memory on the copy).
[[nodiscard]] StatusOr<PrefilledLayer> ExportPrefilledLayer(
    const PrefillResult& prefill, size_t layer, bool to_host,
    std::optional<kernels::DType> dtype = std::nullopt);

/// The element type of `m`'s K/V (LlamaModel::dtype()). kUnimplemented for a dtype pools do
/// not take (f32, f16 and bf16 only).
[[nodiscard]] StatusOr<kernels::DType> KvDType(const LlamaModel& m);

/// A read-only raw f32 prefix of `tokens` positions owning `k` and `v` ([layers] x f32
/// [kv_heads][tokens][head_dim] each, K after RoPE): what a process attends to when it holds
/// a document's K/V itself (a codec-none pool's layout). kInvalidArgument when a buffer's
/// size or the layer count does not match `config`.
[[nodiscard]] StatusOr<std::shared_ptr<KvPrefix>> MakeRawPrefix(const ModelConfig& config,
                                                                int64_t tokens,
                                                                std::vector<std::vector<float>> k,
                                                                std::vector<std::vector<float>> v);

/// Prefills `ids` at positions after a read-only prefix: `views` (root first) hold
/// `prefix_tokens`, attended to in place with the same split attention agents run, in chunks
/// of `chunk` tokens (at least 1); `on_chunk(done, total)` is called after each. Returns the
/// new tokens' K/V, f32 [kv_heads][ids][head_dim] per layer, like LlamaModel::Prefill (without
/// last_logits). Errors: those of LlamaModel::NewCacheWithPrefix (the views must match the
/// model) and LlamaModel::Forward.
[[nodiscard]] StatusOr<PrefillResult> PrefillAfterPrefix(
    LlamaModel& m, const std::vector<kernels::PrefixView>& views,
    const std::vector<int32_t>& prefix_tokens, const std::vector<int32_t>& ids, int64_t chunk,
    const std::function<void(int64_t, int64_t)>& on_chunk);

}  // namespace polykv::model
