// Moving pool bytes between hosts with UCX one-sided reads (ucp_get): the holder registers a
// region (ucp_mem_map) and hands out a descriptor (its worker address, the region's remote
// address and size, the packed memory key); the requester pulls the bytes into its own
// memory, chunked and pipelined. Transport-neutral (TCP here, RDMA or shared memory where
// UCX finds them); knows nothing of pools or models. The descriptor travels over the
// daemons' authenticated control channel, never over UCX itself.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "polykv/status.h"

namespace polykv::ipc {

/// Options of UcxEngine::Pull.
struct UcxPullOptions {
  /// Bytes per ucp_get (the last chunk may be shorter); >= 4096.
  uint64_t chunk_bytes = 4ull << 20;
  /// Gets in flight at once (pipelining depth); >= 1.
  int max_outstanding = 8;
  /// The pull fails with kDeadlineExceeded when no byte completes for this long (a peer
  /// that hangs without closing its connection).
  int stall_timeout_ms = 10000;
  /// Checked between completions: true ends the pull with kCancelled.
  const std::atomic<bool>* cancel = nullptr;
  /// Called from the pulling thread after each completed chunk: (bytes done, total).
  std::function<void(uint64_t, uint64_t)> progress;
  /// Tests and benchmarks: sleep this long after each completed chunk (a slow link).
  int test_chunk_delay_ms = 0;
};

/// A registered region exposed for remote reads. Destroying it unregisters the memory; the
/// caller keeps the memory mapped and unchanged at least as long.
class UcxExposure {
 public:
  virtual ~UcxExposure() = default;
  /// Opaque bytes (a few hundred): what a requester passes to UcxEngine::Pull. Layout, all
  /// integers little endian: u32 magic "PKVX" | u32 version (1) | u32 worker address length |
  /// worker address | u64 remote address | u64 size | u32 rkey length | packed rkey.
  virtual const std::string& descriptor() const = 0;
  virtual uint64_t size() const = 0;
};

/// One UCX context with a serving worker progressed by a background thread (UCX's TCP
/// transport needs the target's worker to progress for one-sided reads). Thread-safe.
class UcxEngine {
 public:
  /// ucp_init (RMA) + a worker + the progress thread. UCX reads its usual environment
  /// (UCX_TLS, UCX_NET_DEVICES, ...). Errors: kUnavailable naming the UCX call and status.
  [[nodiscard]] static StatusOr<std::unique_ptr<UcxEngine>> Create();
  virtual ~UcxEngine() = default;

  /// Registers [data, data + size) for remote reads (read-only memory is fine) and packs its
  /// memory key. Errors: kInvalidArgument (null or size 0), kUnavailable (UCX).
  [[nodiscard]] virtual StatusOr<std::unique_ptr<UcxExposure>> Expose(const void* data,
                                                                      uint64_t size) = 0;

  /// Reads the whole exposed region described by `descriptor` into `dst` (`size` bytes,
  /// which must equal the exposed size). Blocks the calling thread (its own worker and
  /// endpoint, closed before returning). On any error `dst` holds an unspecified prefix.
  /// Errors: kInvalidArgument (malformed descriptor, size mismatch), kUnavailable (the peer
  /// cannot be reached or failed during the transfer: names the bytes done of the total and
  /// the UCX status), kDeadlineExceeded (stall_timeout_ms), kCancelled. The envelope of the
  /// descriptor is checked (magic, version, every length within bounds, nothing trailing);
  /// the worker address and rkey bytes inside are UCX's and are trusted, which is why the
  /// descriptor must come over an authenticated channel. Every error path cancels the gets
  /// in flight, closes the endpoint (forced) and returns within about stall_timeout_ms plus
  /// two seconds. Thread-safe: concurrent pulls each run a worker of their own.
  [[nodiscard]] virtual Status Pull(const std::string& descriptor, void* dst, uint64_t size,
                                    const UcxPullOptions& options) = 0;

  /// Transports UCX chose for this context, as "tcp, self, ..." (for logs and ping).
  virtual std::string transports() const = 0;
};

}  // namespace polykv::ipc
