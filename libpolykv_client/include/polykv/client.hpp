// libpolykv_client C++17 RAII wrapper over the C API in client.h (header-only).
//
// Depends on nothing but the C API and the standard library (no Abseil), so an external
// project links only polykv::client. Errors are returned as polykv::client::Status /
// Result<T>; nothing throws except Result<T>::value() on an error (std::logic_error).
//
//   auto client = polykv::client::Client::Connect();            // default endpoint, 5 s
//   if (!client.ok()) { std::cerr << client.status().ToString(); return 1; }
//   auto pool = client->Attach(id);                             // lease + read-only map
//   std::vector<float> k(pool->LayerElements()), v(k.size());
//   for (uint32_t l = 0; l < pool->info().layers; ++l)
//     pool->DecodeLayer(l, k.data(), v.data(), polykv::client::DType::kF32);
//   // ~Pool detaches, ~Client disconnects.
#ifndef POLYKV_CLIENT_HPP_
#define POLYKV_CLIENT_HPP_

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "polykv/client.h"

namespace polykv::client {

/// Status codes (values match polykv_status and absl::StatusCode).
enum class StatusCode : int {
  kOk = POLYKV_OK,
  kCancelled = POLYKV_CANCELLED,
  kUnknown = POLYKV_UNKNOWN,
  kInvalidArgument = POLYKV_INVALID_ARGUMENT,
  kDeadlineExceeded = POLYKV_DEADLINE_EXCEEDED,
  kNotFound = POLYKV_NOT_FOUND,
  kAlreadyExists = POLYKV_ALREADY_EXISTS,
  kPermissionDenied = POLYKV_PERMISSION_DENIED,
  kResourceExhausted = POLYKV_RESOURCE_EXHAUSTED,
  kFailedPrecondition = POLYKV_FAILED_PRECONDITION,
  kAborted = POLYKV_ABORTED,
  kOutOfRange = POLYKV_OUT_OF_RANGE,
  kUnimplemented = POLYKV_UNIMPLEMENTED,
  kInternal = POLYKV_INTERNAL,
  kUnavailable = POLYKV_UNAVAILABLE,
  kDataLoss = POLYKV_DATA_LOSS,
};

/// A status code plus message (a lightweight, Abseil-free absl::Status look-alike).
class [[nodiscard]] Status {
 public:
  /// OK.
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  /// Status of a C API call: OK, or `status` with this thread's polykv_last_error().
  static Status FromC(polykv_status status) {
    if (status == POLYKV_OK) return Status();
    return Status(static_cast<StatusCode>(status), polykv_last_error());
  }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  /// "NOT_FOUND" etc.
  const char* CodeName() const { return polykv_status_string(static_cast<polykv_status>(code_)); }
  /// "OK" or "<CODE_NAME>: message".
  std::string ToString() const {
    if (ok()) return "OK";
    return std::string(CodeName()) + ": " + message_;
  }
  /// Marks a deliberately ignored status.
  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

/// A value or the Status that prevented it.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit like absl::StatusOr
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) status_ = Status(StatusCode::kInternal, "Result built from OK status");
  }
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  /// The value; throws std::logic_error carrying status().ToString() when !ok().
  T& value() & {
    Check();
    return *value_;
  }
  const T& value() const& {
    Check();
    return *value_;
  }
  T&& value() && {
    Check();
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void Check() const {
    if (!value_)
      throw std::logic_error("polykv::client::Result has no value: " + status_.ToString());
  }
  Status status_;
  std::optional<T> value_;
};

/// Element type of decoded K/V.
enum class DType : int {
  kF32 = POLYKV_DTYPE_F32,
  kF16 = POLYKV_DTYPE_F16,
  kBF16 = POLYKV_DTYPE_BF16,
};

/// Bytes per element of `dtype` (4 or 2).
inline size_t DTypeBytes(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

/// Description of a pool (see polykv_pool_info). Sizes in bytes, times in ms.
struct PoolInfo {
  std::string id;                 ///< 64 hex chars
  std::string codec;              ///< "k8v3", "k8v2", "k8v4", "none"
  std::string backend;            ///< "host" or "cuda"
  std::string model;              ///< model path given at create
  std::string model_fingerprint;  ///< hex SHA-256
  std::string architecture;       ///< "llama", "qwen2", "mistral" (model it was built with)
  std::string tokenizer_family;   ///< "bpe/llama3", "spm", ... ("none" without a tokenizer)
  uint32_t layers = 0, kv_heads = 0, head_dim = 0;
  uint64_t tokens = 0;
  uint64_t total_bytes = 0;    ///< whole shared region
  uint64_t bf16_bytes = 0;     ///< same KV cache held privately in bf16
  double effective_ratio = 0;  ///< bf16_bytes / total_bytes
  uint32_t leases = 0;
  uint64_t key_codes_bytes = 0, key_scales_bytes = 0, value_codes_bytes = 0, value_norms_bytes = 0,
           overhead_bytes = 0;
  int64_t created_unix_ms = 0;
  double prefill_ms = 0, encode_ms = 0, publish_ms = 0;
  /// Reconstruction error recorded at build (see polykv_pool_info); 0 layers: not recorded.
  uint32_t fidelity_layers = 0;
  double key_rel_mse_mean = 0, key_rel_mse_max = 0, value_rel_mse_mean = 0, value_rel_mse_max = 0;
  /// Pool tree: the parent's id ("" for a root pool) and the parent chain's positions.
  std::string parent;
  uint64_t parent_tokens = 0;
  /// "prefill", "state" or "peer tcp://HOST:PORT" (see polykv_pool_info).
  std::string origin;
  /// "memory", "disk" (a pool file only, restored on first use) or "quarantined" (see
  /// polykv_pool_info); state_detail: the file, and why for a quarantined one.
  std::string state, state_detail;
  /// The C struct these members were copied from: every field, those added to
  /// polykv_pool_info after this wrapper's members included.
  polykv_pool_info raw = polykv_pool_info_init();

  /// Converts from the C struct.
  static PoolInfo FromC(const polykv_pool_info& c) {
    PoolInfo p;
    p.id = c.id;
    p.codec = c.codec;
    p.backend = c.backend;
    p.model = c.model;
    p.model_fingerprint = c.model_fingerprint;
    p.architecture = c.architecture;
    p.tokenizer_family = c.tokenizer_family;
    p.layers = c.layers;
    p.kv_heads = c.kv_heads;
    p.head_dim = c.head_dim;
    p.tokens = c.tokens;
    p.total_bytes = c.total_bytes;
    p.bf16_bytes = c.bf16_bytes;
    p.effective_ratio = c.effective_ratio;
    p.leases = c.leases;
    p.key_codes_bytes = c.key_codes_bytes;
    p.key_scales_bytes = c.key_scales_bytes;
    p.value_codes_bytes = c.value_codes_bytes;
    p.value_norms_bytes = c.value_norms_bytes;
    p.overhead_bytes = c.overhead_bytes;
    p.created_unix_ms = c.created_unix_ms;
    p.prefill_ms = c.prefill_ms;
    p.encode_ms = c.encode_ms;
    p.publish_ms = c.publish_ms;
    p.fidelity_layers = c.fidelity_layers;
    p.key_rel_mse_mean = c.key_rel_mse_mean;
    p.key_rel_mse_max = c.key_rel_mse_max;
    p.value_rel_mse_mean = c.value_rel_mse_mean;
    p.value_rel_mse_max = c.value_rel_mse_max;
    p.parent = c.parent;
    p.parent_tokens = c.parent_tokens;
    p.origin = c.origin;
    p.state = c.state;
    p.state_detail = c.state_detail;
    p.raw = c;
    return p;
  }
  /// Elements of one of K or V of a layer: kv_heads * tokens * head_dim.
  size_t LayerElements() const { return size_t{kv_heads} * tokens * head_dim; }
};

/// PING reply.
struct DaemonInfo {
  std::string version;
  uint32_t pid = 0;
  uint64_t memory_used = 0, memory_cap = 0;  ///< bytes
  std::string instance;                      ///< 32 hex chars, new at every daemon start
  uint64_t model_cache_bytes = 0;            ///< weight bytes the models kept loaded hold
  uint64_t model_cache_mapped_bytes = 0;     ///< of which mapped read-only from model files
  uint32_t model_cache_models = 0, model_cache_capacity = 0;
  uint32_t creates_queued = 0, creates_running = 0, create_queue_capacity = 0;
};

/// Options of Client::CreatePool (see polykv_create_options). Give `document` or
/// `token_ids`, not both.
struct CreateOptions {
  std::string model;                 ///< model path (resolved by the daemon)
  std::string document;              ///< text to tokenize (empty when token_ids is used)
  std::vector<int32_t> token_ids;    ///< explicit ids (empty when document is used)
  std::string codec;                 ///< "k8v3" (default: "") | "k8v2" | "k8v4" | "none";
                                     ///< a child's default is its parent's
  std::string key_scale = "tensor";  ///< "tensor" | "head" | "channel"
  bool norm_correction = false;
  bool add_bos = true;
  int timeout_ms = 600000;  ///< bound for the whole create (ms)
  /// A child pool (pool tree): the parent's id or unique prefix; `model` may stay empty.
  std::string parent;
};

/// Result of Client::CreatePool.
struct CreatedPool {
  PoolInfo info;
  bool created = false;  ///< false when an identical pool already existed
};

/// Progress of a create: stage ("tokenize", "prefill", "encode", "publish"), done, total.
using ProgressFn = std::function<void(const std::string& stage, int64_t done, int64_t total)>;

class Pool;

/// A connection to polykvd (move-only; disconnects on destruction). Thread-safe: calls from
/// several threads are serialised on the connection.
class Client {
 public:
  /// Connects and PINGs. `endpoint` empty = $POLYKV_ENDPOINT or the default endpoint.
  /// `timeout_ms` bounds each request try (Lazy Pirate: a few tries, then kUnavailable).
  static Result<Client> Connect(const std::string& endpoint = "", int timeout_ms = 5000) {
    polykv_client* c = nullptr;
    polykv_status s = polykv_connect(endpoint.empty() ? nullptr : endpoint.c_str(), timeout_ms, &c);
    if (s != POLYKV_OK) return Status::FromC(s);
    return Client(c);
  }
  Client(Client&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  Client& operator=(Client&& o) noexcept {
    if (this != &o) {
      polykv_disconnect(c_);
      c_ = std::exchange(o.c_, nullptr);
    }
    return *this;
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client() { polykv_disconnect(c_); }

  /// PING: daemon version, pid, instance, memory, model cache and create queue.
  Result<DaemonInfo> Ping() {
    polykv_daemon_status d{};
    d.struct_size = sizeof(d);
    polykv_status s = polykv_daemon_get_status(c_, &d);
    if (s != POLYKV_OK) return Status::FromC(s);
    DaemonInfo info;
    info.version = d.version;
    info.pid = d.pid;
    info.memory_used = d.memory_used;
    info.memory_cap = d.memory_cap;
    info.instance = d.instance;
    info.model_cache_bytes = d.model_cache_bytes;
    info.model_cache_mapped_bytes = d.model_cache_mapped_bytes;
    info.model_cache_models = d.model_cache_models;
    info.model_cache_capacity = d.model_cache_capacity;
    info.creates_queued = d.creates_queued;
    info.creates_running = d.creates_running;
    info.create_queue_capacity = d.create_queue_capacity;
    return info;
  }
  /// All published pools.
  Result<std::vector<PoolInfo>> ListPools() {
    for (int attempt = 0; attempt < 4; ++attempt) {
      size_t count = 0;
      polykv_status s = polykv_list_pools(c_, nullptr, 0, &count);
      if (s != POLYKV_OK) return Status::FromC(s);
      std::vector<polykv_pool_info> raw(count + 4, polykv_pool_info_init());
      s = polykv_list_pools(c_, raw.data(), raw.size(), &count);
      if (s != POLYKV_OK) return Status::FromC(s);
      if (count > raw.size()) continue;  // pools were published in between
      std::vector<PoolInfo> out;
      out.reserve(count);
      for (size_t i = 0; i < count; ++i) out.push_back(PoolInfo::FromC(raw[i]));
      return out;
    }
    return Status(StatusCode::kAborted, "pool list kept changing while being read");
  }
  /// STATS of one pool (kNotFound for an unknown id).
  Result<PoolInfo> GetPoolInfo(const std::string& id) {
    polykv_pool_info info = polykv_pool_info_init();
    polykv_status s = polykv_pool_info_by_id(c_, id.c_str(), &info);
    if (s != POLYKV_OK) return Status::FromC(s);
    return PoolInfo::FromC(info);
  }
  /// CREATE_POOL, streaming progress to `progress` (may be empty). The document goes as all
  /// of its bytes (NULs included); it must be valid UTF-8 (kInvalidArgument naming the
  /// byte offset otherwise).
  Result<CreatedPool> CreatePool(const CreateOptions& options, const ProgressFn& progress = {}) {
    polykv_create_options o;
    polykv_create_options_init(&o);
    o.model = options.model.empty() ? nullptr : options.model.c_str();
    o.parent = options.parent.empty() ? nullptr : options.parent.c_str();
    o.document = nullptr;
    o.token_ids = options.token_ids.empty() ? nullptr : options.token_ids.data();
    o.token_count = options.token_ids.size();
    o.codec = options.codec.c_str();
    o.key_scale = options.key_scale.c_str();
    o.norm_correction = options.norm_correction ? 1 : 0;
    o.add_bos = options.add_bos ? 1 : 0;
    o.timeout_ms = options.timeout_ms;
    polykv_pool_info info = polykv_pool_info_init();
    int created = 0;
    const bool text = options.token_ids.empty();
    polykv_status s = polykv_create_pool_from_text(
        c_, &o, text ? options.document.data() : nullptr, text ? options.document.size() : 0,
        progress ? &Client::ProgressTrampoline : nullptr, const_cast<ProgressFn*>(&progress), &info,
        &created);
    if (s != POLYKV_OK) return Status::FromC(s);
    return CreatedPool{PoolInfo::FromC(info), created != 0};
  }
  /// The daemon's peers as it last saw them (empty without --peer).
  Result<std::vector<polykv_peer_info>> Peers() {
    size_t count = 0;
    polykv_status s = polykv_daemon_peers(c_, nullptr, 0, &count);
    if (s != POLYKV_OK) return Status::FromC(s);
    std::vector<polykv_peer_info> out(count, polykv_peer_info_init());
    s = polykv_daemon_peers(c_, out.data(), out.size(), &count);
    if (s != POLYKV_OK) return Status::FromC(s);
    out.resize(std::min(count, out.size()));
    return out;
  }
  /// FETCH: the daemon replicates pool `id` from a peer (see polykv_fetch_pool).
  Result<CreatedPool> FetchPool(const std::string& id, const ProgressFn& progress = {}) {
    polykv_pool_info info = polykv_pool_info_init();
    int fetched = 0;
    polykv_status s =
        polykv_fetch_pool(c_, id.c_str(), progress ? &Client::ProgressTrampoline : nullptr,
                          const_cast<ProgressFn*>(&progress), &info, &fetched);
    if (s != POLYKV_OK) return Status::FromC(s);
    return CreatedPool{PoolInfo::FromC(info), fetched != 0};
  }
  /// EVICT (`force`: even with live leases).
  Status Evict(const std::string& id, bool force = false) {
    return Status::FromC(polykv_evict(c_, id.c_str(), force ? 1 : 0));
  }
  /// ATTACH: lease + read-only mapping (see Pool).
  inline Result<Pool> Attach(const std::string& id);

  /// The C handle (owned by this object).
  polykv_client* get() const { return c_; }

 private:
  explicit Client(polykv_client* c) : c_(c) {}
  static void ProgressTrampoline(const char* stage, int64_t done, int64_t total, void* user) {
    try {
      (*static_cast<const ProgressFn*>(user))(stage, done, total);
    } catch (...) {
      // A callback's exception must not unwind through the C library.
    }
  }
  polykv_client* c_ = nullptr;
};

/// An attached pool (move-only): holds a lease, renewed in the background until destroyed,
/// and a read-only mapping. Independent of the Client's lifetime once attached.
class Pool {
 public:
  /// ATTACH `id` through `client`.
  static Result<Pool> Attach(Client& client, const std::string& id) {
    polykv_pool* p = nullptr;
    polykv_status s = polykv_attach(client.get(), id.c_str(), &p);
    if (s != POLYKV_OK) return Status::FromC(s);
    polykv_pool_info info = polykv_pool_info_init();
    s = polykv_pool_get_info(p, &info);
    if (s != POLYKV_OK) {
      Status st = Status::FromC(s);
      polykv_detach(p);
      return st;
    }
    return Pool(p, PoolInfo::FromC(info));
  }
  Pool(Pool&& o) noexcept : p_(std::exchange(o.p_, nullptr)), info_(std::move(o.info_)) {}
  Pool& operator=(Pool&& o) noexcept {
    if (this != &o) {
      polykv_detach(p_);
      p_ = std::exchange(o.p_, nullptr);
      info_ = std::move(o.info_);
    }
    return *this;
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  ~Pool() { polykv_detach(p_); }

  /// Shape, codec and sizes as seen at attach.
  const PoolInfo& info() const { return info_; }
  /// Elements of one of K or V of a layer: kv_heads * tokens * head_dim.
  size_t LayerElements() const { return info_.LayerElements(); }
  /// Token ids of the pool's document [tokens].
  Result<std::vector<int32_t>> TokenIds() const {
    std::vector<int32_t> ids(info_.tokens);
    polykv_status s = polykv_pool_token_ids(p_, ids.data(), ids.size());
    if (s != POLYKV_OK) return Status::FromC(s);
    return ids;
  }
  /// Decodes `layer` into host buffers k, v, each [kv_heads][tokens][head_dim] of `dtype`
  /// (LayerElements() elements). kNotFound / kFailedPrecondition when the lease is invalid.
  Status DecodeLayer(uint32_t layer, void* k, void* v, DType dtype = DType::kF32) const {
    return Status::FromC(polykv_decode_layer(p_, layer, k, v, static_cast<polykv_dtype>(dtype)));
  }
  /// Recomputes the payload checksum (kDataLoss on mismatch).
  Status Verify() const { return Status::FromC(polykv_pool_verify(p_)); }
  /// The lease as last seen by the renewal thread (OK while valid).
  Status LeaseStatus() const { return Status::FromC(polykv_pool_lease_status(p_)); }
  /// Releases the lease and unmaps now (the destructor does it otherwise).
  Status Detach() {
    if (!p_) return Status();
    return Status::FromC(polykv_detach(std::exchange(p_, nullptr)));
  }
  /// The C handle (owned by this object; nullptr after Detach).
  polykv_pool* get() const { return p_; }

 private:
  Pool(polykv_pool* p, PoolInfo info) : p_(p), info_(std::move(info)) {}
  polykv_pool* p_ = nullptr;
  PoolInfo info_;
};

inline Result<Pool> Client::Attach(const std::string& id) { return Pool::Attach(*this, id); }

}  // namespace polykv::client

#endif  // POLYKV_CLIENT_HPP_
