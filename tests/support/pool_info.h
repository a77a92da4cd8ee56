// A typical PoolInfo for tests: the one the client library's scripted fake daemon announces,
// and the base of the control protocol's round trips.
#pragma once

#include <string>

#include "polykv/ipc/protocol.h"

namespace polykv::support {

/// A host pool of stories260K's shape (2 layers, 2 KV heads, head_dim 8, 5 tokens), codec
/// none, every size and timing field set.
inline ipc::PoolInfo TestPoolInfo(const std::string& id) {
  ipc::PoolInfo p;
  p.id = id;
  p.model = "tests/data/models/stories260K";
  p.model_fingerprint = std::string(64, 'f');
  p.codec = "none";
  p.backend = "host";
  p.tokens = 5;
  p.layers = 2;
  p.kv_heads = 2;
  p.head_dim = 8;
  p.total_bytes = 10000;
  p.key_codes = 1, p.key_scales = 2, p.value_codes = 3, p.value_norms = 4, p.overhead = 5;
  p.bf16_bytes = 320;
  p.effective_ratio = 0.032;
  p.leases = 1;
  p.created_unix_ms = 1700000000123;
  p.prefill_ms = 1.5, p.encode_ms = 2.5, p.publish_ms = 3.5;
  return p;
}

}  // namespace polykv::support
