// Attention in place on a pool vs the decompressed path (the pool decoded into a private f32
// cache), through the whole model: logits of prompt forwards of 1, 7, 64 and 300 rows (the
// last crossing an attention chunk) after a 300-token document, for codec none and
// K8/V2, K8/V3, K8/V4 with each key scale mode, on stories260K (head_dim 8) and SmolLM2
// (head_dim 64). Pools are written in memory with ipc::PoolWriter, exactly as the daemon
// writes them. Both paths run in f32 (SmolLM2 with quantized_rows = 0: f32 products on
// dequantized tiles), so they differ only by float reassociation: max |dlogit| <= 1e-4.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "memory_pool.h"
#include "model_test_util.h"
#include "polykv/ipc/codec_spec.h"
#include "polykv/ipc/pool_layout.h"
#include "polykv/model/llama.h"
#ifdef POLYKV_HAVE_TORCH
#include "polykv/model/torch_reference.h"
#endif

namespace polykv::model {
namespace {

using testing::LoadModel;
using testing::MemoryPool;
using testing::SmolLM2Path;
using testing::Tokens;
using testing::WriteMemoryPool;

const char* kStories = POLYKV_TEST_DATA_DIR "/models/stories260K";

struct Codec {
  const char* name;
  ipc::PoolCodec codec;
  int bits;
  kernels::KeyScaleMode scale;
  const char* spec = nullptr;  ///< a codec spec (ipc/codec_spec.h) instead of the fields
};

// The pool parameters of codec `c` (its spec, when it has one, is applied over them).
ipc::PoolParams CodecParams(const Codec& c) {
  ipc::PoolParams p;
  p.codec = c.codec;
  p.codec_config.value_bits = c.bits > 0 ? c.bits : 3;
  p.codec_config.key_scale = c.scale;
  return p;
}

void CompareInPlaceWithDecompressed(LlamaModel& m, const char* model_name, bool all_codecs) {
  const int32_t vocab = m.config().vocab;
  const std::vector<int32_t> doc = Tokens(300, vocab, 1);
  auto prefill = m.Prefill(doc, 128);
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  const Codec codecs[] = {
      {"none", ipc::PoolCodec::kNone, 0, kernels::KeyScaleMode::kPerTensor},
      {"k8v2/tensor", ipc::PoolCodec::kK8V, 2, kernels::KeyScaleMode::kPerTensor},
      {"k8v3/tensor", ipc::PoolCodec::kK8V, 3, kernels::KeyScaleMode::kPerTensor},
      {"k8v3/head", ipc::PoolCodec::kK8V, 3, kernels::KeyScaleMode::kPerHead},
      {"k8v3/channel", ipc::PoolCodec::kK8V, 3, kernels::KeyScaleMode::kPerChannel},
      {"k8v4/channel", ipc::PoolCodec::kK8V, 4, kernels::KeyScaleMode::kPerChannel},
      {"k8v2/head", ipc::PoolCodec::kK8V, 2, kernels::KeyScaleMode::kPerHead},
      {"k8v4/tensor", ipc::PoolCodec::kK8V, 4, kernels::KeyScaleMode::kPerTensor},
      // Packed 7-bit keys, boundary layers at 4 bits, norm correction, f16 norms: the
      // measured default (pools create --codec default).
      {"k7c-v3-e4x2-nc-n16", ipc::PoolCodec::kK8V, 3, kernels::KeyScaleMode::kPerChannel,
       "k7c-v3-e4x2-nc-n16"},
      {"k5h-v2-e4-n16", ipc::PoolCodec::kK8V, 2, kernels::KeyScaleMode::kPerHead, "k5h-v2-e4-n16"},
  };
  for (const Codec& c : codecs) {
    // The larger model checks one configuration per value bit width and key scale mode.
    const std::string name = c.name;
    if (!all_codecs && name != "none" && name != "k8v2/head" && name != "k8v3/tensor" &&
        name != "k8v4/channel" && name != "k7c-v3-e4x2-nc-n16")
      continue;
    MemoryPool pool = WriteMemoryPool(m, *prefill, doc, CodecParams(c), c.spec);
    auto view = ipc::PrefixViewOf(*pool.reader);
    ASSERT_TRUE(view.ok()) << view.status();
    for (int64_t rows : {1, 7, 64, 300}) {
      const std::vector<int32_t> prompt = Tokens(rows, vocab, 3);
      // In place: the cache's prefix is a view of the pool bytes.
      auto prefix = std::make_shared<KvPrefix>();
      prefix->view = *view;
      auto cache = m.NewCacheWithPrefix(prefix, doc, rows + 1);
      ASSERT_TRUE(cache.ok()) << cache.status();
      auto in_place = m.Forward(prompt, *cache, /*all_logits=*/true);
      ASSERT_TRUE(in_place.ok()) << in_place.status();
      EXPECT_EQ(cache->suffix_length(), rows);
      // Decompressed: every layer decoded into a private dense cache.
      KvCache dense = m.NewCache(static_cast<int64_t>(doc.size()) + rows + 1);
      for (int l = 0; l < m.config().layers; ++l) {
        const int64_t kvh = m.config().kv_heads, hd = m.config().head_dim;
        const int64_t nd = static_cast<int64_t>(doc.size());
        std::vector<float> k(static_cast<size_t>(kvh * nd * hd)), v(k.size());
        ASSERT_TRUE(pool.reader->DecodeLayer(l, k.data(), v.data(), kernels::DType::kF32).ok());
        for (int64_t h = 0; h < kvh; ++h) {
          std::copy_n(k.begin() + h * nd * hd, nd * hd,
                      dense.k[l].begin() + h * dense.capacity * hd);
          std::copy_n(v.begin() + h * nd * hd, nd * hd,
                      dense.v[l].begin() + h * dense.capacity * hd);
        }
      }
      dense.tokens = doc;
      dense.length = static_cast<int64_t>(doc.size());
      auto decompressed = m.Forward(prompt, dense, /*all_logits=*/true);
      ASSERT_TRUE(decompressed.ok()) << decompressed.status();
      const float d = testing::MaxAbsDiff(in_place->values, decompressed->values);
      float mag = 0;
      for (float x : decompressed->values) mag = std::max(mag, std::abs(x));
      EXPECT_LE(d, 1e-4f * std::max(1.0f, mag / 10.0f))
          << model_name << " " << c.name << " " << rows << " prompt rows";
      if (rows == 7 || rows == 300)
        std::printf(
            "%s %-13s %3lld rows: max |dlogit| in place vs decompressed %.2e (|logit| <= %.1f)\n",
            model_name, c.name, static_cast<long long>(rows), d, mag);
    }
  }
}

TEST(PrefixAttention, StoriesInPlaceEqualsDecompressed) {
  auto m = LoadModel(kStories, 1);
  ASSERT_TRUE(m.ok()) << m.status();
  CompareInPlaceWithDecompressed(**m, "stories260K", true);
}

TEST(PrefixAttention, SmolLM2InPlaceEqualsDecompressed) {
  if (SmolLM2Path().empty()) GTEST_SKIP() << "POLYKV_SMOLLM2_GGUF is not set";
  LoadOptions o;
  o.threads = 2;
  o.quantized_rows = 0;  // f32 activations everywhere: the two paths differ by reassociation only
  auto m = LlamaModel::Load(SmolLM2Path(), o);
  ASSERT_TRUE(m.ok()) << m.status();
  CompareInPlaceWithDecompressed(**m, "SmolLM2", false);
}

TEST(PrefixAttention, RawPrefixOfOwnPrefillEqualsCodecNonePoolBitForBit) {
  // A process that prefilled the document itself (FreezeAsPrefix) and an agent of a
  // codec-none pool of the same K/V compute the same logits, bit for bit.
  auto m = LoadModel(kStories, 1);
  ASSERT_TRUE(m.ok());
  const std::vector<int32_t> doc = Tokens(300, (*m)->config().vocab, 5);
  const std::vector<int32_t> prompt = Tokens(9, (*m)->config().vocab, 6);
  KvCache own = (*m)->NewCache(300);
  ASSERT_TRUE((*m)->Forward(doc, own, false).ok());
  auto frozen = (*m)->FreezeAsPrefix(std::move(own), 20);
  ASSERT_TRUE(frozen.ok()) << frozen.status();
  auto a = (*m)->Forward(prompt, *frozen, true);
  ASSERT_TRUE(a.ok());
  auto prefix = testing::PoolPrefix(
      **m, doc, CodecParams({"none", ipc::PoolCodec::kNone, 0, kernels::KeyScaleMode::kPerTensor}));
  ASSERT_NE(prefix, nullptr);
  auto cache = (*m)->NewCacheWithPrefix(prefix, doc, 20);
  ASSERT_TRUE(cache.ok());
  auto b = (*m)->Forward(prompt, *cache, true);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->values, b->values);
}

TEST(PrefixAttention, LostLeaseFailsTheStepAndKeepsTheCache) {
  auto m = LoadModel(kStories, 1);
  ASSERT_TRUE(m.ok());
  const std::vector<int32_t> doc = Tokens(40, (*m)->config().vocab, 5);
  auto prefix = testing::PoolPrefix(
      **m, doc, CodecParams({"k8v3", ipc::PoolCodec::kK8V, 3, kernels::KeyScaleMode::kPerTensor}));
  ASSERT_NE(prefix, nullptr);
  int calls = 0;
  prefix->check = [&calls]() -> Status {
    return ++calls >= 3 ? absl::NotFoundError("pool x was evicted") : absl::OkStatus();
  };
  auto cache = (*m)->NewCacheWithPrefix(prefix, doc, 16);
  ASSERT_TRUE(cache.ok());
  SamplingOptions s;
  s.max_new_tokens = 8;
  s.stop_at_eos = false;
  const std::vector<int32_t> prompt = {1, 2, 3};
  auto r = (*m)->Generate(*cache, prompt, s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(calls, 3);
  // Steps 1 and 2 counted (prompt + one token); the failed third step did not.
  EXPECT_EQ(cache->length, 40 + 3 + 1);
}

TEST(PrefixAttention, BadPrefixesAreRefused) {
  auto m = LlamaModel::Load(kStories, {});
  ASSERT_TRUE(m.ok());
  auto prefix = std::make_shared<KvPrefix>();
  prefix->view.kv_heads = 3;  // the model has 4
  prefix->view.head_dim = 8;
  prefix->view.tokens = 2;
  std::vector<float> buf(1024);
  prefix->view.layers.assign(5, kernels::PrefixLayer{buf.data(), nullptr, buf.data(), nullptr});
  auto c = (*m)->NewCacheWithPrefix(prefix, {1, 2}, 4);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  prefix->view.kv_heads = 4;
  c = (*m)->NewCacheWithPrefix(prefix, {1, 2, 3}, 4);  // 3 ids for 2 positions
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
#ifdef POLYKV_HAVE_TORCH
  // The libtorch reference runtime cannot attend in place.
  auto t = LoadTorchReference(kStories, {});
  ASSERT_TRUE(t.ok());
  c = (*t)->NewCacheWithPrefix(prefix, {1, 2}, 4);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
#endif
  // LlamaModel::Load names where the reference runtime lives.
  LoadOptions copy;
  copy.weights = WeightStorage::kCopy;
  auto refused = LlamaModel::Load(kStories, copy);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(refused.status().message()).find("LoadTorchReference"), std::string::npos)
      << refused.status();
}

}  // namespace
}  // namespace polykv::model
