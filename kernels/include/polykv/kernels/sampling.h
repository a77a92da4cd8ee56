// Next-token choice from a row of logits on the CPU: greedy (argmax) and temperature +
// top-p (nucleus) sampling. The reference the CUDA sampling kernels (device_ops.h) are
// tested against; the same rule as the model runtime's sampler (model/llama.h
// SamplingOptions): the random draw stays with the caller, so one seed gives the same tokens
// on every device.
#pragma once

#include <cstdint>

#include "polykv/status.h"

namespace polykv::kernels {

/// The id of the largest logit; equal logits go to the lowest id, and NaN counts as larger
/// than every number (torch.argmax's rule; ops_math.h LogitBeats). vocab >= 1.
int32_t ArgmaxLogits(const float* logits, int64_t vocab);

/// Temperature + top-p sampling with the caller's uniform draw `u` in [0, 1):
///   p = softmax(logits / temperature) in f64 (x_i = double(logit_i) / temperature,
///   p_i = exp(x_i - max x) / sum_j exp(x_j - max x)); the ids sorted by p descending, equal
///   p in ascending id order (a stable sort); keep the shortest head whose running f64 sum
///   `cum` reaches top_p; then walk the kept ids subtracting p from u * cum and return the
///   first id where it goes below 0 (the last kept id if rounding leaves it >= 0).
/// Errors: kInvalidArgument for vocab < 1, a null pointer, temperature <= 0 (or NaN), top_p
/// outside (0, 1] or u outside [0, 1).
[[nodiscard]] StatusOr<int32_t> SampleTopP(const float* logits, int64_t vocab, float temperature,
                                           float top_p, double u);

/// SampleTopP's rule without its argument checks, for a caller that holds its own
/// (model::SampleToken): the same arithmetic for every input. vocab >= 1, logits non-null.
int32_t SampleTopPUnchecked(const float* logits, int64_t vocab, float temperature, float top_p,
                            double u);

}  // namespace polykv::kernels
