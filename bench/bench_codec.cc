// Codec throughput on the Llama-3-8B layer shape (8 KV heads x 4096 tokens x 128, bf16):
// encode/decode GB/s of bf16 data on 1 thread and all threads, next to memcpy of the same
// bytes measured in the same run. Prints a table: figure, unit, value, baseline, ratio.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "polykv/kernels/codec.h"
#include "polykv/kernels/codec_math.h"

namespace {

using namespace polykv::kernels;

double Now(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Best-of-`reps` time of fn in seconds (after one warm-up call): wall clock, or with
// `thread_cpu` the calling thread's CPU time (immune to other processes on a loaded
// machine; meaningful only when all the work runs on the calling thread).
double BestSeconds(int reps, const std::function<void()>& fn, bool thread_cpu = false) {
  const clockid_t clock = thread_cpu ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC;
  fn();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = Now(clock);
    fn();
    best = std::min(best, Now(clock) - t0);
  }
  return best;
}

// memcpy of `bytes` split over `threads` threads (the baseline for the same thread count).
void ParallelMemcpy(uint8_t* dst, const uint8_t* src, size_t bytes, int threads) {
  if (threads <= 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
  std::vector<std::thread> ts;
  const size_t per = (bytes + threads - 1) / threads;
  for (int t = 0; t < threads; ++t) {
    const size_t b = std::min(bytes, per * t), e = std::min(bytes, per * (t + 1));
    ts.emplace_back([=] { std::memcpy(dst + b, src + b, e - b); });
  }
  for (auto& t : ts) t.join();
}

void Check(const polykv::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_codec: PolyKV codec throughput vs memcpy"};
  int heads = 8, tokens = 4096, head_dim = 128, bits = 3, reps = 5, threads = 0;
  app.add_option("--heads", heads, "KV heads");
  app.add_option("--tokens", tokens, "tokens");
  app.add_option("--head-dim", head_dim, "head_dim");
  app.add_option("--v-bits", bits, "value bits (2, 3, 4)");
  app.add_option("--reps", reps, "timed repetitions (best is reported)");
  app.add_option("--threads", threads, "'all threads' count (0 = hardware threads)");
  CLI11_PARSE(app, argc, argv);

  const LayerShape shape{heads, tokens, head_dim};
  CodecConfig cfg;
  cfg.value_bits = bits;
  const size_t n = static_cast<size_t>(shape.elements());
  const size_t bf16_bytes = 2 * n;

  std::mt19937_64 rng(42);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> x(n);
  for (auto& v : x) v = math::FloatToBf16(dist(rng));
  std::vector<uint16_t> out(n);
  std::vector<int8_t> q(n);
  std::vector<float> scales(KeyScaleCount(shape, cfg.key_scale));
  std::vector<uint8_t> packed(shape.vectors() * PackedVectorBytes(head_dim, bits));
  std::vector<float> norms(shape.vectors());
  std::vector<uint8_t> copy(bf16_bytes);

  const int all =
      threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::printf(
      "bench_codec: layer [%d][%d][%d] bf16 = %.1f MiB per tensor, V %d bits, K int8 per-tensor\n",
      heads, tokens, head_dim, bf16_bytes / 1048576.0, bits);
  std::printf("%-34s %-6s %10s %10s %8s\n", "figure", "unit", "value", "memcpy", "ratio");
  std::vector<int> thread_counts = {1};
  if (all > 1) thread_counts.push_back(all);
  for (int th : thread_counts) {
    SetCodecThreads(th);
    const double t_copy = BestSeconds(reps, [&] {
      ParallelMemcpy(copy.data(), reinterpret_cast<const uint8_t*>(x.data()), bf16_bytes, th);
    });
    const double copy_gbs = bf16_bytes / t_copy / 1e9;
    struct Row {
      const char* name;
      std::function<void()> fn;
    };
    const Row rows[] = {
        {"V encode (TurboQuant-MSE)",
         [&] {
           Check(EncodeValues(x.data(), DType::kBF16, shape, cfg, packed.data(), norms.data()));
         }},
        {"V decode",
         [&] {
           Check(DecodeValues(packed.data(), norms.data(), shape, cfg, out.data(), DType::kBF16));
         }},
        {"K encode (int8, scales)",
         [&] {
           Check(
               QuantizeKeys(x.data(), DType::kBF16, shape, cfg.key_scale, q.data(), scales.data()));
         }},
        {"K decode",
         [&] {
           Check(DequantizeKeys(q.data(), scales.data(), shape, cfg.key_scale, out.data(),
                                DType::kBF16));
         }},
    };
    for (const Row& r : rows) {
      const double t = BestSeconds(reps, r.fn);
      const double gbs = bf16_bytes / t / 1e9;
      char name[64];
      std::snprintf(name, sizeof(name), "%s, %d thr", r.name, th);
      std::printf("%-34s %-6s %10.3f %10.3f %8.3f\n", name, "GB/s", gbs, copy_gbs, gbs / copy_gbs);
      if (th == 1) {
        // The same on thread CPU time, against memcpy on thread CPU time.
        const double tc = BestSeconds(reps, r.fn, true);
        const double tcc = BestSeconds(
            reps,
            [&] {
              std::memcpy(copy.data(), reinterpret_cast<const uint8_t*>(x.data()), bf16_bytes);
            },
            true);
        std::printf("%-34s %-6s %10.3f %10.3f %8.3f\n", "  per core (thread CPU time)", "GB/s",
                    bf16_bytes / tc / 1e9, bf16_bytes / tcc / 1e9, tcc / tc);
      } else {
        std::printf("%-34s %-6s %10.3f %10s %8s\n", "  per core", "GB/s", gbs / th, "-", "-");
      }
    }
  }
  SetCodecThreads(0);
  // Byte accounting of the same shape, and the model-level ratios asked for in the report.
  const auto llama = ModelCompressionRatio(32, LayerShape{8, 4096, 128}, cfg);
  const auto smol = ModelCompressionRatio(30, LayerShape{3, 4096, 64}, cfg);
  std::printf("%-34s %-6s %10.4f %10.4f %8.4f\n", "Llama-3-8B ratio vs bf16 @4096", "x",
              llama.effective, llama.nominal, llama.effective / llama.nominal);
  std::printf("%-34s %-6s %10.4f %10.4f %8.4f\n", "SmolLM2-135M ratio vs bf16 @4096", "x",
              smol.effective, smol.nominal, smol.effective / smol.nominal);
  std::printf(
      "(ratio rows: value = effective incl. scales/norms, baseline = paper nominal "
      "16/((8+b)/2))\n");
  return 0;
}
