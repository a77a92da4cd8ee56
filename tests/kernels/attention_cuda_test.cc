// CPU vs CUDA split attention over [prefix | suffix] (label gpu): the same random layers,
// every codec and key scale mode, GQA, head_dim 8..128, prompt rows 1 and 7, a suffix that
// crosses a chunk. The CUDA kernels accumulate in a different order: max |d| <= 2e-5 (outputs
// are convex combinations of O(1) values). Skips without a CUDA device or a CUDA build.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "polykv/kernels/attention.h"
#include "polykv/kernels/codec.h"

#if defined(POLYKV_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace polykv::kernels {
namespace {

#if defined(POLYKV_HAVE_CUDA)
bool HaveDevice() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

template <typename T>
T* ToDevice(const std::vector<T>& v) {
  T* d = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&d), sizeof(T) * std::max<size_t>(v.size(), 1)) !=
      cudaSuccess)
    return nullptr;
  cudaMemcpy(d, v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice);
  return d;
}

std::vector<float> Gauss(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g;
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

struct Case {
  int heads, kv_heads, hd;
  int64_t prefix, suffix, n;
};

void Check(const Case& c, bool k8, int bits, KeyScaleMode mode) {
  SCOPED_TRACE(::testing::Message() << "hd " << c.hd << " prefix " << c.prefix << " suffix "
                                    << c.suffix << " n " << c.n << (k8 ? " k8v" : " raw") << bits);
  const LayerShape shape{c.kv_heads, c.prefix, c.hd};
  std::vector<float> kraw = Gauss(shape.elements(), 1), vraw = Gauss(shape.elements(), 2);
  PrefixView pv;
  pv.kv_heads = c.kv_heads;
  pv.head_dim = c.hd;
  pv.tokens = c.prefix;
  pv.layers.resize(1);
  std::vector<int8_t> kq(shape.elements());
  std::vector<float> ks(KeyScaleCount(shape, mode)), norms(shape.vectors());
  std::vector<uint8_t> packed(shape.vectors() * PackedVectorBytes(c.hd, bits > 0 ? bits : 3));
  if (k8) {
    pv.codec = PrefixCodec::kK8V;
    pv.config.value_bits = bits;
    pv.config.key_scale = mode;
    ASSERT_TRUE(QuantizeKeys(kraw.data(), DType::kF32, shape, mode, kq.data(), ks.data()).ok());
    ASSERT_TRUE(
        EncodeValues(vraw.data(), DType::kF32, shape, pv.config, packed.data(), norms.data()).ok());
    pv.layers[0] = {kq.data(), ks.data(), packed.data(), norms.data()};
  } else {
    pv.layers[0] = {kraw.data(), nullptr, vraw.data(), nullptr};
  }
  const int64_t cap = c.suffix + 3;
  const auto ksuf = Gauss(c.kv_heads * cap * c.hd, 3), vsuf = Gauss(c.kv_heads * cap * c.hd, 4);
  const auto q = Gauss(c.n * c.heads * c.hd, 5);
  AttentionArgs a;
  a.prefix = &pv;
  a.k_suffix = ksuf.data();
  a.v_suffix = vsuf.data();
  a.suffix_capacity = cap;
  a.suffix_length = c.suffix;
  a.n = c.n;
  a.heads = c.heads;
  a.kv_heads = c.kv_heads;
  a.head_dim = c.hd;
  a.q = q.data();
  std::vector<float> cpu(c.n * c.heads * c.hd), gpu(cpu.size());
  a.out = cpu.data();
  ASSERT_TRUE(AttentionForward(a).ok());

  // The same on the device.
  PrefixView dv = pv;
  void *dk = nullptr, *dvv = nullptr;
  float *dks = nullptr, *dn = nullptr;
  if (k8) {
    dk = ToDevice(kq);
    dks = ToDevice(ks);
    dvv = ToDevice(packed);
    dn = ToDevice(norms);
  } else {
    dk = ToDevice(kraw);
    dvv = ToDevice(vraw);
  }
  dv.layers[0] = {dk, dks, dvv, dn};
  float* dksuf = ToDevice(ksuf);
  float* dvsuf = ToDevice(vsuf);
  float* dq = ToDevice(q);
  float* dout = ToDevice(gpu);
  AttentionArgs g = a;
  g.prefix = &dv;
  g.k_suffix = dksuf;
  g.v_suffix = dvsuf;
  g.q = dq;
  g.out = dout;
  AttentionOptions o;
  o.device = Device::kCuda;
  const Status st = AttentionForward(g, o);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaMemcpy(gpu.data(), dout, sizeof(float) * gpu.size(), cudaMemcpyDeviceToHost);
  for (void* p : {static_cast<void*>(dk), static_cast<void*>(dks), dvv, static_cast<void*>(dn),
                  static_cast<void*>(dksuf), static_cast<void*>(dvsuf), static_cast<void*>(dq),
                  static_cast<void*>(dout)})
    if (p != nullptr) cudaFree(p);
  double max_err = 0;
  for (size_t i = 0; i < cpu.size(); ++i)
    max_err = std::max(max_err, std::fabs(double{cpu[i]} - gpu[i]));
  EXPECT_LE(max_err, 2e-5);
}
#endif

TEST(AttentionCuda, MatchesCpuForEveryCodec) {
#if !defined(POLYKV_HAVE_CUDA)
  GTEST_SKIP() << "built without CUDA";
#else
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  const Case cases[] = {{9, 3, 64, 600, 20, 1},
                        {9, 3, 64, 300, 70, 7},
                        {4, 2, 8, 40, 300, 7},
                        {8, 2, 80, 257, 3, 1},
                        {8, 8, 128, 513, 1, 1}};
  for (const Case& c : cases) {
    Check(c, false, 0, KeyScaleMode::kPerTensor);
    for (int bits : {2, 3, 4})
      for (KeyScaleMode m :
           {KeyScaleMode::kPerTensor, KeyScaleMode::kPerHead, KeyScaleMode::kPerChannel})
        Check(c, true, bits, m);
  }
#endif
}

}  // namespace
}  // namespace polykv::kernels
