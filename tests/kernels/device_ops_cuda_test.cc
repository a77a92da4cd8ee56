// CUDA vs CPU for the agent-step kernels of device_ops.h (label gpu). Tolerances, as
// device_ops.h states them:
//  - dequantization, embedding rows, RoPE, residual add, argmax: bit-identical to the CPU;
//  - matrix products with n <= 16 rows (and quantized weights at any n): bit-identical to the
//    CPU emulation of the warp's order (block_math.h MatVecRowWarpOrder);
//  - cuBLAS products (n > 16, F32/F16/BF16): |err| <= (gamma(cols + 6) + r) sum_i |w_i x_i|
//    against the f64 product, r = 0 (F32), 2^-11 (F16), 2^-8 (BF16): the activations'
//    rounding to the weight's type;
//  - RMSNorm: relative 3e-7 (the f64 sum of squares in another order: 1 ulp of the scale,
//    then the two f32 multiplies);
//  - SiLU-gate: relative 1e-6 (+1e-30 absolute): CUDA's expf is within 2 ulp;
//  - top-p sampling: the same ids as the CPU for 64 draws.
// Every test skips (visibly) without a CUDA build or a device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "device_test_util.h"
#include "polykv/kernels/block_math.h"
#include "polykv/kernels/device_ops.h"
#include "polykv/kernels/ops.h"
#include "polykv/kernels/sampling.h"
#if defined(POLYKV_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace polykv::kernels {
namespace {

using testing::Gamma;
using testing::kDeviceTypes;
using testing::RandomRows;
using testing::RandomWeightBytes;

#if defined(POLYKV_HAVE_CUDA)
#define POLYKV_REQUIRE_CUDA_DEVICE()                                    \
  do {                                                                  \
    const Status st_ = CheckDeviceAvailable(Device::kCuda);             \
    if (!st_.ok()) GTEST_SKIP() << "no CUDA device: " << st_.message(); \
  } while (0)
#else
#define POLYKV_REQUIRE_CUDA_DEVICE() GTEST_SKIP() << "built without CUDA"
#endif

#if defined(POLYKV_HAVE_CUDA)
// Device copy of a host vector (`pad` extra leading bytes: the data starts at get()).
template <typename T>
class Dev {
 public:
  explicit Dev(size_t n, size_t pad = 0) : n_(n), pad_(pad) {
    EXPECT_EQ(cudaMalloc(&raw_, n * sizeof(T) + pad + 16), cudaSuccess);
  }
  explicit Dev(const std::vector<T>& h, size_t pad = 0) : Dev(h.size(), pad) {
    EXPECT_EQ(cudaMemcpy(get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  ~Dev() { cudaFree(raw_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() { return reinterpret_cast<T*>(static_cast<char*>(raw_) + pad_); }
  std::vector<T> ToHost() {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<T> h(n_);
    EXPECT_EQ(cudaMemcpy(h.data(), get(), n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

 private:
  void* raw_ = nullptr;
  size_t n_ = 0, pad_ = 0;
};

// Whether `got` (a device result brought to the host) equals `want` bit for bit.
::testing::AssertionResult SameBits(const std::vector<float>& want, const std::vector<float>& got) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " values, want " << want.size();
  if (std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) != 0)
    return ::testing::AssertionFailure() << "the bits differ";
  return ::testing::AssertionSuccess();
}

WeightView ViewAt(WeightType t, const void* data, int64_t rows, int64_t cols) {
  const BlockFormat f = WeightBlockFormat(t).value();
  return MakeWeightView(t, data, static_cast<uint64_t>(rows * cols / f.values * f.bytes), rows,
                        cols)
      .value();
}

// DeviceMatMul on the GPU of random `t` weights [rows][cols] (RandomWeightBytes seed `seed`)
// by `n` random rows (RandomRows seed `seed` + 1): every output within (Gamma(cols + 6) + r)
// sum_i |w_i x_i| of the f64 product of the dequantized weights (a fatal failure names the
// first that is not). `*worst` is the largest |err| / sum_i |w_i x_i|.
void ExpectMatMulWithinBound(WeightType t, int64_t rows, int64_t cols, int64_t n, uint64_t seed,
                             double r, double* worst) {
  const auto bytes = RandomWeightBytes(t, rows, cols, seed);
  const auto x = RandomRows(n, cols, seed + 1);
  Dev<uint8_t> dw(bytes);
  Dev<float> dx(x), dy(static_cast<size_t>(n * rows));
  const Status st = DeviceMatMul(ViewAt(t, dw.get(), rows, cols), dx.get(), n, cols, dy.get(), rows,
                                 Device::kCuda);
  ASSERT_TRUE(st.ok()) << st;
  const auto y = dy.ToHost();
  std::vector<float> deq(rows * cols);
  ASSERT_TRUE(DequantizeRows(ViewAt(t, bytes.data(), rows, cols), 0, rows, deq.data()).ok());
  *worst = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < rows; ++o) {
      double exact = 0, mag = 0;
      for (int64_t c = 0; c < cols; ++c) {
        exact += double{deq[o * cols + c]} * x[i * cols + c];
        mag += std::fabs(double{deq[o * cols + c]} * x[i * cols + c]);
      }
      const double err = std::fabs(y[i * rows + o] - exact);
      *worst = std::max(*worst, err / mag);
      ASSERT_LE(err, (Gamma(cols + 6) + r) * mag) << "row " << i << " out " << o;
    }
}

float Emulated(WeightType t, const uint8_t* row, int64_t cols, const float* x) {
  float r = 0;
  POLYKV_DISPATCH_DEVICE_WEIGHT_TYPE(static_cast<uint32_t>(t), kType, ADD_FAILURE(),
                                     r = blocks::MatVecRowWarpOrder<kType>(row, cols, x));
  return r;
}
#endif

TEST(DeviceOpsCuda, DequantizeRowsEqualsCpuByteForByte) {
  POLYKV_REQUIRE_CUDA_DEVICE();
#if defined(POLYKV_HAVE_CUDA)
  for (WeightType t : kDeviceTypes) {
    for (size_t pad : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << WeightTypeName(t) << " offset " << pad);
      const int64_t rows = 37, cols = 576;
      const auto bytes = RandomWeightBytes(t, rows, cols, 7);
      const WeightView hw = ViewAt(t, bytes.data(), rows, cols);
      Dev<uint8_t> dw(bytes, pad);
      Dev<float> out(static_cast<size_t>((rows - 3) * cols));
      const Status st =
          DeviceDequantizeRows(ViewAt(t, dw.get(), rows, cols), 3, rows, out.get(), Device::kCuda);
      ASSERT_TRUE(st.ok()) << st;
      std::vector<float> ref((rows - 3) * cols);
      ASSERT_TRUE(DequantizeRows(hw, 3, rows, ref.data()).ok());
      EXPECT_TRUE(SameBits(ref, out.ToHost()));
    }
  }
#endif
}

TEST(DeviceOpsCuda, WarpMatMulEqualsTheCpuEmulationBitForBit) {
  POLYKV_REQUIRE_CUDA_DEVICE();
#if defined(POLYKV_HAVE_CUDA)
  struct Shape {
    int64_t rows, cols;
  };
  for (WeightType t : kDeviceTypes) {
    for (Shape s : {Shape{576, 576}, Shape{193, 1536}, Shape{5, 64}}) {
      for (int64_t n : {1, 2, 3, 7, 16, 21}) {
        for (size_t pad : {0, 1}) {
          SCOPED_TRACE(::testing::Message() << WeightTypeName(t) << " " << s.rows << "x" << s.cols
                                            << " n " << n << " offset " << pad);
          const auto bytes = RandomWeightBytes(t, s.rows, s.cols, 3 + s.rows);
          const int64_t xs = s.cols + 5, ys = s.rows + 3;
          const auto x = RandomRows(n, xs, 11 + n);
          Dev<uint8_t> dw(bytes, pad);
          Dev<float> dx(x), dy(static_cast<size_t>(n * ys));
          DeviceMatMulOptions o;
          o.blas = 0;  // the warp kernels also for n > 16 (launches of 16 rows)
          const Status st = DeviceMatMul(ViewAt(t, dw.get(), s.rows, s.cols), dx.get(), n, xs,
                                         dy.get(), ys, Device::kCuda, nullptr, o);
          ASSERT_TRUE(st.ok()) << st;
          const auto y = dy.ToHost();
          const int64_t rb = ViewAt(t, bytes.data(), s.rows, s.cols).row_bytes;
          int64_t mismatches = 0;
          for (int64_t r = 0; r < n; ++r)
            for (int64_t oo = 0; oo < s.rows; ++oo) {
              const float want = Emulated(t, bytes.data() + oo * rb, s.cols, x.data() + r * xs);
              if (std::memcmp(&want, &y[r * ys + oo], 4) != 0 && ++mismatches <= 3)
                ADD_FAILURE() << "row " << r << " out " << oo << ": " << y[r * ys + oo]
                              << " != " << want;
            }
          EXPECT_EQ(mismatches, 0);
        }
      }
    }
  }
#endif
}

TEST(DeviceOpsCuda, CublasMatMulIsWithinItsBound) {
  POLYKV_REQUIRE_CUDA_DEVICE();
#if defined(POLYKV_HAVE_CUDA)
  for (WeightType t : {WeightType::kF32, WeightType::kF16, WeightType::kBF16}) {
    for (int64_t n : {17, 64}) {
      SCOPED_TRACE(::testing::Message() << WeightTypeName(t) << " n " << n);
      const double r16 = t == WeightType::kF32 ? 0.0 : t == WeightType::kF16 ? 0x1.0p-11 : 0x1.0p-8;
      double worst = 0;
      ASSERT_NO_FATAL_FAILURE(ExpectMatMulWithinBound(t, 300, 576, n, 5, r16, &worst));
      std::printf("cuBLAS %s n %lld: worst |err| / sum|wx| = %.3g\n", WeightTypeName(t),
                  static_cast<long long>(n), worst);
    }
  }
#endif
}

// Block-quantized weights and a prefill's rows (>= kDeviceGemmMinRows): dequantized to f32 +
// cublasSgemm, within the f32 bound of the exact product of the dequantized weights.
TEST(DeviceOpsCuda, QuantizedPrefillGemmIsWithinItsBound) {
  POLYKV_REQUIRE_CUDA_DEVICE();
#if defined(POLYKV_HAVE_CUDA)
  for (WeightType t : kDeviceTypes) {
    if (t == WeightType::kF32 || t == WeightType::kF16 || t == WeightType::kBF16) continue;
    SCOPED_TRACE(WeightTypeName(t));
    double worst = 0;
    ASSERT_NO_FATAL_FAILURE(
        ExpectMatMulWithinBound(t, 200, 576, kDeviceGemmMinRows + 9, 31, 0.0, &worst));
  }
#endif
}

TEST(DeviceOpsCuda, EmbedRowsEqualsDequantizedRows) {
  POLYKV_REQUIRE_CUDA_DEVICE();
#if defined(POLYKV_HAVE_CUDA)
  for (WeightType t : kDeviceTypes) {
    SCOPED_TRACE(WeightTypeName(t));
    const int64_t rows = 50, cols = 128;
    const auto bytes = RandomWeightBytes(t, rows, cols, 2);
    const std::vector<int32_t> ids = {49, 0, 7, 7, 50};  // 50 is out of range: a NaN row
    Dev<uint8_t> dw(bytes);
    Dev<int32_t> did(ids);
    const int64_t os = cols + 4;
    Dev<float> out(static_cast<size_t>(ids.size() * os));
    ASSERT_TRUE(
        DeviceEmbedRows(ViewAt(t, dw.get(), rows, cols), did.get(), 5, out.get(), os, Device::kCuda)
            .ok());
    const auto got = out.ToHost();
    const WeightView hw = ViewAt(t, bytes.data(), rows, cols);
    std::vector<float> ref(cols);
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(DequantizeRows(hw, ids[r], ids[r] + 1, ref.data()).ok());
      EXPECT_EQ(std::memcmp(ref.data(), got.data() + r * os, cols * 4), 0) << "row " << r;
    }
    for (int64_t i = 0; i < cols; ++i) EXPECT_TRUE(std::isnan(got[4 * os + i]));
  }
#endif
}

TEST(DeviceOpsCuda, ElementwiseOpsMatchTheCpu) {
  POLYKV_REQUIRE_CUDA_DEVICE();
#if defined(POLYKV_HAVE_CUDA)
  // RMSNorm: 5 rows of 576 (in place on the device).
  const int64_t rows = 5, dim = 576;
  const auto x = RandomRows(rows, dim, 1), w = RandomRows(1, dim, 2);
  std::vector<float> ref(x.size());
  RmsNormRows(x.data(), w.data(), rows, dim, 1e-5f, ref.data());
  Dev<float> dx(x), dw(w);
  ASSERT_TRUE(
      DeviceRmsNormRows(dx.get(), dw.get(), rows, dim, 1e-5f, dx.get(), Device::kCuda).ok());
  auto got = dx.ToHost();
  for (size_t i = 0; i < ref.size(); ++i)
    ASSERT_LE(std::fabs(got[i] - ref[i]), 3e-7 * std::fabs(ref[i])) << i;

  // SiLU-gate over a wide range (gate N(0, 4^2)) and the residual add.
  auto gate = RandomRows(1, 10007, 3);
  for (auto& g : gate) g *= 4;
  const auto up = RandomRows(1, 10007, 4);
  std::vector<float> silu(gate.size()), sum(gate.size());
  SiluMul(gate.data(), up.data(), static_cast<int64_t>(gate.size()), silu.data());
  for (size_t i = 0; i < gate.size(); ++i) sum[i] = gate[i] + up[i];
  Dev<float> dg(gate), du(up), ds(gate.size()), da(gate.size());
  ASSERT_TRUE(DeviceSiluMul(dg.get(), du.get(), 10007, ds.get(), Device::kCuda).ok());
  ASSERT_TRUE(DeviceAdd(dg.get(), du.get(), 10007, da.get(), Device::kCuda).ok());
  const auto gs = ds.ToHost(), ga = da.ToHost();
  for (size_t i = 0; i < gate.size(); ++i) {
    ASSERT_LE(std::fabs(gs[i] - silu[i]), 1e-6 * std::fabs(silu[i]) + 1e-30) << i;
    ASSERT_EQ(ga[i], sum[i]) << i;
  }

  // RoPE on the query part of 3 packed q|k rows (9 heads of 64, then 3 KV heads).
  const int32_t heads = 9, hd = 64;
  const int64_t n = 3, stride = (9 + 3) * hd;
  auto q = RandomRows(n, stride, 5);
  const auto cs = RandomRows(n, hd, 6), sn = RandomRows(n, hd, 7);
  Dev<float> dq(q), dc(cs), dsn(sn);
  ASSERT_TRUE(
      DeviceRopeRows(dq.get(), n, stride, heads, hd, dc.get(), dsn.get(), Device::kCuda).ok());
  ASSERT_TRUE(
      DeviceRopeRows(q.data(), n, stride, heads, hd, cs.data(), sn.data(), Device::kCpu).ok());
  EXPECT_TRUE(SameBits(q, dq.ToHost()));
#endif
}

// The residual add fused into the product (accumulate): bit for bit the product followed by
// DeviceAdd, for a quantized and a float type and more rows than one warp launch takes.
TEST(DeviceOpsCuda, AccumulateEqualsProductThenAdd) {
  POLYKV_REQUIRE_CUDA_DEVICE();
#if defined(POLYKV_HAVE_CUDA)
  for (WeightType t : {WeightType::kQ4_1, WeightType::kF16}) {
    const int64_t rows = 96, cols = 576, n = 20;
    const auto bytes = RandomWeightBytes(t, rows, cols, 21);
    const auto x = RandomRows(n, cols, 22), y0 = RandomRows(n, rows, 23);
    Dev<uint8_t> dw(bytes);
    Dev<float> dx(x), dprod(y0.size()), dsum(y0), dacc(y0);
    const WeightView w = ViewAt(t, dw.get(), rows, cols);
    DeviceMatMulOptions warp;
    warp.blas = 0;
    ASSERT_TRUE(
        DeviceMatMul(w, dx.get(), n, cols, dprod.get(), rows, Device::kCuda, nullptr, warp).ok());
    ASSERT_TRUE(DeviceAdd(dsum.get(), dprod.get(), n * rows, dsum.get(), Device::kCuda).ok());
    DeviceMatMulOptions acc;
    acc.accumulate = true;
    ASSERT_TRUE(
        DeviceMatMul(w, dx.get(), n, cols, dacc.get(), rows, Device::kCuda, nullptr, acc).ok());
    EXPECT_TRUE(SameBits(dsum.ToHost(), dacc.ToHost())) << static_cast<int>(t);
  }
#endif
}

// K/V rows appended to a [kv_heads][capacity][head_dim] cache at a host position and at a
// position read from device memory: the same bytes as the CPU's copy.
TEST(DeviceOpsCuda, AppendKvRowsAtHostAndDevicePositionsEqualsTheCpu) {
  POLYKV_REQUIRE_CUDA_DEVICE();
#if defined(POLYKV_HAVE_CUDA)
  const int32_t kv = 3, hd = 64;
  const int64_t cap = 40, n = 5, stride = (9 + 2 * kv) * hd;  // rows of a packed q|k|v
  const auto src = RandomRows(n, stride, 11);
  std::vector<float> cpu(static_cast<size_t>(kv * cap * hd), -1.0f);
  ASSERT_TRUE(
      DeviceAppendKvRows(src.data(), n, stride, kv, hd, cpu.data(), cap, 7, nullptr, Device::kCpu)
          .ok());
  const std::vector<float> init(cpu.size(), -1.0f);
  Dev<float> ds(src), dh(init), dd(init);
  Dev<int64_t> dpos(std::vector<int64_t>{7});
  ASSERT_TRUE(
      DeviceAppendKvRows(ds.get(), n, stride, kv, hd, dh.get(), cap, 7, nullptr, Device::kCuda)
          .ok());
  ASSERT_TRUE(
      DeviceAppendKvRows(ds.get(), n, stride, kv, hd, dd.get(), cap, 0, dpos.get(), Device::kCuda)
          .ok());
  EXPECT_TRUE(SameBits(cpu, dh.ToHost()));
  EXPECT_TRUE(SameBits(cpu, dd.ToHost()));
  EXPECT_EQ(cpu[(1 * cap + 7) * hd + 3], src[1 * hd + 3]);  // head 1, first row
  EXPECT_EQ(cpu[(1 * cap + 6) * hd + 3], -1.0f);            // untouched before pos
  // A host position past the capacity is refused before any launch.
  EXPECT_EQ(DeviceAppendKvRows(ds.get(), n, stride, kv, hd, dh.get(), cap, cap - 2, nullptr,
                               Device::kCuda)
                .code(),
            absl::StatusCode::kInvalidArgument);
#endif
}

// A batched decode step's K/V rows into their sessions' slots: the CPU's bytes; a row whose
// slot or position is out of range is skipped on the device (nothing written).
TEST(DeviceOpsCuda, AppendKvSlotsEqualsTheCpuAndSkipsRowsOutOfRange) {
  POLYKV_REQUIRE_CUDA_DEVICE();
#if defined(POLYKV_HAVE_CUDA)
  const int32_t kv = 3, hd = 64;
  const int64_t slots = 5, cap = 40, n = 4, stride = (9 + 2 * kv) * hd;
  const auto src = RandomRows(n, stride, 12);
  const std::vector<int32_t> slot = {3, 0, 4, 1};
  const std::vector<int64_t> len = {1, 40, 17, 2};
  std::vector<float> cpu(static_cast<size_t>(slots * kv * cap * hd), -1.0f);
  const std::vector<float> init = cpu;
  ASSERT_TRUE(DeviceAppendKvSlots(src.data(), n, stride, kv, hd, cpu.data(), slots, cap,
                                  slot.data(), len.data(), Device::kCpu)
                  .ok());
  Dev<float> ds(src), dslab(init);
  Dev<int32_t> dslot(slot);
  Dev<int64_t> dlen(len);
  ASSERT_TRUE(DeviceAppendKvSlots(ds.get(), n, stride, kv, hd, dslab.get(), slots, cap, dslot.get(),
                                  dlen.get(), Device::kCuda)
                  .ok());
  EXPECT_TRUE(SameBits(cpu, dslab.ToHost()));
  Dev<float> dbad(init);
  Dev<int32_t> bad_slot(std::vector<int32_t>{5, -1, 0, 1});
  Dev<int64_t> bad_len(std::vector<int64_t>{1, 1, 41, 0});
  ASSERT_TRUE(DeviceAppendKvSlots(ds.get(), n, stride, kv, hd, dbad.get(), slots, cap,
                                  bad_slot.get(), bad_len.get(), Device::kCuda)
                  .ok());
  EXPECT_TRUE(SameBits(init, dbad.ToHost())) << "a row out of range was written";
#endif
}

TEST(DeviceOpsCuda, ArgmaxAndTopPSamplingPickTheCpuIds) {
  POLYKV_REQUIRE_CUDA_DEVICE();
#if defined(POLYKV_HAVE_CUDA)
  const int64_t vocab = 49152, rows = 4;
  auto logits = RandomRows(rows, vocab, 9);
  for (auto& v : logits) v *= 3;
  logits[1 * vocab + 100] = logits[1 * vocab + 40000] = 50.0f;       // a tie: id 100 wins
  logits[2 * vocab + 7] = std::numeric_limits<float>::quiet_NaN();   // NaN counts as largest
  for (int64_t i = 0; i < vocab; ++i) logits[3 * vocab + i] = 1.0f;  // all equal: id 0
  Dev<float> dl(logits);
  Dev<int32_t> dids(rows);
  ASSERT_TRUE(DeviceArgmaxRows(dl.get(), rows, vocab, vocab, dids.get(), Device::kCuda).ok());
  const auto ids = dids.ToHost();
  for (int64_t r = 0; r < rows; ++r)
    EXPECT_EQ(ids[r], ArgmaxLogits(logits.data() + r * vocab, vocab)) << "row " << r;
  EXPECT_EQ(ids[1], 100);
  EXPECT_EQ(ids[2], 7);
  EXPECT_EQ(ids[3], 0);

  std::mt19937_64 rng(42);
  Dev<int32_t> did(1);
  for (int k = 0; k < 64; ++k) {
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    const float temp = k % 2 ? 0.7f : 1.3f, top_p = k % 3 ? 0.9f : 0.5f;
    ASSERT_TRUE(DeviceSampleTopP(dl.get(), vocab, temp, top_p, u, did.get(), Device::kCuda).ok());
    const int32_t want = SampleTopP(logits.data(), vocab, temp, top_p, u).value();
    EXPECT_EQ(did.ToHost()[0], want) << "draw " << k << " u " << u;
  }
  // Equal logits: the stable order keeps ids ascending.
  const float* flat = dl.get() + 3 * vocab;
  ASSERT_TRUE(DeviceSampleTopP(flat, vocab, 1.0f, 1.0f, 0.5, did.get(), Device::kCuda).ok());
  EXPECT_EQ(did.ToHost()[0], SampleTopP(logits.data() + 3 * vocab, vocab, 1.0f, 1.0f, 0.5).value());
#endif
}

}  // namespace
}  // namespace polykv::kernels
