// Child processes for tests and benchmarks: posix_spawn of an argv (no shell, no PATH search)
// with extra environment and stdout/stderr redirected to files, bounded waits, signals and the
// exit status, as free functions over a pid and as a Process object that kills and reaps its
// child on destruction; and RunProcess, which runs a command to completion and returns its output.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace polykv::support {

/// Where a spawned child's standard streams go (stdin always reads /dev/null) and what it adds
/// to its environment.
struct SpawnOptions {
  /// Files for stdout and stderr. The same path for both opens one file that both streams
  /// share (like 2>&1).
  std::string stdout_path = "/dev/null";
  std::string stderr_path = "/dev/null";
  /// Appends (O_APPEND) to existing files instead of truncating them.
  bool append = false;
  /// Permissions of a file the redirection creates.
  mode_t mode = 0600;
  /// "NAME=value" entries set in the child on top of this process's environment (replacing a
  /// variable of the same name). This process's environment is left as it is.
  std::vector<std::string> env;
};

/// Starts argv[0] (a path to an executable) with arguments argv. INVALID_ARGUMENT for an empty
/// argv; the posix_spawn error (e.g. NOT_FOUND for ENOENT) when it cannot start.
[[nodiscard]] absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv,
                                          const SpawnOptions& options = {});

/// A waitpid status as one number: the exit code, or 128 + the signal that ended the process.
int ExitCode(int wait_status);

/// Waits for `pid` up to `timeout_ms` (< 0: without bound) and reaps it. Returns its ExitCode;
/// -1 when it did not end in time (it is then SIGKILLed and reaped) or cannot be waited for
/// (not a child of this process, or already reaped).
int WaitExit(pid_t pid, int timeout_ms);

/// One child process. While it runs (started and not yet reaped) the destructor SIGKILLs and
/// reaps it, so a failing test leaves nothing behind. Movable, not copyable.
class Process {
 public:
  Process() = default;
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  Process(Process&& other) noexcept;
  Process& operator=(Process&& other) noexcept;

  /// Spawn (see above) into this object, which must not hold a running child
  /// (FAILED_PRECONDITION).
  [[nodiscard]] absl::Status Start(const std::vector<std::string>& argv,
                                   const SpawnOptions& options = {});
  /// Start with stdout and stderr truncated into the two files (mode 0600).
  [[nodiscard]] absl::Status Start(const std::vector<std::string>& argv,
                                   const std::string& out_path, const std::string& err_path);

  /// Waits up to `timeout_ms` (0: just checks, < 0: without bound). True when the process has
  /// ended and was reaped (or never ran); its status is then in exit_code().
  bool Wait(int timeout_ms);
  /// Sends `sig` to the running child; false when there is none or kill() failed.
  bool Kill(int sig);
  /// SIGTERM, up to `grace_ms` for it to end, then SIGKILL and up to `kill_ms` more. Returns
  /// exit_code() when it ended within the grace period (also when it had ended before), -1 when
  /// it had to be killed.
  int Stop(int grace_ms, int kill_ms = 10000);

  /// Started and not yet reaped.
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  /// Exit code, 128 + signal when a signal ended it; -1 until it has been reaped.
  int exit_code() const { return exit_code_; }
  /// The signal that ended it; 0 when it exited by itself or has not ended.
  int term_signal() const { return term_signal_; }
  /// What the child has written so far to its stdout / stderr file ("" when not redirected to
  /// a file or not readable).
  std::string out() const;
  std::string err() const;

 private:
  void Reset();
  pid_t pid_ = -1;
  int exit_code_ = -1;
  int term_signal_ = 0;
  std::string out_path_, err_path_;
};

/// How a command run to completion ended, and what it printed.
struct RunResult {
  int exit_code = -1;      ///< exit code, 128 + signal when one ended it; -1 when it did not start
  int term_signal = 0;     ///< the signal that ended it, else 0
  bool timed_out = false;  ///< killed (SIGKILL) after the timeout
  std::string out, err;    ///< everything it wrote to stdout / stderr
};

/// Runs argv to completion, stdout and stderr captured through files in `dir` (named
/// run<pid>_<n>.out/.err and left there; "" means a temporary folder of its own, removed
/// afterwards). After `timeout_ms` (< 0: without bound) the command is SIGKILLed. When it
/// cannot start, exit_code is -1 and err says why.
RunResult RunProcess(const std::vector<std::string>& argv, const std::string& dir = "",
                     int timeout_ms = -1, const std::vector<std::string>& env = {});

}  // namespace polykv::support
