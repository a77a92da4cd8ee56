// polykvd's metrics: request/error counters, attach-latency and create-duration histograms,
// prefill tokens, and the Prometheus text exposition (format 0.0.4) of them plus the pools'
// gauges; served on GET /metrics by a small cpp-httplib server (--metrics-listen).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "polykv/ipc/protocol.h"
#include "polykv/status.h"

namespace httplib {
class Server;
}

namespace polykv::daemon {

class PoolManager;
class PoolStore;

/// A Prometheus histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  /// Appends "<name>_bucket{le=...}", "_sum" and "_count" lines.
  void Render(const std::string& name, std::string* out) const;
  uint64_t count() const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bound (not cumulative); last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

/// Everything polykvd counts. Thread-safe (the control loop and create workers record).
class Metrics {
 public:
  Metrics();
  /// One answered request of `type` (ok or not), taking `seconds` to answer. Errors are
  /// counted by reply code; ATTACH durations feed polykv_attach_duration_seconds and
  /// CREATE_POOL durations polykv_create_duration_seconds.
  void ObserveRequest(ipc::MessageType type, const ipc::Reply& reply, double seconds);
  /// An error reply to a frame that could not be decoded or was refused.
  void ObserveError(const std::string& code);
  /// A create that ran the model over `tokens` tokens (restored and replicated pools, and
  /// creates that found their pool made, add nothing): polykv_prefills_total and
  /// polykv_prefill_tokens_total.
  void AddPrefill(uint64_t tokens);
  /// A CREATE_POOL that joined an identical one in flight instead of taking a queue slot.
  void AddCoalescedCreate();

  /// The exposition: the counters above plus gauges read from `pools` (and `store` when
  /// not null) at call time.
  std::string Render(const PoolManager& pools, const PoolStore* store) const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> requests_;  // by type name
  std::map<std::string, uint64_t> errors_;    // by code
  std::atomic<uint64_t> prefill_tokens_{0};
  std::atomic<uint64_t> prefills_{0};
  std::atomic<uint64_t> coalesced_creates_{0};
  Histogram attach_;
  Histogram create_;
};

/// GET /metrics over HTTP on its own thread.
class MetricsServer {
 public:
  /// Listens on "HOST:PORT" (PORT 0: any free port). `render` produces the body.
  /// Errors: kInvalidArgument (no ":PORT"), kUnavailable (cannot bind).
  [[nodiscard]] static StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& listen, std::function<std::string()> render);
  /// Stops listening and joins the thread.
  ~MetricsServer();
  int port() const { return port_; }
  const std::string& host() const { return host_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::string host_;
  int port_ = 0;
};

}  // namespace polykv::daemon
