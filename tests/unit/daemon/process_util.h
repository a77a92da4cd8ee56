// Helpers for tests that run polykvd (and polykv-cli) as separate processes: spawn with
// output to a file, bounded waits (tests/support, with this suite's conventions), the
// binaries' paths ($POLYKV_TEST_DAEMON_BINARY / $POLYKV_TEST_CLI_BINARY override them, e.g. to
// run a test against an older build). $POLYKV_TEST_TIMEOUT_SCALE multiplies every bound
// (sanitizer builds start slowly).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "support/files.h"
#include "support/process.h"
#include "support/wait.h"

namespace polykv::daemon::testing {

using support::Exists;
using support::ReadFile;
using support::TimeoutScale;

inline std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}
inline std::string DaemonBinary() {
  return EnvOr("POLYKV_TEST_DAEMON_BINARY", std::string(POLYKV_BINARY_DIR) + "/daemon/polykvd");
}
inline std::string CliBinary() {
  return EnvOr("POLYKV_TEST_CLI_BINARY", std::string(POLYKV_BINARY_DIR) + "/cli/polykv-cli");
}

/// Starts `args` with stderr (and stdout when `out_path` is given) appended to files (mode
/// 0644) and "NAME=value" entries `env` added to the child's environment; -1 when it cannot
/// start.
inline pid_t Spawn(const std::vector<std::string>& args, const std::string& log_path,
                   const std::string& out_path = "/dev/null", std::vector<std::string> env = {}) {
  support::SpawnOptions o;
  o.stdout_path = out_path;
  o.stderr_path = log_path;
  o.append = true;
  o.mode = 0644;
  o.env = std::move(env);
  return support::Spawn(args, o).value_or(-1);
}

/// Exit status (128 + signal when killed), or -1 on timeout (the process is then killed);
/// the bound is scaled by TimeoutScale().
inline int WaitExit(pid_t pid, int timeout_ms) {
  return support::WaitExit(pid, timeout_ms * TimeoutScale());
}

/// Polls `pred` every 20 ms for up to `timeout_ms` (scaled by TimeoutScale()); returns its
/// last value.
template <typename Pred>
bool WaitFor(Pred pred, int timeout_ms) {
  return support::WaitFor(std::move(pred), timeout_ms * TimeoutScale());
}

}  // namespace polykv::daemon::testing
