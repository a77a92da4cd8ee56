// A pool of a model's prefill written in memory as the daemon writes it, and a prefix over it,
// for the model tests that attend to a pool (prefix_attention_test.cc, batch_decode_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "polykv/ipc/codec_spec.h"
#include "polykv/ipc/pool_layout.h"
#include "polykv/model/llama.h"

namespace polykv::model::testing {

/// The pool's bytes and a reader of them (at a 64-byte aligned base inside `bytes`, as the
/// daemon's page-aligned regions are).
struct MemoryPool {
  std::vector<uint8_t> bytes;
  std::unique_ptr<ipc::PoolReader> reader;
};

/// Writes `prefill` (the K/V of `doc` by `m`) as a pool of id 32 x 7 and opens it, verifying
/// the payload. `p` brings the codec; the shape, f32 raw dtype and fingerprint come from `m`,
/// and a codec spec (ipc/codec_spec.h), when given, is applied over `p`'s codec fields.
/// Errors fail the test.
inline MemoryPool WriteMemoryPool(const LlamaModel& m, const PrefillResult& prefill,
                                  const std::vector<int32_t>& doc, ipc::PoolParams p,
                                  const char* spec = nullptr) {
  MemoryPool mp;
  p.layers = static_cast<uint32_t>(m.config().layers);
  p.kv_heads = static_cast<uint32_t>(m.config().kv_heads);
  p.head_dim = static_cast<uint32_t>(m.config().head_dim);
  p.tokens = doc.size();
  if (spec != nullptr) {
    auto parsed = ipc::ParseCodecSpec(spec);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_TRUE(ipc::ApplyCodecSpec(*parsed, p.layers, &p).ok());
  }
  p.raw_dtype = kernels::DType::kF32;
  p.model_fingerprint = m.fingerprint();
  auto layout = ipc::ComputePoolLayout(p);
  EXPECT_TRUE(layout.ok()) << layout.status();
  mp.bytes.assign(layout->total_bytes + 64, 0);
  uint8_t* base = mp.bytes.data() + (64 - reinterpret_cast<uintptr_t>(mp.bytes.data()) % 64) % 64;
  auto w = ipc::PoolWriter::Create(base, layout->total_bytes, p, std::vector<uint8_t>(32, 7), doc);
  EXPECT_TRUE(w.ok()) << w.status();
  for (uint32_t l = 0; l < p.layers; ++l)
    EXPECT_TRUE(
        w->WriteLayer(l, prefill.k[l].data(), prefill.v[l].data(), kernels::DType::kF32).ok());
  EXPECT_TRUE(w->Finalize().ok());
  auto r = ipc::PoolReader::Open(base, layout->total_bytes, /*verify_payload=*/true);
  EXPECT_TRUE(r.ok()) << r.status();
  mp.reader = std::make_unique<ipc::PoolReader>(std::move(*r));
  return mp;
}

/// `doc` prefilled by `m` (512 tokens a step) and written as a pool (WriteMemoryPool with `p`
/// and `spec`), as a prefix that owns the pool; null (and a test failure) when the prefill
/// fails.
inline std::shared_ptr<KvPrefix> PoolPrefix(LlamaModel& m, const std::vector<int32_t>& doc,
                                            const ipc::PoolParams& p, const char* spec = nullptr) {
  auto prefill = m.Prefill(doc, 512);
  if (!prefill.ok()) {
    ADD_FAILURE() << prefill.status();
    return nullptr;
  }
  auto pool = std::make_shared<MemoryPool>(WriteMemoryPool(m, *prefill, doc, p, spec));
  auto view = ipc::PrefixViewOf(*pool->reader);
  EXPECT_TRUE(view.ok()) << view.status();
  auto prefix = std::make_shared<KvPrefix>();
  prefix->view = *view;
  prefix->owner = pool;
  return prefix;
}

}  // namespace polykv::model::testing
