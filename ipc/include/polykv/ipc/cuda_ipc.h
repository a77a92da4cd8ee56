// CUDA IPC handles for pools in GPU memory: a cudaMalloc arena exported with
// cudaIpcGetMemHandle. The handle carries the 64-byte cudaIpcMemHandle_t AND the pool's
// offset inside the allocation, its size and the device UUID (Mooncake-style), so a peer
// maps the right interior pointer on the right device without trusting the sender's ordinal.
#pragma once

#include <cstdint>
#include <string>

#include "polykv/status.h"

namespace polykv::ipc {

/// Wire form of a CUDA pool handle. Begins with a version field.
struct CudaIpcHandle {
  uint32_t version = 1;
  uint8_t handle[64] = {};       ///< cudaIpcMemHandle_t bytes
  uint64_t offset = 0;           ///< pool start inside the allocation (bytes)
  uint64_t size = 0;             ///< pool bytes
  uint8_t device_uuid[16] = {};  ///< cudaDeviceProp::uuid of the owning device
};

/// True when this build has CUDA and at least one device is usable.
bool CudaAvailable();

/// A device allocation exported for IPC (owner side). Move-only; frees on destruction.
class CudaArena {
 public:
  /// cudaMalloc `size` bytes on the current device and export it.
  /// Errors: kUnimplemented in CPU-only builds; kResourceExhausted when out of memory;
  /// kInternal with the CUDA error string otherwise.
  [[nodiscard]] static StatusOr<CudaArena> Allocate(uint64_t size);
  CudaArena(CudaArena&&) noexcept;
  CudaArena& operator=(CudaArena&&) noexcept;
  ~CudaArena();
  void* data() const { return ptr_; }
  uint64_t size() const { return size_; }
  /// The handle for a pool at `offset` of `size` bytes inside this arena.
  [[nodiscard]] StatusOr<CudaIpcHandle> Export(uint64_t offset, uint64_t size) const;
  /// Copies `bytes` of host memory into the arena at `offset` (cudaMemcpy H2D), e.g. a pool
  /// encoded on the host. Errors: kOutOfRange past the end; kUnimplemented in CPU-only
  /// builds; kInternal with the CUDA error string.
  [[nodiscard]] Status CopyFromHost(uint64_t offset, const void* src, uint64_t bytes);
  /// Copies `bytes` at `offset` of the arena into host memory `dst` (synchronous).
  /// Errors: kOutOfRange, kFailedPrecondition (empty arena or no CUDA), kInternal (CUDA).
  [[nodiscard]] Status CopyToHost(uint64_t offset, void* dst, uint64_t bytes) const;
  /// A new arena holding a copy of this one's first `bytes` (device to device, synchronous:
  /// fast enough to take under a lock that keeps this arena alive). Errors: as Allocate,
  /// kOutOfRange past the end, kFailedPrecondition for an empty arena.
  [[nodiscard]] StatusOr<CudaArena> Clone(uint64_t bytes) const;

 private:
  CudaArena() = default;
  void* ptr_ = nullptr;
  uint64_t size_ = 0;
};

/// A peer's mapping of a CudaIpcHandle (reader side). Opens each allocation once per
/// process (reference-counted); closes on destruction.
class CudaIpcMapping {
 public:
  /// Finds the local device whose UUID matches, sets it, cudaIpcOpenMemHandle (or reuses an
  /// open mapping), and returns base + offset. Errors: kNotFound for an unknown UUID,
  /// kUnimplemented in CPU-only builds, kInternal with the CUDA error string.
  [[nodiscard]] static StatusOr<CudaIpcMapping> Open(const CudaIpcHandle& handle);
  CudaIpcMapping(CudaIpcMapping&&) noexcept;
  CudaIpcMapping& operator=(CudaIpcMapping&&) noexcept;
  ~CudaIpcMapping();
  const void* data() const { return data_; }
  uint64_t size() const { return size_; }
  int device() const { return device_; }

 private:
  CudaIpcMapping() = default;
  const void* data_ = nullptr;
  uint64_t size_ = 0;
  int device_ = -1;
  std::string key_;  ///< refcount key of the underlying allocation
};

}  // namespace polykv::ipc
