// PoolManager's leases and evictions (see pool_manager.h): pool ids and prefixes, attach,
// renew, detach and expiry (indexed by expiry time, counted per pool), the descriptor of a
// leased pool, evicting a pool or a whole subtree, and the published pools' descriptions.
#include <fcntl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pool_manager_internal.h"

namespace polykv::daemon {

std::vector<std::string> PoolManager::ChildrenLocked(const std::string& id) const {
  std::vector<std::string> out;
  for (const auto& [child, pool] : pools_) {
    if (pool.info.parent == id) out.push_back(child);
  }
  return out;
}

int PoolManager::EvictTreeLocked(const std::string& id, std::vector<std::string>* files) {
  int n = 0;
  for (const std::string& child : ChildrenLocked(id)) n += EvictTreeLocked(child, files);
  auto pool = pools_.find(id);
  if (pool == pools_.end()) return n;
  uint32_t invalidated = 0;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.pool_id == id) {
      evicted_leases_.insert(it->first);
      auto next = std::next(it);
      EraseLeaseLocked(it);
      it = next;
      ++invalidated;
    } else {
      ++it;
    }
  }
  used_ -= pool->second.info.total_bytes;
  pools_.erase(pool);  // closes the memfd (agents' mappings stay valid) / frees device memory
  if (options_.store) files->push_back(id);  // removed by the caller, without mu_
  spdlog::info(
      "evicted pool {}{}", id.substr(0, 16),
      invalidated > 0 ? absl::StrCat(" (forced, ", invalidated, " lease(s) invalidated)") : "");
  return n + 1;
}

StatusOr<std::string> PoolManager::ResolvePoolIdLocked(const std::string& id) const {
  if (id.empty()) return absl::InvalidArgumentError("pool id is empty");
  if (id.size() > 64 || !IsHex(id)) {
    return absl::NotFoundError(absl::StrCat("unknown pool ", ipc::Abbreviate(id, 64),
                                            " (a pool id is up to 64 lowercase hex chars)"));
  }
  if (pools_.count(id)) return id;
  if (id.size() >= 8 && id.size() < 64) {
    std::string found;
    for (auto it = pools_.lower_bound(id); it != pools_.end() && it->first.rfind(id, 0) == 0;
         ++it) {
      if (!found.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("pool id prefix ", id, " is ambiguous"));
      }
      found = it->first;
    }
    if (!found.empty()) return found;
  }
  if (id.size() < 8) {
    return absl::NotFoundError(absl::StrCat(
        "unknown pool ", id, " (a prefix names a pool only with 8 or more hex chars)"));
  }
  return absl::NotFoundError(absl::StrCat("unknown pool ", id));
}

void PoolManager::EraseLeaseLocked(std::map<std::string, Lease>::iterator it) {
  if (auto p = pools_.find(it->second.pool_id); p != pools_.end() && p->second.leases > 0) {
    --p->second.leases;
  }
  expiry_.erase(it->second.expiry);
  leases_.erase(it);
}

void PoolManager::DropExpiredLeasesLocked() {
  const auto now = Clock::now();
  while (!expiry_.empty() && expiry_.begin()->first <= now) {
    auto lease = leases_.find(expiry_.begin()->second);
    if (lease == leases_.end()) {  // cannot happen: the two maps move together
      expiry_.erase(expiry_.begin());
      continue;
    }
    spdlog::debug("lease {} on pool {} (pid {}) expired", lease->first.substr(0, 8),
                  lease->second.pool_id.substr(0, 16), lease->second.client_pid);
    EraseLeaseLocked(lease);
    ++expired_unreported_;
  }
}

ipc::PoolInfo PoolManager::InfoLocked(const Pool& pool) const {
  ipc::PoolInfo info = pool.info;
  info.leases = pool.leases;
  return info;
}

StatusOr<LeaseGrant> PoolManager::Attach(const std::string& pool_id, uint32_t client_pid) {
  if (options_.store) {
    // Lazy restore: a pool persisted by an earlier daemon is published on first attach.
    bool published;
    {
      std::lock_guard<std::mutex> lock(mu_);
      published = ResolvePoolIdLocked(pool_id).ok();
    }
    if (!published && options_.store->Find(pool_id)) {
      POLYKV_RETURN_IF_ERROR(RestorePersisted(pool_id).status());
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  DropExpiredLeasesLocked();
  POLYKV_ASSIGN_OR_RETURN(std::string id, ResolvePoolIdLocked(pool_id));
  Pool& pool = pools_.at(id);
  LeaseGrant g;
  g.lease_id = RandomLeaseId();
  g.lease_ms = options_.lease_ms;
  const auto expires = Clock::now() + std::chrono::milliseconds(options_.lease_ms);
  Lease lease{id, expiry_.emplace(expires, g.lease_id), client_pid};
  leases_.emplace(g.lease_id, std::move(lease));
  ++pool.leases;
  g.expires_unix_ms = UnixMs() + options_.lease_ms;
  g.info = InfoLocked(pool);
  g.memory = pool.memory;
  return g;
}

StatusOr<LeaseGrant> PoolManager::Renew(const std::string& lease_id) {
  std::lock_guard<std::mutex> lock(mu_);
  DropExpiredLeasesLocked();
  const std::string shown = ipc::Abbreviate(lease_id, 64);
  if (evicted_leases_.count(lease_id)) {
    return absl::NotFoundError(absl::StrCat("lease ", shown, ": pool evicted"));
  }
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown or expired lease ", shown));
  }
  expiry_.erase(it->second.expiry);
  it->second.expiry =
      expiry_.emplace(Clock::now() + std::chrono::milliseconds(options_.lease_ms), lease_id);
  LeaseGrant g;
  g.lease_id = lease_id;
  g.lease_ms = options_.lease_ms;
  g.expires_unix_ms = UnixMs() + options_.lease_ms;
  if (auto p = pools_.find(it->second.pool_id); p != pools_.end()) {
    g.info = InfoLocked(p->second);
    g.memory = p->second.memory;
  }
  return g;
}

Status PoolManager::Detach(const std::string& lease_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (evicted_leases_.erase(lease_id)) return absl::OkStatus();  // pool already gone
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    return absl::NotFoundError(
        absl::StrCat("unknown or expired lease ", ipc::Abbreviate(lease_id, 64)));
  }
  EraseLeaseLocked(it);
  return absl::OkStatus();
}

StatusOr<ipc::UniqueFd> PoolManager::PoolFd(const std::string& lease_id) {
  std::lock_guard<std::mutex> lock(mu_);
  DropExpiredLeasesLocked();
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    if (evicted_leases_.count(lease_id)) return absl::NotFoundError("pool evicted");
    return absl::NotFoundError("unknown or expired lease");
  }
  auto p = pools_.find(it->second.pool_id);
  if (p == pools_.end()) return absl::NotFoundError("pool evicted");
  if (!p->second.region) {
    return absl::FailedPreconditionError("the pool is not a host pool (no descriptor to hand out)");
  }
  int fd = fcntl(p->second.region->fd(), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("dup pool descriptor: ", std::strerror(errno)));
  }
  return ipc::UniqueFd(fd);
}

Status PoolManager::Evict(const std::string& pool_id, bool force) {
  // The state folder is read before the pool lock is taken (a slow disk must not stall every
  // other request): the manifests of all pool files, and the file of `pool_id` itself for a
  // pool that is only on disk. Files are removed after the lock is released.
  std::vector<ipc::PoolFileManifest> files;
  std::optional<ipc::PoolFileManifest> on_disk;
  if (options_.store) {
    bool published = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      published = ResolvePoolIdLocked(pool_id).ok();
    }
    if (!published) on_disk = options_.store->Find(pool_id);
    files = options_.store->List();
  }
  std::vector<std::string> remove;  // pool files to delete once mu_ is released
  Status s = EvictLocked(pool_id, force, files, on_disk, &remove);
  for (const std::string& id : remove) options_.store->Remove(id);
  return s;
}

Status PoolManager::EvictLocked(const std::string& pool_id, bool force,
                                const std::vector<ipc::PoolFileManifest>& files,
                                const std::optional<ipc::PoolFileManifest>& on_disk,
                                std::vector<std::string>* remove) {
  std::lock_guard<std::mutex> lock(mu_);
  DropExpiredLeasesLocked();
  auto resolved = ResolvePoolIdLocked(pool_id);
  if (!resolved.ok()) {
    // A pool that is only on disk (not restored since the restart): remove its file.
    if (resolved.status().code() != absl::StatusCode::kNotFound || !on_disk) {
      return resolved.status();
    }
  }
  const std::string id = resolved.ok() ? *resolved : on_disk->info.id;
  // Its descendants: in memory, and persisted ones not restored since the restart.
  std::vector<std::string> children = ChildrenLocked(id);
  std::map<std::string, std::vector<std::string>> disk_children;  // parent -> children
  for (const ipc::PoolFileManifest& m : files) {
    if (!m.info.parent.empty() && pools_.count(m.info.id) == 0) {
      disk_children[m.info.parent].push_back(m.info.id);
    }
  }
  std::vector<std::string> disk_tree;  // persisted-only descendants of id
  for (std::vector<std::string> todo = {id}; !todo.empty();) {
    const std::string p = todo.back();
    todo.pop_back();
    for (const std::string& c : disk_children[p]) {
      disk_tree.push_back(c);
      todo.push_back(c);
    }
    for (const std::string& c : ChildrenLocked(p)) todo.push_back(c);
  }
  const size_t child_count = children.size() + disk_children[id].size();
  if (child_count > 0 && !force) {
    std::vector<std::string> names;
    for (const std::string& c : children) names.push_back(c.substr(0, 16));
    for (const std::string& c : disk_children[id]) names.push_back(c.substr(0, 16));
    return absl::FailedPreconditionError(
        absl::StrCat("pool ", id.substr(0, 16), " has ", child_count, " child pool(s) (",
                     absl::StrJoin(names, ", "),
                     "): evict them first, or evict with force to drop the whole subtree"));
  }
  if (resolved.ok()) {
    const uint32_t live = pools_.find(id)->second.leases;
    if (live > 0 && !force) {
      return absl::FailedPreconditionError(absl::StrCat(
          "pool ", id.substr(0, 16), " has ", live, " live lease(s); evict with force to drop it"));
    }
  }
  for (const std::string& c : disk_tree) {
    remove->push_back(c);
    spdlog::info("evicted persisted pool {} (child of an evicted pool)", c.substr(0, 16));
  }
  if (!resolved.ok()) {
    remove->push_back(id);
    spdlog::info("evicted persisted pool {}", id.substr(0, 16));
    return absl::OkStatus();
  }
  EvictTreeLocked(id, remove);
  return absl::OkStatus();
}

int PoolManager::SweepExpiredLeases() {
  std::lock_guard<std::mutex> lock(mu_);
  DropExpiredLeasesLocked();
  const uint64_t n = expired_unreported_;
  expired_unreported_ = 0;
  // One line per sweep, however many leases a burst of dead agents left behind.
  if (n > 0) spdlog::info("{} lease(s) expired (not renewed); {} live", n, leases_.size());
  // Bound the memory of invalidated-lease records.
  if (evicted_leases_.size() > 65536) evicted_leases_.clear();
  return static_cast<int>(n);
}

std::vector<ipc::PoolInfo> PoolManager::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  const_cast<PoolManager*>(this)->DropExpiredLeasesLocked();
  std::vector<std::pair<int64_t, ipc::PoolInfo>> v;
  for (const auto& [id, pool] : pools_) v.emplace_back(pool.seq, InfoLocked(pool));
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<ipc::PoolInfo> out;
  for (auto& [seq, info] : v) out.push_back(std::move(info));
  return out;
}

StatusOr<ipc::PoolInfo> PoolManager::Info(const std::string& pool_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const_cast<PoolManager*>(this)->DropExpiredLeasesLocked();
  POLYKV_ASSIGN_OR_RETURN(std::string id, ResolvePoolIdLocked(pool_id));
  return InfoLocked(pools_.at(id));
}

std::map<std::string, uint32_t> PoolManager::AgentsByPool() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, std::set<uint32_t>> pids;
  const auto now = Clock::now();
  for (const auto& [lid, lease] : leases_) {
    if (lease.expiry->first > now) pids[lease.pool_id].insert(lease.client_pid);
  }
  std::map<std::string, uint32_t> out;
  for (const auto& [id, pool] : pools_) {
    auto it = pids.find(id);
    out[id] = it == pids.end() ? 0 : static_cast<uint32_t>(it->second.size());
  }
  return out;
}

}  // namespace polykv::daemon
