// polykvd's persisted pools (--state-dir): one pool file per published pool under
// <state-dir>/pools/<id>.pkv (ipc/pool_file.h), a disk budget with LRU eviction of files
// (last use = the file's mtime, so the order survives restarts), and quarantine of corrupt
// or truncated files under <state-dir>/quarantine/ (never served, never deleted silently; the
// reason is kept beside each file and listed by Quarantined()).
// Knows nothing of how pools are held in memory. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "polykv/ipc/pool_file.h"
#include "polykv/status.h"

namespace polykv::daemon {

/// The pool files of one state folder.
class PoolStore {
 public:
  /// Creates <dir>/pools and <dir>/quarantine (mode 0750) and scans the pool files:
  /// corrupt or truncated ones (kDataLoss) are moved to quarantine with a log line; files of
  /// a format this build does not read are skipped (left in place) with a log line; leftover
  /// temporary files of an interrupted write are removed. `budget_bytes` = 0: no bound.
  /// Errors: kPermissionDenied / kInternal when the folders cannot be made.
  [[nodiscard]] static StatusOr<std::unique_ptr<PoolStore>> Open(const std::string& dir,
                                                                 uint64_t budget_bytes);

  /// Persists a published pool (region `data`, `size` bytes) atomically, then evicts the
  /// least recently used other files until the total fits the budget. A pool larger than
  /// the whole budget is not written (kResourceExhausted). Errors from WritePoolFile.
  [[nodiscard]] Status Save(const ipc::PoolInfo& info, const void* data, uint64_t size);
  /// The manifest of a persisted pool by full id or unique prefix (>= 8 hex), if any. A
  /// full id not seen by the scan is looked up on disk (a file placed by `pools import`).
  std::optional<ipc::PoolFileManifest> Find(const std::string& id_or_prefix);
  /// Reads and verifies pool `id` into `dst` (see ipc::ReadPoolFileInto) and marks it used.
  /// A kDataLoss file is quarantined (and forgotten) before the error is returned.
  [[nodiscard]] Status ReadInto(const std::string& id, void* dst, uint64_t size);
  /// Deletes the file of pool `id`; false when there was none.
  bool Remove(const std::string& id);
  /// Marks pool `id` as used now (LRU order).
  void Touch(const std::string& id);
  /// Manifests of all persisted pools, least recently used first.
  std::vector<ipc::PoolFileManifest> List() const;

  /// A file in <dir>/quarantine/: "<id>.pkv.<unix ms>", with "<that>.why" beside it holding
  /// the reason (written when it was quarantined; files quarantined by older daemons have
  /// none).
  struct QuarantinedFile {
    std::string path;
    std::string id;      ///< from the file name (may not be a valid id: the name was wrong)
    std::string reason;  ///< the .why text, or "(no reason recorded)"
    int64_t when_unix_ms = 0;
    /// The manifest when it still reads (a file whose region, not manifest, was bad).
    std::optional<ipc::PoolInfo> info;
  };
  /// Every quarantined file, oldest first (Open scans the folder; later quarantines add to it).
  std::vector<QuarantinedFile> Quarantined() const;

  /// Bytes of all pool files (prelude + manifest + region).
  uint64_t bytes() const;
  size_t count() const;
  uint64_t budget_bytes() const { return budget_; }
  /// Files quarantined since Open (including during Open's scan).
  uint64_t quarantined() const;
  /// Files removed to stay within the budget since Open.
  uint64_t evicted_for_budget() const;
  const std::string& dir() const { return dir_; }
  /// Path of pool `id`'s file (whether or not it exists).
  std::string PathOf(const std::string& id) const;

 private:
  struct Entry {
    ipc::PoolFileManifest manifest;
    uint64_t file_bytes = 0;
    int64_t last_use_ns = 0;
  };
  PoolStore(std::string dir, uint64_t budget) : dir_(std::move(dir)), budget_(budget) {}
  /// Moves `path` to quarantine/ with `why` beside it; `info`: what its manifest said, when
  /// it was readable.
  void QuarantineLocked(const std::string& path, const std::string& why,
                        const ipc::PoolInfo* info = nullptr);
  void ScanQuarantineLocked();
  void EnforceBudgetLocked(const std::string& keep);
  std::optional<std::string> ResolveLocked(const std::string& id_or_prefix) const;

  const std::string dir_;
  const uint64_t budget_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;  // by full id
  std::vector<QuarantinedFile> quarantine_;
  uint64_t bytes_ = 0;
  uint64_t quarantined_ = 0;
  uint64_t evicted_ = 0;
};

}  // namespace polykv::daemon
