// A polykvd child process for client tests on a private temp endpoint (tests/support: spawned
// with stdout and stderr in one log, stopped with SIGTERM then SIGKILL), its temp dir and any
// shm segment of the pools it published removed, whatever the test outcome.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "polykv/client.h"
#include "support/files.h"
#include "support/process.h"
#include "support/wait.h"

namespace polykv::client::testing {

inline std::string DaemonBinary() { return std::string(POLYKV_BINARY_DIR) + "/daemon/polykvd"; }
inline std::string CliBinary() { return std::string(POLYKV_BINARY_DIR) + "/cli/polykv-cli"; }
inline std::string Stories260K() {
  return std::string(POLYKV_TEST_DATA_DIR) + "/models/stories260K";
}

/// polykvd on ipc://<tmpdir>/control.sock. `ready()` once it answers PING.
class DaemonProcess {
 public:
  /// `lease_seconds` may be fractional. Pools get a private shm prefix
  /// ("/polykv-ct<pid>-") so parallel test processes never share a segment.
  explicit DaemonProcess(double lease_seconds) : dir_("polykv-client-daemon.") {
    shm_prefix_ = "/polykv-ct" + std::to_string(getpid()) + "-";
    if (!dir_.ok()) return;
    endpoint_ = "ipc://" + dir_.path() + "/control.sock";
    support::SpawnOptions o;
    o.stdout_path = o.stderr_path = dir_.File("polykvd.log");
    o.mode = 0644;
    if (!proc_
             .Start({DaemonBinary(), "--endpoint", endpoint_, "--backend", "host",
                     "--lease-seconds", std::to_string(lease_seconds), "--threads", "2",
                     "--log-level", "warn", "--shm-prefix", shm_prefix_},
                    o)
             .ok()) {
      return;
    }
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(30 * support::TimeoutScale());
    while (std::chrono::steady_clock::now() < deadline) {
      if (proc_.Wait(0)) return;  // it ended
      polykv_client* c = nullptr;
      if (polykv_connect(endpoint_.c_str(), 200, &c) == POLYKV_OK) {
        polykv_disconnect(c);
        ready_ = true;
        return;
      }
    }
  }
  ~DaemonProcess() {
    Stop();
    for (const auto& id : pools_) {
      std::error_code ec;
      std::filesystem::remove(ShmPath(id), ec);
    }
  }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  bool ready() const { return ready_; }
  const std::string& endpoint() const { return endpoint_; }
  std::string log() const { return dir_.ok() ? support::ReadFile(dir_.File("polykvd.log")) : ""; }
  /// /dev/shm path a host pool of this daemon would have had as a named segment (older
  /// daemons); host pools are sealed memfds now and never appear there.
  std::string ShmPath(const std::string& pool_id) const {
    return "/dev/shm" + shm_prefix_ + pool_id.substr(0, 16);
  }
  /// How a host pool's mapping appears in /proc/self/maps: "/memfd:<prefix>...".
  std::string MemfdName(const std::string& pool_id) const {
    return "/memfd:" + shm_prefix_.substr(1) + pool_id.substr(0, 16);
  }
  /// Remembers a pool id so a leftover named segment is removed even if the daemon is killed.
  void Track(const std::string& pool_id) { pools_.push_back(pool_id); }

  /// SIGTERM, then SIGKILL after 10 s (scaled). Returns the exit status (-1 if killed, ended by
  /// a signal or not run).
  int Stop() {
    const int code = proc_.Stop(10000 * support::TimeoutScale());
    return code < 0 || proc_.term_signal() != 0 ? -1 : code;
  }

 private:
  support::TempDir dir_;
  std::string endpoint_, shm_prefix_;
  support::Process proc_;
  bool ready_ = false;
  std::vector<std::string> pools_;
};

/// Result of running a command: exit status (-1 when a signal ended it), stdout, stderr.
struct CommandResult {
  int status = -1;
  std::string out, err;
};

/// Runs argv (no shell) to completion, capturing stdout and stderr through temp files.
inline CommandResult RunCommand(const std::vector<std::string>& args) {
  support::RunResult r = support::RunProcess(args);
  CommandResult result;
  result.status = r.term_signal != 0 ? -1 : r.exit_code;
  result.out = std::move(r.out);
  result.err = std::move(r.err);
  return result;
}

}  // namespace polykv::client::testing
