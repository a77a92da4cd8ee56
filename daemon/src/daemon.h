// polykvd's control server: options (CLI11 flags + config file), startup checks (live
// daemon on the endpoint, stale sockets, legacy shm segments), the ZeroMQ ROUTER loop, a
// bounded CREATE_POOL queue served by a fixed set of worker threads (with PROGRESS
// heartbeats), reader/operator roles from the peer's uid/gid (ZAP + SO_PEERCRED), the
// pool-descriptor socket (fd_server.h), lease sweeping, sd_notify, and a shutdown that
// answers in-flight creates with CANCELLED and never waits on a blocked worker for more
// than a bounded time.
#pragma once

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "peers.h"
#include "polykv/status.h"
#include "pool_manager.h"

namespace polykv::daemon {

/// Everything polykvd is configured with.
struct DaemonOptions {
  std::string endpoint;          ///< empty: ipc::DefaultEndpoint()
  std::string backend = "auto";  ///< auto | host | cuda
  /// host (default): documents are prefilled on the host; cuda: with the cuda backend, on
  /// the GPU (CUDA model runtime) when it is usable, else on the host (logged once).
  std::string prefill_device = "host";
  uint64_t memory_cap = 0;              ///< bytes per backend; 0 = unlimited
  double lease_seconds = 30;            ///< lease duration
  std::vector<std::string> model_path;  ///< search path for relative model names
  /// Model folders: models are opened only under these (canonical, no symlink escape).
  /// Empty: only the daemon's own uid and root may name model files.
  std::vector<std::string> models_dirs;
  /// Operators (CREATE_POOL, EVICT and everything readers may) by uid; --allow-uid, kept
  /// for older configs, adds to it. When no role list is given at all: the daemon's own uid
  /// and root.
  std::vector<uint32_t> allow_uids;
  std::vector<uint32_t> operator_uids, operator_gids;
  /// Readers (PING, LIST, STATS, ATTACH, RENEW, DETACH, pool descriptors) by uid / gid.
  std::vector<uint32_t> reader_uids, reader_gids;
  int create_workers = 2;               ///< threads running creates (fixed)
  int max_queued_creates = 8;           ///< creates waiting for a worker; more: refused
  size_t model_cache_models = 2;        ///< models kept loaded (LRU)
  uint64_t model_cache_bytes = 0;       ///< bound on their estimated weights (0 = none)
  double shutdown_grace_seconds = 5;    ///< how long shutdown waits for busy workers
  std::string fd_socket;                ///< pool-descriptor socket (default: <socket>.fds)
  int test_create_delay_ms = 0;         ///< fault injection (tests): slow creates
  int threads = 0;                      ///< compute threads (kernels' pool); 0 = all cores
  std::string log_level = "info";       ///< trace|debug|info|warn|error|critical|off
  std::string shm_prefix = "/polykv-";  ///< shm object name prefix of pools
  uint32_t socket_mode = 0660;          ///< mode of the ipc socket file
  double sweep_seconds = 0.25;          ///< lease sweep / watchdog tick
  std::string state_dir;                ///< persisted pools (empty: memory only)
  uint64_t state_budget = 0;            ///< disk budget of pool files; 0 = unlimited
  bool preload = false;                 ///< restore every persisted pool at start
  std::string metrics_listen;           ///< HOST:PORT of GET /metrics (empty: off)
  PeerOptions peer;                     ///< other daemons (--listen, --peer, key files)
  ModelLoader loader;                   ///< tests: inject a model loader
};

/// "4G", "512M", "1.5GiB", "1000000" -> bytes (K/M/G/T = 1024^n; KB/MB/GB/TB = 1000^n).
/// Errors: kInvalidArgument naming the text.
[[nodiscard]] StatusOr<uint64_t> ParseByteSize(const std::string& text);

/// Adds polykvd's flags (and --config FILE, TOML/INI) to `app`, writing into `options`.
/// Bad values (e.g. --memory-cap 4X) make app.parse throw CLI::ValidationError.
void AddDaemonFlags(CLI::App& app, DaemonOptions& options);

/// The filesystem path of an ipc:// endpoint ("" for other transports).
std::string IpcPath(const std::string& endpoint);

/// A running polykvd: Start binds the endpoint, Run serves until Stop (or a signal flag).
class Daemon {
 public:
  /// Startup checks and bind. Errors: kAlreadyExists when a live daemon answers PING on the
  /// endpoint; kInvalidArgument for bad options; kUnavailable when binding fails.
  [[nodiscard]] static StatusOr<std::unique_ptr<Daemon>> Start(DaemonOptions options);
  ~Daemon();

  /// Serves requests until Stop() or `*external_stop` becomes true; then shuts down: answers
  /// every queued or running create with CANCELLED, stops accepting, waits at most
  /// shutdown_grace_seconds for busy workers (a worker still blocked then is left behind),
  /// releases all pools, removes the socket, descriptor-socket and pid files.
  [[nodiscard]] Status Run(const std::atomic<bool>* external_stop = nullptr);
  /// Thread-safe (a single atomic store): asks Run to return.
  void Stop() { stop_.store(true); }

  const std::string& endpoint() const;
  /// The 32-hex-char instance id sent in every reply.
  const std::string& instance() const;
  /// Path of the pool-descriptor socket.
  const std::string& fd_socket() const;
  /// Create workers the last shutdown left running (blocked past the grace time). A
  /// process should then end with _exit: static destructors would race with them.
  int workers_left_behind() const;
  PoolManager& pools();
  /// The port GET /metrics listens on (--metrics-listen, port 0 = any free one); 0 without.
  int metrics_port() const;

  struct Impl;

 private:
  explicit Daemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> stop_{false};
};

}  // namespace polykv::daemon
