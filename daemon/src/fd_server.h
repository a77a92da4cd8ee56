// polykvd's pool-descriptor server: a Unix-domain SOCK_SEQPACKET socket beside the control
// socket that hands the sealed memfd of a pool to an agent holding a live lease on it
// (request "PKVFD1 <lease_id>", answer "OK <bytes>" + SCM_RIGHTS, or "ERR <CODE> <text>").
// The peer's uid/gid (SO_PEERCRED) must have the reader role. One thread, poll(2) over the
// listening socket and the pending connections; a connection that says nothing for 2 s is
// dropped, so no peer can stall it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "polykv/ipc/sealed_region.h"
#include "polykv/status.h"
#include "pool_manager.h"

namespace polykv::daemon {

class FdServer {
 public:
  /// OK when the peer may fetch pool descriptors (reader role).
  using Authorize = std::function<Status(uint32_t uid, uint32_t gid, uint32_t pid)>;

  /// Binds `path` (a stale socket file there is replaced; any other file is an error),
  /// sets its mode (and group polykv when that group exists) and starts serving.
  /// Errors: kFailedPrecondition (path is not a socket), kUnavailable (bind/listen).
  [[nodiscard]] static StatusOr<std::unique_ptr<FdServer>> Start(
      const std::string& path, uint32_t mode, std::shared_ptr<PoolManager> manager,
      Authorize authorize);
  /// Stops the thread and removes the socket file.
  ~FdServer();
  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;

  const std::string& path() const { return path_; }
  /// Descriptors handed out so far.
  uint64_t served() const { return served_.load(); }

 private:
  FdServer() = default;
  void Loop();
  void Answer(int conn);

  std::string path_;
  ipc::UniqueFd listen_;
  ipc::UniqueFd wake_read_, wake_write_;
  std::shared_ptr<PoolManager> manager_;
  Authorize authorize_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> served_{0};
  std::thread thread_;
};

}  // namespace polykv::daemon
