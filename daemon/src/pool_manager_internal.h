// PoolManager's internals shared by its files (not installed): the small helpers, and the
// create's scoped pieces (RunSlot, Reservation, PendingPool). The manager's files, by role:
//   pool_manager.cc    construction, shutdown, codec names, pool ids, counters
//   pool_models.cc     opening model files under the model folders, the model cache (LRU)
//   pool_admission.cc  CreatePool: codec, tokens, parameters, single flight, restore or build
//   pool_build.cc      Build: reserve, allocate, prefill, encode, seal, persist, publish;
//                      the parent chain of a child pool
//   pool_leases.cc     leases (attach, renew, detach, expiry), eviction, List / Info
//   pool_persist.cc    the state folder: restore, preload, Catalog / Describe
//   pool_replicate.cc  pools from and for peer daemons
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "pool_manager.h"

namespace polykv::daemon {

/// Thrown from the prefill progress callback to abandon a cancelled create (the model's
/// Prefill has no other way out; it unwinds through RAII locals only).
struct CreateCancelled : std::exception {
  const char* what() const noexcept override { return "create cancelled"; }
};

/// Wall-clock milliseconds since the Unix epoch.
int64_t UnixMs();
/// Milliseconds of the steady clock since `t0`.
double MsSince(std::chrono::steady_clock::time_point t0);
/// Lowercase hex of `n` bytes.
std::string Hex(const uint8_t* data, size_t n);
/// The bytes of an even-length hex string (as Hex writes it).
std::vector<uint8_t> Unhex(const std::string& hex);
/// 32 hex chars of 128 random bits.
std::string RandomLeaseId();
/// Whether every char of `s` is 0-9 or a-f.
bool IsHex(const std::string& s);
/// A full pool id: 64 lowercase hex chars.
bool IsFullPoolId(const std::string& id);
/// Mean and largest per-layer relative MSE into `info` (the pool's header keeps every layer).
void SetFidelity(const std::vector<float>& key, const std::vector<float>& value,
                 ipc::PoolInfo* info);
/// `path` with "//", "." and ".." removed lexically ("" for a relative path). "/.." is "/".
std::string LexicalNormal(const std::string& path);
/// realpath(3). Errors: kNotFound (ENOENT, ENOTDIR), else kPermissionDenied.
StatusOr<std::string> RealPath(const std::string& path);

class PoolManager::RunSlot {
 public:
  explicit RunSlot(ModelEntry* entry) : entry_(entry) {}
  RunSlot(const RunSlot&) = delete;
  RunSlot& operator=(const RunSlot&) = delete;
  ~RunSlot() { Release(); }

  /// Waits until no other create runs the model, then holds it. kCancelled when `cancel`
  /// (or the daemon's shutdown) is seen while waiting.
  [[nodiscard]] Status Acquire(const PoolManager& manager, const std::atomic<bool>* cancel) {
    std::unique_lock<std::mutex> lock(entry_->run_state_mu);
    while (entry_->running) {
      entry_->run_cv.wait_for(lock, std::chrono::milliseconds(100));
      if (manager.Cancelled(cancel)) return absl::CancelledError("polykvd is shutting down");
    }
    entry_->running = true;
    held_ = true;
    return absl::OkStatus();
  }

  /// Hands the model to the next create (once; also done on destruction).
  void Release() {
    if (!held_) return;
    held_ = false;
    {
      std::lock_guard<std::mutex> lock(entry_->run_state_mu);
      entry_->running = false;
    }
    entry_->run_cv.notify_one();
  }

 private:
  ModelEntry* entry_;
  bool held_ = false;
};

class PoolManager::Reservation {
 public:
  Reservation(PoolManager* manager, uint64_t needed, Pool* pool)
      : manager_(manager), needed_(needed), pool_(pool) {}
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;

  /// Unless dismissed: gives the bytes back and drops the half-made region and arena, under
  /// mu_ so that the cap never counts memory that is already gone.
  ~Reservation() {
    if (!held_) return;
    std::lock_guard<std::mutex> lock(manager_->mu_);
    manager_->used_ -= needed_;
    pool_->region.reset();  // the memfd goes away with its last descriptor
    pool_->arena.reset();
  }

  /// Reserves the bytes against the memory cap; kResourceExhausted when they do not fit,
  /// naming used, cap and what `who` (e.g. "the pool") needs.
  [[nodiscard]] Status Acquire(const std::string& who = "the pool") {
    std::lock_guard<std::mutex> lock(manager_->mu_);
    const PoolManagerOptions& options = manager_->options_;
    if (options.memory_cap > 0 && manager_->used_ + needed_ > options.memory_cap) {
      return absl::ResourceExhaustedError(
          absl::StrCat("memory cap exceeded on backend ", ipc::PoolMemoryName(options.backend),
                       ": used ", manager_->used_, " of cap ", options.memory_cap, " bytes, ", who,
                       " needs ", needed_, " bytes"));
    }
    manager_->used_ += needed_;
    held_ = true;
    return absl::OkStatus();
  }

  /// The bytes now belong to the published pool: nothing is given back.
  void Dismiss() { held_ = false; }

 private:
  PoolManager* manager_;
  uint64_t needed_;
  Pool* pool_;
  bool held_ = false;
};

struct PoolManager::PendingPool {
  PendingPool(const std::string& id, const ipc::PoolParams& params, const ipc::PoolLayout& layout,
              ipc::PoolMemory memory)
      : id(id),
        params(params),
        layout(layout),
        needed(layout.total_bytes),
        cuda(memory == ipc::PoolMemory::kCuda) {}

  const std::string& id;
  const ipc::PoolParams& params;
  const ipc::PoolLayout layout;
  const uint64_t needed;  ///< layout.total_bytes
  const bool cuda;        ///< the cuda backend (else a sealed memfd on the host)
  Pool pool;
  std::vector<uint8_t> host_staging;  ///< a CUDA pool encoded on the host, before its copy
  void* base = nullptr;               ///< where the encoder writes
  kernels::Device write_device = kernels::Device::kCpu;
  std::optional<ipc::PoolWriter> writer;
  double prefill_ms = 0, encode_ms = 0;
  Clock::time_point publish_start;  ///< for publish_ms

  /// Fills pool.info from the parameters, the layout, the writer's fidelity and the timings.
  void Describe(const std::string& model_name) {
    ipc::PoolInfo& info = pool.info;
    info.id = id;
    info.model = model_name;
    info.model_fingerprint = params.model_fingerprint;
    info.architecture = params.architecture;
    info.tokenizer_family = params.tokenizer_family;
    info.codec = ipc::PoolCodecLabel(params);
    info.backend = std::string(ipc::PoolMemoryName(pool.memory.backend));
    info.tokens = params.tokens;
    info.layers = params.layers;
    info.kv_heads = params.kv_heads;
    info.head_dim = params.head_dim;
    info.total_bytes = needed;
    info.key_codes = layout.key_codes;
    info.key_scales = layout.key_scales;
    info.value_codes = layout.value_codes;
    info.value_norms = layout.value_norms;
    info.overhead = layout.overhead;
    SetFidelity(writer->key_rel_mse(), writer->value_rel_mse(), &info);
    info.bf16_bytes = ipc::Bf16CacheBytes(params);
    info.effective_ratio = static_cast<double>(info.bf16_bytes) / static_cast<double>(needed);
    info.parent = params.parent_id;
    info.parent_tokens = params.parent_tokens;
    info.created_unix_ms = UnixMs();
    info.prefill_ms = prefill_ms;
    info.encode_ms = encode_ms;
    info.origin = "prefill";
  }
};

}  // namespace polykv::daemon
