// Matrix kernels over weight blocks: every weight type x every ISA variant this CPU has,
// against (1) the scalar reference on the same quantized activations and (2) the exact
// product of the dequantized weights with the f32 activations (in double), within the
// bound that activation quantization allows.
#include "polykv/kernels/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "device_test_util.h"
#include "matmul_internal.h"  // kernels/src: the activation quantizers
#include "polykv/kernels/cpu.h"

namespace polykv::kernels {
namespace {

using testing::RandomRows;
using testing::RandomWeightBytes;

constexpr WeightType kAllTypes[] = {WeightType::kF32,  WeightType::kF16,  WeightType::kBF16,
                                    WeightType::kQ4_0, WeightType::kQ4_1, WeightType::kQ5_0,
                                    WeightType::kQ5_1, WeightType::kQ8_0, WeightType::kQ4_K,
                                    WeightType::kQ5_K, WeightType::kQ6_K};

// N(0, 1) activations (RandomRows) with a few outliers, as real activations have.
std::vector<float> RandomActivations(int64_t n, int64_t cols, uint64_t seed) {
  std::vector<float> x = RandomRows(n, cols, seed);
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i * cols + (i * 7) % cols)] = 12.0f;
  return x;
}

struct Case {
  int64_t rows, cols, n;
};

class MatMulTest : public ::testing::TestWithParam<WeightType> {};

TEST_P(MatMulTest, EveryIsaMatchesScalarAndDequantizedProduct) {
  const WeightType type = GetParam();
  const BlockFormat f = WeightBlockFormat(type).value();
  // Block types: 1 block; 18 blocks (SmolLM2's 576 columns: 4 groups of 4 + 2 single
  // blocks, one partial gather of 2; for the many-row kernels one group of 16 + one pair);
  // 7 (many-row kernels: 4 pairs, the last one single); 48 (3 full gathers of 16); 33 (two
  // groups of 16 + one single block). f32 family: odd lengths.
  const bool blocks = f.values > 1;
  const std::vector<Case> cases = {
      {37, blocks ? f.values : 37, 1},          // ragged rows; f32: cols not a multiple of 8
      {37, blocks ? 18 * f.values : 576, 3},    // 3 activation rows in one call
      {37, blocks ? 18 * f.values : 576, 9},    // 9 rows: the many-row kernels, j-blocks 8 + 1
      {16, blocks ? 7 * f.values : 291, 5},     // 4 + 1
      {53, blocks ? 48 * f.values : 1536, 64},  // 64 rows: 16 calls of 4
      {21, blocks ? 33 * f.values : 1056, 4},   // ragged panel of 5 rows after 16
      {37, blocks ? 18 * f.values : 576, 1},    // decode: 2 packed panels + 5 rows
      {53, blocks ? 48 * f.values : 1536, 1},   // decode, long rows
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << WeightTypeName(type) << " rows=" << c.rows
                                      << " cols=" << c.cols << " n=" << c.n);
    const std::vector<uint8_t> wb = RandomWeightBytes(type, c.rows, c.cols, 17 + c.rows);
    auto view = MakeWeightView(type, wb.data(), wb.size(), c.rows, c.cols);
    ASSERT_TRUE(view.ok()) << view.status();
    const std::vector<float> x = RandomActivations(c.n, c.cols, 99 + c.n);
    std::vector<float> wf(static_cast<size_t>(c.rows * c.cols));
    ASSERT_TRUE(DequantizeRows(*view, 0, c.rows, wf.data()).ok());
    // The same matrix in the packed layout (where the type has one), 64-byte aligned.
    std::vector<uint8_t> packed_buf(static_cast<size_t>(PackedWeightBytes(*view)) + 64);
    WeightView packed_view = *view;
    if (PackedLayoutSupported(type)) {
      uint8_t* p =
          packed_buf.data() + (64 - reinterpret_cast<uintptr_t>(packed_buf.data()) % 64) % 64;
      ASSERT_TRUE(PackWeights(*view, absl::MakeSpan(p, PackedWeightBytes(*view))).ok());
      packed_view.packed = p;
    }

    MatMulOptions scalar_opt;
    scalar_opt.isa = static_cast<int>(Isa::kScalar);
    scalar_opt.threads = 1;
    std::vector<float> ref(static_cast<size_t>(c.n * c.rows));
    ASSERT_TRUE(MatMul(*view, x.data(), c.n, c.cols, ref.data(), c.rows, scalar_opt).ok());

    // (2) scalar reference vs the exact product: the only error is the activation rounding,
    // |dy| <= sum_i |w_i| * e_i (+ f32 accumulation), with d_x the block scale and e_i the
    // activation error: d_x / 512 (8-bit codes + 8-bit residual codes; d_x / 256 where the
    // residual clamps).
    const int64_t ablock = f.values == 1 ? 1 : f.values;  // activation block = weight block
    for (int64_t r = 0; r < c.n; ++r) {
      std::vector<double> half_step(static_cast<size_t>(c.cols), 0.0);
      if (f.values > 1) {
        for (int64_t b = 0; b < c.cols / ablock; ++b) {
          double amax = 0;
          for (int64_t i = 0; i < ablock; ++i)
            amax = std::max(amax, std::fabs(double{x[r * c.cols + b * ablock + i]}));
          const double e = amax / 127.0 / 256.0;  // 32- and 256-value blocks alike
          for (int64_t i = 0; i < ablock; ++i) half_step[b * ablock + i] = e;
        }
      }
      for (int64_t o = 0; o < c.rows; ++o) {
        double exact = 0, bound = 0, mag = 0;
        for (int64_t i = 0; i < c.cols; ++i) {
          const double wi = wf[o * c.cols + i], xi = x[r * c.cols + i];
          exact += wi * xi;
          bound += std::fabs(wi) * half_step[i];
          mag += std::fabs(wi * xi);
        }
        const double tol = bound * 1.0001 + 1e-5 * mag + 1e-6;
        ASSERT_NEAR(ref[r * c.rows + o], exact, tol) << "row " << r << " out " << o;
      }
    }
    // (1) every SIMD variant vs the scalar reference (float reassociation only), 1 and 2
    // threads (the partition must not change any value), with and without the many-row
    // kernels (rows_kernels; they exist for Q4_0/Q4_1 on avx512 and run from 4 rows), and
    // from the packed layout (Q4_0/Q4_1/Q8_0 1-row products on avx512; other ISAs and row
    // counts read the blocks).
    for (Isa isa : SupportedIsas()) {
      for (int threads : {1, 2}) {
        for (int rows_kernels : {0, 1}) {
          for (bool packed : {false, true}) {
            if (packed && packed_view.packed == nullptr) continue;
            SCOPED_TRACE(::testing::Message()
                         << IsaName(isa) << " threads=" << threads
                         << " rows_kernels=" << rows_kernels << " packed=" << packed);
            MatMulOptions opt;
            opt.isa = static_cast<int>(isa);
            opt.threads = threads;
            opt.rows_kernels = rows_kernels;
            opt.amx = 0;
            std::vector<float> y(static_cast<size_t>(c.n * (c.rows + 3)), -7.0f);
            ASSERT_TRUE(MatMul(packed ? packed_view : *view, x.data(), c.n, c.cols, y.data(),
                               c.rows + 3, opt)
                            .ok());
            for (int64_t r = 0; r < c.n; ++r) {
              for (int64_t o = 0; o < c.rows; ++o) {
                double mag = 0;
                for (int64_t i = 0; i < c.cols; ++i)
                  mag += std::fabs(double{wf[o * c.cols + i]} * x[r * c.cols + i]);
                ASSERT_NEAR(y[r * (c.rows + 3) + o], ref[r * c.rows + o], 2e-6 * mag + 1e-6)
                    << "row " << r << " out " << o;
              }
              for (int64_t o = c.rows; o < c.rows + 3; ++o)
                ASSERT_EQ(y[r * (c.rows + 3) + o], -7.0f) << "wrote past the row";
            }
          }
        }
      }
    }
  }
}

// The packed layout: each panel block holds its 16 rows' code dwords interleaved and their
// scales after them; rows past the matrix are zero.
TEST(MatMul, PackWeightsLaysOutPanelsOfSixteenRows) {
  const int64_t rows = 19, cols = 64;  // 2 panels (the second with 3 rows), 2 blocks
  for (WeightType type : {WeightType::kQ4_0, WeightType::kQ4_1, WeightType::kQ8_0}) {
    SCOPED_TRACE(WeightTypeName(type));
    const auto wb = RandomWeightBytes(type, rows, cols, 3);
    const auto v = MakeWeightView(type, wb.data(), wb.size(), rows, cols).value();
    const int64_t kb = v.row_bytes / 2, scales = type == WeightType::kQ4_1 ? 2 : 1;
    const int64_t code_bytes = kb - 2 * scales;
    ASSERT_EQ(PackedWeightBytes(v), 32 * v.row_bytes);
    std::vector<uint8_t> out(static_cast<size_t>(PackedWeightBytes(v)), 0xAB);
    ASSERT_TRUE(PackWeights(v, absl::MakeSpan(out)).ok());
    for (int64_t row = 0; row < 32; ++row) {
      for (int64_t b = 0; b < 2; ++b) {
        const uint8_t* blk = out.data() + ((row / 16) * 2 + b) * 16 * kb;
        const int64_t r = row % 16;
        for (int64_t i = 0; i < code_bytes; ++i) {
          const uint8_t want = row < rows ? wb[row * v.row_bytes + b * kb + 2 * scales + i] : 0;
          ASSERT_EQ(blk[64 * (i / 4) + 4 * r + i % 4], want) << "row " << row << " code " << i;
        }
        for (int64_t s = 0; s < 2 * scales; ++s) {
          const uint8_t want = row < rows ? wb[row * v.row_bytes + b * kb + s] : 0;
          ASSERT_EQ(blk[16 * code_bytes + 32 * (s / 2) + 2 * r + s % 2], want) << "row " << row;
        }
      }
    }
    std::vector<uint8_t> small(static_cast<size_t>(PackedWeightBytes(v) - 1));
    const Status st = PackWeights(v, absl::MakeSpan(small));
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  }
  const auto wk = RandomWeightBytes(WeightType::kQ4_K, 2, 256, 1);
  const auto vk = MakeWeightView(WeightType::kQ4_K, wk.data(), wk.size(), 2, 256).value();
  EXPECT_FALSE(PackedLayoutSupported(WeightType::kQ4_K));
  EXPECT_EQ(PackedWeightBytes(vk), 0);
  std::vector<uint8_t> any(1024);
  EXPECT_EQ(PackWeights(vk, absl::MakeSpan(any)).code(), absl::StatusCode::kUnimplemented);
}

// Packed 1-row products inside one shared call whose outputs start off the 16-row panels
// (40 + 24 rows, chunks of 16 split over 2 threads): the same values as one MatMul each.
TEST(MatMul, PackedSharedProductsEqualSeparateProducts) {
  const int64_t cols = 576;
  const auto wa = RandomWeightBytes(WeightType::kQ4_1, 40, cols, 1);
  const auto wb = RandomWeightBytes(WeightType::kQ8_0, 24, cols, 2);
  auto va = MakeWeightView(WeightType::kQ4_1, wa.data(), wa.size(), 40, cols).value();
  auto vb = MakeWeightView(WeightType::kQ8_0, wb.data(), wb.size(), 24, cols).value();
  std::vector<uint8_t> pa(static_cast<size_t>(PackedWeightBytes(va)));
  std::vector<uint8_t> pb(static_cast<size_t>(PackedWeightBytes(vb)));
  ASSERT_TRUE(PackWeights(va, absl::MakeSpan(pa)).ok());
  ASSERT_TRUE(PackWeights(vb, absl::MakeSpan(pb)).ok());
  va.packed = pa.data();
  vb.packed = pb.data();
  const auto x = RandomActivations(1, cols, 4);
  std::vector<float> ya(40), yb(24), sa(40), sb(24);
  const MatMulOutput outs[] = {{&va, ya.data(), 40}, {&vb, yb.data(), 24}};
  MatMulOptions two;
  two.threads = 2;
  ASSERT_TRUE(MatMulShared(outs, x.data(), 1, cols, cols, two).ok());
  ASSERT_TRUE(MatMul(va, x.data(), 1, cols, sa.data(), 40).ok());
  ASSERT_TRUE(MatMul(vb, x.data(), 1, cols, sb.data(), 24).ok());
  EXPECT_EQ(ya, sa);
  EXPECT_EQ(yb, sb);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatMulTest, ::testing::ValuesIn(kAllTypes),
                         [](const ::testing::TestParamInfo<WeightType>& i) {
                           return std::string(WeightTypeName(i.param));
                         });

TEST(ParallelTasks, RunsEveryTaskOnceAndNestedCallsInline) {
  // Every task runs exactly once with 1 and 2 threads; a task that starts a parallel kernel
  // (here DequantizeRowsParallel, and ParallelTasks itself) runs it inline on its thread
  // instead of waiting for the job the caller holds.
  const int64_t rows = 64, cols = 256;
  const auto wb = RandomWeightBytes(WeightType::kQ4_1, rows, cols, 11);
  const auto view = MakeWeightView(WeightType::kQ4_1, wb.data(), wb.size(), rows, cols).value();
  std::vector<float> want(rows * cols);
  ASSERT_TRUE(DequantizeRows(view, 0, rows, want.data()).ok());
  const int before = ComputeThreads();
  for (int threads : {1, 2}) {
    SetComputeThreads(threads);
    const int64_t tasks = 37;
    std::vector<int> runs(tasks, 0), inner(tasks, 0);
    std::vector<std::vector<float>> out(tasks, std::vector<float>(rows * cols));
    std::vector<char> ok(tasks, 0);  // not vector<bool>: tasks write it concurrently
    ParallelTasks(tasks, [&](int64_t t) {
      ++runs[t];
      ok[t] = DequantizeRowsParallel(view, 0, rows, out[t].data()).ok();
      ParallelTasks(3, [&](int64_t) { ++inner[t]; });
    });
    for (int64_t t = 0; t < tasks; ++t) {
      EXPECT_EQ(runs[t], 1) << "task " << t << ", " << threads << " threads";
      EXPECT_EQ(inner[t], 3) << "task " << t;
      EXPECT_TRUE(ok[t]);
      EXPECT_EQ(out[t], want) << "task " << t;
    }
  }
  SetComputeThreads(before);
}

TEST(MatMul, ResultsDoNotDependOnThreadsOrBatching) {
  // Within one kernel family (vector kernels: amx = 0; AMX tiles: amx = 1, where the CPU has
  // them), the same activation row gives bit-identical outputs alone, in a batch of 64, and
  // with 1 or 2 threads (fixed row partition; each output is one dot call or one lane of a
  // tile panel). The default (amx = -1) picks the family by the batch size: tiles from
  // kAmxMinRows rows, which equal the scalar reference bit for bit (MatMulAmx below).
  // The many-row kernels (family 2: rows_kernels = 1, amx = 0) run from kRowsFnMinRows = 4
  // rows, so their smallest batch is 4 rows: rows r..r+3 against the batch of 64.
  std::vector<int> families = {0, 2};
  if (AmxInt8Supported()) families.push_back(1);
  for (int family : families) {
    const int amx = family == 1 ? 1 : 0;
    const int rows_kernels = family == 2 ? 1 : 0;
    const int64_t small = family == 2 ? 4 : 1;
    for (WeightType type : {WeightType::kQ4_1, WeightType::kQ8_0, WeightType::kQ6_K}) {
      SCOPED_TRACE(::testing::Message() << WeightTypeName(type) << " family=" << family);
      const int64_t rows = 96, cols = 512, n = 64;
      const auto wb = RandomWeightBytes(type, rows, cols, 5);
      const auto view = MakeWeightView(type, wb.data(), wb.size(), rows, cols).value();
      const auto x = RandomActivations(n, cols, 6);
      std::vector<float> batch(n * rows), single(small * rows);
      MatMulOptions two;
      two.threads = 2;
      two.amx = amx;
      two.rows_kernels = rows_kernels;
      ASSERT_TRUE(MatMul(view, x.data(), n, cols, batch.data(), rows, two).ok());
      for (int64_t r = 0; r + small <= n; r += 9) {
        MatMulOptions one;
        one.threads = 1;
        one.amx = amx;
        one.rows_kernels = rows_kernels;
        ASSERT_TRUE(MatMul(view, x.data() + r * cols, small, cols, single.data(), rows, one).ok());
        for (int64_t o = 0; o < small * rows; ++o) ASSERT_EQ(single[o], batch[r * rows + o]);
      }
    }
  }
}

// AMX-INT8 tile panels vs the scalar reference: bit for bit, for every 32-value block type,
// panels that are not whole (rows % 16 != 0, n % 16 != 0), 1 and 2 threads, and rows of 18
// and 48 blocks (SmolLM2's 576 and 1536 columns).
TEST(MatMulAmx, TilesEqualScalarReferenceBitForBit) {
  if (!AmxInt8Supported()) {
    MatMulOptions opt;
    opt.amx = 1;
    const auto wb = RandomWeightBytes(WeightType::kQ4_1, 16, 64, 1);
    const auto view = MakeWeightView(WeightType::kQ4_1, wb.data(), wb.size(), 16, 64).value();
    const auto x = RandomActivations(1, 64, 2);
    std::vector<float> y(16);
    EXPECT_EQ(MatMul(view, x.data(), 1, 64, y.data(), 16, opt).code(),
              absl::StatusCode::kFailedPrecondition);
    GTEST_SKIP() << "this CPU/OS has no AMX-INT8 (or refused the tile state): requesting the "
                    "tiles is refused with kFailedPrecondition, as checked";
  }
  for (WeightType type : {WeightType::kQ4_0, WeightType::kQ4_1, WeightType::kQ5_0,
                          WeightType::kQ5_1, WeightType::kQ8_0}) {
    for (int64_t cols : {int64_t{576}, int64_t{1536}}) {
      const int64_t rows = 40;
      const auto wb = RandomWeightBytes(type, rows, cols, 11 + cols);
      const auto blocks_view = MakeWeightView(type, wb.data(), wb.size(), rows, cols).value();
      // The tiles read the packed layout where it is attached (Q4_0/Q4_1/Q8_0): the same
      // codes and scales, so the same bits.
      std::vector<uint8_t> packed(static_cast<size_t>(PackedWeightBytes(blocks_view)));
      WeightView packed_view = blocks_view;
      if (PackedLayoutSupported(type)) {
        ASSERT_TRUE(PackWeights(blocks_view, absl::MakeSpan(packed)).ok());
        packed_view.packed = packed.data();
      }
      for (int pass = 0; pass < 2; ++pass) {
        if (pass == 1 && packed_view.packed == nullptr) continue;
        const WeightView& view = pass == 0 ? blocks_view : packed_view;
        for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{16}, int64_t{17}, int64_t{40}}) {
          const auto x = RandomActivations(n, cols, 7 + n);
          std::vector<float> ref(static_cast<size_t>(n * rows));
          MatMulOptions scalar;
          scalar.isa = static_cast<int>(Isa::kScalar);
          scalar.amx = 0;
          ASSERT_TRUE(MatMul(view, x.data(), n, cols, ref.data(), rows, scalar).ok());
          for (int threads : {1, 2}) {
            SCOPED_TRACE(::testing::Message()
                         << WeightTypeName(type) << " cols " << cols << " n " << n << " threads "
                         << threads << " packed " << (view.packed != nullptr));
            MatMulOptions opt;
            opt.amx = 1;
            opt.threads = threads;
            std::vector<float> y(static_cast<size_t>(n * (rows + 3)), -7.0f);
            ASSERT_TRUE(MatMul(view, x.data(), n, cols, y.data(), rows + 3, opt).ok());
            for (int64_t r = 0; r < n; ++r) {
              for (int64_t o = 0; o < rows; ++o)
                ASSERT_EQ(y[r * (rows + 3) + o], ref[r * rows + o]) << "row " << r << " out " << o;
              for (int64_t o = rows; o < rows + 3; ++o)
                ASSERT_EQ(y[r * (rows + 3) + o], -7.0f) << "wrote past the row";
            }
            // The default picks the tiles from kAmxMinRows rows on.
            if (n >= kAmxMinRows && threads == 2) {
              MatMulOptions def;
              def.threads = 2;
              std::vector<float> yd(static_cast<size_t>(n * rows));
              ASSERT_TRUE(MatMul(view, x.data(), n, cols, yd.data(), rows, def).ok());
              ASSERT_EQ(yd, ref);
            }
          }
        }
      }
    }
  }
}

TEST(MatMul, SharedActivationsEqualSeparateProducts) {
  // n = 5 >= kAmxMinRows: on CPUs with AMX, Q4_1 and Q8_0 run on the tiles and Q4_K on the
  // vector kernels within the same shared call.
  const int64_t cols = 256, n = 5;
  const auto wa = RandomWeightBytes(WeightType::kQ4_1, 40, cols, 1);
  const auto wb = RandomWeightBytes(WeightType::kQ8_0, 24, cols, 2);
  const auto wc = RandomWeightBytes(WeightType::kQ4_K, 8, cols, 3);
  const auto va = MakeWeightView(WeightType::kQ4_1, wa.data(), wa.size(), 40, cols).value();
  const auto vb = MakeWeightView(WeightType::kQ8_0, wb.data(), wb.size(), 24, cols).value();
  const auto vc = MakeWeightView(WeightType::kQ4_K, wc.data(), wc.size(), 8, cols).value();
  const auto x = RandomActivations(n, cols, 4);
  std::vector<float> ya(n * 40), yb(n * 24), yc(n * 8), sa(n * 40), sb(n * 24), sc(n * 8);
  const MatMulOutput outs[] = {{&va, ya.data(), 40}, {&vb, yb.data(), 24}, {&vc, yc.data(), 8}};
  MatMulOptions two;
  two.threads = 2;
  ASSERT_TRUE(MatMulShared(outs, x.data(), n, cols, cols, two).ok());
  ASSERT_TRUE(MatMul(va, x.data(), n, cols, sa.data(), 40).ok());
  ASSERT_TRUE(MatMul(vb, x.data(), n, cols, sb.data(), 24).ok());
  ASSERT_TRUE(MatMul(vc, x.data(), n, cols, sc.data(), 8).ok());
  EXPECT_EQ(ya, sa);
  EXPECT_EQ(yb, sb);
  EXPECT_EQ(yc, sc);
}

TEST(MatMul, RejectsBadShapesWithClearErrors) {
  std::vector<uint8_t> buf(4096);
  auto v = MakeWeightView(WeightType::kQ4_K, buf.data(), buf.size(), 2, 576);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(v.status().message().find("multiple of 256, got 576"), std::string::npos) << v.status();
  v = MakeWeightView(WeightType::kQ8_0, buf.data(), buf.size(), 1000, 64);  // 68,000 bytes
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDataLoss) << v.status();
  v = MakeWeightView(static_cast<WeightType>(10), buf.data(), buf.size(), 1, 256);  // Q2_K
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kUnimplemented);
  auto ok = MakeWeightView(WeightType::kQ8_0, buf.data(), buf.size(), 4, 64).value();
  std::vector<float> x(64), y(4);
  EXPECT_EQ(MatMul(ok, x.data(), 1, 32, y.data(), 4).code(), absl::StatusCode::kInvalidArgument)
      << "x_stride < cols";
  EXPECT_EQ(MatMul(ok, x.data(), 1, 64, y.data(), 3).code(), absl::StatusCode::kInvalidArgument)
      << "y_stride < rows";
  EXPECT_EQ(MatMul(ok, x.data(), -1, 64, y.data(), 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MatMul(ok, x.data(), 0, 64, y.data(), 4).ok());
}

TEST(MatMul, UnsupportedForcedIsaIsAnError) {
  std::vector<uint8_t> buf(34 * 2);
  auto v = MakeWeightView(WeightType::kQ8_0, buf.data(), buf.size(), 1, 64).value();
  std::vector<float> x(64), y(1);
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    MatMulOptions o;
    o.isa = static_cast<int>(isa);
    const Status s = MatMul(v, x.data(), 1, 64, y.data(), 1, o);
    if (IsaSupported(isa)) {
      EXPECT_TRUE(s.ok()) << s;
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
      std::printf("ISA %s is not available on this CPU: refused as expected\n", IsaName(isa));
    }
  }
  std::printf("ISA variants on this CPU: ");
  for (Isa i : SupportedIsas()) std::printf("%s ", IsaName(i));
  std::printf("(best: %s)\n", IsaName(BestIsa()));
}

TEST(MatMul, DequantizeValuesMatchesRows) {
  for (WeightType type : kAllTypes) {
    const BlockFormat f = WeightBlockFormat(type).value();
    const int64_t cols = f.values == 1 ? 24 : f.values * 2;
    const auto wb = RandomWeightBytes(type, 3, cols, 8);
    const auto view = MakeWeightView(type, wb.data(), wb.size(), 3, cols).value();
    std::vector<float> a(3 * cols), b(3 * cols);
    ASSERT_TRUE(DequantizeRows(view, 0, 3, a.data()).ok());
    ASSERT_TRUE(DequantizeValues(type, wb.data(), wb.size(), 3 * cols, b.data()).ok());
    EXPECT_EQ(a, b) << WeightTypeName(type);
    EXPECT_EQ(DequantizeValues(type, wb.data(), wb.size() - 1, 3 * cols, b.data()).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace polykv::kernels

namespace polykv::kernels {
namespace {

TEST(MatMul, SimdActivationQuantizerWritesTheScalarBytes) {
#ifdef POLYKV_HAVE_AVX2_KERNELS
  if (!IsaSupported(Isa::kAvx2)) GTEST_SKIP() << "this CPU has no AVX2";
  for (int64_t nb : {1, 3, 4, 18, 48}) {
    std::vector<float> x = RandomActivations(1, nb * 32, 77 + nb);
    // Exact ties of x / d: x = (k + 0.5) * amax / 127 with amax = 127 (so id = 1).
    x[0] = 127.0f;
    for (int i = 1; i < 8 && i < nb * 32; ++i) x[i] = static_cast<float>(i) + 0.5f;
    for (bool permuted : {false, true}) {
      std::vector<uint8_t> a(static_cast<size_t>(mm::ActQ8RowBytes(nb))), b(a.size());
      mm::QuantizeActQ8(x.data(), nb * 32, permuted, a.data());
      mm::QuantizeActQ8Avx2(x.data(), nb * 32, permuted, b.data());
      EXPECT_EQ(a, b) << "nb=" << nb << " permuted=" << permuted;
    }
  }
#else
  GTEST_SKIP() << "built without the AVX2 kernels";
#endif
}

}  // namespace
}  // namespace polykv::kernels
