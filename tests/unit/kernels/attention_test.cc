// Split attention over [compressed or raw prefix | f32 suffix]: every ISA variant against
// the scalar reference, and against plain softmax attention (in double) over the prefix
// decoded with the codec's own decoder; the log-sum-exp merge's edge cases.
#include "polykv/kernels/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "polykv/kernels/codec.h"
#include "polykv/kernels/codec_math.h"
#include "polykv/kernels/cpu.h"
#include "test_util.h"

namespace polykv::kernels {
namespace {

using testing::AttentionDims;
using testing::BatchArgs;
using testing::Gaussian;
using testing::kKeyScaleModes;
using testing::MaxAbsError;
using testing::SlotArgs;
using testing::SuffixArgs;

// AttentionForward(a) on `isa` with `threads` (and AttentionOptions::amx) into `out`, first
// filled with 1e30 so that a value it does not write shows.
void ForwardOn(AttentionArgs a, Isa isa, int threads, std::vector<float>* out, int amx = -1) {
  std::fill(out->begin(), out->end(), 1e30f);
  a.out = out->data();
  AttentionOptions o;
  o.isa = static_cast<int>(isa);
  o.threads = threads;
  o.amx = amx;
  ASSERT_TRUE(AttentionForward(a, o).ok());
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
  p.kraw = Gaussian(shape.elements(), seed, 1.5f);
  p.vraw = Gaussian(shape.elements(), seed + 1);
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
  const auto ks = Gaussian(static_cast<size_t>(sh.kv_heads * cap * sh.hd), 21, 1.5f);
  const auto vs = Gaussian(static_cast<size_t>(sh.kv_heads * cap * sh.hd), 22);
  const auto q = Gaussian(static_cast<size_t>(sh.n * sh.heads * sh.hd), 23);
  AttentionArgs a = SuffixArgs({cap, sh.suffix, sh.n, sh.heads, sh.kv_heads, sh.hd}, ks.data(),
                               vs.data(), q.data());
  a.prefix = &p.view;
  const auto ref = Reference(&p, ks, vs, cap, sh.suffix, sh.n, sh.heads, sh.kv_heads, sh.hd, q);
  std::vector<float> scalar_out;
  for (Isa isa : SupportedIsas()) {
    for (int threads : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << IsaName(isa) << " threads " << threads);
      std::vector<float> out(ref.size());
      ASSERT_NO_FATAL_FAILURE(ForwardOn(a, isa, threads, &out));
      // Outputs are convex combinations of O(1) values: an absolute bound.
      EXPECT_LE(MaxAbsError(out, ref), 2e-5) << "vs plain attention over the decoded prefix";
      if (isa == Isa::kScalar && threads == 1) {
        scalar_out = out;
      } else {
        for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], scalar_out[i], 1e-5) << i;
      }
    }
  }
}

TEST(Attention, InPlaceEqualsDecodedPrefixForEveryCodecAndIsa) {
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
      for (KeyScaleMode m : kKeyScaleModes) CheckCase(sh, "k8v", bits, m);
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
    auto k = Gaussian(static_cast<size_t>(shape.elements()), 5 + bits, 2.0f);
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
  const auto ks = Gaussian(3 * cap * 64, 1), vs = Gaussian(3 * cap * 64, 2),
             q = Gaussian(2 * 9 * 64, 3);
  std::vector<float> o1(2 * 9 * 64), o2(o1.size());
  AttentionArgs a = SuffixArgs({cap, 33, 2, 9, 3, 64}, ks.data(), vs.data(), q.data(), o1.data());
  a.prefix = &p.view;
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
    const auto ks = Gaussian(kvh * cap * hd, 41, 1.5f), vs = Gaussian(kvh * cap * hd, 42);
    const auto q = Gaussian(n * heads * hd, 43);
    const auto ref = Reference(&cat, ks, vs, cap, slen, n, heads, kvh, hd, q);
    std::vector<PrefixView> tail = {b.view};
    AttentionArgs args = SuffixArgs({cap, slen, n, heads, kvh, hd}, ks.data(), vs.data(), q.data());
    args.prefix = &a.view;
    args.prefix_tail = tail;
    for (Isa isa : SupportedIsas()) {
      for (int threads : {1, 2}) {
        std::vector<float> out(ref.size());
        ASSERT_NO_FATAL_FAILURE(ForwardOn(args, isa, threads, &out));
        EXPECT_LE(MaxAbsError(out, ref), 2e-5) << IsaName(isa) << " threads " << threads;
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
    const auto ks = Gaussian(kvh * cap * hd, 1), vs = Gaussian(kvh * cap * hd, 2),
               q = Gaussian(rows * heads * hd, 3);
    std::vector<float> o1(rows * heads * hd), o2(o1.size());
    AttentionArgs a = SuffixArgs({cap, 9, rows, heads, kvh, hd}, ks.data(), vs.data(), q.data());
    for (Isa isa : SupportedIsas())
      for (int threads : {1, 2}) {
        a.prefix = &whole.view;
        a.prefix_tail = {};
        ASSERT_NO_FATAL_FAILURE(ForwardOn(a, isa, threads, &o1));
        std::vector<PrefixView> tails = {tail};
        a.prefix = &head;
        a.prefix_tail = tails;
        ASSERT_NO_FATAL_FAILURE(ForwardOn(a, isa, threads, &o2));
        EXPECT_EQ(o1, o2) << IsaName(isa) << " threads " << threads << " rows " << rows;
      }
  }
}

TEST(Attention, PrefixSegmentsMustShareCodecAndRotation) {
  TestPrefix a = MakePrefix(2, 10, 16, "k8v", 3, KeyScaleMode::kPerTensor, 1, 8, false, 0, 99);
  TestPrefix b = MakePrefix(2, 10, 16, "k8v", 3, KeyScaleMode::kPerTensor, 2, 8, false, 0, 100);
  TestPrefix r = MakePrefix(2, 10, 16, "none-f32", 0, KeyScaleMode::kPerTensor, 3);
  std::vector<float> buf(4096);
  AttentionArgs args =
      SuffixArgs({4, 1, 1, 2, 2, 16}, buf.data(), buf.data(), buf.data(), buf.data() + 2048);
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
  AttentionArgs a = SuffixArgs({4, 5, 1, 2, 1, 8}, buf.data(), buf.data(), buf.data(), buf.data());
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

// ---- AttentionForwardBatch: S sessions over one shared prefix -----------------------------

// One session's buffers: its suffix K/V, queries and output.
struct TestSession {
  int64_t cap = 0, slen = 0, n = 0;
  std::vector<float> ks, vs, q, out;
};

// Sessions with the given (rows, private suffix tokens before the rows) pairs: suffix_length
// = rows + history; rows 0 = a session that sits the step out.
std::vector<TestSession> MakeSessions(const std::vector<std::pair<int64_t, int64_t>>& shapes,
                                      int heads, int kvh, int hd, uint64_t seed) {
  std::vector<TestSession> v;
  for (const auto& [rows, history] : shapes) {
    TestSession s;
    s.n = rows;
    s.slen = rows + history;
    s.cap = s.slen + 3;
    s.ks = Gaussian(static_cast<size_t>(kvh * s.cap * hd), seed++, 1.5f);
    s.vs = Gaussian(static_cast<size_t>(kvh * s.cap * hd), seed++);
    s.q = Gaussian(static_cast<size_t>(std::max<int64_t>(rows, 1) * heads * hd), seed++);
    v.push_back(std::move(s));
  }
  return v;
}

// Every session's output of AttentionForwardBatch equals its own AttentionForward call bit for
// bit, on every ISA (avx512: with and without the AMX integer scores of int8 keys) and for 1
// and 2 threads; a session with n = 0 is left untouched.
void CheckBatch(const std::vector<PrefixView>& segments, int heads, int kvh, int hd,
                std::vector<TestSession>& sess) {
  const PrefixView* prefix = segments.empty() ? nullptr : &segments[0];
  const absl::Span<const PrefixView> tail = segments.size() > 1
                                                ? absl::MakeConstSpan(segments).subspan(1)
                                                : absl::Span<const PrefixView>();
  std::vector<std::pair<Isa, int>> runs;  // (ISA, AttentionOptions::amx)
  for (Isa isa : SupportedIsas()) {
    runs.push_back({isa, -1});
    if (isa == Isa::kAvx512 && AmxInt8Supported()) runs.push_back({isa, 0});
  }
  for (const auto& [isa, amx] : runs) {
    for (int threads : {1, 2}) {
      SCOPED_TRACE(::testing::Message()
                   << IsaName(isa) << " amx " << amx << " threads " << threads);
      AttentionOptions o;
      o.isa = static_cast<int>(isa);
      o.threads = threads;
      o.amx = amx;
      std::vector<std::vector<float>> separate(sess.size());
      std::vector<AttentionSession> bs(sess.size());
      for (size_t i = 0; i < sess.size(); ++i) {
        TestSession& s = sess[i];
        const size_t out_size = static_cast<size_t>(std::max<int64_t>(s.n, 1) * heads * hd);
        s.out.assign(out_size, 1e30f);
        bs[i] = AttentionSession{s.ks.data(), s.vs.data(), s.cap,       s.slen,
                                 s.n,         s.q.data(),  s.out.data()};
        if (s.n == 0) continue;
        AttentionArgs a =
            SuffixArgs({s.cap, s.slen, s.n, heads, kvh, hd}, s.ks.data(), s.vs.data(), s.q.data());
        a.prefix = prefix;
        a.prefix_tail = tail;
        separate[i].resize(out_size);
        ASSERT_NO_FATAL_FAILURE(ForwardOn(a, isa, threads, &separate[i], amx));
      }
      BatchAttentionArgs b = BatchArgs(heads, kvh, hd, bs);
      b.prefix = prefix;
      b.prefix_tail = tail;
      const Status st = AttentionForwardBatch(b, o);
      ASSERT_TRUE(st.ok()) << st;
      for (size_t i = 0; i < sess.size(); ++i) {
        if (sess[i].n == 0) {
          for (float x : sess[i].out) ASSERT_EQ(x, 1e30f) << "session " << i << " was written";
          continue;
        }
        ASSERT_EQ(sess[i].out, separate[i])
            << "session " << i << " (n " << sess[i].n << ", suffix " << sess[i].slen << ")";
      }
    }
  }
}

// Ragged session sets: S = 1, 3 and 16, suffix histories 0 (only the new row) to 300 (past a
// chunk), decode rows (n = 1) mixed with prompt rows (n = 7: 7 x G queries, which the
// AVX-512 build scores on transposed keys in its own call), a session with n = 0.
std::vector<std::vector<std::pair<int64_t, int64_t>>> RaggedSets() {
  std::vector<std::pair<int64_t, int64_t>> sixteen;
  for (int i = 0; i < 16; ++i) sixteen.push_back({i == 5 ? 7 : 1, (i * 37) % 290});
  sixteen[0].second = 0;
  sixteen[9] = {0, 4};  // idle this step
  return {{{1, 0}}, {{1, 12}, {7, 0}, {1, 300}}, sixteen};
}

TEST(AttentionBatch, EqualsSeparateCallsBitForBitForEveryCodecAndIsa) {
  // Bit-equal, not within a tolerance: a batched prefix chunk computes every score, softmax and
  // value sum of a session in the float order of that session's own call.
  struct Codec {
    const char* codec;
    int bits;
    KeyScaleMode mode;
    int key_bits;
    bool f16_norms;
    int layer_bits;
  };
  const Codec codecs[] = {
      {"none-f32", 0, KeyScaleMode::kPerTensor, 8, false, 0},
      {"none-f16", 0, KeyScaleMode::kPerTensor, 8, false, 0},
      {"none-bf16", 0, KeyScaleMode::kPerTensor, 8, false, 0},
      {"k8v", 3, KeyScaleMode::kPerTensor, 8, false, 0},  // k8v3 (paper)
      {"k8v", 2, KeyScaleMode::kPerHead, 8, false, 0},
      {"k8v", 4, KeyScaleMode::kPerChannel, 8, false, 0},
      {"k8v", 3, KeyScaleMode::kPerChannel, 7, true, 0},  // the default codec's middle layers
      {"k8v", 3, KeyScaleMode::kPerChannel, 7, true, 4},  // ... and its 4-bit boundary layers
      {"k8v", 3, KeyScaleMode::kPerHead, 5, false, 2},
  };
  struct Model {
    int heads, kvh, hd;
    int64_t prefix;
  };
  const Model models[] = {
      {9, 3, 64, 600},   // SmolLM2: GQA 3, prefix over three chunks
      {4, 2, 8, 40},     // stories260K-like head_dim 8
      {8, 2, 80, 257},   // head_dim 80 (not a multiple of 16; block rotation)
      {8, 8, 128, 300},  // no GQA
      {2, 1, 12, 50},    // head_dim 12: the scalar path on every ISA
  };
  for (const Model& md : models) {
    for (const Codec& c : codecs) {
      // Every codec on the SmolLM2 shape; raw f32 / bf16, k8v3 and the default codec's
      // boundary layers on the others (CPU time).
      const size_t ci = static_cast<size_t>(&c - codecs);
      if (md.hd != 64 && ci != 0 && ci != 2 && ci != 3 && ci != 7) continue;
      TestPrefix p = MakePrefix(md.kvh, md.prefix, md.hd, c.codec, c.bits, c.mode, 3 + md.hd,
                                c.key_bits, c.f16_norms, c.layer_bits);
      for (const auto& set : RaggedSets()) {
        SCOPED_TRACE(::testing::Message()
                     << c.codec << c.bits << " mode " << static_cast<int>(c.mode) << " key_bits "
                     << c.key_bits << " f16 " << c.f16_norms << " layer_bits " << c.layer_bits
                     << " heads " << md.heads << "/" << md.kvh << " hd " << md.hd << " S "
                     << set.size());
        auto sess = MakeSessions(set, md.heads, md.kvh, md.hd, 100);
        CheckBatch({p.view}, md.heads, md.kvh, md.hd, sess);
      }
    }
  }
}

TEST(AttentionBatch, PrefixSegmentsAndNoPrefix) {
  // A pool tree's segments (parent + child, each with its own key scales) and no prefix at
  // all: still each session's own call, bit for bit.
  const int heads = 9, kvh = 3, hd = 64;
  TestPrefix a = MakePrefix(kvh, 300, hd, "k8v", 3, KeyScaleMode::kPerChannel, 31, 8, false, 0, 7);
  TestPrefix b = MakePrefix(kvh, 45, hd, "k8v", 3, KeyScaleMode::kPerHead, 77, 8, false, 0, 7);
  for (const auto& set : RaggedSets()) {
    auto sess = MakeSessions(set, heads, kvh, hd, 500);
    CheckBatch({a.view, b.view}, heads, kvh, hd, sess);
    CheckBatch({}, heads, kvh, hd, sess);
  }
}

TEST(AttentionBatch, MatchesPlainAttentionPerSession) {
  // Against the double-precision reference too (so the batch is not only equal to itself):
  // outputs are convex combinations of O(1) values, |error| <= 2e-5 as for AttentionForward.
  const int heads = 9, kvh = 3, hd = 64;
  TestPrefix p = MakePrefix(kvh, 600, hd, "k8v", 3, KeyScaleMode::kPerChannel, 5, 7, true, 0);
  auto sess = MakeSessions(RaggedSets()[2], heads, kvh, hd, 900);
  std::vector<AttentionSession> bs;
  for (TestSession& s : sess) {
    s.out.assign(static_cast<size_t>(std::max<int64_t>(s.n, 1) * heads * hd), 0.0f);
    bs.push_back(
        AttentionSession{s.ks.data(), s.vs.data(), s.cap, s.slen, s.n, s.q.data(), s.out.data()});
  }
  BatchAttentionArgs b = BatchArgs(heads, kvh, hd, bs);
  b.prefix = &p.view;
  ASSERT_TRUE(AttentionForwardBatch(b).ok());
  for (size_t i = 0; i < sess.size(); ++i) {
    const TestSession& s = sess[i];
    if (s.n == 0) continue;
    const auto ref = Reference(&p, s.ks, s.vs, s.cap, s.slen, s.n, heads, kvh, hd, s.q);
    EXPECT_LE(MaxAbsError(s.out, ref), 2e-5) << "session " << i;
  }
}

TEST(AttentionBatch, RejectsBadSessionsNamingThem) {
  std::vector<float> buf(4096);
  AttentionSession good{buf.data(), buf.data(), 4, 2, 1, buf.data(), buf.data() + 2048};
  std::vector<AttentionSession> s = {good, good, good};
  BatchAttentionArgs b = BatchArgs(/*heads=*/2, /*kv_heads=*/1, /*head_dim=*/8, s);
  EXPECT_TRUE(AttentionForwardBatch(b).ok());
  s[2].suffix_length = 5;  // > capacity
  Status st = AttentionForwardBatch(b);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("session 2"), std::string::npos) << st;
  s[2] = good;
  s[1].n = -1;
  st = AttentionForwardBatch(b);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("session 1"), std::string::npos) << st;
  s[1] = good;
  s[0].q = nullptr;
  EXPECT_EQ(AttentionForwardBatch(b).code(), absl::StatusCode::kInvalidArgument);
  s[0] = good;
  b.heads = 3;  // not a multiple of kv_heads
  b.kv_heads = 2;
  EXPECT_EQ(AttentionForwardBatch(b).code(), absl::StatusCode::kInvalidArgument);
  b.heads = 2;
  b.kv_heads = 1;
  PrefixView pv;  // kv_heads differ from the model's
  pv.kv_heads = 2;
  pv.head_dim = 8;
  pv.tokens = 3;
  pv.layers.resize(1, PrefixLayer{buf.data(), nullptr, buf.data(), nullptr});
  b.prefix = &pv;
  EXPECT_EQ(AttentionForwardBatch(b).code(), absl::StatusCode::kInvalidArgument);
  b.prefix = nullptr;
  b.sessions = {};
  EXPECT_TRUE(AttentionForwardBatch(b).ok());  // nothing to do
}

// ---- AttentionForwardSlots: one decode row per session, suffixes in one slab -------------

// Each row's output equals AttentionForward with n = 1 over its slot (capacity, row_length),
// bit for bit, for the default codec's formats and raw f32; slots in any order, some unused;
// lengths from 1 (only the new row) past a chunk.
TEST(AttentionSlots, EachRowEqualsItsOwnCallBitForBit) {
  const int heads = 9, kvh = 3, hd = 64;
  const int64_t slots = 6, cap = 300;
  const std::vector<int32_t> slot = {4, 0, 5, 2};
  const std::vector<int64_t> len = {1, 17, 300, 64};
  const int64_t rows = static_cast<int64_t>(slot.size());
  const std::vector<float> ks = Gaussian(static_cast<size_t>(slots * kvh * cap * hd), 41, 1.5f);
  const std::vector<float> vs = Gaussian(ks.size(), 42);
  const std::vector<float> q = Gaussian(static_cast<size_t>(rows * heads * hd), 43);
  TestPrefix k7 = MakePrefix(kvh, 600, hd, "k8v", 3, KeyScaleMode::kPerChannel, 5, 7, true, 0);
  TestPrefix raw = MakePrefix(kvh, 100, hd, "none-f32", 0, KeyScaleMode::kPerTensor, 6);
  const PrefixView* prefixes[] = {&k7.view, &raw.view, nullptr};
  for (const PrefixView* prefix : prefixes) {
    std::vector<float> out(q.size(), 1e30f);
    SlotAttentionArgs a = SlotArgs(heads, kvh, hd, ks.data(), vs.data(), slots, cap, rows,
                                   slot.data(), len.data(), q.data(), out.data());
    a.prefix = prefix;
    ASSERT_TRUE(AttentionForwardSlots(a).ok());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t stride = kvh * cap * hd;
      AttentionArgs one = SuffixArgs({cap, len[r], 1, heads, kvh, hd}, ks.data() + slot[r] * stride,
                                     vs.data() + slot[r] * stride, q.data() + r * heads * hd);
      one.prefix = prefix;
      std::vector<float> want(static_cast<size_t>(heads * hd));
      one.out = want.data();
      ASSERT_TRUE(AttentionForward(one).ok());
      EXPECT_EQ(
          std::vector<float>(out.begin() + r * heads * hd, out.begin() + (r + 1) * heads * hd),
          want)
          << "row " << r << (prefix == nullptr ? " no prefix" : "");
    }
  }
}

// A pool tree's segments (root + child) behind the slots: each row still equals its own
// AttentionForward over the same segments, bit for bit.
TEST(AttentionSlots, PoolTreeRowsEqualTheirOwnCalls) {
  const int heads = 9, kvh = 3, hd = 64;
  const int64_t slots = 3, cap = 80;
  TestPrefix a = MakePrefix(kvh, 300, hd, "k8v", 3, KeyScaleMode::kPerChannel, 31, 7, true, 0, 7);
  TestPrefix b = MakePrefix(kvh, 45, hd, "k8v", 4, KeyScaleMode::kPerHead, 77, 8, false, 0, 7);
  const std::vector<PrefixView> tail = {b.view};
  const std::vector<int32_t> slot = {2, 0};
  const std::vector<int64_t> len = {80, 3};
  const std::vector<float> ks = Gaussian(static_cast<size_t>(slots * kvh * cap * hd), 51, 1.5f);
  const std::vector<float> vs = Gaussian(ks.size(), 52);
  const std::vector<float> q = Gaussian(static_cast<size_t>(2 * heads * hd), 53);
  std::vector<float> out(q.size(), 1e30f);
  SlotAttentionArgs sa = SlotArgs(heads, kvh, hd, ks.data(), vs.data(), slots, cap, 2, slot.data(),
                                  len.data(), q.data(), out.data());
  sa.prefix = &a.view;
  sa.prefix_tail = tail;
  ASSERT_TRUE(AttentionForwardSlots(sa).ok());
  for (int64_t r = 0; r < 2; ++r) {
    const int64_t stride = kvh * cap * hd;
    AttentionArgs one = SuffixArgs({cap, len[r], 1, heads, kvh, hd}, ks.data() + slot[r] * stride,
                                   vs.data() + slot[r] * stride, q.data() + r * heads * hd);
    one.prefix = &a.view;
    one.prefix_tail = tail;
    std::vector<float> want(static_cast<size_t>(heads * hd));
    one.out = want.data();
    ASSERT_TRUE(AttentionForward(one).ok());
    EXPECT_EQ(std::vector<float>(out.begin() + r * heads * hd, out.begin() + (r + 1) * heads * hd),
              want)
        << "row " << r;
  }
}

// A CUDA call whose queries would not fit the kernels' grid (rows x query heads per KV head
// > 65535) is refused on the host, naming the limit, with or without a device.
TEST(Attention, CudaGridLimitIsCheckedOnTheHost) {
  const int heads = 9, kvh = 3, hd = 8;
  const int64_t n = 30000;  // x 3 = 90000 queries per KV head
  std::vector<float> kv(static_cast<size_t>(kvh * n * hd)), q(static_cast<size_t>(n * heads * hd));
  std::vector<float> out(q.size());
  AttentionArgs a =
      SuffixArgs({n, n, n, heads, kvh, hd}, kv.data(), kv.data(), q.data(), out.data());
  AttentionOptions o;
  o.device = Device::kCuda;
  const Status st = AttentionForward(a, o);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("65535"), std::string::npos) << st;
}

TEST(AttentionSlots, RejectsBadRowsAndShapesNamingThem) {
  const int heads = 2, kvh = 1, hd = 8;
  std::vector<float> slab(3 * kvh * 4 * hd), q(2 * heads * hd), out(q.size());
  std::vector<int32_t> slot = {0, 2};
  std::vector<int64_t> len = {1, 4};
  SlotAttentionArgs a = SlotArgs(heads, kvh, hd, slab.data(), slab.data(), 3, 4, 2, slot.data(),
                                 len.data(), q.data(), out.data());
  EXPECT_TRUE(AttentionForwardSlots(a).ok());
  slot[1] = 3;  // no such slot
  Status st = AttentionForwardSlots(a);
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange) << st;
  EXPECT_NE(st.message().find("row 1"), std::string::npos) << st;
  slot[1] = 2;
  len[0] = 0;  // not even the new row
  st = AttentionForwardSlots(a);
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange) << st;
  EXPECT_NE(st.message().find("row 0"), std::string::npos) << st;
  len[0] = 1;
  a.max_length = 5;  // > capacity
  EXPECT_EQ(AttentionForwardSlots(a).code(), absl::StatusCode::kInvalidArgument);
  a.max_length = 4;
  a.rows = 0;
  EXPECT_EQ(AttentionForwardSlots(a).code(), absl::StatusCode::kInvalidArgument);
  a.rows = 2;
  a.row_length = nullptr;
  EXPECT_EQ(AttentionForwardSlots(a).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace polykv::kernels
