// Pool layout: offsets, PoolWriter/PoolReader round trips (none bit-exact, k8v3 equal to the
// direct codec), checksums detecting flipped bytes, truncated regions.
#include "polykv/ipc/pool_layout.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <random>
#include <vector>

#include "polykv/ipc/codec_spec.h"
#include "pool_test_util.h"

namespace polykv::ipc {
namespace {

using kernels::DType;

PoolParams SmallParams(PoolCodec codec) {
  PoolParams p = testing::TestPoolParams(3, 4, 8, 37, codec);
  p.raw_dtype = DType::kF32;
  p.model_fingerprint = std::string(64, 'a');
  p.architecture = "qwen2";
  p.tokenizer_family = "bpe/qwen2";
  return p;
}

std::vector<float> RandomKv(const PoolParams& p, uint32_t seed) {
  return testing::RandomKv(p, seed, 1.5f);
}

std::vector<int32_t> Ids(uint64_t n) {
  std::vector<int32_t> ids(n);
  for (uint64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(i * 7 % 512);
  return ids;
}

// Writes a whole pool; K of layer l uses seed 2l, V seed 2l+1.
std::vector<uint8_t> BuildPool(const PoolParams& p, PoolLayout* layout_out = nullptr) {
  auto layout = ComputePoolLayout(p);
  EXPECT_TRUE(layout.ok()) << layout.status();
  std::vector<uint8_t> region(layout->total_bytes, 0xEE);
  std::vector<uint8_t> id(32, 0x5A);
  auto ids = Ids(p.tokens);
  auto w = PoolWriter::Create(region.data(), region.size(), p, id, ids);
  EXPECT_TRUE(w.ok()) << w.status();
  for (uint32_t l = 0; l < p.layers; ++l) {
    auto k = RandomKv(p, 2 * l), v = RandomKv(p, 2 * l + 1);
    EXPECT_TRUE(w->WriteLayer(l, k.data(), v.data(), DType::kF32).ok());
  }
  EXPECT_TRUE(w->Finalize().ok());
  if (layout_out) *layout_out = *layout;
  return region;
}

TEST(PoolLayoutTest, OffsetsAlignedAndSized) {
  for (PoolCodec codec : {PoolCodec::kNone, PoolCodec::kK8V}) {
    PoolParams p = SmallParams(codec);
    auto l = ComputePoolLayout(p);
    ASSERT_TRUE(l.ok()) << l.status();
    EXPECT_EQ(l->token_ids, kPoolHeaderBytes);
    ASSERT_EQ(l->layer.size(), p.layers);
    uint64_t prev_end = l->token_ids + 4 * p.tokens;
    const uint64_t elems = uint64_t{p.kv_heads} * p.tokens * p.head_dim;
    for (const auto& lo : l->layer) {
      EXPECT_EQ(lo.k % kPoolSectionAlign, 0u);
      EXPECT_EQ(lo.v % kPoolSectionAlign, 0u);
      EXPECT_EQ(lo.end % kPoolSectionAlign, 0u);
      EXPECT_GE(lo.k, prev_end);
      if (codec == PoolCodec::kK8V) {
        EXPECT_EQ(lo.k_scales % kPoolSectionAlign, 0u);
        EXPECT_EQ(lo.v_norms % kPoolSectionAlign, 0u);
        EXPECT_GE(lo.k_scales, lo.k + elems);
        EXPECT_GE(lo.v, lo.k_scales + 4);
        // 3 bits x 8 dims = 3 bytes per vector.
        EXPECT_GE(lo.v_norms, lo.v + 3 * uint64_t{p.kv_heads} * p.tokens);
        EXPECT_GE(lo.end, lo.v_norms + 4 * uint64_t{p.kv_heads} * p.tokens);
      } else {
        EXPECT_GE(lo.v, lo.k + 4 * elems);
        EXPECT_GE(lo.end, lo.v + 4 * elems);
      }
      prev_end = lo.end;
    }
    EXPECT_EQ(l->total_bytes, l->layer.back().end);
    EXPECT_EQ(l->key_codes + l->key_scales + l->value_codes + l->value_norms + l->overhead,
              l->total_bytes);
    if (codec == PoolCodec::kK8V) {
      EXPECT_EQ(l->key_codes, p.layers * elems);
      EXPECT_EQ(l->key_scales, p.layers * 4u);
      EXPECT_EQ(l->value_codes, p.layers * 3u * p.kv_heads * p.tokens);
      EXPECT_EQ(l->value_norms, p.layers * 4u * p.kv_heads * p.tokens);
    } else {
      EXPECT_EQ(l->key_codes, p.layers * 4 * elems);
    }
  }
  EXPECT_EQ(Bf16CacheBytes(SmallParams(PoolCodec::kK8V)), 2u * 2 * 3 * 4 * 37 * 8);
}

TEST(PoolLayoutTest, RejectsBadParams) {
  PoolParams p = SmallParams(PoolCodec::kK8V);
  p.layers = 0;
  EXPECT_EQ(ComputePoolLayout(p).status().code(), absl::StatusCode::kInvalidArgument);
  p = SmallParams(PoolCodec::kK8V);
  p.codec_config.value_bits = 5;
  auto s = ComputePoolLayout(p).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("value_bits"), std::string::npos);
  p = SmallParams(PoolCodec::kK8V);
  p.tokens = 0;
  EXPECT_NE(std::string(ComputePoolLayout(p).status().message()).find("tokens"), std::string::npos);
  p = SmallParams(PoolCodec::kK8V);
  p.model_fingerprint = std::string(100, 'x');
  EXPECT_EQ(ComputePoolLayout(p).status().code(), absl::StatusCode::kInvalidArgument);
  p = SmallParams(PoolCodec::kK8V);
  p.architecture = std::string(32, 'a');  // 31 + NUL fit
  EXPECT_NE(std::string(ComputePoolLayout(p).status().message()).find("architecture"),
            std::string::npos);
  p.architecture = std::string(31, 'a');
  p.tokenizer_family = std::string(48, 'b');
  EXPECT_NE(std::string(ComputePoolLayout(p).status().message()).find("tokenizer family"),
            std::string::npos);
  p.tokenizer_family = std::string(47, 'b');
  EXPECT_TRUE(ComputePoolLayout(p).ok());
}

TEST(PoolLayoutTest, NoneRoundTripIsBitExact) {
  PoolParams p = SmallParams(PoolCodec::kNone);
  auto region = BuildPool(p);
  auto r = PoolReader::Open(region.data(), region.size(), /*verify_payload=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->params().layers, p.layers);
  EXPECT_EQ(r->params().tokens, p.tokens);
  EXPECT_EQ(r->params().model_fingerprint, p.model_fingerprint);
  EXPECT_EQ(r->params().tokenizer_fingerprint, "none");
  EXPECT_EQ(r->params().architecture, "qwen2");
  EXPECT_EQ(r->params().tokenizer_family, "bpe/qwen2");
  EXPECT_STREQ(r->header().architecture, "qwen2");
  EXPECT_EQ(r->header().pool_id[0], 0x5A);
  EXPECT_EQ(r->TokenIds(), Ids(p.tokens));
  for (uint32_t l = 0; l < p.layers; ++l) {
    auto k = RandomKv(p, 2 * l), v = RandomKv(p, 2 * l + 1);
    std::vector<float> ko(k.size()), vo(v.size());
    ASSERT_TRUE(r->DecodeLayer(l, ko.data(), vo.data(), DType::kF32).ok());
    EXPECT_EQ(0, std::memcmp(ko.data(), k.data(), 4 * k.size())) << "layer " << l;
    EXPECT_EQ(0, std::memcmp(vo.data(), v.data(), 4 * v.size())) << "layer " << l;
  }
  // bf16 output: the top 16 bits of values exactly representable in bf16 survive.
  std::vector<uint16_t> kb(size_t{p.kv_heads} * p.tokens * p.head_dim), vb(kb.size());
  ASSERT_TRUE(r->DecodeLayer(0, kb.data(), vb.data(), DType::kBF16).ok());
  auto k0 = RandomKv(p, 0);
  for (size_t i = 0; i < k0.size(); ++i) {
    uint32_t u = static_cast<uint32_t>(kb[i]) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    EXPECT_NEAR(f, k0[i], std::abs(k0[i]) / 128 + 1e-30) << i;
  }
}

TEST(PoolLayoutTest, ChildPoolRecordsItsParentInTheHeader) {
  // A pool tree: parent id + parent chain length survive the round trip; a root pool reads
  // back with neither; a flipped parent byte fails the header checksum.
  PoolParams p = SmallParams(PoolCodec::kK8V);
  p.parent_id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
  p.parent_tokens = 1438;
  auto region = BuildPool(p);
  auto r = PoolReader::Open(region.data(), region.size(), /*verify_payload=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->params().parent_id, p.parent_id);
  EXPECT_EQ(r->params().parent_tokens, 1438u);
  EXPECT_EQ(r->header().parent_id[0], 0x01);
  EXPECT_EQ(r->header().parent_id[31], 0xef);
  EXPECT_EQ(r->params().tokens, p.tokens);
  auto root = BuildPool(SmallParams(PoolCodec::kK8V));
  auto rr = PoolReader::Open(root.data(), root.size(), true);
  ASSERT_TRUE(rr.ok());
  EXPECT_EQ(rr->params().parent_id, "");
  EXPECT_EQ(rr->params().parent_tokens, 0u);
  region[offsetof(PoolHeader, parent_id) + 5] ^= 1;
  auto bad = PoolReader::Open(region.data(), region.size(), false);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << bad.status();
  // Parent fields are given together, as 64 lowercase hex chars.
  PoolParams q = SmallParams(PoolCodec::kK8V);
  q.parent_tokens = 5;
  EXPECT_EQ(ComputePoolLayout(q).status().code(), absl::StatusCode::kInvalidArgument);
  q.parent_id = std::string(64, 'A');
  EXPECT_EQ(ComputePoolLayout(q).status().code(), absl::StatusCode::kInvalidArgument);
  q.parent_id = std::string(63, 'a');
  EXPECT_EQ(ComputePoolLayout(q).status().code(), absl::StatusCode::kInvalidArgument);
  q.parent_id = std::string(64, 'a');
  EXPECT_TRUE(ComputePoolLayout(q).ok());
  q.parent_tokens = 0;
  EXPECT_EQ(ComputePoolLayout(q).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PoolLayoutTest, CodecSpecPoolsDecodeAsTheCodecAndSizeAsTheEvalSays) {
  // Packed keys, per-layer value bits and f16 norms: the pool decodes to exactly what the
  // codec's own functions give (norms rounded to f16), its layout is the size the eval
  // reports for the spec (PoolSizeOf), and the header keeps every parameter.
  for (const char* name : {"k7c-v3-e4x2-nc-n16", "k4t-v2-n16", "k6h-v4-e2", "k8c-v3-e4-nc"}) {
    SCOPED_TRACE(name);
    PoolParams p = SmallParams(PoolCodec::kK8V);
    p.layers = 5;
    auto spec = ParseCodecSpec(name);
    ASSERT_TRUE(spec.ok()) << spec.status();
    ASSERT_TRUE(ApplyCodecSpec(*spec, p.layers, &p).ok());
    PoolLayout layout;
    auto region = BuildPool(p, &layout);
    EXPECT_EQ(static_cast<int64_t>(layout.total_bytes),
              PoolSizeOf(*spec, p.layers, p.kv_heads, p.head_dim, p.tokens).bytes);
    auto r = PoolReader::Open(region.data(), region.size(), /*verify_payload=*/true);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(PoolCodecLabel(r->params()), CodecSpecOf(p).Canonical());
    EXPECT_EQ(CodecSpecOf(r->params()).Canonical(), spec->Canonical());
    EXPECT_EQ(r->params().codec_config.key_bits, spec->key_bits);
    EXPECT_EQ(r->params().codec_config.norm_dtype, p.codec_config.norm_dtype);
    EXPECT_EQ(r->params().layer_value_bits, p.layer_value_bits);
    const kernels::LayerShape shape{static_cast<int32_t>(p.kv_heads),
                                    static_cast<int64_t>(p.tokens),
                                    static_cast<int32_t>(p.head_dim)};
    auto view = PrefixViewOf(*r);
    ASSERT_TRUE(view.ok()) << view.status();
    for (uint32_t l = 0; l < p.layers; ++l) {
      kernels::CodecConfig c = spec->LayerConfig(static_cast<int>(l), static_cast<int>(p.layers));
      EXPECT_EQ(view->ValueBitsOf(l), c.value_bits);
      auto k = RandomKv(p, 2 * l), v = RandomKv(p, 2 * l + 1);
      std::vector<uint8_t> kc(shape.vectors() *
                              kernels::PackedKeyVectorBytes(shape.head_dim, c.key_bits));
      std::vector<float> ks(kernels::KeyScaleCount(shape, c.key_scale)), kd(k.size());
      ASSERT_TRUE(kernels::EncodeKeys(k.data(), DType::kF32, shape, c, kc.data(), ks.data()).ok());
      ASSERT_TRUE(kernels::DecodeKeys(kc.data(), ks.data(), shape, c, kd.data(), DType::kF32).ok());
      std::vector<uint8_t> vc(shape.vectors() *
                              kernels::PackedVectorBytes(shape.head_dim, c.value_bits));
      std::vector<float> norms(shape.vectors()), vd(v.size());
      ASSERT_TRUE(
          kernels::EncodeValues(v.data(), DType::kF32, shape, c, vc.data(), norms.data()).ok());
      if (c.norm_dtype == DType::kF16) {
        std::vector<uint16_t> h(norms.size());
        kernels::NormsToF16(norms.data(), shape.vectors(), h.data());
        kernels::NormsFromF16(h.data(), shape.vectors(), norms.data());
      }
      ASSERT_TRUE(
          kernels::DecodeValues(vc.data(), norms.data(), shape, c, vd.data(), DType::kF32).ok());
      std::vector<float> ko(k.size()), vo(v.size());
      ASSERT_TRUE(r->DecodeLayer(l, ko.data(), vo.data(), DType::kF32).ok());
      EXPECT_EQ(ko, kd) << "layer " << l;
      EXPECT_EQ(vo, vd) << "layer " << l;
      EXPECT_EQ(0, std::memcmp(region.data() + layout.layer[l].k, kc.data(), kc.size()));
      // A copy of only the layer's bytes (as a CUDA pool's layer reaches the host under
      // --allow-copy) decodes to the same values.
      const std::vector<uint8_t> copy(region.begin() + layout.layer[l].k,
                                      region.begin() + layout.layer[l].end);
      std::vector<float> kcopy(k.size()), vcopy(v.size());
      ASSERT_TRUE(DecodeLayerCopy(copy.data(), r->params(), layout, l, kcopy.data(), vcopy.data(),
                                  DType::kF32)
                      .ok());
      EXPECT_EQ(kcopy, kd) << "layer " << l;
      EXPECT_EQ(vcopy, vd) << "layer " << l;
    }
  }
  // Pools rotate always; per-layer bits are checked.
  PoolParams p = SmallParams(PoolCodec::kK8V);
  EXPECT_EQ(ApplyCodecSpec(*ParseCodecSpec("k8t-v3-norot"), p.layers, &p).code(),
            absl::StatusCode::kInvalidArgument);
  p.layer_value_bits = {3, 5, 3};
  EXPECT_EQ(ComputePoolLayout(p).status().code(), absl::StatusCode::kInvalidArgument);
  p.layer_value_bits = {3, 4};
  EXPECT_EQ(ComputePoolLayout(p).status().code(), absl::StatusCode::kInvalidArgument);
  // The names pools had before specs keep their labels.
  PoolParams legacy = SmallParams(PoolCodec::kK8V);
  legacy.codec_config.key_scale = kernels::KeyScaleMode::kPerChannel;
  EXPECT_EQ(PoolCodecLabel(legacy), "k8v3");
  ASSERT_TRUE(ApplyCodecSpec(*ParseCodecSpec("default"), 30, &legacy).ok());
  EXPECT_EQ(PoolCodecLabel(legacy), kDefaultCodecSpec);
}

TEST(PoolLayoutTest, K8v3DecodeEqualsDirectCodec) {
  PoolParams p = SmallParams(PoolCodec::kK8V);
  auto region = BuildPool(p);
  auto r = PoolReader::Open(region.data(), region.size(), true);
  ASSERT_TRUE(r.ok()) << r.status();
  kernels::LayerShape shape{static_cast<int32_t>(p.kv_heads), static_cast<int64_t>(p.tokens),
                            static_cast<int32_t>(p.head_dim)};
  const auto& c = p.codec_config;
  for (uint32_t l = 0; l < p.layers; ++l) {
    auto k = RandomKv(p, 2 * l), v = RandomKv(p, 2 * l + 1);
    std::vector<int8_t> q(k.size());
    std::vector<float> scales(kernels::KeyScaleCount(shape, c.key_scale));
    std::vector<uint8_t> packed(shape.vectors() * kernels::PackedVectorBytes(8, 3));
    std::vector<float> norms(shape.vectors());
    ASSERT_TRUE(
        kernels::QuantizeKeys(k.data(), DType::kF32, shape, c.key_scale, q.data(), scales.data())
            .ok());
    ASSERT_TRUE(
        kernels::EncodeValues(v.data(), DType::kF32, shape, c, packed.data(), norms.data()).ok());
    std::vector<float> kd(k.size()), vd(v.size()), ko(k.size()), vo(v.size());
    ASSERT_TRUE(
        kernels::DequantizeKeys(q.data(), scales.data(), shape, c.key_scale, kd.data(), DType::kF32)
            .ok());
    ASSERT_TRUE(
        kernels::DecodeValues(packed.data(), norms.data(), shape, c, vd.data(), DType::kF32).ok());
    ASSERT_TRUE(r->DecodeLayer(l, ko.data(), vo.data(), DType::kF32).ok());
    EXPECT_EQ(0, std::memcmp(ko.data(), kd.data(), 4 * kd.size())) << "layer " << l;
    EXPECT_EQ(0, std::memcmp(vo.data(), vd.data(), 4 * vd.size())) << "layer " << l;
    // And the codes in the region are byte-identical to the direct encoding.
    const auto& lo = r->layout().layer[l];
    EXPECT_EQ(0, std::memcmp(region.data() + lo.k, q.data(), q.size()));
    EXPECT_EQ(0, std::memcmp(region.data() + lo.v, packed.data(), packed.size()));
  }
}

TEST(PoolLayoutTest, ChecksumsDetectFlippedBytes) {
  PoolParams p = SmallParams(PoolCodec::kK8V);
  PoolLayout layout;
  auto region = BuildPool(p, &layout);
  // Payload byte (a V code of the last layer).
  {
    auto bad = region;
    bad[layout.layer.back().v + 1] ^= 0x10;
    auto header_only = PoolReader::Open(bad.data(), bad.size(), /*verify_payload=*/false);
    ASSERT_TRUE(header_only.ok()) << "header is intact";
    EXPECT_EQ(header_only->VerifyPayload().code(), absl::StatusCode::kDataLoss);
    auto r = PoolReader::Open(bad.data(), bad.size(), true);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(std::string(r.status().message()).find("payload"), std::string::npos);
  }
  // Header byte (tokens field).
  {
    auto bad = region;
    bad[offsetof(PoolHeader, tokens)] ^= 0x01;
    auto r = PoolReader::Open(bad.data(), bad.size(), false);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(std::string(r.status().message()).find("header"), std::string::npos);
  }
  // Magic.
  {
    auto bad = region;
    bad[0] = 'X';
    EXPECT_EQ(PoolReader::Open(bad.data(), bad.size(), false).status().code(),
              absl::StatusCode::kDataLoss);
  }
}

TEST(PoolLayoutTest, TruncatedRegionRejected) {
  PoolParams p = SmallParams(PoolCodec::kNone);
  auto region = BuildPool(p);
  auto r = PoolReader::Open(region.data(), region.size() - 1, false);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(r.status().message()).find("truncated"), std::string::npos);
  EXPECT_EQ(PoolReader::Open(region.data(), 100, false).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PoolLayoutTest, WriterRejectsBadUse) {
  PoolParams p = SmallParams(PoolCodec::kK8V);
  auto layout = ComputePoolLayout(p);
  ASSERT_TRUE(layout.ok());
  std::vector<uint8_t> region(layout->total_bytes);
  std::vector<uint8_t> id(32, 1);
  auto ids = Ids(p.tokens);
  EXPECT_EQ(PoolWriter::Create(region.data(), region.size() - 1, p, id, ids).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PoolWriter::Create(region.data(), region.size(), p, id, absl::MakeSpan(ids).subspan(1))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  auto w = PoolWriter::Create(region.data(), region.size(), p, id, ids);
  ASSERT_TRUE(w.ok());
  auto k = RandomKv(p, 0);
  ASSERT_TRUE(w->WriteLayer(0, k.data(), k.data(), DType::kF32).ok());
  EXPECT_EQ(w->WriteLayer(3, k.data(), k.data(), DType::kF32).code(),
            absl::StatusCode::kOutOfRange);
  Status fin = w->Finalize();
  EXPECT_EQ(fin.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(fin.message()).find("layer 1"), std::string::npos);
  // An unfinished pool does not open.
  EXPECT_EQ(PoolReader::Open(region.data(), region.size(), false).status().code(),
            absl::StatusCode::kDataLoss);
  // NaN input is refused by the codec, with an error (no crash).
  k[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(w->WriteLayer(1, k.data(), k.data(), DType::kF32).ok());
}

// sum((dec - ref)^2) / sum(ref^2) in double, as the header should record it.
double RelMse(const std::vector<float>& ref, const std::vector<float>& dec) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(dec[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return num / den;
}

TEST(PoolLayoutTest, HeaderRecordsPerLayerReconstructionError) {
  for (PoolCodec codec : {PoolCodec::kK8V, PoolCodec::kNone}) {
    PoolParams p = SmallParams(codec);
    auto layout = ComputePoolLayout(p).value();
    std::vector<uint8_t> region(layout.total_bytes);
    auto w = PoolWriter::Create(region.data(), region.size(), p, std::vector<uint8_t>(32, 7),
                                Ids(p.tokens));
    ASSERT_TRUE(w.ok()) << w.status();
    std::vector<std::vector<float>> ks, vs;
    for (uint32_t l = 0; l < p.layers; ++l) {
      ks.push_back(RandomKv(p, 2 * l));
      vs.push_back(RandomKv(p, 2 * l + 1));
      ASSERT_TRUE(w->WriteLayer(l, ks[l].data(), vs[l].data(), DType::kF32).ok());
    }
    ASSERT_TRUE(w->Finalize().ok());
    auto r = PoolReader::Open(region.data(), region.size(), true);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->header().fidelity_layers, p.layers);
    const std::vector<LayerFidelity> rec = r->RecordedFidelity();
    ASSERT_EQ(rec.size(), p.layers);
    const size_t n = ks[0].size();
    for (uint32_t l = 0; l < p.layers; ++l) {
      std::vector<float> kd(n), vd(n);
      ASSERT_TRUE(r->DecodeLayer(l, kd.data(), vd.data(), DType::kF32).ok());
      const double ek = RelMse(ks[l], kd), ev = RelMse(vs[l], vd);
      if (codec == PoolCodec::kNone) {
        EXPECT_EQ(rec[l].key_rel_mse, 0.0);  // f32 stored as it is
        EXPECT_EQ(rec[l].value_rel_mse, 0.0);
        continue;
      }
      // Recorded as f32: within its rounding of the double computed here.
      EXPECT_NEAR(rec[l].key_rel_mse, ek, 1e-6 * ek) << "layer " << l;
      EXPECT_NEAR(rec[l].value_rel_mse, ev, 1e-6 * ev) << "layer " << l;
      // int8 keys of N(0, 1.5^2) values per tensor scale: about 1e-4; 3-bit values: ~3.4e-2.
      EXPECT_GT(ek, 1e-6);
      EXPECT_LT(ek, 1e-2);
      EXPECT_GT(ev, 1e-2);
      EXPECT_LT(ev, 1e-1);
      auto again = r->MeasureFidelity(l, ks[l].data(), vs[l].data(), DType::kF32);
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_DOUBLE_EQ(again->key_rel_mse, ek);
      EXPECT_DOUBLE_EQ(again->value_rel_mse, ev);
    }
    // The recorded errors are under the header checksum: changing one is DATA_LOSS.
    auto* h = reinterpret_cast<PoolHeader*>(region.data());
    h->value_rel_mse[0] += 0.25f;
    auto bad = PoolReader::Open(region.data(), region.size(), false);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  }
}

TEST(PoolLayoutTest, MeasureFidelityRejectsBadArguments) {
  PoolParams p = SmallParams(PoolCodec::kK8V);
  auto region = BuildPool(p);
  auto r = PoolReader::Open(region.data(), region.size(), true);
  ASSERT_TRUE(r.ok());
  auto k = RandomKv(p, 0);
  EXPECT_EQ(r->MeasureFidelity(p.layers, k.data(), k.data(), DType::kF32).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(r->MeasureFidelity(0, nullptr, k.data(), DType::kF32).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace polykv::ipc
