// Files named on polykv-cli's command line: whole-file reads (documents, tensors, question
// lists, texts to tokenize) and writes, with one wording of their errors.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "polykv/status.h"

namespace polykv::cli {

/// All bytes of the file at `path`. `what` names the file in the error ("document file"; empty:
/// the path alone). Errors: kNotFound "cannot read <what> <path>" when it cannot be opened or
/// read.
[[nodiscard]] StatusOr<std::string> ReadFile(const std::string& path, std::string_view what = {});

/// ReadFile, or all of standard input when `path` is "-".
[[nodiscard]] StatusOr<std::string> ReadFileOrStdin(const std::string& path,
                                                    std::string_view what = {});

/// The first `max_bytes` bytes of the file at `path` (all of it when shorter). Errors: as
/// ReadFile.
[[nodiscard]] StatusOr<std::string> ReadFilePrefix(const std::string& path, size_t max_bytes,
                                                   std::string_view what = {});

/// Writes `bytes` to the file at `path` (created or truncated). Errors: kPermissionDenied
/// "cannot write <path>" when it cannot be opened, kDataLoss "cannot write <path>: write
/// failed" when the bytes do not all reach it.
[[nodiscard]] Status WriteFile(const std::string& path, std::string_view bytes);

}  // namespace polykv::cli
