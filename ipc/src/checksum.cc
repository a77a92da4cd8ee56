// The pool format's 64-bit checksum: XXH64 (libxxhash), seed 0.
#include <xxhash.h>

#include "polykv/ipc/pool_layout.h"

namespace polykv::ipc {

uint64_t Checksum64(const void* data, uint64_t bytes) { return XXH64(data, bytes, 0); }

}  // namespace polykv::ipc
