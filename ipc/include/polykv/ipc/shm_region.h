// POSIX shared-memory regions for host pools, through Boost.Interprocess.
// The owner (polykvd) creates and fills a region; it is announced (LIST/ATTACH) only after
// PoolWriter::Finalize, so no half-written pool is ever visible. Readers map read-only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "polykv/status.h"

namespace polykv::ipc {

/// A mapped POSIX shm object. Move-only; unmaps on destruction (the owner also unlinks).
class ShmRegion {
 public:
  /// Creates `name` ("/polykv-...") of `size` bytes, mode 0640, mapped read-write; the
  /// region is unlinked on destruction. Errors: kAlreadyExists, kResourceExhausted when
  /// /dev/shm is full (the object is removed again), kInternal otherwise.
  [[nodiscard]] static StatusOr<ShmRegion> Create(const std::string& name, uint64_t size);
  /// Maps an existing object read-only (PROT_READ). Errors: kNotFound, kPermissionDenied.
  [[nodiscard]] static StatusOr<ShmRegion> OpenReadOnly(const std::string& name);
  /// Removes a shm object by name; OK if absent.
  [[nodiscard]] static Status Remove(const std::string& name);

  ShmRegion(ShmRegion&&) noexcept;
  ShmRegion& operator=(ShmRegion&&) noexcept;
  ~ShmRegion();

  void* data() const;
  uint64_t size() const;
  const std::string& name() const;
  bool owner() const;

 private:
  struct Impl;
  ShmRegion();
  std::unique_ptr<Impl> impl_;
};

}  // namespace polykv::ipc
