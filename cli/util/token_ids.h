// Token ids given on polykv-cli's command line (--token-ids, --prompt-ids, --score-ids).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "polykv/status.h"

namespace polykv::cli {

/// Parses "1,2,3" (separators: commas and white space) into token ids 0..INT32_MAX.
/// Errors (kInvalidArgument, each naming `flag`):
///  - `<flag>: "-5" is negative: token ids are 0..2147483647` for a negative id,
///  - `<flag>: "x" is too large: token ids are 0..2147483647` for one above INT32_MAX,
///  - `<flag>: "x" is not a token id (expected 1,2,3)` for anything but a decimal integer,
///  - `<flag>: no token ids given` for none.
[[nodiscard]] StatusOr<std::vector<int32_t>> ParseTokenIds(const std::string& text,
                                                           const std::string& flag);

}  // namespace polykv::cli
