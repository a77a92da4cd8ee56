/* libpolykv_client: C API for agent processes that share a polykvd pool.
 *
 * Every call returns a polykv_status (POLYKV_OK == 0); polykv_status_string() names it and
 * polykv_last_error() gives the detailed message of the calling thread's last failure.
 * Handles are opaque. A pool is mapped read-only; the library never writes to it.
 *
 * Typical use:
 *   polykv_client* c;  polykv_connect(NULL, 5000, &c);          // default endpoint
 *   polykv_pool* p;    polykv_attach(c, "3fa2...", &p);          // lease + read-only map
 *   polykv_pool_info(p, &info);                                  // shape, codec, bytes
 *   for (l...) polykv_decode_layer(p, l, k, v, POLYKV_DTYPE_F32); // [kv_heads][tokens][head_dim]
 *   polykv_detach(p);  polykv_disconnect(c);
 */
#ifndef POLYKV_CLIENT_H_
#define POLYKV_CLIENT_H_

#include <stddef.h>
#include <stdint.h>

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
  POLYKV_PERMISSION_DENIED = 7, /**< uid not allowed by the daemon */
  POLYKV_RESOURCE_EXHAUSTED = 8,/**< memory cap / out of memory / message too large */
  POLYKV_FAILED_PRECONDITION = 9,/**< e.g. evict with live leases, lease expired */
  POLYKV_ABORTED = 10,
  POLYKV_OUT_OF_RANGE = 11,
  POLYKV_UNIMPLEMENTED = 12,
  POLYKV_INTERNAL = 13,
  POLYKV_UNAVAILABLE = 14,      /**< cannot reach the daemon */
  POLYKV_DATA_LOSS = 15,        /**< pool checksum mismatch */
} polykv_status;

/** Element type of decoded K/V. */
typedef enum polykv_dtype { POLYKV_DTYPE_F32 = 0, POLYKV_DTYPE_F16 = 1, POLYKV_DTYPE_BF16 = 2 } polykv_dtype;

typedef struct polykv_client polykv_client; /**< a connection to polykvd */
typedef struct polykv_pool polykv_pool;     /**< an attached, mapped pool (holds a lease) */

/** Description of a pool. Strings are NUL-terminated. Sizes in bytes. */
typedef struct polykv_pool_info_t {
  char id[65];             /**< 64 hex chars */
  char codec[16];          /**< "k8v3", "none", ... */
  char backend[8];         /**< "host" or "cuda" */
  char model[512];         /**< model path given at create */
  char model_fingerprint[72];
  uint32_t layers, kv_heads, head_dim;
  uint64_t tokens;
  uint64_t total_bytes;    /**< the whole shared region */
  uint64_t bf16_bytes;     /**< the same KV cache held privately in bf16 */
  double effective_ratio;  /**< bf16_bytes / total_bytes */
  uint32_t leases;
} polykv_pool_info;

/** Name of a status ("NOT_FOUND"); never NULL. */
const char* polykv_status_string(polykv_status status);
/** Detailed message of this thread's last failed call ("" if none). */
const char* polykv_last_error(void);

/** Connects to polykvd at `endpoint` (NULL = default endpoint, or $POLYKV_ENDPOINT) and
 *  PINGs it. `timeout_ms` bounds each request (Lazy Pirate: retried, then fails).
 *  Errors: POLYKV_UNAVAILABLE / POLYKV_DEADLINE_EXCEEDED when no daemon answers. */
polykv_status polykv_connect(const char* endpoint, int timeout_ms, polykv_client** out);
/** Closes the connection (detaches nothing: detach pools first). NULL is a no-op. */
void polykv_disconnect(polykv_client* client);

/** Number of published pools, and their infos (up to `capacity`). */
polykv_status polykv_list_pools(polykv_client* client, polykv_pool_info* infos, size_t capacity,
                                size_t* count);

/** Attaches `pool_id`: takes a lease (renewed by a background thread until detach), maps the
 *  pool read-only, verifies the header checksum. Errors: POLYKV_NOT_FOUND (unknown pool),
 *  POLYKV_DATA_LOSS (bad header), POLYKV_UNAVAILABLE. */
polykv_status polykv_attach(polykv_client* client, const char* pool_id, polykv_pool** out);
/** Releases the lease, unmaps. NULL is a no-op. */
polykv_status polykv_detach(polykv_pool* pool);

/** Info of an attached pool. */
polykv_status polykv_pool_get_info(const polykv_pool* pool, polykv_pool_info* out);
/** Token ids of the pool's document: writes min(capacity, tokens) ids. */
polykv_status polykv_pool_token_ids(const polykv_pool* pool, int32_t* ids, size_t capacity);
/** Decodes layer `layer` into caller buffers k_out, v_out, each
 *  [kv_heads][tokens][head_dim] of `dtype` (host memory). Checks the lease first:
 *  POLYKV_NOT_FOUND / POLYKV_FAILED_PRECONDITION when the pool was evicted or the lease
 *  expired (never stale data). */
polykv_status polykv_decode_layer(const polykv_pool* pool, uint32_t layer, void* k_out,
                                  void* v_out, polykv_dtype dtype);
/** Recomputes the payload checksum of the mapped pool (POLYKV_DATA_LOSS on mismatch). */
polykv_status polykv_pool_verify(const polykv_pool* pool);
/** Status of the pool's lease as last seen by the renewal thread (POLYKV_OK while valid). */
polykv_status polykv_pool_lease_status(const polykv_pool* pool);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* POLYKV_CLIENT_H_ */
