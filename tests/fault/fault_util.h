// Shared pieces of the fault suite (attach storm, chaos): a polykvd child process on a
// private endpoint that can be killed and restarted, and percentiles.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "process_util.h"
#include "test_util.h"

namespace polykv::fault {

using daemon::testing::Exists;
using daemon::testing::RawClient;
using daemon::testing::ReadFile;
using daemon::testing::Spawn;
using daemon::testing::TempDir;
using daemon::testing::WaitExit;
using daemon::testing::WaitFor;

inline std::string FaultClient() {
  return std::string(POLYKV_BINARY_DIR) + "/tests/fault/polykv_fault_client";
}

/// polykvd on dir/control.sock with a private shm prefix; Kill()/Start() at will.
class DaemonProc {
 public:
  DaemonProc(const TempDir& dir, std::vector<std::string> extra)
      : dir_(dir), extra_(std::move(extra)) {
    prefix_ = "/polykv-ft" + std::to_string(getpid()) + "-";
    log_ = dir_.path() + "/polykvd.log";
  }
  ~DaemonProc() {
    if (pid_ > 0) Kill(SIGKILL);
  }
  /// Starts and waits until it answers PING (as this new process).
  bool Start() {
    std::vector<std::string> a = {daemon::testing::DaemonBinary(),
                                  "--endpoint",
                                  dir_.endpoint(),
                                  "--backend",
                                  "host",
                                  "--shm-prefix",
                                  prefix_,
                                  "--threads",
                                  "1",
                                  "--log-level",
                                  "info"};
    a.insert(a.end(), extra_.begin(), extra_.end());
    pid_ = Spawn(a, log_);
    if (pid_ <= 0) return false;
    return WaitFor([&] { return daemon::testing::AnswersPingAs(dir_, pid_); }, 20000);
  }
  /// Sends `sig` and reaps; returns the exit status (WaitExit), -1 if it did not end.
  int Kill(int sig, int timeout_ms = 20000) {
    if (pid_ <= 0) return -1;
    kill(pid_, sig);
    int rc = WaitExit(pid_, timeout_ms);
    pid_ = -1;
    return rc;
  }
  pid_t pid() const { return pid_; }
  const std::string& prefix() const { return prefix_; }
  const std::string& log() const { return log_; }

 private:
  const TempDir& dir_;
  std::vector<std::string> extra_;
  std::string prefix_, log_;
  pid_t pid_ = -1;
};

/// The p-th percentile (0..100) by nearest rank; 0 for an empty list.
inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  rank = std::clamp<size_t>(rank, 1, v.size());
  return v[rank - 1];
}

inline int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

}  // namespace polykv::fault
