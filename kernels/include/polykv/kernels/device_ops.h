// Device-neutral entry points of what an agent computes per decode/prompt step: matrix
// products over weight blocks, embedding rows, RMSNorm, RoPE, SiLU-gate, residual add,
// greedy argmax and top-p sampling. Each call runs on the Device it is given:
//  - Device::kCpu: the CPU kernels (matmul.h, ops.h, sampling.h) on host pointers;
//  - Device::kCuda: the CUDA kernels (kernels/cuda/*.cu) on device pointers, enqueued on
//    `stream` (a cudaStream_t; nullptr = the default stream) without synchronizing, on the
//    calling thread's current device (cudaSetDevice). A build without CUDA returns
//    kUnimplemented, a CUDA build on a host without a usable device kFailedPrecondition:
//    never a silent fallback to the CPU.
// Arguments are checked on the host first (kInvalidArgument naming the field, kUnimplemented
// for a weight type without device kernels), so the same bad call fails the same way with or
// without a device. CUDA errors are kInternal (kResourceExhausted for out of device memory)
// naming the kernel; errors of a kernel that fail later surface at the next synchronizing
// call, as with any CUDA work.
//
// Shared math: the CUDA kernels and the CPU run the same per-element functions
// (block_math.h, ops_math.h). Agreement with the CPU (tests/kernels/device_ops_cuda_test.cc):
//  - DeviceDequantizeRows, DeviceEmbedRows, DeviceRopeRows, DeviceAdd, DeviceArgmaxRows:
//    bit-identical;
//  - DeviceMatMul on CUDA, n <= 16 rows (warp kernels): bit-identical to the CPU emulation
//    of the warp's order (block_math.h MatVecRowWarpOrder); against the exact f64 product
//    |err| <= gamma(cols) sum_i |w_i x_i| (gamma(k) = k u / (1 - k u), u = 2^-24). The CPU
//    kernels (matmul.h) quantize activations to 8-bit + residual codes for block weights, so
//    CPU and CUDA logits differ by that (matmul.h: max |dlogit| 0.006 on SmolLM2 Q4_1);
//  - DeviceMatMul on CUDA, n > 16 rows, F32 weights: cublasSgemm (f32 inputs and
//    accumulation, no TF32); F16 / BF16 weights: the activations rounded to the weight's
//    16-bit type, cublasGemmEx with f32 accumulation (|err| <= 2^-8 (bf16) or 2^-11 (f16)
//    relative per product term, plus the f32 sum's rounding); quantized weights: the warp
//    kernels in launches of 16 rows below kDeviceGemmMinRows rows, from there the weights
//    dequantized to f32 and cublasSgemm (|err| <= gamma(cols) sum |w x|);
//  - DeviceRmsNormRows: the f64 sum of squares in another order: equal to 1 f32 ulp;
//  - DeviceSiluMul: expf differs by <= 2 ulp on the device: relative 1e-6;
//  - DeviceSampleTopP: the f64 softmax sum in another order (~1e-16 relative): the same id
//    unless u * cum falls within that of a boundary.
#pragma once

#include <cstdint>

#include "polykv/kernels/codec.h"
#include "polykv/kernels/matmul.h"
#include "polykv/status.h"

namespace polykv::kernels {

/// CUDA devices this process can use: 0 in a build without CUDA or when the driver reports
/// none (or fails). Computed once per process.
int CudaDeviceCount();

/// OK when calls on `device` can run here. kCuda: kUnimplemented in a build without CUDA,
/// kFailedPrecondition naming the reason when no device is usable.
[[nodiscard]] Status CheckDeviceAvailable(Device device);

/// Whether `type` has CUDA kernels: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (the
/// K-quants Q4_K, Q5_K, Q6_K run on the CPU only).
bool DeviceWeightTypeSupported(WeightType type);

/// Most activation rows one CUDA warp-kernel launch multiplies (block_math.h).
inline constexpr int64_t kDeviceMatVecMaxRows = 16;

/// From this many rows on, DeviceMatMul on CUDA dequantizes block-quantized weights to f32
/// once and multiplies with cuBLAS (a prefill) instead of warp-kernel launches of 16 rows (an
/// agent's prompt of fewer rows keeps the warp kernels).
inline constexpr int64_t kDeviceGemmMinRows = 64;

/// Options of DeviceMatMul.
struct DeviceMatMulOptions {
  /// CUDA, F32/F16/BF16 weights: -1 (auto) uses cuBLAS for n > kDeviceMatVecMaxRows and the
  /// warp kernels below; block-quantized weights: -1 dequantizes to f32 + cuBLAS for n >=
  /// kDeviceGemmMinRows; 0 never uses cuBLAS (launches of 16 rows); 1 uses cuBLAS for every n.
  int blas = -1;
  /// y += x W^T instead of y = x W^T: each output gets one f32 add of its product, exactly
  /// what a DeviceAdd after the product gives (a residual add fused into the product). On
  /// CUDA the warp kernels serve every n (never cuBLAS).
  bool accumulate = false;
  /// Device::kCpu: the CPU kernels' options.
  MatMulOptions cpu;
};

/// y[r * y_stride + o] = sum_i x[r * x_stride + i] * W[o][i] for r < n, o < w.rows (matmul.h
/// MatMul): x f32 [n][>= cols], y f32 [n][>= rows]; on kCuda w.data, x and y are device
/// memory. Errors: kInvalidArgument for n < 0, strides below cols / rows or null pointers;
/// kUnimplemented for a weight type without kernels on `device`; device errors as above.
[[nodiscard]] Status DeviceMatMul(const WeightView& w, const float* x, int64_t n, int64_t x_stride,
                                  float* y, int64_t y_stride, Device device,
                                  Stream stream = nullptr, const DeviceMatMulOptions& options = {});

/// Dequantizes rows [begin, end) of `w` to f32 out[(r - begin) * cols + i] (DequantizeRows).
[[nodiscard]] Status DeviceDequantizeRows(const WeightView& w, int64_t begin, int64_t end,
                                          float* out, Device device, Stream stream = nullptr);

/// Embedding lookup: out[r * out_stride + i] = table[ids[r]][i] (f32) for r < n; `ids`
/// lives on `device` (kCuda: device memory, each id in [0, table.rows), which the caller
/// checks: a row for an id outside is written as NaN; kCpu: host memory, checked:
/// kOutOfRange naming the id).
[[nodiscard]] Status DeviceEmbedRows(const WeightView& table, const int32_t* ids, int64_t n,
                                     float* out, int64_t out_stride, Device device,
                                     Stream stream = nullptr);

/// RMSNorm of rows x [rows][dim] with weight w [dim] into out (ops.h RmsNormRows; `out`
/// may alias `x`).
[[nodiscard]] Status DeviceRmsNormRows(const float* x, const float* w, int64_t rows, int64_t dim,
                                       float eps, float* out, Device device,
                                       Stream stream = nullptr);

/// out[i] = silu(gate[i]) * up[i] for i < count (ops.h SiluMul; may alias).
[[nodiscard]] Status DeviceSiluMul(const float* gate, const float* up, int64_t count, float* out,
                                   Device device, Stream stream = nullptr);

/// out[i] = a[i] + b[i] for i < count (the residual add; may alias).
[[nodiscard]] Status DeviceAdd(const float* a, const float* b, int64_t count, float* out,
                               Device device, Stream stream = nullptr);

/// RoPE in the HF rotate_half layout (ops.h RopeHeads) on n rows of x, row r at
/// x + r * row_stride holding `heads` vectors of head_dim, with row r's tables at
/// cos + r * head_dim and sin + r * head_dim (f32 [n][head_dim], computed on the host by the
/// runtime: the d/2 angles twice, Llama-3 / YaRN scaling included). In place.
/// Errors: kInvalidArgument for odd head_dim, row_stride < heads * head_dim, n > 65535.
[[nodiscard]] Status DeviceRopeRows(float* x, int64_t n, int64_t row_stride, int32_t heads,
                                    int32_t head_dim, const float* cos, const float* sin,
                                    Device device, Stream stream = nullptr);

/// Appends n rows of new K (or V) to a cache: src f32 [n][src_stride] (row r holds kv_heads
/// vectors of head_dim at its start) into cache f32 [kv_heads][capacity][head_dim] at
/// positions pos .. pos + n - 1, where pos = *pos_device (device memory on kCuda, read when
/// the kernel runs: a captured CUDA graph appends at each step's position) when pos_device
/// is set, else `pos`. Bit-exact copy. Errors: kInvalidArgument for n < 0, src_stride <
/// kv_heads * head_dim, a host `pos` with pos + n > capacity (a device position is the
/// caller's to keep in range).
[[nodiscard]] Status DeviceAppendKvRows(const float* src, int64_t n, int64_t src_stride,
                                        int32_t kv_heads, int32_t head_dim, float* cache,
                                        int64_t capacity, int64_t pos, const int64_t* pos_device,
                                        Device device, Stream stream = nullptr);

/// Appends one new K (or V) row per session of a batched decode step to a slab of session
/// caches f32 [slots][kv_heads][capacity][head_dim]: row r of src (kv_heads vectors of
/// head_dim at src + r * src_stride) goes to slot row_slot[r] at position row_length[r] - 1.
/// row_slot / row_length live on `device` (kCuda: device memory read when the kernel runs;
/// a slot or position out of range is skipped, never written; kCpu: checked, kOutOfRange
/// naming the row). Bit-exact copy. Errors: kInvalidArgument for n outside [0, 65535],
/// src_stride < kv_heads * head_dim, slots or capacity < 1.
[[nodiscard]] Status DeviceAppendKvSlots(const float* src, int64_t n, int64_t src_stride,
                                         int32_t kv_heads, int32_t head_dim, float* slab,
                                         int64_t slots, int64_t capacity, const int32_t* row_slot,
                                         const int64_t* row_length, Device device,
                                         Stream stream = nullptr);

/// ids[r] = ArgmaxLogits(logits + r * stride, vocab) for r < rows (greedy decoding: lowest
/// id on ties, NaN largest). ids lives on `device`.
[[nodiscard]] Status DeviceArgmaxRows(const float* logits, int64_t rows, int64_t vocab,
                                      int64_t stride, int32_t* ids, Device device,
                                      Stream stream = nullptr);

/// *id = SampleTopP(logits, vocab, temperature, top_p, u) (sampling.h; the caller draws u
/// in [0, 1) from its own generator, so a seed gives the same tokens on every device). `id`
/// lives on `device`. Errors as SampleTopP.
[[nodiscard]] Status DeviceSampleTopP(const float* logits, int64_t vocab, float temperature,
                                      float top_p, double u, int32_t* id, Device device,
                                      Stream stream = nullptr);

}  // namespace polykv::kernels
