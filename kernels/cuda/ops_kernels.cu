// CUDA element-wise ops of a decoder step (RMSNorm, SiLU-gate, residual add, RoPE), f32 ->
// f16/bf16 row conversion (cuBLAS inputs), greedy argmax and temperature + top-p sampling.
// The per-element math is ops_math.h's, shared with the CPU ops (ops.cc, sampling.cc).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "device_cuda.h"
#include "polykv/kernels/dtype_convert.h"
#include "polykv/kernels/ops_math.h"

namespace polykv::kernels::cuda {
namespace {

namespace om = ::polykv::kernels::opmath;

constexpr int kThreads = 256;

unsigned GridFor(int64_t n, int threads = kThreads) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535LL * 16) blocks = 65535LL * 16;  // grid-stride loops cover the rest
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

// One block per row: f64 sum of squares (per-thread strided, then a fixed tree), the scale
// from ops_math.h, then x * inv * w.
__global__ void RmsNormKernel(const float* x, const float* __restrict__ w, int64_t dim, float eps,
                              float* out) {
  __shared__ double red[kThreads];
  __shared__ float inv_s;
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  float* o = out + static_cast<int64_t>(blockIdx.x) * dim;
  double ss = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const double v = xr[i];
    ss += v * v;
  }
  red[threadIdx.x] = ss;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) inv_s = om::RmsNormInverse(red[0], dim, eps);
  __syncthreads();
  const float inv = inv_s;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) o[i] = om::RmsNormValue(xr[i], inv, w[i]);
}

__global__ void SiluMulKernel(const float* gate, const float* up, int64_t count, float* out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = om::SiluMulValue(gate[i], up[i]);
}

__global__ void AddKernel(const float* a, const float* b, int64_t count, float* out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = a[i] + b[i];
}

// Grid (heads, n): one block per (row, head), threads over the head_dim / 2 pairs.
__global__ void RopeKernel(float* x, int64_t row_stride, int32_t head_dim,
                           const float* __restrict__ cos, const float* __restrict__ sin) {
  const int64_t r = blockIdx.y;
  float* v = x + r * row_stride + static_cast<int64_t>(blockIdx.x) * head_dim;
  const float* c = cos + r * head_dim;
  const float* s = sin + r * head_dim;
  const int half = head_dim / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x)
    om::RopePair(v[i], v[i + half], c[i], s[i], c[i + half], s[i + half], &v[i], &v[i + half]);
}

// Grid (kv_heads, n): block (h, r) copies one head_dim vector.
__global__ void AppendKvRowsKernel(const float* __restrict__ src, int64_t src_stride,
                                   int32_t head_dim, float* __restrict__ cache, int64_t capacity,
                                   int64_t pos, const int64_t* __restrict__ pos_dev) {
  const int64_t h = blockIdx.x, r = blockIdx.y;
  const int64_t p = (pos_dev != nullptr ? *pos_dev : pos) + r;
  const float* s = src + r * src_stride + h * head_dim;
  float* d = cache + (h * capacity + p) * head_dim;
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) d[i] = s[i];
}

// Grid (kv_heads, n): block (h, r) copies row r's vector h into its session's slot.
__global__ void AppendKvSlotsKernel(const float* __restrict__ src, int64_t src_stride,
                                    int32_t kv_heads, int32_t head_dim, float* __restrict__ slab,
                                    int64_t slots, int64_t capacity,
                                    const int32_t* __restrict__ row_slot,
                                    const int64_t* __restrict__ row_length) {
  const int64_t h = blockIdx.x, r = blockIdx.y;
  const int64_t slot = row_slot[r], p = row_length[r] - 1;
  if (slot < 0 || slot >= slots || p < 0 || p >= capacity) return;
  const float* s = src + r * src_stride + h * head_dim;
  float* d = slab + ((slot * kv_heads + h) * capacity + p) * head_dim;
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) d[i] = s[i];
}

__global__ void ConvertRowsKernel(const float* __restrict__ x, int64_t n, int64_t cols, int64_t xs,
                                  int dtype, uint16_t* __restrict__ out) {
  const int64_t total = n * cols;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = x[(k / cols) * xs + k % cols];
    out[k] = dtype == 1 ? dtype::FloatToF16(v) : dtype::FloatToBf16(v);
  }
}

// One block per row; (value, id) pairs reduced with LogitBeats, a strict total order, so
// the result does not depend on the reduction order.
constexpr int kArgmaxThreads = 1024;
__global__ void ArgmaxKernel(const float* __restrict__ logits, int64_t vocab, int64_t stride,
                             int32_t* ids) {
  __shared__ float bv[kArgmaxThreads];
  __shared__ int64_t bi[kArgmaxThreads];
  const float* l = logits + static_cast<int64_t>(blockIdx.x) * stride;
  float best = INFINITY;
  int64_t besti = -1;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = l[i];
    if (besti < 0 || om::LogitBeats(v, i, best, besti)) {
      best = v;
      besti = i;
    }
  }
  bv[threadIdx.x] = best;
  bi[threadIdx.x] = besti;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const int64_t oi = bi[threadIdx.x + s];
      if (oi >= 0 && (bi[threadIdx.x] < 0 ||
                      om::LogitBeats(bv[threadIdx.x + s], oi, bv[threadIdx.x], bi[threadIdx.x]))) {
        bv[threadIdx.x] = bv[threadIdx.x + s];
        bi[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) ids[blockIdx.x] = static_cast<int32_t>(bi[0]);
}

// Top-p, step 1 (one block): p_i = exp(x_i - max x) / sum (f64, x_i = logit_i / t), ids_i = i.
constexpr int kSoftmaxThreads = 1024;
__global__ void SoftmaxF64Kernel(const float* __restrict__ logits, int64_t vocab, double t,
                                 double* __restrict__ p, int32_t* __restrict__ ids) {
  __shared__ double red[kSoftmaxThreads];
  double mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const double v = static_cast<double>(logits[i]) / t;
    mx = mx < v ? v : mx;  // std::max's rule: a NaN never replaces the maximum
  }
  red[threadIdx.x] = mx;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s && red[threadIdx.x] < red[threadIdx.x + s])
      red[threadIdx.x] = red[threadIdx.x + s];
    __syncthreads();
  }
  mx = red[0];
  __syncthreads();
  double sum = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const double e = exp(static_cast<double>(logits[i]) / t - mx);
    p[i] = e;
    ids[i] = static_cast<int32_t>(i);
    sum += e;
  }
  red[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  sum = red[0];
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) p[i] = p[i] / sum;
}

// Top-p, step 3 (one block): over the sorted probabilities, staged in shared memory a chunk
// at a time, thread 0 runs the CPU's two sequential f64 walks (SampleTopP).
constexpr int kWalkThreads = 256;

// One walk over ps[0, n): staged in shared `chunk` kWalkThreads values at a time, thread 0
// runs scan(base, m) over chunk[0, m) = ps[base, base + m); the walk stops once *done is set.
template <class Scan>
__device__ inline void WalkChunks(const double* __restrict__ ps, int64_t n, double* chunk,
                                  const int* done, Scan scan) {
  for (int64_t base = 0; base < n; base += kWalkThreads) {
    if (base + threadIdx.x < n) chunk[threadIdx.x] = ps[base + threadIdx.x];
    __syncthreads();
    if (threadIdx.x == 0) scan(base, n - base < kWalkThreads ? n - base : kWalkThreads);
    __syncthreads();
    if (*done) break;
  }
}

__global__ void TopPWalkKernel(const double* __restrict__ ps, const int32_t* __restrict__ ids,
                               int64_t vocab, double top_p, double u, int32_t* out) {
  __shared__ double chunk[kWalkThreads];
  __shared__ int64_t keep_s;
  __shared__ double cum_s;
  __shared__ int done;
  if (threadIdx.x == 0) {
    keep_s = 0;
    cum_s = 0;
    done = 0;
  }
  __syncthreads();
  // Walk 1: the shortest head whose running sum reaches top_p.
  WalkChunks(ps, vocab, chunk, &done, [&](int64_t, int64_t m) {
    double cum = cum_s;
    int64_t keep = keep_s;
    for (int64_t k = 0; k < m; ++k) {
      cum += chunk[k];
      ++keep;
      if (cum >= top_p) {
        done = 1;
        break;
      }
    }
    cum_s = cum;
    keep_s = keep;
  });
  const int64_t keep = keep_s;
  // Walk 2: subtract the kept probabilities from u * cum.
  __shared__ double r_s;
  __shared__ int64_t pick;
  if (threadIdx.x == 0) {
    r_s = u * cum_s;
    pick = keep - 1;
    done = 0;
  }
  __syncthreads();
  WalkChunks(ps, keep, chunk, &done, [&](int64_t base, int64_t m) {
    double r = r_s;
    for (int64_t k = 0; k < m; ++k) {
      r -= chunk[k];
      if (r < 0) {
        pick = base + k;
        done = 1;
        break;
      }
    }
    r_s = r;
  });
  if (threadIdx.x == 0) *out = ids[pick];
}

}  // namespace

cudaError_t InvokeRmsNormRows(const float* x, const float* w, int64_t rows, int64_t dim, float eps,
                              float* out, cudaStream_t stream) {
  if (rows < 0 || rows > 0x7FFFFFFF || dim < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  RmsNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, w, dim, eps, out);
  return cudaGetLastError();
}

cudaError_t InvokeSiluMul(const float* gate, const float* up, int64_t count, float* out,
                          cudaStream_t stream) {
  if (count <= 0) return count == 0 ? cudaSuccess : cudaErrorInvalidValue;
  SiluMulKernel<<<GridFor(count), kThreads, 0, stream>>>(gate, up, count, out);
  return cudaGetLastError();
}

cudaError_t InvokeAdd(const float* a, const float* b, int64_t count, float* out,
                      cudaStream_t stream) {
  if (count <= 0) return count == 0 ? cudaSuccess : cudaErrorInvalidValue;
  AddKernel<<<GridFor(count), kThreads, 0, stream>>>(a, b, count, out);
  return cudaGetLastError();
}

cudaError_t InvokeRopeRows(float* x, int64_t n, int64_t row_stride, int32_t heads, int32_t head_dim,
                           const float* cos, const float* sin, cudaStream_t stream) {
  if (n < 0 || n > 65535 || heads < 1 || head_dim < 2 || head_dim % 2 != 0)
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int threads = head_dim / 2 < 128 ? head_dim / 2 : 128;
  RopeKernel<<<dim3(static_cast<unsigned>(heads), static_cast<unsigned>(n)), threads, 0, stream>>>(
      x, row_stride, head_dim, cos, sin);
  return cudaGetLastError();
}

cudaError_t InvokeAppendKvRows(const float* src, int64_t n, int64_t src_stride, int32_t kv_heads,
                               int32_t head_dim, float* cache, int64_t capacity, int64_t pos,
                               const int64_t* pos_dev, cudaStream_t stream) {
  if (n < 0 || n > 65535 || kv_heads < 1 || head_dim < 1) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int threads = head_dim < 128 ? head_dim : 128;
  AppendKvRowsKernel<<<dim3(static_cast<unsigned>(kv_heads), static_cast<unsigned>(n)), threads, 0,
                       stream>>>(src, src_stride, head_dim, cache, capacity, pos, pos_dev);
  return cudaGetLastError();
}

cudaError_t InvokeAppendKvSlots(const float* src, int64_t n, int64_t src_stride, int32_t kv_heads,
                                int32_t head_dim, float* slab, int64_t slots, int64_t capacity,
                                const int32_t* row_slot, const int64_t* row_length,
                                cudaStream_t stream) {
  if (n < 0 || n > 65535 || kv_heads < 1 || head_dim < 1) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int threads = head_dim < 128 ? head_dim : 128;
  AppendKvSlotsKernel<<<dim3(static_cast<unsigned>(kv_heads), static_cast<unsigned>(n)), threads, 0,
                        stream>>>(src, src_stride, kv_heads, head_dim, slab, slots, capacity,
                                  row_slot, row_length);
  return cudaGetLastError();
}

cudaError_t InvokeConvertRows(const float* x, int64_t n, int64_t cols, int64_t xs, int dtype,
                              void* out, cudaStream_t stream) {
  if (n < 0 || cols < 1 || (dtype != 1 && dtype != 2)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  ConvertRowsKernel<<<GridFor(n * cols), kThreads, 0, stream>>>(x, n, cols, xs, dtype,
                                                                static_cast<uint16_t*>(out));
  return cudaGetLastError();
}

cudaError_t InvokeArgmaxRows(const float* logits, int64_t rows, int64_t vocab, int64_t stride,
                             int32_t* ids, cudaStream_t stream) {
  if (rows < 0 || rows > 0x7FFFFFFF || vocab < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  ArgmaxKernel<<<static_cast<unsigned>(rows), kArgmaxThreads, 0, stream>>>(logits, vocab, stride,
                                                                           ids);
  return cudaGetLastError();
}

cudaError_t InvokeSampleTopP(const float* logits, int64_t vocab, float temperature, float top_p,
                             double u, int32_t* id, cudaStream_t stream) {
  if (vocab < 1 || vocab > 0x7FFFFFFF) return cudaErrorInvalidValue;
  const int n = static_cast<int>(vocab);
  size_t sort_bytes = 0;
  cudaError_t e = cub::DeviceRadixSort::SortPairsDescending(
      nullptr, sort_bytes, static_cast<const double*>(nullptr), static_cast<double*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n, 0, 64, stream);
  if (e != cudaSuccess) return e;
  // Scratch: p, sorted p (f64), ids, sorted ids (i32), the sort's temporary storage.
  const size_t v8 = sizeof(double) * static_cast<size_t>(vocab);
  const size_t v4 = (sizeof(int32_t) * static_cast<size_t>(vocab) + 255) / 256 * 256;
  uint8_t* scratch = nullptr;
  e = cudaMallocAsync(reinterpret_cast<void**>(&scratch), 2 * v8 + 2 * v4 + sort_bytes, stream);
  if (e != cudaSuccess) return e;
  double* p = reinterpret_cast<double*>(scratch);
  double* ps = reinterpret_cast<double*>(scratch + v8);
  int32_t* ids = reinterpret_cast<int32_t*>(scratch + 2 * v8);
  int32_t* ids_sorted = reinterpret_cast<int32_t*>(scratch + 2 * v8 + v4);
  void* sort_tmp = scratch + 2 * v8 + 2 * v4;
  SoftmaxF64Kernel<<<1, kSoftmaxThreads, 0, stream>>>(logits, vocab, temperature, p, ids);
  e = cudaGetLastError();
  if (e == cudaSuccess)
    e = cub::DeviceRadixSort::SortPairsDescending(sort_tmp, sort_bytes, p, ps, ids, ids_sorted, n,
                                                  0, 64, stream);
  if (e == cudaSuccess) {
    TopPWalkKernel<<<1, kWalkThreads, 0, stream>>>(ps, ids_sorted, vocab, top_p, u, id);
    e = cudaGetLastError();
  }
  const cudaError_t f = cudaFreeAsync(scratch, stream);
  return e != cudaSuccess ? e : f;
}

}  // namespace polykv::kernels::cuda
