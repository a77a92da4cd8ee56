// Integer attention scores of int8 keys (attention_internal.h, "Integer scores"): the query
// codes' reconstruction bound, the AMX-INT8 tiles against the scalar integer reference bit for
// bit, and AttentionOptions::amx through the public call.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "attention_internal.h"  // kernels/src: the integer-score internals
#include "polykv/kernels/attention.h"
#include "polykv/kernels/codec.h"
#include "polykv/kernels/cpu.h"

namespace polykv::kernels {
namespace {

std::vector<float> Normal(size_t n, uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(AttentionIntScores, QueryCodesReconstructWithinTheStatedBound) {
  for (int hd : {8, 64, 80, 128, 256}) {
    const int rb = attn::QueryCodeRowBytes(hd);
    EXPECT_EQ(rb % 64, 0);
    EXPECT_GE(rb, hd);
    EXPECT_LT(rb - hd, 64);
    for (uint32_t seed = 1; seed <= 20; ++seed) {
      std::vector<float> q = Normal(static_cast<size_t>(hd), seed * 31 + hd, 0.3f * seed);
      q[seed % hd] *= 7.0f;  // one outlier sets the scale
      std::vector<int8_t> codes(static_cast<size_t>(attn::kQueryCodeLevels * rb), 99);
      float scale = -1.0f;
      attn::QuantizeQueryCodes(q.data(), hd, codes.data(), &scale);
      if (AmxInt8Supported()) {  // the AVX-512 quantizer the tiles' callers use: same bits
        std::vector<int8_t> v(codes.size(), 99);
        float vs = -1.0f;
        attn::QuantizeQueryCodesAvx512(q.data(), hd, v.data(), &vs);
        ASSERT_EQ(v, codes) << "hd " << hd << " seed " << seed;
        ASSERT_EQ(vs, scale);
      }
      float amax = 0.0f;
      for (float x : q) amax = std::fmax(amax, std::fabs(x));
      const double bound = amax * 3e-7;  // attention_internal.h
      for (int i = 0; i < rb; ++i) {
        const int c1 = codes[i], c2 = codes[rb + i], c3 = codes[2 * rb + i];
        if (i >= hd) {  // zero padding up to the tile row
          EXPECT_EQ(c1 | c2 | c3, 0) << "hd " << hd << " padding byte " << i;
          continue;
        }
        EXPECT_LE(std::abs(c1), 127);
        EXPECT_LE(std::abs(c2), 127);
        EXPECT_LE(std::abs(c3), 127);
        const double r = static_cast<double>(scale) * (64516.0 * c1 + 254.0 * c2 + c3);
        EXPECT_LE(std::fabs(r - q[i]), bound) << "hd " << hd << " i " << i;
      }
    }
  }
  std::vector<int8_t> codes(static_cast<size_t>(attn::kQueryCodeLevels * 64), 5);
  std::vector<float> zero(64, 0.0f);
  float scale = -1.0f;
  attn::QuantizeQueryCodes(zero.data(), 64, codes.data(), &scale);
  EXPECT_EQ(scale, 0.0f);
  for (int8_t c : codes) EXPECT_EQ(c, 0);
  if (AmxInt8Supported()) {
    attn::QuantizeQueryCodesAvx512(zero.data(), 64, codes.data(), &scale);
    EXPECT_EQ(scale, 0.0f);
  }
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    zero[3] = bad;
    attn::QuantizeQueryCodes(zero.data(), 64, codes.data(), &scale);
    EXPECT_TRUE(std::isnan(scale)) << "a non-finite query must give NaN scores, as f32 would";
    if (AmxInt8Supported()) {
      scale = 0.0f;
      attn::QuantizeQueryCodesAvx512(zero.data(), 64, codes.data(), &scale);
      EXPECT_TRUE(std::isnan(scale));
    }
  }
}

TEST(AttentionIntScores, AmxTilesEqualTheScalarReferenceBitForBit) {
  if (!AmxInt8Supported()) {
    GTEST_SKIP() << "this CPU/OS has no AMX-INT8 tiles: only the reference is in use here "
                    "(checked by the other tests)";
  }
  // Keys as int8 codes (key_bits 8) and as the pool's packed codes of 4..7 bits, which the
  // tiles read as they lie: every score equals ScoreI8 of the unpacked codes.
  for (int key_bits : {8, 7, 6, 5, 4}) {
    for (int hd : {8, 64, 80, 96, 128, 256}) {
      const int rb = attn::QueryCodeRowBytes(hd);
      const int64_t vb = PackedKeyVectorBytes(hd, key_bits);
      for (int nq : {1, 3, 16, 17, 48}) {
        for (int64_t tk : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{256}}) {
          SCOPED_TRACE(::testing::Message()
                       << "key_bits " << key_bits << " hd " << hd << " nq " << nq << " tk " << tk);
          std::mt19937 rng(static_cast<uint32_t>(key_bits * 100000 + hd * 1000 + nq * 10 + tk));
          const int lim = key_bits == 8 ? 127 : (1 << (key_bits - 1)) - 1;
          std::uniform_int_distribution<int> key(-lim, lim);  // the full code range
          std::vector<int8_t> keys(static_cast<size_t>(tk * hd));
          for (int8_t& k : keys) k = static_cast<int8_t>(key(rng));
          // Packed: exactly tk * vb bytes, so a read past the last vector would show (ASan).
          std::vector<uint8_t> packed(static_cast<size_t>(tk * vb));
          if (key_bits < 8) {
            for (int64_t t = 0; t < tk; ++t)
              for (int i = 0; i < hd; ++i) {
                const uint32_t code =
                    static_cast<uint32_t>(keys[t * hd + i] + (1 << (key_bits - 1)));
                for (int b = 0; b < key_bits; ++b)
                  if ((code >> b) & 1u) {
                    const int64_t bit = static_cast<int64_t>(i) * key_bits + b;
                    packed[static_cast<size_t>(t * vb + bit / 8)] |=
                        static_cast<uint8_t>(1u << (bit % 8));
                  }
              }
            std::vector<int8_t> back(keys.size());
            UnpackKeyVectors(packed.data(), tk, hd, key_bits, back.data());
            ASSERT_EQ(back, keys) << "the test's packing is not the pool's";
          }
          std::vector<int8_t> codes(static_cast<size_t>(nq * attn::kQueryCodeLevels * rb));
          std::vector<float> scale(static_cast<size_t>(nq));
          for (int j = 0; j < nq; ++j) {
            const std::vector<float> q = Normal(static_cast<size_t>(hd), rng(), 2.0f);
            attn::QuantizeQueryCodes(q.data(), hd, codes.data() + j * attn::kQueryCodeLevels * rb,
                                     &scale[static_cast<size_t>(j)]);
          }
          const int64_t ss = tk + 3;  // a row stride past the scores
          std::vector<float> s(static_cast<size_t>(nq * ss), 1e30f);
          std::vector<float> tiles(static_cast<size_t>(attn::AmxKeyTileFloats(tk, hd)));
          if (key_bits == 8) {
            attn::ScoresAmxI8(codes.data(), scale.data(), nq, keys.data(), 8, hd, tk, hd, s.data(),
                              ss, tiles.data());
          } else {
            attn::ScoresAmxI8(codes.data(), scale.data(), nq, packed.data(), key_bits, vb, tk, hd,
                              s.data(), ss, tiles.data());
          }
          for (int j = 0; j < nq; ++j) {
            for (int64_t t = 0; t < tk; ++t) {
              const float ref =
                  attn::ScoreI8(codes.data() + j * attn::kQueryCodeLevels * rb,
                                scale[static_cast<size_t>(j)], keys.data() + t * hd, hd);
              ASSERT_EQ(s[static_cast<size_t>(j * ss + t)], ref) << "j " << j << " t " << t;
            }
            for (int64_t t = tk; t < ss; ++t)
              ASSERT_EQ(s[static_cast<size_t>(j * ss + t)], 1e30f) << "written past the keys";
          }
        }
      }
    }
  }
}

TEST(AttentionIntScores, ForcedTilesMatchF32ScoresAndAreRefusedWithoutAmx) {
  constexpr int kHeads = 9, kKv = 3, kHd = 64;
  constexpr int64_t kPrefix = 600, kCap = 8;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> key(-63, 63);
  std::vector<int8_t> keys(static_cast<size_t>(kKv * kPrefix * kHd));
  for (int8_t& k : keys) k = static_cast<int8_t>(key(rng));
  // One decode row of SmolLM2's shape over a K8V prefix held in place: 8-bit keys with a
  // per-tensor scale, random 3-bit value codes and norms (attention_test.cc covers every codec).
  const int bits = 3;
  const int64_t vb = PackedVectorBytes(kHd, bits);
  std::vector<uint8_t> vcodes(static_cast<size_t>(kKv * kPrefix * vb));
  for (uint8_t& b : vcodes) b = static_cast<uint8_t>(rng());
  std::vector<float> norms = Normal(static_cast<size_t>(kKv * kPrefix), 3, 1.0f);
  std::vector<float> kscale{0.05f};
  PrefixView view;
  view.codec = PrefixCodec::kK8V;
  view.tokens = kPrefix;
  view.kv_heads = kKv;
  view.head_dim = kHd;
  view.config.value_bits = bits;
  view.config.key_bits = 8;
  view.config.key_scale = KeyScaleMode::kPerTensor;
  view.layers.resize(1);
  view.layers[0].k = keys.data();
  view.layers[0].k_scales = kscale.data();
  view.layers[0].v = vcodes.data();
  view.layers[0].v_norms = norms.data();
  const std::vector<float> ks = Normal(static_cast<size_t>(kKv * kCap * kHd), 4, 1.0f);
  const std::vector<float> vs = Normal(static_cast<size_t>(kKv * kCap * kHd), 5, 1.0f);
  const std::vector<float> q = Normal(static_cast<size_t>(kHeads * kHd), 6, 1.5f);
  AttentionArgs a;
  a.prefix = &view;
  a.layer = 0;
  a.k_suffix = ks.data();
  a.v_suffix = vs.data();
  a.suffix_capacity = kCap;
  a.suffix_length = 5;
  a.n = 1;
  a.heads = kHeads;
  a.kv_heads = kKv;
  a.head_dim = kHd;
  a.q = q.data();
  std::vector<float> f32(static_cast<size_t>(kHeads * kHd)), tiles(f32.size());
  AttentionOptions off;
  off.amx = 0;
  a.out = f32.data();
  const Status st = AttentionForward(a, off);
  ASSERT_TRUE(st.ok()) << st;
  AttentionOptions on;
  on.amx = 1;
  a.out = tiles.data();
  if (!AmxInt8Supported() || BestIsa() != Isa::kAvx512) {
    EXPECT_EQ(AttentionForward(a, on).code(), absl::StatusCode::kFailedPrecondition);
    GTEST_SKIP() << "no AMX-INT8 tiles here: amx = 1 is refused with kFailedPrecondition, as "
                    "checked";
  }
  ASSERT_TRUE(AttentionForward(a, on).ok());
  // Outputs are convex combinations of values of magnitude ~3: the query codes' relative
  // error (2^-22 of max|q|) moves them far less than this.
  float worst = 0.0f;
  for (size_t i = 0; i < f32.size(); ++i) worst = std::fmax(worst, std::fabs(f32[i] - tiles[i]));
  EXPECT_LE(worst, 1e-5f);
  // A scalar ISA with amx = 1 is refused too: the tiles run only in the avx512 build.
  on.isa = static_cast<int>(Isa::kScalar);
  EXPECT_EQ(AttentionForward(a, on).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace polykv::kernels
