// CPU vs CUDA split attention over [prefix | suffix] (label gpu): the same random layers,
// every codec and key scale mode, packed keys, f16 norms and per-layer value bits, GQA,
// head_dim 8..128, prompt rows 1 and 7, a suffix that crosses a chunk. The CUDA kernels accumulate
// in a different order: max |d| <= 2e-5 (outputs are convex combinations of O(1) values). A
// launch that reads the suffix length from device memory (grid sized by the capacity, as a
// captured decode graph launches it) gives the same bits as the host-length launch, and so
// does a batched decode step's slot launch (AttentionForwardSlots). Skips without a CUDA
// device or a CUDA build.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "polykv/kernels/attention.h"
#include "polykv/kernels/codec.h"
#include "test_util.h"  // tests/unit/kernels

#if defined(POLYKV_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace polykv::kernels {
namespace {

using testing::Gaussian;
using testing::kKeyScaleModes;
using testing::MaxAbsError;
using testing::SlotArgs;
using testing::SuffixArgs;

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

// AttentionForward of *g (its prefix already device views) on the device with the suffix
// K/V, queries and output at the given device pointers (set into *g); the output copied to
// *out (host, out->size() floats).
void ForwardOnDevice(AttentionArgs* g, const float* k, const float* v, const float* q, float* dout,
                     std::vector<float>* out) {
  g->k_suffix = k;
  g->v_suffix = v;
  g->q = q;
  g->out = dout;
  AttentionOptions o;
  o.device = Device::kCuda;
  const Status st = AttentionForward(*g, o);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(out->data(), dout, sizeof(float) * out->size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
}

struct Case {
  int heads, kv_heads, hd;
  int64_t prefix, suffix, n;
};

// The pool format of a compressed prefix: key bits (8 or packed 4..7), f16 norms, and
// whether the attended layer carries its own value bits (PrefixLayer::value_bits, layer 1 of
// two, the view's config saying 3 bits).
struct Format {
  int key_bits = 8;
  bool f16_norms = false;
  bool layer_bits = false;
};

// AttentionForwardSlots on the device (a batched decode step): the case's suffix in slot 1
// of a 3-slot slab, attended by row 0 with its length, while row 1 attends to slot 2 with one
// position. Row 0 gives the single launch's bits (`single`: the same blocks and merge order;
// a grid bound past its length adds empty chunks only), row 1 the CPU's AttentionForward
// within 2e-5.
void CheckSlots(const Case& c, const AttentionArgs& host, const PrefixView& dv,
                const std::vector<float>& ksuf, const std::vector<float>& vsuf,
                const std::vector<float>& q, const std::vector<float>& single) {
  const int64_t cap = host.suffix_capacity, per = c.kv_heads * cap * c.hd;
  std::vector<float> kslab = Gaussian(3 * per, 11), vslab = Gaussian(3 * per, 12);
  std::copy(ksuf.begin(), ksuf.end(), kslab.begin() + per);
  std::copy(vsuf.begin(), vsuf.end(), vslab.begin() + per);
  std::vector<float> q2 = q;
  const std::vector<float> other = Gaussian(c.heads * c.hd, 13);
  q2.insert(q2.end(), other.begin(), other.end());
  float* dk = ToDevice(kslab);
  float* dvs = ToDevice(vslab);
  float* dq = ToDevice(q2);
  std::vector<float> out(q2.size(), 0.0f);
  float* dout = ToDevice(out);
  int32_t* dslot = ToDevice(std::vector<int32_t>{1, 2});
  int64_t* dlen = ToDevice(std::vector<int64_t>{c.suffix, 1});
  SlotAttentionArgs s =
      SlotArgs(c.heads, c.kv_heads, c.hd, dk, dvs, 3, cap, 2, dslot, dlen, dq, dout);
  s.prefix = &dv;
  s.layer = host.layer;
  AttentionOptions o;
  o.device = Device::kCuda;
  const Status st = AttentionForwardSlots(s, o);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaMemcpy(out.data(), dout, sizeof(float) * out.size(), cudaMemcpyDeviceToHost);
  for (void* p : {static_cast<void*>(dk), static_cast<void*>(dvs), static_cast<void*>(dq),
                  static_cast<void*>(dout), static_cast<void*>(dslot), static_cast<void*>(dlen)})
    cudaFree(p);
  EXPECT_EQ(std::memcmp(out.data(), single.data(), sizeof(float) * single.size()), 0)
      << "slot launch row 0 differs from the single launch";
  AttentionArgs r1 = SuffixArgs({cap, 1, 1, c.heads, c.kv_heads, c.hd}, kslab.data() + 2 * per,
                                vslab.data() + 2 * per, other.data());
  r1.prefix = host.prefix;
  r1.layer = host.layer;
  std::vector<float> want(other.size());
  r1.out = want.data();
  ASSERT_TRUE(AttentionForward(r1).ok());
  EXPECT_LE(MaxAbsError(std::vector<float>(out.begin() + single.size(), out.end()), want), 2e-5)
      << "slot launch row 1";
}

void Check(const Case& c, bool k8, int bits, KeyScaleMode mode, Format f = {}) {
  SCOPED_TRACE(::testing::Message()
               << "hd " << c.hd << " prefix " << c.prefix << " suffix " << c.suffix << " n " << c.n
               << (k8 ? " k8v" : " raw") << bits << " mode " << static_cast<int>(mode)
               << " key_bits " << f.key_bits << (f.f16_norms ? " f16 norms" : "")
               << (f.layer_bits ? " per-layer bits" : ""));
  const LayerShape shape{c.kv_heads, c.prefix, c.hd};
  std::vector<float> kraw = Gaussian(shape.elements(), 1), vraw = Gaussian(shape.elements(), 2);
  PrefixView pv;
  pv.kv_heads = c.kv_heads;
  pv.head_dim = c.hd;
  pv.tokens = c.prefix;
  const int layer = f.layer_bits ? 1 : 0;
  pv.layers.resize(layer + 1);
  std::vector<uint8_t> kq(shape.vectors() * PackedKeyVectorBytes(c.hd, f.key_bits));
  std::vector<float> ks(KeyScaleCount(shape, mode)), norms(shape.vectors());
  std::vector<uint16_t> norms16(shape.vectors());
  std::vector<uint8_t> packed(shape.vectors() * PackedVectorBytes(c.hd, bits > 0 ? bits : 3));
  const void* norm_ptr = norms.data();
  if (k8) {
    pv.codec = PrefixCodec::kK8V;
    pv.config.value_bits = f.layer_bits ? 3 : bits;
    pv.config.key_scale = mode;
    pv.config.key_bits = f.key_bits;
    pv.config.norm_dtype = f.f16_norms ? DType::kF16 : DType::kF32;
    CodecConfig enc = pv.config;
    enc.value_bits = bits;
    ASSERT_TRUE(EncodeKeys(kraw.data(), DType::kF32, shape, enc, kq.data(), ks.data()).ok());
    ASSERT_TRUE(
        EncodeValues(vraw.data(), DType::kF32, shape, enc, packed.data(), norms.data()).ok());
    if (f.f16_norms) {
      NormsToF16(norms.data(), shape.vectors(), norms16.data());
      norm_ptr = norms16.data();
    }
    pv.layers[layer] = {kq.data(), ks.data(), packed.data(), norm_ptr, f.layer_bits ? bits : 0};
    if (f.layer_bits) pv.layers[0] = pv.layers[layer];  // layer 0 is not attended to
  } else {
    pv.layers[0] = {kraw.data(), nullptr, vraw.data(), nullptr};
  }
  const int64_t cap = c.suffix + 3;
  const auto ksuf = Gaussian(c.kv_heads * cap * c.hd, 3),
             vsuf = Gaussian(c.kv_heads * cap * c.hd, 4);
  const auto q = Gaussian(c.n * c.heads * c.hd, 5);
  std::vector<float> cpu(c.n * c.heads * c.hd), gpu(cpu.size());
  AttentionArgs a = SuffixArgs({cap, c.suffix, c.n, c.heads, c.kv_heads, c.hd}, ksuf.data(),
                               vsuf.data(), q.data(), cpu.data());
  a.prefix = &pv;
  a.layer = layer;
  ASSERT_TRUE(AttentionForward(a).ok());

  // The same on the device.
  PrefixView dv = pv;
  void *dk = nullptr, *dvv = nullptr, *dn = nullptr;
  float* dks = nullptr;
  if (k8) {
    dk = ToDevice(kq);
    dks = ToDevice(ks);
    dvv = ToDevice(packed);
    dn = f.f16_norms ? static_cast<void*>(ToDevice(norms16)) : static_cast<void*>(ToDevice(norms));
  } else {
    dk = ToDevice(kraw);
    dvv = ToDevice(vraw);
  }
  for (PrefixLayer& l : dv.layers) {
    l.k = dk;
    l.k_scales = dks;
    l.v = dvv;
    l.v_norms = dn;
  }
  float* dksuf = ToDevice(ksuf);
  float* dvsuf = ToDevice(vsuf);
  float* dq = ToDevice(q);
  float* dout = ToDevice(gpu);
  AttentionArgs g = a;
  g.prefix = &dv;
  ASSERT_NO_FATAL_FAILURE(ForwardOnDevice(&g, dksuf, dvsuf, dq, dout, &gpu));
  AttentionOptions o;
  o.device = Device::kCuda;
  // The live suffix length read from device memory, the grid sized by the capacity (a
  // captured decode graph's launch): the same bits as the host-length launch.
  int64_t* dlen = ToDevice(std::vector<int64_t>{c.suffix});
  AttentionArgs gd = g;
  gd.suffix_length = cap;
  gd.suffix_length_device = dlen;
  std::vector<float> gpu_dev(gpu.size());
  ASSERT_EQ(cudaMemset(dout, 0xff, sizeof(float) * gpu.size()), cudaSuccess);
  const Status std_ = AttentionForward(gd, o);
  ASSERT_TRUE(std_.ok()) << std_;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaMemcpy(gpu_dev.data(), dout, sizeof(float) * gpu.size(), cudaMemcpyDeviceToHost);
  cudaFree(dlen);
  EXPECT_EQ(std::memcmp(gpu_dev.data(), gpu.data(), sizeof(float) * gpu.size()), 0)
      << "device-length launch differs from the host-length launch";
  if (c.n == 1) CheckSlots(c, a, dv, ksuf, vsuf, q, gpu);
  for (void* p :
       {static_cast<void*>(dk), static_cast<void*>(dks), dvv, dn, static_cast<void*>(dksuf),
        static_cast<void*>(dvsuf), static_cast<void*>(dq), static_cast<void*>(dout)})
    if (p != nullptr) cudaFree(p);
  EXPECT_LE(MaxAbsError(cpu, gpu), 2e-5);
}
#endif

#if defined(POLYKV_HAVE_CUDA)
// A compressed prefix segment on the host and its copy in device memory (a pool of a tree).
struct Segment {
  std::vector<uint8_t> k, v;
  std::vector<float> scales, norms;
  PrefixView host, dev;
  std::vector<void*> blocks;
  ~Segment() {
    for (void* b : blocks) cudaFree(b);
  }
};

// `tokens` of random K/V encoded with key_bits / mode / value bits and `seed` for the data
// (rotation seed 77 for every segment, as a tree's pools share it).
void MakeSegment(int kvh, int64_t tokens, int hd, int key_bits, KeyScaleMode mode, int bits,
                 uint64_t seed, Segment* out) {
  const LayerShape shape{kvh, tokens, hd};
  const auto kraw = Gaussian(shape.elements(), seed), vraw = Gaussian(shape.elements(), seed + 1);
  PrefixView& pv = out->host;
  pv.kv_heads = kvh;
  pv.head_dim = hd;
  pv.tokens = tokens;
  pv.codec = PrefixCodec::kK8V;
  pv.config.key_bits = key_bits;
  pv.config.key_scale = mode;
  pv.config.value_bits = bits;
  pv.config.rotation_seed = 77;
  out->k.resize(shape.vectors() * PackedKeyVectorBytes(hd, key_bits));
  out->scales.resize(KeyScaleCount(shape, mode));
  out->v.resize(shape.vectors() * PackedVectorBytes(hd, bits));
  out->norms.resize(shape.vectors());
  ASSERT_TRUE(
      EncodeKeys(kraw.data(), DType::kF32, shape, pv.config, out->k.data(), out->scales.data())
          .ok());
  ASSERT_TRUE(
      EncodeValues(vraw.data(), DType::kF32, shape, pv.config, out->v.data(), out->norms.data())
          .ok());
  pv.layers = {PrefixLayer{out->k.data(), out->scales.data(), out->v.data(), out->norms.data(), 0}};
  out->dev = pv;
  void* dk = ToDevice(out->k);
  float* ds = ToDevice(out->scales);
  void* dv = ToDevice(out->v);
  float* dn = ToDevice(out->norms);
  out->blocks = {dk, ds, dv, dn};
  out->dev.layers = {PrefixLayer{dk, ds, dv, dn, 0}};
}
#endif

// A pool tree's prefix on CUDA (root + two children, each with its own key width, scales and
// value bits, one rotation seed): one partial-state launch per segment, one merge; against
// the CPU's AttentionForward over the same segments within 2e-5, for single calls (1 and 7
// rows), the 7 rows also split into row groups (bit for bit), and for a slot launch.
TEST(AttentionCuda, PoolTreeSegmentsMatchCpu) {
#if !defined(POLYKV_HAVE_CUDA)
  GTEST_SKIP() << "built without CUDA";
#else
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  const int heads = 9, kvh = 3, hd = 64;
  Segment root, child, grandchild;
  ASSERT_NO_FATAL_FAILURE(MakeSegment(kvh, 300, hd, 7, KeyScaleMode::kPerChannel, 3, 1, &root));
  ASSERT_NO_FATAL_FAILURE(MakeSegment(kvh, 70, hd, 8, KeyScaleMode::kPerHead, 4, 5, &child));
  ASSERT_NO_FATAL_FAILURE(
      MakeSegment(kvh, 129, hd, 5, KeyScaleMode::kPerTensor, 2, 9, &grandchild));
  const std::vector<PrefixView> host_tail = {child.host, grandchild.host};
  const std::vector<PrefixView> dev_tail = {child.dev, grandchild.dev};
  for (int64_t n : {1, 7}) {
    SCOPED_TRACE(::testing::Message() << "rows " << n);
    const int64_t cap = 40, slen = 20 + n;
    const auto ks = Gaussian(kvh * cap * hd, 21), vs = Gaussian(kvh * cap * hd, 22);
    const auto q = Gaussian(n * heads * hd, 23);
    std::vector<float> cpu(q.size());
    AttentionArgs a =
        SuffixArgs({cap, slen, n, heads, kvh, hd}, ks.data(), vs.data(), q.data(), cpu.data());
    a.prefix = &root.host;
    a.prefix_tail = host_tail;
    AttentionOptions cpu_opt;
    cpu_opt.amx = 0;  // the f32 reference
    ASSERT_TRUE(AttentionForward(a, cpu_opt).ok());
    float* dks = ToDevice(ks);
    float* dvs = ToDevice(vs);
    float* dq = ToDevice(q);
    std::vector<float> gpu(q.size(), 0.0f);
    float* dout = ToDevice(gpu);
    AttentionArgs g = a;
    g.prefix = &root.dev;
    g.prefix_tail = dev_tail;
    ASSERT_NO_FATAL_FAILURE(ForwardOnDevice(&g, dks, dvs, dq, dout, &gpu));
    AttentionOptions o;
    o.device = Device::kCuda;
    EXPECT_LE(MaxAbsError(gpu, cpu), 2e-5);
    if (n > 1) {
      // States capped below two rows' (26,136 bytes per row here): one launch per query row
      // over every segment, each row's result the single launch's bit for bit.
      ASSERT_EQ(setenv("POLYKV_CUDA_ATTENTION_STATE_BYTES", "50000", 1), 0);
      std::vector<float> grouped(q.size(), 0.0f);
      ASSERT_EQ(cudaMemset(dout, 0, sizeof(float) * grouped.size()), cudaSuccess);
      ASSERT_NO_FATAL_FAILURE(ForwardOnDevice(&g, dks, dvs, dq, dout, &grouped));
      unsetenv("POLYKV_CUDA_ATTENTION_STATE_BYTES");
      EXPECT_EQ(grouped, gpu) << "row groups differ from the single launch";
    }
    if (n == 1) {  // the same row through a slot launch (slot 0 of a one-slot slab)
      int32_t* dslot = ToDevice(std::vector<int32_t>{0});
      int64_t* dlen = ToDevice(std::vector<int64_t>{slen});
      SlotAttentionArgs sa = SlotArgs(heads, kvh, hd, dks, dvs, 1, cap, 1, dslot, dlen, dq, dout);
      sa.prefix = &root.dev;
      sa.prefix_tail = dev_tail;
      ASSERT_TRUE(AttentionForwardSlots(sa, o).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<float> slot_out(gpu.size());
      cudaMemcpy(slot_out.data(), dout, sizeof(float) * gpu.size(), cudaMemcpyDeviceToHost);
      EXPECT_EQ(slot_out, gpu) << "slot launch differs from the single launch";
      cudaFree(dslot);
      cudaFree(dlen);
    }
    for (void* p : {static_cast<void*>(dks), static_cast<void*>(dvs), static_cast<void*>(dq),
                    static_cast<void*>(dout)})
      cudaFree(p);
  }
#endif
}

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
      for (KeyScaleMode m : kKeyScaleModes) Check(c, true, bits, m);
  }
#endif
}

// The pool's other formats, the default codec's among them (packed keys, f16 norms, per-layer
// value bits): the CUDA kernel reads them where they lie, with the same tolerance.
TEST(AttentionCuda, MatchesCpuForPackedKeysF16NormsAndPerLayerBits) {
#if !defined(POLYKV_HAVE_CUDA)
  GTEST_SKIP() << "built without CUDA";
#else
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  const Case cases[] = {{9, 3, 64, 600, 20, 1}, {9, 3, 64, 300, 70, 7}, {8, 2, 80, 257, 3, 1}};
  for (const Case& c : cases) {
    for (int kb : {4, 5, 6, 7})
      for (KeyScaleMode m : {KeyScaleMode::kPerTensor, KeyScaleMode::kPerChannel})
        Check(c, true, 3, m, Format{kb, false, false});
    for (int bits : {2, 3, 4}) {
      Check(c, true, bits, KeyScaleMode::kPerHead, Format{8, true, false});
      Check(c, true, bits, KeyScaleMode::kPerTensor, Format{8, false, true});
      Check(c, true, bits, KeyScaleMode::kPerChannel, Format{5, true, true});
    }
  }
#endif
}

}  // namespace
}  // namespace polykv::kernels
