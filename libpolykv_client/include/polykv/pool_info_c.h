// ipc::PoolInfo <-> the C API's polykv_pool_info, field by field from the one list
// (POLYKV_POOL_INFO_FIELDS in polykv/ipc/protocol.h). For this repository's C++ code that
// links polykv_ipc (the client library, polykv-cli, tests); not installed with client.h.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include "polykv/client.h"
#include "polykv/ipc/protocol.h"

namespace polykv::client {
namespace pool_info_c_internal {

// A string into a fixed C array: cut to fit, always NUL-terminated.
template <size_t N>
void ToC(char (&dst)[N], const std::string& src) {
  const size_t n = std::min(N - 1, src.size());
  std::memcpy(dst, src.data(), n);
  dst[n] = '\0';
}
// A number: the C member has the list's type exactly (a mismatch does not compile).
template <typename T>
void ToC(T& dst, const T& src) {
  dst = src;
}

template <size_t N>
void FromC(std::string& dst, const char (&src)[N]) {
  dst.assign(src, strnlen(src, N));
}
template <typename T>
void FromC(T& dst, const T& src) {
  dst = src;
}

}  // namespace pool_info_c_internal

/// Fills every member of `*out` from `p` (strings cut to their arrays) and sets
/// out->struct_size = sizeof(polykv_pool_info). A zero effective_ratio (older daemons) is
/// derived from bf16_bytes / total_bytes.
inline void ToCPoolInfo(const ipc::PoolInfo& p, polykv_pool_info* out) {
  *out = polykv_pool_info_init();
#define POLYKV_POOL_INFO_TO_C(type, name, json_key, c_name) \
  pool_info_c_internal::ToC(out->c_name, p.name);
  POLYKV_POOL_INFO_FIELDS(POLYKV_POOL_INFO_TO_C)
#undef POLYKV_POOL_INFO_TO_C
  if (out->effective_ratio == 0 && p.total_bytes > 0) {
    out->effective_ratio = static_cast<double>(p.bf16_bytes) / static_cast<double>(p.total_bytes);
  }
}

/// The ipc::PoolInfo that `c` describes (every field of the list).
inline ipc::PoolInfo FromCPoolInfo(const polykv_pool_info& c) {
  ipc::PoolInfo p;
#define POLYKV_POOL_INFO_FROM_C(type, name, json_key, c_name) \
  pool_info_c_internal::FromC(p.name, c.c_name);
  POLYKV_POOL_INFO_FIELDS(POLYKV_POOL_INFO_FROM_C)
#undef POLYKV_POOL_INFO_FROM_C
  return p;
}

}  // namespace polykv::client
