// polykvd's control server: options (CLI11 flags + config file), startup checks (live
// daemon on the endpoint, stale socket and shm segments), the ZeroMQ ROUTER loop with
// worker threads for CREATE_POOL, peer-uid checks via ZAP, lease sweeping, sd_notify.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "pool_manager.h"
#include "polykv/status.h"

namespace polykv::daemon {

/// Everything polykvd is configured with.
struct DaemonOptions {
  std::string endpoint;                  ///< empty: ipc::DefaultEndpoint()
  std::string backend = "auto";          ///< auto | host | cuda
  uint64_t memory_cap = 0;               ///< bytes per backend; 0 = unlimited
  double lease_seconds = 30;             ///< lease duration
  std::vector<std::string> model_path;   ///< search path for relative model names
  std::vector<uint32_t> allow_uids;      ///< empty: the daemon's own uid and root
  int threads = 0;                       ///< libtorch intra-op threads; 0 = all cores
  std::string log_level = "info";        ///< trace|debug|info|warn|error|critical|off
  std::string shm_prefix = "/polykv-";   ///< shm object name prefix of pools
  uint32_t socket_mode = 0660;           ///< mode of the ipc socket file
  double sweep_seconds = 0.25;           ///< lease sweep / watchdog tick
  std::string state_dir;                 ///< persisted pools (empty: memory only)
  uint64_t state_budget = 0;             ///< disk budget of pool files; 0 = unlimited
  bool preload = false;                  ///< restore every persisted pool at start
  std::string metrics_listen;            ///< HOST:PORT of GET /metrics (empty: off)
  ModelLoader loader;                    ///< tests: inject a model loader
};

/// "4G", "512M", "1.5GiB", "1000000" -> bytes (K/M/G/T = 1024^n; KB/MB/GB/TB = 1000^n).
/// Errors: kInvalidArgument naming the text.
StatusOr<uint64_t> ParseByteSize(const std::string& text);

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
  static StatusOr<std::unique_ptr<Daemon>> Start(DaemonOptions options);
  ~Daemon();

  /// Serves requests until Stop() or `*external_stop` becomes true; then shuts down (stops
  /// accepting, joins workers, releases all pools, removes the socket and pid files).
  Status Run(const std::atomic<bool>* external_stop = nullptr);
  /// Thread-safe (a single atomic store): asks Run to return.
  void Stop() { stop_.store(true); }

  const std::string& endpoint() const;
  PoolManager& pools();

  struct Impl;

 private:
  explicit Daemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> stop_{false};
};

}  // namespace polykv::daemon
