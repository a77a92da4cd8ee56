// CUDA pool decode into host memory (see client_device.h).
#include "client_device.h"

#include "absl/strings/str_cat.h"

#if defined(POLYKV_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "polykv/cuda_status.h"
#endif

namespace polykv::client {

#if defined(POLYKV_HAVE_CUDA)
namespace {

/// cudaFree on scope exit.
struct DeviceBuffer {
  void* ptr = nullptr;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
};

}  // namespace

Status DecodeDeviceLayerToHost(const ipc::PoolReader& reader, int device, uint32_t layer,
                               void* k_out, void* v_out, kernels::DType dtype) {
  const ipc::PoolParams& p = reader.params();
  const size_t elem = dtype == kernels::DType::kF32 ? 4 : 2;
  const size_t bytes = size_t{p.kv_heads} * p.tokens * p.head_dim * elem;
  POLYKV_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  DeviceBuffer k, v;
  POLYKV_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&k.ptr, bytes), "cudaMalloc (decoded K)"));
  POLYKV_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&v.ptr, bytes), "cudaMalloc (decoded V)"));
  POLYKV_RETURN_IF_ERROR(reader.DecodeLayer(layer, k.ptr, v.ptr, dtype, nullptr));
  POLYKV_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(k_out, k.ptr, bytes, cudaMemcpyDeviceToHost),
                                    "cudaMemcpy (K to host)"));
  POLYKV_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(v_out, v.ptr, bytes, cudaMemcpyDeviceToHost),
                                    "cudaMemcpy (V to host)"));
  return Status();
}

#else

Status DecodeDeviceLayerToHost(const ipc::PoolReader&, int, uint32_t, void*, void*,
                               kernels::DType) {
  return absl::UnimplementedError(
      "this libpolykv_client was built without CUDA: cannot decode a cuda pool");
}

#endif

}  // namespace polykv::client
