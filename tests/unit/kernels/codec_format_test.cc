// Format tests of the codec: Lloyd-Max codebooks, bit packing, dtype conversions, golden bytes
// (shared with an independent Python reference, tests/data/codec/golden.json).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "polykv/kernels/codec.h"
#include "polykv/kernels/codec_math.h"
#include "test_util.h"

namespace polykv::kernels {
namespace {

namespace m = math;

void ExpectSymmetricLevels(int bits, const std::vector<double>& positive) {
  auto cb = LloydMaxCodebook(bits);
  ASSERT_TRUE(cb.ok()) << cb.status();
  const int n = 1 << bits;
  ASSERT_EQ(static_cast<int>(cb->size()), n);
  for (int i = 0; i < n / 2; ++i) {
    EXPECT_NEAR((*cb)[n / 2 + i], positive[i], 1e-3) << "bits " << bits << " level +" << i;
    EXPECT_NEAR((*cb)[n / 2 - 1 - i], -positive[i], 1e-3) << "bits " << bits << " level -" << i;
  }
  for (int i = 0; i + 1 < n; ++i) EXPECT_LT((*cb)[i], (*cb)[i + 1]);
}

TEST(CodecCodebook, ThreeBitsMatchesLloydMax) {
  ExpectSymmetricLevels(3, {0.2451, 0.7560, 1.3439, 2.1519});
}

TEST(CodecCodebook, TwoBitsMatchesLloydMax) { ExpectSymmetricLevels(2, {0.4528, 1.5104}); }

TEST(CodecCodebook, FourBitsMatchesLloydMax) {
  ExpectSymmetricLevels(4, {0.1284, 0.3881, 0.6568, 0.9424, 1.2562, 1.6181, 2.0690, 2.7326});
}

TEST(CodecCodebook, OneBitIsConditionalMean) {
  // E[x | x > 0] = sqrt(2/pi) = 0.79788.
  ExpectSymmetricLevels(1, {0.7979});
}

TEST(CodecCodebook, RejectsBadBits) {
  EXPECT_EQ(LloydMaxCodebook(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LloydMaxCodebook(5).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- packing -----------------------------------------------------------------------------

TEST(CodecPacking, PackedBytesIsCeil) {
  EXPECT_EQ(PackedVectorBytes(1, 3), 1);
  EXPECT_EQ(PackedVectorBytes(3, 3), 2);
  EXPECT_EQ(PackedVectorBytes(8, 3), 3);
  EXPECT_EQ(PackedVectorBytes(11, 3), 5);
  EXPECT_EQ(PackedVectorBytes(128, 3), 48);
  EXPECT_EQ(PackedVectorBytes(128, 2), 32);
  EXPECT_EQ(PackedVectorBytes(5, 4), 3);
  EXPECT_EQ(PackedVectorBytes(80, 3), 30);
}

TEST(CodecPacking, RoundTripAllSizes) {
  std::mt19937 rng(7);
  for (int bits : {2, 3, 4}) {
    for (int n : {1, 5, 11, 48, 128}) {
      for (int pattern = 0; pattern < 3; ++pattern) {
        std::vector<uint8_t> codes(n);
        for (int i = 0; i < n; ++i) {
          codes[i] = pattern == 0   ? static_cast<uint8_t>(rng() % (1u << bits))
                     : pattern == 1 ? static_cast<uint8_t>((1u << bits) - 1)
                                    : static_cast<uint8_t>(i % (1 << bits));
        }
        const int64_t nb = m::PackedBytes(n, bits);
        // Guard bytes around the packed vector must stay untouched.
        std::vector<uint8_t> buf(nb + 2, 0xAB);
        m::PackCodes(codes.data(), n, bits, buf.data() + 1);
        EXPECT_EQ(buf[0], 0xAB);
        EXPECT_EQ(buf[nb + 1], 0xAB);
        // Unused high bits of the last byte are zero.
        const int used = (n * bits) % 8;
        if (used != 0) {
          EXPECT_EQ(buf[nb] >> used, 0) << "bits " << bits << " n " << n;
        }
        std::vector<uint8_t> back(n, 0xFF);
        m::UnpackCodes(buf.data() + 1, n, bits, back.data());
        EXPECT_EQ(back, codes) << "bits " << bits << " n " << n << " pattern " << pattern;
      }
    }
  }
}

std::vector<uint8_t> Pack(const std::vector<uint8_t>& codes, int bits) {
  std::vector<uint8_t> out(m::PackedBytes(static_cast<int64_t>(codes.size()), bits));
  m::PackCodes(codes.data(), static_cast<int>(codes.size()), bits, out.data());
  return out;
}

TEST(CodecPacking, FixedBytesFromTheLayoutDiagram) {
  // Worked example in codec.h: 3-bit codes [1,2,3,4,5,6,7,0] -> D1 58 1F.
  EXPECT_EQ(Pack({1, 2, 3, 4, 5, 6, 7, 0}, 3), (std::vector<uint8_t>{0xD1, 0x58, 0x1F}));
  // Code 2 straddles bytes 0 and 1: bits 6,7 of byte 0 and bit 0 of byte 1.
  EXPECT_EQ(Pack({0, 0, 7}, 3), (std::vector<uint8_t>{0xC0, 0x01}));
  EXPECT_EQ(Pack({0, 0, 5}, 3), (std::vector<uint8_t>{0x40, 0x01}));
  EXPECT_EQ(Pack({0, 0, 2}, 3), (std::vector<uint8_t>{0x80, 0x00}));
  // 5 codes of 7 = 15 one-bits.
  EXPECT_EQ(Pack({7, 7, 7, 7, 7}, 3), (std::vector<uint8_t>{0xFF, 0x7F}));
  // 2 bits: [0,1,2,3] -> 0b11'10'01'00.
  EXPECT_EQ(Pack({0, 1, 2, 3, 3}, 2), (std::vector<uint8_t>{0xE4, 0x03}));
  // 4 bits: low nibble first.
  EXPECT_EQ(Pack({1, 2, 15}, 4), (std::vector<uint8_t>{0x21, 0x0F}));
  // 11 codes of 3 bits crossing the 8-code group boundary: codes 8..10 start a new group.
  EXPECT_EQ(Pack({0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3}, 3),
            (std::vector<uint8_t>{0x00, 0x00, 0x00, 0xD1, 0x00}));
}

// ---- dtype conversions -------------------------------------------------------------------

TEST(CodecDTypeConversion, F16RoundTripsAllBitPatterns) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = m::F16ToFloat(static_cast<uint16_t>(h));
    const bool nan = ((h >> 10) & 0x1F) == 0x1F && (h & 0x3FF) != 0;
    if (nan) {
      EXPECT_TRUE(std::isnan(f)) << h;
      EXPECT_TRUE(((m::FloatToF16(f) >> 10) & 0x1F) == 0x1F && (m::FloatToF16(f) & 0x3FF) != 0);
    } else {
      ASSERT_EQ(m::FloatToF16(f), h) << "f16 0x" << std::hex << h;
    }
  }
  EXPECT_EQ(m::F16ToFloat(0x3C00), 1.0f);
  EXPECT_EQ(m::F16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(m::F16ToFloat(0x7BFF), 65504.0f);
}

TEST(CodecDTypeConversion, F16MatchesCompilerRoundingOnASweep) {
  // GCC's _Float16 conversion (libgcc, round to nearest even) is the reference.
  for (uint64_t u = 0; u < (1ull << 32); u += 65521) {
    float f;
    const uint32_t bits = static_cast<uint32_t>(u);
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f)) continue;
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t rb;
    std::memcpy(&rb, &ref, 2);
    ASSERT_EQ(m::FloatToF16(f), rb) << "float bits 0x" << std::hex << bits;
  }
  // Ties: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 -> even (1.0); 1 + 3 * 2^-11 -> up.
  EXPECT_EQ(m::FloatToF16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(m::FloatToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(m::FloatToF16(65520.0f), 0x7C00);
  EXPECT_EQ(m::FloatToF16(65519.0f), 0x7BFF);
  EXPECT_EQ(m::FloatToF16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even (0)
  EXPECT_EQ(m::FloatToF16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp -> 2 (even)
  EXPECT_EQ(m::FloatToF16(-0.0f), 0x8000);
}

// Reference bf16 rounding in double: pick the nearer of the two neighbours, ties to even.
uint16_t RefBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t lo = u & 0xFFFF0000u;  // truncation toward zero
  const uint32_t hi = lo + 0x10000u;    // next bf16 away from zero (0x7F80 = Inf past the max)
  float flo;
  std::memcpy(&flo, &lo, 4);
  const int e = static_cast<int>((u >> 23) & 0xFF);
  const double ulp = std::ldexp(1.0, (e == 0 ? 1 : e) - 134);  // bf16 step at this exponent
  const double dl = std::fabs(double{f}) - std::fabs(double{flo});
  const double dh = ulp - dl;
  if (dl < dh) return static_cast<uint16_t>(lo >> 16);
  if (dh < dl) return static_cast<uint16_t>(hi >> 16);
  return static_cast<uint16_t>(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
}

TEST(CodecDTypeConversion, Bf16MatchesReferenceRounding) {
  for (uint64_t u = 0; u < (1ull << 32); u += 65519) {
    float f;
    const uint32_t bits = static_cast<uint32_t>(u);
    std::memcpy(&f, &bits, 4);
    if (!std::isfinite(f)) continue;
    ASSERT_EQ(m::FloatToBf16(f), RefBf16(f)) << "float bits 0x" << std::hex << bits;
  }
  EXPECT_EQ(m::FloatToBf16(1.0f), 0x3F80);
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7 -> even (1.0); 1 + 3 * 2^-8 -> up to 1 + 2^-6.
  EXPECT_EQ(m::FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  EXPECT_EQ(m::FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_TRUE(std::isnan(m::Bf16ToFloat(m::FloatToBf16(std::nanf("")))));
  EXPECT_EQ(m::FloatToBf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds to +Inf
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = m::Bf16ToFloat(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(m::FloatToBf16(f), h);
    }
  }
}

// ---- golden bytes (lock the format; the CUDA test checks the same bytes on the GPU) --------

// Deterministic input without a RNG: v[j][i] = sin(0.37 i + 1.3 j) + 0.25 cos(2.1 i j).
std::vector<float> GoldenInput(int vectors, int d) {
  std::vector<float> v(static_cast<size_t>(vectors) * d);
  for (int j = 0; j < vectors; ++j) {
    for (int i = 0; i < d; ++i) {
      v[j * d + i] =
          static_cast<float>(std::sin(0.37 * i + 1.3 * j) + 0.25 * std::cos(2.1 * i * j));
    }
  }
  return v;
}

std::string Hex(const uint8_t* p, size_t n) {
  static const char* k = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += k[p[i] >> 4];
    s += k[p[i] & 15];
  }
  return s;
}

// The golden bytes live in tests/data/codec/golden.json, which the independent Python reference
// of the codec's definition (tests/python/codec_reference.py, ctest codec_python_reference)
// checks too: these are not just snapshots of this code's own output.
nlohmann::json GoldenCase(const std::string& name) {
  std::ifstream in(POLYKV_TEST_DATA_DIR "/codec/golden.json");
  EXPECT_TRUE(in) << "tests/data/codec/golden.json missing";
  const nlohmann::json golden = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  for (const auto& c : golden.value("value_cases", nlohmann::json::array())) {
    if (c.value("name", "") == name) return c;
  }
  ADD_FAILURE() << "no value case " << name << " in golden.json";
  return nlohmann::json::object();
}

void ExpectGoldenValues(const std::string& name) {
  const nlohmann::json c = GoldenCase(name);
  ASSERT_TRUE(c.contains("packed_hex")) << name;
  const int d = c["head_dim"], n = c["vectors"], bits = c["bits"];
  const LayerShape shape{1, n, d};
  const auto v = GoldenInput(n, d);
  CodecConfig cfg;
  cfg.value_bits = bits;
  cfg.norm_correction = c["norm_correction"];
  cfg.rotation_seed = std::stoull(c["seed"].get<std::string>(), nullptr, 16);
  const int64_t vb = PackedVectorBytes(d, bits);
  std::vector<uint8_t> packed(n * vb);
  std::vector<float> norms(n);
  ASSERT_TRUE(EncodeValues(v.data(), DType::kF32, shape, cfg, packed.data(), norms.data()).ok());
  for (int j = 0; j < n; ++j) {
    EXPECT_EQ(Hex(packed.data() + j * vb, vb), c["packed_hex"][j].get<std::string>())
        << name << " vector " << j;
    EXPECT_FLOAT_EQ(norms[j], c["norms"][j].get<float>()) << name << " vector " << j;
  }
}

TEST(CodecGolden, ValueBytesThreeBitsHeadDim64) { ExpectGoldenValues("bits3_head_dim64"); }

TEST(CodecGolden, ValueBytesFourBitsHeadDim48NormCorrected) {
  ExpectGoldenValues("bits4_head_dim48_norm_corrected");
}

TEST(CodecGolden, RotationSignsOfDefaultSeed) {
  // First 16 signs of the default seed, as bits (1 = negative), LSB = coordinate 0.
  const CodecConfig cfg;
  uint32_t bits = 0;
  for (int i = 0; i < 16; ++i) bits |= (m::RotationSign(cfg.rotation_seed, i) < 0 ? 1u : 0u) << i;
  EXPECT_EQ(bits, 0x7D44u);
}

TEST(CodecGolden, KeyBytesPerTensor) {
  const LayerShape shape{2, 2, 8};
  std::vector<float> k(32);
  for (int i = 0; i < 32; ++i) k[i] = (i - 12) * 0.0625f;  // absmax 19 * 0.0625 = 1.1875
  std::vector<int8_t> q(32);
  float scale = 0;
  ASSERT_TRUE(
      QuantizeKeys(k.data(), DType::kF32, shape, KeyScaleMode::kPerTensor, q.data(), &scale).ok());
  EXPECT_EQ(scale, 1.1875f / 127.0f);
  // q = rne((i - 12) * 127 / 19), in exact rational arithmetic (no ties: 19 is odd).
  const int8_t expect[32] = {-80, -74, -67, -60, -53, -47, -40, -33, -27, -20, -13,
                             -7,  0,   7,   13,  20,  27,  33,  40,  47,  53,  60,
                             67,  74,  80,  87,  94,  100, 107, 114, 120, 127};
  for (int i = 0; i < 32; ++i) EXPECT_EQ(q[i], expect[i]) << i;
}

TEST(CodecKeyRounding, TiesGoToEven) {
  EXPECT_EQ(m::QuantizeKey(2.5f, 1.0f), 2);
  EXPECT_EQ(m::QuantizeKey(3.5f, 1.0f), 4);
  EXPECT_EQ(m::QuantizeKey(-2.5f, 1.0f), -2);
  EXPECT_EQ(m::QuantizeKey(-0.5f, 1.0f), 0);
  EXPECT_EQ(m::QuantizeKey(0.5000001f, 1.0f), 1);
  EXPECT_EQ(m::QuantizeKey(1000.0f, 1.0f), 127);
  EXPECT_EQ(m::QuantizeKey(-1000.0f, 1.0f), -127);
}

}  // namespace
}  // namespace polykv::kernels

namespace polykv::kernels {
namespace {

// Every FWHT implementation (host SIMD first stages, fixed-size stages) must equal the plain
// runtime butterfly network bit for bit: the CUDA kernels run the portable one.
TEST(CodecFwht, AllImplementationsAreBitIdentical) {
  for (int block : {2, 4, 8, 16, 32, 64, 128, 256}) {
    auto x = testing::Gaussian(block * 3, 40 + block, 3.0f);
    auto y = x;
    for (int g = 0; g < 3; ++g) {
      math::BlockFwht(x.data() + g * block, block, block);
      math::FwhtRuntime(y.data() + g * block, block);
    }
    for (size_t i = 0; i < x.size(); ++i) {
      uint32_t a, b;
      std::memcpy(&a, &x[i], 4);
      std::memcpy(&b, &y[i], 4);
      ASSERT_EQ(a, b) << "block " << block << " i " << i;
    }
  }
  // H_B * H_B = B * I on a unit vector (exact in f32 for these sizes).
  std::vector<float> e(64, 0.0f);
  e[5] = 1.0f;
  math::BlockFwht(e.data(), 64, 64);
  for (float v : e) EXPECT_EQ(std::fabs(v), 1.0f);
  math::BlockFwht(e.data(), 64, 64);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(e[i], i == 5 ? 64.0f : 0.0f);
}

TEST(CodecKeyRounding, MagicConstantEqualsRint) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-140.0f, 140.0f);
  for (int i = 0; i < 200000; ++i) {
    const float v = i < 1000 ? (i - 500) * 0.5f : u(rng);  // includes every .5 tie in range
    const float c = std::max(-127.0f, std::min(127.0f, std::rint(v)));
    ASSERT_EQ(m::QuantizeKey(v, 1.0f), static_cast<int>(c)) << v;
  }
}

TEST(CodecSumSquares, FixedLaneOrder) {
  // d = 11: lanes 0..2 get two terms, 3..7 one; result = (t0 + t2) + (t1 + t3).
  std::vector<float> x(11);
  for (int i = 0; i < 11; ++i) x[i] = 0.1f * (i + 1);
  float lane[8] = {};
  for (int i = 0; i < 11; ++i) lane[i % 8] += x[i] * x[i];
  const float expect =
      ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
  EXPECT_EQ(m::SumSquares(x.data(), 11), expect);
}

// A value-code width outside 1..4 that reaches the per-vector math (a broken invariant:
// widths are validated where they enter) stops the process with a message; it used to be
// packed silently as 4 bits.
TEST(CodecDispatchDeathTest, UnsupportedWidthStopsLoudly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<uint8_t> codes(16, 1), out(16);
  EXPECT_DEATH(m::PackCodes(codes.data(), 16, 5, out.data()), "5-bit value codes reached a kernel");
  EXPECT_DEATH(m::PackCodes(codes.data(), 16, 0, out.data()), "0-bit value codes reached a kernel");
}

}  // namespace
}  // namespace polykv::kernels
