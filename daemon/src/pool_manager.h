// polykvd's pools and leases: content-addressed pool creation (tokenize, prefill, encode,
// publish), memory accounting against a cap, leases with expiry, eviction. Thread-safe:
// CreatePool runs on worker threads while the control loop calls everything else.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "polykv/ipc/cuda_ipc.h"
#include "polykv/ipc/pool_layout.h"
#include "polykv/ipc/protocol.h"
#include "polykv/ipc/shm_region.h"
#include "polykv/model/llama.h"
#include "polykv/status.h"
#include "pool_store.h"

namespace polykv::daemon {

/// Loads a model by resolved path (LlamaModel::Load by default; tests may inject fakes).
using ModelLoader =
    std::function<StatusOr<std::unique_ptr<model::LlamaModel>>(const std::string& path)>;

/// Progress of a CREATE_POOL: stage "tokenize" | "prefill" | "encode" | "publish".
using ProgressFn = std::function<void(const std::string& stage, int64_t done, int64_t total)>;

/// Configuration of a PoolManager.
struct PoolManagerOptions {
  /// "host" or "cuda" (the daemon resolves "auto" before constructing the manager).
  std::string backend = "host";
  /// Bytes the backend may hold in pools; 0 = unlimited.
  uint64_t memory_cap = 0;
  /// Lease duration granted by ATTACH and RENEW (milliseconds).
  int64_t lease_ms = 30000;
  /// Directories searched for relative model names (after the name itself).
  std::vector<std::string> model_path;
  /// POSIX shm object name prefix: pools are "<prefix><first 16 hex of id>".
  std::string shm_prefix = "/polykv-";
  /// Prefill chunk (tokens).
  int64_t prefill_chunk = 512;
  /// libtorch intra-op threads passed to the default loader (0 = all cores).
  int threads = 0;
  /// Empty: model::LlamaModel::Load with LoadOptions{threads}.
  ModelLoader loader;
  /// Called with the current list of shm object names whenever it changes (for the
  /// daemon's stale-segment record). May be empty.
  std::function<void(const std::vector<std::string>&)> on_segments_changed;
  /// Persisted pools (--state-dir), owned by the daemon; null = pools live in memory only.
  /// Published pools are written to it before they become visible, creates and attaches of
  /// a pool found there restore it instead of prefilling, and Evict removes its file.
  PoolStore* store = nullptr;
};

/// Result of CreatePool.
struct CreateResult {
  ipc::PoolInfo info;
  bool created = false;  ///< false when the pool already existed (or another create made it)
  bool restored = false;  ///< created from the state folder (no prefill ran)
};

/// Result of Attach / Renew.
struct LeaseGrant {
  std::string lease_id;           ///< 32 hex chars (128 random bits)
  int64_t expires_unix_ms = 0;
  int64_t lease_ms = 0;
  ipc::PoolInfo info;             ///< Attach only
  ipc::MemoryHandle memory;       ///< Attach only
};

/// Parsed codec name: "k8v2" | "k8v3" | "k8v4" | "none".
struct CodecChoice {
  ipc::PoolCodec codec = ipc::PoolCodec::kK8V;
  int32_t value_bits = 3;
};
/// Errors: kInvalidArgument naming the accepted names.
StatusOr<CodecChoice> ParseCodecName(const std::string& name);
/// "tensor" | "head" | "channel". Errors: kInvalidArgument.
StatusOr<kernels::KeyScaleMode> ParseKeyScale(const std::string& name);

/// Hex SHA-256 content address of a pool: over "polykv-pool-v1", the model fingerprint,
/// the tokenizer fingerprint ("none" without a tokenizer), the codec parameters (codec,
/// key bits, value bits, key scale mode, rotation seed, norm correction, raw dtype) and the
/// token ids (int32 little-endian).
std::string ComputePoolId(const std::string& model_fingerprint,
                          const std::string& tokenizer_fingerprint,
                          const ipc::PoolParams& params, const std::vector<int32_t>& token_ids);

/// All pools and leases of one daemon.
class PoolManager {
 public:
  explicit PoolManager(PoolManagerOptions options);
  /// Releases every pool (unlinks shm objects, frees device memory).
  ~PoolManager();
  PoolManager(const PoolManager&) = delete;
  PoolManager& operator=(const PoolManager&) = delete;

  /// Creates (or returns the existing) pool for `request` (a CREATE_POOL). Blocks for the
  /// prefill; a concurrent create of the same content waits for the first and returns its
  /// pool. The pool becomes visible to List/Attach only once complete.
  /// Errors: kInvalidArgument (codec, key scale, token ids, missing tokenizer), kNotFound
  /// (model), kResourceExhausted (memory cap: names used/cap/needed; nothing is left
  /// behind), kCancelled after Shutdown, codec/model errors as returned.
  StatusOr<CreateResult> CreatePool(const ipc::Request& request, const ProgressFn& progress);

  /// Grants a lease on a published pool (`pool_id`: full id or a unique prefix of >= 8 hex).
  /// Errors: kNotFound, kInvalidArgument (ambiguous prefix).
  StatusOr<LeaseGrant> Attach(const std::string& pool_id, uint32_t client_pid);
  /// Extends a lease. Errors: kNotFound "pool evicted" for leases of a force-evicted pool,
  /// kNotFound for unknown or expired leases.
  StatusOr<LeaseGrant> Renew(const std::string& lease_id);
  /// Releases a lease. Errors: kNotFound.
  Status Detach(const std::string& lease_id);
  /// Removes a pool. Errors: kNotFound; kFailedPrecondition when it has live leases and
  /// !force. A forced eviction invalidates its leases.
  Status Evict(const std::string& pool_id, bool force);
  /// Drops leases past their expiry; returns how many.
  int SweepExpiredLeases();

  /// Publishes persisted pool `pool_id` (full id or unique prefix) from the store: loads its
  /// model (by the name it was created with) and refuses it when the model is absent or its
  /// fingerprint differs (kFailedPrecondition, logged), then reads and verifies the bytes
  /// (a corrupt file is quarantined: kDataLoss). Returns the pool at once when it is already
  /// published. Errors: also kNotFound (not persisted), kResourceExhausted (memory cap).
  StatusOr<ipc::PoolInfo> RestorePersisted(const std::string& pool_id);
  /// Restores every persisted pool (--preload), most recently used first, stopping at the
  /// memory cap; returns how many were published. Failures are logged, not returned.
  int PreloadPersisted();
  /// Pools restored from the store since start (counted once per pool published).
  uint64_t restored_count() const;
  /// Distinct agent processes (client pids) holding live leases, by full pool id.
  std::map<std::string, uint32_t> AgentsByPool() const;

  /// Published pools, oldest first.
  std::vector<ipc::PoolInfo> List() const;
  /// One pool. Errors: kNotFound, kInvalidArgument (ambiguous prefix).
  StatusOr<ipc::PoolInfo> Info(const std::string& pool_id) const;
  /// Bytes held by published and in-flight pools.
  uint64_t memory_used() const;
  uint64_t memory_cap() const { return options_.memory_cap; }
  const std::string& backend() const { return options_.backend; }

  /// Refuses new creates (kCancelled) and releases every published pool.
  void Shutdown();

 private:
  struct Pool {
    ipc::PoolInfo info;
    ipc::MemoryHandle memory;
    std::optional<ipc::ShmRegion> shm;
    std::optional<ipc::CudaArena> arena;
    int64_t seq = 0;
  };
  struct Lease {
    std::string pool_id;
    std::chrono::steady_clock::time_point expires;
    uint32_t client_pid = 0;
  };
  struct InFlight {
    bool done = false;
    Status status;
    std::condition_variable cv;
  };
  struct ModelEntry {
    std::mutex load_mu;  ///< held while loading
    bool loaded = false;
    Status status;
    std::unique_ptr<model::LlamaModel> model;
    std::mutex run_mu;   ///< forward passes are not reentrant
  };

  StatusOr<std::string> ResolveModelPath(const std::string& name) const;
  StatusOr<ModelEntry*> GetModel(const std::string& resolved);
  StatusOr<CreateResult> Restore(const ipc::PoolFileManifest& manifest);
  StatusOr<std::string> ResolvePoolIdLocked(const std::string& id_or_prefix) const;
  uint32_t LiveLeasesLocked(const std::string& pool_id) const;
  ipc::PoolInfo InfoLocked(const Pool& pool) const;
  void NotifySegmentsLocked();
  StatusOr<CreateResult> Build(const ipc::Request& request, const std::string& model_name,
                               ModelEntry* entry, const std::string& pool_id,
                               const ipc::PoolParams& params,
                               const std::vector<int32_t>& token_ids, const ProgressFn& progress);

  PoolManagerOptions options_;
  mutable std::mutex mu_;
  bool shutdown_ = false;
  std::map<std::string, Pool> pools_;                      // by full hex id
  std::map<std::string, std::shared_ptr<InFlight>> in_flight_;
  std::map<std::string, Lease> leases_;
  std::set<std::string> evicted_leases_;                   // leases of force-evicted pools
  std::set<std::string> segments_;                         // shm names held (incl. in flight)
  uint64_t used_ = 0;                                      // published + reserved bytes
  int64_t seq_ = 0;
  uint64_t restored_ = 0;                                  // pools restored from the store
  std::mutex models_mu_;
  std::map<std::string, std::unique_ptr<ModelEntry>> models_;
};

}  // namespace polykv::daemon
