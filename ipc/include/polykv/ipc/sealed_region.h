// Sealed memfd regions for host pools, and passing their descriptors between processes.
//
// polykvd creates an anonymous memfd (no name in /dev/shm, so nothing to squat and nothing
// left behind when the daemon dies), fills it through a read-write mapping, then Seal()s it:
// the writable mapping is removed and F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW |
// F_SEAL_SEAL are added. From then on nobody — the daemon's uid and root included — can
// write, truncate or grow it: write(2) and mmap(PROT_WRITE, MAP_SHARED) fail with EPERM.
// Agents receive the descriptor over a Unix-domain socket (SCM_RIGHTS, see SendWithFd /
// RequestPoolFd), check the seals and map the whole region read-only (one plain PROT_READ,
// MAP_SHARED mapping of [0, size)).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "polykv/status.h"

namespace polykv::ipc {

/// An owned file descriptor (closed on destruction). Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) Reset(std::exchange(o.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() { return std::exchange(fd_, -1); }
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

/// Seals every published host pool carries (checked by MapSealed).
inline constexpr int kPoolSealsRequired =
    0x0008 /*F_SEAL_WRITE*/ | 0x0002 /*F_SEAL_SHRINK*/ | 0x0004 /*F_SEAL_GROW*/;

/// A memfd-backed region. Created writable by its owner, sealed before publication; or
/// mapped read-only from a received, sealed descriptor. Move-only; unmaps and closes on
/// destruction (the memory is freed by the kernel once no descriptor or mapping is left).
class SealedRegion {
 public:
  /// Creates an anonymous memfd of `size` bytes ("memfd:<debug_name>" in /proc/*/fd),
  /// reserves its pages (so a full memory budget is an error here, never a SIGBUS while
  /// writing) and maps it read-write. Errors: kInvalidArgument (size 0),
  /// kResourceExhausted (no memory), kInternal (memfd_create / sealing unsupported).
  [[nodiscard]] static StatusOr<SealedRegion> Create(const std::string& debug_name, uint64_t size);
  /// Maps a received descriptor read-only after checking that it is a memfd sealed with
  /// kPoolSealsRequired and at least `expected_size` bytes (0: any). Takes ownership of
  /// `fd`. Errors: kPermissionDenied naming the missing seals (the sender could still
  /// change the memory), kDataLoss (smaller than announced), kInternal (mmap).
  [[nodiscard]] static StatusOr<SealedRegion> MapSealed(UniqueFd fd, uint64_t expected_size);

  SealedRegion(SealedRegion&& o) noexcept;
  SealedRegion& operator=(SealedRegion&& o) noexcept;
  SealedRegion(const SealedRegion&) = delete;
  SealedRegion& operator=(const SealedRegion&) = delete;
  ~SealedRegion();

  /// Removes the writable mapping, adds F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW |
  /// F_SEAL_SEAL, and maps the region read-only. Idempotent. Errors: kInternal.
  [[nodiscard]] Status Seal();

  /// Writable base before Seal() (owner only); nullptr afterwards and for readers.
  void* writable_data() const { return sealed_ ? nullptr : base_; }
  /// Read-only base of the whole region (valid for the object's lifetime).
  const void* data() const { return base_; }
  uint64_t size() const { return size_; }
  bool sealed() const { return sealed_; }
  /// The memfd (owned by this object; dup() it to hand it out).
  int fd() const { return fd_.get(); }

 private:
  SealedRegion() = default;
  void Unmap();
  UniqueFd fd_;
  void* base_ = nullptr;
  uint64_t size_ = 0;
  bool sealed_ = false;
};

/// The seals currently on `fd` (F_GET_SEALS), or -1 when it is not a sealable file.
int GetSeals(int fd);

// ---- descriptor passing over Unix-domain SOCK_SEQPACKET sockets (SCM_RIGHTS) ----

/// Sends one packet `message`, with `fd` attached when fd >= 0. Never blocks (MSG_DONTWAIT;
/// kUnavailable when the peer's queue is full). Errors: kUnavailable, kInternal.
[[nodiscard]] Status SendWithFd(int socket, std::string_view message, int fd);
/// Receives one packet of at most `max_bytes` and at most one descriptor, waiting up to
/// `timeout_ms`. Extra descriptors are closed. Errors: kDeadlineExceeded, kUnavailable (peer
/// closed), kInternal.
[[nodiscard]] StatusOr<std::pair<std::string, UniqueFd>> RecvWithFd(int socket, size_t max_bytes,
                                                                    int timeout_ms);

/// Client side of polykvd's pool-descriptor socket: connects to `socket_path`, sends
/// "PKVFD1 <lease_id>", and returns the sealed pool memfd the daemon answers with
/// ("OK <bytes>" + SCM_RIGHTS). The daemon checks the peer's uid (SO_PEERCRED) and that the
/// lease is live. Errors: the daemon's status ("ERR <CODE> <message>"), kUnavailable (no
/// socket / daemon gone), kPermissionDenied (socket not accessible), kDeadlineExceeded.
[[nodiscard]] StatusOr<UniqueFd> RequestPoolFd(const std::string& socket_path,
                                               const std::string& lease_id, int timeout_ms);

/// Probes an AF_UNIX stream socket path with connect(2), for a fast, precise error instead
/// of a timeout: OK when something accepts; kUnavailable "no socket" (ENOENT) or "nothing is
/// listening" (ECONNREFUSED: a dead daemon's stale socket); kPermissionDenied (EACCES).
/// `type` is SOCK_STREAM or SOCK_SEQPACKET.
[[nodiscard]] Status ProbeUnixSocket(const std::string& path, int type);

}  // namespace polykv::ipc
