// Sealed memfd regions and SCM_RIGHTS descriptor passing (see sealed_region.h).
#include "polykv/ipc/sealed_region.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "polykv/ipc/protocol.h"

#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif

namespace polykv::ipc {

static_assert(kPoolSealsRequired == (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW),
              "kPoolSealsRequired must match <fcntl.h>");

namespace {

std::string Errno(int e) { return std::strerror(e); }

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string SealNames(int seals) {
  std::string s;
  auto add = [&](int bit, const char* name) {
    if (seals & bit) absl::StrAppend(&s, s.empty() ? "" : "|", name);
  };
  add(F_SEAL_WRITE, "F_SEAL_WRITE");
  add(F_SEAL_SHRINK, "F_SEAL_SHRINK");
  add(F_SEAL_GROW, "F_SEAL_GROW");
  add(F_SEAL_SEAL, "F_SEAL_SEAL");
  return s.empty() ? "none" : s;
}

// Fills a sockaddr_un; false when the path does not fit.
bool UnixAddress(const std::string& path, sockaddr_un* addr, socklen_t* len) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr->sun_path)) return false;
  std::memcpy(addr->sun_path, path.data(), path.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return true;
}

Status ConnectError(int e, const std::string& path) {
  switch (e) {
    case ENOENT:
    case ENOTDIR:
      return absl::UnavailableError(
          absl::StrCat("no polykvd socket at ", path, " (is the daemon running?)"));
    case ECONNREFUSED:
      return absl::UnavailableError(absl::StrCat("nothing is listening on ", path,
                                                 " (the daemon is not running; stale socket)"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(absl::StrCat(
          "cannot connect to ", path, ": ", Errno(e),
          " (the socket is for the daemon's users: ask for group access, e.g. group polykv)"));
    default:
      return absl::UnavailableError(absl::StrCat("cannot connect to ", path, ": ", Errno(e)));
  }
}

// Calls `io` (a sendmsg or recvmsg) again while it fails with EINTR; its last result.
template <typename Io>
ssize_t RetryOnEintr(const Io& io) {
  ssize_t n;
  do {
    n = io();
  } while (n < 0 && errno == EINTR);
  return n;
}

}  // namespace

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

int GetSeals(int fd) { return fcntl(fd, F_GET_SEALS); }

// ---------------------------------------------------------------------------------------

SealedRegion::SealedRegion(SealedRegion&& o) noexcept
    : fd_(std::move(o.fd_)),
      base_(std::exchange(o.base_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      sealed_(std::exchange(o.sealed_, false)) {}

SealedRegion& SealedRegion::operator=(SealedRegion&& o) noexcept {
  if (this != &o) {
    Unmap();
    fd_ = std::move(o.fd_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    sealed_ = std::exchange(o.sealed_, false);
  }
  return *this;
}

SealedRegion::~SealedRegion() { Unmap(); }

void SealedRegion::Unmap() {
  if (base_ != nullptr) munmap(base_, size_);
  base_ = nullptr;
}

StatusOr<SealedRegion> SealedRegion::Create(const std::string& debug_name, uint64_t size) {
  if (size == 0) return absl::InvalidArgumentError("sealed region size must be > 0");
  const std::string name = debug_name.substr(0, 200);
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL);
  if (fd < 0 && errno == EINVAL) {  // kernels before 6.3 do not know MFD_NOEXEC_SEAL
    fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  }
  if (fd < 0) {
    const int e = errno;
    if (e == EMFILE || e == ENFILE || e == ENOMEM) {
      return absl::ResourceExhaustedError(absl::StrCat("memfd_create: ", Errno(e)));
    }
    return absl::InternalError(absl::StrCat("memfd_create: ", Errno(e)));
  }
  SealedRegion r;
  r.fd_.Reset(fd);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int e = errno;
    std::string msg = absl::StrCat("size memfd to ", size, " bytes: ", Errno(e));
    if (e == EFBIG || e == ENOSPC || e == ENOMEM) return absl::ResourceExhaustedError(msg);
    return absl::InternalError(msg);
  }
  if (int rc = posix_fallocate(fd, 0, static_cast<off_t>(size)); rc != 0) {
    std::string msg = absl::StrCat("reserve ", size, " bytes of pool memory: ", Errno(rc));
    if (rc == ENOSPC || rc == ENOMEM || rc == EFBIG) return absl::ResourceExhaustedError(msg);
    if (rc != EINVAL && rc != EOPNOTSUPP) return absl::InternalError(msg);
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    std::string msg = absl::StrCat("map ", size, " bytes of pool memory: ", Errno(e));
    if (e == ENOMEM) return absl::ResourceExhaustedError(msg);
    return absl::InternalError(msg);
  }
  r.base_ = p;
  r.size_ = size;
  return r;
}

Status SealedRegion::Seal() {
  if (sealed_) return absl::OkStatus();
  if (!fd_.valid()) return absl::FailedPreconditionError("sealed region has no descriptor");
  // F_SEAL_WRITE is refused while a writable shared mapping exists: drop ours first.
  Unmap();
  if (fcntl(fd_.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) !=
      0) {
    return absl::InternalError(absl::StrCat("seal pool memory: ", Errno(errno)));
  }
  void* p = mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_.get(), 0);
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("map sealed pool memory: ", Errno(errno)));
  }
  base_ = p;
  sealed_ = true;
  return absl::OkStatus();
}

StatusOr<SealedRegion> SealedRegion::MapSealed(UniqueFd fd, uint64_t expected_size) {
  if (!fd.valid()) return absl::InvalidArgumentError("no pool descriptor");
  const int seals = GetSeals(fd.get());
  if (seals < 0 || (seals & kPoolSealsRequired) != kPoolSealsRequired) {
    return absl::PermissionDeniedError(
        absl::StrCat("the pool descriptor is not sealed against writes (seals: ",
                     seals < 0 ? std::string("not a memfd") : SealNames(seals),
                     "); refusing to map memory its sender could still change"));
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) {
    return absl::InternalError(absl::StrCat("fstat pool descriptor: ", Errno(errno)));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == 0 || (expected_size > 0 && size < expected_size)) {
    return absl::DataLossError(
        absl::StrCat("pool memory has ", size, " bytes, the daemon announced ", expected_size));
  }
  void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("map pool memory read-only: ", Errno(errno)));
  }
  SealedRegion r;
  r.fd_ = std::move(fd);
  r.base_ = p;
  r.size_ = size;
  r.sealed_ = true;
  return r;
}

// ---------------------------------------------------------------------------------------

Status SendWithFd(int socket, std::string_view message, int fd) {
  iovec iov{const_cast<char*>(message.data()), message.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (fd >= 0) {
    std::memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  const ssize_t n =
      RetryOnEintr([&] { return sendmsg(socket, &msg, MSG_DONTWAIT | MSG_NOSIGNAL); });
  if (n < 0) {
    const int e = errno;
    if (e == EAGAIN || e == EPIPE || e == ECONNRESET || e == ENOTCONN) {
      return absl::UnavailableError(absl::StrCat("send on descriptor socket: ", Errno(e)));
    }
    return absl::InternalError(absl::StrCat("send on descriptor socket: ", Errno(e)));
  }
  if (static_cast<size_t>(n) != message.size()) {
    return absl::InternalError("short send on descriptor socket");
  }
  return absl::OkStatus();
}

StatusOr<std::pair<std::string, UniqueFd>> RecvWithFd(int socket, size_t max_bytes,
                                                      int timeout_ms) {
  const int64_t deadline = NowMs() + std::max(0, timeout_ms);
  for (;;) {
    pollfd p{socket, POLLIN, 0};
    const int64_t left = deadline - NowMs();
    int rc = poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return absl::InternalError(absl::StrCat("poll: ", Errno(errno)));
    if (rc == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("no answer on the descriptor socket within ", timeout_ms, " ms"));
    }
    break;
  }
  std::string buf(max_bytes + 1, '\0');
  iovec iov{buf.data(), buf.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n =
      RetryOnEintr([&] { return recvmsg(socket, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC); });
  if (n < 0) {
    const int e = errno;
    if (e == EAGAIN) return absl::DeadlineExceededError("descriptor socket: nothing to read");
    return absl::UnavailableError(absl::StrCat("receive on descriptor socket: ", Errno(e)));
  }
  UniqueFd received;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (!received.valid()) {
        received.Reset(fd);
      } else {
        ::close(fd);  // at most one descriptor is expected
      }
    }
  }
  if (n == 0 && !received.valid()) {
    return absl::UnavailableError("the descriptor socket was closed by the peer");
  }
  if ((msg.msg_flags & MSG_TRUNC) || static_cast<size_t>(n) > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("descriptor socket message exceeds ", max_bytes, " bytes"));
  }
  buf.resize(static_cast<size_t>(n));
  return std::make_pair(std::move(buf), std::move(received));
}

Status ProbeUnixSocket(const std::string& path, int type) {
  sockaddr_un addr;
  socklen_t len;
  if (!UnixAddress(path, &addr, &len)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path ", path, " is too long"));
  }
  UniqueFd s(socket(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s.valid()) return absl::InternalError(absl::StrCat("socket: ", Errno(errno)));
  if (connect(s.get(), reinterpret_cast<const sockaddr*>(&addr), len) == 0) {
    return absl::OkStatus();
  }
  const int e = errno;
  // EAGAIN: the listener's backlog is full, so it is alive.
  if (e == EAGAIN || e == EINPROGRESS) return absl::OkStatus();
  return ConnectError(e, path);
}

StatusOr<UniqueFd> RequestPoolFd(const std::string& socket_path, const std::string& lease_id,
                                 int timeout_ms) {
  sockaddr_un addr;
  socklen_t len;
  if (!UnixAddress(socket_path, &addr, &len)) {
    return absl::InvalidArgumentError(
        absl::StrCat("descriptor socket path ", socket_path, " is too long"));
  }
  UniqueFd s(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s.valid()) return absl::InternalError(absl::StrCat("socket: ", Errno(errno)));
  const int64_t deadline = NowMs() + std::max(1, timeout_ms);
  // A non-blocking connect on a Unix socket fails with EAGAIN while the listener's backlog
  // is full: retry until the deadline.
  for (;;) {
    if (connect(s.get(), reinterpret_cast<const sockaddr*>(&addr), len) == 0) break;
    const int e = errno;
    if (e == EINTR) continue;
    if (e == EAGAIN && NowMs() < deadline) {
      usleep(2000);
      continue;
    }
    if (e == EAGAIN) {
      return absl::DeadlineExceededError(
          absl::StrCat("descriptor socket ", socket_path, " is busy (backlog full)"));
    }
    return ConnectError(e, socket_path);
  }
  POLYKV_RETURN_IF_ERROR(SendWithFd(s.get(), absl::StrCat("PKVFD1 ", lease_id), -1));
  const int left = static_cast<int>(std::max<int64_t>(1, deadline - NowMs()));
  POLYKV_ASSIGN_OR_RETURN(auto answer, RecvWithFd(s.get(), 4096, left));
  const std::string& text = answer.first;
  if (text.rfind("OK", 0) == 0) {
    if (!answer.second.valid()) {
      return absl::InternalError("the daemon answered OK without a pool descriptor");
    }
    return std::move(answer.second);
  }
  if (text.rfind("ERR ", 0) == 0) {
    // "ERR <CODE> <message>"
    const size_t sp = text.find(' ', 4);
    Reply r;
    r.ok = false;
    r.code = text.substr(4, sp == std::string::npos ? std::string::npos : sp - 4);
    r.error =
        sp == std::string::npos ? std::string("pool descriptor refused") : text.substr(sp + 1);
    return ReplyStatus(r);
  }
  return absl::InternalError(
      absl::StrCat("unexpected answer on the descriptor socket: ", Abbreviate(text, 80)));
}

}  // namespace polykv::ipc
