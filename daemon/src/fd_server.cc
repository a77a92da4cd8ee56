// polykvd's pool-descriptor server (see fd_server.h).
#include "fd_server.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <list>

#include "absl/strings/str_cat.h"

namespace polykv::daemon {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kConnTimeout = std::chrono::seconds(2);
constexpr size_t kMaxPending = 1024;

}  // namespace

StatusOr<std::unique_ptr<FdServer>> FdServer::Start(const std::string& path, uint32_t mode,
                                                    std::shared_ptr<PoolManager> manager,
                                                    Authorize authorize) {
  std::unique_ptr<FdServer> s(new FdServer());
  s->path_ = path;
  s->manager_ = std::move(manager);
  s->authorize_ = std::move(authorize);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("descriptor socket path ", path, " is empty or too long"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " exists and is not a socket; refusing to replace it"));
    }
    unlink(path.c_str());  // a dead daemon's socket (the caller owns the endpoint now)
  }
  s->listen_.Reset(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s->listen_.valid())
    return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  // Bind with a restrictive umask, then open up to `mode`: no window with a wider mode.
  const mode_t old = umask(0177);
  const int rc = bind(s->listen_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int bind_errno = errno;
  umask(old);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("bind ", path, ": ", std::strerror(bind_errno)));
  }
  if (listen(s->listen_.get(), SOMAXCONN) != 0) {
    unlink(path.c_str());
    return absl::UnavailableError(absl::StrCat("listen ", path, ": ", std::strerror(errno)));
  }
  if (chmod(path.c_str(), mode) != 0) {
    spdlog::warn("chmod {:o} {}: {}", mode, path, std::strerror(errno));
  }
  if (struct group* g = getgrnam("polykv"); g != nullptr) {
    if (chown(path.c_str(), static_cast<uid_t>(-1), g->gr_gid) != 0) {
      spdlog::warn("chgrp polykv {}: {}", path, std::strerror(errno));
    }
  }
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) != 0) {
    unlink(path.c_str());
    return absl::UnavailableError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  s->wake_read_.Reset(pipefd[0]);
  s->wake_write_.Reset(pipefd[1]);
  FdServer* raw = s.get();
  s->thread_ = std::thread([raw] { raw->Loop(); });
  return s;
}

FdServer::~FdServer() {
  stop_.store(true);
  if (wake_write_.valid()) {
    char c = 1;
    (void)!write(wake_write_.get(), &c, 1);
  }
  if (thread_.joinable()) thread_.join();
  if (!path_.empty()) unlink(path_.c_str());
}

void FdServer::Answer(int conn) {
  auto reply = [&](const Status& s, int fd, uint64_t bytes) {
    std::string text = s.ok() ? absl::StrCat("OK ", bytes)
                              : absl::StrCat("ERR ", absl::StatusCodeToString(s.code()), " ",
                                             ipc::Abbreviate(s.message(), 512));
    (void)ipc::SendWithFd(conn, text, s.ok() ? fd : -1);
  };
  auto msg = ipc::RecvWithFd(conn, 256, 0);
  if (!msg.ok()) {
    if (msg.status().code() != absl::StatusCode::kUnavailable) {
      reply(absl::InvalidArgumentError(msg.status().message()), -1, 0);
    }
    return;
  }
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    reply(absl::PermissionDeniedError("peer credentials unavailable"), -1, 0);
    return;
  }
  if (Status allowed = authorize_(cred.uid, cred.gid, static_cast<uint32_t>(cred.pid));
      !allowed.ok()) {
    spdlog::warn("descriptor socket: refused uid {} (pid {}): {}", cred.uid, cred.pid,
                 std::string(allowed.message()));
    reply(allowed, -1, 0);
    return;
  }
  const std::string& text = msg->first;
  constexpr char kPrefix[] = "PKVFD1 ";
  if (text.rfind(kPrefix, 0) != 0) {
    reply(absl::InvalidArgumentError("expected \"PKVFD1 <lease_id>\""), -1, 0);
    return;
  }
  auto fd = manager_->PoolFd(text.substr(sizeof(kPrefix) - 1));
  if (!fd.ok()) {
    reply(fd.status(), -1, 0);
    return;
  }
  struct stat st;
  const uint64_t bytes = fstat(fd->get(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  reply(absl::OkStatus(), fd->get(), bytes);
  served_.fetch_add(1);
}

void FdServer::Loop() {
  struct Pending {
    ipc::UniqueFd fd;
    Clock::time_point deadline;
  };
  std::list<Pending> pending;
  std::vector<pollfd> fds;
  while (!stop_.load()) {
    fds.clear();
    fds.push_back({wake_read_.get(), POLLIN, 0});
    fds.push_back({listen_.get(), POLLIN, 0});
    for (const auto& p : pending) fds.push_back({p.fd.get(), POLLIN, 0});
    int rc = poll(fds.data(), fds.size(), 100);
    if (rc < 0 && errno != EINTR) {
      spdlog::error("descriptor socket poll: {}", std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    if (stop_.load()) break;
    // Answer readable connections (their order in `fds` follows `pending`).
    size_t i = 2;
    for (auto it = pending.begin(); it != pending.end(); ++i) {
      if (rc > 0 && (fds[i].revents & (POLLIN | POLLHUP | POLLERR))) {
        if (fds[i].revents & POLLIN) Answer(it->fd.get());
        it = pending.erase(it);
      } else if (Clock::now() > it->deadline) {
        it = pending.erase(it);  // said nothing in time
      } else {
        ++it;
      }
    }
    if (rc > 0 && (fds[1].revents & POLLIN)) {
      for (int n = 0; n < 256; ++n) {
        int c = accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c < 0) break;
        if (pending.size() >= kMaxPending) pending.pop_front();
        pending.push_back(Pending{ipc::UniqueFd(c), Clock::now() + kConnTimeout});
      }
    }
    if (rc > 0 && (fds[0].revents & POLLIN)) {
      char buf[64];
      while (read(wake_read_.get(), buf, sizeof(buf)) > 0) {
      }
    }
  }
}

}  // namespace polykv::daemon
