// The CPU side of the device kernels (no GPU needed): block dequantization of block_math.h
// against kernels::DequantizeRows byte for byte; the warp-order emulation of the CUDA
// matrix-vector kernel against the exact product (derived bound); launch shapes; the shared
// element-wise math; the CPU sampling reference; and the device-neutral entry points'
// checks and routing (kCuda without a device or without CUDA is an error, never a CPU run).
#include "polykv/kernels/device_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "device_test_util.h"
#include "polykv/kernels/block_math.h"
#include "polykv/kernels/ops.h"
#include "polykv/kernels/ops_math.h"
#include "polykv/kernels/sampling.h"

namespace polykv::kernels {
namespace {

using testing::Gamma;
using testing::kDeviceTypes;
using testing::RandomRows;
using testing::RandomWeightBytes;

WeightView View(WeightType t, const std::vector<uint8_t>& bytes, int64_t rows, int64_t cols) {
  return MakeWeightView(t, bytes.data(), bytes.size(), rows, cols).value();
}

float RowDotEmulated(uint32_t type, const uint8_t* row, int64_t cols, const float* x) {
  float r = 0;
  POLYKV_DISPATCH_DEVICE_WEIGHT_TYPE(type, kType, ADD_FAILURE() << "type " << type,
                                     r = blocks::MatVecRowWarpOrder<kType>(row, cols, x));
  return r;
}

TEST(BlockMath, DequantizationEqualsDequantizeRowsByteForByte) {
  for (WeightType t : kDeviceTypes) {
    SCOPED_TRACE(WeightTypeName(t));
    const int64_t rows = 7, cols = 256;
    const auto bytes = RandomWeightBytes(t, rows, cols, 3 + static_cast<int>(t));
    const WeightView w = View(t, bytes, rows, cols);
    std::vector<float> ref(rows * cols), blk(rows * cols), val(rows * cols);
    ASSERT_TRUE(DequantizeRows(w, 0, rows, ref.data()).ok());
    const uint32_t type = static_cast<uint32_t>(t);
    const int vals = blocks::BlockValues(type), bb = blocks::BlockBytes(type);
    ASSERT_EQ(vals, WeightBlockFormat(t)->values);
    ASSERT_EQ(bb, WeightBlockFormat(t)->bytes);
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* row = bytes.data() + r * w.row_bytes;
      for (int64_t b = 0; b < cols / vals; ++b)
        ASSERT_TRUE(blocks::DequantizeBlock(type, row + b * bb, blk.data() + r * cols + b * vals));
      for (int64_t i = 0; i < cols; ++i) val[r * cols + i] = blocks::RowValue(type, row, i);
    }
    EXPECT_EQ(std::memcmp(ref.data(), blk.data(), ref.size() * 4), 0);
    EXPECT_EQ(std::memcmp(ref.data(), val.data(), ref.size() * 4), 0);
  }
}

TEST(BlockMath, UnalignedBlocksDequantizeTheSame) {
  // Blocks at an odd address (a view into a file mapping need not be aligned).
  for (WeightType t : kDeviceTypes) {
    SCOPED_TRACE(WeightTypeName(t));
    const auto bytes = RandomWeightBytes(t, 1, 64, 9);
    std::vector<uint8_t> shifted(bytes.size() + 1);
    std::memcpy(shifted.data() + 1, bytes.data(), bytes.size());
    std::vector<float> a(64), b(64);
    const uint32_t type = static_cast<uint32_t>(t);
    const int vals = blocks::BlockValues(type), bb = blocks::BlockBytes(type);
    for (int k = 0; k < 64 / vals; ++k) {
      blocks::DequantizeBlock(type, bytes.data() + k * bb, a.data() + k * vals);
      blocks::DequantizeBlock(type, shifted.data() + 1 + k * bb, b.data() + k * vals);
    }
    EXPECT_EQ(std::memcmp(a.data(), b.data(), 256), 0);
  }
}

TEST(BlockMath, OtherTypesAreNotDeviceTypes) {
  for (WeightType t : {WeightType::kQ4_K, WeightType::kQ5_K, WeightType::kQ6_K}) {
    EXPECT_FALSE(DeviceWeightTypeSupported(t));
    EXPECT_EQ(blocks::BlockValues(static_cast<uint32_t>(t)), 0);
    float y[256];
    const uint8_t b[256] = {};
    EXPECT_FALSE(blocks::DequantizeBlock(static_cast<uint32_t>(t), b, y));
  }
  for (WeightType t : kDeviceTypes) EXPECT_TRUE(DeviceWeightTypeSupported(t));
}

// The warp kernel's order against the exact f64 product of the dequantized weights:
// |err| <= gamma(cols + 6) * sum |w x| (cols products, each term's block-scale multiply and
// the 5 butterfly adds are further roundings of magnitude <= the sum of |w x|).
TEST(BlockMath, WarpOrderProductIsWithinTheF32Bound) {
  for (WeightType t : kDeviceTypes) {
    for (int64_t cols : {32, 576, 1536, 4096}) {
      SCOPED_TRACE(::testing::Message() << WeightTypeName(t) << " cols " << cols);
      const int64_t rows = 5;
      const auto bytes = RandomWeightBytes(t, rows, cols, 21 + cols);
      const WeightView w = View(t, bytes, rows, cols);
      const auto x = RandomRows(1, cols, 5 + cols);
      std::vector<float> deq(rows * cols);
      ASSERT_TRUE(DequantizeRows(w, 0, rows, deq.data()).ok());
      for (int64_t o = 0; o < rows; ++o) {
        double exact = 0, mag = 0;
        for (int64_t i = 0; i < cols; ++i) {
          exact += double{deq[o * cols + i]} * x[i];
          mag += std::fabs(double{deq[o * cols + i]} * x[i]);
        }
        const float got = RowDotEmulated(static_cast<uint32_t>(t), bytes.data() + o * w.row_bytes,
                                         cols, x.data());
        EXPECT_LE(std::fabs(got - exact), Gamma(cols + 6) * mag) << "row " << o;
      }
    }
  }
}

TEST(BlockMath, WarpSumOrderIsTheXorButterfly) {
  float v[32];
  for (int l = 0; l < 32; ++l) v[l] = static_cast<float>(l + 1);
  EXPECT_EQ(blocks::WarpSumOrder(v), 528.0f);
  // Order matters in f32: 1e8 + 1 - 1e8 style cancellation follows the butterfly pairs.
  float w[32] = {};
  w[0] = 1e8f;
  w[16] = -1e8f;
  w[1] = 1.0f;
  EXPECT_EQ(blocks::WarpSumOrder(w), 1.0f);  // lanes 0 and 16 cancel in the first step
}

TEST(BlockMath, LaunchShapes) {
  EXPECT_EQ(blocks::MatVecLaunchShape(576).blocks, 144);
  EXPECT_EQ(blocks::MatVecLaunchShape(577).blocks, 145);
  EXPECT_EQ(blocks::MatVecLaunchShape(1).blocks, 1);
  EXPECT_EQ(blocks::MatVecLaunchShape(49152).blocks, 12288);
  EXPECT_EQ(blocks::MatVecLaunchShape(49152).threads, 128);
  const int tiles[17] = {0, 1, 2, 4, 4, 8, 8, 8, 8, 16, 16, 16, 16, 16, 16, 16, 16};
  for (int n = 0; n <= 16; ++n) EXPECT_EQ(blocks::MatVecRowTile(n), tiles[n]) << n;
  EXPECT_EQ(blocks::MatVecRowTile(17), 0);
  EXPECT_EQ(blocks::MatVecRowTile(-1), 0);
}

TEST(OpsMath, CpuOpsUseTheSharedFunctions) {
  const int64_t dim = 96;
  const auto x = RandomRows(3, dim, 1), w = RandomRows(1, dim, 2);
  std::vector<float> out(x.size());
  RmsNormRows(x.data(), w.data(), 3, dim, 1e-5f, out.data());
  for (int64_t r = 0; r < 3; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double{x[r * dim + i]} * x[r * dim + i];
    const float inv = opmath::RmsNormInverse(ss, dim, 1e-5f);
    for (int64_t i = 0; i < dim; ++i)
      ASSERT_EQ(out[r * dim + i], opmath::RmsNormValue(x[r * dim + i], inv, w[i]));
  }
  // RoPE: head_dim 8, 2 heads, against the formula.
  std::vector<float> v = RandomRows(2, 8, 3), c = RandomRows(1, 8, 4), s = RandomRows(1, 8, 5);
  std::vector<float> ref = v;
  RopeHeads(v.data(), 2, 8, c.data(), s.data());
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 4; ++i) {
      const float a = ref[h * 8 + i], b = ref[h * 8 + i + 4];
      EXPECT_EQ(v[h * 8 + i], a * c[i] - b * s[i]);
      EXPECT_EQ(v[h * 8 + i + 4], b * c[i + 4] + a * s[i + 4]);
    }
  EXPECT_FLOAT_EQ(opmath::SiluMulValue(1.0f, 2.0f), 2.0f / (1.0f + std::exp(-1.0f)));
}

TEST(Sampling, ArgmaxTakesTheLowestIdOnTiesAndNanAsLargest) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> a = {1, 3, 3, 2};
  EXPECT_EQ(ArgmaxLogits(a.data(), 4), 1);
  const std::vector<float> b = {1, nan, 5, nan};
  EXPECT_EQ(ArgmaxLogits(b.data(), 4), 1);
  const std::vector<float> c = {-INFINITY, -INFINITY};
  EXPECT_EQ(ArgmaxLogits(c.data(), 2), 0);
  const std::vector<float> d = {-0.0f, 0.0f};
  EXPECT_EQ(ArgmaxLogits(d.data(), 2), 0);
  EXPECT_TRUE(opmath::LogitBeats(2, 5, 1, 0));
  EXPECT_FALSE(opmath::LogitBeats(1, 5, 1, 0));
  EXPECT_TRUE(opmath::LogitBeats(1, 0, 1, 5));
}

TEST(Sampling, TopPKeepsTheHeadAndWalksTheDraw) {
  // p = 0.5, 0.3, 0.2 (temperature 1): top_p 0.6 keeps ids 0 and 1 (cum 0.8).
  const std::vector<float> l = {std::log(0.2f), std::log(0.5f), std::log(0.3f)};
  EXPECT_EQ(SampleTopP(l.data(), 3, 1.0f, 0.6f, 0.0).value(), 1);
  EXPECT_EQ(SampleTopP(l.data(), 3, 1.0f, 0.6f, 0.6).value(), 1);  // 0.48 - 0.5 < 0
  EXPECT_EQ(SampleTopP(l.data(), 3, 1.0f, 0.6f, 0.7).value(), 2);  // 0.56 - 0.5 - 0.3 < 0
  EXPECT_EQ(SampleTopP(l.data(), 3, 1.0f, 0.6f, 0.999).value(), 2);
  EXPECT_EQ(SampleTopP(l.data(), 3, 1.0f, 1.0f, 0.95).value(), 0);  // the tail id 0 is kept
  EXPECT_EQ(SampleTopP(l.data(), 3, 1.0f, 0.01f, 0.9).value(), 1);  // only the head
  // Equal logits: the sort is stable, so the lowest id comes first.
  const std::vector<float> eq = {0, 0, 0, 0};
  EXPECT_EQ(SampleTopP(eq.data(), 4, 1.0f, 0.25f, 0.5).value(), 0);
  EXPECT_EQ(SampleTopP(eq.data(), 4, 1.0f, 1.0f, 0.5).value(), 2);
  // Low temperature sharpens towards the argmax.
  const std::vector<float> r = RandomRows(1, 1000, 7);
  EXPECT_EQ(SampleTopP(r.data(), 1000, 1e-4f, 0.9f, 0.99).value(), ArgmaxLogits(r.data(), 1000));
  EXPECT_EQ(SampleTopP(l.data(), 3, 0.0f, 0.5f, 0.5).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SampleTopP(l.data(), 3, 1.0f, 1.5f, 0.5).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SampleTopP(l.data(), 3, 1.0f, 0.5f, 1.0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- device-neutral entry points ------------------------------------------------------

TEST(DeviceOps, CpuRoutesToTheCpuKernels) {
  const int64_t rows = 12, cols = 64, n = 3;
  const auto bytes = RandomWeightBytes(WeightType::kQ8_0, rows, cols, 1);
  const WeightView w = View(WeightType::kQ8_0, bytes, rows, cols);
  const auto x = RandomRows(n, cols, 2);
  std::vector<float> a(n * rows), b(n * rows);
  ASSERT_TRUE(MatMul(w, x.data(), n, cols, a.data(), rows).ok());
  ASSERT_TRUE(DeviceMatMul(w, x.data(), n, cols, b.data(), rows, Device::kCpu).ok());
  EXPECT_EQ(a, b);
  const int32_t ids[2] = {5, 0};
  std::vector<float> e(2 * cols), d(cols);
  ASSERT_TRUE(DeviceEmbedRows(w, ids, 2, e.data(), cols, Device::kCpu).ok());
  ASSERT_TRUE(DequantizeRows(w, 5, 6, d.data()).ok());
  EXPECT_EQ(std::memcmp(e.data(), d.data(), cols * 4), 0);
  const int32_t bad[1] = {12};
  EXPECT_EQ(DeviceEmbedRows(w, bad, 1, e.data(), cols, Device::kCpu).code(),
            absl::StatusCode::kOutOfRange);
  std::vector<float> s(4), g = {1, -2, 3, 0.5f}, u = {2, 2, 2, 2};
  ASSERT_TRUE(DeviceAdd(g.data(), u.data(), 4, s.data(), Device::kCpu).ok());
  EXPECT_EQ(s, (std::vector<float>{3, 0, 5, 2.5f}));
  int32_t id = -1;
  ASSERT_TRUE(DeviceArgmaxRows(g.data(), 1, 4, 4, &id, Device::kCpu).ok());
  EXPECT_EQ(id, 2);
  ASSERT_TRUE(DeviceSampleTopP(g.data(), 4, 1.0f, 0.01f, 0.3, &id, Device::kCpu).ok());
  EXPECT_EQ(id, 2);
}

TEST(DeviceOps, CudaWithoutADeviceIsAnErrorNeverACpuRun) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present (tests/kernels covers it)";
#if defined(POLYKV_HAVE_CUDA)
  const absl::StatusCode want = absl::StatusCode::kFailedPrecondition;
#else
  const absl::StatusCode want = absl::StatusCode::kUnimplemented;
#endif
  EXPECT_EQ(CheckDeviceAvailable(Device::kCuda).code(), want);
  EXPECT_TRUE(CheckDeviceAvailable(Device::kCpu).ok());
  const auto bytes = RandomWeightBytes(WeightType::kF16, 4, 32, 1);
  const WeightView w = View(WeightType::kF16, bytes, 4, 32);
  std::vector<float> x(32, 1.0f), y(4, -7.0f);
  const Status st = DeviceMatMul(w, x.data(), 1, 32, y.data(), 4, Device::kCuda);
  EXPECT_EQ(st.code(), want) << st;
  EXPECT_EQ(y, std::vector<float>(4, -7.0f));  // nothing computed on the CPU
  EXPECT_EQ(DeviceRmsNormRows(x.data(), x.data(), 1, 32, 1e-5f, x.data(), Device::kCuda).code(),
            want);
  EXPECT_EQ(DeviceSiluMul(x.data(), x.data(), 32, x.data(), Device::kCuda).code(), want);
  EXPECT_EQ(DeviceAdd(x.data(), x.data(), 32, x.data(), Device::kCuda).code(), want);
  EXPECT_EQ(DeviceRopeRows(x.data(), 1, 32, 1, 32, x.data(), x.data(), Device::kCuda).code(), want);
  int32_t id = 0;
  EXPECT_EQ(DeviceArgmaxRows(x.data(), 1, 32, 32, &id, Device::kCuda).code(), want);
  EXPECT_EQ(DeviceSampleTopP(x.data(), 32, 1.0f, 0.9f, 0.5, &id, Device::kCuda).code(), want);
  EXPECT_EQ(DeviceEmbedRows(w, &id, 1, y.data(), 32, Device::kCuda).code(), want);
  EXPECT_EQ(DeviceDequantizeRows(w, 0, 1, y.data(), Device::kCuda).code(), want);
}

TEST(DeviceOps, BadArgumentsFailTheSameWayOnEveryDevice) {
  const auto bytes = RandomWeightBytes(WeightType::kQ4_0, 4, 64, 1);
  const WeightView w = View(WeightType::kQ4_0, bytes, 4, 64);
  std::vector<float> x(64), y(8);
  for (Device d : {Device::kCpu, Device::kCuda}) {
    EXPECT_EQ(DeviceMatMul(w, x.data(), 1, 32, y.data(), 4, d).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(DeviceMatMul(w, x.data(), -1, 64, y.data(), 4, d).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(DeviceMatMul(w, nullptr, 1, 64, y.data(), 4, d).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(DeviceRopeRows(x.data(), 1, 64, 1, 63, x.data(), x.data(), d).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(DeviceRopeRows(x.data(), 1, 16, 2, 16, x.data(), x.data(), d).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(DeviceArgmaxRows(x.data(), 1, 64, 32, nullptr, d).code(),
              absl::StatusCode::kInvalidArgument);
    int32_t id;
    EXPECT_EQ(DeviceSampleTopP(x.data(), 64, 1.0f, 0.0f, 0.5, &id, d).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(DeviceDequantizeRows(w, 2, 5, y.data(), d).code(),
              absl::StatusCode::kInvalidArgument);
  }
  // A K-quant has CPU kernels but no CUDA kernels: kUnimplemented on kCuda, named.
  std::vector<uint8_t> k(144 * 2);
  const WeightView wk = View(WeightType::kQ4_K, k, 2, 256);
  std::vector<float> xk(256), yk(2);
  const Status st = DeviceMatMul(wk, xk.data(), 1, 256, yk.data(), 2, Device::kCuda);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(std::string(st.message()).find("Q4_K"), std::string::npos) << st;
  EXPECT_TRUE(DeviceMatMul(wk, xk.data(), 1, 256, yk.data(), 2, Device::kCpu).ok());
}

// The K/V append of a decode step on the CPU: rows [n][kv_heads * head_dim] (stride of a
// packed q|k|v row) land at [h][pos + r][:], from a host position or a position read through
// a pointer (the CUDA graph's device position); nothing else is written; past the capacity
// is an error.
TEST(DeviceOps, AppendKvRowsCopiesEachHeadToItsPosition) {
  const int32_t kv = 2, hd = 4;
  const int64_t cap = 6, n = 2, stride = 3 * kv * hd;
  std::vector<float> src(n * stride);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  std::vector<float> a(kv * cap * hd, -1.0f), b = a;
  ASSERT_TRUE(
      DeviceAppendKvRows(src.data(), n, stride, kv, hd, a.data(), cap, 3, nullptr, Device::kCpu)
          .ok());
  const int64_t pos = 3;
  ASSERT_TRUE(
      DeviceAppendKvRows(src.data(), n, stride, kv, hd, b.data(), cap, 0, &pos, Device::kCpu).ok());
  EXPECT_EQ(a, b);
  for (int32_t h = 0; h < kv; ++h)
    for (int64_t t = 0; t < cap; ++t)
      for (int32_t d = 0; d < hd; ++d) {
        const float want = t >= 3 && t < 3 + n ? src[(t - 3) * stride + h * hd + d] : -1.0f;
        EXPECT_EQ(a[(h * cap + t) * hd + d], want) << h << " " << t << " " << d;
      }
  EXPECT_EQ(
      DeviceAppendKvRows(src.data(), n, stride, kv, hd, a.data(), cap, 5, nullptr, Device::kCpu)
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DeviceAppendKvRows(src.data(), n, kv * hd - 1, kv, hd, a.data(), cap, 0, nullptr,
                               Device::kCpu)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// A batched decode step's K/V rows land in their sessions' slots at each one's own position
// (row_length - 1) and nowhere else; a slot or position out of range is refused, naming the
// row, before anything is written.
TEST(DeviceOps, AppendKvSlotsCopiesEachRowToItsSlotAndPosition) {
  const int32_t kv = 2, hd = 4;
  const int64_t slots = 4, cap = 5, n = 3, stride = 3 * kv * hd;
  std::vector<float> src(n * stride);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  const std::vector<int32_t> slot = {2, 0, 3};
  const std::vector<int64_t> len = {1, 5, 3};  // positions 0, 4, 2
  std::vector<float> slab(slots * kv * cap * hd, -1.0f);
  ASSERT_TRUE(DeviceAppendKvSlots(src.data(), n, stride, kv, hd, slab.data(), slots, cap,
                                  slot.data(), len.data(), Device::kCpu)
                  .ok());
  for (int64_t s = 0; s < slots; ++s)
    for (int32_t h = 0; h < kv; ++h)
      for (int64_t t = 0; t < cap; ++t)
        for (int32_t d = 0; d < hd; ++d) {
          float want = -1.0f;
          for (int64_t r = 0; r < n; ++r)
            if (slot[r] == s && len[r] - 1 == t) want = src[r * stride + h * hd + d];
          EXPECT_EQ(slab[((s * kv + h) * cap + t) * hd + d], want) << s << " " << h << " " << t;
        }
  const std::vector<float> before = slab;
  for (auto [bad_slot, bad_len] : {std::pair{4, int64_t{1}}, std::pair{-1, int64_t{1}},
                                   std::pair{1, int64_t{6}}, std::pair{1, int64_t{0}}}) {
    const std::vector<int32_t> sl = {0, bad_slot, 1};
    const std::vector<int64_t> ln = {1, bad_len, 2};
    const Status st = DeviceAppendKvSlots(src.data(), n, stride, kv, hd, slab.data(), slots, cap,
                                          sl.data(), ln.data(), Device::kCpu);
    EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange) << st;
    EXPECT_NE(st.message().find("row 1"), std::string::npos) << st;
    EXPECT_EQ(slab, before) << "a refused call wrote";
  }
  EXPECT_EQ(DeviceAppendKvSlots(src.data(), n, kv * hd - 1, kv, hd, slab.data(), slots, cap,
                                slot.data(), len.data(), Device::kCpu)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DeviceAppendKvSlots(src.data(), n, stride, kv, hd, slab.data(), slots, cap, nullptr,
                                len.data(), Device::kCpu)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// y += W x (DeviceMatMulOptions::accumulate) on the CPU: the product, then one add per
// output, as DeviceAdd after the product gives.
TEST(DeviceOps, AccumulateAddsTheProductToY) {
  const int64_t rows = 5, cols = 64, n = 3;
  std::vector<float> wv(rows * cols), x(n * cols), y0(n * rows);
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = static_cast<float>((i * 7) % 13) - 6.0f;
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * static_cast<float>((i * 5) % 9);
  for (size_t i = 0; i < y0.size(); ++i) y0[i] = static_cast<float>(i) - 3.5f;
  const WeightView w =
      MakeWeightView(WeightType::kF32, wv.data(), wv.size() * 4, rows, cols).value();
  std::vector<float> prod(n * rows), want(n * rows), got = y0;
  ASSERT_TRUE(DeviceMatMul(w, x.data(), n, cols, prod.data(), rows, Device::kCpu).ok());
  for (size_t i = 0; i < want.size(); ++i) want[i] = y0[i] + prod[i];
  DeviceMatMulOptions acc;
  acc.accumulate = true;
  ASSERT_TRUE(
      DeviceMatMul(w, x.data(), n, cols, got.data(), rows, Device::kCpu, nullptr, acc).ok());
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace polykv::kernels
