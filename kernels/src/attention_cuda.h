// CUDA launcher of the split attention (kernels/cuda/attention_kernels.cu); internal, CUDA
// builds only. Every pointer is a device pointer. Same math as the CPU path
// (attention.cc): chunks of kAttentionChunk tokens give partial softmax states that merge by
// log-sum-exp in position order; TurboQuant-MSE values are accumulated in the rotated code
// domain and un-rotated once per output vector.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace polykv::kernels::cuda {

/// One layer's attention, device pointers (see AttentionArgs in attention.h).
struct AttentionLaunch {
  // Prefix (prefix_tokens == 0: none).
  int64_t prefix_tokens = 0;
  int codec = 0;             ///< 0 raw, 1 int8 keys + packed values
  int raw_dtype = 0;         ///< codec 0: 0 f32, 1 f16, 2 bf16
  const void* pk = nullptr;  ///< codec 1: int8 codes (key_bits 8) or packed key codes
  const float* pk_scales = nullptr;
  const void* pv = nullptr;
  const void* pv_norms = nullptr;  ///< codec 1: f32 or f16 (norms_f16) [kv_heads * tokens]
  int key_scale_mode = 0;          ///< KeyScaleMode value
  int key_bits = 8;                ///< codec 1: 8, or 4..7 (PackKeyCodes layout, codec.h)
  bool norms_f16 = false;          ///< codec 1: the norms are f16 (CodecConfig::norm_dtype)
  int bits = 3;                    ///< codec 1: this layer's value bits (PrefixView::ValueBitsOf)
  float levels[16] = {};
  uint64_t seed = 0;
  // Suffix and queries.
  const float* k_suffix = nullptr;
  const float* v_suffix = nullptr;
  int64_t suffix_capacity = 0, suffix_length = 0, n = 0;
  /// When set, the live suffix length is read here at run time (device memory) and
  /// suffix_length is its upper bound (the launch shape).
  const int64_t* suffix_length_dev = nullptr;
  int32_t heads = 0, kv_heads = 0, head_dim = 0;
  const float* q = nullptr;
  float* out = nullptr;
  // Slot mode (AttentionForwardSlots): `rows` sessions, one query row each (n == 1), the
  // launch's grid z; row r's suffix is slot row_slot[r] of the slab at k_suffix / v_suffix
  // (slot_stride floats apart), its live length row_length[r] (suffix_length: the bound);
  // q and out advance heads * head_dim per row. row_slot == nullptr: one session as above.
  const int32_t* row_slot = nullptr;
  const int64_t* row_length = nullptr;
  int64_t rows = 1, slots = 0, slot_stride = 0;
};

/// Runs the attention on `stream` (scratch for the partial states is allocated on the
/// stream and freed after use) over `segments` prefix segments in position order (a pool
/// tree: root first): segs[i] holds segment i's prefix fields (prefix_tokens 0 and one entry:
/// no prefix); every entry carries the same suffix, query, output and slot fields (segment
/// i's launch reads its own entry's; the shape and the merge are the last entry's). Every
/// segment's chunks merge in position order, values un-rotated once (one rotation seed).
cudaError_t InvokeAttention(const AttentionLaunch* segs, int segments, cudaStream_t stream);

}  // namespace polykv::kernels::cuda
