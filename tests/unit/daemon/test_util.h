// Test helpers for polykvd: a temp dir endpoint that is always removed, a raw DEALER
// client speaking the control protocol, shm-object and memfd listing, mapping a pool the way
// an agent does (descriptor socket + seals check), and the stories260K path.
#pragma once

#include <dirent.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "polykv/ipc/protocol.h"
#include "polykv/ipc/sealed_region.h"
#include "support/files.h"
#include "support/leaks.h"

namespace polykv::daemon::testing {

inline std::string Stories260K() {
  return std::string(POLYKV_TEST_DATA_DIR) + "/models/stories260K";
}

/// 40 token ids valid for stories260K (vocab 512).
inline std::vector<int32_t> StoryIds(int salt = 0) {
  std::vector<int32_t> ids = {1};
  for (int i = 1; i < 40; ++i) ids.push_back((i * 37 + salt * 11 + 5) % 500 + 3);
  return ids;
}

/// A private folder /tmp/polykv-test-XXXXXX (support::TempDir), removed recursively on
/// destruction, with the daemon endpoint inside it.
class TempDir : public support::TempDir {
 public:
  TempDir() : support::TempDir("polykv-test-") {}
  std::string endpoint() const { return "ipc://" + path() + "/control.sock"; }
  std::string socket() const { return path() + "/control.sock"; }
};

/// Names ("/x") of /dev/shm objects starting with `prefix` ("/polykv-...").
inline std::vector<std::string> ShmObjects(const std::string& prefix) {
  std::vector<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      std::string name = std::string("/") + e->d_name;
      if (name.rfind(prefix, 0) == 0) out.push_back(name);
    }
    closedir(d);
  }
  return out;
}

/// Descriptors of this process that are pool memfds of `prefix` ("/polykv-..."): their
/// /proc/self/fd links read "/memfd:<prefix without '/'>... (deleted)" (support::MemfdUses,
/// the mappings left out).
inline std::vector<std::string> MemfdObjects(const std::string& prefix) {
  std::vector<std::string> out;
  for (const support::MemfdUse& u : support::MemfdUses(prefix, getpid())) {
    if (u.where.rfind("fd ", 0) == 0) out.push_back("/" + u.name);
  }
  return out;
}

/// Pool memfds of `prefix` that any process still holds or maps once `timeout_ms` passed
/// (support::MemfdUsesSettled), as text for a failure message; "none" when there are none.
inline std::string PoolMemoryLeft(const std::string& prefix, int timeout_ms = 5000) {
  return support::DescribeMemfdUses(support::MemfdUsesSettled(prefix, timeout_ms));
}

/// Number of this process's memfds with `prefix`, once it equals `want` or `timeout_ms` has
/// passed. The descriptor server closes its duplicate just after sendmsg returns, which can be
/// after the receiving test thread has moved on: a count right after a descriptor pass races.
inline size_t MemfdCountSettled(const std::string& prefix, size_t want, int timeout_ms = 5000) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const size_t n = MemfdObjects(prefix).size();
    if (n == want || std::chrono::steady_clock::now() > deadline) return n;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

/// Fetches a pool's sealed memfd with a lease, as an agent does, and maps it read-only.
inline StatusOr<ipc::SealedRegion> MapPool(const std::string& fd_socket,
                                           const std::string& lease_id) {
  POLYKV_ASSIGN_OR_RETURN(ipc::UniqueFd fd, ipc::RequestPoolFd(fd_socket, lease_id, 5000));
  return ipc::SealedRegion::MapSealed(std::move(fd), 0);
}

/// Removes leftovers of a test's prefix (cleanup even when a test fails).
inline void RemoveShmObjects(const std::string& prefix) {
  for (const auto& n : ShmObjects(prefix)) shm_unlink(n.c_str());
}

/// A DEALER speaking the REQ-style envelope (empty delimiter + JSON frame).
class RawClient {
 public:
  explicit RawClient(const std::string& endpoint) : socket_(ctx_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.connect(endpoint);
  }
  void SendFrame(const std::string& frame) {
    socket_.send(zmq::message_t(), zmq::send_flags::sndmore);
    socket_.send(zmq::buffer(frame), zmq::send_flags::none);
  }
  void SendRaw(std::vector<std::string> frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      socket_.send(zmq::buffer(frames[i]),
                   i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }
  /// Next message's JSON frame, or nullopt after `timeout_ms`.
  std::optional<std::string> RecvFrame(int timeout_ms) {
    zmq::pollitem_t item{static_cast<void*>(socket_), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms));
    if (!(item.revents & ZMQ_POLLIN)) return std::nullopt;
    std::vector<zmq::message_t> parts;
    (void)zmq::recv_multipart(socket_, std::back_inserter(parts));
    if (parts.empty()) return std::nullopt;
    return parts.back().to_string();
  }
  /// Sends `req` and returns the final reply (PROGRESS messages go to `progress`).
  [[nodiscard]] StatusOr<ipc::Reply> Call(ipc::Request req, int timeout_ms = 20000,
                                          std::vector<ipc::Reply>* progress = nullptr) {
    req.id = ++next_id_;
    SendFrame(ipc::EncodeRequest(req));
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                      deadline - std::chrono::steady_clock::now())
                                      .count());
      if (left <= 0) return absl::DeadlineExceededError("no reply");
      auto frame = RecvFrame(left);
      if (!frame) return absl::DeadlineExceededError("no reply");
      POLYKV_ASSIGN_OR_RETURN(ipc::Reply r, ipc::DecodeReply(*frame));
      if (r.type == ipc::MessageType::kProgress) {
        if (progress) progress->push_back(r);
        continue;
      }
      if (r.id != req.id) continue;  // a late reply to an earlier (timed out) call
      return r;
    }
  }
  [[nodiscard]] StatusOr<ipc::Reply> Ping(int timeout_ms = 5000) {
    ipc::Request r;
    r.type = ipc::MessageType::kPing;
    return Call(r, timeout_ms);
  }
  /// LIST: every pool.
  [[nodiscard]] StatusOr<ipc::Reply> List() {
    ipc::Request r;
    r.type = ipc::MessageType::kList;
    return Call(r);
  }
  /// ATTACH to `pool_id`: a lease and the pool's memory.
  [[nodiscard]] StatusOr<ipc::Reply> Attach(const std::string& pool_id, int timeout_ms = 20000) {
    ipc::Request r;
    r.type = ipc::MessageType::kAttach;
    r.pool_id = pool_id;
    return Call(r, timeout_ms);
  }
  /// DETACH: ends lease `lease_id`.
  [[nodiscard]] StatusOr<ipc::Reply> Detach(const std::string& lease_id, int timeout_ms = 20000) {
    ipc::Request r;
    r.type = ipc::MessageType::kDetach;
    r.lease_id = lease_id;
    return Call(r, timeout_ms);
  }

 private:
  zmq::context_t ctx_;
  zmq::socket_t socket_;
  uint64_t next_id_ = 0;
};

/// True when a polykvd answers PING at `dir`'s endpoint within 300 ms as process `pid` (not
/// another daemon still bound there).
inline bool AnswersPingAs(const TempDir& dir, pid_t pid) {
  if (!support::Exists(dir.socket())) return false;
  RawClient c(dir.endpoint());
  auto p = c.Ping(300);
  return p.ok() && p->ok && p->daemon_pid == static_cast<uint32_t>(pid);
}

inline ipc::Request CreateRequest(const std::string& codec, int salt = 0) {
  ipc::Request r;
  r.type = ipc::MessageType::kCreatePool;
  r.model = Stories260K();
  r.token_ids = StoryIds(salt);
  r.codec = codec;
  return r;
}

}  // namespace polykv::daemon::testing
