// PoolManager's bridge to the state folder (see pool_manager.h, pool_store.h): publishing a
// pool from its file (or from bytes a peer sent: PublishFilled), restoring a pool and its
// parent chain on demand or at --preload, and the Catalog of pools in memory, on disk and
// quarantined.
#include <spdlog/spdlog.h>

#include <chrono>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "pool_manager_internal.h"

namespace polykv::daemon {

namespace {

ipc::PoolInfo DiskInfo(const ipc::PoolFileManifest& m, const PoolStore& store) {
  ipc::PoolInfo info = m.info;
  info.leases = 0;
  info.backend.clear();  // in no memory until it is restored
  info.state = "disk";
  info.state_detail = store.PathOf(m.info.id);
  return info;
}

ipc::PoolInfo QuarantinedInfo(const PoolStore::QuarantinedFile& q) {
  ipc::PoolInfo info;
  if (q.info) info = *q.info;
  if (info.id.empty()) info.id = q.id;
  info.leases = 0;
  info.backend.clear();
  info.state = "quarantined";
  info.state_detail = absl::StrCat(q.reason, " (", q.path, ")");
  return info;
}

}  // namespace

std::vector<ipc::PoolInfo> PoolManager::Catalog() const {
  // The files first, then the pools in memory: a pool restored in between is then shown
  // once, in memory (the later look).
  std::vector<ipc::PoolFileManifest> files;
  std::vector<PoolStore::QuarantinedFile> quarantined;
  if (options_.store) {
    files = options_.store->List();
    quarantined = options_.store->Quarantined();
  }
  std::vector<ipc::PoolInfo> out = List();
  std::set<std::string> held;
  for (ipc::PoolInfo& info : out) {
    held.insert(info.id);
    info.state = "memory";
  }
  for (const ipc::PoolFileManifest& m : files) {
    if (held.count(m.info.id)) continue;
    out.push_back(DiskInfo(m, *options_.store));
  }
  for (const PoolStore::QuarantinedFile& q : quarantined) out.push_back(QuarantinedInfo(q));
  return out;
}

StatusOr<ipc::PoolInfo> PoolManager::Describe(const std::string& pool_id) const {
  StatusOr<ipc::PoolInfo> info = Info(pool_id);
  if (info.ok()) {
    info->state = "memory";
    return info;
  }
  if (info.status().code() != absl::StatusCode::kNotFound || !options_.store) return info;
  if (pool_id.size() < 8) return info;
  if (auto m = options_.store->Find(pool_id)) return DiskInfo(*m, *options_.store);
  // The newest quarantined file of that id (or unique prefix of one).
  std::optional<PoolStore::QuarantinedFile> found;
  for (const PoolStore::QuarantinedFile& q : options_.store->Quarantined()) {
    if (q.id.rfind(pool_id, 0) != 0) continue;
    if (found && found->id != q.id) {
      return absl::InvalidArgumentError(absl::StrCat("pool id prefix ", pool_id, " is ambiguous"));
    }
    found = q;
  }
  if (found) return QuarantinedInfo(*found);
  return info;
}

StatusOr<CreateResult> PoolManager::Restore(const ipc::PoolFileManifest& m) {
  return PublishFilled(m.info, m.pool_bytes, "state", [&](void* dst, uint64_t size) {
    return options_.store->ReadInto(m.info.id, dst, size);
  });
}

StatusOr<CreateResult> PoolManager::PublishFilled(const ipc::PoolInfo& source_info, uint64_t needed,
                                                  const std::string& origin, const FillFn& fill) {
  const std::string& pool_id = source_info.id;
  const bool from_state = origin == "state";
  auto t0 = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_.load()) return absl::CancelledError("polykvd is shutting down");
  }
  // Reserved, allocated and sealed exactly as Build does; every way out before the publish
  // gives the memory back.
  Pool pool;
  Reservation reservation(this, needed, &pool);
  POLYKV_RETURN_IF_ERROR(reservation.Acquire(
      absl::StrCat(from_state ? "persisted" : "replicated", " pool ", pool_id.substr(0, 16))));
  if (Status s = FillPublished(source_info, needed, from_state, fill, &pool); !s.ok()) {
    spdlog::warn("{} of pool {} failed: {}", from_state ? "restore" : "replication",
                 pool_id.substr(0, 16), s.ToString());
    return s;
  }
  pool.info = source_info;
  pool.info.origin = origin;
  if (pool.info.fidelity_layers == 0 && pool.region.has_value()) {
    // A manifest written before fidelity was recorded: the header may still hold it.
    if (auto reader = ipc::PoolReader::Open(pool.region->data(), pool.region->size(), false);
        reader.ok()) {
      std::vector<float> k, v;
      for (const ipc::LayerFidelity& f : reader->RecordedFidelity()) {
        k.push_back(static_cast<float>(f.key_rel_mse));
        v.push_back(static_cast<float>(f.value_rel_mse));
      }
      SetFidelity(k, v, &pool.info);
    }
  }
  pool.info.backend = std::string(ipc::PoolMemoryName(pool.memory.backend));
  pool.info.leases = 0;
  CreateResult result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_.load()) return absl::CancelledError("polykvd is shutting down");
    pool.info.publish_ms = MsSince(t0);
    pool.seq = ++seq_;
    if (from_state)
      ++restored_;
    else
      ++replicated_;
    auto [it, inserted] = pools_.emplace(pool_id, std::move(pool));
    POLYKV_CHECK(inserted);
    reservation.Dismiss();  // the bytes are the published pool's now
    result.info = InfoLocked(it->second);
    result.created = true;
    result.restored = from_state;
    result.replicated = !from_state;
  }
  spdlog::info("{} pool {} from {} ({}, {} tokens, {} bytes) in {:.1f} ms",
               from_state ? "restored" : "replicated", pool_id.substr(0, 16),
               from_state ? options_.store->PathOf(pool_id) : origin, result.info.codec,
               result.info.tokens, needed, result.info.publish_ms);
  return result;
}

Status PoolManager::FillPublished(const ipc::PoolInfo& source_info, uint64_t needed,
                                  bool from_state, const FillFn& fill, Pool* pool) {
  const std::string& pool_id = source_info.id;
  std::vector<uint8_t> staging;
  POLYKV_ASSIGN_OR_RETURN(
      void* base, AllocatePoolMemory(pool_id, needed, options_.backend == ipc::PoolMemory::kCuda,
                                     pool, &staging));
  // The state folder verifies the file's checksums and the pool (PoolReader::Open with the
  // payload check; a corrupt file is quarantined); a replica is verified here.
  POLYKV_RETURN_IF_ERROR(fill(base, needed));
  if (!from_state) {
    POLYKV_RETURN_IF_ERROR(CheckReplica(source_info, base, needed));
    if (options_.store) {
      // Persisted like a pool built here, so a restart restores it instead of fetching again.
      if (Status s = options_.store->Save(source_info, base, needed); !s.ok()) {
        spdlog::warn("replica of pool {} is not persisted: {}", pool_id.substr(0, 16),
                     s.ToString());
      }
    }
  }
  return SealPoolMemory(needed, staging, "restore", pool);
}

Status PoolManager::CheckReplica(const ipc::PoolInfo& source_info, const void* base,
                                 uint64_t needed) {
  const std::string& pool_id = source_info.id;
  auto reader = ipc::PoolReader::Open(base, needed, /*verify_payload=*/true);
  if (!reader.ok()) {
    return Status(absl::StatusCode::kDataLoss,
                  absl::StrCat("replica of pool ", pool_id.substr(0, 16),
                               " does not verify: ", reader.status().message()));
  }
  const std::string header_id = absl::BytesToHexString(absl::string_view(
      reinterpret_cast<const char*>(reader->header().pool_id), sizeof(reader->header().pool_id)));
  if (header_id != pool_id || reader->params().tokens != source_info.tokens ||
      reader->params().parent_id != source_info.parent ||
      reader->params().model_fingerprint != source_info.model_fingerprint) {
    return Status(absl::StatusCode::kDataLoss,
                  absl::StrCat("replica of pool ", pool_id.substr(0, 16),
                               " holds another pool than announced (header id ",
                               header_id.substr(0, 16), ", ", reader->params().tokens, " tokens)"));
  }
  return absl::OkStatus();
}

StatusOr<ipc::PoolInfo> PoolManager::RestorePersisted(const std::string& id_or_prefix, int depth) {
  if (!options_.store) return absl::NotFoundError("polykvd runs without a state folder");
  std::optional<ipc::PoolFileManifest> m = options_.store->Find(id_or_prefix);
  if (!m)
    return absl::NotFoundError(absl::StrCat("unknown pool ", ipc::Abbreviate(id_or_prefix, 64)));
  const std::string id = m->info.id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_.load()) return absl::CancelledError("polykvd is shutting down");
    if (auto it = pools_.find(id); it != pools_.end()) return InfoLocked(it->second);
  }
  if (!m->info.parent.empty()) {
    // A child pool (pool tree) is served only with its parent chain.
    bool published = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      published = pools_.count(m->info.parent) > 0;
    }
    if (!published && depth >= 64) {
      return absl::FailedPreconditionError(
          absl::StrCat("persisted pool ", id.substr(0, 16), ": parent chain deeper than 64"));
    }
    if (!published) {
      auto parent = RestorePersisted(m->info.parent, depth + 1);
      if (!parent.ok()) {
        spdlog::error(
            "state: pool {} needs its parent pool {}, which is not available ({}); "
            "not served",
            id.substr(0, 16), m->info.parent.substr(0, 16), std::string(parent.status().message()));
        return absl::FailedPreconditionError(absl::StrCat(
            "persisted pool ", id.substr(0, 16), " needs its parent pool ",
            m->info.parent.substr(0, 16), ", which is not available: ", parent.status().message()));
      }
    }
  }
  POLYKV_RETURN_IF_ERROR(
      CheckServableModel(m->info, absl::StrCat("persisted pool ", id.substr(0, 16))));
  // Join a create or restore of the same pool in progress.
  std::shared_ptr<InFlight> flight;
  POLYKV_ASSIGN_OR_RETURN(std::optional<ipc::PoolInfo> existing, JoinOrRegisterFlight(id, &flight));
  if (existing) return *existing;
  auto result = Restore(*m);
  FinishFlight(id, flight, result.ok() ? absl::OkStatus() : result.status());
  if (!result.ok()) return result.status();
  return result->info;
}

int PoolManager::PreloadPersisted() {
  if (!options_.store) return 0;
  std::vector<ipc::PoolFileManifest> all = options_.store->List();
  int n = 0;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    auto r = RestorePersisted(it->info.id);
    if (r.ok()) {
      ++n;
    } else if (r.status().code() == absl::StatusCode::kResourceExhausted) {
      spdlog::warn("preload stops at the memory cap: {}", std::string(r.status().message()));
      break;
    }
  }
  return n;
}

}  // namespace polykv::daemon
