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

/// Computes key scales of `bits`-bit keys (absmax / KeyQMax(bits), 1 for all-zero groups)
/// into `scales`.
cudaError_t InvokeKeyScales(const void* k, int dtype, int32_t heads, int64_t tokens, int32_t d,
                            int mode, int bits, float* scales, unsigned long long* bad,
                            cudaStream_t stream);
/// q = rne(x / scale) clamped to [-127, 127], then to [-KeyQMax(bits), KeyQMax(bits)].
cudaError_t InvokeQuantizeKeys(const void* k, int dtype, int32_t heads, int64_t tokens, int32_t d,
                               int mode, int bits, const float* scales, int8_t* q,
                               unsigned long long* bad, cudaStream_t stream);
/// pack: PackKeyCodes of each of `vectors` vectors of d signed values (int8 `in`, bits
/// 4..7) into packed codes `out` ([vectors][PackedBytes(d, bits)]); else UnpackKeyCodes of
/// packed `in` into int8 `out` [vectors][d].
cudaError_t InvokePackedKeys(const void* in, int64_t vectors, int32_t d, int bits, bool pack,
                             void* out, cudaStream_t stream);
/// Norms f32 -> f16 (to_f16: FloatToF16, round to nearest even) or f16 -> f32 (F16ToFloat),
/// n of them.
cudaError_t InvokeConvertNorms(const void* in, int64_t n, bool to_f16, void* out,
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
