// bench_attention: the split attention kernels (kernels/attention.h) on SmolLM2-shaped layers
// (9 query heads, 3 KV heads, head_dim 64).
//  - single: one layer over a prefix of 1451 / 4096 tokens, in place on a K8/V3 prefix and on
//    the same prefix decoded to f32 (what --attend decompressed attends to), for 1 (decode)
//    and 8 / 32 (an agent's prompt) query rows, per ISA variant. Baseline in the same run: the
//    scalar reference and single-thread memcpy of the bytes the call reads.
//  - batch: one decode step of S sessions (1 query row each, ragged private suffixes) over one
//    shared pool of every layer (default 16 sessions, 1469 tokens: the demo document, 30
//    layers), AttentionForwardBatch (the pool read once per layer) against S separate
//    AttentionForward calls in the same run, session-major (what S agent processes do: each
//    walks every layer for its own token) and layer-major; prefix bytes read per step.
// Every figure is single-threaded thread CPU time (median).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "polykv/kernels/attention.h"
#include "polykv/kernels/codec.h"
#include "polykv/kernels/codec_math.h"
#include "polykv/kernels/cpu.h"
#include "support/random.h"

namespace {

using namespace polykv::kernels;

// CPU time of the calling thread: every figure here is single-threaded, and thread CPU time
// is not inflated when other processes share the cores (wall time would be).
double Now() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

using polykv::support::Gaussian;

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

constexpr int kHeads = 9, kKv = 3, kHd = 64;

int SingleTable(int reps) {
  std::printf(
      "bench_attention: one layer, %d heads / %d KV heads, head_dim %d, 1 thread, "
      "median thread CPU time of %d calls (SmolLM2 has 30 such layers)\n\n",
      kHeads, kKv, kHd, reps);
  std::printf("%-7s %-5s %-10s %-7s %12s %12s %12s %10s\n", "prefix", "rows", "prefix", "isa",
              "us/layer", "x30 ms", "GB/s read", "vs scalar");
  for (int64_t tokens : {1451, 4096}) {
    const LayerShape shape{kKv, tokens, kHd};
    auto kraw = Gaussian(shape.elements(), 1, 1.5f);
    auto vraw = Gaussian(shape.elements(), 2, 1.0f);
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
      auto ksuf = Gaussian(static_cast<size_t>(kKv * cap * kHd), 3, 1.5f);
      auto vsuf = Gaussian(static_cast<size_t>(kKv * cap * kHd), 4, 1.0f);
      auto q = Gaussian(static_cast<size_t>(n * kHeads * kHd), 5, 1.0f);
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

// One pool of `layers` layers of `tokens` tokens in one codec, owning its bytes.
struct BenchPool {
  std::string name;
  std::vector<std::vector<int8_t>> k8;
  std::vector<std::vector<uint8_t>> kpacked, v;
  std::vector<std::vector<float>> kscales, norms;
  std::vector<std::vector<uint16_t>> norms16, raw_k, raw_v;
  PrefixView view;
};

// codec "none-f16" (raw), or key_bits / key scale / value bits (edge_bits in the first and
// last `edge` layers) / f16 norms.
bool MakePool(BenchPool& p, const std::string& name, int layers, int64_t tokens, bool raw,
              int key_bits, KeyScaleMode mode, int value_bits, int edge_bits, int edge,
              bool f16_norms) {
  const LayerShape shape{kKv, tokens, kHd};
  p.name = name;
  p.view.kv_heads = kKv;
  p.view.head_dim = kHd;
  p.view.tokens = tokens;
  p.view.layers.resize(layers);
  if (raw) {
    p.view.codec = PrefixCodec::kRaw;
    p.view.raw_dtype = DType::kF16;
    p.raw_k.resize(layers);
    p.raw_v.resize(layers);
  } else {
    p.view.codec = PrefixCodec::kK8V;
    p.view.config.key_bits = key_bits;
    p.view.config.key_scale = mode;
    p.view.config.value_bits = value_bits;
    p.view.config.norm_dtype = f16_norms ? DType::kF16 : DType::kF32;
    p.kpacked.resize(layers);
    p.kscales.resize(layers);
    p.v.resize(layers);
    p.norms.resize(layers);
    p.norms16.resize(layers);
  }
  for (int l = 0; l < layers; ++l) {
    const auto kraw = Gaussian(shape.elements(), 100 + 2 * l, 1.5f);
    const auto vraw = Gaussian(shape.elements(), 101 + 2 * l, 1.0f);
    if (raw) {
      p.raw_k[l].resize(kraw.size());
      p.raw_v[l].resize(vraw.size());
      for (size_t i = 0; i < kraw.size(); ++i) {
        p.raw_k[l][i] = math::FloatToF16(kraw[i]);
        p.raw_v[l][i] = math::FloatToF16(vraw[i]);
      }
      p.view.layers[l] = PrefixLayer{p.raw_k[l].data(), nullptr, p.raw_v[l].data(), nullptr};
      continue;
    }
    CodecConfig c = p.view.config;
    const bool boundary = edge_bits > 0 && (l < edge || l >= layers - edge);
    c.value_bits = boundary ? edge_bits : value_bits;
    p.kpacked[l].resize(shape.vectors() * PackedKeyVectorBytes(kHd, key_bits));
    p.kscales[l].resize(KeyScaleCount(shape, mode));
    p.v[l].resize(shape.vectors() * PackedVectorBytes(kHd, c.value_bits));
    p.norms[l].resize(shape.vectors());
    if (!EncodeKeys(kraw.data(), DType::kF32, shape, c, p.kpacked[l].data(), p.kscales[l].data())
             .ok() ||
        !EncodeValues(vraw.data(), DType::kF32, shape, c, p.v[l].data(), p.norms[l].data()).ok())
      return false;
    const void* norms = p.norms[l].data();
    if (f16_norms) {
      p.norms16[l].resize(p.norms[l].size());
      NormsToF16(p.norms[l].data(), static_cast<int64_t>(p.norms[l].size()), p.norms16[l].data());
      norms = p.norms16[l].data();
    }
    p.view.layers[l] =
        PrefixLayer{p.kpacked[l].data(), p.kscales[l].data(), p.v[l].data(), norms, c.value_bits};
  }
  return true;
}

// `only_pool` / `only_isa`: one pool / ISA (empty: all); `batched_only`: without the
// separate calls (for profiling the batched step).
int BatchTable(int reps, int sessions, int64_t tokens, int layers, const std::string& only_pool,
               const std::string& only_isa, bool batched_only) {
  std::printf(
      "\nbatched decode step: %d sessions x 1 query row over one %lld-token pool, %d layers, "
      "%d heads / %d KV heads, head_dim %d, private suffixes of 21..%d tokens, 1 thread, "
      "median thread CPU time of %d steps\n\n",
      sessions, static_cast<long long>(tokens), layers, kHeads, kKv, kHd, 21 + 3 * (sessions - 1),
      reps);
  std::vector<BenchPool> pools(3);
  if (!MakePool(pools[0], "k8v3", layers, tokens, false, 8, KeyScaleMode::kPerTensor, 3, 0, 0,
                false) ||
      !MakePool(pools[1], "default", layers, tokens, false, 7, KeyScaleMode::kPerChannel, 3, 4, 3,
                true) ||
      !MakePool(pools[2], "none-f16", layers, tokens, true, 8, KeyScaleMode::kPerTensor, 3, 0, 0,
                false)) {
    std::fprintf(stderr, "error: encoding the pool failed\n");
    return 1;
  }
  // Per layer and session: suffix K/V (f32 [kv][cap][hd]), the new row's query and output.
  struct Sess {
    int64_t len = 0, cap = 0;
    std::vector<std::vector<float>> k, v, q, out;
  };
  std::vector<Sess> ss(sessions);
  for (int s = 0; s < sessions; ++s) {
    Sess& x = ss[s];
    x.len = 21 + 3 * s;  // a question of ~20 tokens + 3 s generated, the new row included
    x.cap = x.len + 8;
    for (int l = 0; l < layers; ++l) {
      const uint64_t seed = 7000 + 10 * (static_cast<uint64_t>(s) * layers + l);
      x.k.push_back(Gaussian(static_cast<size_t>(kKv * x.cap * kHd), seed, 1.5f));
      x.v.push_back(Gaussian(static_cast<size_t>(kKv * x.cap * kHd), seed + 1, 1.0f));
      x.q.push_back(Gaussian(static_cast<size_t>(kHeads * kHd), seed + 2, 1.0f));
      x.out.emplace_back(static_cast<size_t>(kHeads * kHd));
    }
  }
  std::printf("%-9s %-7s %-24s %10s %12s %14s %10s\n", "pool", "isa", "step", "ms/step",
              "tok/s attn", "prefix MiB/step", "vs agents");
  for (const BenchPool& p : pools) {
    if (!only_pool.empty() && p.name != only_pool) continue;
    double pool_bytes = 0;
    {
      PrefixView one = p.view;  // LayerBytes averages over the layers: x layers = the pool
      pool_bytes = static_cast<double>(one.LayerBytes()) * layers;
    }
    for (Isa isa : SupportedIsas()) {
      if (!only_isa.empty() && only_isa != IsaName(isa)) continue;
      AttentionOptions o;
      o.isa = static_cast<int>(isa);
      o.threads = 1;
      auto args_of = [&](int s, int l) {
        AttentionArgs a;
        a.prefix = &p.view;
        a.layer = l;
        a.k_suffix = ss[s].k[l].data();
        a.v_suffix = ss[s].v[l].data();
        a.suffix_capacity = ss[s].cap;
        a.suffix_length = ss[s].len;
        a.n = 1;
        a.heads = kHeads;
        a.kv_heads = kKv;
        a.head_dim = kHd;
        a.q = ss[s].q[l].data();
        a.out = ss[s].out[l].data();
        return a;
      };
      bool ok = true;
      const double agents = batched_only ? 0.0 : Median(reps, [&] {
        for (int s = 0; s < sessions; ++s)
          for (int l = 0; l < layers; ++l) ok = ok && AttentionForward(args_of(s, l), o).ok();
      });
      const double layer_major = batched_only ? 0.0 : Median(reps, [&] {
        for (int l = 0; l < layers; ++l)
          for (int s = 0; s < sessions; ++s) ok = ok && AttentionForward(args_of(s, l), o).ok();
      });
      // The batched outputs must equal the separate calls' (bit for bit, as the tests assert).
      std::vector<std::vector<float>> expect(static_cast<size_t>(sessions) * layers);
      for (int s = 0; s < sessions; ++s)
        for (int l = 0; l < layers; ++l) expect[s * layers + l] = ss[s].out[l];
      std::vector<std::vector<AttentionSession>> bs(layers);
      for (int l = 0; l < layers; ++l)
        for (int s = 0; s < sessions; ++s) {
          const AttentionArgs a = args_of(s, l);
          bs[l].push_back(AttentionSession{a.k_suffix, a.v_suffix, a.suffix_capacity,
                                           a.suffix_length, 1, a.q, a.out});
        }
      const double batched = Median(reps, [&] {
        for (int l = 0; l < layers; ++l) {
          BatchAttentionArgs b;
          b.prefix = &p.view;
          b.layer = l;
          b.heads = kHeads;
          b.kv_heads = kKv;
          b.head_dim = kHd;
          b.sessions = bs[l];
          ok = ok && AttentionForwardBatch(b, o).ok();
        }
      });
      if (!ok) {
        std::fprintf(stderr, "error: attention failed\n");
        return 1;
      }
      for (int s = 0; s < sessions && !batched_only; ++s)
        for (int l = 0; l < layers; ++l)
          if (ss[s].out[l] != expect[s * layers + l]) {
            std::fprintf(stderr, "error: batched output of session %d layer %d differs\n", s, l);
            return 1;
          }
      const double mib = pool_bytes / (1024.0 * 1024.0);
      auto row = [&](const char* what, double t, double read) {
        std::printf("%-9s %-7s %-24s %10.2f %12.0f %14.2f %9.2fx\n", p.name.c_str(), IsaName(isa),
                    what, t * 1e3, sessions / t, read, agents / t);
      };
      row("separate, session-major", agents, mib * sessions);
      row("separate, layer-major", layer_major, mib * sessions);
      row("batched", batched, mib);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_attention: split attention over a compressed prefix; batched sessions"};
  int reps = 15;
  std::string table = "all";
  int sessions = 16, layers = 30;
  int64_t tokens = 1469;
  app.add_option("--reps", reps, "Timed calls per figure (median)");
  app.add_option("--table", table, "single, batch or all")
      ->check(CLI::IsMember({"single", "batch", "all"}));
  app.add_option("--sessions", sessions, "batch: sessions per step")->check(CLI::Range(1, 4096));
  app.add_option("--tokens", tokens, "batch: pool tokens")->check(CLI::Range(1, 1 << 20));
  app.add_option("--layers", layers, "batch: layers")->check(CLI::Range(1, 256));
  std::string only_pool, only_isa;
  app.add_option("--pool", only_pool, "batch: only this pool (k8v3, default, none-f16)");
  app.add_option("--isa", only_isa, "batch: only this ISA (scalar, avx2, avx512)");
  bool batched_only = false;
  app.add_flag("--batched-only", batched_only,
               "batch: time only the batched step (no separate calls, no equality check)");
  CLI11_PARSE(app, argc, argv);
  SetComputeThreads(1);
  if (table != "batch" && SingleTable(reps) != 0) return 1;
  if (table != "single" && BatchTable(std::max(3, reps / 3), sessions, tokens, layers, only_pool,
                                      only_isa, batched_only) != 0)
    return 1;
  return 0;
}
