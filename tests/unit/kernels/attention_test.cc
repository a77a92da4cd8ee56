// Split attention over [compressed or raw prefix | f32 suffix]: every ISA variant against
// the scalar reference, and against plain softmax attention (in double) over the prefix
// decoded with the codec's own decoder; the log-sum-exp merge's edge cases.
#include "polykv/kernels/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "polykv/kernels/codec.h"
#include "polykv/kernels/codec_math.h"
#include "polykv/kernels/cpu.h"

namespace polykv::kernels {
namespace {

std::vector<float> Gauss(size_t n, uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

// A one-layer prefix in pool layout, plus its decoded f32 K/V ([kv_heads][tokens][hd]).
struct TestPrefix {
  PrefixView view;
  std::vector<int8_t> kq;
  std::vector<uint8_t> kpacked;   // key_bits < 8
  std::vector<uint16_t> norms16;  // f16 norms
  std::vector<float> kscales, norms;
  std::vector<uint8_t> vpacked;
  std::vector<float> kraw, vraw;         // raw f32 (kRaw f32)
  std::vector<uint16_t> kraw16, vraw16;  // raw f16 / bf16
  std::vector<float> kdec, vdec;         // what the prefix decodes to
};

// codec: "none-f32", "none-f16", "none-bf16", or value bits 2/3/4 with a key scale mode.
// key_bits < 8 packs the keys; f16_norms stores f16 norms; layer_bits > 0 encodes the values
// at that width and records it in PrefixLayer::value_bits (config.value_bits stays `bits`).
TestPrefix MakePrefix(int kv_heads, int64_t tokens, int hd, const std::string& codec, int bits,
                      KeyScaleMode mode, uint64_t seed, int key_bits = 8, bool f16_norms = false,
                      int layer_bits = 0, uint64_t rotation_seed = 0) {
  TestPrefix p;
  const LayerShape shape{kv_heads, tokens, hd};
  p.kraw = Gauss(shape.elements(), seed, 1.5f);
  p.vraw = Gauss(shape.elements(), seed + 1);
  // Per-channel structure in the keys (outlier channels), as real keys have.
  for (int64_t i = 0; i < shape.elements(); ++i)
    if (i % hd == 3) p.kraw[i] *= 6.0f;
  p.view.kv_heads = kv_heads;
  p.view.head_dim = hd;
  p.view.tokens = tokens;
  p.view.layers.resize(1);
  if (codec.rfind("none", 0) == 0) {
    p.view.codec = PrefixCodec::kRaw;
    if (codec == "none-f32") {
      p.view.raw_dtype = DType::kF32;
      p.view.layers[0].k = p.kraw.data();
      p.view.layers[0].v = p.vraw.data();
      p.kdec = p.kraw;
      p.vdec = p.vraw;
    } else {
      const DType t = codec == "none-f16" ? DType::kF16 : DType::kBF16;
      p.view.raw_dtype = t;
      p.kraw16.resize(p.kraw.size());
      p.vraw16.resize(p.vraw.size());
      p.kdec.resize(p.kraw.size());
      p.vdec.resize(p.vraw.size());
      for (size_t i = 0; i < p.kraw.size(); ++i) {
        p.kraw16[i] = t == DType::kF16 ? math::FloatToF16(p.kraw[i]) : math::FloatToBf16(p.kraw[i]);
        p.vraw16[i] = t == DType::kF16 ? math::FloatToF16(p.vraw[i]) : math::FloatToBf16(p.vraw[i]);
        p.kdec[i] =
            t == DType::kF16 ? math::F16ToFloat(p.kraw16[i]) : math::Bf16ToFloat(p.kraw16[i]);
        p.vdec[i] =
            t == DType::kF16 ? math::F16ToFloat(p.vraw16[i]) : math::Bf16ToFloat(p.vraw16[i]);
      }
      p.view.layers[0].k = p.kraw16.data();
      p.view.layers[0].v = p.vraw16.data();
    }
    return p;
  }
  p.view.codec = PrefixCodec::kK8V;
  p.view.config.value_bits = bits;
  p.view.config.key_scale = mode;
  p.view.config.rotation_seed = rotation_seed != 0 ? rotation_seed : seed * 7919;
  p.view.config.key_bits = key_bits;
  p.view.config.norm_dtype = f16_norms ? DType::kF16 : DType::kF32;
  CodecConfig vcfg = p.view.config;
  if (layer_bits > 0) vcfg.value_bits = layer_bits;
  p.kpacked.resize(shape.vectors() * PackedKeyVectorBytes(hd, key_bits));
  p.kscales.resize(KeyScaleCount(shape, mode));
  EXPECT_TRUE(EncodeKeys(p.kraw.data(), DType::kF32, shape, p.view.config, p.kpacked.data(),
                         p.kscales.data())
                  .ok());
  p.vpacked.resize(shape.vectors() * PackedVectorBytes(hd, vcfg.value_bits));
  p.norms.resize(shape.vectors());
  EXPECT_TRUE(
      EncodeValues(p.vraw.data(), DType::kF32, shape, vcfg, p.vpacked.data(), p.norms.data()).ok());
  if (f16_norms) {
    p.norms16.resize(p.norms.size());
    NormsToF16(p.norms.data(), static_cast<int64_t>(p.norms.size()), p.norms16.data());
    NormsFromF16(p.norms16.data(), static_cast<int64_t>(p.norms.size()), p.norms.data());
  }
  p.kdec.resize(shape.elements());
  p.vdec.resize(shape.elements());
  EXPECT_TRUE(DecodeKeys(p.kpacked.data(), p.kscales.data(), shape, p.view.config, p.kdec.data(),
                         DType::kF32)
                  .ok());
  EXPECT_TRUE(
      DecodeValues(p.vpacked.data(), p.norms.data(), shape, vcfg, p.vdec.data(), DType::kF32).ok());
  p.view.layers[0] = PrefixLayer{p.kpacked.data(), p.kscales.data(), p.vpacked.data(),
                                 f16_norms ? static_cast<const void*>(p.norms16.data())
                                           : static_cast<const void*>(p.norms.data()),
                                 layer_bits};
  return p;
}

// Plain attention in double over decoded prefix + suffix, causal in the suffix.
std::vector<double> Reference(const TestPrefix* p, const std::vector<float>& ks,
                              const std::vector<float>& vs, int64_t cap, int64_t slen, int64_t n,
                              int heads, int kvh, int hd, const std::vector<float>& q) {
  const int G = heads / kvh;
  const int64_t P = p != nullptr ? p->view.tokens : 0;
  std::vector<double> out(static_cast<size_t>(n * heads * hd));
  for (int64_t i = 0; i < n; ++i) {
    for (int h = 0; h < heads; ++h) {
      const int kh = h / G;
      const float* qq = q.data() + (i * heads + h) * hd;
      const int64_t sl = slen - n + i + 1;
      std::vector<double> s(P + sl);
      for (int64_t t = 0; t < P + sl; ++t) {
        const float* k =
            t < P ? p->kdec.data() + (kh * P + t) * hd : ks.data() + (kh * cap + (t - P)) * hd;
        double acc = 0;
        for (int d = 0; d < hd; ++d) acc += double{qq[d]} * k[d];
        s[t] = acc / std::sqrt(static_cast<double>(hd));
      }
      double m = -1e300;
      for (double x : s) m = std::max(m, x);
      double l = 0;
      for (double& x : s) {
        x = std::exp(x - m);
        l += x;
      }
      double* o = out.data() + (i * heads + h) * hd;
      for (int64_t t = 0; t < P + sl; ++t) {
        const float* v =
            t < P ? p->vdec.data() + (kh * P + t) * hd : vs.data() + (kh * cap + (t - P)) * hd;
        for (int d = 0; d < hd; ++d) o[d] += s[t] / l * v[d];
      }
    }
  }
  return out;
}

struct Shape {
  int heads, kv_heads, hd;
  int64_t prefix, suffix, n;
};

void CheckCase(const Shape& sh, const std::string& codec, int bits, KeyScaleMode mode,
               int key_bits = 8, bool f16_norms = false, int layer_bits = 0) {
  SCOPED_TRACE(::testing::Message()
               << codec << " bits=" << bits << " mode=" << static_cast<int>(mode)
               << " key_bits=" << key_bits << " f16_norms=" << f16_norms
               << " layer_bits=" << layer_bits << " hd=" << sh.hd << " prefix=" << sh.prefix
               << " suffix=" << sh.suffix << " n=" << sh.n);
  TestPrefix p = MakePrefix(sh.kv_heads, sh.prefix, sh.hd, codec, bits, mode, 11 + sh.hd, key_bits,
                            f16_norms, layer_bits);
  const int64_t cap = sh.suffix + 5;
  const auto ks = Gauss(static_cast<size_t>(sh.kv_heads * cap * sh.hd), 21, 1.5f);
  const auto vs = Gauss(static_cast<size_t>(sh.kv_heads * cap * sh.hd), 22);
  const auto q = Gauss(static_cast<size_t>(sh.n * sh.heads * sh.hd), 23);
  AttentionArgs a;
  a.prefix = &p.view;
  a.k_suffix = ks.data();
  a.v_suffix = vs.data();
  a.suffix_capacity = cap;
  a.suffix_length = sh.suffix;
  a.n = sh.n;
  a.heads = sh.heads;
  a.kv_heads = sh.kv_heads;
  a.head_dim = sh.hd;
  a.q = q.data();
  const auto ref = Reference(&p, ks, vs, cap, sh.suffix, sh.n, sh.heads, sh.kv_heads, sh.hd, q);
  std::vector<float> scalar_out;
  for (Isa isa : SupportedIsas()) {
    for (int threads : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << IsaName(isa) << " threads " << threads);
      std::vector<float> out(ref.size(), 1e30f);
      a.out = out.data();
      AttentionOptions o;
      o.isa = static_cast<int>(isa);
      o.threads = threads;
      ASSERT_TRUE(AttentionForward(a, o).ok());
      double max_err = 0;
      for (size_t i = 0; i < ref.size(); ++i)
        max_err = std::max(max_err, std::fabs(out[i] - ref[i]));
      // Outputs are convex combinations of O(1) values: an absolute bound.
      EXPECT_LE(max_err, 2e-5) << "vs plain attention over the decoded prefix";
      if (isa == Isa::kScalar && threads == 1) {
        scalar_out = out;
      } else {
        for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], scalar_out[i], 1e-5) << i;
      }
    }
  }
}

TEST(Attention, InPlaceEqualsDecodedPrefixForEveryCodecAndIsa) {
  const KeyScaleMode modes[] = {KeyScaleMode::kPerTensor, KeyScaleMode::kPerHead,
                                KeyScaleMode::kPerChannel};
  const Shape shapes[] = {
      {9, 3, 64, 600, 20, 1},  // SmolLM2 decode; prefix crosses chunks (256)
      {9, 3, 64, 300, 70, 7},  // prompt of 7 rows
      {4, 2, 8, 40, 300, 64},  // stories260K-like head_dim 8; suffix crosses a chunk
      {8, 2, 80, 257, 3, 1},   // head_dim 80 (block-diagonal rotation)
      {6, 2, 96, 100, 9, 2},   // head_dim 96
      {8, 8, 128, 513, 1, 1},  // head_dim 128, no GQA
  };
  for (const Shape& sh : shapes) {
    for (const char* c : {"none-f32", "none-f16", "none-bf16"})
      CheckCase(sh, c, 0, KeyScaleMode::kPerTensor);
    for (int bits : {2, 3, 4})
      for (KeyScaleMode m : modes) CheckCase(sh, "k8v", bits, m);
  }
}

TEST(Attention, InPlacePackedKeysF16NormsAndLayerBits) {
  // Keys of 4..7 bits (packed, unpacked per chunk), f16 norms (widened per chunk) and a
  // layer whose value bits differ from the view's: the same result as plain attention over
  // what the prefix decodes to, on every ISA.
  const Shape shapes[] = {
      {9, 3, 64, 600, 20, 1},
      {4, 2, 8, 40, 300, 64},
      {8, 2, 80, 257, 3, 1},
  };
  for (const Shape& sh : shapes) {
    for (int kb : {4, 5, 6, 7}) CheckCase(sh, "k8v", 4, KeyScaleMode::kPerChannel, kb, kb % 2 == 0);
    CheckCase(sh, "k8v", 3, KeyScaleMode::kPerTensor, 8, true);
    CheckCase(sh, "k8v", 3, KeyScaleMode::kPerHead, 6, false, 4);
    CheckCase(sh, "k8v", 4, KeyScaleMode::kPerChannel, 8, false, 2);
  }
}

TEST(Codec, PackedKeysRoundTripAndLayout) {
  // 8 codes of 6 bits fill 6 bytes; code = q + 32, LSB first.
  const int8_t q[8] = {-31, -1, 0, 1, 31, 5, -5, 2};
  uint8_t packed[6] = {};
  math::PackKeyCodes(q, 8, 6, packed);
  uint64_t w = 0;
  for (int b = 0; b < 6; ++b) w |= uint64_t{packed[b]} << (8 * b);
  for (int k = 0; k < 8; ++k) EXPECT_EQ(static_cast<int>((w >> (6 * k)) & 63), q[k] + 32) << k;
  int8_t back[8];
  math::UnpackKeyCodes(packed, 8, 6, back);
  for (int k = 0; k < 8; ++k) EXPECT_EQ(back[k], q[k]);
  // Every width 4..7 and a head_dim that is not a multiple of 8.
  for (int bits = 4; bits <= 7; ++bits) {
    const LayerShape shape{2, 17, 13};
    auto k = Gauss(static_cast<size_t>(shape.elements()), 5 + bits, 2.0f);
    CodecConfig c;
    c.key_bits = bits;
    c.key_scale = KeyScaleMode::kPerChannel;
    std::vector<uint8_t> codes(shape.vectors() * PackedKeyVectorBytes(13, bits));
    EXPECT_EQ(PackedKeyVectorBytes(13, bits), (13 * bits + 7) / 8);
    std::vector<float> scales(KeyScaleCount(shape, c.key_scale)), out(k.size());
    ASSERT_TRUE(EncodeKeys(k.data(), DType::kF32, shape, c, codes.data(), scales.data()).ok());
    ASSERT_TRUE(DecodeKeys(codes.data(), scales.data(), shape, c, out.data(), DType::kF32).ok());
    const int qm = (1 << (bits - 1)) - 1;
    for (size_t i = 0; i < k.size(); ++i) {
      const float s = scales[(i / (17 * 13)) * 13 + i % 13];
      EXPECT_LE(std::fabs(out[i] - k[i]), 0.5f * s * 1.0001f) << bits << " " << i;
      EXPECT_LE(std::fabs(out[i] / s), qm + 1e-3f);
    }
  }
  CodecConfig bad;
  bad.key_bits = 3;
  EXPECT_FALSE(ValidateConfig({1, 1, 8}, bad).ok());
  bad.key_bits = 8;
  bad.norm_dtype = DType::kBF16;
  EXPECT_FALSE(ValidateConfig({1, 1, 8}, bad).ok());
}

TEST(Codec, PackedKeyUnpackMatchesTheScalarReference) {
  // The BMI2 PDEP path (on CPUs that have it) gives the reference's bytes, also for groups at
  // the very end of an exactly sized buffer and head_dims that are not multiples of 8.
  for (int bits = 4; bits <= 7; ++bits) {
    for (int hd : {64, 13, 80, 8, 128}) {
      for (int64_t n : {1, 3, 37}) {
        const int64_t vb = PackedKeyVectorBytes(hd, bits);
        std::vector<uint8_t> codes(static_cast<size_t>(n * vb));
        std::mt19937 rng(static_cast<uint32_t>(bits * 1000 + hd * 10 + n));
        for (auto& c : codes) c = static_cast<uint8_t>(rng());
        std::vector<int8_t> a(static_cast<size_t>(n * hd)), b(a.size(), 99);
        UnpackKeyVectorsScalar(codes.data(), n, hd, bits, a.data());
        UnpackKeyVectors(codes.data(), n, hd, bits, b.data());
        ASSERT_EQ(a, b) << "bits " << bits << " hd " << hd << " n " << n;
        const int lim = 1 << (bits - 1);
        for (int8_t x : a) ASSERT_TRUE(x >= -lim && x < lim);
      }
    }
  }
}

TEST(Attention, NoPrefixAndOddHeadDim) {
  CheckCase({4, 2, 64, 0, 30, 5}, "none-f32", 0, KeyScaleMode::kPerTensor);  // empty prefix
  CheckCase({2, 1, 12, 50, 4, 2}, "k8v", 3, KeyScaleMode::kPerChannel);      // hd % 8 != 0
}

TEST(Attention, RawPrefixEqualsSameValuesHeldAsPrefixBitForBit) {
  // A raw f32 prefix read from one buffer or another copy of the same bytes: identical
  // results, for every thread count (the chunking depends only on the lengths).
  TestPrefix p = MakePrefix(3, 700, 64, "none-f32", 0, KeyScaleMode::kPerTensor, 5);
  TestPrefix p2 = p;
  p2.view.layers[0].k = p2.kraw.data();
  p2.view.layers[0].v = p2.vraw.data();
  const int64_t cap = 40;
  const auto ks = Gauss(3 * cap * 64, 1), vs = Gauss(3 * cap * 64, 2), q = Gauss(2 * 9 * 64, 3);
  std::vector<float> o1(2 * 9 * 64), o2(o1.size());
  AttentionArgs a;
  a.k_suffix = ks.data();
  a.v_suffix = vs.data();
  a.suffix_capacity = cap;
  a.suffix_length = 33;
  a.n = 2;
  a.heads = 9;
  a.kv_heads = 3;
  a.head_dim = 64;
  a.q = q.data();
  a.prefix = &p.view;
  a.out = o1.data();
  AttentionOptions one;
  one.threads = 1;
  ASSERT_TRUE(AttentionForward(a, one).ok());
  a.prefix = &p2.view;
  a.out = o2.data();
  AttentionOptions two;
  two.threads = 2;
  ASSERT_TRUE(AttentionForward(a, two).ok());
  EXPECT_EQ(o1, o2);
}

// The prefix of `a` followed by that of `b` as one decoded prefix (for Reference).
TestPrefix Concatenated(const TestPrefix& a, const TestPrefix& b) {
  TestPrefix c;
  c.view = a.view;
  c.view.tokens = a.view.tokens + b.view.tokens;
  const int kvh = a.view.kv_heads, hd = a.view.head_dim;
  for (int h = 0; h < kvh; ++h) {
    for (const TestPrefix* p : {&a, &b}) {
      const int64_t n = p->view.tokens * hd;
      c.kdec.insert(c.kdec.end(), p->kdec.begin() + h * n, p->kdec.begin() + (h + 1) * n);
      c.vdec.insert(c.vdec.end(), p->vdec.begin() + h * n, p->vdec.begin() + (h + 1) * n);
    }
  }
  return c;
}

TEST(Attention, PrefixSegmentsEqualTheConcatenatedPrefix) {
  // A pool tree: a parent's segment then a child's, each encoded on its own (own key scales,
  // even another key scale mode, the same rotation seed): plain attention over both decoded
  // segments concatenated, on every ISA and thread count.
  struct Case {
    const char* codec;
    int bits;
    KeyScaleMode ma, mb;
    int64_t pa, pb;
  };
  const Case cases[] = {
      {"none-f32", 0, KeyScaleMode::kPerTensor, KeyScaleMode::kPerTensor, 300, 45},
      {"none-bf16", 0, KeyScaleMode::kPerTensor, KeyScaleMode::kPerTensor, 256, 300},
      {"k8v", 3, KeyScaleMode::kPerTensor, KeyScaleMode::kPerTensor, 600, 37},
      {"k8v", 4, KeyScaleMode::kPerChannel, KeyScaleMode::kPerHead, 100, 260},
      {"k8v", 2, KeyScaleMode::kPerHead, KeyScaleMode::kPerHead, 1, 1},
  };
  const int heads = 9, kvh = 3, hd = 64;
  for (const Case& cs : cases) {
    SCOPED_TRACE(::testing::Message() << cs.codec << cs.bits << " " << cs.pa << "+" << cs.pb);
    TestPrefix a = MakePrefix(kvh, cs.pa, hd, cs.codec, cs.bits, cs.ma, 31, 8, false, 0, 4242);
    TestPrefix b = MakePrefix(kvh, cs.pb, hd, cs.codec, cs.bits, cs.mb, 77, 8, false, 0, 4242);
    TestPrefix cat = Concatenated(a, b);
    const int64_t cap = 20, slen = 11, n = 3;
    const auto ks = Gauss(kvh * cap * hd, 41, 1.5f), vs = Gauss(kvh * cap * hd, 42);
    const auto q = Gauss(n * heads * hd, 43);
    const auto ref = Reference(&cat, ks, vs, cap, slen, n, heads, kvh, hd, q);
    std::vector<PrefixView> tail = {b.view};
    AttentionArgs args;
    args.prefix = &a.view;
    args.prefix_tail = tail;
    args.k_suffix = ks.data();
    args.v_suffix = vs.data();
    args.suffix_capacity = cap;
    args.suffix_length = slen;
    args.n = n;
    args.heads = heads;
    args.kv_heads = kvh;
    args.head_dim = hd;
    args.q = q.data();
    for (Isa isa : SupportedIsas()) {
      for (int threads : {1, 2}) {
        std::vector<float> out(ref.size(), 1e30f);
        args.out = out.data();
        AttentionOptions o;
        o.isa = static_cast<int>(isa);
        o.threads = threads;
        ASSERT_TRUE(AttentionForward(args, o).ok());
        double max_err = 0;
        for (size_t i = 0; i < ref.size(); ++i)
          max_err = std::max(max_err, std::fabs(out[i] - ref[i]));
        EXPECT_LE(max_err, 2e-5) << IsaName(isa) << " threads " << threads;
      }
    }
  }
}

TEST(Attention, PrefixSplitAtAChunkBoundaryIsBitIdentical) {
  // Each segment is chunked from its own first token: a raw prefix of 700 tokens split at
  // 512 (2 x kAttentionChunk) runs exactly the chunks and merges of the unsplit prefix;
  // for 2 query rows (decode-like) and 7 (a prompt: 21 queries per KV head, the AVX-512
  // build's transposed-key scores), on every ISA.
  const int kvh = 3, hd = 64, heads = 9;
  TestPrefix whole = MakePrefix(kvh, 700, hd, "none-f32", 0, KeyScaleMode::kPerTensor, 9);
  std::vector<float> ka, va, kb, vb;
  for (int h = 0; h < kvh; ++h) {
    const float* k = whole.kraw.data() + h * 700 * hd;
    const float* v = whole.vraw.data() + h * 700 * hd;
    ka.insert(ka.end(), k, k + 512 * hd);
    va.insert(va.end(), v, v + 512 * hd);
    kb.insert(kb.end(), k + 512 * hd, k + 700 * hd);
    vb.insert(vb.end(), v + 512 * hd, v + 700 * hd);
  }
  PrefixView head = whole.view, tail = whole.view;
  head.tokens = 512;
  head.layers[0] = PrefixLayer{ka.data(), nullptr, va.data(), nullptr};
  tail.tokens = 188;
  tail.layers[0] = PrefixLayer{kb.data(), nullptr, vb.data(), nullptr};
  const int64_t cap = 16;
  for (int64_t rows : {int64_t{2}, int64_t{7}}) {
    const auto ks = Gauss(kvh * cap * hd, 1), vs = Gauss(kvh * cap * hd, 2),
               q = Gauss(rows * heads * hd, 3);
    std::vector<float> o1(rows * heads * hd), o2(o1.size());
    AttentionArgs a;
    a.k_suffix = ks.data();
    a.v_suffix = vs.data();
    a.suffix_capacity = cap;
    a.suffix_length = 9;
    a.n = rows;
    a.heads = heads;
    a.kv_heads = kvh;
    a.head_dim = hd;
    a.q = q.data();
    for (Isa isa : SupportedIsas())
      for (int threads : {1, 2}) {
        AttentionOptions o;
        o.isa = static_cast<int>(isa);
        o.threads = threads;
        a.prefix = &whole.view;
        a.prefix_tail = {};
        a.out = o1.data();
        ASSERT_TRUE(AttentionForward(a, o).ok());
        std::vector<PrefixView> tails = {tail};
        a.prefix = &head;
        a.prefix_tail = tails;
        a.out = o2.data();
        ASSERT_TRUE(AttentionForward(a, o).ok());
        EXPECT_EQ(o1, o2) << IsaName(isa) << " threads " << threads << " rows " << rows;
      }
  }
}

TEST(Attention, PrefixSegmentsMustShareCodecAndRotation) {
  TestPrefix a = MakePrefix(2, 10, 16, "k8v", 3, KeyScaleMode::kPerTensor, 1, 8, false, 0, 99);
  TestPrefix b = MakePrefix(2, 10, 16, "k8v", 3, KeyScaleMode::kPerTensor, 2, 8, false, 0, 100);
  TestPrefix r = MakePrefix(2, 10, 16, "none-f32", 0, KeyScaleMode::kPerTensor, 3);
  std::vector<float> buf(4096);
  AttentionArgs args;
  args.k_suffix = args.v_suffix = buf.data();
  args.q = buf.data();
  args.out = buf.data() + 2048;
  args.suffix_capacity = 4;
  args.suffix_length = 1;
  args.n = 1;
  args.heads = 2;
  args.kv_heads = 2;
  args.head_dim = 16;
  args.prefix = &a.view;
  for (const PrefixView* bad : {&b.view, &r.view}) {
    std::vector<PrefixView> tail = {*bad};
    args.prefix_tail = tail;
    const Status s = AttentionForward(args);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("segment 1"), std::string::npos) << s;
  }
}

TEST(Attention, MergeHandlesEmptyPartsAndInfinities) {
  const float inf = std::numeric_limits<float>::infinity();
  float oa[2] = {1.0f, 2.0f}, ob[2] = {3.0f, -1.0f};
  // Empty b: a unchanged, exactly.
  AttentionState a{0.5f, 2.0f, oa};
  MergeAttentionState(a, AttentionState{-inf, 0.0f, ob}, 2);
  EXPECT_EQ(a.m, 0.5f);
  EXPECT_EQ(a.l, 2.0f);
  EXPECT_EQ(oa[0], 1.0f);
  EXPECT_EQ(oa[1], 2.0f);
  // Empty a: becomes b exactly.
  float oe[2] = {9.0f, 9.0f};
  AttentionState e{-inf, 0.0f, oe};
  MergeAttentionState(e, AttentionState{1.5f, 3.0f, ob}, 2);
  EXPECT_EQ(e.m, 1.5f);
  EXPECT_EQ(e.l, 3.0f);
  EXPECT_EQ(oe[0], 3.0f);
  EXPECT_EQ(oe[1], -1.0f);
  // Both non-empty: the weights l_p e^(m_p - m).
  float o1[1] = {1.0f}, o2[1] = {0.0f};
  AttentionState s1{0.0f, 1.0f, o1};
  MergeAttentionState(s1, AttentionState{std::log(3.0f), 1.0f, o2}, 1);  // weights 1 and 3
  EXPECT_NEAR(o1[0], 0.25f, 1e-7);
  EXPECT_NEAR(s1.l, 4.0f / 3.0f, 1e-6);  // 1/3 + 1
  EXPECT_FLOAT_EQ(s1.m, std::log(3.0f));
  // Two empty parts stay empty (no NaN from -inf - -inf).
  float z1[1] = {0.0f}, z2[1] = {0.0f};
  AttentionState za{-inf, 0.0f, z1};
  MergeAttentionState(za, AttentionState{-inf, 0.0f, z2}, 1);
  EXPECT_EQ(za.l, 0.0f);
  EXPECT_FALSE(std::isnan(z1[0]));
}

TEST(Attention, RejectsInconsistentShapes) {
  std::vector<float> buf(1024);
  AttentionArgs a;
  a.k_suffix = a.v_suffix = buf.data();
  a.q = buf.data();
  a.out = buf.data();
  a.suffix_capacity = 4;
  a.suffix_length = 5;
  a.n = 1;
  a.heads = 2;
  a.kv_heads = 1;
  a.head_dim = 8;
  EXPECT_EQ(AttentionForward(a).code(), absl::StatusCode::kInvalidArgument);  // length > capacity
  a.suffix_length = 2;
  a.heads = 3;
  a.kv_heads = 2;
  EXPECT_EQ(AttentionForward(a).code(), absl::StatusCode::kInvalidArgument);  // GQA
  a.heads = 2;
  a.kv_heads = 1;
  PrefixView pv;
  pv.kv_heads = 2;
  pv.head_dim = 8;
  pv.tokens = 3;
  pv.layers.resize(1, PrefixLayer{buf.data(), nullptr, buf.data(), nullptr});
  a.prefix = &pv;
  EXPECT_EQ(AttentionForward(a).code(), absl::StatusCode::kInvalidArgument);  // kv_heads differ
}

}  // namespace
}  // namespace polykv::kernels
