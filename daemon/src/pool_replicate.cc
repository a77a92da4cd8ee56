// PoolManager and the peer daemons (see pool_manager.h, peers.h): Replicate pulls a pool this
// daemon lacks from a peer (parent chain first), ExportForPeer holds one for a peer's pull.
#include <fcntl.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "pool_manager_internal.h"

namespace polykv::daemon {

StatusOr<CreateResult> PoolManager::Replicate(const std::string& pool_id,
                                              const std::atomic<bool>* cancel,
                                              const ProgressFn& progress, int depth) {
  constexpr int kMaxTreeDepth = 64;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_.load()) return absl::CancelledError("polykvd is shutting down");
    if (auto id = ResolvePoolIdLocked(pool_id); id.ok()) {
      CreateResult r;
      r.info = InfoLocked(pools_.at(*id));
      return r;
    } else if (id.status().code() != absl::StatusCode::kNotFound) {
      return id.status();
    }
  }
  if (options_.store && options_.store->Find(pool_id)) {
    POLYKV_ASSIGN_OR_RETURN(ipc::PoolInfo info, RestorePersisted(pool_id));
    CreateResult r;
    r.info = info;
    r.restored = true;
    return r;
  }
  if (options_.peers == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown pool ", ipc::Abbreviate(pool_id, 64),
                                            " (and no peer daemons are configured)"));
  }
  // A full id joins a replication of the same pool at once; a prefix once a peer named it.
  std::shared_ptr<InFlight> flight;
  std::string id;
  auto published = [](const ipc::PoolInfo& info) {
    CreateResult r;
    r.info = info;
    return r;
  };
  if (IsFullPoolId(pool_id)) {
    id = pool_id;
    POLYKV_ASSIGN_OR_RETURN(std::optional<ipc::PoolInfo> existing,
                            JoinOrRegisterFlight(id, &flight));
    if (existing) return published(*existing);
  }
  auto finish = [&](StatusOr<CreateResult> r) -> StatusOr<CreateResult> {
    if (flight) FinishFlight(id, flight, r.ok() ? absl::OkStatus() : r.status());
    return r;
  };
  auto offer = options_.peers->Find(pool_id);
  if (!offer.ok()) return finish(offer.status());
  struct ReleaseOnExit {
    PeerSource* peers;
    const PeerSource::Offer* offer;
    ~ReleaseOnExit() { peers->Release(*offer); }
  } release_on_exit{options_.peers, &*offer};
  if (!IsFullPoolId(offer->info.id) || (!id.empty() && offer->info.id != id)) {
    return finish(absl::DataLossError(absl::StrCat("peer ", offer->peer, " answered for pool ",
                                                   ipc::Abbreviate(pool_id, 64), " with pool id \"",
                                                   ipc::Abbreviate(offer->info.id, 64), "\"")));
  }
  if (id.empty()) {
    id = offer->info.id;
    POLYKV_ASSIGN_OR_RETURN(std::optional<ipc::PoolInfo> existing,
                            JoinOrRegisterFlight(id, &flight));
    if (existing) return published(*existing);
  }
  const std::string what = absl::StrCat("peer pool ", id.substr(0, 16), " from ", offer->peer);
  if (!offer->info.parent.empty()) {
    // A child pool (pool tree) is served only with its parent chain: replicate it first.
    if (depth >= kMaxTreeDepth) {
      return finish(absl::FailedPreconditionError(
          absl::StrCat(what, ": parent chain deeper than ", kMaxTreeDepth)));
    }
    auto parent = Replicate(offer->info.parent, cancel, progress, depth + 1);
    if (!parent.ok()) {
      return finish(Status(parent.status().code(), absl::StrCat(what, " needs its parent pool ",
                                                                offer->info.parent.substr(0, 16),
                                                                ": ", parent.status().message())));
    }
  }
  if (Status s = CheckServableModel(offer->info, what); !s.ok()) return finish(s);
  if (Cancelled(cancel)) return finish(absl::CancelledError("the fetch was cancelled"));
  const auto t0 = Clock::now();
  auto result = PublishFilled(
      offer->info, offer->pool_bytes, "peer " + offer->peer, [&](void* dst, uint64_t size) {
        return options_.peers->Pull(*offer, dst, size, cancel, [&](uint64_t done, uint64_t total) {
          if (progress) {
            progress("fetch", static_cast<int64_t>(done), static_cast<int64_t>(total));
          }
        });
      });
  if (result.ok()) {
    const double ms = MsSince(t0);
    spdlog::info("fetched pool {} ({} bytes) from {} in {:.1f} ms ({:.1f} MB/s)", id.substr(0, 16),
                 offer->pool_bytes, offer->peer, ms, ms > 0 ? offer->pool_bytes / (ms * 1e3) : 0.0);
  }
  return finish(std::move(result));
}

namespace {

// The first `size` bytes of a pool in GPU memory (`src`) read back into out->staging, logged.
Status StageForPeer(const ipc::CudaArena& src, uint64_t size, PoolExport* out) {
  try {
    out->staging.resize(size);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("no host memory to stage pool ",
                                                     out->info.id.substr(0, 16), " (", size,
                                                     " bytes) for a peer"));
  }
  POLYKV_RETURN_IF_ERROR(src.CopyToHost(0, out->staging.data(), size));
  spdlog::info("pool {} ({} bytes) read back from GPU memory to send it to a peer",
               out->info.id.substr(0, 16), size);
  return absl::OkStatus();
}

}  // namespace

StatusOr<PoolExport> PoolManager::ExportForPeer(const std::string& pool_id) const {
  ipc::UniqueFd fd;
  PoolExport out;
  uint64_t size = 0;
  std::optional<ipc::CudaArena> device_copy;  // a pool in GPU memory, copied under the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    POLYKV_ASSIGN_OR_RETURN(std::string id, ResolvePoolIdLocked(pool_id));
    const Pool& pool = pools_.at(id);
    if (!pool.region) {
      if (!pool.arena) {
        return absl::InternalError(absl::StrCat("pool ", id.substr(0, 16), " holds no memory"));
      }
      // A pool in GPU memory: copied device to device under the lock (fast; an evict cannot
      // pull it away), staged through host memory after it (the requester publishes it on
      // its own backend, CopyFromHost for a CUDA one). Without device memory for the copy,
      // staged under the lock.
      size = pool.memory.size;
      out.info = InfoLocked(pool);
      StatusOr<ipc::CudaArena> copy = pool.arena->Clone(size);
      if (copy.ok()) {
        device_copy.emplace(*std::move(copy));
      } else if (copy.status().code() == absl::StatusCode::kResourceExhausted) {
        POLYKV_RETURN_IF_ERROR(StageForPeer(*pool.arena, size, &out));
        return out;
      } else {
        return copy.status();
      }
    } else {
      const int dup = fcntl(pool.region->fd(), F_DUPFD_CLOEXEC, 0);
      if (dup < 0)
        return absl::InternalError(absl::StrCat("dup of pool memfd: ", std::strerror(errno)));
      fd = ipc::UniqueFd(dup);
      size = pool.region->size();
      out.info = InfoLocked(pool);
    }
  }
  if (device_copy) {
    POLYKV_RETURN_IF_ERROR(StageForPeer(*device_copy, size, &out));
    return out;
  }
  POLYKV_ASSIGN_OR_RETURN(ipc::SealedRegion map, ipc::SealedRegion::MapSealed(std::move(fd), size));
  out.map.emplace(std::move(map));
  return out;
}

}  // namespace polykv::daemon
