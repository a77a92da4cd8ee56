/* libpolykv_client: C API for agent processes that share a polykvd pool.
 *
 * Every call returns a polykv_status (POLYKV_OK == 0); polykv_status_string() names it and
 * polykv_last_error() gives the detailed message of the calling thread's last failure.
 * Handles are opaque. A pool is mapped read-only; the library never writes to it.
 *
 * Typical use:
 *   polykv_client* c;  polykv_connect(NULL, 5000, &c);          // default endpoint
 *   polykv_pool* p;    polykv_attach(c, "3fa2...", &p);          // lease + read-only map
 *   polykv_pool_info info = polykv_pool_info_init();
 *   polykv_pool_get_info(p, &info);                              // shape, codec, bytes
 *   for (l...) polykv_decode_layer(p, l, k, v, POLYKV_DTYPE_F32); // [kv_heads][tokens][head_dim]
 *   polykv_detach(p);  polykv_disconnect(c);
 */
#ifndef POLYKV_CLIENT_H_
#define POLYKV_CLIENT_H_

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(_WIN32)
#define POLYKV_CLIENT_API
#else
/** Marks the exported C API (the library is built with hidden visibility). */
#define POLYKV_CLIENT_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** Status codes (values match absl::StatusCode). */
typedef enum polykv_status {
  POLYKV_OK = 0,
  POLYKV_CANCELLED = 1,
  POLYKV_UNKNOWN = 2,
  POLYKV_INVALID_ARGUMENT = 3,
  POLYKV_DEADLINE_EXCEEDED = 4, /**< daemon did not answer in time (daemon gone?) */
  POLYKV_NOT_FOUND = 5,         /**< unknown pool, or pool evicted, or lease unknown */
  POLYKV_ALREADY_EXISTS = 6,
  POLYKV_PERMISSION_DENIED = 7,   /**< uid not allowed by the daemon */
  POLYKV_RESOURCE_EXHAUSTED = 8,  /**< memory cap / out of memory / message too large */
  POLYKV_FAILED_PRECONDITION = 9, /**< e.g. evict with live leases, lease expired */
  POLYKV_ABORTED = 10,
  POLYKV_OUT_OF_RANGE = 11,
  POLYKV_UNIMPLEMENTED = 12,
  POLYKV_INTERNAL = 13,
  POLYKV_UNAVAILABLE = 14, /**< cannot reach the daemon */
  POLYKV_DATA_LOSS = 15,   /**< pool checksum mismatch */
} polykv_status;

/** Element type of decoded K/V. */
typedef enum polykv_dtype {
  POLYKV_DTYPE_F32 = 0,
  POLYKV_DTYPE_F16 = 1,
  POLYKV_DTYPE_BF16 = 2
} polykv_dtype;

typedef struct polykv_client polykv_client; /**< a connection to polykvd */
typedef struct polykv_pool polykv_pool;     /**< an attached, mapped pool (holds a lease) */

/** Description of a pool. Strings are NUL-terminated. Sizes in bytes. An out-struct that
 *  grows: make one with polykv_pool_info_init() (or set `struct_size` =
 *  sizeof(polykv_pool_info) before the call); the library writes the members that fit in
 *  struct_size, so a program built against an older header keeps working. A struct_size
 *  smaller than the first version (every member up to `origin`) or larger than this library's
 *  struct is refused with POLYKV_INVALID_ARGUMENT. New members are only ever appended. */
typedef struct polykv_pool_info_t {
  uint32_t struct_size; /**< in: sizeof(polykv_pool_info) (polykv_pool_info_init) */
  char id[65];          /**< 64 hex chars */
  char codec[48];       /**< "k8v3", "none", or a codec spec ("k7c-v3-e4x3-nc-n16") */
  char backend[8];      /**< "host" or "cuda" */
  char model[512];      /**< model path given at create */
  char model_fingerprint[72];
  uint32_t layers, kv_heads, head_dim;
  uint64_t tokens;
  uint64_t total_bytes;   /**< the whole shared region */
  uint64_t bf16_bytes;    /**< the same KV cache held privately in bf16 */
  double effective_ratio; /**< bf16_bytes / total_bytes */
  uint32_t leases;        /**< live leases (at the time of the reply) */
  /* Bytes by part (sum == total_bytes). For codec "none" raw K/V count as key/value codes. */
  uint64_t key_codes_bytes;   /**< int8 K codes [layers][kv_heads][tokens][head_dim] */
  uint64_t key_scales_bytes;  /**< f32 K scales */
  uint64_t value_codes_bytes; /**< packed TurboQuant-MSE V codes */
  uint64_t value_norms_bytes; /**< f32 V norms [layers][kv_heads*tokens] */
  uint64_t overhead_bytes;    /**< header + token ids + alignment padding */
  int64_t created_unix_ms;    /**< when the daemon published the pool (ms since epoch) */
  double prefill_ms, encode_ms, publish_ms; /**< daemon-side build times (ms) */
  char architecture[32]; /**< model architecture the pool was built with ("llama", "qwen2", ...) */
  char tokenizer_family[48]; /**< "bpe/llama3", "bpe/qwen2", "spm", ... ("none" without one) */
  /* Reconstruction error the daemon recorded in the pool's header at build: per-layer
   * relative MSE sum((x' - x)^2) / sum(x^2) of decoded keys / values; the per-layer values
   * come from polykv_pool_fidelity on an attached pool. fidelity_layers = 0: not recorded. */
  uint32_t fidelity_layers;
  double key_rel_mse_mean, key_rel_mse_max;
  double value_rel_mse_mean, value_rel_mse_max;
  /* A pool tree: the parent pool's id ("" for a root pool) and the positions of the whole
   * parent chain, which this pool's `tokens` follow. A reader attends to the whole chain:
   * attach the parent (by this id) too, and so on up to the root (PooledAgent does). */
  char parent[65];
  uint64_t parent_tokens;
  /* Where the answering daemon got the pool: "prefill", "state" (restored from its state
   * folder) or "peer tcp://HOST:PORT" (replicated from another daemon). */
  char origin[160];
  /* New members go here, after every member of the first version. */
  /* Where the pool is on the answering daemon (polykv_list_pools, polykv_pool_info_by_id):
   * "memory" (published), "disk" (only a pool file in its state folder, restored on the first
   * attach or create) or "quarantined" (a corrupt pool file, never served); "" from older
   * daemons. state_detail: the pool file, and for a quarantined one why. */
  char state[16];
  char state_detail[512];
} polykv_pool_info;

/** Defines `static inline T fn(void)`, which returns a zeroed T with struct_size = sizeof(T):
 *  the initializer of each out-struct that grows. */
#define POLYKV_DEFINE_STRUCT_INIT(T, fn)         \
  static inline T fn(void) {                     \
    T value;                                     \
    memset(&value, 0, sizeof(value));            \
    value.struct_size = (uint32_t)sizeof(value); \
    return value;                                \
  }

/** A zeroed polykv_pool_info with struct_size set: `polykv_pool_info info =
 *  polykv_pool_info_init();` (also for each element of an array given to
 *  polykv_list_pools). */
POLYKV_DEFINE_STRUCT_INIT(polykv_pool_info, polykv_pool_info_init)

/** A peer daemon as the answering daemon last saw it (polykv_daemon_peers). An out-struct
 *  that grows, as polykv_pool_info: make one with polykv_peer_info_init(). */
typedef struct polykv_peer_info_t {
  uint32_t struct_size;      /**< in: sizeof(polykv_peer_info) (polykv_peer_info_init) */
  char endpoint[160];        /**< tcp://HOST:PORT as configured */
  char state[16];            /**< "up", "down", "refused" (CURVE key refused) or "unknown" */
  char detail[512];          /**< why it is down or refused */
  char instance[33];         /**< the peer's instance id (when up) */
  char version[32];          /**< the peer's daemon version (when up) */
  uint32_t pools;            /**< pools the peer holds (when up) */
  double rtt_ms;             /**< round trip of the last check (ms) */
  int64_t last_seen_unix_ms; /**< last answer (ms since epoch; 0 = never) */
  /* New members go here, after every member of the first version. */
} polykv_peer_info;

/** A zeroed polykv_peer_info with struct_size set. */
POLYKV_DEFINE_STRUCT_INIT(polykv_peer_info, polykv_peer_info_init)

/** PING reply: the daemon's identity and memory use. */
typedef struct polykv_daemon_info_t {
  char version[32];     /**< daemon version string, e.g. "0.1.0" */
  uint32_t pid;         /**< daemon process id */
  uint64_t memory_used; /**< bytes of pool memory in use (active backend) */
  uint64_t memory_cap;  /**< configured cap in bytes (0 = none reported) */
} polykv_daemon_info;

/** Daemon status (polykv_daemon_get_status). Set `struct_size` = sizeof(polykv_daemon_status)
 *  before the call; the library fills the rest. */
typedef struct polykv_daemon_status_t {
  uint32_t struct_size;              /**< in: sizeof(polykv_daemon_status) */
  char version[32];                  /**< daemon version string */
  char instance[33];                 /**< 32 hex chars, new at every daemon start */
  uint32_t pid;                      /**< daemon process id */
  uint64_t memory_used;              /**< bytes of pool memory in use (active backend) */
  uint64_t memory_cap;               /**< configured pool memory cap (0 = none) */
  uint64_t model_cache_bytes;        /**< weight bytes the models kept loaded hold */
  uint32_t model_cache_models;       /**< models kept loaded */
  uint32_t model_cache_capacity;     /**< most models kept (LRU) */
  uint32_t creates_queued;           /**< creates waiting for a worker */
  uint32_t creates_running;          /**< creates being built */
  uint32_t create_queue_capacity;    /**< more waiting creates are refused (RESOURCE_EXHAUSTED) */
  uint64_t model_cache_mapped_bytes; /**< of model_cache_bytes, mapped read-only from the model
                                          files (page cache shared with agents); filled when
                                          struct_size covers it */
} polykv_daemon_status;

/** Options of polykv_create_pool. Initialise with polykv_create_options_init(). Exactly one
 *  of `document` (UTF-8 text, tokenized by the daemon) or `token_ids` (+ `token_count`) must
 *  be given. Pointers are borrowed for the duration of the call. A NUL-terminated
 *  `document` cannot hold NUL bytes: use polykv_create_pool_from_text for arbitrary text. */
typedef struct polykv_create_options_t {
  uint32_t struct_version;  /**< POLYKV_CREATE_OPTIONS_VERSION (set by _init) */
  const char* model;        /**< model path (resolved by the daemon); required */
  const char* document;     /**< text, or NULL when token_ids is given */
  const int32_t* token_ids; /**< token ids, or NULL when document is given */
  size_t token_count;       /**< number of token_ids */
  const char* codec;        /**< NULL or "": the daemon's default (host: "default", CUDA: k8v3);
                                 else "k8v2", "k8v3",
                                 "k8v4", "none", "paper", "default" (the measured default spec)
                                 or a spec such as "k7c-v3-e4x3-nc-n16" (polykv-cli eval --help);
                                 for a child pool NULL/"" = the parent's codec */
  const char* key_scale;    /**< "tensor" (default, NULL), "head" or "channel" */
  int norm_correction;      /**< non-zero: TurboQuant norm correction on values */
  int add_bos;              /**< non-zero (default): prepend BOS when tokenizing `document` */
  int timeout_ms;           /**< bound for the whole create; <= 0: 600000 (10 min) */
  /* struct_version >= 2: */
  const char* parent; /**< NULL: a root pool. Else the id (or unique prefix) of the parent
                           pool: the new pool holds only `document`'s KV, prefilled after
                           the parent chain's (a pool tree); `model` may then be NULL (the
                           parent's), the document is tokenized without BOS, and the codec
                           is the parent's. */
} polykv_create_options;

/** Current version of polykv_create_options (1: without `parent`, also accepted). */
#define POLYKV_CREATE_OPTIONS_VERSION 2u

/** Progress callback of polykv_create_pool: `stage` is "tokenize", "prefill", "encode" or
 *  "publish"; `done` of `total` units (tokens for prefill, layers for encode). Called on the
 *  calling thread. */
typedef void (*polykv_progress_fn)(const char* stage, int64_t done, int64_t total, void* user);

/** Name of a status ("NOT_FOUND"); never NULL. */
POLYKV_CLIENT_API const char* polykv_status_string(polykv_status status);
/** Detailed message of this thread's last failed call ("" if none). */
POLYKV_CLIENT_API const char* polykv_last_error(void);

/** Connects to polykvd at `endpoint` (NULL = default endpoint, or $POLYKV_ENDPOINT) and
 *  PINGs it. `timeout_ms` (<= 0: 5000) bounds each try of a request; a request is tried 3
 *  times, each on a fresh DEALER socket (Lazy Pirate), so a call fails after ~3 x timeout_ms
 *  when the daemon does not answer. For ipc:// endpoints the socket file is checked first,
 *  so these fail at once with their own message: no socket, a stale socket nobody listens on
 *  (POLYKV_UNAVAILABLE) and a socket this user may not open (POLYKV_PERMISSION_DENIED).
 *  A client may be used from several threads (calls are serialised).
 *  Errors: POLYKV_UNAVAILABLE / POLYKV_DEADLINE_EXCEEDED when no daemon answers,
 *  POLYKV_PERMISSION_DENIED (socket mode, or the daemon refuses this uid). */
POLYKV_CLIENT_API polykv_status polykv_connect(const char* endpoint, int timeout_ms,
                                               polykv_client** out);
/** Closes the connection (detaches nothing: detach pools first). NULL is a no-op. */
POLYKV_CLIENT_API void polykv_disconnect(polykv_client* client);

/** Lists published pools: *count = their number; the first min(capacity, *count) are written
 *  to `infos` (which may be NULL when capacity is 0, to ask for the count). infos[0].struct_size
 *  is the size of every element (the array's stride), as each polykv_pool_info_init() sets it.
 *  Errors: POLYKV_INVALID_ARGUMENT (struct_size, see polykv_pool_info), POLYKV_UNAVAILABLE. */
POLYKV_CLIENT_API polykv_status polykv_list_pools(polykv_client* client, polykv_pool_info* infos,
                                                  size_t capacity, size_t* count);

/** Attaches `pool_id`: takes a lease (renewed by a background thread with its own socket
 *  until detach) and maps the whole pool read-only: a host pool's sealed memfd is fetched
 *  from the daemon's descriptor socket (SCM_RIGHTS) and refused unless sealed against
 *  writes, so nobody (the daemon's uid and root included) can change it while mapped; cuda
 *  pools come through CUDA IPC; pools of older daemons (named POSIX shm) get their payload
 *  checksum verified. Checks the header checksum and that the header's id is `pool_id`.
 *  The pool stays usable after polykv_disconnect of its client. Errors: POLYKV_NOT_FOUND
 *  (unknown pool), POLYKV_DATA_LOSS (bad header or payload), POLYKV_PERMISSION_DENIED
 *  (descriptor not sealed, or this uid is not a reader), POLYKV_UNAVAILABLE. */
POLYKV_CLIENT_API polykv_status polykv_attach(polykv_client* client, const char* pool_id,
                                              polykv_pool** out);
/** Stops renewal, releases the lease (DETACH; skipped when the lease is already gone),
 *  unmaps and frees `pool` in every case. Returns POLYKV_UNAVAILABLE when the daemon did not
 *  answer the DETACH (the lease then expires by itself). NULL is a no-op. */
POLYKV_CLIENT_API polykv_status polykv_detach(polykv_pool* pool);

/** Info of an attached pool. Errors: POLYKV_INVALID_ARGUMENT (NULL, or out->struct_size: see
 *  polykv_pool_info). */
POLYKV_CLIENT_API polykv_status polykv_pool_get_info(const polykv_pool* pool,
                                                     polykv_pool_info* out);
/** Token ids of the pool's document: writes min(capacity, tokens) ids. */
POLYKV_CLIENT_API polykv_status polykv_pool_token_ids(const polykv_pool* pool, int32_t* ids,
                                                      size_t capacity);
/** Decodes layer `layer` into caller buffers k_out, v_out, each
 *  [kv_heads][tokens][head_dim] of `dtype` (host memory; polykv_pool_layer_elements()
 *  elements each). A cuda pool is decoded on its device, then copied to host. Checks the
 *  lease before and after decoding: POLYKV_NOT_FOUND ("pool <id> was evicted") /
 *  POLYKV_FAILED_PRECONDITION ("lease on pool <id> expired") when the renewal thread has
 *  learnt that the lease is gone (it renews every lease_ms/3), so a forced eviction is seen
 *  within about a third of the lease time. POLYKV_OUT_OF_RANGE for a bad layer.
 *  Thread-safe (the mapping is read-only). */
POLYKV_CLIENT_API polykv_status polykv_decode_layer(const polykv_pool* pool, uint32_t layer,
                                                    void* k_out, void* v_out, polykv_dtype dtype);
/** Recomputes the payload checksum of the mapped pool (POLYKV_DATA_LOSS on mismatch). */
POLYKV_CLIENT_API polykv_status polykv_pool_verify(const polykv_pool* pool);
/** The per-layer reconstruction error recorded in the pool's header at build (relative MSE
 *  of decoded keys and values, see polykv_pool_info): writes min(capacity, layers) values to
 *  each of key_rel_mse / value_rel_mse (either may be NULL when capacity is 0) and the
 *  recorded layer count to *layers (0: not recorded). */
POLYKV_CLIENT_API polykv_status polykv_pool_fidelity(const polykv_pool* pool, float* key_rel_mse,
                                                     float* value_rel_mse, size_t capacity,
                                                     size_t* layers);
/** Status of the pool's lease as last seen by the renewal thread (POLYKV_OK while valid). */
POLYKV_CLIENT_API polykv_status polykv_pool_lease_status(const polykv_pool* pool);

/** Sets *opts to the defaults (codec "k8v3", key_scale "tensor", add_bos 1, no document). */
POLYKV_CLIENT_API void polykv_create_options_init(polykv_create_options* opts);

/** PINGs the daemon. Errors: POLYKV_UNAVAILABLE when it does not answer. */
POLYKV_CLIENT_API polykv_status polykv_ping(polykv_client* client, polykv_daemon_info* out);

/** Asks the daemon to prefill, compress and publish a pool (CREATE_POOL), streaming its
 *  PROGRESS messages to `progress` (may be NULL) and waiting for the reply, at most
 *  opts->timeout_ms (not retried: POLYKV_DEADLINE_EXCEEDED when it runs out). Pools are
 *  content-addressed: when an identical pool exists, it is returned with *created = 0.
 *  `out` and `created` may be NULL; out->struct_size is checked before anything is sent.
 *  The daemon sends a heartbeat every second while the create is
 *  queued or running, so a daemon that dies or hangs is noticed within seconds:
 *  POLYKV_UNAVAILABLE (its socket stops accepting, or 5 s without a word), POLYKV_ABORTED
 *  (another daemon instance now answers on the endpoint: the create was lost),
 *  POLYKV_CANCELLED (the daemon was stopped with SIGTERM). Other errors:
 *  POLYKV_INVALID_ARGUMENT (bad options, codec, ids, a document that is not UTF-8 — the
 *  message names the byte offset), POLYKV_NOT_FOUND (model), POLYKV_PERMISSION_DENIED (not
 *  an operator, or a model outside the daemon's model folders), POLYKV_RESOURCE_EXHAUSTED
 *  (memory cap, or the daemon's create queue is full). POLYKV_INVALID_ARGUMENT also for a bad
 *  out->struct_size (see polykv_pool_info). */
POLYKV_CLIENT_API polykv_status polykv_create_pool(polykv_client* client,
                                                   const polykv_create_options* opts,
                                                   polykv_progress_fn progress, void* user,
                                                   polykv_pool_info* out, int* created);

/** Like polykv_create_pool, with the document given as `document_size` bytes at `document`
 *  (NUL bytes included; opts->document must be NULL, opts->token_ids unused). The text must
 *  be valid UTF-8: otherwise POLYKV_INVALID_ARGUMENT "... not valid UTF-8 at byte offset N"
 *  and nothing is sent (it is never altered on the way). */
POLYKV_CLIENT_API polykv_status polykv_create_pool_from_text(
    polykv_client* client, const polykv_create_options* opts, const char* document,
    size_t document_size, polykv_progress_fn progress, void* user, polykv_pool_info* out,
    int* created);

/** PING with the daemon's full status: instance, memory, model cache, create queue.
 *  Errors: POLYKV_INVALID_ARGUMENT when out->struct_size is too small, POLYKV_UNAVAILABLE. */
POLYKV_CLIENT_API polykv_status polykv_daemon_get_status(polykv_client* client,
                                                         polykv_daemon_status* out);

/** The daemon's peer daemons (PING): *count = their number; the first min(capacity, *count)
 *  are written to `peers` (NULL when capacity is 0). A daemon without --peer has none.
 *  peers[0].struct_size is the size of every element (polykv_peer_info_init() sets it).
 *  Errors: POLYKV_INVALID_ARGUMENT (struct_size too small or too large), POLYKV_UNAVAILABLE. */
POLYKV_CLIENT_API polykv_status polykv_daemon_peers(polykv_client* client, polykv_peer_info* peers,
                                                    size_t capacity, size_t* count);

/** FETCH (operator): makes the daemon replicate pool `pool_id` (full id or unique prefix)
 *  from its peers, streaming `progress` (stage "fetch", bytes); returns at once when the daemon
 *  already holds it (*fetched = 0). Errors: POLYKV_NOT_FOUND (no peer holds it),
 *  POLYKV_FAILED_PRECONDITION (no peers configured, or the pool's model fingerprint does not
 *  match the daemon's model of that name), POLYKV_UNAVAILABLE (the holder failed during the
 *  transfer: nothing is published), POLYKV_PERMISSION_DENIED (not an operator),
 *  POLYKV_INVALID_ARGUMENT (`out` may be NULL; else its struct_size, see polykv_pool_info). */
POLYKV_CLIENT_API polykv_status polykv_fetch_pool(polykv_client* client, const char* pool_id,
                                                  polykv_progress_fn progress, void* user,
                                                  polykv_pool_info* out, int* fetched);

/** Evicts `pool_id`. Without `force` the daemon refuses while leases are live
 *  (POLYKV_FAILED_PRECONDITION); with it, lease holders see POLYKV_NOT_FOUND on their next
 *  renewal and decode. Errors: POLYKV_NOT_FOUND (unknown pool). */
POLYKV_CLIENT_API polykv_status polykv_evict(polykv_client* client, const char* pool_id, int force);

/** STATS of one pool (no attach): shape, bytes by part, leases, build times.
 *  Errors: POLYKV_NOT_FOUND ("unknown pool <id>"), POLYKV_INVALID_ARGUMENT (NULL, or
 *  out->struct_size: see polykv_pool_info). */
POLYKV_CLIENT_API polykv_status polykv_pool_info_by_id(polykv_client* client, const char* pool_id,
                                                       polykv_pool_info* out);

/** The read-only mapping of an attached host pool: *base points at the pool's first byte
 *  (its PoolHeader, layout in ipc/pool_layout.h) and *size is the mapped length, valid until
 *  polykv_detach. Agents attend to the pool's K/V there in place. Pages must never be written
 *  (the mapping is PROT_READ). Errors: POLYKV_INVALID_ARGUMENT (NULL arguments),
 *  POLYKV_FAILED_PRECONDITION for a cuda pool (device memory: use polykv_decode_layer). */
POLYKV_CLIENT_API polykv_status polykv_pool_mapping(const polykv_pool* pool, const void** base,
                                                    uint64_t* size);

/** How an attached host pool's K/V lie in its mapping, for attending to them in place
 *  (polykv_pool_attention_view; every layer's pointers from polykv_pool_layer_view). The
 *  encoding is the one kernels/attention.h reads (PrefixView): codec 0 = raw K/V of
 *  raw_dtype [kv_heads][tokens][head_dim] (codec "none"); codec 1 = keys int8 symmetric linear
 *  (key_bits 8, or 4..7 densely packed) with f32 scales (key_scale 0 per tensor, 1 per KV
 *  head, 2 per channel), values TurboQuant-MSE (random signs seeded by rotation_seed +
 *  Walsh-Hadamard rotation, Lloyd-Max codebook for N(0,1), value_bits per layer) with
 *  per-vector norms of norm_dtype (f32 or f16). An out-struct that grows: make one with
 *  polykv_attention_view_init(). */
typedef struct polykv_attention_view_t {
  uint32_t struct_size; /**< in: sizeof(polykv_attention_view) */
  uint32_t codec;       /**< 0 raw, 1 int8 keys + TurboQuant-MSE values */
  uint32_t layers, kv_heads, head_dim;
  uint64_t tokens;         /**< positions of this pool (after parent_tokens of its chain) */
  uint64_t parent_tokens;  /**< positions of the parent chain (0 for a root pool) */
  polykv_dtype raw_dtype;  /**< codec 0 */
  int32_t key_bits;        /**< codec 1: 8, or 4..7 (packed) */
  int32_t value_bits;      /**< codec 1: the default; a layer's own in polykv_layer_view */
  int32_t key_scale;       /**< codec 1: 0 per tensor, 1 per KV head, 2 per channel */
  int32_t norm_correction; /**< codec 1: norms are ||v|| / ||reconstruction|| */
  polykv_dtype norm_dtype; /**< codec 1: F32 or F16 norms */
  uint64_t rotation_seed;  /**< codec 1: seeds the random signs */
} polykv_attention_view;

/** A zeroed polykv_attention_view with struct_size set. */
POLYKV_DEFINE_STRUCT_INIT(polykv_attention_view, polykv_attention_view_init)

/** Pointers into the mapping for one layer of an attached host pool, valid until
 *  polykv_detach: k (int8 / packed key codes, or raw K), k_scales (codec 1: f32 scales),
 *  v (packed value codes, or raw V), v_norms (codec 1: [kv_heads * tokens] of norm_dtype),
 *  value_bits (codec 1: this layer's value bits). Make one with polykv_layer_view_init(). */
typedef struct polykv_layer_view_t {
  uint32_t struct_size; /**< in: sizeof(polykv_layer_view) */
  int32_t value_bits;
  const void* k;
  const float* k_scales;
  const void* v;
  const void* v_norms;
} polykv_layer_view;

/** A zeroed polykv_layer_view with struct_size set. */
POLYKV_DEFINE_STRUCT_INIT(polykv_layer_view, polykv_layer_view_init)

/** The encoding of an attached host pool as parsed (and checked) at polykv_attach: no second
 *  parse of the header by the caller. Errors: POLYKV_INVALID_ARGUMENT (NULL, or a
 *  struct_size other than sizeof(polykv_attention_view)), POLYKV_FAILED_PRECONDITION for a
 *  cuda pool (device memory has no host view). */
POLYKV_CLIENT_API polykv_status polykv_pool_attention_view(const polykv_pool* pool,
                                                           polykv_attention_view* out);

/** Layer `layer`'s pointers (see polykv_layer_view). Errors as polykv_pool_attention_view,
 *  and POLYKV_INVALID_ARGUMENT for a layer >= layers. */
POLYKV_CLIENT_API polykv_status polykv_pool_layer_view(const polykv_pool* pool, uint32_t layer,
                                                       polykv_layer_view* out);

/** Where an attached pool lies: *cuda_device = the CUDA ordinal of a pool in CUDA memory
 *  (mapped into this process by CUDA IPC), -1 for a host pool. Errors:
 *  POLYKV_INVALID_ARGUMENT (NULL). */
POLYKV_CLIENT_API polykv_status polykv_pool_cuda_device(const polykv_pool* pool, int* cuda_device);

/** polykv_pool_attention_view for a pool in CUDA memory (same encoding), for attending to it
 *  in place with CUDA kernels. Errors: POLYKV_INVALID_ARGUMENT as polykv_pool_attention_view,
 *  POLYKV_FAILED_PRECONDITION for a host pool. */
POLYKV_CLIENT_API polykv_status polykv_pool_device_attention_view(const polykv_pool* pool,
                                                                  polykv_attention_view* out);

/** polykv_pool_layer_view for a pool in CUDA memory: every pointer is DEVICE memory of
 *  polykv_pool_cuda_device, valid until polykv_detach; never dereference it on the host.
 *  Errors as polykv_pool_device_attention_view, and POLYKV_INVALID_ARGUMENT for a layer >=
 *  layers. */
POLYKV_CLIENT_API polykv_status polykv_pool_device_layer_view(const polykv_pool* pool,
                                                              uint32_t layer,
                                                              polykv_layer_view* out);

/** Elements of one of K or V of a layer: kv_heads * tokens * head_dim (0 for NULL). */
POLYKV_CLIENT_API size_t polykv_pool_layer_elements(const polykv_pool* pool);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* POLYKV_CLIENT_H_ */
