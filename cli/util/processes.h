// Child processes of polykv-cli (`agents run`, `eval --sections agents`): posix_spawn with
// stdout/stderr to files, at most `jobs` alive at once, exit status, peak RSS (wait4) and
// the parsed JSON each child prints.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "polykv/status.h"

namespace polykv::cli {

/// One child process and what came of it.
struct Child {
  int index = 0;
  std::string prompt;  ///< the caller's label of what this child runs
  pid_t pid = -1;
  int exit_code = -1;
  int signal = 0;
  uint64_t max_rss_bytes = 0;  ///< wait4 ru_maxrss
  double wall_ms = 0;
  std::chrono::steady_clock::time_point start;
  std::string out_path, err_path;  ///< where stdout and stderr go (set before RunAll)
  nlohmann::json result;           ///< stdout parsed as JSON when the child exited 0
  std::string error;               ///< the last line of stderr (or why it failed) otherwise
};

/// The running executable (/proc/self/exe), or "polykv-cli".
std::string SelfExe();

/// Runs `children` with at most `jobs` alive at once (jobs >= children.size(): all at
/// once); `argv_of` gives each child's argv (argv[0] a path). stdin is /dev/null. A child
/// that cannot be spawned gets `error` set. Errors: kInternal when wait4 fails.
[[nodiscard]] Status RunAll(std::vector<Child>& children, int jobs,
                            const std::function<std::vector<std::string>(const Child&)>& argv_of);

}  // namespace polykv::cli
