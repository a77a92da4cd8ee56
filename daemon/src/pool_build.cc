// PoolManager::Build (see pool_manager.h): hold the model, reserve memory against the cap,
// allocate the region, prefill, encode every layer, seal, persist and publish; and the parent
// chain a child pool is prefilled after.
#include <fcntl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "polykv/kernels/device_ops.h"
#include "pool_manager_internal.h"

namespace polykv::daemon {

namespace {

/// Logs why a create failed after its memory was reserved, and returns `why`.
Status CreateFailed(const std::string& pool_id, Status why) {
  if (why.code() == absl::StatusCode::kCancelled) {
    spdlog::info("create of pool {} cancelled", pool_id.substr(0, 16));
  } else {
    spdlog::warn("create of pool {} failed: {}", pool_id.substr(0, 16), why.ToString());
  }
  return why;
}

}  // namespace

StatusOr<CreateResult> PoolManager::Build(const std::string& model_name, ModelEntry* entry,
                                          const std::string& pool_id, const ipc::PoolParams& params,
                                          const std::vector<int32_t>& ids,
                                          const ProgressFn& progress,
                                          const std::atomic<bool>* cancel, ParentChain* chain) {
  POLYKV_ASSIGN_OR_RETURN(ipc::PoolLayout layout, ipc::ComputePoolLayout(params));

  // Hold the model first (one forward pass at a time): memory is reserved only by the
  // create that is about to prefill, never by creates waiting their turn.
  RunSlot run(entry);
  POLYKV_RETURN_IF_ERROR(run.Acquire(*this, cancel));
  if (Cancelled(cancel)) return absl::CancelledError("polykvd is shutting down");

  // Reserve memory against the cap; every way out before the publish gives it back.
  PendingPool p(pool_id, params, layout, options_.backend);
  Reservation reservation(this, p.needed, &p.pool);
  POLYKV_RETURN_IF_ERROR(reservation.Acquire());

  if (Status s = FillPool(entry, ids, progress, cancel, chain, &run, &p); !s.ok()) {
    return CreateFailed(pool_id, std::move(s));
  }
  p.Describe(model_name);
  PersistPool(&p);
  return PublishPool(&p, &reservation, progress, cancel, chain);
}

Status PoolManager::FillPool(ModelEntry* entry, const std::vector<int32_t>& ids,
                             const ProgressFn& progress, const std::atomic<bool>* cancel,
                             ParentChain* chain, RunSlot* run, PendingPool* p) {
  POLYKV_RETURN_IF_ERROR(AllocateRegion(p));
  Clock::time_point t_encode;
  {
    POLYKV_ASSIGN_OR_RETURN(model::PrefillResult prefill,
                            PrefillForPool(entry, ids, progress, cancel, chain, p));
    if (prefill.device_kv && p->pool.arena) {
      // A GPU prefill of a cuda pool: encoded where the K/V lie, into the pool's device
      // memory (every codec, the host's bytes); the host staging is not needed.
      p->write_device = kernels::Device::kCuda;
      p->base = p->pool.arena->data();
      std::vector<uint8_t>().swap(p->host_staging);
    }
    t_encode = Clock::now();
    POLYKV_RETURN_IF_ERROR(EncodeLayers(prefill, ids, progress, cancel, p));
  }  // the f32 K/V are freed before publishing
  run->Release();
  p->encode_ms = MsSince(t_encode);
  return SealPool(progress, p);
}

Status PoolManager::AllocateRegion(PendingPool* p) {
  POLYKV_ASSIGN_OR_RETURN(
      p->base, AllocatePoolMemory(p->id, p->needed, p->cuda, &p->pool, &p->host_staging));
  return absl::OkStatus();
}

StatusOr<void*> PoolManager::AllocatePoolMemory(const std::string& pool_id, uint64_t needed,
                                                bool cuda, Pool* pool,
                                                std::vector<uint8_t>* staging) {
  if (cuda) {
    POLYKV_ASSIGN_OR_RETURN(ipc::CudaArena arena, ipc::CudaArena::Allocate(needed));
    pool->arena.emplace(std::move(arena));
    // The model prefills on the host (and a restored or replicated pool arrives there): the
    // pool is written into host staging and copied to the device when published.
    staging->resize(needed);
    return static_cast<void*>(staging->data());
  }
  // A sealed memfd: no name anyone could squat, nothing left behind when we die. Shown as
  // "/memfd:<prefix without '/'><first 16 hex of id> (deleted)" in /proc/*/fd.
  const std::string region_name =
      (options_.shm_prefix.size() > 1 ? options_.shm_prefix.substr(1) : std::string("polykv-")) +
      pool_id.substr(0, 16);
  POLYKV_ASSIGN_OR_RETURN(ipc::SealedRegion region, ipc::SealedRegion::Create(region_name, needed));
  pool->region.emplace(std::move(region));
  return pool->region->writable_data();
}

// The GPU prefiller of a model entry (backend cuda, prefill_on_device), loaded at its first
// use; null when the host prefills (said once per model in the log, with the reason).
model::CudaLlama* PoolManager::DevicePrefiller(ModelEntry* entry) {
  if (!PrefillsOnDevice()) return nullptr;
  if (entry->cuda) return entry->cuda.get();
  if (entry->cuda_failed) return nullptr;
  Status why = kernels::CheckDeviceAvailable(kernels::Device::kCuda);
  if (why.ok() && !model::CudaRuntimeBuilt())
    why = absl::UnimplementedError("the CUDA model runtime is not in this build");
  if (why.ok()) {
    auto loaded = model::CudaLlama::Load(entry->key.canonical, 0);
    if (loaded.ok()) {
      entry->cuda = std::move(*loaded);
      spdlog::info("prefill of {} on CUDA device 0 ({:.1f} MiB of weights uploaded)",
                   entry->key.canonical, entry->cuda->device_bytes() / 1048576.0);
      return entry->cuda.get();
    }
    why = loaded.status();
  }
  entry->cuda_failed = true;
  spdlog::warn("prefill of {} on the host: the GPU prefill is unavailable ({})",
               entry->key.canonical, why.ToString());
  return nullptr;
}

StatusOr<model::PrefillResult> PoolManager::PrefillForPool(ModelEntry* entry,
                                                           const std::vector<int32_t>& ids,
                                                           const ProgressFn& progress,
                                                           const std::atomic<bool>* cancel,
                                                           ParentChain* chain, PendingPool* p) {
  progress("prefill", 0, static_cast<int64_t>(ids.size()));
  for (int waited = 0; waited < options_.test_create_delay_ms; waited += 20) {
    if (Cancelled(cancel)) return absl::CancelledError("create cancelled");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto t0 = Clock::now();
  // A child of pools in GPU memory is prefilled there, attending to their device copies in
  // place, when the GPU prefills; else on the host after its parents are read back (done in
  // OpenParentChain already when the daemon prefills on the host).
  model::CudaLlama* gpu = chain == nullptr || chain->on_device() ? DevicePrefiller(entry) : nullptr;
  if (chain != nullptr && gpu == nullptr) POLYKV_RETURN_IF_ERROR(ReadBackParentChain(chain));
  const int64_t gpu_chunk = std::min<int64_t>(options_.prefill_chunk, 256);
  StatusOr<model::PrefillResult> r = absl::InternalError("prefill did not run");
  try {
    auto on_chunk = [&](int64_t done, int64_t total) {
      if (Cancelled(cancel)) throw CreateCancelled();
      progress("prefill", done, total);
    };
    auto on_host = [&]() -> StatusOr<model::PrefillResult> {
      if (chain == nullptr) return entry->model->Prefill(ids, options_.prefill_chunk, on_chunk);
      return model::PrefillAfterPrefix(*entry->model, chain->views, chain->tokens, ids,
                                       options_.prefill_chunk, on_chunk);
    };
    if (gpu != nullptr) {
      model::KvPrefix prefix;
      if (chain != nullptr) {
        prefix.view = chain->device_views.front();
        prefix.tail.assign(chain->device_views.begin() + 1, chain->device_views.end());
      }
      r = gpu->Prefill(chain != nullptr ? &prefix : nullptr, ids, gpu_chunk, on_chunk,
                       /*keep_on_device=*/true);
      if (!r.ok() && r.status().code() == absl::StatusCode::kResourceExhausted) {
        // Out of device memory (the chain's copies, the f32 K/V and the pool at once): the
        // host prefills instead, its pool still published on the GPU.
        spdlog::warn("GPU prefill of pool {} out of device memory ({}): the host prefills it",
                     p->id.substr(0, 16), std::string(r.status().message()));
        if (chain != nullptr) POLYKV_RETURN_IF_ERROR(ReadBackParentChain(chain));
        progress("prefill", 0, static_cast<int64_t>(ids.size()));
        r = on_host();
      }
    } else {
      r = on_host();
    }
  } catch (const CreateCancelled&) {
    r = absl::CancelledError("polykvd is shutting down: the create was cancelled");
  } catch (const std::exception& e) {
    r = absl::InternalError(absl::StrCat("prefill threw: ", e.what()));
  }
  if (chain != nullptr) chain->ReleaseDeviceCopies();  // the prefill no longer reads them
  if (!r.ok()) return r.status();
  p->prefill_ms = MsSince(t0);
  const uint32_t layers = p->params.layers;
  if (model::PrefilledLayerCount(*r) != layers) {
    return absl::InternalError(absl::StrCat("prefill returned ", model::PrefilledLayerCount(*r),
                                            " layers, expected ", layers));
  }
  return r;
}

Status PoolManager::EncodeLayers(const model::PrefillResult& prefill,
                                 const std::vector<int32_t>& ids, const ProgressFn& progress,
                                 const std::atomic<bool>* cancel, PendingPool* p) {
  const ipc::PoolParams& params = p->params;
  std::vector<uint8_t> id_bytes = Unhex(p->id);
  POLYKV_ASSIGN_OR_RETURN(
      ipc::PoolWriter writer,
      ipc::PoolWriter::Create(p->base, p->needed, params, id_bytes, ids, p->write_device));
  p->writer.emplace(std::move(writer));
  for (uint32_t l = 0; l < params.layers; ++l) {
    if (Cancelled(cancel)) return absl::CancelledError("create cancelled");
    // Moved to the host when the pool is written there (a GPU prefill), else left in place.
    POLYKV_ASSIGN_OR_RETURN(
        model::PrefilledLayer kv,
        model::ExportPrefilledLayer(prefill, l, p->write_device == kernels::Device::kCpu));
    if (kv.elements() != static_cast<int64_t>(params.kv_heads * params.tokens * params.head_dim)) {
      return absl::InternalError(absl::StrCat("layer ", l, " K/V have ", kv.elements(),
                                              " elements, expected [kv_heads][tokens][head_dim]"));
    }
    Status s = p->writer->WriteLayer(l, kv.k(), kv.v(), kv.dtype());
    if (!s.ok()) return Status(s.code(), absl::StrCat("encode layer ", l, ": ", s.message()));
    progress("encode", l + 1, params.layers);
  }
  return absl::OkStatus();
}

Status PoolManager::SealPool(const ProgressFn& progress, PendingPool* p) {
  p->publish_start = Clock::now();
  progress("publish", 0, 1);
  POLYKV_RETURN_IF_ERROR(p->writer->Finalize());
  return SealPoolMemory(p->needed, p->host_staging, "encode", &p->pool);
}

Status PoolManager::SealPoolMemory(uint64_t needed, const std::vector<uint8_t>& staging,
                                   const char* filled_by, Pool* pool) {
  if (pool->arena) {
    if (!staging.empty()) {
      POLYKV_RETURN_IF_ERROR(pool->arena->CopyFromHost(0, staging.data(), needed));
    }
    pool->memory.backend = ipc::PoolMemory::kCuda;
    pool->memory.size = needed;
    POLYKV_ASSIGN_OR_RETURN(pool->memory.cuda, pool->arena->Export(0, needed));
    return absl::OkStatus();
  }
  pool->memory.backend = ipc::PoolMemory::kHost;
  pool->memory.size = needed;
  // Seal, then check the payload once more: it is now immutable, and what agents will
  // map is exactly what the checksum in the header describes.
  POLYKV_RETURN_IF_ERROR(pool->region->Seal());
  auto reader = ipc::PoolReader::Open(pool->region->data(), pool->region->size(),
                                      /*verify_payload=*/true);
  if (!reader.ok()) {
    return Status(
        absl::StatusCode::kDataLoss,
        absl::StrCat("pool changed between ", filled_by, " and seal: ", reader.status().message()));
  }
  pool->memory.transport = "memfd";
  pool->memory.fd_socket = options_.fd_socket;
  return absl::OkStatus();
}

void PoolManager::PersistPool(PendingPool* p) {
  if (options_.store) {
    // Persist before publishing, so that an evict can never race the write. A pool that
    // cannot be written is still served (from memory only). Host pools are written from the
    // sealed memfd (the bytes agents will map), host-staged CUDA pools from the staging copy,
    // CUDA pools encoded on the device from one read-back of their bytes.
    const std::string& pool_id = p->id;
    const void* persist_from = nullptr;
    std::vector<uint8_t> device_copy;  // a pool encoded on the device, read back once
    if (!p->cuda) {
      persist_from = p->pool.region->data();
    } else if (!p->host_staging.empty()) {
      persist_from = p->host_staging.data();
    } else if (p->pool.arena) {
      device_copy.resize(p->needed);
      if (Status s = p->pool.arena->CopyToHost(0, device_copy.data(), p->needed); s.ok()) {
        persist_from = device_copy.data();
        spdlog::info("pool {} ({} bytes) read back from GPU memory to persist it (--state-dir)",
                     pool_id.substr(0, 16), p->needed);
      } else {
        spdlog::warn("pool {} is not persisted: reading it back from the device: {}",
                     pool_id.substr(0, 16), s.ToString());
      }
    }
    if (persist_from != nullptr) {
      auto tw = Clock::now();
      if (Status s = options_.store->Save(p->pool.info, persist_from, p->needed); !s.ok()) {
        spdlog::warn("pool {} is not persisted: {}", pool_id.substr(0, 16), s.ToString());
      } else {
        spdlog::debug("persisted pool {} in {:.1f} ms", pool_id.substr(0, 16), MsSince(tw));
      }
    }
  }
  p->host_staging = {};
}

StatusOr<CreateResult> PoolManager::PublishPool(PendingPool* p, Reservation* reservation,
                                                const ProgressFn& progress,
                                                const std::atomic<bool>* cancel,
                                                const ParentChain* chain) {
  const std::string& pool_id = p->id;
  CreateResult result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (Cancelled(cancel)) {
      return absl::CancelledError("polykvd is shutting down: the create was cancelled");
    }
    if (chain != nullptr && pools_.count(p->params.parent_id) == 0) {
      // Evicted meanwhile: a child without its parent cannot be attended to.
      if (options_.store) options_.store->Remove(pool_id);
      return absl::AbortedError(absl::StrCat("parent pool ", p->params.parent_id.substr(0, 16),
                                             " was evicted during the create of its child"));
    }
    p->pool.info.publish_ms = MsSince(p->publish_start);
    p->pool.seq = ++seq_;
    auto [it, inserted] = pools_.emplace(pool_id, std::move(p->pool));
    POLYKV_CHECK(inserted);
    reservation->Dismiss();  // the bytes are the published pool's now
    result.info = InfoLocked(it->second);
    result.created = true;
  }
  progress("publish", 1, 1);
  spdlog::info(
      "published pool {} ({}, {} tokens, {} bytes, {:.2f}x vs bf16; prefill {:.0f} ms, "
      "encode {:.0f} ms, publish {:.1f} ms)",
      pool_id.substr(0, 16), result.info.codec, result.info.tokens, result.info.total_bytes,
      result.info.effective_ratio, result.info.prefill_ms, result.info.encode_ms,
      result.info.publish_ms);
  return result;
}

StatusOr<std::shared_ptr<PoolManager::ParentChain>> PoolManager::OpenParentChain(
    const std::string& parent_id) {
  constexpr int kMaxTreeDepth = 64;
  bool restore = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto r = ResolvePoolIdLocked(parent_id);
    restore = !r.ok() && r.status().code() == absl::StatusCode::kNotFound && options_.store;
  }
  if (restore) {  // a persisted parent is published from its file first
    auto r = RestorePersisted(parent_id);
    if (!r.ok() && r.status().code() != absl::StatusCode::kNotFound) return r.status();
  }
  auto chain = std::make_shared<ParentChain>();
  // Per pool of the chain (leaf first while walking): its memfd (a host pool, mapped below)
  // or, for a pool in GPU memory, a device copy made under the lock (an evict after the lock
  // cannot pull it away; fast): a GPU prefill attends to it in place, a host prefill reads
  // it back first (ReadBackParentChain).
  struct Source {
    ipc::UniqueFd fd;  ///< a host pool's memfd (duplicated)
    uint64_t size = 0;
    std::optional<ipc::CudaArena> device_copy;  ///< else: a copy of a cuda pool
  };
  std::vector<Source> sources;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto resolved = ResolvePoolIdLocked(parent_id);
    if (!resolved.ok()) {
      return Status(resolved.status().code(),
                    absl::StrCat("parent pool: ", resolved.status().message()));
    }
    for (std::string id = *resolved; !id.empty();) {
      if (sources.size() >= kMaxTreeDepth) {
        return absl::FailedPreconditionError(absl::StrCat(
            "pool tree under ", resolved->substr(0, 16), " is deeper than ", kMaxTreeDepth));
      }
      auto it = pools_.find(id);
      if (it == pools_.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("parent chain of ", resolved->substr(0, 16), " is broken: pool ",
                         id.substr(0, 16), " is not published"));
      }
      if (it->second.region) {
        const int fd = fcntl(it->second.region->fd(), F_DUPFD_CLOEXEC, 0);
        if (fd < 0) {
          return absl::InternalError(absl::StrCat("dup of pool memfd: ", std::strerror(errno)));
        }
        sources.push_back({ipc::UniqueFd(fd), it->second.region->size(), std::nullopt});
      } else if (it->second.arena) {
        POLYKV_ASSIGN_OR_RETURN(ipc::CudaArena copy,
                                it->second.arena->Clone(it->second.memory.size));
        sources.push_back({ipc::UniqueFd(), 0, std::move(copy)});
      } else {
        return absl::FailedPreconditionError(
            absl::StrCat("parent pool ", id.substr(0, 16), " has no memory to read"));
      }
      chain->infos.push_back(it->second.info);
      id = it->second.info.parent;
    }
  }
  std::reverse(sources.begin(), sources.end());
  std::reverse(chain->infos.begin(), chain->infos.end());
  bool all_on_device = true;
  for (size_t i = 0; i < sources.size(); ++i) {
    const bool on_device = sources[i].device_copy.has_value();
    all_on_device = all_on_device && on_device;
    StatusOr<ipc::PoolReader> reader = absl::InternalError("no reader");
    if (on_device) {
      // The header and token ids are read from the device copy; its payload never leaves the
      // GPU (a device-to-device copy: not verified again here).
      const ipc::CudaArena& copy = *sources[i].device_copy;
      reader = ipc::PoolReader::Open(copy.data(), copy.size(), /*verify_payload=*/false,
                                     kernels::Device::kCuda);
    } else {
      POLYKV_ASSIGN_OR_RETURN(
          ipc::SealedRegion map,
          ipc::SealedRegion::MapSealed(std::move(sources[i].fd), sources[i].size));
      chain->maps.push_back(std::move(map));
      reader = ipc::PoolReader::Open(chain->maps.back().data(), chain->maps.back().size(),
                                     /*verify_payload=*/false);
    }
    if (!reader.ok()) return reader.status();
    if (reader->params().parent_tokens != chain->tokens.size()) {
      return absl::DataLossError(absl::StrCat("pool ", chain->infos[i].id.substr(0, 16),
                                              " says it follows ", reader->params().parent_tokens,
                                              " positions, its parent chain holds ",
                                              chain->tokens.size()));
    }
    if (on_device) {
      POLYKV_ASSIGN_OR_RETURN(kernels::PrefixView view, ipc::DevicePrefixViewOf(*reader));
      chain->device_views.push_back(std::move(view));
      chain->views.emplace_back();  // filled by ReadBackParentChain if the host prefills
    } else {
      POLYKV_ASSIGN_OR_RETURN(kernels::PrefixView view, ipc::PrefixViewOf(*reader));
      chain->views.push_back(std::move(view));
    }
    const std::vector<int32_t> ids = reader->TokenIds();
    if (ids.size() != reader->params().tokens) {
      return absl::DataLossError(absl::StrCat("token ids of parent pool ",
                                              chain->infos[i].id.substr(0, 16), " unreadable"));
    }
    chain->tokens.insert(chain->tokens.end(), ids.begin(), ids.end());
    chain->leaf_params = reader->params();
    chain->device_copies.push_back(std::move(sources[i].device_copy));
  }
  if (!all_on_device) chain->device_views.clear();  // a GPU prefill needs every pool there
  // A daemon that prefills on the host reads the parents back now (before the create waits
  // for its model; a GPU prefill attends to the device copies instead).
  if (!PrefillsOnDevice() || !chain->on_device())
    POLYKV_RETURN_IF_ERROR(ReadBackParentChain(chain.get()));
  return chain;
}

Status PoolManager::ReadBackParentChain(ParentChain* chain) const {
  chain->device_views.clear();  // (views into copies this frees)
  for (size_t i = 0; i < chain->device_copies.size(); ++i) {
    if (!chain->device_copies[i]) continue;
    const ipc::CudaArena& copy = *chain->device_copies[i];
    const std::string& id = chain->infos[i].id;
    try {
      chain->read_back.emplace_back(copy.size());
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "out of host memory reading back parent pool ", id.substr(0, 16), " from the GPU"));
    }
    POLYKV_RETURN_IF_ERROR(copy.CopyToHost(0, chain->read_back.back().data(), copy.size()));
    spdlog::info(
        "parent pool {} ({} bytes) read back from GPU memory: the host prefills its child ({})",
        id.substr(0, 16), copy.size(),
        options_.prefill_on_device ? "the GPU prefill is unavailable or out of memory"
                                   : "--prefill-device cuda would attend to it in place");
    chain->device_copies[i].reset();
    // (A read-back copy is verified: it crossed the PCIe bus outside any seal.)
    POLYKV_ASSIGN_OR_RETURN(
        ipc::PoolReader reader,
        ipc::PoolReader::Open(chain->read_back.back().data(), chain->read_back.back().size(),
                              /*verify_payload=*/true));
    POLYKV_ASSIGN_OR_RETURN(chain->views[i], ipc::PrefixViewOf(reader));
  }
  return absl::OkStatus();
}

}  // namespace polykv::daemon
