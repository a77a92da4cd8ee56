// Token ids given on polykv-cli's command line.
#include "util/token_ids.h"

#include <cerrno>
#include <climits>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace polykv::cli {

StatusOr<std::vector<int32_t>> ParseTokenIds(const std::string& text, const std::string& flag) {
  std::vector<int32_t> ids;
  for (absl::string_view part :
       absl::StrSplit(text, absl::ByAnyChar(", \t\r\n"), absl::SkipEmpty())) {
    const std::string item(part);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (end == item.c_str() || *end != '\0') {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": \"", item, "\" is not a token id (expected 1,2,3)"));
    }
    if (v < 0 || v > INT32_MAX || errno == ERANGE) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": \"", item, "\" is ",
                                                     v < 0 ? "negative" : "too large",
                                                     ": token ids are 0..", INT32_MAX));
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": no token ids given"));
  return ids;
}

}  // namespace polykv::cli
