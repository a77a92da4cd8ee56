// CUDA launchers of the agent-step kernels (kernels/cuda/matvec_kernels.cu, ops_kernels.cu);
// internal, CUDA builds only. Every pointer is a device pointer; arguments are validated by
// the device-neutral entry points (device_ops.cc). Each launcher enqueues on `stream` and
// returns the launch's error (cudaGetLastError), never synchronizing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace polykv::kernels::cuda {

/// y[r * ys + o] = sum_i W[o][i] x[r * xs + i] for r < n (1..16), o < rows: one warp per
/// output row (block_math.h: lane order, xor-butterfly sum); `accumulate`: y += that sum
/// (one f32 add, as a separate add kernel would do). `type` is a ggml type number with
/// device kernels (block_math.h DeviceTypeSupported).
cudaError_t InvokeMatVec(uint32_t type, const void* w, int64_t rows, int64_t cols,
                         int64_t row_bytes, const float* x, int64_t n, int64_t xs, float* y,
                         int64_t ys, bool accumulate, cudaStream_t stream);

/// out[(r - begin) * cols + i] = W[r][i] for r in [begin, end) (block_math.h dequantization).
cudaError_t InvokeDequantizeRows(uint32_t type, const void* w, int64_t begin, int64_t end,
                                 int64_t cols, int64_t row_bytes, float* out, cudaStream_t stream);

/// out[r * out_stride + i] = W[ids[r]][i] for r < n; a row whose id is outside [0, rows) is
/// written as NaN (the host validates ids first).
cudaError_t InvokeEmbedRows(uint32_t type, const void* w, int64_t rows, int64_t cols,
                            int64_t row_bytes, const int32_t* ids, int64_t n, float* out,
                            int64_t out_stride, cudaStream_t stream);

/// x [n][>= cols] f32 (stride xs) -> out [n][cols] f16 (dtype 1) or bf16 (dtype 2), RNE.
cudaError_t InvokeConvertRows(const float* x, int64_t n, int64_t cols, int64_t xs, int dtype,
                              void* out, cudaStream_t stream);

/// RMSNorm of `rows` rows of `dim` (ops.h RmsNormRows; f64 sum of squares). out may alias x.
cudaError_t InvokeRmsNormRows(const float* x, const float* w, int64_t rows, int64_t dim, float eps,
                              float* out, cudaStream_t stream);

/// out[i] = silu(gate[i]) * up[i]. out may alias either input.
cudaError_t InvokeSiluMul(const float* gate, const float* up, int64_t count, float* out,
                          cudaStream_t stream);

/// out[i] = a[i] + b[i]. out may alias either input.
cudaError_t InvokeAdd(const float* a, const float* b, int64_t count, float* out,
                      cudaStream_t stream);

/// RoPE in place on x [n][row_stride] (row r: heads vectors of head_dim at its start) with
/// tables cos/sin [n][head_dim] (ops.h RopeHeads per row).
cudaError_t InvokeRopeRows(float* x, int64_t n, int64_t row_stride, int32_t heads, int32_t head_dim,
                           const float* cos, const float* sin, cudaStream_t stream);

/// cache[h][pos + r][d] = src[r * src_stride + h * head_dim + d] for r < n, h < kv_heads,
/// pos = *pos_dev when set (read by the kernel), else `pos`.
cudaError_t InvokeAppendKvRows(const float* src, int64_t n, int64_t src_stride, int32_t kv_heads,
                               int32_t head_dim, float* cache, int64_t capacity, int64_t pos,
                               const int64_t* pos_dev, cudaStream_t stream);

/// slab[row_slot[r]][h][row_length[r] - 1][d] = src[r * src_stride + h * head_dim + d]
/// (slab f32 [slots][kv_heads][capacity][head_dim]); rows whose slot or position is out of
/// range are skipped.
cudaError_t InvokeAppendKvSlots(const float* src, int64_t n, int64_t src_stride, int32_t kv_heads,
                                int32_t head_dim, float* slab, int64_t slots, int64_t capacity,
                                const int32_t* row_slot, const int64_t* row_length,
                                cudaStream_t stream);

/// ids[r] = argmax of logits[r * stride .. + vocab) (ops_math.h LogitBeats).
cudaError_t InvokeArgmaxRows(const float* logits, int64_t rows, int64_t vocab, int64_t stride,
                             int32_t* ids, cudaStream_t stream);

/// *id = the top-p draw of sampling.h SampleTopP for one row of logits (scratch allocated on
/// the stream and freed after use).
cudaError_t InvokeSampleTopP(const float* logits, int64_t vocab, float temperature, float top_p,
                             double u, int32_t* id, cudaStream_t stream);

}  // namespace polykv::kernels::cuda
