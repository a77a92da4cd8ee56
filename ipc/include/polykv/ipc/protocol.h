// The polykvd control protocol: versioned JSON messages over ZeroMQ (ROUTER in polykvd,
// DEALER in clients). One message = one frame of UTF-8 JSON (after the ROUTER identity
// frame and an empty delimiter frame on the daemon side). Every message begins with
// "magic": "PKV1" and "version": 1; replies echo the request's "type" and "id".
//
//   request  {"magic":"PKV1","version":1,"type":"ATTACH","id":7, ...fields}
//   reply    {"magic":"PKV1","version":1,"type":"ATTACH","id":7,"ok":true, ...fields}
//   error    {"magic":"PKV1","version":1,"type":"ATTACH","id":7,"ok":false,
//             "code":"NOT_FOUND","error":"unknown pool 3fa2..."}
//   progress {"magic":"PKV1","version":1,"type":"PROGRESS","id":7,"stage":"prefill",
//             "done":512,"total":2048}   (zero or more before a CREATE_POOL reply)
//
// Every reply of polykvd carries "instance": 32 random hex chars drawn at start-up, so a
// client notices a daemon restart on the same endpoint. While a CREATE_POOL that asked for
// progress is queued or running, polykvd sends a PROGRESS at least every kHeartbeatMs
// (repeating the last stage with "heartbeat":true when nothing moved): silence longer than
// that means the daemon died or hung. Strings are UTF-8; a document is sent as a JSON
// string (NUL bytes as \u0000) together with its byte length "document_bytes".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "polykv/ipc/cuda_ipc.h"
#include "polykv/ipc/pool_memory.h"
#include "polykv/status.h"

namespace polykv::ipc {

inline constexpr char kProtocolMagic[] = "PKV1";
inline constexpr int kProtocolVersion = 1;
/// Largest accepted message (bytes); larger ones get an error reply (RESOURCE_EXHAUSTED).
inline constexpr size_t kMaxMessageBytes = 16u << 20;
/// Longest "error" text of a reply; longer ones are cut (client input is never echoed at
/// full size).
inline constexpr size_t kMaxErrorBytes = 1024;
/// polykvd sends a PROGRESS at least this often while a create with progress is in flight.
inline constexpr int kHeartbeatMs = 1000;

enum class MessageType {
  kCreatePool,
  kAttach,
  kRenew,
  kDetach,
  kList,
  kStats,
  kEvict,
  kPing,
  kProgress,
  /// "ERROR": reply type used only when a frame's own type could not be read (malformed
  /// JSON, missing/unknown "type"); always ok=false.
  kError,
  /// "FETCH" (operator): replicate pool `pool_id` from a peer daemon (`pools fetch`); the
  /// reply carries the pool once it is published here. With "progress", PROGRESS messages
  /// (stage "fetch") come first.
  kFetch,
  /// Daemon-to-daemon, on the CURVE-authenticated TCP peer channel only (never accepted on
  /// the local endpoint). "PEER_FETCH" {pool_id}: the holder registers the pool's memory
  /// with UCX and replies {pool, pool_bytes, transfer_id, descriptor}; the bytes are then
  /// pulled with one-sided UCX reads (ipc/ucx_transfer.h). "PEER_RELEASE" {transfer_id}:
  /// the requester is done (the holder also drops a transfer on its own after a deadline).
  kPeerFetch,
  kPeerRelease,
};
/// "CREATE_POOL", "ATTACH", ... ; kInvalidArgument for unknown names.
std::string_view MessageTypeName(MessageType type);
[[nodiscard]] StatusOr<MessageType> ParseMessageType(std::string_view name);

/// Request fields a message requires (MessageSpec::required, a bit set).
enum RequiredField : uint32_t {
  kNeedsPoolId = 1u << 0,         ///< "pool_id" non-empty
  kNeedsLeaseId = 1u << 1,        ///< "lease_id" non-empty
  kNeedsTransferId = 1u << 2,     ///< "transfer_id" non-empty
  kNeedsModelOrParent = 1u << 3,  ///< "model" or "parent" non-empty
  kNeedsDocument = 1u << 4,       ///< "document" or "token_ids" non-empty
};
/// Who may send a request.
enum class MessageRole {
  kNone,      ///< not a request (PROGRESS, ERROR)
  kReader,    ///< any allowed uid (reader or operator) on the local endpoint
  kOperator,  ///< operators only on the local endpoint
  kPeer,      ///< other daemons only, on the CURVE-authenticated peer channel
};
/// Where polykvd serves a request.
enum class MessageRuns {
  kInline,  ///< on the control loop (never blocks on a prefill or the network)
  kWorker,  ///< on a create worker (bounded queue; PROGRESS heartbeats when asked for)
  /// inline when the pool is here (or in the state folder), else on a worker (replication)
  kInlineOrWorker,
};
/// The protocol as data: one row per message type. DecodeRequest checks `required`; polykvd
/// checks `role`, routes by `runs` and serves `peer_channel` types on --listen.
struct MessageSpec {
  MessageType type;
  std::string_view name;
  uint32_t required;  ///< RequiredField bits
  MessageRole role;
  MessageRuns runs;
  bool peer_channel;  ///< also answered on the peer channel (PING, LIST, PEER_*)
};
/// The row of `type` (every MessageType has one).
const MessageSpec& SpecOf(MessageType type);

/// Where a pool's bytes live and how another process maps them.
struct MemoryHandle {
  PoolMemory backend = PoolMemory::kHost;  ///< "host" or "cuda" on the wire
  /// host: "memfd" (a sealed memfd, fetched from `fd_socket` with the lease id) or "shm"
  /// (legacy: a POSIX shm object named `shm_name`). Empty reads as "shm".
  std::string transport;
  std::string fd_socket;  ///< host/memfd: Unix socket path that hands out the descriptor
  std::string shm_name;   ///< host/shm: POSIX shm object name ("/polykv-<id16>")
  CudaIpcHandle cuda;     ///< cuda: 64-byte handle + offset + size + device UUID
  uint64_t size = 0;      ///< bytes of the pool region
};

/// Every field of PoolInfo, written once as data: X(type, name, json_key, c_name). The list
/// makes the struct below, its JSON form in the protocol (and so in pool file manifests), the
/// copy into the C API's polykv_pool_info (libpolykv_client/include/polykv/pool_info_c.h,
/// where `c_name` is the member; the bytes by part carry a _bytes suffix there) and the
/// CLI's --json output. `json_key` is the wire name: never change one (old peers read it);
/// a new field is one more row (and, when the C API carries it, a member appended to
/// polykv_pool_info). Every field defaults to 0 / "".
// clang-format off
#define POLYKV_POOL_INFO_FIELDS(X)                                                                \
  /* id: 64 hex chars (SHA-256 content address); model: the path given at create */               \
  X(std::string, id,                 "id",                 id)                                    \
  X(std::string, model,              "model",              model)                                 \
  X(std::string, model_fingerprint,  "model_fingerprint",  model_fingerprint)                     \
  /* the model's architecture ("llama", "qwen2", ...) and tokenizer ("bpe/llama3", "spm", */      \
  /* ...; "none" without one) */                                                                  \
  X(std::string, architecture,       "architecture",       architecture)                          \
  X(std::string, tokenizer_family,   "tokenizer_family",   tokenizer_family)                      \
  /* "k8v3", "k8v2", "k8v4", "none" or a codec spec; backend "host" or "cuda" */                  \
  X(std::string, codec,              "codec",              codec)                                 \
  X(std::string, backend,            "backend",            backend)                               \
  X(uint64_t,    tokens,             "tokens",             tokens)                                \
  X(uint32_t,    layers,             "layers",             layers)                                \
  X(uint32_t,    kv_heads,           "kv_heads",           kv_heads)                              \
  X(uint32_t,    head_dim,           "head_dim",           head_dim)                              \
  /* bytes: the whole region, then by part (the parts sum to total_bytes) */                      \
  X(uint64_t,    total_bytes,        "total_bytes",        total_bytes)                           \
  X(uint64_t,    key_codes,          "key_codes",          key_codes_bytes)                       \
  X(uint64_t,    key_scales,         "key_scales",         key_scales_bytes)                      \
  X(uint64_t,    value_codes,        "value_codes",        value_codes_bytes)                     \
  X(uint64_t,    value_norms,        "value_norms",        value_norms_bytes)                     \
  X(uint64_t,    overhead,           "overhead",           overhead_bytes)                        \
  /* the same cache held privately in bf16; bf16_bytes / total_bytes (overhead included) */       \
  X(uint64_t,    bf16_bytes,         "bf16_bytes",         bf16_bytes)                            \
  X(double,      effective_ratio,    "effective_ratio",    effective_ratio)                       \
  /* live leases; when the pool was published (ms since epoch); build times (ms) */               \
  X(uint32_t,    leases,             "leases",             leases)                                \
  X(int64_t,     created_unix_ms,    "created_unix_ms",    created_unix_ms)                       \
  X(double,      prefill_ms,         "prefill_ms",         prefill_ms)                            \
  X(double,      encode_ms,          "encode_ms",          encode_ms)                             \
  X(double,      publish_ms,         "publish_ms",         publish_ms)                            \
  /* Reconstruction error recorded in the pool's header at build (ipc::PoolHeader): layers */     \
  /* recorded (0: none) and the mean / largest per-layer relative MSE of keys and values. */      \
  X(uint32_t,    fidelity_layers,    "fidelity_layers",    fidelity_layers)                       \
  X(double,      key_rel_mse_mean,   "key_rel_mse_mean",   key_rel_mse_mean)                      \
  X(double,      key_rel_mse_max,    "key_rel_mse_max",    key_rel_mse_max)                       \
  X(double,      value_rel_mse_mean, "value_rel_mse_mean", value_rel_mse_mean)                    \
  X(double,      value_rel_mse_max,  "value_rel_mse_max",  value_rel_mse_max)                     \
  /* A pool tree: the parent pool's id (empty for a root pool) and the positions of the */        \
  /* whole parent chain; this pool's `tokens` follow them. Agents attach the chain and */         \
  /* attend to every pool of it in place. */                                                      \
  X(std::string, parent,             "parent",             parent)                                \
  X(uint64_t,    parent_tokens,      "parent_tokens",      parent_tokens)                         \
  /* Where this daemon got the pool: "prefill" (built here), "state" (restored from its */        \
  /* state folder) or "peer tcp://HOST:PORT" (replicated from another daemon). */                 \
  X(std::string, origin,             "origin",             origin)                                \
  /* Where the pool is on the answering daemon (LIST, STATS): "memory" (published), "disk" */     \
  /* (only a pool file in its state folder: restored on the first attach or create) or */         \
  /* "quarantined" (a corrupt pool file moved to quarantine/, never served); state_detail: */     \
  /* the file, and for a quarantined one why. Empty from older daemons (read as "memory"). */     \
  X(std::string, state,              "state",              state)                                 \
  X(std::string, state_detail,       "state_detail",       state_detail)
// clang-format on

/// Description of a pool (LIST, STATS, ATTACH, CREATE_POOL replies): the fields of
/// POLYKV_POOL_INFO_FIELDS, in its order.
struct PoolInfo {
#define POLYKV_POOL_INFO_MEMBER(type, name, json_key, c_name) type name{};
  POLYKV_POOL_INFO_FIELDS(POLYKV_POOL_INFO_MEMBER)
#undef POLYKV_POOL_INFO_MEMBER
};

/// Calls f(json_key, member) for every field of `info` (a PoolInfo, const or not), in the
/// order of POLYKV_POOL_INFO_FIELDS.
template <typename Info, typename F>
void ForEachPoolInfoField(Info& info, F&& f) {
#define POLYKV_POOL_INFO_VISIT(type, name, json_key, c_name) f(json_key, info.name);
  POLYKV_POOL_INFO_FIELDS(POLYKV_POOL_INFO_VISIT)
#undef POLYKV_POOL_INFO_VISIT
}

/// A peer daemon as this daemon last saw it (PING replies; `polykv-cli ping`).
struct PeerState {
  std::string endpoint;  ///< tcp://HOST:PORT as configured
  /// "up" (answered the last PING), "down" (no answer), "refused" (CURVE handshake refused:
  /// wrong or unknown key), "unknown" (not asked yet).
  std::string state = "unknown";
  std::string detail;             ///< why it is down or refused
  std::string instance;           ///< the peer's instance id (when up)
  std::string version;            ///< the peer's daemon version (when up)
  uint32_t pools = 0;             ///< pools the peer holds (when up)
  double rtt_ms = 0;              ///< round trip of the last PING
  int64_t last_seen_unix_ms = 0;  ///< last answer (0: never)
};

/// The one list of PeerState's fields, in wire order: X(name) per field, where `name` is the
/// member, its JSON key, and the member of the C API's polykv_peer_info too.
// clang-format off
#define POLYKV_PEER_STATE_FIELDS(X) \
  X(endpoint) X(state) X(detail) X(instance) X(version) X(pools) X(rtt_ms) X(last_seen_unix_ms)
// clang-format on

/// One row of a name-only field list: f(json_key, object.name) (the visitor bodies below).
#define POLYKV_VISIT_NAMED_FIELD(name) f(#name, object.name);

/// Calls f(json_key, member) for every field of `object` (a PeerState or a polykv_peer_info,
/// const or not), in the order of POLYKV_PEER_STATE_FIELDS.
template <typename Peer, typename F>
void ForEachPeerStateField(Peer& object, F&& f) {
  POLYKV_PEER_STATE_FIELDS(POLYKV_VISIT_NAMED_FIELD);
}

/// A request from a client. Fields not used by `type` are ignored.
struct Request {
  MessageType type = MessageType::kPing;
  uint64_t id = 0;  ///< echoed in the reply
  // CREATE_POOL
  std::string model;     ///< model path (resolved against the daemon's search path)
  std::string document;  ///< text to tokenize (UTF-8, may hold NUL bytes), or empty
  /// Byte length of `document` as the client sent it (checked by the daemon; 0 = unknown).
  uint64_t document_bytes = 0;
  std::vector<int32_t> token_ids;
  bool add_bos = true;
  std::string codec = "k8v3";  ///< "k8v2" | "k8v3" | "k8v4" | "none" ("" with `parent`)
  /// CREATE_POOL of a child pool (pool tree): the parent's id (full or a unique prefix). The
  /// document (text tokenized without BOS unless add_bos, or token_ids) continues the parent
  /// chain; the child is prefilled attending to the parent's KV and takes its codec
  /// parameters (`codec` empty, or the parent's codec name; key_scale and norm_correction
  /// are the parent's).
  std::string parent;
  std::string key_scale = "tensor";  ///< "tensor" | "head" | "channel"
  bool norm_correction = false;
  /// CREATE_POOL, FETCH, ATTACH: send PROGRESS messages (heartbeats every kHeartbeatMs while
  /// the request runs on a worker: a create, or an ATTACH that replicates the pool first).
  bool progress = false;
  // ATTACH / EVICT / STATS(one pool)
  std::string pool_id;
  bool force = false;  ///< EVICT with live leases
  // RENEW / DETACH
  std::string lease_id;
  // ATTACH
  uint32_t client_pid = 0;
  // PEER_RELEASE
  std::string transfer_id;
};

/// A reply (or PROGRESS message) from polykvd.
struct Reply {
  MessageType type = MessageType::kPing;
  uint64_t id = 0;
  bool ok = true;
  std::string code;   ///< absl status code name on error ("NOT_FOUND", ...)
  std::string error;  ///< human-readable error
  /// The answering daemon's instance id (32 hex chars, new at every start).
  std::string instance;
  // PROGRESS
  /// "queued" | "load" | "tokenize" | "prefill" | "encode" | "publish"
  std::string stage;
  int64_t done = 0, total = 0;
  bool heartbeat = false;  ///< a repeat of the last stage (nothing moved)
  // CREATE_POOL, ATTACH, STATS(one pool)
  std::optional<PoolInfo> pool;
  bool created = false;  ///< CREATE_POOL: false when the pool already existed
  // LIST, STATS
  std::vector<PoolInfo> pools;
  // ATTACH / RENEW
  std::string lease_id;
  int64_t lease_expires_unix_ms = 0;
  int64_t lease_ms = 0;  ///< lease duration granted
  std::optional<MemoryHandle> memory;
  // PING / STATS
  std::string daemon_version;
  uint32_t daemon_pid = 0;
  uint64_t memory_used = 0, memory_cap = 0;  ///< bytes, for the active backend
  // PING / STATS / LIST: the daemon's model cache and create queue
  uint64_t model_cache_bytes = 0;         ///< weight bytes the cached models hold
  uint64_t model_cache_mapped_bytes = 0;  ///< of which mapped read-only from model files
  uint32_t model_cache_models = 0;        ///< models in the cache
  uint32_t model_cache_capacity = 0;      ///< most models kept (LRU)
  uint32_t creates_queued = 0, creates_running = 0, create_queue_capacity = 0;
  // PING: the configured peer daemons (empty without --peer)
  std::vector<PeerState> peers;
  // PEER_FETCH
  std::string transfer_id;  ///< names the transfer in PEER_RELEASE
  std::string descriptor;   ///< UcxExposure::descriptor() (bytes; base64 in JSON)
  uint64_t pool_bytes = 0;  ///< bytes of the pool region to pull
};

/// The one list of the daemon figures of STATS, PING and LIST replies, in wire order: X(name)
/// per field, where `name` is the Reply member, its JSON key, and the member of the C API's
/// polykv_daemon_status too.
// clang-format off
#define POLYKV_DAEMON_FIGURE_FIELDS(X)                                                    \
  X(memory_used) X(memory_cap) X(model_cache_bytes) X(model_cache_mapped_bytes)           \
  X(model_cache_models) X(model_cache_capacity) X(creates_queued) X(creates_running)      \
  X(create_queue_capacity)
// clang-format on

/// Calls f(json_key, member) for every daemon figure of `object` (a Reply, const or not), in the
/// order of POLYKV_DAEMON_FIGURE_FIELDS.
template <typename R, typename F>
void ForEachDaemonFigure(R& object, F&& f) {
  POLYKV_DAEMON_FIGURE_FIELDS(POLYKV_VISIT_NAMED_FIELD);
}

/// Serializes to one JSON frame. Invalid UTF-8 in a string field is replaced by U+FFFD, so
/// callers that must not alter text check ValidateRequest first (the client library does).
std::string EncodeRequest(const Request& request);
std::string EncodeReply(const Reply& reply);
/// Parses and validates a frame: magic, version, type, field types, size <= kMaxMessageBytes.
/// Errors: kInvalidArgument naming the bad field; kResourceExhausted when oversized;
/// kFailedPrecondition for a version mismatch.
[[nodiscard]] StatusOr<Request> DecodeRequest(std::string_view frame);
[[nodiscard]] StatusOr<Reply> DecodeReply(std::string_view frame);

/// An error reply for `request_id` carrying `status`'s code and message.
Reply ErrorReply(MessageType type, uint64_t request_id, const Status& status);
/// An error reply to a frame that failed DecodeRequest: echoes the frame's "type" and "id"
/// when they can be read, else type kError and id 0.
Reply ErrorReplyForFrame(std::string_view frame, const Status& status);
/// The Status carried by an error reply (OkStatus for ok replies).
[[nodiscard]] Status ReplyStatus(const Reply& reply);

/// OK when `text` is valid UTF-8; else kInvalidArgument "<field> is not valid UTF-8 at byte
/// offset N".
Status ValidateUtf8(absl::string_view text, absl::string_view field);
/// Checks what EncodeRequest needs: every string field valid UTF-8 (see ValidateUtf8).
[[nodiscard]] Status ValidateRequest(const Request& request);
/// `text` itself when at most `max_bytes` long, else its first bytes (cut at a UTF-8
/// boundary) + "... (N bytes)".
std::string Abbreviate(absl::string_view text, size_t max_bytes);

/// Default control endpoint: ipc:///run/polykv/control.sock when /run/polykv is writable,
/// else ipc://$XDG_RUNTIME_DIR/polykv/control.sock, else ipc:///tmp/polykv-<uid>/control.sock.
/// $POLYKV_ENDPOINT overrides all of them.
std::string DefaultEndpoint();

}  // namespace polykv::ipc
