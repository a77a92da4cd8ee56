// polykvd's persisted pools (see pool_store.h).
#include "pool_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "locked.h"

namespace polykv::daemon {
namespace {

constexpr char kSuffix[] = ".pkv";
constexpr char kWhySuffix[] = ".why";

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Status MakeDir(const std::string& path) {
  if (mkdir(path.c_str(), 0750) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create state folder ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a folder"));
  }
  return absl::OkStatus();
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool IsHexId(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

StatusOr<std::unique_ptr<PoolStore>> PoolStore::Open(const std::string& dir_in,
                                                     uint64_t budget_bytes) {
  if (dir_in.empty()) return absl::InvalidArgumentError("state folder is empty");
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  POLYKV_RETURN_IF_ERROR(MakeDir(dir));
  POLYKV_RETURN_IF_ERROR(MakeDir(dir + "/pools"));
  POLYKV_RETURN_IF_ERROR(MakeDir(dir + "/quarantine"));
  std::unique_ptr<PoolStore> store(new PoolStore(dir, budget_bytes));
  std::lock_guard<std::mutex> lock(store->mu_);
  store->ScanQuarantineLocked();  // before the scan below adds to it
  const std::string pools = dir + "/pools";
  DIR* d = opendir(pools.c_str());
  if (d == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot read ", pools, ": ", std::strerror(errno)));
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) names.emplace_back(e->d_name);
  closedir(d);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    if (name == "." || name == "..") continue;
    const std::string path = pools + "/" + name;
    if (name.find(".tmp.") != std::string::npos) {
      spdlog::warn("state: removing {} (an interrupted write)", path);
      unlink(path.c_str());
      continue;
    }
    if (!EndsWith(name, kSuffix)) continue;
    const std::string id = name.substr(0, name.size() - (sizeof(kSuffix) - 1));
    if (struct stat ls; lstat(path.c_str(), &ls) == 0 && !S_ISREG(ls.st_mode)) {
      // A FIFO would block the start (its open waits for a writer), a symlink could lead
      // anywhere: neither is a pool file this daemon wrote.
      store->QuarantineLocked(path, "not a regular file");
      continue;
    }
    auto m = ipc::ReadPoolFileManifest(path);
    if (!m.ok() && m.status().code() == absl::StatusCode::kFailedPrecondition) {
      spdlog::warn("state: skipping {}: {}", path, std::string(m.status().message()));
      continue;
    }
    if (!m.ok() || !IsHexId(id) || m->info.id != id) {
      store->QuarantineLocked(
          path, m.ok() ? "its name and manifest id differ" : std::string(m.status().message()));
      continue;
    }
    struct stat st;
    if (stat(path.c_str(), &st) != 0) continue;
    Entry e;
    e.manifest = *std::move(m);
    e.file_bytes = static_cast<uint64_t>(st.st_size);
    e.last_use_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    store->bytes_ += e.file_bytes;
    store->entries_[id] = std::move(e);
  }
  spdlog::info("state: {} persisted pool(s), {} bytes in {}{}", store->entries_.size(),
               store->bytes_, pools,
               budget_bytes ? absl::StrCat(" (budget ", budget_bytes, " bytes)") : "");
  if (budget_bytes) store->EnforceBudgetLocked("");
  return store;
}

std::string PoolStore::PathOf(const std::string& id) const {
  return absl::StrCat(dir_, "/pools/", id, kSuffix);
}

void PoolStore::QuarantineLocked(const std::string& path, const std::string& why,
                                 const ipc::PoolInfo* info) {
  const size_t slash = path.rfind('/');
  const int64_t now_ms = NowNs() / 1000000;
  const std::string name = path.substr(slash + 1);
  const std::string target = absl::StrCat(dir_, "/quarantine/", name, ".", now_ms);
  if (rename(path.c_str(), target.c_str()) != 0) {
    spdlog::error("state: {} is unusable ({}) and cannot be moved to quarantine: {}; deleting it",
                  path, why, std::strerror(errno));
    unlink(path.c_str());
  } else {
    spdlog::error("state: quarantined {} -> {}: {}", path, target, why);
    // The reason beside the file, so that a restarted daemon (and an operator) still knows.
    const std::string why_path = target + kWhySuffix;
    const int fd = open(why_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    if (fd >= 0) {
      const std::string text = why + "\n";
      (void)!write(fd, text.data(), text.size());
      close(fd);
    }
    QuarantinedFile q;
    q.path = target;
    q.id = name.size() > sizeof(kSuffix) - 1 ? name.substr(0, name.size() - (sizeof(kSuffix) - 1))
                                             : name;
    q.reason = why;
    q.when_unix_ms = now_ms;
    if (info != nullptr) q.info = *info;  // a file whose region, not manifest, was bad
    quarantine_.push_back(std::move(q));
  }
  ++quarantined_;
}

void PoolStore::ScanQuarantineLocked() {
  const std::string folder = dir_ + "/quarantine";
  DIR* d = opendir(folder.c_str());
  if (d == nullptr) return;
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) names.emplace_back(e->d_name);
  closedir(d);
  for (const std::string& name : names) {
    if (name == "." || name == ".." || EndsWith(name, kWhySuffix)) continue;
    // "<id>.pkv.<unix ms>"
    const size_t pkv = name.rfind(std::string(kSuffix) + ".");
    if (pkv == std::string::npos) continue;
    QuarantinedFile q;
    q.path = folder + "/" + name;
    q.id = name.substr(0, pkv);
    q.when_unix_ms = std::atoll(name.c_str() + pkv + sizeof(kSuffix));
    q.reason = "(no reason recorded)";
    if (FILE* f = std::fopen((q.path + kWhySuffix).c_str(), "r")) {
      char buf[1024];
      const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
      std::fclose(f);
      std::string text(buf, n);
      while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
      if (!text.empty()) q.reason = text;
    }
    struct stat ls;
    if (lstat(q.path.c_str(), &ls) == 0 && S_ISREG(ls.st_mode)) {
      if (auto m = ipc::ReadPoolFileManifest(q.path); m.ok()) q.info = m->info;
    }
    quarantine_.push_back(std::move(q));
  }
  std::sort(quarantine_.begin(), quarantine_.end(),
            [](const QuarantinedFile& a, const QuarantinedFile& b) {
              return std::tie(a.when_unix_ms, a.path) < std::tie(b.when_unix_ms, b.path);
            });
  if (!quarantine_.empty()) {
    spdlog::warn("state: {} quarantined pool file(s) in {} (never served; see `pools list`)",
                 quarantine_.size(), folder);
  }
}

std::vector<PoolStore::QuarantinedFile> PoolStore::Quarantined() const {
  std::lock_guard<std::mutex> lock(mu_);
  return quarantine_;
}

std::optional<std::string> PoolStore::ResolveLocked(const std::string& id) const {
  if (entries_.count(id)) return id;
  if (id.size() < 8 || id.size() >= 64) return std::nullopt;
  std::optional<std::string> found;
  for (auto it = entries_.lower_bound(id); it != entries_.end() && it->first.rfind(id, 0) == 0;
       ++it) {
    if (found) return std::nullopt;  // ambiguous
    found = it->first;
  }
  return found;
}

std::optional<ipc::PoolFileManifest> PoolStore::Find(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto full = ResolveLocked(id);
    if (full) return entries_.at(*full).manifest;
  }
  if (!IsHexId(id)) return std::nullopt;
  // A file the scan did not see (`pools import`): read without the lock, so that a slow
  // read stalls only this caller.
  const std::string path = PathOf(id);
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return std::nullopt;
  auto m = ipc::ReadPoolFileManifest(path);
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = entries_.find(id); it != entries_.end()) return it->second.manifest;
  if (!m.ok() || m->info.id != id) {
    if (!m.ok() && m.status().code() == absl::StatusCode::kFailedPrecondition) {
      spdlog::warn("state: skipping {}: {}", path, std::string(m.status().message()));
    } else {
      QuarantineLocked(
          path, m.ok() ? "its name and manifest id differ" : std::string(m.status().message()));
    }
    return std::nullopt;
  }
  spdlog::info("state: found pool file {} (imported)", path);
  Entry e;
  e.manifest = *m;
  e.file_bytes = static_cast<uint64_t>(st.st_size);
  e.last_use_ns = NowNs();
  bytes_ += e.file_bytes;
  entries_[id] = std::move(e);
  EnforceBudgetLocked(id);
  return *m;
}

void PoolStore::EnforceBudgetLocked(const std::string& keep) {
  if (budget_ == 0) return;
  while (bytes_ > budget_) {
    auto victim = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->first == keep) continue;
      if (victim == entries_.end() || it->second.last_use_ns < victim->second.last_use_ns) {
        victim = it;
      }
    }
    if (victim == entries_.end()) return;
    spdlog::info(
        "state: removing pool file {} ({} bytes, least recently used) to stay within "
        "the disk budget of {} bytes",
        victim->first.substr(0, 16), victim->second.file_bytes, budget_);
    unlink(PathOf(victim->first).c_str());
    bytes_ -= victim->second.file_bytes;
    entries_.erase(victim);
    ++evicted_;
  }
}

Status PoolStore::Save(const ipc::PoolInfo& info, const void* data, uint64_t size) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = entries_.find(info.id);
        it != entries_.end() && it->second.manifest.pool_bytes == size) {
      it->second.last_use_ns = NowNs();  // already on disk (a restored pool)
      return absl::OkStatus();
    }
    if (budget_ > 0 && size + ipc::kPoolFilePrelude > budget_) {
      return absl::ResourceExhaustedError(absl::StrCat("pool ", info.id.substr(0, 16), " (", size,
                                                       " bytes) exceeds the disk budget of ",
                                                       budget_, " bytes; not persisted"));
    }
  }
  // The write runs unlocked (it may take a while); the id is content-addressed, so two
  // writers of one id write the same bytes and the last rename wins harmlessly.
  ipc::PoolInfo stored = info;
  stored.leases = 0;
  stored.state.clear();  // where a pool is depends on the daemon that reads the file
  stored.state_detail.clear();
  const std::string path = PathOf(info.id);
  POLYKV_RETURN_IF_ERROR(ipc::WritePoolFile(path, stored, data, size));
  auto m = ipc::ReadPoolFileManifest(path);
  if (!m.ok()) return m.status();
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::InternalError(absl::StrCat("stat ", path, ": ", std::strerror(errno)));
  }
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entries_[info.id];
  bytes_ -= e.file_bytes;
  e.manifest = *std::move(m);
  e.file_bytes = static_cast<uint64_t>(st.st_size);
  e.last_use_ns = NowNs();
  bytes_ += e.file_bytes;
  EnforceBudgetLocked(info.id);
  return absl::OkStatus();
}

Status PoolStore::ReadInto(const std::string& id, void* dst, uint64_t size) {
  ipc::PoolFileManifest m;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) {
      return absl::NotFoundError(absl::StrCat("pool ", id.substr(0, 16), " is not persisted"));
    }
    m = it->second.manifest;
  }
  const std::string path = PathOf(id);
  Status s = ipc::ReadPoolFileInto(path, m, dst, size);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (s.code() == absl::StatusCode::kDataLoss) {
    QuarantineLocked(path, std::string(s.message()), &m.info);
    if (it != entries_.end()) {
      bytes_ -= it->second.file_bytes;
      entries_.erase(it);
    }
    return s;
  }
  if (s.ok() && it != entries_.end()) {
    it->second.last_use_ns = NowNs();
    (void)utimensat(AT_FDCWD, path.c_str(), nullptr, 0);
  }
  return s;
}

bool PoolStore::Remove(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  unlink(PathOf(id).c_str());
  bytes_ -= it->second.file_bytes;
  entries_.erase(it);
  spdlog::info("state: removed pool file {}", id.substr(0, 16));
  return true;
}

void PoolStore::Touch(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  it->second.last_use_ns = NowNs();
  (void)utimensat(AT_FDCWD, PathOf(id).c_str(), nullptr, 0);
}

std::vector<ipc::PoolFileManifest> PoolStore::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<int64_t, const ipc::PoolFileManifest*>> v;
  for (const auto& [id, e] : entries_) v.emplace_back(e.last_use_ns, &e.manifest);
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<ipc::PoolFileManifest> out;
  for (const auto& [t, m] : v) out.push_back(*m);
  return out;
}

uint64_t PoolStore::bytes() const { return ReadLocked(mu_, bytes_); }
size_t PoolStore::count() const {
  return ReadLockedBy(mu_, [&] { return entries_.size(); });
}
uint64_t PoolStore::quarantined() const { return ReadLocked(mu_, quarantined_); }
uint64_t PoolStore::evicted_for_budget() const { return ReadLocked(mu_, evicted_); }

}  // namespace polykv::daemon
