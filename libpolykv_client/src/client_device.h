// Decoding a CUDA pool into host buffers (internal; CUDA runtime only in CUDA builds).
#pragma once

#include <cstdint>

#include "polykv/ipc/pool_layout.h"
#include "polykv/kernels/codec.h"
#include "polykv/status.h"

namespace polykv::client {

/// Copies `layer` of a device-resident pool on `device` to the host as it lies (compressed)
/// and decodes it there with the CPU codec into host k_out / v_out ([kv_heads][tokens]
/// [head_dim] of `dtype` each; every codec). Errors: kUnimplemented in builds without CUDA;
/// kInternal with the CUDA error string; the codec's errors.
[[nodiscard]] Status DecodeDeviceLayerToHost(const ipc::PoolReader& reader, int device,
                                             uint32_t layer, void* k_out, void* v_out,
                                             kernels::DType dtype);

}  // namespace polykv::client
