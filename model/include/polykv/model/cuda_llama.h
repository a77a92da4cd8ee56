// The CUDA model runtime: an agent's whole step on one CUDA device, over the device kernels
// of polykv/kernels/device_ops.h and the CUDA attention of polykv/kernels/attention.h.
//
// Per forward of n rows at positions past .. past + n - 1 (the same order of operations as
// the mapped CPU runtime, mapped_llama.cc):
//   x = DeviceEmbedRows(ids)                                        f32 [n][hidden]
//   per layer: h = RMSNorm(x); q, k, v = h W^T (+ biases)           DeviceMatMul
//     RoPE on q, k with the CPU runtime's own host cos/sin tables   DeviceRopeRows
//       (Llama-3, YaRN, linear and file factors included), uploaded per step
//     k, v appended to the agent's private device suffix            f32 [kv_heads][cap][hd]
//     attention over [prefix where it lies | suffix], merged by     AttentionForward(kCuda)
//       log-sum-exp (the prefix: a pool in CUDA memory, read in place, never copied)
//     x += o Wo^T (+ bias); h = RMSNorm(x); x += (silu(h Wg^T) * h Wu^T) Wd^T
//   logits = RMSNorm(x_last) Wout^T; the next id by DeviceArgmaxRows (greedy) or
//   DeviceSampleTopP (u drawn on the host from the seed as the CPU runtime draws it).
// Decode steps (one row) replay one CUDA graph captured at the first step of a Generate: the
// embedding reads the sampled id where the sampler wrote it, the K/V append and the
// attention read the step's position from device memory, and the host only uploads that
// position and the RoPE row before each replay: the same kernels in the same order as
// direct launches (identical results), without ~17 launches per layer from the host.
// Weights: every matrix is copied to device memory once per process, in its stored format
// (GGUF Q/K rows permuted once from llama.cpp's interleaved order to HF's, which the CPU
// runtime does on each output instead); the norms and biases as f32. A matrix whose type has
// no CUDA kernels (the K-quants: a tied Q6_K embedding of a Q4_1 GGUF) is converted to F16 at
// upload, with one line on stderr saying so.
//
// Agreement with the CPU runtime: the device matrix products do not quantize activations
// (the CPU kernels do, matmul.h), so logits differ by that (~1e-2 on SmolLM2 Q4_1; exact-f32
// weights agree to float rounding); greedy answers are compared in the gpu tests.
// A build without CUDA returns kUnimplemented from Load; a host without a usable device
// kFailedPrecondition: never a CPU run.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/types/span.h"
#include "polykv/model/batch_engine.h"
#include "polykv/model/llama.h"
#include "polykv/status.h"

namespace polykv::model {

class CudaBatch;

/// A Llama-family model whose forward passes run on one CUDA device. Not thread-safe.
class CudaLlama {
 public:
  /// Loads `path` (as LlamaModel::Load: HF folder or .gguf) and uploads its weights to CUDA
  /// device `device` (an ordinal). Errors: kUnimplemented (no CUDA in this build),
  /// kFailedPrecondition (no usable device, ordinal
  /// out of range), kResourceExhausted (device memory), the loader's errors.
  [[nodiscard]] static StatusOr<std::unique_ptr<CudaLlama>> Load(const std::string& path,
                                                                 int device,
                                                                 const LoadOptions& options = {});
  ~CudaLlama();
  CudaLlama(const CudaLlama&) = delete;
  CudaLlama& operator=(const CudaLlama&) = delete;

  const ModelConfig& config() const;
  const std::string& fingerprint() const;
  /// The model's tokenizer (the CPU runtime's), or null when it ships none.
  const Tokenizer* tokenizer() const;
  /// Bytes of the weights on the device (what a decode step reads, the f32 copies aside).
  uint64_t weight_bytes() const;
  /// The CUDA ordinal the weights live on.
  int device() const;
  /// Bytes of device memory this model holds: weights, norms, biases, the workspace and the
  /// f32 matrix copies of batched products (CudaBatch).
  uint64_t device_bytes() const;

  /// Generates after `prefix` (null: no prefix): feeds `prompt` at positions
  /// prefix->tokens() .. (prefix tokens ids are not needed), then samples up to
  /// sampling.max_new_tokens ids as LlamaModel::Generate does (greedy = lowest id on ties;
  /// top-p with a std::mt19937_64 seeded by sampling.seed; an end-of-generation id stops).
  /// Every pointer of `prefix` (all segments: a pool tree's root and children, in position
  /// order) must be device memory of device(). The agent's own K/V live in a private device suffix
  /// of prompt + max_new_tokens positions, freed on return. prefix->check is called after every
  /// step (a failing check fails the call). Errors: kInvalidArgument (empty prompt, ids
  /// outside the vocabulary, a prefix of another shape),
  /// kInternal / kResourceExhausted for device errors.
  [[nodiscard]] StatusOr<GenerateResult> Generate(const KvPrefix* prefix,
                                                  absl::Span<const int32_t> prompt,
                                                  const SamplingOptions& sampling);

  /// Prefills `tokens` on the device after `prefix` (null: a document from position 0; else
  /// a child pool's tokens at positions prefix->tokens() .., attending to every segment of
  /// the prefix in place, which must be device memory of device()) in steps of `chunk` rows
  /// (at most 256), calling progress(done, total) after each, and returns the new positions'
  /// K/V as LlamaModel::Prefill / PrefillAfterPrefix do: f32 [kv_heads][tokens][head_dim] per
  /// layer (K after RoPE) and the last position's logits. The K/V are copied to host memory,
  /// or with `keep_on_device` left where they are (PrefillResult::device_k / device_v, owned
  /// by device_kv): what a daemon with a GPU encodes into a cuda pool without a round trip
  /// through the host. Errors as Generate (kInvalidArgument for an empty document, ids
  /// outside the vocab, a prefix of another shape; a failing prefix->check).
  [[nodiscard]] StatusOr<PrefillResult> Prefill(
      const KvPrefix* prefix, absl::Span<const int32_t> tokens, int64_t chunk = 256,
      const std::function<void(int64_t, int64_t)>& progress = nullptr, bool keep_on_device = false);

  /// Whether decode steps replay a captured CUDA graph (default: on, unless the environment
  /// sets POLYKV_CUDA_GRAPHS=0). Off: every kernel is launched from the host (tests compare).
  void set_cuda_graphs(bool on);

  /// -log p(targets[i]) of each position i of `input` fed after `prefix` (null: from
  /// position 0), in forwards of at most `rows` (1..256) rows: every row's logits come to the
  /// host and are scored by model::LogProb (llama.cpp's formula, as the CPU's ScoreTokens).
  /// What `polykv-cli agent --score-ids --device cuda` (the eval's agents section) reports.
  /// Errors: kInvalidArgument (empty input, sizes differ, ids outside the vocabulary, rows
  /// outside 1..256, a prefix of another shape), device errors as Generate.
  [[nodiscard]] StatusOr<std::vector<double>> Score(const KvPrefix* prefix,
                                                    absl::Span<const int32_t> input,
                                                    absl::Span<const int32_t> targets,
                                                    int64_t rows = 256);

  /// Logits f32 [vocab] of the last of `tokens` run from position 0 without a prefix (tests:
  /// CUDA vs CPU). Errors as Generate.
  [[nodiscard]] StatusOr<std::vector<float>> LastLogits(absl::Span<const int32_t> tokens);

  /// Sessions decoded together over `prefix` (null: none; device memory of device(), every
  /// segment of a pool tree; it and this model must outlive the batch): `slots` sessions of at most
  /// `capacity` own positions each (prompt + answer), their K/V in one slab of device memory
  /// (2 x layers x slots x kv_heads x capacity x head_dim f32, allocated here). From the first
  /// step of more than 16 rows the matrices are also held as f32 on the device (dequantized
  /// once, the total logged; cuBLAS products for every row at once; where a copy does not fit
  /// in device memory, the products run on the stored blocks). Errors: kInvalidArgument (slots
  /// or capacity < 1, a prefix of another shape), kUnimplemented (no CUDA),
  /// kResourceExhausted (device memory).
  [[nodiscard]] StatusOr<std::unique_ptr<CudaBatch>> NewBatch(const KvPrefix* prefix, int32_t slots,
                                                              int64_t capacity);

 private:
  friend class CudaBatch;
  struct Impl;
  explicit CudaLlama(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Batched decode on a CudaLlama (see CudaLlama::NewBatch). Each decode step runs every
/// product once for all rows (the weights read once per step, not once per session), RoPE
/// per row at its own position, one K/V append and one attention launch per layer for all
/// sessions (kernels::DeviceAppendKvSlots, kernels::AttentionForwardSlots: the prefix read
/// in place), and a greedy id per row on the device. A row computes what a single session
/// computes up to the products' summation order (cuBLAS f32 for more than 16 rows, the warp
/// kernels below). Not thread-safe.
class CudaBatch {
 public:
  ~CudaBatch();
  CudaBatch(const CudaBatch&) = delete;
  CudaBatch& operator=(const CudaBatch&) = delete;

  /// A free slot, its suffix empty. kResourceExhausted when every slot is taken.
  [[nodiscard]] StatusOr<int32_t> Open();
  /// Frees `slot` (ignored when not open).
  void Close(int32_t slot);
  /// Own positions `slot` holds.
  int64_t length(int32_t slot) const;
  int32_t slots() const;
  int64_t capacity() const;
  /// Device memory of the slab and the batch's buffers (the f32 matrices included), bytes.
  uint64_t device_bytes() const;

  /// Feeds `prompt` into open `slot` after what it holds (the agents' own step, 256 rows at a
  /// time); the last row's logits f32 [vocab] into *logits (host; may be null) and its greedy
  /// id into *argmax. Errors: kInvalidArgument (slot not open, empty prompt, ids outside the
  /// vocabulary), kOutOfRange (past the slot's capacity), the prefix check's, device errors;
  /// after an error the slot holds what it held before the call.
  [[nodiscard]] Status Prompt(int32_t slot, absl::Span<const int32_t> prompt,
                              std::vector<float>* logits, int32_t* argmax);

  /// One decode step: tokens[i] at the next position of slots[i] (distinct open slots).
  /// argmax[i] = the greedy id of row i; rows with need_logits[i] != 0 get their logits
  /// f32 [vocab] at (*logits)[i * vocab] (host; other rows left as they are). Errors as
  /// Prompt (kInvalidArgument also for repeated slots, mismatched sizes or null outputs).
  [[nodiscard]] Status Decode(absl::Span<const int32_t> slots, absl::Span<const int32_t> tokens,
                              absl::Span<const uint8_t> need_logits, std::vector<int32_t>* argmax,
                              std::vector<float>* logits);

 private:
  friend class CudaLlama;
  struct State;
  explicit CudaBatch(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

/// CudaLlama as the model of a BatchEngine (`agents serve --device cuda`): one CudaBatch of
/// `slots` sessions of `capacity` own positions over `prefix` (device memory of the model's
/// device; kept alive by the result). Sessions' prompts run one at a time on their slots,
/// decode steps as CudaBatch::Decode (greedy ids from the device; logits copied to the host
/// only for sampled rows). NewCache fails with kResourceExhausted when every slot is taken,
/// kOutOfRange for a capacity past `capacity`. Errors: CudaLlama::NewBatch's.
[[nodiscard]] StatusOr<std::unique_ptr<BatchModel>> NewCudaBatchModel(
    CudaLlama& model, std::shared_ptr<const KvPrefix> prefix, int32_t slots, int64_t capacity);

/// GGUF Llama Q/K projections store each head's rows in llama.cpp's interleaved-pair order
/// (row 2j + s of a head holds HF row s * head_dim / 2 + j). Returns the file row that holds
/// HF row `r` (r < heads * head_dim; head_dim even): the CUDA runtime permutes those weight
/// rows and their biases once at upload by this, where the CPU runtime de-interleaves every
/// output.
int64_t GgufInterleavedSourceRow(int64_t r, int32_t head_dim);

/// Whether this build has the CUDA model runtime (a CUDA build): false = Load returns
/// kUnimplemented.
bool CudaRuntimeBuilt();

}  // namespace polykv::model
