// Helpers for tests that run polykvd (and polykv-cli) as separate processes: spawn with
// output to a file, bounded waits, the binaries' paths ($POLYKV_TEST_DAEMON_BINARY /
// $POLYKV_TEST_CLI_BINARY override them, e.g. to run a test against an older build).
// $POLYKV_TEST_TIMEOUT_SCALE multiplies every bound (sanitizer builds start slowly).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace polykv::daemon::testing {

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

/// The factor for every wait bound ($POLYKV_TEST_TIMEOUT_SCALE, default 1).
inline int TimeoutScale() {
  static const int scale = [] {
    const char* v = std::getenv("POLYKV_TEST_TIMEOUT_SCALE");
    int s = v != nullptr ? std::atoi(v) : 1;
    return s >= 1 ? s : 1;
  }();
  return scale;
}

/// posix_spawn with stderr (and stdout unless `out_path` is given) appended to files.
inline pid_t Spawn(const std::vector<std::string>& args, const std::string& log_path,
                   const std::string& out_path = "/dev/null") {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

/// Exit status (128 + signal when killed), or -1 on timeout (the process is then killed).
inline int WaitExit(pid_t pid, int timeout_ms) {
  timeout_ms *= TimeoutScale();
  for (int waited = 0; waited < timeout_ms; waited += 20) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

inline std::string ReadText(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

/// Polls `pred` every 20 ms for up to `timeout_ms`; returns its last value.
template <typename Pred>
bool WaitFor(Pred pred, int timeout_ms) {
  timeout_ms *= TimeoutScale();
  for (int waited = 0; waited < timeout_ms; waited += 20) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

}  // namespace polykv::daemon::testing
