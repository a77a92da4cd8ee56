// CUDA pool decode into host memory (see client_device.h).
#include "client_device.h"

#include <vector>

#include "absl/strings/str_cat.h"

#if defined(POLYKV_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "polykv/cuda_status.h"
#endif

namespace polykv::client {

#if defined(POLYKV_HAVE_CUDA)
Status DecodeDeviceLayerToHost(const ipc::PoolReader& reader, int device, uint32_t layer,
                               void* k_out, void* v_out, kernels::DType dtype) {
  const ipc::PoolLayout& layout = reader.layout();
  if (layer >= layout.layer.size())
    return absl::OutOfRangeError(absl::StrCat("layer ", layer, " of ", layout.layer.size()));
  // The layer's compressed bytes to the host, decoded there by the CPU codec (every codec a
  // pool holds: packed keys and f16 norms included).
  const ipc::LayerOffsets& lo = layout.layer[layer];
  std::vector<uint8_t> bytes(static_cast<size_t>(lo.end - lo.k));
  POLYKV_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  POLYKV_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpy(bytes.data(), reader.base() + lo.k, bytes.size(), cudaMemcpyDeviceToHost),
      "cudaMemcpy (a pool layer to the host)"));
  return ipc::DecodeLayerCopy(bytes.data(), reader.params(), layout, layer, k_out, v_out, dtype);
}

#else

Status DecodeDeviceLayerToHost(const ipc::PoolReader&, int, uint32_t, void*, void*,
                               kernels::DType) {
  return absl::UnimplementedError(
      "this libpolykv_client was built without CUDA: cannot decode a cuda pool");
}

#endif

}  // namespace polykv::client
