// libpolykv_client's internals shared by its files (not installed): the C API's handles
// (polykv_client, polykv_pool) and its error plumbing (last error, Status -> polykv_status,
// no exception across the C boundary). client.cc: connect, daemon requests, attach/detach and
// the lease renewer; client_views.cc: what an attached pool offers (attention and layer
// views on the host and the device, token ids, decode, fidelity, verify).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <zmq.hpp>

#include "absl/strings/str_cat.h"
#include "client_channel.h"
#include "polykv/client.h"
#include "polykv/ipc/cuda_ipc.h"
#include "polykv/ipc/pool_layout.h"
#include "polykv/ipc/protocol.h"
#include "polykv/ipc/sealed_region.h"
#include "polykv/ipc/shm_region.h"
#include "polykv/status.h"

namespace polykv::client {

using Clock = std::chrono::steady_clock;

inline constexpr int kDefaultTimeoutMs = 5000;
inline constexpr int kTries = 3;  // Lazy Pirate tries per request

/// The calling thread's last error text (polykv_last_error).
extern thread_local std::string g_last_error;

/// OK -> POLYKV_OK; else records the message as the last error and maps the code.
polykv_status ToC(const Status& s);
/// Records `message` as the last error and returns `code`.
polykv_status Fail(polykv_status code, std::string message);

/// Runs `f` (returning Status) so that no exception crosses the C boundary.
template <typename F>
polykv_status Guarded(const char* what, F&& f) noexcept {
  try {
    return ToC(f());
  } catch (const zmq::error_t& e) {
    return Fail(POLYKV_UNAVAILABLE, absl::StrCat(what, ": ZeroMQ error: ", e.what()));
  } catch (const std::bad_alloc&) {
    return Fail(POLYKV_RESOURCE_EXHAUSTED, absl::StrCat(what, ": out of memory"));
  } catch (const std::exception& e) {
    return Fail(POLYKV_INTERNAL, absl::StrCat(what, ": ", e.what()));
  } catch (...) {
    return Fail(POLYKV_INTERNAL, absl::StrCat(what, ": unknown exception"));
  }
}

}  // namespace polykv::client

/// A connection: one DEALER channel used under a mutex (zmq sockets are not thread-safe).
struct polykv_client {
  std::shared_ptr<zmq::context_t> context;
  std::string endpoint;
  int timeout_ms = polykv::client::kDefaultTimeoutMs;
  std::mutex mu;
  std::unique_ptr<polykv::client::Channel> channel;

  polykv::StatusOr<polykv::ipc::Reply> Call(polykv::ipc::Request request,
                                            int tries = polykv::client::kTries) {
    std::lock_guard<std::mutex> lock(mu);
    return channel->CallOk(std::move(request), timeout_ms, tries);
  }
};

/// An attached pool: mapping + reader + lease (renewed by `renewer` on its own channel).
struct polykv_pool {
  std::shared_ptr<zmq::context_t> context;
  std::string endpoint;
  int timeout_ms = polykv::client::kDefaultTimeoutMs;
  polykv::ipc::PoolInfo info;
  std::string lease_id;
  int64_t lease_ms = 0;

  std::string instance;  // daemon instance that granted the lease ("" for older daemons)

  std::optional<polykv::ipc::SealedRegion> sealed;  // host pool: sealed memfd, mapped read-only
  std::optional<polykv::ipc::ShmRegion> shm;        // host pool from an older daemon (POSIX shm)
  std::optional<polykv::ipc::CudaIpcMapping> cuda;
  std::optional<polykv::ipc::PoolReader> reader;
  // The read-only mapping of the whole region (host pools): [map_base, map_base + map_size).
  const uint8_t* map_base = nullptr;
  uint64_t map_size = 0;

  // Lease state, written by the renewer, read by every call.
  mutable std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::atomic<bool> cancel{false};
  polykv_status lease_code = POLYKV_OK;
  std::string lease_message;
  polykv::client::Clock::time_point lease_valid_until;
  std::thread renewer;
  std::unique_ptr<polykv::client::Channel>
      channel;  // renewer's socket; detach uses it after the join

  /// OK while the lease is valid; otherwise the reason (sets nothing).
  std::pair<polykv_status, std::string> LeaseState() const;
  /// The renewer thread: renews every lease_ms / 3 until `stop`, the lease is lost (evicted,
  /// expired, another daemon instance) or it runs out locally while the daemon is silent.
  void RenewLoop();
};
