// CUDA matrix-vector and small-batch (n <= 16 rows) products over weight blocks where they
// lie in device memory, one warp per output row, plus block dequantization and embedding
// rows. The per-lane arithmetic and the warp's reduction order are block_math.h's
// (LanePartial's order, WarpSumOrder), which the CPU emulates bit for bit
// (MatVecRowWarpOrder); compiled with -fmad=false like the rest of the kernels.
//
// Memory access: lane l reads weight blocks l, l + 32, ... (a warp's loads of one step
// cover 32 consecutive blocks: 576 contiguous bytes of Q4_0) or, for F32/F16/BF16,
// values l, l + 32, ... (consecutive lanes, consecutive values). A block is copied once
// into registers (16-bit loads where the row is 2-byte aligned) and multiplied with every
// activation row of the batch; accumulation is f32.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "device_cuda.h"
#include "polykv/kernels/block_math.h"

namespace polykv::kernels::cuda {
namespace {

namespace bm = ::polykv::kernels::blocks;

template <uint32_t kType>
constexpr int kBytesOf = kType == bm::kQ4_0   ? 18
                         : kType == bm::kQ4_1 ? 20
                         : kType == bm::kQ5_0 ? 22
                         : kType == bm::kQ5_1 ? 24
                         : kType == bm::kQ8_0 ? 34
                         : kType == bm::kF32  ? 4
                                              : 2;

template <uint32_t kType>
constexpr bool kIsFloatType = kType == bm::kF32 || kType == bm::kF16 || kType == bm::kBF16;

// Copies one block (kBytes, even) into `dst`: 16-bit loads when `src` is 2-byte aligned.
template <int kBytes>
__device__ __forceinline__ void LoadBlock(const uint8_t* src, bool aligned2, uint8_t* dst) {
  if (aligned2) {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
#pragma unroll
    for (int k = 0; k < kBytes / 2; ++k) {
      const uint16_t v = __ldg(s + k);
      dst[2 * k] = static_cast<uint8_t>(v);
      dst[2 * k + 1] = static_cast<uint8_t>(v >> 8);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kBytes; ++k) dst[k] = __ldg(src + k);
  }
}

template <uint32_t kType, int kRows>
__global__ void __launch_bounds__(bm::kMatVecWarps* bm::kWarp)
    MatVecKernel(const uint8_t* __restrict__ w, int64_t rows, int64_t cols, int64_t row_bytes,
                 const float* __restrict__ x, int n, int64_t xs, float* __restrict__ y, int64_t ys,
                 bool accumulate) {
  const int lane = threadIdx.x % bm::kWarp;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * bm::kMatVecWarps + threadIdx.x / bm::kWarp;
  if (o >= rows) return;  // the whole warp leaves together
  const uint8_t* row = w + o * row_bytes;
  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
  if constexpr (kIsFloatType<kType>) {
    for (int64_t i = lane; i < cols; i += bm::kWarp) {
      const float wv = bm::FloatRowValue<kType>(row, i);
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        if (r < n) acc[r] += wv * __ldg(x + r * xs + i);
    }
  } else {
    constexpr int kBytes = kBytesOf<kType>;
    const bool aligned2 = (reinterpret_cast<uintptr_t>(row) & 1u) == 0;
    const int64_t nb = cols / 32;
    for (int64_t b = lane; b < nb; b += bm::kWarp) {
      uint8_t blk[kBytes];
      LoadBlock<kBytes>(row + b * kBytes, aligned2, blk);
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        if (r < n) acc[r] += bm::DotBlock<kType>(blk, x + r * xs + 32 * b);
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float v = acc[r];
#pragma unroll
    for (int off = bm::kWarp / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0 && r < n) y[r * ys + o] = accumulate ? y[r * ys + o] + v : v;
  }
}

template <uint32_t kType, int kRows>
cudaError_t LaunchMatVec(const void* w, int64_t rows, int64_t cols, int64_t row_bytes,
                         const float* x, int64_t n, int64_t xs, float* y, int64_t ys,
                         bool accumulate, cudaStream_t stream) {
  const bm::MatVecShape s = bm::MatVecLaunchShape(rows);
  if (s.blocks > 0x7FFFFFFF) return cudaErrorInvalidValue;
  MatVecKernel<kType, kRows><<<static_cast<unsigned>(s.blocks), s.threads, 0, stream>>>(
      static_cast<const uint8_t*>(w), rows, cols, row_bytes, x, static_cast<int>(n), xs, y, ys,
      accumulate);
  return cudaGetLastError();
}

template <uint32_t kType>
cudaError_t MatVecTyped(const void* w, int64_t rows, int64_t cols, int64_t row_bytes,
                        const float* x, int64_t n, int64_t xs, float* y, int64_t ys,
                        bool accumulate, cudaStream_t stream) {
  switch (bm::MatVecRowTile(n)) {
    case 1:
      return LaunchMatVec<kType, 1>(w, rows, cols, row_bytes, x, n, xs, y, ys, accumulate, stream);
    case 2:
      return LaunchMatVec<kType, 2>(w, rows, cols, row_bytes, x, n, xs, y, ys, accumulate, stream);
    case 4:
      return LaunchMatVec<kType, 4>(w, rows, cols, row_bytes, x, n, xs, y, ys, accumulate, stream);
    case 8:
      return LaunchMatVec<kType, 8>(w, rows, cols, row_bytes, x, n, xs, y, ys, accumulate, stream);
    case 16:
      return LaunchMatVec<kType, 16>(w, rows, cols, row_bytes, x, n, xs, y, ys, accumulate, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

// One thread per block (per value for F32/F16/BF16) of rows [begin, end).
__global__ void DequantizeRowsKernel(uint32_t type, const uint8_t* __restrict__ w, int64_t begin,
                                     int64_t count, int64_t cols, int64_t row_bytes,
                                     float* __restrict__ out) {
  const int values = bm::BlockValues(type), bytes = bm::BlockBytes(type);
  const int64_t per_row = cols / values;
  const int64_t total = count * per_row;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = k / per_row, b = k % per_row;
    bm::DequantizeBlock(type, w + (begin + r) * row_bytes + b * bytes, out + r * cols + b * values);
  }
}

// Grid (n): block r writes row ids[r].
__global__ void EmbedRowsKernel(uint32_t type, const uint8_t* __restrict__ w, int64_t rows,
                                int64_t cols, int64_t row_bytes, const int32_t* __restrict__ ids,
                                float* __restrict__ out, int64_t out_stride) {
  const int64_t r = blockIdx.x;
  const int32_t id = ids[r];
  float* o = out + r * out_stride;
  if (id < 0 || id >= rows) {
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) o[i] = NAN;
    return;
  }
  const int values = bm::BlockValues(type), bytes = bm::BlockBytes(type);
  const uint8_t* row = w + static_cast<int64_t>(id) * row_bytes;
  for (int64_t b = threadIdx.x; b < cols / values; b += blockDim.x)
    bm::DequantizeBlock(type, row + b * bytes, o + b * values);
}

unsigned GridFor(int64_t n, int threads) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535LL * 16) blocks = 65535LL * 16;  // grid-stride loops cover the rest
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

}  // namespace

cudaError_t InvokeMatVec(uint32_t type, const void* w, int64_t rows, int64_t cols,
                         int64_t row_bytes, const float* x, int64_t n, int64_t xs, float* y,
                         int64_t ys, bool accumulate, cudaStream_t stream) {
  if (rows < 1 || n < 1 || n > bm::kMatVecMaxRows) return cudaErrorInvalidValue;
  POLYKV_DISPATCH_DEVICE_WEIGHT_TYPE(
      type, kType, return cudaErrorInvalidValue,
      return MatVecTyped<kType>(w, rows, cols, row_bytes, x, n, xs, y, ys, accumulate, stream));
  return cudaErrorInvalidValue;
}

cudaError_t InvokeDequantizeRows(uint32_t type, const void* w, int64_t begin, int64_t end,
                                 int64_t cols, int64_t row_bytes, float* out, cudaStream_t stream) {
  if (!bm::DeviceTypeSupported(type) || end < begin) return cudaErrorInvalidValue;
  if (end == begin) return cudaSuccess;
  const int64_t total = (end - begin) * (cols / bm::BlockValues(type));
  DequantizeRowsKernel<<<GridFor(total, 256), 256, 0, stream>>>(
      type, static_cast<const uint8_t*>(w), begin, end - begin, cols, row_bytes, out);
  return cudaGetLastError();
}

cudaError_t InvokeEmbedRows(uint32_t type, const void* w, int64_t rows, int64_t cols,
                            int64_t row_bytes, const int32_t* ids, int64_t n, float* out,
                            int64_t out_stride, cudaStream_t stream) {
  if (!bm::DeviceTypeSupported(type) || n < 0 || n > 0x7FFFFFFF) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  EmbedRowsKernel<<<static_cast<unsigned>(n), 128, 0, stream>>>(
      type, static_cast<const uint8_t*>(w), rows, cols, row_bytes, ids, out, out_stride);
  return cudaGetLastError();
}

}  // namespace polykv::kernels::cuda
