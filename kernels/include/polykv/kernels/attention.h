// Attention of new query rows over [shared prefix | private suffix], the prefix read where
// it lies: in a compressed pool (int8 keys, TurboQuant-MSE values) or raw (codec none).
//
// Split attention with an exact merge (FlashInfer cascade attention; Hydragen, Juravsky et
// al. 2024): each part p gives a partial softmax state per query head, with maximum score
// m_p, sum l_p = sum_t exp(s_t - m_p) and normalized output o_p = sum_t exp(s_t - m_p) v_t / l_p.
// Two states merge by log-sum-exp:
//   m = max(m_a, m_b), a = l_a exp(m_a - m), b = l_b exp(m_b - m), o = (a o_a + b o_b) / (a + b),
//   l = a + b; an empty part (l = 0, m = -inf) contributes nothing.
//
// The prefix part, per layer and KV head, serves all query heads of its GQA group at once:
//  - scores s_t = q . k_hat_t / sqrt(head_dim) with k_hat_t = code_t * scale: the key scale
//    (per tensor, head or channel) and 1/sqrt(head_dim) are folded into the query once;
//  - values stay in the rotated domain: for TurboQuant-MSE, v_hat_t = norm_t D H c[code_t] /
//    sqrt(head_dim * block) (codec.h), so sum_t p_t v_hat_t = D H (sum_t p_t norm_t c[code_t])
//    / sqrt(head_dim * block): the kernel accumulates p_t norm_t c[code_t] in a head_dim
//    vector and undoes the rotation (Walsh-Hadamard + signs) once per output vector, after
//    the prefix chunks are merged, not once per token;
//  - the prefix is split in chunks of kAttentionChunk tokens (tokens [0, C), [C, 2C), ...),
//    the suffix likewise from its own first position; chunks run on the threads and their
//    states merge in position order. The chunking depends only on the lengths, so results do
//    not depend on the thread count.
// Codec none (raw f32/f16/bf16 K/V) runs the same split with the same f32 kernel as the
// private suffix, so a raw prefix gives bit-identical results to the same K/V held locally
// as a raw prefix.
//
// Layouts: the prefix as in a pool (ipc/pool_layout.h): K [kv_heads][tokens][head_dim]
// (int8 codes or raw), K scales (KeyScaleCount), V packed [kv_heads * tokens][PackedVectorBytes]
// or raw [kv_heads][tokens][head_dim], V norms f32 [kv_heads * tokens]. The suffix: f32
// [kv_heads][capacity][head_dim]. Queries and output: f32 [n][heads][head_dim], query head h
// uses KV head h / (heads / kv_heads) (GQA, HF repeat_kv).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "polykv/kernels/codec.h"
#include "polykv/kernels/cpu.h"
#include "polykv/status.h"

namespace polykv::kernels {

/// Tokens per attention chunk (the unit of work split over threads).
inline constexpr int64_t kAttentionChunk = 256;

/// How a prefix stores K and V.
enum class PrefixCodec : uint8_t {
  kRaw = 0,  ///< K and V in `raw_dtype` (codec none)
  kK8V = 1,  ///< int8 keys + TurboQuant-MSE values (codec k8vb)
};

/// One layer of a prefix (pointers into a read-only region; not owned).
struct PrefixLayer {
  const void* k = nullptr;          ///< int8 codes, packed key codes (key_bits < 8) or raw K
  const float* k_scales = nullptr;  ///< kK8V: KeyScaleCount f32 scales
  const void* v = nullptr;          ///< packed V codes or raw V
  const void* v_norms = nullptr;    ///< kK8V: norms [kv_heads * tokens], f32 or f16 (norm_dtype)
  int32_t value_bits = 0;           ///< kK8V: this layer's value bits; 0 = config.value_bits
};

/// A read-only shared prefix of a KV cache: the document's K/V for every layer.
struct PrefixView {
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  int64_t tokens = 0;
  PrefixCodec codec = PrefixCodec::kRaw;
  DType raw_dtype = DType::kF32;  ///< kRaw
  /// kK8V: key_bits (8, or 4..7 packed: unpacked per chunk into int8 scratch), value_bits
  /// (per layer: PrefixLayer::value_bits), key_scale, rotation_seed, norm_dtype (f16 norms
  /// are widened per chunk). The CUDA kernels read all of these where they lie (packed keys
  /// unpacked per element, f16 norms widened per token, each layer's own value bits).
  CodecConfig config;
  std::vector<PrefixLayer> layers;
  /// Bytes read per layer when every prefix token is attended to (K, scales, V, norms),
  /// averaged over the layers when their value bits differ.
  int64_t LayerBytes() const;
  /// Value bits of layer `l` (kK8V).
  int32_t ValueBitsOf(size_t l) const {
    return l < layers.size() && layers[l].value_bits > 0 ? layers[l].value_bits : config.value_bits;
  }
};

/// Checks a view: sizes >= 1 (tokens may be 0), head_dim <= 512, codec parameters valid,
/// non-null pointers for every layer. kInvalidArgument naming the field.
[[nodiscard]] Status ValidatePrefixView(const PrefixView& view);

/// Arguments of AttentionForward for one layer.
struct AttentionArgs {
  const PrefixView* prefix = nullptr;  ///< may be null (no prefix)
  /// Further prefix segments after `prefix`, in position order (a pool tree: the root pool's
  /// tokens, then each child's): a segment's positions follow those of the segments before
  /// it. Each segment has its own layers (codes, key scales, norms); all must match `prefix`
  /// in kv_heads, head_dim and codec, and kK8V segments in rotation seed (values are merged
  /// in the rotated domain and un-rotated once). Each segment is chunked from its own first
  /// token, so a split at a multiple of kAttentionChunk gives bit-identical results to one
  /// segment holding both. On CUDA: one partial-state launch per segment (the last one also
  /// runs the suffix chunks), one merge.
  absl::Span<const PrefixView> prefix_tail;
  int32_t layer = 0;                ///< prefix layer (of every segment)
  const float* k_suffix = nullptr;  ///< f32 [kv_heads][suffix_capacity][head_dim]
  const float* v_suffix = nullptr;
  int64_t suffix_capacity = 0;
  /// Valid suffix positions, the n new rows included: query row i sits at suffix index
  /// suffix_length - n + i and attends to every prefix token and suffix indices <= its own.
  int64_t suffix_length = 0;
  int64_t n = 0;  ///< query rows (>= 1)
  int32_t heads = 0, kv_heads = 0, head_dim = 0;
  const float* q = nullptr;  ///< f32 [n][heads][head_dim] (after RoPE)
  float* out = nullptr;      ///< f32 [n][heads][head_dim]
  /// Device::kCuda only: when set, the kernels read the live suffix length from this device
  /// int64 when they run, and `suffix_length` is its upper bound (the launch shape), so one
  /// captured CUDA graph serves every decode step. The caller keeps n <= *it <= bound.
  const int64_t* suffix_length_device = nullptr;
};

/// Options of the attention kernels.
struct AttentionOptions {
  int isa = -1;     ///< as MatMulOptions::isa: -1 = BestIsa()
  int threads = 0;  ///< 0 = ComputeThreads()
  /// Scores of int8 prefix keys (the K8V codec) on AMX-INT8 tiles, from the queries held as
  /// three int8 code rows (|query error| <= 3e-7 max|q| per element): -1
  /// (auto) where the ISA is avx512 and AmxInt8Supported(), 0 never (f32 scores), 1 required
  /// (kFailedPrecondition where unavailable). Either way a score depends only on its query
  /// and key, so a batched call equals separate calls bit for bit.
  int amx = -1;
  /// kCuda: every pointer of the args and of the prefix view is device memory; the kernels
  /// run on `stream` (asynchronously) with the same math (kernels/cuda/attention_kernels.cu).
  Device device = Device::kCpu;
  Stream stream = nullptr;
};

/// softmax(q K^T / sqrt(head_dim)) V over [prefix | suffix] for every query row and head,
/// merged exactly by log-sum-exp (see the file comment). Errors: kInvalidArgument for
/// inconsistent shapes (naming the field), kFailedPrecondition for a forced ISA the CPU lacks,
/// kUnimplemented for Device::kCuda in a build without CUDA, kInternal for a CUDA error.
[[nodiscard]] Status AttentionForward(const AttentionArgs& args, const AttentionOptions& opt = {});

/// One session of a batched call (AttentionForwardBatch): its query rows and its private
/// suffix, with the meaning of the AttentionArgs fields of the same names.
struct AttentionSession {
  const float* k_suffix = nullptr;  ///< f32 [kv_heads][suffix_capacity][head_dim]
  const float* v_suffix = nullptr;
  int64_t suffix_capacity = 0;
  /// Valid suffix positions, the n new rows included (>= n): row i sits at suffix index
  /// suffix_length - n + i. suffix_length == n: no private token before the new rows.
  int64_t suffix_length = 0;
  int64_t n = 0;             ///< query rows; 0 = the session sits this step out (untouched)
  const float* q = nullptr;  ///< f32 [n][heads][head_dim] (after RoPE)
  float* out = nullptr;      ///< f32 [n][heads][head_dim]
};

/// Arguments of AttentionForwardBatch for one layer: S sessions over ONE shared prefix.
struct BatchAttentionArgs {
  const PrefixView* prefix = nullptr;        ///< as AttentionArgs::prefix (may be null)
  absl::Span<const PrefixView> prefix_tail;  ///< as AttentionArgs::prefix_tail
  int32_t layer = 0;
  int32_t heads = 0, kv_heads = 0, head_dim = 0;
  absl::Span<const AttentionSession> sessions;  ///< may be empty (nothing to do)
};

/// AttentionForward for S sessions sharing one prefix (Hydragen's inter-sequence batching,
/// Juravsky et al. 2024; FlashInfer's shared-prefix cascade): each prefix chunk of each KV
/// head is read and decoded ONCE for the queries of all sessions (int8 keys converted once,
/// a queries x keys score tile, packed values decoded once and accumulated for every query),
/// then each session's own suffix chunks are merged in by log-sum-exp as AttentionForward
/// does. Every session's output is bit-identical to an AttentionForward call with the same
/// prefix and that session's fields, on every ISA and thread count: every score, softmax and
/// value sum follows the single call's float order (tiles never change a result; on AVX-512
/// a session takes the transposed-key scores iff its own call would).
/// Prefix bytes read per step: LayerBytes() once instead of S times.
/// Device::kCuda runs one AttentionForward per session (correct, not yet batched).
/// Errors: as AttentionForward, the message naming the session ("session 3: ...").
[[nodiscard]] Status AttentionForwardBatch(const BatchAttentionArgs& args,
                                           const AttentionOptions& opt = {});

/// One decode row for each of `rows` sessions whose private suffixes share one slab (a
/// batched decode step on a device: no per-session pointers, one launch for all).
struct SlotAttentionArgs {
  const PrefixView* prefix = nullptr;        ///< as AttentionArgs::prefix (may be null)
  absl::Span<const PrefixView> prefix_tail;  ///< as AttentionArgs::prefix_tail
  int32_t layer = 0;
  /// f32 [slots][kv_heads][capacity][head_dim] (this layer's): slot s's suffix at
  /// k_slab + s * kv_heads * capacity * head_dim.
  const float* k_slab = nullptr;
  const float* v_slab = nullptr;
  int64_t slots = 0;
  int64_t capacity = 0;
  int64_t rows = 0;  ///< sessions (>= 1, <= 65535), one query row each
  /// [rows] slot of row r and its suffix length (the new row included: it sits at suffix
  /// index row_length[r] - 1). On Device::kCuda device memory read when the kernels run (the
  /// caller keeps them in range: a slot or length outside reads as an empty suffix); on the
  /// CPU host memory, checked (kOutOfRange naming the row).
  const int32_t* row_slot = nullptr;
  const int64_t* row_length = nullptr;
  /// Upper bound of every row_length (<= capacity): the launch shape on CUDA.
  int64_t max_length = 0;
  int32_t heads = 0, kv_heads = 0, head_dim = 0;
  const float* q = nullptr;  ///< f32 [rows][heads][head_dim] (after RoPE)
  float* out = nullptr;      ///< f32 [rows][heads][head_dim]
};

/// AttentionForward for every row of `a`: row r's output equals an AttentionForward call
/// with n = 1 over slot row_slot[r] (suffix_capacity = capacity, suffix_length =
/// row_length[r]) on the same device (on the CPU it runs as AttentionForwardBatch, bit for
/// bit; on CUDA one launch of the split kernels with a session grid dimension, the same
/// per-block math as a single call). Errors: kInvalidArgument for shapes (naming the field),
/// kOutOfRange for a host slot or length outside its bounds, kUnimplemented for CUDA in a
/// build without it, kInternal for a CUDA error.
[[nodiscard]] Status AttentionForwardSlots(const SlotAttentionArgs& a,
                                           const AttentionOptions& opt = {});

/// A partial softmax state of one query head (see the file comment).
struct AttentionState {
  float m = 0;         ///< maximum score (-inf for an empty part)
  float l = 0;         ///< sum of exp(s - m) (0 for an empty part)
  float* o = nullptr;  ///< normalized output [head_dim]
};

/// Merges `b` into `a` by log-sum-exp (exact for empty parts: l == 0 leaves the other).
void MergeAttentionState(AttentionState& a, const AttentionState& b, int32_t head_dim);

}  // namespace polykv::kernels
