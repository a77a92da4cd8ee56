// A polykvd child process for client tests on a private temp endpoint: started with
// fork/exec, stopped with SIGTERM then SIGKILL, its temp dir and any shm segment of the
// pools it published removed, whatever the test outcome.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "polykv/client.h"

namespace polykv::client::testing {

inline std::string DaemonBinary() { return std::string(POLYKV_BINARY_DIR) + "/daemon/polykvd"; }
inline std::string CliBinary() { return std::string(POLYKV_BINARY_DIR) + "/cli/polykv-cli"; }
inline std::string Stories260K() {
  return std::string(POLYKV_TEST_DATA_DIR) + "/models/stories260K";
}

/// $POLYKV_TEST_TIMEOUT_SCALE (default 1): multiplies the bounds (sanitizer builds).
inline int Scale() {
  const char* v = std::getenv("POLYKV_TEST_TIMEOUT_SCALE");
  int s = v != nullptr ? std::atoi(v) : 1;
  return s >= 1 ? s : 1;
}

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// polykvd on ipc://<tmpdir>/control.sock. `ready()` once it answers PING.
class DaemonProcess {
 public:
  /// `lease_seconds` may be fractional. Pools get a private shm prefix
  /// ("/polykv-ct<pid>-") so parallel test processes never share a segment.
  explicit DaemonProcess(double lease_seconds) {
    shm_prefix_ = "/polykv-ct" + std::to_string(getpid()) + "-";
    char tmpl[] = "/tmp/polykv-client-daemon.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return;
    dir_ = tmpl;
    endpoint_ = "ipc://" + dir_ + "/control.sock";
    std::vector<std::string> args = {DaemonBinary(),
                                     "--endpoint",
                                     endpoint_,
                                     "--backend",
                                     "host",
                                     "--lease-seconds",
                                     std::to_string(lease_seconds),
                                     "--threads",
                                     "2",
                                     "--log-level",
                                     "warn",
                                     "--shm-prefix",
                                     shm_prefix_};
    pid_ = fork();
    if (pid_ == 0) {
      int out = open((dir_ + "/polykvd.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out >= 0) {
        dup2(out, 1);
        dup2(out, 2);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30 * Scale());
    while (std::chrono::steady_clock::now() < deadline) {
      if (!Running()) return;
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
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  bool ready() const { return ready_; }
  const std::string& endpoint() const { return endpoint_; }
  std::string log() const { return dir_.empty() ? "" : Slurp(dir_ + "/polykvd.log"); }
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

  /// SIGTERM, then SIGKILL after 10 s. Returns the exit status (-1 if killed or not run).
  int Stop() {
    if (pid_ <= 0) return exit_status_;
    if (!exited_) {
      kill(pid_, SIGTERM);
      for (int i = 0; i < 1000 * Scale() && Running(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (Running()) {
        kill(pid_, SIGKILL);
        int st = 0;
        waitpid(pid_, &st, 0);
        exited_ = true;
      }
    }
    pid_ = -1;
    return exit_status_;
  }

 private:
  bool Running() {
    if (exited_ || pid_ <= 0) return false;
    int st = 0;
    pid_t r = waitpid(pid_, &st, WNOHANG);
    if (r == 0) return true;
    exited_ = true;
    exit_status_ = (r == pid_ && WIFEXITED(st)) ? WEXITSTATUS(st) : -1;
    return false;
  }

  std::string dir_, endpoint_, shm_prefix_;
  pid_t pid_ = -1;
  bool ready_ = false, exited_ = false;
  int exit_status_ = -1;
  std::vector<std::string> pools_;
};

/// Result of running a command: exit status, stdout, stderr.
struct CommandResult {
  int status = -1;
  std::string out, err;
};

/// Runs argv (no shell), capturing stdout and stderr through temp files.
inline CommandResult RunCommand(std::vector<std::string> args) {
  CommandResult result;
  char tmpl[] = "/tmp/polykv-client-cmd.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return result;
  const std::string dir = tmpl, out = dir + "/out", err = dir + "/err";
  pid_t pid = fork();
  if (pid == 0) {
    int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int in = open("/dev/null", O_RDONLY);
    dup2(o, 1);
    dup2(e, 2);
    dup2(in, 0);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  result.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  result.out = Slurp(out);
  result.err = Slurp(err);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return result;
}

}  // namespace polykv::client::testing
