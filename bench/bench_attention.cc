// bench_attention: the split attention kernels (kernels/attention.h) on one SmolLM2-shaped
// layer (9 query heads, 3 KV heads, head_dim 64) over a prefix of 1451 / 4096 tokens, in
// place on a K8/V3 prefix and on the same prefix decoded to f32 (what --attend decompressed
// attends to), for 1 (decode) and 8 / 32 (an agent's prompt) query rows, per ISA variant,
// 1 thread. Baseline in the same run: the scalar reference and single-thread memcpy of the
// bytes the call reads.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include "polykv/kernels/attention.h"
#include "polykv/kernels/codec.h"
#include "polykv/kernels/cpu.h"

namespace {

using namespace polykv::kernels;

// CPU time of the calling thread: every figure here is single-threaded, and thread CPU time
// is not inflated when other processes share the cores (wall time would be).
double Now() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::vector<float> Gauss(size_t n, uint64_t seed, float sigma) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

// Median seconds of `reps` calls of f (after one warm-up call).
template <typename F>
double Median(int reps, F&& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const double s = Now();
    f();
    t.push_back(Now() - s);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_attention: split attention over a K8/V3 prefix, in place vs decoded f32"};
  int reps = 15;
  app.add_option("--reps", reps, "Timed calls per figure (median)");
  CLI11_PARSE(app, argc, argv);

  constexpr int kHeads = 9, kKv = 3, kHd = 64;
  SetComputeThreads(1);
  std::printf(
      "bench_attention: one layer, %d heads / %d KV heads, head_dim %d, 1 thread, "
      "median thread CPU time of %d calls (SmolLM2 has 30 such layers)\n\n",
      kHeads, kKv, kHd, reps);
  std::printf("%-7s %-5s %-10s %-7s %12s %12s %12s %10s\n", "prefix", "rows", "prefix", "isa",
              "us/layer", "x30 ms", "GB/s read", "vs scalar");
  for (int64_t tokens : {1451, 4096}) {
    const LayerShape shape{kKv, tokens, kHd};
    auto kraw = Gauss(shape.elements(), 1, 1.5f);
    auto vraw = Gauss(shape.elements(), 2, 1.0f);
    CodecConfig cfg;
    cfg.value_bits = 3;
    cfg.key_scale = KeyScaleMode::kPerChannel;
    cfg.rotation_seed = 12345;
    std::vector<int8_t> kq(shape.elements());
    std::vector<float> ks(KeyScaleCount(shape, cfg.key_scale)), norms(shape.vectors());
    std::vector<uint8_t> vp(shape.vectors() * PackedVectorBytes(kHd, 3));
    if (!QuantizeKeys(kraw.data(), DType::kF32, shape, cfg.key_scale, kq.data(), ks.data()).ok() ||
        !EncodeValues(vraw.data(), DType::kF32, shape, cfg, vp.data(), norms.data()).ok()) {
      std::fprintf(stderr, "error: encoding the prefix failed\n");
      return 1;
    }
    std::vector<float> kdec(shape.elements()), vdec(shape.elements());
    if (!DequantizeKeys(kq.data(), ks.data(), shape, cfg.key_scale, kdec.data(), DType::kF32)
             .ok() ||
        !DecodeValues(vp.data(), norms.data(), shape, cfg, vdec.data(), DType::kF32).ok()) {
      std::fprintf(stderr, "error: decoding the prefix failed\n");
      return 1;
    }
    PrefixView k8;
    k8.kv_heads = kKv;
    k8.head_dim = kHd;
    k8.tokens = tokens;
    k8.codec = PrefixCodec::kK8V;
    k8.config = cfg;
    k8.layers = {PrefixLayer{kq.data(), ks.data(), vp.data(), norms.data()}};
    PrefixView raw = k8;
    raw.codec = PrefixCodec::kRaw;
    raw.raw_dtype = DType::kF32;
    raw.layers = {PrefixLayer{kdec.data(), nullptr, vdec.data(), nullptr}};

    for (int64_t n : {1, 8, 32}) {
      const int64_t cap = n + 8;
      auto ksuf = Gauss(static_cast<size_t>(kKv * cap * kHd), 3, 1.5f);
      auto vsuf = Gauss(static_cast<size_t>(kKv * cap * kHd), 4, 1.0f);
      auto q = Gauss(static_cast<size_t>(n * kHeads * kHd), 5, 1.0f);
      std::vector<float> out(q.size());
      for (const PrefixView* pv : {&k8, &raw}) {
        const double bytes = static_cast<double>(pv->LayerBytes());
        // memcpy of the prefix bytes, same run: the bandwidth yardstick.
        std::vector<char> src(static_cast<size_t>(bytes)), dst(src.size());
        const double mc = Median(reps, [&] { std::memcpy(dst.data(), src.data(), src.size()); });
        double scalar_s = 0;
        for (Isa isa : SupportedIsas()) {
          AttentionArgs a;
          a.prefix = pv;
          a.k_suffix = ksuf.data();
          a.v_suffix = vsuf.data();
          a.suffix_capacity = cap;
          a.suffix_length = n;
          a.n = n;
          a.heads = kHeads;
          a.kv_heads = kKv;
          a.head_dim = kHd;
          a.q = q.data();
          a.out = out.data();
          AttentionOptions o;
          o.isa = static_cast<int>(isa);
          o.threads = 1;
          bool ok = true;
          const double s = Median(reps, [&] { ok = ok && AttentionForward(a, o).ok(); });
          if (!ok) {
            std::fprintf(stderr, "error: AttentionForward failed\n");
            return 1;
          }
          if (isa == Isa::kScalar) scalar_s = s;
          std::printf("%-7lld %-5lld %-10s %-7s %12.1f %12.2f %12.2f %9.2fx\n",
                      static_cast<long long>(tokens), static_cast<long long>(n),
                      pv == &k8 ? "k8v3" : "f32", IsaName(isa), s * 1e6, s * 30e3, bytes / s / 1e9,
                      scalar_s / s);
        }
        std::printf("%-7lld %-5lld %-10s %-7s %12.1f %12.2f %12.2f\n",
                    static_cast<long long>(tokens), static_cast<long long>(n),
                    pv == &k8 ? "k8v3" : "f32", "memcpy", mc * 1e6, mc * 30e3, bytes / mc / 1e9);
      }
    }
  }
  return 0;
}
