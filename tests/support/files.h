// Files for tests and benchmarks: whole-file read and write, an atomic replace, a copy, and a
// private temporary folder that is removed with everything in it on destruction.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace polykv::support {

/// The whole file, byte for byte; "" when it does not exist or cannot be read (tests read
/// logs that a child may not have created yet).
std::string ReadFile(const std::string& path);

/// True when the file at `path` holds `needle` (false when it cannot be read).
bool FileContains(const std::string& path, std::string_view needle);

/// Creates or truncates `path` and writes `bytes`. INTERNAL naming the path on an I/O error.
[[nodiscard]] absl::Status WriteFile(const std::string& path, std::string_view bytes);

/// Writes `bytes` to `path` + ".tmp" and renames it over `path`, so a process that mapped the
/// old file keeps the old contents (rewriting a mapped file in place changes them under it).
/// INTERNAL naming the path on an I/O error.
[[nodiscard]] absl::Status ReplaceFile(const std::string& path, std::string_view bytes);

/// Copies `from` to `to` (created or truncated) and gives it permissions `mode`. NOT_FOUND when
/// `from` cannot be opened, INTERNAL on a write or chmod error.
[[nodiscard]] absl::Status CopyFile(const std::string& from, const std::string& to,
                                    mode_t mode = 0644);

/// True when `path` exists (access(F_OK): a dangling symlink counts as absent).
bool Exists(const std::string& path);

/// This executable's absolute path (/proc/self/exe); "" when it cannot be read.
std::string SelfExe();

/// A fresh private folder /tmp/<prefix>XXXXXX (mkdtemp, mode 0700), removed recursively on
/// destruction. The path stays short on purpose: Unix socket paths inside it must fit in 108
/// bytes. path() is "" (and ok() false) when mkdtemp failed; nothing is removed then.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "polykv-test-");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  TempDir(TempDir&& other) noexcept;
  TempDir& operator=(TempDir&& other) noexcept;

  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  /// path() + "/" + name.
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  void Remove();
  std::string path_;
};

}  // namespace polykv::support
