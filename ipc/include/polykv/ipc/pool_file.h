// Pool files: a published pool's region, byte for byte as in memory, behind a small JSON
// manifest, for pools that outlive the daemon (polykvd --state-dir) and for moving a pool
// between hosts by hand. Written atomically: a temporary file in the same folder, fsync,
// rename over the final name, fsync of the folder. Independent of how the daemon holds pools
// in memory (POSIX shm, sealed memfds, device memory): a reader copies the bytes wherever
// its backend wants them.
//
//   offset 0    char[8] magic "PKVFILE1"
//          8    u32 file_version       kPoolFileVersion
//         12    u32 manifest_bytes     length of the manifest JSON
//         16    u64 pool_offset        4096-aligned start of the region
//         24    u64 pool_bytes         region size (= PoolHeader::total_bytes)
//         32    u64 pool_checksum      Checksum64 over the region
//         40    u64 prelude_checksum   Checksum64 over bytes [0, 40) followed by the manifest
//         48    16 bytes reserved (0)
//         64    manifest JSON: {"file_version", "pool_format_version", "checksum":
//               "xxh64:<16 hex>", and the PoolInfo fields (id, model, model_fingerprint,
//               codec, tokens, shape, bytes by part, created_unix_ms, prefill_ms, ...)}
//   pool_offset the region (PoolHeader first; its own header and payload checksums too)
#pragma once

#include <cstdint>
#include <string>

#include "polykv/ipc/protocol.h"
#include "polykv/status.h"

namespace polykv::ipc {

inline constexpr char kPoolFileMagic[8] = {'P', 'K', 'V', 'F', 'I', 'L', 'E', '1'};
inline constexpr uint32_t kPoolFileVersion = 1;
/// Bytes before the manifest.
inline constexpr uint64_t kPoolFilePrelude = 64;

/// What a pool file says about itself (read without touching the region).
struct PoolFileManifest {
  uint32_t file_version = 0;
  uint32_t pool_format_version = 0;  ///< PoolHeader::format_version of the region
  PoolInfo info;                     ///< leases = 0; backend as when it was written
  uint64_t pool_offset = 0;
  uint64_t pool_bytes = 0;
  uint64_t pool_checksum = 0;  ///< Checksum64 over the region
};

/// Writes `pool` (`bytes` long, a complete region starting with its PoolHeader) with a
/// manifest made from `info` to `path`, atomically. The region's header is checked first
/// (magic, version, header checksum, id = info.id). Errors: kInvalidArgument (not a pool,
/// id mismatch), kInternal/kResourceExhausted naming the failing system call (disk full:
/// kResourceExhausted); a failed write leaves no file behind, not even the temporary one.
[[nodiscard]] Status WritePoolFile(const std::string& path, const PoolInfo& info, const void* pool,
                                   uint64_t bytes);

/// Reads and checks the prelude and manifest of `path` (not the region). Errors: kNotFound
/// (no such file), kDataLoss (bad magic, checksum, JSON, or a file shorter than its
/// region: truncated), kFailedPrecondition (a file version or pool format version this
/// build does not read; the file may be fine for another build).
[[nodiscard]] StatusOr<PoolFileManifest> ReadPoolFileManifest(const std::string& path);

/// Reads the region of `path` into `dst` (`dst_bytes` >= manifest.pool_bytes, host memory)
/// and verifies it: the file checksum, then PoolReader::Open with the payload checksum, the
/// pool id and model fingerprint against the manifest. Errors: kDataLoss naming what did not
/// match (the caller must not serve the bytes), kInvalidArgument (dst too small), kNotFound.
[[nodiscard]] Status ReadPoolFileInto(const std::string& path, const PoolFileManifest& manifest,
                                      void* dst, uint64_t dst_bytes);

}  // namespace polykv::ipc
