// The torch-free face of a prefill (polykv/model/prefill.h) on stories260K: exported layers
// hold exactly the prefill's K/V bytes (and their bf16 rounding when asked), outlive the
// PrefillResult and refuse a missing layer; a prefill after a read-only raw prefix equals the
// tail of one prefill of the whole sequence within float reassociation (|dK|, |dV| <= 1e-4).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "model_test_util.h"
#include "polykv/model/llama.h"
#include "polykv/model/prefill.h"

namespace polykv::model {
namespace {

using testing::Tokens;

const char* kStories = POLYKV_TEST_DATA_DIR "/models/stories260K";

TEST(PrefillExport, LayersHoldThePrefillBytesAndOutliveIt) {
  auto m = LlamaModel::Load(kStories, {});
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& c = (*m)->config();
  const std::vector<int32_t> ids = Tokens(37, c.vocab, 1);
  auto pre = (*m)->Prefill(ids, 16);
  ASSERT_TRUE(pre.ok()) << pre.status();
  ASSERT_EQ(PrefilledLayerCount(*pre), static_cast<size_t>(c.layers));
  auto kv = KvDType(**m);
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_EQ(*kv, kernels::DType::kF32);

  std::vector<PrefilledLayer> layers;
  std::vector<std::vector<float>> want_k, want_v;
  for (size_t l = 0; l < PrefilledLayerCount(*pre); ++l) {
    auto layer = ExportPrefilledLayer(*pre, l, /*to_host=*/true);
    ASSERT_TRUE(layer.ok()) << layer.status();
    EXPECT_EQ(layer->dtype(), kernels::DType::kF32);
    EXPECT_EQ(layer->device(), kernels::Device::kCpu);
    ASSERT_EQ(layer->elements(),
              int64_t{c.kv_heads} * static_cast<int64_t>(ids.size()) * c.head_dim);
    want_k.push_back(pre->k[l]);
    want_v.push_back(pre->v[l]);
    layers.push_back(*std::move(layer));
  }
  *pre = PrefillResult();  // the exported layers keep their own storage
  for (size_t l = 0; l < layers.size(); ++l) {
    const size_t bytes = want_k[l].size() * sizeof(float);
    EXPECT_EQ(std::memcmp(layers[l].k(), want_k[l].data(), bytes), 0) << "layer " << l;
    EXPECT_EQ(std::memcmp(layers[l].v(), want_v[l].data(), bytes), 0) << "layer " << l;
  }
}

TEST(PrefillExport, ConvertsToTheAskedDtypeAndRefusesAMissingLayer) {
  auto m = LlamaModel::Load(kStories, {});
  ASSERT_TRUE(m.ok()) << m.status();
  auto pre = (*m)->Prefill(Tokens(9, (*m)->config().vocab, 2), 16);
  ASSERT_TRUE(pre.ok()) << pre.status();
  auto layer = ExportPrefilledLayer(*pre, 0, true, kernels::DType::kBF16);
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_EQ(layer->dtype(), kernels::DType::kBF16);
  // bf16 by hand: round the f32 bits to nearest even at bit 16 (finite values).
  std::vector<uint16_t> want;
  for (float f : pre->v[0]) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    want.push_back(static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16));
  }
  ASSERT_EQ(layer->elements(), static_cast<int64_t>(want.size()));
  EXPECT_EQ(std::memcmp(layer->v(), want.data(), want.size() * 2), 0);

  auto missing = ExportPrefilledLayer(*pre, PrefilledLayerCount(*pre), true);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kOutOfRange) << missing.status();
}

// A GPU prefill that kept its K/V on the device (PrefillResult::device_kv): exported in place
// (device pointers, shared ownership, f32), never silently copied: to_host and another dtype
// are refused. The pointers are opaque here (host buffers standing in for device memory).
TEST(PrefillExport, DevicePrefillIsHandedOverInPlace) {
  auto owner = std::make_shared<std::vector<std::vector<float>>>(std::vector<std::vector<float>>{
      {1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}, {13, 14, 15, 16}});
  PrefillResult pre;
  pre.tokens = 2;
  pre.device_k = {(*owner)[0].data(), (*owner)[2].data()};
  pre.device_v = {(*owner)[1].data(), (*owner)[3].data()};
  pre.device_layer_elements = 4;
  pre.device_kv = owner;
  EXPECT_EQ(PrefilledLayerCount(pre), 2u);
  auto layer = ExportPrefilledLayer(pre, 1, /*to_host=*/false);
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_EQ(layer->device(), kernels::Device::kCuda);
  EXPECT_EQ(layer->dtype(), kernels::DType::kF32);
  EXPECT_EQ(layer->k(), (*owner)[2].data());
  EXPECT_EQ(layer->v(), (*owner)[3].data());
  EXPECT_EQ(layer->elements(), 4);
  const std::weak_ptr<std::vector<std::vector<float>>> watch = owner;
  owner.reset();
  pre = PrefillResult();
  EXPECT_FALSE(watch.expired()) << "the exported layer must keep the device K/V alive";
  PrefillResult again;
  again.device_k = {nullptr};
  again.device_v = {nullptr};
  again.device_kv = std::make_shared<int>(0);
  EXPECT_EQ(ExportPrefilledLayer(again, 0, /*to_host=*/true).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ExportPrefilledLayer(again, 0, false, kernels::DType::kBF16).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(ExportPrefilledLayer(again, 1, false).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(PrefillExport, PrefillAfterARawPrefixEqualsTheTailOfOnePrefill) {
  auto m = LlamaModel::Load(kStories, {});
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& c = (*m)->config();
  const std::vector<int32_t> all = Tokens(50, c.vocab, 3);
  const std::vector<int32_t> head(all.begin(), all.begin() + 30), tail(all.begin() + 30, all.end());
  auto whole = (*m)->Prefill(all, 64);
  auto first = (*m)->Prefill(head, 64);
  ASSERT_TRUE(whole.ok() && first.ok());

  // The first 30 tokens as a read-only raw f32 prefix (codec none), as a pool would hold them.
  std::vector<PrefilledLayer> keep;
  kernels::PrefixView view;
  view.kv_heads = c.kv_heads;
  view.head_dim = c.head_dim;
  view.tokens = static_cast<int64_t>(head.size());
  view.codec = kernels::PrefixCodec::kRaw;
  view.raw_dtype = kernels::DType::kF32;
  for (size_t l = 0; l < PrefilledLayerCount(*first); ++l) {
    auto layer = ExportPrefilledLayer(*first, l, true);
    ASSERT_TRUE(layer.ok()) << layer.status();
    kernels::PrefixLayer pl;
    pl.k = layer->k();
    pl.v = layer->v();
    view.layers.push_back(pl);
    keep.push_back(*std::move(layer));
  }
  int64_t chunks = 0;
  auto after = PrefillAfterPrefix(**m, {view}, head, tail, 8, [&](int64_t done, int64_t total) {
    ++chunks;
    EXPECT_EQ(total, static_cast<int64_t>(tail.size()));
    EXPECT_LE(done, total);
  });
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(chunks, 3);  // 20 tokens in chunks of 8
  ASSERT_EQ(after->k.size(), whole->k.size());
  for (size_t l = 0; l < after->k.size(); ++l) {
    const int64_t n = static_cast<int64_t>(tail.size());
    const int64_t kvh = (*m)->config().kv_heads, hd = (*m)->config().head_dim;
    const int64_t whole_n = whole->tokens, h0 = static_cast<int64_t>(head.size());
    using testing::MaxAbsDiff;
    using testing::Positions;
    EXPECT_LE(MaxAbsDiff(after->k[l], Positions(whole->k[l], kvh, whole_n, hd, h0, n)), 1e-4f)
        << "layer " << l;
    EXPECT_LE(MaxAbsDiff(after->v[l], Positions(whole->v[l], kvh, whole_n, hd, h0, n)), 1e-4f)
        << "layer " << l;
  }

  auto no_views = PrefillAfterPrefix(**m, {}, head, tail, 8, [](int64_t, int64_t) {});
  ASSERT_FALSE(no_views.ok());
  EXPECT_EQ(no_views.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace polykv::model
