// CUDA IPC pool memory: cudaMalloc arenas exported with cudaIpcGetMemHandle, peers open each
// allocation once per process (refcounted registry) on the device matching the handle's
// UUID. Without POLYKV_HAVE_CUDA every entry point returns kUnimplemented.
#include "polykv/ipc/cuda_ipc.h"

#include <cstring>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "device_memory.h"

#ifdef POLYKV_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "polykv/cuda_status.h"
#endif

namespace polykv::ipc {

#ifdef POLYKV_HAVE_CUDA
namespace {

std::string KeyOf(const CudaIpcHandle& h) {
  return std::string(reinterpret_cast<const char*>(h.handle), sizeof(h.handle)) +
         std::string(reinterpret_cast<const char*>(h.device_uuid), sizeof(h.device_uuid));
}

struct OpenAllocation {
  void* base = nullptr;
  int device = -1;
  int refs = 0;
};

std::mutex& RegistryMutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, OpenAllocation>& Registry() {
  static auto* r = new std::map<std::string, OpenAllocation>();
  return *r;
}

void Release(const std::string& key) {
  if (key.empty()) return;
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto it = Registry().find(key);
  if (it == Registry().end()) return;
  if (--it->second.refs == 0) {
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(it->second.device);
    cudaIpcCloseMemHandle(it->second.base);
    cudaSetDevice(prev);
    Registry().erase(it);
  }
}

}  // namespace

bool CudaAvailable() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

StatusOr<CudaArena> CudaArena::Allocate(uint64_t size) {
  if (size == 0) return absl::InvalidArgumentError("CUDA arena size must be > 0");
  if (!CudaAvailable()) return absl::FailedPreconditionError("no CUDA device is available");
  CudaArena a;
  cudaError_t err = cudaMalloc(&a.ptr_, size);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(err, absl::StrCat("cudaMalloc(", size, ")"));
  }
  a.size_ = size;
  return a;
}

CudaArena::CudaArena(CudaArena&& o) noexcept : ptr_(o.ptr_), size_(o.size_) {
  o.ptr_ = nullptr;
  o.size_ = 0;
}
CudaArena& CudaArena::operator=(CudaArena&& o) noexcept {
  if (this != &o) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = o.ptr_;
    size_ = o.size_;
    o.ptr_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}
CudaArena::~CudaArena() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

StatusOr<CudaIpcHandle> CudaArena::Export(uint64_t offset, uint64_t size) const {
  if (ptr_ == nullptr) return absl::FailedPreconditionError("CUDA arena is empty");
  if (offset > size_ || size > size_ - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("export [", offset, ", +", size, ") exceeds the arena of ", size_, " bytes"));
  }
  CudaIpcHandle h;
  cudaIpcMemHandle_t mem;
  cudaError_t err = cudaIpcGetMemHandle(&mem, ptr_);
  if (err != cudaSuccess) return CudaStatus(err, "cudaIpcGetMemHandle");
  static_assert(sizeof(mem) == sizeof(h.handle), "cudaIpcMemHandle_t must be 64 bytes");
  std::memcpy(h.handle, &mem, sizeof(h.handle));
  cudaPointerAttributes attr{};
  err = cudaPointerGetAttributes(&attr, ptr_);
  if (err != cudaSuccess) return CudaStatus(err, "cudaPointerGetAttributes");
  cudaDeviceProp prop{};
  err = cudaGetDeviceProperties(&prop, attr.device);
  if (err != cudaSuccess) return CudaStatus(err, "cudaGetDeviceProperties");
  std::memcpy(h.device_uuid, &prop.uuid, sizeof(h.device_uuid));
  h.offset = offset;
  h.size = size;
  return h;
}

Status CudaArena::CopyFromHost(uint64_t offset, const void* src, uint64_t bytes) {
  if (ptr_ == nullptr) return absl::FailedPreconditionError("CUDA arena is empty");
  if (offset > size_ || bytes > size_ - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("copy [", offset, ", +", bytes, ") exceeds the arena of ", size_, " bytes"));
  }
  return internal::CopyToDevice(static_cast<uint8_t*>(ptr_) + offset, src, bytes);
}

StatusOr<CudaArena> CudaArena::Clone(uint64_t bytes) const {
  if (ptr_ == nullptr) return absl::FailedPreconditionError("CUDA arena is empty");
  if (bytes > size_)
    return absl::OutOfRangeError(
        absl::StrCat("clone of ", bytes, " bytes exceeds the arena of ", size_, " bytes"));
  POLYKV_ASSIGN_OR_RETURN(CudaArena copy, Allocate(bytes));
  POLYKV_RETURN_IF_ERROR(internal::CopyDeviceToDevice(copy.ptr_, ptr_, bytes, nullptr));
  POLYKV_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(nullptr), "clone of a CUDA arena"));
  return copy;
}

Status CudaArena::CopyToHost(uint64_t offset, void* dst, uint64_t bytes) const {
  if (ptr_ == nullptr) return absl::FailedPreconditionError("CUDA arena is empty");
  if (offset > size_ || bytes > size_ - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("copy [", offset, ", +", bytes, ") exceeds the arena of ", size_, " bytes"));
  }
  return internal::CopyToHost(dst, static_cast<const uint8_t*>(ptr_) + offset, bytes);
}

StatusOr<CudaIpcMapping> CudaIpcMapping::Open(const CudaIpcHandle& handle) {
  if (handle.version != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA IPC handle version ", handle.version, " is not supported"));
  }
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError("no CUDA device is available to map the pool");
  }
  int device = -1;
  for (int d = 0; d < count && device < 0; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) continue;
    if (std::memcmp(&prop.uuid, handle.device_uuid, sizeof(handle.device_uuid)) == 0) device = d;
  }
  if (device < 0) {
    return absl::NotFoundError("no local CUDA device has the pool's device UUID");
  }
  const std::string key = KeyOf(handle);
  void* base = nullptr;
  {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    auto it = Registry().find(key);
    if (it != Registry().end()) {
      ++it->second.refs;
      base = it->second.base;
    } else {
      err = cudaSetDevice(device);
      if (err != cudaSuccess) return CudaStatus(err, "cudaSetDevice");
      cudaIpcMemHandle_t mem;
      std::memcpy(&mem, handle.handle, sizeof(mem));
      err = cudaIpcOpenMemHandle(&base, mem, cudaIpcMemLazyEnablePeerAccess);
      if (err != cudaSuccess) {
        cudaGetLastError();
        return CudaStatus(err, "cudaIpcOpenMemHandle");
      }
      Registry()[key] = OpenAllocation{base, device, 1};
    }
  }
  err = cudaSetDevice(device);
  if (err != cudaSuccess) {
    Release(key);
    return CudaStatus(err, "cudaSetDevice");
  }
  CudaIpcMapping m;
  m.data_ = static_cast<const uint8_t*>(base) + handle.offset;
  m.size_ = handle.size;
  m.device_ = device;
  m.key_ = key;
  return m;
}

CudaIpcMapping::CudaIpcMapping(CudaIpcMapping&& o) noexcept
    : data_(o.data_), size_(o.size_), device_(o.device_), key_(std::move(o.key_)) {
  o.data_ = nullptr;
  o.key_.clear();
}
CudaIpcMapping& CudaIpcMapping::operator=(CudaIpcMapping&& o) noexcept {
  if (this != &o) {
    Release(key_);
    data_ = o.data_;
    size_ = o.size_;
    device_ = o.device_;
    key_ = std::move(o.key_);
    o.data_ = nullptr;
    o.key_.clear();
  }
  return *this;
}
CudaIpcMapping::~CudaIpcMapping() { Release(key_); }

namespace internal {

Status CopyToDevice(void* dst, const void* src, uint64_t bytes) {
  return CudaStatus(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}
Status CopyToHost(void* dst, const void* src, uint64_t bytes) {
  return CudaStatus(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}
Status CopyDeviceToDevice(void* dst, const void* src, uint64_t bytes, void* stream) {
  return CudaStatus(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)),
      "cudaMemcpyAsync D2D");
}
}  // namespace internal

#else  // !POLYKV_HAVE_CUDA

namespace {
Status NoCuda() { return absl::UnimplementedError("this build of PolyKV has no CUDA support"); }
}  // namespace

bool CudaAvailable() { return false; }

StatusOr<CudaArena> CudaArena::Allocate(uint64_t) { return NoCuda(); }
CudaArena::CudaArena(CudaArena&& o) noexcept : ptr_(o.ptr_), size_(o.size_) { o.ptr_ = nullptr; }
CudaArena& CudaArena::operator=(CudaArena&& o) noexcept {
  ptr_ = o.ptr_;
  size_ = o.size_;
  o.ptr_ = nullptr;
  return *this;
}
CudaArena::~CudaArena() = default;
StatusOr<CudaIpcHandle> CudaArena::Export(uint64_t, uint64_t) const { return NoCuda(); }
Status CudaArena::CopyFromHost(uint64_t, const void*, uint64_t) { return NoCuda(); }
Status CudaArena::CopyToHost(uint64_t, void*, uint64_t) const { return NoCuda(); }
StatusOr<CudaArena> CudaArena::Clone(uint64_t) const { return NoCuda(); }

StatusOr<CudaIpcMapping> CudaIpcMapping::Open(const CudaIpcHandle&) { return NoCuda(); }
CudaIpcMapping::CudaIpcMapping(CudaIpcMapping&& o) noexcept
    : data_(o.data_), size_(o.size_), device_(o.device_), key_(std::move(o.key_)) {}
CudaIpcMapping& CudaIpcMapping::operator=(CudaIpcMapping&& o) noexcept {
  data_ = o.data_;
  size_ = o.size_;
  device_ = o.device_;
  key_ = std::move(o.key_);
  return *this;
}
CudaIpcMapping::~CudaIpcMapping() = default;

namespace internal {
Status CopyToDevice(void*, const void*, uint64_t) { return NoCuda(); }
Status CopyToHost(void*, const void*, uint64_t) { return NoCuda(); }
Status CopyDeviceToDevice(void*, const void*, uint64_t, void*) { return NoCuda(); }
}  // namespace internal

#endif  // POLYKV_HAVE_CUDA

}  // namespace polykv::ipc
