// Internal declarations shared by the codec's CPU sources (not a public header).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "polykv/kernels/codec.h"
#include "polykv/kernels/codec_math.h"

namespace polykv::kernels::internal {

/// Codebook (levels + midpoint thresholds) for `bits` in 1..4, computed once and cached.
[[nodiscard]] StatusOr<math::ValueCodebook> GetValueCodebook(int32_t bits);

/// Runs fn(begin, end) over [0, n) split into at most CodecThreads() contiguous chunks of
/// at least `grain` items; the calling thread takes one chunk. Runs inline when one chunk.
void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

/// "element 123 (head 0, token 15, dim 3)" for flat index `i` of a [H][T][D] tensor.
std::string DescribeIndex(const LayerShape& shape, int64_t i);

/// dtype code used by codec_math.h (0 f32, 1 f16, 2 bf16).
inline int DTypeCode(DType t) { return static_cast<int>(t); }

// CPU implementations (codec_cpu.cc). Arguments are already validated.
/// `bits` (4..8) sets the scales computed from the absmax (KeyScaleFromAbsmaxBits) and the
/// clamp of q to +-KeyQMax(bits).
[[nodiscard]] Status QuantizeKeysCpu(const void* k, DType dtype, const LayerShape& shape,
                                     KeyScaleMode mode, const float* given_scales, int8_t* q,
                                     float* scales_out, int bits = 8);
void DequantizeKeysCpu(const int8_t* q, const float* scales, const LayerShape& shape,
                       KeyScaleMode mode, void* out, DType out_dtype);
[[nodiscard]] Status EncodeValuesCpu(const void* v, DType dtype, const LayerShape& shape,
                                     const CodecConfig& config, const math::ValueCodebook& cb,
                                     uint8_t* packed, float* norms);
void DecodeValuesCpu(const uint8_t* packed, const float* norms, const LayerShape& shape,
                     const CodecConfig& config, const math::ValueCodebook& cb, void* out,
                     DType out_dtype);

}  // namespace polykv::kernels::internal
