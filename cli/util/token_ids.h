// Token ids given on polykv-cli's command line (--token-ids, --prompt-ids, --score-ids).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "polykv/status.h"

namespace polykv::cli {

/// Parses "1,2,3" (separators: commas and white space) into token ids 0..INT32_MAX.
/// Errors: kInvalidArgument `<flag>: "x" is not a token id (expected 1,2,3)` for anything
/// else (negative, too large, not a number), `<flag>: no token ids given` for none.
[[nodiscard]] StatusOr<std::vector<int32_t>> ParseTokenIds(const std::string& text,
                                                           const std::string& flag);

}  // namespace polykv::cli
