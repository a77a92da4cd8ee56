// Internal: byte copies between host and CUDA device memory for pools in GPU memory.
// Implemented in cuda_ipc.cc (kUnimplemented in CPU-only builds).
#pragma once

#include <cstdint>

#include "polykv/status.h"

namespace polykv::ipc::internal {

/// cudaMemcpy host -> device of `bytes`. Errors: kUnimplemented without CUDA, kInternal.
[[nodiscard]] Status CopyToDevice(void* device_dst, const void* host_src, uint64_t bytes);
/// cudaMemcpy device -> host of `bytes`.
[[nodiscard]] Status CopyToHost(void* host_dst, const void* device_src, uint64_t bytes);
/// cudaMemcpy device -> device of `bytes` (stream: cudaStream_t or nullptr).
[[nodiscard]] Status CopyDeviceToDevice(void* dst, const void* src, uint64_t bytes, void* stream);

}  // namespace polykv::ipc::internal
