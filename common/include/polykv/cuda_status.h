// The one mapping of CUDA runtime errors to Status, for the sources built with CUDA
// (POLYKV_HAVE_CUDA: kernels, ipc, the client): cudaSuccess is OK, out of device memory
// (cudaErrorMemoryAllocation) is kResourceExhausted, anything else kInternal; the message
// names the call, the error's name and its text.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "polykv/status.h"

namespace polykv {

/// `what`: the call or kernel that failed, e.g. "cudaMalloc (decoded K)".
[[nodiscard]] inline Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string msg =
      absl::StrCat(what, ": CUDA error ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

/// Runs fn(void* scratch) with `bytes` of stream-ordered device memory: cudaMallocAsync on
/// `stream` before, cudaFreeAsync after the work fn enqueued (freed on every path). Returns
/// fn's error first, else the free's; `what` names the scratch in errors.
template <class Fn>
[[nodiscard]] Status WithStreamScratch(size_t bytes, cudaStream_t stream, absl::string_view what,
                                       Fn&& fn) {
  void* scratch = nullptr;
  const cudaError_t e = cudaMallocAsync(&scratch, bytes, stream);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky: the next launch's check must not report it again
    return CudaStatus(e, absl::StrCat("cudaMallocAsync (", what, ")"));
  }
  const Status st = fn(scratch);
  const Status freed =
      CudaStatus(cudaFreeAsync(scratch, stream), absl::StrCat("cudaFreeAsync (", what, ")"));
  return st.ok() ? freed : st;
}

}  // namespace polykv
