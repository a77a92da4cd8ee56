// Child processes for tests and benchmarks (see process.h).
#include "support/process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "support/files.h"

extern char** environ;

namespace polykv::support {

namespace {

// The part of "NAME=value" before '=' (the whole entry when there is none).
std::string_view EnvName(std::string_view entry) { return entry.substr(0, entry.find('=')); }

// waitpid without WNOHANG races, EINTR retried: the pid, 0 when still running, -1 on error.
pid_t WaitPid(pid_t pid, int* status, int flags) {
  for (;;) {
    const pid_t r = waitpid(pid, status, flags);
    if (r >= 0 || errno != EINTR) return r;
  }
}

// Polls `pid` every 20 ms for up to `timeout_ms` (< 0: one blocking wait). The pid (status in
// *status) when reaped, 0 on timeout, -1 when it cannot be waited for.
pid_t WaitPidFor(pid_t pid, int* status, int timeout_ms) {
  if (timeout_ms < 0) return WaitPid(pid, status, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const pid_t r = WaitPid(pid, status, WNOHANG);
    if (r != 0) return r;
    if (std::chrono::steady_clock::now() >= deadline) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const SpawnOptions& options) {
  if (argv.empty()) return absl::InvalidArgumentError("Spawn: empty argv");
  const int flags = O_WRONLY | O_CREAT | (options.append ? O_APPEND : O_TRUNC);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, options.stdout_path.c_str(), flags, options.mode);
  if (options.stderr_path == options.stdout_path) {
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
  } else {
    posix_spawn_file_actions_addopen(&fa, 2, options.stderr_path.c_str(), flags, options.mode);
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // This process's environment, less the names `env` sets, then `env`.
  std::vector<char*> envp;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    bool replaced = false;
    for (const std::string& mine : options.env) replaced |= EnvName(mine) == EnvName(*e);
    if (!replaced) envp.push_back(*e);
  }
  for (const std::string& mine : options.env) envp.push_back(const_cast<char*>(mine.c_str()));
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &fa, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return absl::ErrnoToStatus(rc, "cannot start " + argv[0]);
  return pid;
}

int ExitCode(int wait_status) {
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
}

int WaitExit(pid_t pid, int timeout_ms) {
  if (pid <= 0) return -1;
  int status = 0;
  const pid_t r = WaitPidFor(pid, &status, timeout_ms);
  if (r == pid) return ExitCode(status);
  if (r == 0) {
    kill(pid, SIGKILL);
    WaitPid(pid, nullptr, 0);
  }
  return -1;
}

Process::~Process() {
  Kill(SIGKILL);
  Wait(10000);
}

Process::Process(Process&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      exit_code_(std::exchange(other.exit_code_, -1)),
      term_signal_(std::exchange(other.term_signal_, 0)),
      out_path_(std::move(other.out_path_)),
      err_path_(std::move(other.err_path_)) {}

Process& Process::operator=(Process&& other) noexcept {
  if (this != &other) {
    Kill(SIGKILL);
    Wait(10000);
    pid_ = std::exchange(other.pid_, -1);
    exit_code_ = std::exchange(other.exit_code_, -1);
    term_signal_ = std::exchange(other.term_signal_, 0);
    out_path_ = std::move(other.out_path_);
    err_path_ = std::move(other.err_path_);
  }
  return *this;
}

absl::Status Process::Start(const std::vector<std::string>& argv, const SpawnOptions& options) {
  if (running()) return absl::FailedPreconditionError("Process::Start: a child still runs");
  Reset();
  out_path_ = options.stdout_path;
  err_path_ = options.stderr_path;
  absl::StatusOr<pid_t> pid = Spawn(argv, options);
  if (!pid.ok()) return pid.status();
  pid_ = *pid;
  return absl::OkStatus();
}

absl::Status Process::Start(const std::vector<std::string>& argv, const std::string& out_path,
                            const std::string& err_path) {
  SpawnOptions o;
  o.stdout_path = out_path;
  o.stderr_path = err_path;
  return Start(argv, o);
}

bool Process::Wait(int timeout_ms) {
  if (pid_ <= 0) return true;
  int status = 0;
  const pid_t r = WaitPidFor(pid_, &status, timeout_ms);
  if (r == 0) return false;
  if (r == pid_) {
    exit_code_ = ExitCode(status);
    term_signal_ = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  }
  pid_ = -1;  // reaped, or not ours to wait for (r < 0)
  return true;
}

bool Process::Kill(int sig) { return pid_ > 0 && ::kill(pid_, sig) == 0; }

int Process::Stop(int grace_ms, int kill_ms) {
  if (!running()) return exit_code_;
  Kill(SIGTERM);
  if (Wait(grace_ms)) return exit_code_;
  Kill(SIGKILL);
  Wait(kill_ms);
  return -1;
}

std::string Process::out() const { return out_path_.empty() ? "" : ReadFile(out_path_); }
std::string Process::err() const { return err_path_.empty() ? "" : ReadFile(err_path_); }

void Process::Reset() {
  pid_ = -1;
  exit_code_ = -1;
  term_signal_ = 0;
  out_path_.clear();
  err_path_.clear();
}

RunResult RunProcess(const std::vector<std::string>& argv, const std::string& dir, int timeout_ms,
                     const std::vector<std::string>& env) {
  static std::atomic<int> counter{0};
  RunResult r;
  std::optional<TempDir> own;
  if (dir.empty()) own.emplace("polykv-run-");
  const std::string folder = own ? own->path() : dir;
  if (folder.empty()) {
    r.err = "cannot create a temporary folder for the output";
    return r;
  }
  const std::string base =
      folder + "/run" + std::to_string(getpid()) + "_" + std::to_string(counter++);
  SpawnOptions o;
  o.stdout_path = base + ".out";
  o.stderr_path = base + ".err";
  o.env = env;
  Process p;
  if (absl::Status s = p.Start(argv, o); !s.ok()) {
    r.err = std::string(s.message());
    return r;
  }
  if (!p.Wait(timeout_ms)) {
    r.timed_out = true;
    p.Kill(SIGKILL);
    p.Wait(10000);
  }
  r.exit_code = p.exit_code();
  r.term_signal = p.term_signal();
  r.out = p.out();
  r.err = p.err();
  return r;
}

}  // namespace polykv::support
