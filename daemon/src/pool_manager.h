// polykvd's pools and leases: content-addressed pool creation (open the model safely, load
// it through a bounded LRU cache, tokenize, prefill, encode, seal, publish), memory
// accounting against a cap, leases with expiry (indexed by expiry time and counted per
// pool), eviction. Thread-safe: CreatePool runs on worker threads while the control loop
// and the descriptor server call everything else.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "polykv/ipc/codec_spec.h"
#include "polykv/ipc/cuda_ipc.h"
#include "polykv/ipc/pool_layout.h"
#include "polykv/ipc/protocol.h"
#include "polykv/ipc/sealed_region.h"
#include "polykv/model/cuda_llama.h"
#include "polykv/model/llama.h"
#include "polykv/model/prefill.h"
#include "polykv/status.h"
#include "pool_store.h"

namespace polykv::daemon {

/// Loads a model from a path (LlamaModel::Load by default; tests may inject fakes). The
/// daemon passes "/proc/self/fd/<n>" of the model it opened and checked (a regular file or
/// a folder under the model folders), so the file cannot be swapped in between.
using ModelLoader =
    std::function<StatusOr<std::unique_ptr<model::LlamaModel>>(const std::string& path)>;

/// Progress of a CREATE_POOL: stage "load" | "tokenize" | "prefill" | "encode" | "publish".
using ProgressFn = std::function<void(const std::string& stage, int64_t done, int64_t total)>;

/// Pools held by other daemons (peers.h implements it over ZeroMQ + UCX). PoolManager asks
/// it for a pool it neither holds nor finds in its state folder.
class PeerSource {
 public:
  virtual ~PeerSource() = default;
  /// A holder's answer to PEER_FETCH: the pool as it describes it and how to pull it.
  struct Offer {
    ipc::PoolInfo info;
    uint64_t pool_bytes = 0;  ///< bytes of the pool region
    std::string peer;         ///< tcp://HOST:PORT of the holder
    std::string transfer_id;
    std::string descriptor;  ///< ipc::UcxExposure::descriptor()
  };
  /// Asks the peers in order for `pool_id` (full id or unique prefix). Errors: kNotFound
  /// when no peer holds it (naming what each said), kUnavailable when no peer answered.
  [[nodiscard]] virtual StatusOr<Offer> Find(const std::string& pool_id) = 0;
  /// Pulls the offer's bytes into `dst` (`size` = offer.pool_bytes). `progress` gets (bytes
  /// done, total). Errors: kUnavailable (the holder failed mid-transfer), kDeadlineExceeded
  /// (stalled), kCancelled.
  [[nodiscard]] virtual Status Pull(const Offer& offer, void* dst, uint64_t size,
                                    const std::atomic<bool>* cancel,
                                    const std::function<void(uint64_t, uint64_t)>& progress) = 0;
  /// Tells the holder the transfer is over (best effort, never blocks for long).
  virtual void Release(const Offer& offer) = 0;
};

/// Configuration of a PoolManager.
struct PoolManagerOptions {
  /// Where pools live (the daemon resolves --backend auto before constructing the manager).
  ipc::PoolMemory backend = ipc::PoolMemory::kHost;
  /// Bytes the backend may hold in pools; 0 = unlimited.
  uint64_t memory_cap = 0;
  /// Lease duration granted by ATTACH and RENEW (milliseconds).
  int64_t lease_ms = 30000;
  /// Directories searched for relative model names (before the model folders).
  std::vector<std::string> model_path;
  /// Model folders (--models-dir): when non-empty, models are opened only when their
  /// canonical path (symlinks resolved) lies under one of them, and error texts never say
  /// anything about paths outside them. When empty, only trusted requesters (the daemon's
  /// own uid and root) may name model files.
  std::vector<std::string> models_dirs;
  /// Debug-name prefix of the pools' memfds ("memfd:<prefix><first 16 hex of id>").
  std::string shm_prefix = "/polykv-";
  /// Path of the daemon's pool-descriptor socket, announced in ATTACH replies.
  std::string fd_socket;
  /// Prefill chunk (tokens).
  int64_t prefill_chunk = 512;
  /// backend kCuda: prefill documents (without a parent chain) on that GPU with the CUDA
  /// model runtime (model::CudaLlama, loaded once per model) when it is built and a device
  /// is usable; the K/V are encoded on the host as before. False (the default,
  /// --prefill-device host), or no usable runtime (logged once): the host prefills.
  bool prefill_on_device = false;
  /// Compute threads passed to the default loader (0 = all cores).
  int threads = 0;
  /// Empty: model::LlamaModel::Load with LoadOptions{threads}.
  ModelLoader loader;
  /// Persisted pools (--state-dir), owned by the daemon; null = pools live in memory only.
  /// Published pools are written to it before they become visible, creates and attaches of
  /// a pool found there restore it instead of prefilling, and Evict removes its file.
  PoolStore* store = nullptr;
  /// Model cache bound (LRU over models no create is using): at most this many models ...
  size_t model_cache_models = 2;
  /// ... and at most this many bytes of estimated weights (0 = no byte bound).
  uint64_t model_cache_bytes = 0;
  /// Peer daemons (--peer), owned by the daemon; null = pools come only from prefill and
  /// the state folder. Attach and Replicate of an unknown pool ask them.
  PeerSource* peers = nullptr;
  /// Fault injection for tests: a cancellable pause of this many ms after the memory is
  /// reserved and before the prefill (a create that is "running" for a while).
  int test_create_delay_ms = 0;
};

/// Who sends a request (from the control socket's peer credentials).
struct Requester {
  uint32_t uid = 0;
  /// May name any model file the daemon can read when no --models-dir is configured (the
  /// daemon's own uid and root).
  bool trusted_paths = true;
};

/// Result of CreatePool.
struct CreateResult {
  ipc::PoolInfo info;
  bool created = false;     ///< false when the pool already existed (or another create made it)
  bool restored = false;    ///< created from the state folder (no prefill ran)
  bool replicated = false;  ///< pulled from a peer daemon (no prefill ran)
};

/// A published pool's bytes held for a peer's transfer: a read-only mapping of a duplicate of
/// its sealed memfd (host pools), so an evict meanwhile cannot pull the memory away, or a host
/// copy (pools in GPU memory: UCX from Debian has no CUDA transport, so they are staged).
struct PoolExport {
  ipc::PoolInfo info;
  std::optional<ipc::SealedRegion> map;
  std::vector<uint8_t> staging;
  const void* data() const { return map ? map->data() : staging.data(); }
  uint64_t size() const { return map ? map->size() : staging.size(); }
};

/// The model cache as reported by PING / STATS / LIST.
struct ModelCacheStats {
  uint64_t bytes = 0;         ///< weight bytes the cached models hold (ModelHeldBytes)
  uint64_t mapped_bytes = 0;  ///< of which mapped read-only from the model files
  uint32_t models = 0;
  uint32_t capacity = 0;  ///< PoolManagerOptions::model_cache_models
};

/// Estimated bytes of a model's weights in this runtime: every tensor of LlamaWeights
/// (embeddings, fused q/k/v, o, gate/up, down, norms, untied lm_head) x dtype size.
uint64_t ModelWeightBytes(const model::ModelConfig& config, kernels::DType dtype);

/// Weight bytes a loaded model holds in memory. A model whose weights are used where they lie
/// (WeightStorage::kMapped) holds its stored-format matrices and vectors mapped read-only from
/// the file (LlamaModel::WeightBytesPerToken; page cache shared with every agent mapping the
/// same file), all reported in `*mapped`; a libtorch copy (kCopy) holds ModelWeightBytes of
/// private memory and *mapped = 0.
uint64_t ModelHeldBytes(const model::LlamaModel& model, uint64_t* mapped);

/// Result of Attach / Renew.
struct LeaseGrant {
  std::string lease_id;  ///< 32 hex chars (128 random bits)
  int64_t expires_unix_ms = 0;
  int64_t lease_ms = 0;
  ipc::PoolInfo info;        ///< Attach only
  ipc::MemoryHandle memory;  ///< Attach only
};

/// The codec of a CREATE_POOL that names none, on every backend: the measured default spec
/// (ipc::kDefaultCodecSpec). The CUDA attention kernels read it in place (packed keys, f16
/// norms, per-layer value widths; AttentionCuda tests, scripts/gpu-check.sh).
inline constexpr char kDefaultPoolCodec[] = "default";

/// Parsed codec name: a preset ("none", "paper", "default", "k8v2" | "k8v3" | "k8v4") or a
/// spec (ipc/codec_spec.h, e.g. "k7c-v3-e4x3-nc-n16"); "" = kDefaultPoolCodec.
struct CodecChoice {
  ipc::PoolCodec codec = ipc::PoolCodec::kK8V;
  int32_t value_bits = 3;
  ipc::CodecSpec spec;
  /// "k8v2" / "k8v3" / "k8v4" (and ""): the request's key_scale and norm_correction apply;
  /// a full spec carries its own.
  bool named_bits_only = false;
};
/// Errors: kInvalidArgument naming the grammar and the accepted names.
[[nodiscard]] StatusOr<CodecChoice> ParseCodecName(const std::string& name);
/// "tensor" | "head" | "channel". Errors: kInvalidArgument.
[[nodiscard]] StatusOr<kernels::KeyScaleMode> ParseKeyScale(const std::string& name);

/// Hex SHA-256 content address of a pool: over "polykv-pool-v1", the model fingerprint,
/// the tokenizer fingerprint ("none" without a tokenizer), the codec parameters (codec,
/// key bits, value bits, key scale mode, rotation seed, norm correction, raw dtype) and the
/// token ids (int32 little-endian); for a child pool (pool tree) also the parent's id and the
/// parent chain's length.
std::string ComputePoolId(const std::string& model_fingerprint,
                          const std::string& tokenizer_fingerprint, const ipc::PoolParams& params,
                          const std::vector<int32_t>& token_ids);

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
  /// pool. Memory is reserved only once the create holds the model (right before its
  /// prefill). The pool becomes visible to List/Attach only once complete and sealed.
  /// `cancel` (may be null) and Shutdown() end a create early with kCancelled, also
  /// during the prefill. Errors: kInvalidArgument (codec, key scale, token ids, missing
  /// tokenizer, a model that is not a regular file or folder), kNotFound (model),
  /// kPermissionDenied (model outside the model folders, or an untrusted requester without
  /// --models-dir), kResourceExhausted (memory cap: names used/cap/needed; nothing is left
  /// behind), kCancelled, codec/model errors as returned.
  /// With `request.parent` (a pool tree), the pool holds only the new tokens' KV: they are
  /// prefilled attending in place to the parent chain's (read-only mappings of its sealed
  /// memfds, so an evict meanwhile cannot pull them away) and encoded with the parent's
  /// codec parameters; the model defaults to the parent's. Further errors: kNotFound (no such
  /// parent), kInvalidArgument (another codec or model than the parent's, parent chain +
  /// document longer than the model's context), kFailedPrecondition (a CUDA backend or a
  /// runtime that cannot attend in place), kAborted (the parent was evicted during the
  /// create: nothing is published).
  [[nodiscard]] StatusOr<CreateResult> CreatePool(const ipc::Request& request,
                                                  const ProgressFn& progress,
                                                  const Requester& who = {},
                                                  const std::atomic<bool>* cancel = nullptr);

  /// Grants a lease on a published pool (`pool_id`: full id or a unique prefix of >= 8 hex).
  /// Errors: kNotFound, kInvalidArgument (ambiguous prefix).
  [[nodiscard]] StatusOr<LeaseGrant> Attach(const std::string& pool_id, uint32_t client_pid);
  /// Extends a lease. Errors: kNotFound "pool evicted" for leases of a force-evicted pool,
  /// kNotFound for unknown or expired leases.
  [[nodiscard]] StatusOr<LeaseGrant> Renew(const std::string& lease_id);
  /// Releases a lease. Errors: kNotFound.
  [[nodiscard]] Status Detach(const std::string& lease_id);
  /// Removes a pool. Errors: kNotFound; kFailedPrecondition when it has live leases or child
  /// pools (pool tree, in memory or persisted) and !force. A forced eviction invalidates its
  /// leases and evicts its descendants too (a child is not usable without its parent).
  [[nodiscard]] Status Evict(const std::string& pool_id, bool force);
  /// Drops leases past their expiry; returns how many (logged as one line per sweep).
  int SweepExpiredLeases();
  /// A descriptor (dup) of the sealed memfd of the pool that `lease_id` holds.
  /// Errors: kNotFound (unknown or expired lease, evicted pool), kFailedPrecondition (not a
  /// host pool).
  [[nodiscard]] StatusOr<ipc::UniqueFd> PoolFd(const std::string& lease_id);

  /// Publishes persisted pool `pool_id` (full id or unique prefix) from the store: loads its
  /// model (by the name it was created with) and refuses it when the model is absent or its
  /// fingerprint differs (kFailedPrecondition, logged), then reads and verifies the bytes
  /// (a corrupt file is quarantined: kDataLoss). Returns the pool at once when it is already
  /// published. Errors: also kNotFound (not persisted), kResourceExhausted (memory cap).
  /// A child pool (pool tree) restores its parent chain first (kFailedPrecondition when a
  /// parent is not available); `depth` bounds that recursion (callers leave it 0).
  [[nodiscard]] StatusOr<ipc::PoolInfo> RestorePersisted(const std::string& pool_id, int depth = 0);
  /// Restores every persisted pool (--preload), most recently used first, stopping at the
  /// memory cap; returns how many were published. Failures are logged, not returned.
  int PreloadPersisted();
  /// Pools restored from the store since start (counted once per pool published).
  uint64_t restored_count() const;

  /// Publishes pool `pool_id` (full id or unique prefix) from a peer daemon (PeerSource):
  /// returns it at once when published here, restores it when persisted here; else asks the
  /// peers, checks the pool's model fingerprint against the model of that name this daemon
  /// would serve (kFailedPrecondition naming both when it differs or is absent), replicates
  /// the parent chain first for a child pool, pulls the bytes into a new sealed memfd,
  /// verifies header and payload checksums (kDataLoss) and publishes it under the same id
  /// (persisted too with a state folder). Concurrent calls for one pool share one transfer;
  /// a failed or interrupted transfer publishes nothing and frees its memory. Errors: also
  /// kNotFound (no peer holds it, or no peers), kResourceExhausted (memory cap), the
  /// PeerSource's errors.
  [[nodiscard]] StatusOr<CreateResult> Replicate(const std::string& pool_id,
                                                 const std::atomic<bool>* cancel = nullptr,
                                                 const ProgressFn& progress = {}, int depth = 0);
  /// Holds published pool `pool_id` (full id or unique prefix) for a peer's transfer (a pool
  /// in GPU memory is copied to host memory first). Errors: kNotFound, kInvalidArgument
  /// (ambiguous prefix), kResourceExhausted (no host memory for the copy), CUDA errors.
  [[nodiscard]] StatusOr<PoolExport> ExportForPeer(const std::string& pool_id) const;
  /// Pools replicated from peers since start.
  uint64_t replicated_count() const;
  /// Sets PoolManagerOptions::peers once, before requests are served.
  void SetPeers(PeerSource* peers) { options_.peers = peers; }
  /// Distinct agent processes (client pids) holding live leases, by full pool id.
  std::map<std::string, uint32_t> AgentsByPool() const;

  /// Published pools, oldest first.
  std::vector<ipc::PoolInfo> List() const;
  /// One pool. Errors: kNotFound, kInvalidArgument (ambiguous prefix).
  [[nodiscard]] StatusOr<ipc::PoolInfo> Info(const std::string& pool_id) const;
  /// Every pool this daemon knows, each with its `state`: the published ones ("memory",
  /// oldest first), then the pool files of the state folder not restored since the start
  /// ("disk", least recently used first; restored on the first attach or create, nothing is
  /// read but their manifests), then the quarantined files ("quarantined", oldest first;
  /// the manifest's description when it still reads, else only the id from the file name).
  /// state_detail names the pool file (and for a quarantined one why it was quarantined).
  std::vector<ipc::PoolInfo> Catalog() const;
  /// One pool of the Catalog by full id or unique prefix (>= 8 hex): a published one first,
  /// then a pool file, then a quarantined file. Errors: as Info.
  [[nodiscard]] StatusOr<ipc::PoolInfo> Describe(const std::string& pool_id) const;
  /// Bytes held by published and in-flight pools.
  uint64_t memory_used() const;
  uint64_t memory_cap() const { return options_.memory_cap; }
  ModelCacheStats model_cache() const;
  /// Live leases over all pools.
  uint64_t lease_count() const;
  ipc::PoolMemory backend() const { return options_.backend; }

  /// Refuses new creates (kCancelled) and releases every published pool.
  void Shutdown();

 private:
  using Clock = std::chrono::steady_clock;
  struct Pool {
    ipc::PoolInfo info;
    ipc::MemoryHandle memory;
    std::optional<ipc::SealedRegion> region;  // host: sealed memfd
    std::optional<ipc::CudaArena> arena;      // cuda
    int64_t seq = 0;
    uint32_t leases = 0;  // live leases (expired ones are dropped first)
  };
  struct Lease {
    std::string pool_id;
    std::multimap<Clock::time_point, std::string>::iterator expiry;
    uint32_t client_pid = 0;
  };
  struct InFlight {
    bool done = false;
    Status status;
    std::condition_variable cv;
  };
  /// Identity of a model file: canonical path + device, inode, size and mtime, so the same
  /// file under different spellings is one entry and a replaced file is a new one.
  struct ModelKey {
    std::string canonical;
    uint64_t dev = 0, ino = 0, size = 0;
    int64_t mtime_ns = 0;
    bool operator<(const ModelKey& o) const {
      return std::tie(dev, ino, size, mtime_ns, canonical) <
             std::tie(o.dev, o.ino, o.size, o.mtime_ns, o.canonical);
    }
  };
  struct ModelEntry {
    ModelKey key;
    std::mutex load_mu;  ///< held while loading
    bool loaded = false;
    std::unique_ptr<model::LlamaModel> model;
    /// The same model on the GPU for prefills (PoolManagerOptions::prefill_on_device),
    /// loaded at the first create that prefills; guarded by `running` like `model`.
    std::unique_ptr<model::CudaLlama> cuda;
    bool cuda_failed = false;   ///< its load failed once (logged): the host prefills
    uint64_t bytes = 0;         ///< ModelHeldBytes
    uint64_t mapped_bytes = 0;  ///< of which mapped from the model file
    // Forward passes are not reentrant: one create at a time holds the model (`running`).
    // A flag + condition variable rather than a timed mutex, so that waiting creates can be
    // cancelled (and ThreadSanitizer, which does not see pthread_mutex_clocklock, agrees).
    std::mutex run_state_mu;
    std::condition_variable run_cv;
    bool running = false;
    uint64_t last_used = 0;  ///< LRU tick (guarded by models_mu_)
  };
  /// A model file opened and checked by OpenModel.
  struct OpenedModel {
    ipc::UniqueFd fd;
    ModelKey key;
    std::string loader_path;  ///< "/proc/self/fd/<n>" (or the canonical path)
  };

  [[nodiscard]] StatusOr<OpenedModel> OpenModel(const std::string& name,
                                                const Requester& who) const;
  [[nodiscard]] StatusOr<std::shared_ptr<ModelEntry>> GetModel(OpenedModel opened,
                                                               const std::string& name,
                                                               const ProgressFn& progress);
  void TrimModelCacheLocked(const ModelEntry* keep);
  [[nodiscard]] StatusOr<CreateResult> Restore(const ipc::PoolFileManifest& manifest);
  /// Fills a new pool region of `needed` bytes with `fill` and publishes it as `info` (Restore
  /// and Replicate); `origin` is "state" or "peer tcp://...". Nothing is left on error.
  using FillFn = std::function<Status(void* dst, uint64_t size)>;
  [[nodiscard]] StatusOr<CreateResult> PublishFilled(const ipc::PoolInfo& info, uint64_t needed,
                                                     const std::string& origin, const FillFn& fill);
  /// PublishFilled's region: allocated, filled, checked (a replica: CheckReplica, then
  /// persisted) and sealed into `pool`.
  [[nodiscard]] Status FillPublished(const ipc::PoolInfo& info, uint64_t needed, bool from_state,
                                     const FillFn& fill, Pool* pool);
  /// A replica's payload checksums, and its header against what the peer announced (id,
  /// tokens, parent, model fingerprint). Errors: kDataLoss.
  [[nodiscard]] static Status CheckReplica(const ipc::PoolInfo& info, const void* base,
                                           uint64_t needed);
  /// OK when this daemon would serve a pool made with `info.model` of fingerprint
  /// `info.model_fingerprint`; else kFailedPrecondition starting with `what`.
  [[nodiscard]] Status CheckServableModel(const ipc::PoolInfo& info, const std::string& what);
  /// Waits for a create / restore / replication of `id` in flight. Returns the pool when it
  /// is (or became) published; else registers `*flight` for the caller and returns nullopt.
  /// `cancel` (may be null) and Shutdown() end the wait with kCancelled.
  [[nodiscard]] StatusOr<std::optional<ipc::PoolInfo>> JoinOrRegisterFlight(
      const std::string& id, std::shared_ptr<InFlight>* flight,
      const std::atomic<bool>* cancel = nullptr);
  void FinishFlight(const std::string& id, const std::shared_ptr<InFlight>& flight,
                    const Status& status);
  [[nodiscard]] StatusOr<std::string> ResolvePoolIdLocked(const std::string& id_or_prefix) const;
  void DropExpiredLeasesLocked();
  void EraseLeaseLocked(std::map<std::string, Lease>::iterator it);
  ipc::PoolInfo InfoLocked(const Pool& pool) const;
  bool Cancelled(const std::atomic<bool>* cancel) const;
  /// The parent chain of a child pool being created: root first, each host pool mapped
  /// read-only from a duplicate of its sealed memfd, each pool in GPU memory (the cuda
  /// backend) copied device to device under the lock (independent of the Pool entries: an
  /// evict cannot pull them away).
  struct ParentChain {
    std::vector<ipc::PoolInfo> infos;
    std::vector<ipc::SealedRegion> maps;
    /// [pool]: the device copy of a pool in GPU memory, else empty.
    std::vector<std::optional<ipc::CudaArena>> device_copies;
    /// [pool]: the device copy's view in place (only while every pool of the chain has one:
    /// what a GPU prefill of the child attends to).
    std::vector<kernels::PrefixView> device_views;
    /// Host copies of device copies, made only when the host prefills the child.
    std::deque<std::vector<uint8_t>> read_back;
    /// [pool]: host views (a device copy's only after ReadBackParentChain; empty before).
    std::vector<kernels::PrefixView> views;
    std::vector<int32_t> tokens;  ///< all positions of the chain
    ipc::PoolParams leaf_params;  ///< the parent's pool parameters (codec, shape)
    /// Whether a GPU prefill can attend to every pool of the chain where it lies.
    bool on_device() const { return !infos.empty() && device_views.size() == infos.size(); }
    /// Frees the device copies (and their views) once no prefill reads them.
    void ReleaseDeviceCopies() {
      device_views.clear();
      for (auto& c : device_copies) c.reset();
    }
  };
  [[nodiscard]] StatusOr<std::shared_ptr<ParentChain>> OpenParentChain(
      const std::string& parent_id);
  /// Gives every pool of `chain` a host view: device copies are read back to host memory
  /// (one info line each: the bytes and why; their device copies freed). Errors:
  /// kResourceExhausted (host memory), device copy errors, kDataLoss (a copy that does not
  /// verify).
  [[nodiscard]] Status ReadBackParentChain(ParentChain* chain) const;
  // CreatePool's steps (pool_admission.cc).
  /// The create's codec and key scale: parsed from the request, or the parent's (a child may
  /// name it again, not another). Errors: kInvalidArgument.
  [[nodiscard]] Status CreateCodec(const ipc::Request& request, const ParentChain* chain,
                                   CodecChoice* codec, kernels::KeyScaleMode* key_scale) const;
  /// The request's token ids, or its document tokenized; checked against the vocabulary and
  /// the model's context (after the parent chain). Errors: kInvalidArgument.
  [[nodiscard]] StatusOr<std::vector<int32_t>> CreateTokens(const ipc::Request& request,
                                                            const model::LlamaModel& m,
                                                            const ParentChain* chain,
                                                            const ProgressFn& progress) const;
  /// The pool's shape, codec parameters (the parent's for a child) and fingerprints.
  [[nodiscard]] StatusOr<ipc::PoolParams> CreateParams(
      const model::LlamaModel& m, const CodecChoice& codec, kernels::KeyScaleMode key_scale,
      bool norm_correction, const ParentChain* chain, size_t tokens) const;
  /// Restores the pool from the state folder when it is there (a failed restore other than
  /// the memory cap or a cancel falls back to a prefill), else Builds it.
  [[nodiscard]] StatusOr<CreateResult> RestoreOrBuild(
      const std::string& model_name, ModelEntry* entry, const std::string& pool_id,
      const ipc::PoolParams& params, const std::vector<int32_t>& token_ids,
      const ProgressFn& progress, const std::atomic<bool>* cancel, ParentChain* chain);
  [[nodiscard]] StatusOr<CreateResult> Build(
      const std::string& model_name, ModelEntry* entry, const std::string& pool_id,
      const ipc::PoolParams& params, const std::vector<int32_t>& token_ids,
      const ProgressFn& progress, const std::atomic<bool>* cancel, ParentChain* chain = nullptr);
  // Build's steps (pool_build.cc).
  /// A create's hold on its model's forward pass (ModelEntry::running), released at the end
  /// of its scope at the latest.
  class RunSlot;
  /// A create's reservation of memory against the cap: unless dismissed at the publish,
  /// leaving its scope gives the bytes back and drops the half-made region.
  class Reservation;
  /// A pool between its reservation and its publish: region, staging copy, writer, timings.
  struct PendingPool;
  /// Allocate, prefill, encode (then hand back the model), seal: the pool ready to publish.
  [[nodiscard]] Status FillPool(ModelEntry* entry, const std::vector<int32_t>& token_ids,
                                const ProgressFn& progress, const std::atomic<bool>* cancel,
                                ParentChain* chain, RunSlot* run, PendingPool* p);
  /// AllocatePoolMemory of the pending pool's size: sets p->base, where the encoder writes.
  [[nodiscard]] Status AllocateRegion(PendingPool* p);
  /// A sealed memfd (host) or a CUDA arena plus a host staging copy (`*staging`) of `needed`
  /// bytes into `pool`; returns where to write the pool (the memfd or the staging copy).
  [[nodiscard]] StatusOr<void*> AllocatePoolMemory(const std::string& pool_id, uint64_t needed,
                                                   bool cuda, Pool* pool,
                                                   std::vector<uint8_t>* staging);
  /// CUDA: copies `staging` (when not empty) into the arena and exports it. Host: seals the
  /// memfd and verifies the payload once more (kDataLoss "pool changed between `filled_by`
  /// and seal"). Fills pool->memory.
  [[nodiscard]] Status SealPoolMemory(uint64_t needed, const std::vector<uint8_t>& staging,
                                      const char* filled_by, Pool* pool);
  /// Whether this daemon asks for prefills on the GPU (backend cuda with --prefill-device
  /// cuda); DevicePrefiller may still find the runtime unusable.
  bool PrefillsOnDevice() const {
    return options_.backend == ipc::PoolMemory::kCuda && options_.prefill_on_device;
  }
  /// The model's GPU prefiller (PrefillsOnDevice), loaded at first use; null when the host
  /// prefills.
  model::CudaLlama* DevicePrefiller(ModelEntry* entry);
  /// Prefills `token_ids` (after the parent chain, if any: on the GPU in place when the
  /// chain lies there and the GPU prefills, else on the host after ReadBackParentChain);
  /// checks the layer count.
  [[nodiscard]] StatusOr<model::PrefillResult> PrefillForPool(ModelEntry* entry,
                                                              const std::vector<int32_t>& token_ids,
                                                              const ProgressFn& progress,
                                                              const std::atomic<bool>* cancel,
                                                              ParentChain* chain, PendingPool* p);
  /// Encodes every layer of `prefill` into the pool's region (p->writer).
  [[nodiscard]] Status EncodeLayers(const model::PrefillResult& prefill,
                                    const std::vector<int32_t>& token_ids,
                                    const ProgressFn& progress, const std::atomic<bool>* cancel,
                                    PendingPool* p);
  /// Finalizes the header, then seals and re-verifies the memfd (host) or copies and exports
  /// the arena (cuda): fills p->pool.memory.
  [[nodiscard]] Status SealPool(const ProgressFn& progress, PendingPool* p);
  /// Writes the pool to the state folder (when there is one; a failure is only logged) and
  /// frees the staging copy.
  void PersistPool(PendingPool* p);
  /// Inserts the pool into pools_ and dismisses the reservation; kCancelled on shutdown,
  /// kAborted when the parent was evicted meanwhile.
  [[nodiscard]] StatusOr<CreateResult> PublishPool(PendingPool* p, Reservation* reservation,
                                                   const ProgressFn& progress,
                                                   const std::atomic<bool>* cancel,
                                                   const ParentChain* chain);
  /// Evicts `id` and its descendants (mu_ held); returns how many pools went. Their pool
  /// files (with a state folder) are appended to `files` for the caller to remove.
  int EvictTreeLocked(const std::string& id, std::vector<std::string>* files);
  /// Evict's checks and work in memory under mu_, given what it read from the state folder
  /// beforehand (`files`: every manifest; `on_disk`: pool_id's own file, when not published).
  /// Appends the pool files to delete to `remove`.
  [[nodiscard]] Status EvictLocked(const std::string& pool_id, bool force,
                                   const std::vector<ipc::PoolFileManifest>& files,
                                   const std::optional<ipc::PoolFileManifest>& on_disk,
                                   std::vector<std::string>* remove);
  /// Full ids of the pools in memory whose parent is `id` (mu_ held).
  std::vector<std::string> ChildrenLocked(const std::string& id) const;

  PoolManagerOptions options_;
  std::vector<std::string> roots_;        // canonical model folders
  std::vector<std::string> roots_given_;  // as configured (lexically normalized)
  mutable std::mutex mu_;
  std::atomic<bool> shutdown_{false};
  std::map<std::string, Pool> pools_;  // by full hex id
  std::map<std::string, std::shared_ptr<InFlight>> in_flight_;
  std::map<std::string, Lease> leases_;
  std::multimap<Clock::time_point, std::string> expiry_;  // lease expiry -> lease id
  std::set<std::string> evicted_leases_;                  // leases of force-evicted pools
  uint64_t expired_unreported_ = 0;                       // for the one-line sweep log
  uint64_t used_ = 0;                                     // published + reserved bytes
  int64_t seq_ = 0;
  uint64_t restored_ = 0;    // pools restored from the store
  uint64_t replicated_ = 0;  // pools pulled from peers
  mutable std::mutex models_mu_;
  std::map<ModelKey, std::shared_ptr<ModelEntry>> models_;
  uint64_t model_tick_ = 0;
};

}  // namespace polykv::daemon
