// Decoding a CUDA pool into host buffers (internal; CUDA runtime only in CUDA builds).
#pragma once

#include <cstdint>

#include "polykv/ipc/pool_layout.h"
#include "polykv/kernels/codec.h"
#include "polykv/status.h"

namespace polykv::client {

/// Decodes `layer` of a device-resident pool on `device` into temporary device buffers and
/// copies them to host k_out / v_out ([kv_heads][tokens][head_dim] of `dtype` each).
/// Errors: kUnimplemented in builds without CUDA; kResourceExhausted when device memory is
/// short; kInternal with the CUDA error string otherwise.
[[nodiscard]] Status DecodeDeviceLayerToHost(const ipc::PoolReader& reader, int device,
                                             uint32_t layer, void* k_out, void* v_out,
                                             kernels::DType dtype);

}  // namespace polykv::client
