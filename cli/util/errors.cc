// How polykv-cli's commands fail (see errors.h).
#include "util/errors.h"

#include <iostream>
#include <string>

namespace polykv::cli {

void FailWith(const Status& status) {
  const Status s = status.ok() ? absl::UnknownError("failed without a status") : status;
  std::cerr << "error: " << absl::StatusCodeToString(s.code()) << ": " << s.message() << "\n";
  ExitCode() = 1;
}

}  // namespace polykv::cli
