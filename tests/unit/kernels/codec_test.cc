// Value tests of the codec: int8 keys and TurboQuant-MSE values on the CPU path.
#include "polykv/kernels/codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <vector>

#include "polykv/kernels/codec_math.h"
#include "test_util.h"
#if defined(POLYKV_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace polykv::kernels {
namespace {

using testing::CodesOf;
using testing::FromHalf;
using testing::Gaussian;
using testing::kKeyScaleModes;
using testing::RelMse;
using testing::ToHalf;

const char* ModeName(KeyScaleMode m) {
  return m == KeyScaleMode::kPerTensor ? "tensor"
         : m == KeyScaleMode::kPerHead ? "head"
                                       : "channel";
}

// Scale that applies to element (h, c) for `mode`.
float ScaleAt(const std::vector<float>& scales, KeyScaleMode mode, int64_t h, int64_t c, int d) {
  return mode == KeyScaleMode::kPerTensor ? scales[0]
         : mode == KeyScaleMode::kPerHead ? scales[h]
                                          : scales[h * d + c];
}

// Builds K with a different magnitude per head and per channel, so that the three modes
// really give different scales.
std::vector<float> KeyInput(const LayerShape& s, uint64_t seed) {
  auto k = Gaussian(s.elements(), seed);
  for (int64_t h = 0; h < s.kv_heads; ++h)
    for (int64_t t = 0; t < s.tokens; ++t)
      for (int c = 0; c < s.head_dim; ++c)
        k[(h * s.tokens + t) * s.head_dim + c] *= (1.0f + h) * (0.1f + 0.3f * (c % 7));
  return k;
}

// Checks scales = absmax/127 over each group and |x_hat - x| <= scale / 2.
void CheckKeys(const std::vector<float>& x, const LayerShape& s, KeyScaleMode mode) {
  std::vector<int8_t> q(s.elements());
  std::vector<float> scales(KeyScaleCount(s, mode));
  ASSERT_TRUE(QuantizeKeys(x.data(), DType::kF32, s, mode, q.data(), scales.data()).ok());
  // Expected scales from the definition.
  std::vector<float> absmax(scales.size(), 0.0f);
  const int d = s.head_dim;
  for (int64_t h = 0; h < s.kv_heads; ++h)
    for (int64_t t = 0; t < s.tokens; ++t)
      for (int c = 0; c < d; ++c) {
        const int64_t g = mode == KeyScaleMode::kPerTensor ? 0
                          : mode == KeyScaleMode::kPerHead ? h
                                                           : h * d + c;
        absmax[g] = std::max(absmax[g], std::fabs(x[(h * s.tokens + t) * d + c]));
      }
  for (size_t g = 0; g < scales.size(); ++g) {
    ASSERT_EQ(scales[g], absmax[g] > 0 ? absmax[g] / 127.0f : 1.0f) << ModeName(mode) << " " << g;
  }
  std::vector<float> out(s.elements());
  ASSERT_TRUE(DequantizeKeys(q.data(), scales.data(), s, mode, out.data(), DType::kF32).ok());
  for (int64_t h = 0; h < s.kv_heads; ++h)
    for (int64_t t = 0; t < s.tokens; ++t)
      for (int c = 0; c < d; ++c) {
        const int64_t i = (h * s.tokens + t) * d + c;
        const float sc = ScaleAt(scales, mode, h, c, d);
        // scale/2 plus the f32 rounding of x/scale and q*scale (a few ulps).
        ASSERT_LE(std::fabs(out[i] - x[i]), sc * 0.5f * (1.0f + 1e-5f))
            << ModeName(mode) << " element " << i << " x " << x[i] << " q " << int{q[i]};
        ASSERT_EQ(out[i], static_cast<float>(q[i]) * sc);
      }
}

// CheckKeys of KeyInput(s, seed) in every key-scale mode.
void CheckKeysEveryMode(const LayerShape& s, uint64_t seed) {
  const auto x = KeyInput(s, seed);
  for (auto mode : kKeyScaleModes) CheckKeys(x, s, mode);
}

TEST(CodecKeys, ErrorBoundAllModes) { CheckKeysEveryMode(LayerShape{3, 37, 64}, 1); }

TEST(CodecKeys, SingleToken) { CheckKeysEveryMode(LayerShape{2, 1, 8}, 2); }

TEST(CodecKeys, Tokens4097) { CheckKeysEveryMode(LayerShape{2, 4097, 64}, 3); }

TEST(CodecKeys, ZeroTensorGivesScaleOneAndExactZeros) {
  const LayerShape s{2, 5, 8};
  std::vector<float> x(s.elements(), 0.0f);
  for (auto mode : kKeyScaleModes) {
    std::vector<int8_t> q(s.elements(), 99);
    std::vector<float> scales(KeyScaleCount(s, mode), -1.0f);
    ASSERT_TRUE(QuantizeKeys(x.data(), DType::kF32, s, mode, q.data(), scales.data()).ok());
    for (float sc : scales) EXPECT_EQ(sc, 1.0f);
    for (int8_t v : q) EXPECT_EQ(v, 0);
    std::vector<float> out(s.elements(), 7.0f);
    ASSERT_TRUE(DequantizeKeys(q.data(), scales.data(), s, mode, out.data(), DType::kF32).ok());
    for (float v : out) EXPECT_EQ(v, 0.0f);
  }
}

TEST(CodecKeys, OneZeroHeadGetsScaleOne) {
  const LayerShape s{2, 4, 8};
  auto x = KeyInput(s, 4);
  std::fill(x.begin(), x.begin() + 32, 0.0f);  // head 0 all zero
  std::vector<int8_t> q(s.elements());
  std::vector<float> scales(2);
  ASSERT_TRUE(
      QuantizeKeys(x.data(), DType::kF32, s, KeyScaleMode::kPerHead, q.data(), scales.data()).ok());
  EXPECT_EQ(scales[0], 1.0f);
  EXPECT_GT(scales[1], 0.0f);
  EXPECT_NE(scales[1], 1.0f);
}

TEST(CodecKeys, NaNAndInfAreRejectedWithTheirIndex) {
  const LayerShape s{2, 10, 8};
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    auto x = KeyInput(s, 5);
    x[101] = bad;  // head 1, token 2, dim 5
    x[150] = bad;  // later one must not be reported
    std::vector<int8_t> q(s.elements());
    std::vector<float> scales(KeyScaleCount(s, KeyScaleMode::kPerChannel));
    for (auto mode : {KeyScaleMode::kPerTensor, KeyScaleMode::kPerChannel}) {
      const Status st = QuantizeKeys(x.data(), DType::kF32, s, mode, q.data(), scales.data());
      ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(st.message().find("element 101 (head 1, token 2, dim 5)"), std::string::npos)
          << st.message();
      EXPECT_NE(st.message().find(std::isnan(bad) ? "NaN" : "Inf"), std::string::npos);
    }
    const float one = 1.0f;
    const Status st2 =
        QuantizeKeysWithScales(x.data(), DType::kF32, s, KeyScaleMode::kPerTensor, &one, q.data());
    ASSERT_EQ(st2.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(st2.message().find("element 101"), std::string::npos) << st2.message();
  }
}

TEST(CodecKeys, HalfPrecisionInputsAndOutputs) {
  const LayerShape s{2, 33, 64};
  const auto x32 = KeyInput(s, 6);
  for (DType t : {DType::kBF16, DType::kF16}) {
    const auto xh = ToHalf(x32, t);
    const auto x = FromHalf(xh, t);  // the values the codec actually sees
    for (auto mode : kKeyScaleModes) {
      std::vector<int8_t> q(s.elements()), q32(s.elements());
      std::vector<float> scales(KeyScaleCount(s, mode)), scales32(scales.size());
      ASSERT_TRUE(QuantizeKeys(xh.data(), t, s, mode, q.data(), scales.data()).ok());
      // Same as quantizing the widened f32 values.
      ASSERT_TRUE(QuantizeKeys(x.data(), DType::kF32, s, mode, q32.data(), scales32.data()).ok());
      EXPECT_EQ(q, q32);
      EXPECT_EQ(scales, scales32);
      std::vector<uint16_t> out(s.elements());
      ASSERT_TRUE(DequantizeKeys(q.data(), scales.data(), s, mode, out.data(), t).ok());
      for (int64_t i = 0; i < s.elements(); ++i) {
        const int64_t h = i / (s.tokens * s.head_dim), c = i % s.head_dim;
        const float exact = static_cast<float>(q[i]) * ScaleAt(scales, mode, h, c, s.head_dim);
        ASSERT_EQ(out[i], t == DType::kF16 ? math::FloatToF16(exact) : math::FloatToBf16(exact));
        ASSERT_LE(std::fabs(exact - x[i]),
                  ScaleAt(scales, mode, h, c, s.head_dim) * 0.5f * (1 + 1e-5f));
      }
    }
  }
}

TEST(CodecKeys, TokenByTokenWithGivenScalesEqualsBatch) {
  // Scales depend on the whole tensor, so "token by token" is comparable only with the
  // scales fixed: quantize the batch, then each (head, token) row alone with those scales.
  const LayerShape s{3, 50, 16};
  const auto x = KeyInput(s, 7);
  for (auto mode : kKeyScaleModes) {
    std::vector<int8_t> q(s.elements());
    std::vector<float> scales(KeyScaleCount(s, mode));
    ASSERT_TRUE(QuantizeKeys(x.data(), DType::kF32, s, mode, q.data(), scales.data()).ok());
    std::vector<int8_t> q2(s.elements(), 0);
    const LayerShape one{1, 1, s.head_dim};
    for (int64_t h = 0; h < s.kv_heads; ++h) {
      const float* sc = mode == KeyScaleMode::kPerTensor ? &scales[0]
                        : mode == KeyScaleMode::kPerHead ? &scales[h]
                                                         : &scales[h * s.head_dim];
      for (int64_t t = 0; t < s.tokens; ++t) {
        const int64_t off = (h * s.tokens + t) * s.head_dim;
        ASSERT_TRUE(
            QuantizeKeysWithScales(x.data() + off, DType::kF32, one, mode, sc, q2.data() + off)
                .ok());
      }
    }
    EXPECT_EQ(q, q2) << ModeName(mode);
  }
}

TEST(CodecKeys, GivenScalesAreValidated) {
  const LayerShape s{1, 1, 4};
  std::vector<float> x(4, 1.0f);
  std::vector<int8_t> q(4);
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    const Status st =
        QuantizeKeysWithScales(x.data(), DType::kF32, s, KeyScaleMode::kPerTensor, &bad, q.data());
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("key scale 0"), std::string::npos) << st.message();
  }
}

// ---- values -------------------------------------------------------------------------------

struct VResult {
  std::vector<uint8_t> packed;
  std::vector<float> norms;
  std::vector<float> decoded;
};

VResult RoundTripV(const std::vector<float>& x, const LayerShape& s, const CodecConfig& cfg) {
  VResult r;
  r.packed.assign(s.vectors() * PackedVectorBytes(s.head_dim, cfg.value_bits), 0);
  r.norms.assign(s.vectors(), -1.0f);
  r.decoded.assign(s.elements(), 0.0f);
  const Status e = EncodeValues(x.data(), DType::kF32, s, cfg, r.packed.data(), r.norms.data());
  EXPECT_TRUE(e.ok()) << e;
  const Status d =
      DecodeValues(r.packed.data(), r.norms.data(), s, cfg, r.decoded.data(), DType::kF32);
  EXPECT_TRUE(d.ok()) << d;
  return r;
}

TEST(CodecValues, RelativeMseOnGaussianVectors) {
  const double bound[5] = {0, 0, 0.127, 0.0374, 0.0103};
  for (int d : {8, 48, 64, 80, 96, 128}) {
    const LayerShape s{2, 600, d};  // 1200 vectors
    const auto x = Gaussian(s.elements(), 100 + d);
    for (int bits : {2, 3, 4}) {
      CodecConfig cfg;
      cfg.value_bits = bits;
      const VResult r = RoundTripV(x, s, cfg);
      const double mse = RelMse(r.decoded, x);
      std::printf("gaussian d=%3d bits=%d rel_mse=%.5f\n", d, bits, mse);
      EXPECT_LE(mse, bound[bits]) << "head_dim " << d << " bits " << bits;
      EXPECT_GT(mse, 0.0);
      if (d >= 64) {
        std::set<int> used;
        for (int64_t v = 0; v < s.vectors(); ++v)
          for (uint8_t c : CodesOf(r.packed, v, d, bits)) used.insert(c);
        EXPECT_EQ(static_cast<int>(used.size()), 1 << bits) << "head_dim " << d << " bits " << bits;
      }
    }
  }
}

// Reference encode in double with an explicit block-Hadamard matrix and brute-force nearest
// level; the optimized path must agree except for z within 1e-4 of a decision threshold.
TEST(CodecValues, MatchesExplicitMatrixReference) {
  for (int d : {8, 48, 64, 96}) {
    const LayerShape s{1, 40, d};
    const auto x = Gaussian(s.elements(), 300 + d, 2.0f);
    CodecConfig cfg;
    const VResult r = RoundTripV(x, s, cfg);
    const auto levels = *LloydMaxCodebook(3);
    const int B = math::HadamardBlock(d);
    for (int64_t v = 0; v < s.vectors(); ++v) {
      const float* xv = x.data() + v * d;
      double norm = 0;
      for (int i = 0; i < d; ++i) norm += double{xv[i]} * xv[i];
      norm = std::sqrt(norm);
      EXPECT_NEAR(r.norms[v], norm, 1e-5 * norm);
      std::vector<double> z(d, 0.0);
      for (int i = 0; i < d; ++i) {
        const int blk = i / B * B;
        for (int j = blk; j < blk + B; ++j) {
          const int sign = __builtin_popcount(static_cast<unsigned>((i - blk) & (j - blk))) & 1;
          const double h = (sign ? -1.0 : 1.0) / std::sqrt(double(B));
          z[i] += h * math::RotationSign(cfg.rotation_seed, j) * xv[j] / norm;
        }
        z[i] *= std::sqrt(double(d));
      }
      const auto codes = CodesOf(r.packed, v, d, 3);
      std::vector<double> zhat(d);
      for (int i = 0; i < d; ++i) {
        int best = 0;
        for (int k = 1; k < 8; ++k)
          if (std::fabs(z[i] - levels[k]) < std::fabs(z[i] - levels[best])) best = k;
        bool near_threshold = false;
        for (int k = 0; k + 1 < 8; ++k)
          near_threshold |= std::fabs(z[i] - 0.5 * (levels[k] + levels[k + 1])) < 1e-4;
        if (!near_threshold) {
          ASSERT_EQ(codes[i], best) << "d " << d << " vec " << v << " i " << i;
        }
        zhat[i] = levels[codes[i]];
      }
      // Decode reference: x_hat = norm * D H^T zhat / sqrt(d).
      for (int i = 0; i < d; ++i) {
        const int blk = i / B * B;
        double acc = 0;
        for (int j = blk; j < blk + B; ++j) {
          const int sign = __builtin_popcount(static_cast<unsigned>((i - blk) & (j - blk))) & 1;
          acc += (sign ? -1.0 : 1.0) / std::sqrt(double(B)) * zhat[j];
        }
        const double ref =
            norm * math::RotationSign(cfg.rotation_seed, i) * acc / std::sqrt(double(d));
        ASSERT_NEAR(r.decoded[v * d + i], ref, 1e-5 * norm) << "d " << d << " vec " << v;
      }
    }
  }
}

// The Euclidean norm of x[0, d), summed in double.
double Norm(const float* x, int d) {
  double n = 0;
  for (int i = 0; i < d; ++i) n += double{x[i]} * x[i];
  return std::sqrt(n);
}

// The largest | |v| - 1 | over the d-vectors v of `x`.
double WorstUnitNormError(const std::vector<float>& x, int64_t vectors, int d) {
  double worst = 0;
  for (int64_t v = 0; v < vectors; ++v)
    worst = std::max(worst, std::fabs(Norm(&x[v * d], d) - 1.0));
  return worst;
}

TEST(CodecValues, NormCorrectionKeepsUnitNorm) {
  for (int d : {8, 48, 64, 128}) {
    for (int bits : {2, 3, 4}) {
      const LayerShape s{1, 500, d};
      auto x = Gaussian(s.elements(), 900 + d + bits);
      for (int64_t v = 0; v < s.vectors(); ++v) {
        const double n = Norm(&x[v * d], d);
        for (int i = 0; i < d; ++i) x[v * d + i] = static_cast<float>(x[v * d + i] / n);
      }
      CodecConfig cfg;
      cfg.value_bits = bits;
      cfg.norm_correction = true;
      const double worst = WorstUnitNormError(RoundTripV(x, s, cfg).decoded, s.vectors(), d);
      EXPECT_LE(worst, 0.02) << "d " << d << " bits " << bits;
      EXPECT_LE(worst, 1e-5) << "d " << d << " bits " << bits;  // exact up to f32 rounding
      // Without correction the decoded norm deviates more (the correction is doing the work).
      cfg.norm_correction = false;
      const double worst2 = WorstUnitNormError(RoundTripV(x, s, cfg).decoded, s.vectors(), d);
      EXPECT_GT(worst2, worst) << "d " << d << " bits " << bits;
    }
  }
}

TEST(CodecValues, ZeroVectorDecodesToZeros) {
  for (int bits : {2, 3, 4}) {
    for (bool nc : {false, true}) {
      const LayerShape s{1, 3, 48};
      auto x = Gaussian(s.elements(), 11);
      std::fill(x.begin() + 48, x.begin() + 96, 0.0f);  // vector 1 is zero
      CodecConfig cfg;
      cfg.value_bits = bits;
      cfg.norm_correction = nc;
      const VResult r = RoundTripV(x, s, cfg);
      EXPECT_EQ(r.norms[1], 0.0f);
      for (uint8_t c : CodesOf(r.packed, 1, 48, bits)) EXPECT_EQ(c, 1 << (bits - 1));
      for (int i = 48; i < 96; ++i) EXPECT_EQ(r.decoded[i], 0.0f);
      for (DType t : {DType::kBF16, DType::kF16}) {
        std::vector<uint16_t> out(s.elements(), 0x1234);
        ASSERT_TRUE(DecodeValues(r.packed.data(), r.norms.data(), s, cfg, out.data(), t).ok());
        for (int i = 48; i < 96; ++i) EXPECT_EQ(out[i] & 0x7FFF, 0);
      }
    }
  }
}

TEST(CodecValues, NaNAndInfAreRejectedWithTheirIndex) {
  const LayerShape s{2, 10, 8};
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto x = Gaussian(s.elements(), 12);
    x[157] = bad;  // head 1, token 9, dim 5
    x[159] = bad;
    std::vector<uint8_t> packed(s.vectors() * 3);
    std::vector<float> norms(s.vectors());
    const Status st =
        EncodeValues(x.data(), DType::kF32, s, CodecConfig{}, packed.data(), norms.data());
    ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("element 157 (head 1, token 9, dim 5)"), std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find(std::isnan(bad) ? "NaN" : "Inf"), std::string::npos);
  }
  // A bf16 NaN is caught too.
  std::vector<uint16_t> xh(8, 0x3F80);
  xh[3] = 0x7FC0;
  std::vector<uint8_t> packed(3);
  float norm;
  const Status st = EncodeValues(xh.data(), DType::kBF16, LayerShape{1, 1, 8}, CodecConfig{},
                                 packed.data(), &norm);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("element 3"), std::string::npos) << st.message();
}

TEST(CodecValues, BatchEqualsTokenByToken) {
  const LayerShape s{3, 40, 80};
  const auto x = Gaussian(s.elements(), 13);
  for (int bits : {2, 3, 4}) {
    CodecConfig cfg;
    cfg.value_bits = bits;
    cfg.norm_correction = bits == 3;
    const VResult r = RoundTripV(x, s, cfg);
    const int64_t vb = PackedVectorBytes(80, bits);
    std::vector<uint8_t> packed(r.packed.size());
    std::vector<float> norms(s.vectors());
    for (int64_t v = 0; v < s.vectors(); ++v) {
      ASSERT_TRUE(EncodeValues(x.data() + v * 80, DType::kF32, LayerShape{1, 1, 80}, cfg,
                               packed.data() + v * vb, norms.data() + v)
                      .ok());
    }
    EXPECT_EQ(packed, r.packed);
    EXPECT_EQ(norms, r.norms);
  }
}

TEST(CodecValues, ThreadCountDoesNotChangeBytes) {
  const LayerShape s{4, 300, 128};
  const auto x = Gaussian(s.elements(), 14);
  CodecConfig cfg;
  SetCodecThreads(1);
  EXPECT_EQ(CodecThreads(), 1);
  const VResult r1 = RoundTripV(x, s, cfg);
  std::vector<int8_t> q1(s.elements());
  std::vector<float> sc1(KeyScaleCount(s, KeyScaleMode::kPerChannel));
  ASSERT_TRUE(
      QuantizeKeys(x.data(), DType::kF32, s, KeyScaleMode::kPerChannel, q1.data(), sc1.data())
          .ok());
  SetCodecThreads(5);
  EXPECT_EQ(CodecThreads(), 5);
  const VResult r5 = RoundTripV(x, s, cfg);
  std::vector<int8_t> q5(s.elements());
  std::vector<float> sc5(sc1.size());
  ASSERT_TRUE(
      QuantizeKeys(x.data(), DType::kF32, s, KeyScaleMode::kPerChannel, q5.data(), sc5.data())
          .ok());
  SetCodecThreads(0);
  EXPECT_GE(CodecThreads(), 1);
  EXPECT_EQ(r1.packed, r5.packed);
  EXPECT_EQ(r1.norms, r5.norms);
  EXPECT_EQ(r1.decoded, r5.decoded);
  EXPECT_EQ(q1, q5);
  EXPECT_EQ(sc1, sc5);
}

TEST(CodecValues, HalfPrecisionInputsAndOutputs) {
  const LayerShape s{2, 100, 64};
  const auto x32 = Gaussian(s.elements(), 15);
  CodecConfig cfg;
  for (DType t : {DType::kBF16, DType::kF16}) {
    const auto xh = ToHalf(x32, t);
    const auto x = FromHalf(xh, t);
    std::vector<uint8_t> packed(s.vectors() * 24), packed32(packed.size());
    std::vector<float> norms(s.vectors()), norms32(s.vectors());
    ASSERT_TRUE(EncodeValues(xh.data(), t, s, cfg, packed.data(), norms.data()).ok());
    ASSERT_TRUE(EncodeValues(x.data(), DType::kF32, s, cfg, packed32.data(), norms32.data()).ok());
    EXPECT_EQ(packed, packed32);
    EXPECT_EQ(norms, norms32);
    std::vector<float> dec32(s.elements());
    std::vector<uint16_t> dec(s.elements());
    ASSERT_TRUE(DecodeValues(packed.data(), norms.data(), s, cfg, dec32.data(), DType::kF32).ok());
    ASSERT_TRUE(DecodeValues(packed.data(), norms.data(), s, cfg, dec.data(), t).ok());
    for (int64_t i = 0; i < s.elements(); ++i) {
      ASSERT_EQ(dec[i],
                t == DType::kF16 ? math::FloatToF16(dec32[i]) : math::FloatToBf16(dec32[i]));
    }
    EXPECT_LE(RelMse(FromHalf(dec, t), x), 0.0374 + 1e-3);
  }
}

// Block-diagonal rotation cost. Three inputs, 3 bits, 1000 vectors each: i.i.d. Gaussian;
// "spike" (one channel of magnitude 3 plus N(0, 0.1^2) noise); "one block" (N(0,1) in the
// first 16 channels, zeros elsewhere). With B < head_dim a block mixes only its own B
// coordinates, so the energy of "one block" stays in 16 of the z coordinates (too large
// for the N(0,1) codebook) while the others are 0 (quantized to +-0.2451). Prints the table
// quoted in codec.h; asserts the bounds that must hold.
TEST(CodecValues, BlockRotationCostTable) {
  std::printf("head_dim block gaussian3 spike3 oneblock3\n");
  for (int d : {8, 48, 64, 80, 96, 128}) {
    const LayerShape s{1, 1000, d};
    const auto g = Gaussian(s.elements(), 500 + d);
    auto spiky = Gaussian(s.elements(), 600 + d, 0.1f);
    for (int64_t v = 0; v < s.vectors(); ++v) spiky[v * d + (v * 7) % d] += 3.0f;
    auto block = Gaussian(s.elements(), 800 + d);
    for (int64_t v = 0; v < s.vectors(); ++v)
      for (int i = std::min(d, 16); i < d; ++i) block[v * d + i] = 0.0f;
    CodecConfig cfg;
    const double mg = RelMse(RoundTripV(g, s, cfg).decoded, g);
    const double ms = RelMse(RoundTripV(spiky, s, cfg).decoded, spiky);
    const double mb = RelMse(RoundTripV(block, s, cfg).decoded, block);
    std::printf("%8d %5d %9.5f %6.5f %9.5f\n", d, math::HadamardBlock(d), mg, ms, mb);
    EXPECT_LE(mg, 0.0374) << d;
    EXPECT_LE(ms, 0.127) << d;
    if (math::HadamardBlock(d) == d && d >= 64) {
      // A full rotation spreads any input: every case stays near the Gaussian figure
      // (d = 8 is too short for a spike to look Gaussian after rotation).
      EXPECT_LE(ms, 0.0374 * 1.15) << d;
      EXPECT_LE(mb, 0.0374 * 1.15) << d;
    } else {
      // The documented cost: concentrated energy is quantized worse than with a full rotation.
      EXPECT_GT(mb, mg) << d;
    }
  }
}

TEST(CodecValues, NonPowerOfTwoAndOddHeadDims) {
  for (int d : {1, 3, 12, 24, 40, 100, 160, 192, 256, 320}) {
    const LayerShape s{1, 64, d};
    const auto x = Gaussian(s.elements(), 700 + d);
    CodecConfig cfg;
    const VResult r = RoundTripV(x, s, cfg);
    const double mse = RelMse(r.decoded, x);
    // d = 1: u = +-1, the nearest level is 0.2451 in magnitude... rel MSE (1-0.2451)^2.
    EXPECT_LE(mse, d == 1 ? 0.58 : d == 3 ? 0.1 : 0.045) << "head_dim " << d;
  }
}

// ---- config, errors, accounting ------------------------------------------------------------

TEST(CodecConfig, RejectsBadShapesAndBits) {
  CodecConfig cfg;
  EXPECT_TRUE(ValidateConfig({1, 1, 8}, cfg).ok());
  auto msg = [&](LayerShape s, CodecConfig c) {
    return std::string(ValidateConfig(s, c).message());
  };
  EXPECT_NE(msg({0, 1, 8}, cfg).find("kv_heads"), std::string::npos);
  EXPECT_NE(msg({1, 0, 8}, cfg).find("tokens"), std::string::npos);
  EXPECT_NE(msg({1, 1, 0}, cfg).find("head_dim"), std::string::npos);
  CodecConfig c2 = cfg;
  c2.value_bits = 5;
  EXPECT_NE(msg({1, 1, 8}, c2).find("value_bits"), std::string::npos);
  c2.value_bits = 1;
  EXPECT_EQ(ValidateConfig({1, 1, 8}, c2).code(), absl::StatusCode::kInvalidArgument);
  CodecConfig c3 = cfg;
  c3.key_bits = 3;  // packed keys take 4..8 bits (issue 10)
  EXPECT_NE(msg({1, 1, 8}, c3).find("key_bits"), std::string::npos);
  c3.key_bits = 9;
  EXPECT_NE(msg({1, 1, 8}, c3).find("key_bits"), std::string::npos);
  std::vector<float> x(8, 1.0f);
  std::vector<uint8_t> p(3);
  float n;
  EXPECT_EQ(EncodeValues(nullptr, DType::kF32, {1, 1, 8}, cfg, p.data(), &n).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeValues(x.data(), static_cast<DType>(9), {1, 1, 8}, cfg, p.data(), &n).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeValues(x.data(), DType::kF32, {1, 1, 8}, c2, p.data(), &n).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CodecConfig, CudaDeviceWithoutCudaIsAnError) {
  std::vector<float> x(8, 1.0f);
  std::vector<uint8_t> p(3);
  float n;
  const Status st =
      EncodeValues(x.data(), DType::kF32, {1, 1, 8}, CodecConfig{}, p.data(), &n, Device::kCuda);
#if defined(POLYKV_HAVE_CUDA)
  // Built with CUDA: host pointers / no device must give an error, never a crash.
  int count = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) GTEST_SKIP() << "a GPU is present";
  EXPECT_FALSE(st.ok());
#else
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
#endif
}

TEST(CodecAccounting, LayerBytes) {
  const LayerShape s{8, 4096, 128};
  CodecConfig cfg;
  const LayerBytes b = CompressedLayerBytes(s, cfg);
  EXPECT_EQ(b.key_codes, 8 * 4096 * 128);
  EXPECT_EQ(b.key_scales, 4);
  EXPECT_EQ(b.value_codes, 8 * 4096 * 48);
  EXPECT_EQ(b.value_norms, 4 * 8 * 4096);
  EXPECT_EQ(b.total(), 4194304 + 4 + 1572864 + 131072);
  EXPECT_EQ(Bf16LayerBytes(s), 2 * 2 * 8 * 4096 * 128);
  cfg.key_scale = KeyScaleMode::kPerChannel;
  EXPECT_EQ(CompressedLayerBytes(s, cfg).key_scales, 4 * 8 * 128);
  cfg.key_scale = KeyScaleMode::kPerHead;
  EXPECT_EQ(CompressedLayerBytes(s, cfg).key_scales, 4 * 8);
}

TEST(CodecAccounting, ModelRatios) {
  CodecConfig cfg;
  const auto smol = ModelCompressionRatio(30, LayerShape{3, 4096, 64}, cfg);
  const auto llama = ModelCompressionRatio(32, LayerShape{8, 4096, 128}, cfg);
  std::printf(
      "SmolLM2-135M @4096: compressed %lld B, bf16 %lld B, effective %.4fx, nominal %.4fx\n",
      static_cast<long long>(smol.compressed_bytes), static_cast<long long>(smol.bf16_bytes),
      smol.effective, smol.nominal);
  std::printf(
      "Llama-3-8B   @4096: compressed %lld B, bf16 %lld B, effective %.4fx, nominal %.4fx\n",
      static_cast<long long>(llama.compressed_bytes), static_cast<long long>(llama.bf16_bytes),
      llama.effective, llama.nominal);
  // Per element: K 1 B, V 3/8 B, plus 4 B of norm per head_dim elements (+ 4 B/layer scale).
  // SmolLM2: 30 * (786432 + 4 + 294912 + 49152) = 33,915,000 B vs 30 * 3,145,728 B.
  EXPECT_EQ(smol.compressed_bytes, 30LL * (786432 + 4 + 294912 + 49152));
  EXPECT_EQ(smol.bf16_bytes, 30LL * 3145728);
  EXPECT_NEAR(smol.effective, 94371840.0 / 33915000.0, 1e-9);
  EXPECT_EQ(llama.compressed_bytes, 32LL * 5898244);
  EXPECT_NEAR(llama.effective, 16777216.0 / 5898244.0, 1e-9);
  EXPECT_NEAR(smol.nominal, 16.0 / 5.5, 1e-12);
  EXPECT_NEAR(llama.nominal, 2.909090909, 1e-6);
}

// ConvertNorms on the CPU: NormsToF16 / NormsFromF16's bits (round to nearest even, exact
// widening; the device path is compared with these in codec_cuda_test); bad arguments named.
TEST(CodecNorms, ConvertNormsEqualsTheHostConversions) {
  const std::vector<float> norms = {0.0f, 1.0f, 3.14159f, 65504.0f, 1e-7f, 123.456f, 0.3333f};
  const int64_t n = static_cast<int64_t>(norms.size());
  std::vector<uint16_t> want16(norms.size()), got16(norms.size());
  NormsToF16(norms.data(), n, want16.data());
  ASSERT_TRUE(ConvertNorms(norms.data(), DType::kF32, n, got16.data(), Device::kCpu).ok());
  EXPECT_EQ(got16, want16);
  EXPECT_EQ(got16[1], 0x3C00u);  // 1.0 in f16
  std::vector<float> want(norms.size()), got(norms.size());
  NormsFromF16(want16.data(), n, want.data());
  ASSERT_TRUE(ConvertNorms(want16.data(), DType::kF16, n, got.data(), Device::kCpu).ok());
  EXPECT_EQ(got, want);
  EXPECT_EQ(got[1], 1.0f);
  EXPECT_EQ(ConvertNorms(norms.data(), DType::kBF16, n, got16.data(), Device::kCpu).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConvertNorms(norms.data(), DType::kF32, -1, got16.data(), Device::kCpu).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConvertNorms(nullptr, DType::kF32, n, got16.data(), Device::kCpu).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace polykv::kernels
