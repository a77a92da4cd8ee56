// CPU vs CUDA consistency of the codec: identical packed bytes, codes and scales; decoded
// values within 1e-6 relative. Skips without a CUDA device or in a build without CUDA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "polykv/kernels/codec.h"
#include "polykv/kernels/codec_math.h"
#if defined(POLYKV_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace polykv::kernels {
namespace {

#if defined(POLYKV_HAVE_CUDA)

// Skips the current test unless a CUDA device is usable.
#define POLYKV_REQUIRE_CUDA_DEVICE()                                                             \
  do {                                                                                           \
    int count_ = 0;                                                                              \
    const cudaError_t err_ = cudaGetDeviceCount(&count_);                                        \
    if (err_ != cudaSuccess) {                                                                   \
      GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount failed: " << cudaGetErrorString(err_); \
    }                                                                                            \
    if (count_ == 0) GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount returned 0";            \
  } while (0)

// Device buffer holding a copy of a host vector (or `n` uninitialized elements).
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T) + 1), cudaSuccess);
  }
  explicit DeviceBuffer(const std::vector<T>& h) : DeviceBuffer(h.size()) {
    EXPECT_EQ(cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() { return p_; }
  std::vector<T> ToHost() const {
    std::vector<T> h(n_);
    EXPECT_EQ(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

std::vector<float> Gaussian(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Raw bytes of `x` converted to `t`.
std::vector<uint8_t> AsDType(const std::vector<float>& x, DType t) {
  std::vector<uint8_t> out(x.size() * DTypeSize(t));
  for (size_t i = 0; i < x.size(); ++i) math::StoreF32(out.data(), static_cast<int>(t), i, x[i]);
  return out;
}

void ExpectClose(const std::vector<float>& gpu, const std::vector<float>& cpu,
                 const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_NEAR(gpu[i], cpu[i], 1e-6f * std::max(1.0f, std::fabs(cpu[i]))) << what << " at " << i;
  }
}

TEST(CodecCuda, ValuesMatchCpu) {
  POLYKV_REQUIRE_CUDA_DEVICE();
  for (int d : {8, 48, 64, 80, 128, 256}) {
    const LayerShape s{3, 257, d};
    const auto x = Gaussian(s.elements(), 1000 + d);
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
      const auto in = AsDType(x, t);
      DeviceBuffer<uint8_t> din(in);
      for (int bits : {2, 3, 4}) {
        for (bool nc : {false, true}) {
          CodecConfig cfg;
          cfg.value_bits = bits;
          cfg.norm_correction = nc;
          const std::string what = "d " + std::to_string(d) + " bits " + std::to_string(bits) +
                                   " dtype " + std::to_string(static_cast<int>(t)) + " nc " +
                                   std::to_string(nc);
          const size_t pb = s.vectors() * PackedVectorBytes(d, bits);
          std::vector<uint8_t> packed(pb);
          std::vector<float> norms(s.vectors());
          ASSERT_TRUE(EncodeValues(in.data(), t, s, cfg, packed.data(), norms.data()).ok());
          DeviceBuffer<uint8_t> dpacked(pb);
          DeviceBuffer<float> dnorms(s.vectors());
          const Status st = EncodeValues(din.get(), t, s, cfg, dpacked.get(), dnorms.get(),
                                         Device::kCuda, nullptr);
          ASSERT_TRUE(st.ok()) << st << " " << what;
          EXPECT_EQ(dpacked.ToHost(), packed) << what;
          ExpectClose(dnorms.ToHost(), norms, "norms " + what);
          // Decode on the GPU from the CPU's bytes; compare with the CPU decode (f32 out).
          DeviceBuffer<uint8_t> dp2(packed);
          DeviceBuffer<float> dn2(norms);
          DeviceBuffer<float> dout(s.elements());
          ASSERT_TRUE(DecodeValues(dp2.get(), dn2.get(), s, cfg, dout.get(), DType::kF32,
                                   Device::kCuda, nullptr)
                          .ok());
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          std::vector<float> cpu_out(s.elements());
          ASSERT_TRUE(
              DecodeValues(packed.data(), norms.data(), s, cfg, cpu_out.data(), DType::kF32).ok());
          ExpectClose(dout.ToHost(), cpu_out, "decode " + what);
        }
      }
    }
  }
}

// The golden bytes of tests/unit/kernels/codec_format_test.cc (CodecGolden), on the GPU.
TEST(CodecCuda, GoldenValueBytes) {
  POLYKV_REQUIRE_CUDA_DEVICE();
  std::vector<float> v(2 * 64);
  for (int j = 0; j < 2; ++j) {
    for (int i = 0; i < 64; ++i) {
      v[j * 64 + i] =
          static_cast<float>(std::sin(0.37 * i + 1.3 * j) + 0.25 * std::cos(2.1 * i * j));
    }
  }
  DeviceBuffer<float> dv(v);
  DeviceBuffer<uint8_t> dp(48);
  DeviceBuffer<float> dn(2);
  ASSERT_TRUE(EncodeValues(dv.get(), DType::kF32, LayerShape{1, 2, 64}, CodecConfig{}, dp.get(),
                           dn.get(), Device::kCuda)
                  .ok());
  const auto packed = dp.ToHost();
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  for (uint8_t b : packed) {
    hex += kHex[b >> 4];
    hex += kHex[b & 15];
  }
  EXPECT_EQ(hex,
            "5c3764d5ba759f49a65497a154b7b12959be8c1c4a856f0b"
            "e5dec89b47752ec98636c5cd94a59ad1d25ca5769692bfa8");
  const auto norms = dn.ToHost();
  EXPECT_FLOAT_EQ(norms[0], 6.0897069f);
  EXPECT_FLOAT_EQ(norms[1], 5.9272695f);
}

TEST(CodecCuda, KeysMatchCpu) {
  POLYKV_REQUIRE_CUDA_DEVICE();
  const LayerShape s{4, 1031, 64};
  auto x = Gaussian(s.elements(), 5);
  for (size_t i = 0; i < x.size(); ++i) x[i] *= 1.0f + (i % 64) * 0.1f;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    const auto in = AsDType(x, t);
    DeviceBuffer<uint8_t> din(in);
    for (auto mode :
         {KeyScaleMode::kPerTensor, KeyScaleMode::kPerHead, KeyScaleMode::kPerChannel}) {
      std::vector<int8_t> q(s.elements());
      std::vector<float> sc(KeyScaleCount(s, mode));
      ASSERT_TRUE(QuantizeKeys(in.data(), t, s, mode, q.data(), sc.data()).ok());
      DeviceBuffer<int8_t> dq(s.elements());
      DeviceBuffer<float> dsc(sc.size());
      ASSERT_TRUE(QuantizeKeys(din.get(), t, s, mode, dq.get(), dsc.get(), Device::kCuda).ok());
      EXPECT_EQ(dq.ToHost(), q);
      EXPECT_EQ(dsc.ToHost(), sc);
      DeviceBuffer<uint8_t> dout(s.elements() * DTypeSize(t));
      ASSERT_TRUE(DequantizeKeys(dq.get(), dsc.get(), s, mode, dout.get(), t, Device::kCuda).ok());
      std::vector<uint8_t> cpu_out(s.elements() * DTypeSize(t));
      ASSERT_TRUE(DequantizeKeys(q.data(), sc.data(), s, mode, cpu_out.data(), t).ok());
      EXPECT_EQ(dout.ToHost(), cpu_out);
      // Given scales path.
      DeviceBuffer<int8_t> dq2(s.elements());
      ASSERT_TRUE(
          QuantizeKeysWithScales(din.get(), t, s, mode, dsc.get(), dq2.get(), Device::kCuda).ok());
      EXPECT_EQ(dq2.ToHost(), q);
    }
  }
}

// Packed keys (4..7 bits) encoded on the device: the CPU's code bytes and scales for every
// scale mode and input dtype, decoded back to the CPU's values; norms f32 <-> f16 on the
// device: the CPU's bits.
TEST(CodecCuda, PackedKeysAndNormConversionMatchCpu) {
  POLYKV_REQUIRE_CUDA_DEVICE();
  const LayerShape s{3, 517, 64};
  auto x = Gaussian(s.elements(), 9);
  for (size_t i = 0; i < x.size(); ++i) x[i] *= 1.0f + (i % 64) * 0.1f;
  for (DType t : {DType::kF32, DType::kBF16}) {
    const auto in = AsDType(x, t);
    DeviceBuffer<uint8_t> din(in);
    for (int bits : {4, 5, 6, 7}) {
      for (auto mode :
           {KeyScaleMode::kPerTensor, KeyScaleMode::kPerHead, KeyScaleMode::kPerChannel}) {
        SCOPED_TRACE(::testing::Message() << "bits " << bits << " mode " << static_cast<int>(mode)
                                          << " dtype " << static_cast<int>(t));
        CodecConfig c;
        c.key_bits = bits;
        c.key_scale = mode;
        const size_t nb = s.vectors() * PackedKeyVectorBytes(s.head_dim, bits);
        std::vector<uint8_t> codes(nb);
        std::vector<float> sc(KeyScaleCount(s, mode));
        ASSERT_TRUE(EncodeKeys(in.data(), t, s, c, codes.data(), sc.data()).ok());
        DeviceBuffer<uint8_t> dcodes(nb);
        DeviceBuffer<float> dsc(sc.size());
        const Status st = EncodeKeys(din.get(), t, s, c, dcodes.get(), dsc.get(), Device::kCuda);
        ASSERT_TRUE(st.ok()) << st;
        EXPECT_EQ(dcodes.ToHost(), codes);
        EXPECT_EQ(dsc.ToHost(), sc);
        std::vector<float> cpu_out(s.elements());
        ASSERT_TRUE(DecodeKeys(codes.data(), sc.data(), s, c, cpu_out.data(), DType::kF32).ok());
        DeviceBuffer<float> dout(s.elements());
        ASSERT_TRUE(
            DecodeKeys(dcodes.get(), dsc.get(), s, c, dout.get(), DType::kF32, Device::kCuda).ok());
        EXPECT_EQ(dout.ToHost(), cpu_out);
      }
    }
  }
  std::vector<float> norms = Gaussian(1000, 3);
  for (float& n : norms) n = std::fabs(n) * 40.0f;
  std::vector<uint16_t> h16(norms.size());
  NormsToF16(norms.data(), static_cast<int64_t>(norms.size()), h16.data());
  DeviceBuffer<float> dn(norms);
  DeviceBuffer<uint16_t> d16(norms.size());
  ASSERT_TRUE(ConvertNorms(dn.get(), DType::kF32, static_cast<int64_t>(norms.size()), d16.get(),
                           Device::kCuda)
                  .ok());
  EXPECT_EQ(d16.ToHost(), h16);
  std::vector<float> back(norms.size());
  NormsFromF16(h16.data(), static_cast<int64_t>(h16.size()), back.data());
  DeviceBuffer<float> dback(norms.size());
  ASSERT_TRUE(ConvertNorms(d16.get(), DType::kF16, static_cast<int64_t>(norms.size()), dback.get(),
                           Device::kCuda)
                  .ok());
  EXPECT_EQ(dback.ToHost(), back);
}

TEST(CodecCuda, ZeroVectorsAndNonFiniteInput) {
  POLYKV_REQUIRE_CUDA_DEVICE();
  const LayerShape s{1, 4, 64};
  std::vector<float> x(s.elements(), 0.0f);
  DeviceBuffer<float> dx(x);
  DeviceBuffer<uint8_t> dp(4 * 24);
  DeviceBuffer<float> dn(4);
  ASSERT_TRUE(
      EncodeValues(dx.get(), DType::kF32, s, CodecConfig{}, dp.get(), dn.get(), Device::kCuda)
          .ok());
  for (float n : dn.ToHost()) EXPECT_EQ(n, 0.0f);
  DeviceBuffer<float> dout(s.elements());
  ASSERT_TRUE(
      DecodeValues(dp.get(), dn.get(), s, CodecConfig{}, dout.get(), DType::kF32, Device::kCuda)
          .ok());
  for (float v : dout.ToHost()) EXPECT_EQ(v, 0.0f);
  x[77] = std::numeric_limits<float>::quiet_NaN();
  x[200] = std::numeric_limits<float>::infinity();
  DeviceBuffer<float> dbad(x);
  Status st =
      EncodeValues(dbad.get(), DType::kF32, s, CodecConfig{}, dp.get(), dn.get(), Device::kCuda);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("NaN at element 77"), std::string::npos) << st;
  DeviceBuffer<int8_t> dq(s.elements());
  DeviceBuffer<float> dsc(64);
  st = QuantizeKeys(dbad.get(), DType::kF32, s, KeyScaleMode::kPerChannel, dq.get(), dsc.get(),
                    Device::kCuda);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("NaN at element 77"), std::string::npos) << st;
}

#else  // !POLYKV_HAVE_CUDA

TEST(CodecCuda, ValuesMatchCpu) { GTEST_SKIP() << "built without CUDA (POLYKV_HAVE_CUDA off)"; }
TEST(CodecCuda, KeysMatchCpu) { GTEST_SKIP() << "built without CUDA (POLYKV_HAVE_CUDA off)"; }
TEST(CodecCuda, GoldenValueBytes) { GTEST_SKIP() << "built without CUDA (POLYKV_HAVE_CUDA off)"; }
TEST(CodecCuda, PackedKeysAndNormConversionMatchCpu) {
  GTEST_SKIP() << "built without CUDA (POLYKV_HAVE_CUDA off)";
}
TEST(CodecCuda, ZeroVectorsAndNonFiniteInput) {
  GTEST_SKIP() << "built without CUDA (POLYKV_HAVE_CUDA off)";
}

#endif

}  // namespace
}  // namespace polykv::kernels
