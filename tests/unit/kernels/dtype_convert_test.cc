// kernels/dtype_convert.h, the one f16/bf16 <-> f32 converter of the project, against
// references that share no code with it: ldexp for the exact widenings (all 65536 inputs),
// the F16C instructions where the CPU has them, GCC's _Float16 and a nearest-even pick in
// double for the roundings, on a sweep of f32 values plus every tie, NaN, Inf and subnormal
// case. NaN results (where the references disagree among themselves) are pinned to this
// header's documented choice.
#include "polykv/kernels/dtype_convert.h"

#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "polykv/kernels/codec_math.h"

namespace polykv::kernels {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

bool IsNanF16(uint32_t h) { return ((h >> 10) & 0x1F) == 0x1F && (h & 0x3FF) != 0; }
bool IsNanBf16(uint32_t h) { return ((h >> 7) & 0xFF) == 0xFF && (h & 0x7F) != 0; }

// binary16 value in double arithmetic (sign, 5-bit exponent, 10-bit mantissa).
double RefF16Value(uint32_t h) {
  const int e = static_cast<int>((h >> 10) & 0x1F);
  const int m = static_cast<int>(h & 0x3FF);
  double v = e == 0    ? std::ldexp(static_cast<double>(m), -24)
             : e == 31 ? std::numeric_limits<double>::infinity()  // NaN handled by the caller
                       : std::ldexp(static_cast<double>(1024 + m), e - 25);
  return (h & 0x8000) ? -v : v;
}

// bfloat16 value in double arithmetic (sign, 8-bit exponent, 7-bit mantissa).
double RefBf16Value(uint32_t h) {
  const int e = static_cast<int>((h >> 7) & 0xFF);
  const int m = static_cast<int>(h & 0x7F);
  double v = e == 0     ? std::ldexp(static_cast<double>(m), -133)
             : e == 255 ? std::numeric_limits<double>::infinity()
                        : std::ldexp(static_cast<double>(128 + m), e - 134);
  return (h & 0x8000) ? -v : v;
}

// Nearest-even f32 -> bf16 in double: the nearer of the two bf16 neighbours of f, ties to the
// even one; past the largest finite bf16 the next "neighbour" is Inf (as IEEE rounding says).
uint16_t RefRoundBf16(float f) {
  const uint32_t u = Bits(f);
  if (std::isinf(f)) return static_cast<uint16_t>(u >> 16);
  const uint32_t lo = u & 0xFFFF0000u;  // toward zero
  const uint32_t hi = lo + 0x10000u;    // away from zero (0x7F80 0000 = Inf past the max)
  const double a = std::fabs(static_cast<double>(f));
  const double dl = a - std::fabs(RefBf16Value(lo >> 16));
  const double dh = std::fabs(RefBf16Value(hi >> 16)) == std::numeric_limits<double>::infinity()
                        ? std::ldexp(1.0, 128) - a  // the step past the max is to 2^128
                        : std::fabs(RefBf16Value(hi >> 16)) - a;
  if (dl < dh) return static_cast<uint16_t>(lo >> 16);
  if (dh < dl) return static_cast<uint16_t>(hi >> 16);
  return static_cast<uint16_t>(((lo >> 16) & 1u) ? hi >> 16 : lo >> 16);
}

// GCC's _Float16 conversion (libgcc or the F16C instruction; round to nearest even).
uint16_t RefRoundF16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

__attribute__((target("f16c"))) float F16cToFloat(uint16_t h) { return _cvtsh_ss(h); }
__attribute__((target("f16c"))) uint16_t F16cFromFloat(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
bool HaveF16c() { return __builtin_cpu_supports("f16c"); }

// f32 inputs for the roundings: a sweep over all bit patterns, every exponent's smallest,
// largest and halfway values, and the edges named in the header.
std::vector<float> SampleFloats() {
  std::vector<float> v;
  for (uint64_t u = 0; u < (1ull << 32); u += 65521)
    v.push_back(FromBits(static_cast<uint32_t>(u)));
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t e = 0; e < 256; ++e) {
      for (uint32_t m : {0u, 1u, 0x1000u, 0x0FFFu, 0x1001u, 0x3000u, 0x8000u, 0x7FFFu, 0x8001u,
                         0x18000u, 0x400000u, 0x7FFFFFu, 0x7F8000u, 0x7FF000u}) {
        v.push_back(FromBits(sign | (e << 23) | m));
      }
    }
  }
  for (float f :
       {0.0f, -0.0f, 1.0f, 65504.0f, 65519.0f, 65519.996f, 65520.0f, 65536.0f,
        std::ldexp(1.0f, -14), std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), std::ldexp(3.0f, -25),
        std::ldexp(1.0f, -26), std::ldexp(1.5f, -25), std::numeric_limits<float>::max(),
        std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(),
        std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
    v.push_back(f);
    v.push_back(-f);
  }
  return v;
}

// NaN inputs: quiet and signalling, both signs, payloads in the kept and the dropped bits.
const uint32_t kNanBits[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FA00000u,
                             0x7FFFFFFFu, 0xFFFFFFFFu, 0x7F810000u, 0x7FC0FFFFu, 0x7F802000u};

TEST(DTypeConvert, F16ToFloatEqualsLdexpForAllBitPatterns) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = dtype::F16ToFloat(static_cast<uint16_t>(h));
    if (IsNanF16(h)) {
      // Pinned: the payload is kept as it is (mantissa << 13, sign kept, quiet bit untouched).
      ASSERT_EQ(Bits(f), ((h & 0x8000u) << 16) | 0x7F800000u | ((h & 0x3FFu) << 13)) << h;
      continue;
    }
    const float ref = static_cast<float>(RefF16Value(h));  // exact: every f16 is an f32
    ASSERT_EQ(Bits(f), Bits(ref)) << "f16 0x" << std::hex << h;
  }
  EXPECT_EQ(dtype::F16ToFloat(0x3C00), 1.0f);
  EXPECT_EQ(dtype::F16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(dtype::F16ToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(Bits(dtype::F16ToFloat(0x8000)), 0x80000000u);  // -0 keeps its sign
  EXPECT_EQ(Bits(dtype::F16ToFloat(0x7C01)), 0x7F802000u);  // signalling NaN stays signalling
}

TEST(DTypeConvert, F16ToFloatEqualsF16cWhereTheCpuHasIt) {
  if (!HaveF16c()) GTEST_SKIP() << "no F16C on this CPU";
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t x = static_cast<uint16_t>(h);
    const uint32_t ours = Bits(dtype::F16ToFloat(x)), hw = Bits(F16cToFloat(x));
    if (IsNanF16(h)) {
      // The instruction sets the quiet bit (vcvtph2ps quiets signalling NaNs); the payload
      // is the same. The AVX2 matrix kernels use the instruction for f16 weights.
      ASSERT_EQ(ours | 0x00400000u, hw) << h;
    } else {
      ASSERT_EQ(ours, hw) << "f16 0x" << std::hex << h;
    }
  }
}

TEST(DTypeConvert, Bf16ToFloatEqualsLdexpForAllBitPatterns) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = dtype::Bf16ToFloat(static_cast<uint16_t>(h));
    if (IsNanBf16(h)) {
      ASSERT_EQ(Bits(f), h << 16) << h;  // pinned: payload and signalling bit kept
      continue;
    }
    ASSERT_EQ(Bits(f), Bits(static_cast<float>(RefBf16Value(h)))) << "bf16 0x" << std::hex << h;
  }
}

TEST(DTypeConvert, FloatToBf16RoundsToNearestEven) {
  for (float f : SampleFloats()) {
    if (std::isnan(f)) continue;
    ASSERT_EQ(dtype::FloatToBf16(f), RefRoundBf16(f)) << "f32 0x" << std::hex << Bits(f);
  }
  // Every tie (low 16 bits exactly half) goes to the even neighbour, whatever the exponent
  // (subnormals included); the largest finite values round to Inf past the halfway point.
  for (uint32_t hi = 0; hi < 65536; ++hi) {
    const uint32_t u = (hi << 16) | 0x8000u;
    const float f = FromBits(u);
    if (std::isnan(f) || std::isinf(f)) continue;
    const uint16_t even = static_cast<uint16_t>((hi & 1u) ? hi + 1 : hi);
    ASSERT_EQ(dtype::FloatToBf16(f), even) << "f32 0x" << std::hex << u;
  }
  EXPECT_EQ(dtype::FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  EXPECT_EQ(dtype::FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(dtype::FloatToBf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(dtype::FloatToBf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(dtype::FloatToBf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(dtype::FloatToBf16(FromBits(0x00008001u)), 0x0001);  // subnormal, past the tie
  EXPECT_EQ(dtype::FloatToBf16(-0.0f), 0x8000);
  // Pinned NaN: the top half with the quiet bit set (sign and the top payload bits kept).
  for (uint32_t u : kNanBits) {
    EXPECT_EQ(dtype::FloatToBf16(FromBits(u)), static_cast<uint16_t>((u >> 16) | 0x0040u)) << u;
  }
}

TEST(DTypeConvert, FloatToF16RoundsToNearestEven) {
  const bool f16c = HaveF16c();
  for (float f : SampleFloats()) {
    if (std::isnan(f)) continue;
    const uint16_t ours = dtype::FloatToF16(f);
    ASSERT_EQ(ours, RefRoundF16(f)) << "f32 0x" << std::hex << Bits(f);
    if (f16c) {
      ASSERT_EQ(ours, F16cFromFloat(f)) << "f32 0x" << std::hex << Bits(f);
    }
  }
  // Every tie of the normal range (13 dropped bits exactly half): the even neighbour.
  for (uint32_t e = 113; e <= 142; ++e) {  // f16 exponents 1..30
    for (uint32_t m = 0; m < (1u << 10); ++m) {
      const uint32_t u = (e << 23) | (m << 13) | 0x1000u;
      const uint16_t lo = static_cast<uint16_t>(((e - 112) << 10) | m);
      const uint16_t even = (lo & 1u) ? static_cast<uint16_t>(lo + 1) : lo;
      ASSERT_EQ(dtype::FloatToF16(FromBits(u)), even) << "f32 0x" << std::hex << u;
      ASSERT_EQ(dtype::FloatToF16(FromBits(u | 0x80000000u)), even | 0x8000u);
    }
  }
  // Ties in the subnormal range: (2k + 1) * 2^-25 -> the even one of k, k + 1 (times 2^-24).
  for (uint32_t k = 0; k < 1024; ++k) {
    const float f = std::ldexp(static_cast<float>(2 * k + 1), -25);
    ASSERT_EQ(dtype::FloatToF16(f), (k & 1u) ? k + 1 : k) << k;
  }
  EXPECT_EQ(dtype::FloatToF16(65519.0f), 0x7BFF);
  EXPECT_EQ(dtype::FloatToF16(65520.0f), 0x7C00);  // the tie past the max rounds to Inf
  EXPECT_EQ(dtype::FloatToF16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(dtype::FloatToF16(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(dtype::FloatToF16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(dtype::FloatToF16(-0.0f), 0x8000);
  // Pinned NaN: the canonical quiet NaN with the sign (F16C would keep payload bits instead).
  for (uint32_t u : kNanBits) {
    EXPECT_EQ(dtype::FloatToF16(FromBits(u)), (u & 0x80000000u) ? 0xFE00 : 0x7E00) << u;
  }
}

TEST(DTypeConvert, HalfPrecisionRoundTripsThroughF32) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t x = static_cast<uint16_t>(h);
    if (!IsNanF16(h)) {
      ASSERT_EQ(dtype::FloatToF16(dtype::F16ToFloat(x)), x) << h;
    }
    if (!IsNanBf16(h)) {
      ASSERT_EQ(dtype::FloatToBf16(dtype::Bf16ToFloat(x)), x) << h;
    }
  }
}

TEST(DTypeConvert, UnalignedLoadsAndTheCodecNamesAreTheSameConversions) {
  const uint8_t bytes[5] = {0x11, 0x00, 0x3C, 0x80, 0x3F};  // 0x3C00 and 0x3F80 at odd offsets
  EXPECT_EQ(dtype::LoadF16(bytes + 1), 1.0f);
  EXPECT_EQ(dtype::LoadBf16(bytes + 3), 1.0f);
  for (uint32_t h = 0; h < 65536; h += 7) {
    const uint16_t x = static_cast<uint16_t>(h);
    uint8_t raw[3];
    std::memcpy(raw + 1, &x, 2);
    EXPECT_EQ(Bits(dtype::LoadF16(raw + 1)), Bits(dtype::F16ToFloat(x)));
    EXPECT_EQ(Bits(dtype::LoadBf16(raw + 1)), Bits(dtype::Bf16ToFloat(x)));
    // codec_math.h re-exports these functions: math:: and dtype:: are one definition.
    EXPECT_EQ(Bits(math::F16ToFloat(x)), Bits(dtype::F16ToFloat(x)));
    EXPECT_EQ(Bits(math::LoadF32(&x, 1, 0)), Bits(dtype::F16ToFloat(x)));
    EXPECT_EQ(Bits(math::LoadF32(&x, 2, 0)), Bits(dtype::Bf16ToFloat(x)));
  }
}

}  // namespace
}  // namespace polykv::kernels
