// CUDA launchers of the codec (kernels/cuda/codec_kernels.cu); internal, CUDA builds only.
// All pointers are device pointers; dtype codes as in codec_math.h (0 f32, 1 f16, 2 bf16);
// mode is the KeyScaleMode value. `bad` is a device uint64 that the kernels lower (atomicMin)
// to the flat index of the first NaN/Inf element they meet; the caller initializes it to
// ~0ull and reads it back.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "polykv/kernels/codec_math.h"

namespace polykv::kernels::cuda {

/// Computes key scales (absmax / 127, 1 for all-zero groups) into `scales`.
cudaError_t InvokeKeyScales(const void* k, int dtype, int32_t heads, int64_t tokens, int32_t d,
                            int mode, float* scales, unsigned long long* bad, cudaStream_t stream);
/// q = rne(x / scale) clamped to [-127, 127].
cudaError_t InvokeQuantizeKeys(const void* k, int dtype, int32_t heads, int64_t tokens, int32_t d,
                               int mode, const float* scales, int8_t* q, unsigned long long* bad,
                               cudaStream_t stream);
/// out = q * scale as out_dtype.
cudaError_t InvokeDequantizeKeys(const int8_t* q, const float* scales, int32_t heads,
                                 int64_t tokens, int32_t d, int mode, void* out, int out_dtype,
                                 cudaStream_t stream);
/// TurboQuant-MSE encode of `vectors` vectors of d (<= kMaxCudaHeadDim) elements.
cudaError_t InvokeEncodeValues(const void* v, int dtype, int64_t vectors, int32_t d,
                               const math::ValueCodebook& cb, uint64_t seed, bool norm_correction,
                               uint8_t* packed, float* norms, unsigned long long* bad,
                               cudaStream_t stream);
/// TurboQuant-MSE decode.
cudaError_t InvokeDecodeValues(const uint8_t* packed, const float* norms, int64_t vectors,
                               int32_t d, const math::ValueCodebook& cb, uint64_t seed, void* out,
                               int out_dtype, cudaStream_t stream);

}  // namespace polykv::kernels::cuda
