// How polykv-cli's commands fail: one line "error: <CODE>: <message>" on stderr (CODE as
// absl::StatusCodeToString: INVALID_ARGUMENT, NOT_FOUND, ...) and exit code 1.
#pragma once

#include "polykv/status.h"

namespace polykv::cli {

/// The exit code polykv-cli returns (main.cc): 0 until a command fails (FailWith sets 1).
inline int& ExitCode() {
  static int code = 0;
  return code;
}

/// Reports a failed command: prints "error: <CODE>: <message>\n" to stderr and sets
/// ExitCode() to 1. `status` is an error; an OK status (a caller's bug) is still reported,
/// as "error: UNKNOWN: failed without a status".
void FailWith(const Status& status);

}  // namespace polykv::cli
