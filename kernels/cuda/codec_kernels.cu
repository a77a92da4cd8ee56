// CUDA kernels of the codec: each thread calls the shared per-vector math of codec_math.h.
// Compiled with -fmad=false so that results equal the CPU path bit for bit.
#include <cuda_runtime.h>

#include "codec_cuda.h"
#include "polykv/kernels/codec_math.h"

namespace polykv::kernels::cuda {
namespace {

namespace m = ::polykv::kernels::math;

constexpr int kThreads = 256;

__device__ inline void ReportBad(unsigned long long* bad, int64_t index) {
  atomicMin(bad, static_cast<unsigned long long>(index));
}

// Scale index of flat element e for a [heads][tokens][d] tensor.
__device__ inline int64_t ScaleIndex(int mode, int64_t e, int64_t tokens, int32_t d) {
  if (mode == 0) return 0;
  if (mode == 1) return e / (tokens * d);
  return (e / (tokens * d)) * d + e % d;
}

// Absmax of each contiguous group of `group_len` elements (blockIdx.y = group) into
// absmax_bits[group] (non-negative floats order like their bit patterns).
__global__ void GroupAbsmaxKernel(const void* x, int dtype, int64_t group_len,
                                  unsigned int* absmax_bits, unsigned long long* bad) {
  __shared__ float red[kThreads];
  const int64_t base = static_cast<int64_t>(blockIdx.y) * group_len;
  float mx = 0.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < group_len;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = m::LoadF32(x, dtype, base + i);
    if (m::IsNonFinite(v)) {
      ReportBad(bad, base + i);
    } else {
      mx = fmaxf(mx, fabsf(v));
    }
  }
  red[threadIdx.x] = mx;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicMax(&absmax_bits[blockIdx.y], __float_as_uint(red[0]));
}

// Absmax per (head, channel) column: one thread per column, looping over tokens.
__global__ void ColumnAbsmaxKernel(const void* x, int dtype, int32_t heads, int64_t tokens,
                                   int32_t d, unsigned int* absmax_bits, unsigned long long* bad) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= static_cast<int64_t>(heads) * d) return;
  const int64_t h = col / d, c = col % d;
  float mx = 0.0f;
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t e = (h * tokens + t) * d + c;
    const float v = m::LoadF32(x, dtype, e);
    if (m::IsNonFinite(v)) {
      ReportBad(bad, e);
    } else {
      mx = fmaxf(mx, fabsf(v));
    }
  }
  absmax_bits[col] = __float_as_uint(mx);
}

__global__ void FinalizeScalesKernel(float* scales, int64_t n, int bits) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) scales[i] = m::KeyScaleFromAbsmaxBits(scales[i], bits);
}

// The CPU's order (codec_cpu.cc): the int8 code, then the clamp to the bits' range.
__global__ void QuantizeKeysKernel(const void* x, int dtype, int64_t n, int64_t tokens, int32_t d,
                                   int mode, int bits, const float* scales, int8_t* q,
                                   unsigned long long* bad) {
  const int qm = m::KeyQMax(bits);
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = m::LoadF32(x, dtype, e);
    if (m::IsNonFinite(v)) {
      ReportBad(bad, e);
      q[e] = 0;
    } else {
      const int c = m::QuantizeKey(v, scales[ScaleIndex(mode, e, tokens, d)]);
      q[e] = static_cast<int8_t>(c < -qm ? -qm : c > qm ? qm : c);
    }
  }
}

// One thread per key vector: PackKeyCodes (pack: int8 values in, packed codes out) or its
// inverse UnpackKeyCodes.
__global__ void PackedKeysKernel(const void* in, int64_t vectors, int32_t d, int bits, bool pack,
                                 void* out) {
  const int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v >= vectors) return;
  const int64_t vb = m::PackedBytes(d, bits);
  if (pack) {
    m::PackKeyCodes(static_cast<const int8_t*>(in) + v * d, d, bits,
                    static_cast<uint8_t*>(out) + v * vb);
  } else {
    m::UnpackKeyCodes(static_cast<const uint8_t*>(in) + v * vb, d, bits,
                      static_cast<int8_t*>(out) + v * d);
  }
}

__global__ void ConvertNormsKernel(const void* in, int64_t n, bool to_f16, void* out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (to_f16) {
      static_cast<uint16_t*>(out)[i] = m::FloatToF16(static_cast<const float*>(in)[i]);
    } else {
      static_cast<float*>(out)[i] = m::F16ToFloat(static_cast<const uint16_t*>(in)[i]);
    }
  }
}

__global__ void DequantizeKeysKernel(const int8_t* q, const float* scales, int64_t n,
                                     int64_t tokens, int32_t d, int mode, void* out,
                                     int out_dtype) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    m::StoreF32(out, out_dtype, e, m::DequantizeKey(q[e], scales[ScaleIndex(mode, e, tokens, d)]));
  }
}

// The value kernels' prologue: the block's threads fill signs[0, d) (D, the random signs)
// in shared memory; returns this thread's vector index (one thread per vector).
__device__ inline int64_t BlockSignsAndVector(uint64_t seed, int32_t d, float* signs) {
  for (int i = threadIdx.x; i < d; i += blockDim.x) signs[i] = m::RotationSign(seed, i);
  __syncthreads();
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

// One thread per vector; D (the random signs) is computed once per block in shared memory.
__global__ void EncodeValuesKernel(const void* v, int dtype, int64_t vectors, int32_t d,
                                   m::ValueCodebook cb, uint64_t seed, bool norm_correction,
                                   uint8_t* packed, float* norms, unsigned long long* bad) {
  __shared__ float signs[m::kMaxCudaHeadDim];
  const int64_t vi = BlockSignsAndVector(seed, d, signs);
  if (vi >= vectors) return;
  float x[m::kMaxCudaHeadDim];
  uint8_t codes[m::kMaxCudaHeadDim];
  const int64_t off = vi * d;
  int first_bad = -1;
  for (int i = 0; i < d; ++i) {
    x[i] = m::LoadF32(v, dtype, off + i);
    if (first_bad < 0 && m::IsNonFinite(x[i])) first_bad = i;
  }
  if (first_bad >= 0) {
    ReportBad(bad, off + first_bad);
    return;
  }
  norms[vi] = m::EncodeValueVector(x, d, signs, cb, norm_correction, codes,
                                   packed + vi * m::PackedBytes(d, cb.bits));
}

__global__ void DecodeValuesKernel(const uint8_t* packed, const float* norms, int64_t vectors,
                                   int32_t d, m::ValueCodebook cb, uint64_t seed, void* out,
                                   int out_dtype) {
  __shared__ float signs[m::kMaxCudaHeadDim];
  const int64_t vi = BlockSignsAndVector(seed, d, signs);
  if (vi >= vectors) return;
  float x[m::kMaxCudaHeadDim];
  m::DecodeValueVector(packed + vi * m::PackedBytes(d, cb.bits), norms[vi], d, signs, cb, x);
  const int64_t off = vi * d;
  for (int i = 0; i < d; ++i) m::StoreF32(out, out_dtype, off + i, x[i]);
}

unsigned int GridFor(int64_t n, int threads = kThreads) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535LL * 16) blocks = 65535LL * 16;  // grid-stride loops cover the rest
  return static_cast<unsigned int>(blocks < 1 ? 1 : blocks);
}

}  // namespace

cudaError_t InvokeKeyScales(const void* k, int dtype, int32_t heads, int64_t tokens, int32_t d,
                            int mode, int key_bits, float* scales, unsigned long long* bad,
                            cudaStream_t stream) {
  const int64_t n_scales = mode == 0 ? 1 : mode == 1 ? heads : static_cast<int64_t>(heads) * d;
  auto* bits = reinterpret_cast<unsigned int*>(scales);
  cudaError_t err = cudaMemsetAsync(scales, 0, sizeof(float) * n_scales, stream);
  if (err != cudaSuccess) return err;
  if (mode == 2) {
    ColumnAbsmaxKernel<<<GridFor(n_scales, 128), 128, 0, stream>>>(k, dtype, heads, tokens, d, bits,
                                                                   bad);
  } else {
    const int64_t groups = n_scales;
    const int64_t group_len = static_cast<int64_t>(heads) * tokens * d / groups;
    int64_t bx = (group_len + kThreads - 1) / kThreads;
    if (bx > 1024) bx = 1024;
    dim3 grid(static_cast<unsigned int>(bx), static_cast<unsigned int>(groups));
    GroupAbsmaxKernel<<<grid, kThreads, 0, stream>>>(k, dtype, group_len, bits, bad);
  }
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  FinalizeScalesKernel<<<GridFor(n_scales), kThreads, 0, stream>>>(scales, n_scales, key_bits);
  return cudaGetLastError();
}

cudaError_t InvokeQuantizeKeys(const void* k, int dtype, int32_t heads, int64_t tokens, int32_t d,
                               int mode, int bits, const float* scales, int8_t* q,
                               unsigned long long* bad, cudaStream_t stream) {
  if (bits < 4 || bits > 8) return cudaErrorInvalidValue;
  const int64_t n = static_cast<int64_t>(heads) * tokens * d;
  QuantizeKeysKernel<<<GridFor(n), kThreads, 0, stream>>>(k, dtype, n, tokens, d, mode, bits,
                                                          scales, q, bad);
  return cudaGetLastError();
}

cudaError_t InvokePackedKeys(const void* in, int64_t vectors, int32_t d, int bits, bool pack,
                             void* out, cudaStream_t stream) {
  if (bits < 4 || bits > 7 || d < 1) return cudaErrorInvalidValue;
  if (vectors == 0) return cudaSuccess;
  const int64_t blocks = (vectors + kThreads - 1) / kThreads;
  if (blocks > 0x7FFFFFFF) return cudaErrorInvalidValue;
  PackedKeysKernel<<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(in, vectors, d, bits,
                                                                               pack, out);
  return cudaGetLastError();
}

cudaError_t InvokeConvertNorms(const void* in, int64_t n, bool to_f16, void* out,
                               cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  ConvertNormsKernel<<<GridFor(n), kThreads, 0, stream>>>(in, n, to_f16, out);
  return cudaGetLastError();
}

cudaError_t InvokeDequantizeKeys(const int8_t* q, const float* scales, int32_t heads,
                                 int64_t tokens, int32_t d, int mode, void* out, int out_dtype,
                                 cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(heads) * tokens * d;
  DequantizeKeysKernel<<<GridFor(n), kThreads, 0, stream>>>(q, scales, n, tokens, d, mode, out,
                                                            out_dtype);
  return cudaGetLastError();
}

cudaError_t InvokeEncodeValues(const void* v, int dtype, int64_t vectors, int32_t d,
                               const m::ValueCodebook& cb, uint64_t seed, bool norm_correction,
                               uint8_t* packed, float* norms, unsigned long long* bad,
                               cudaStream_t stream) {
  if (d < 1 || d > m::kMaxCudaHeadDim) return cudaErrorInvalidValue;
  constexpr int kT = 128;
  const int64_t blocks = (vectors + kT - 1) / kT;
  if (blocks > 0x7FFFFFFF) return cudaErrorInvalidValue;
  EncodeValuesKernel<<<static_cast<unsigned int>(blocks), kT, 0, stream>>>(
      v, dtype, vectors, d, cb, seed, norm_correction, packed, norms, bad);
  return cudaGetLastError();
}

cudaError_t InvokeDecodeValues(const uint8_t* packed, const float* norms, int64_t vectors,
                               int32_t d, const m::ValueCodebook& cb, uint64_t seed, void* out,
                               int out_dtype, cudaStream_t stream) {
  if (d < 1 || d > m::kMaxCudaHeadDim) return cudaErrorInvalidValue;
  constexpr int kT = 128;
  const int64_t blocks = (vectors + kT - 1) / kT;
  if (blocks > 0x7FFFFFFF) return cudaErrorInvalidValue;
  DecodeValuesKernel<<<static_cast<unsigned int>(blocks), kT, 0, stream>>>(
      packed, norms, vectors, d, cb, seed, out, out_dtype);
  return cudaGetLastError();
}

}  // namespace polykv::kernels::cuda
