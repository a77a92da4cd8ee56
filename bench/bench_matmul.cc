// bench_matmul: the matrix kernels per weight type and ISA on synthetic blocks: matrix-vector
// (decode) bandwidth in GB/s of weight bytes next to single-thread memcpy of the same bytes
// (measured in the same run), the same from the packed layout (PackWeights; avx512 reads it,
// other ISAs the blocks), and small-batch throughput (GMAC/s) for 4, 16 and 32 rows.
// Usage: bench_matmul [--mib N] [--threads T] [--types Q4_1,Q8_0,...] [--cols C]
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "polykv/kernels/codec_math.h"
#include "polykv/kernels/cpu.h"
#include "polykv/kernels/matmul.h"

namespace {

namespace k = polykv::kernels;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Valid random blocks: random codes, small finite f16 scales at the type's scale offsets.
std::vector<uint8_t> Blocks(k::WeightType t, int64_t rows, int64_t cols) {
  const k::BlockFormat f = k::WeightBlockFormat(t).value();
  const int64_t nb = rows * cols / f.values;
  std::vector<uint8_t> w(static_cast<size_t>(nb * f.bytes));
  std::mt19937_64 rng(1);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  const uint16_t h = k::math::FloatToF16(0.01f);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* p = w.data() + b * f.bytes;
    if (f.values == 1) {
      if (t == k::WeightType::kF32) {
        const float v = 0.01f;
        std::memcpy(p, &v, 4);
      } else {
        std::memcpy(p, &h, 2);
      }
    } else if (t == k::WeightType::kQ6_K) {
      std::memcpy(p + 208, &h, 2);
    } else {
      std::memcpy(p, &h, 2);
      if (t == k::WeightType::kQ4_1 || t == k::WeightType::kQ5_1 || t == k::WeightType::kQ4_K ||
          t == k::WeightType::kQ5_K)
        std::memcpy(p + 2, &h, 2);
    }
  }
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_matmul: matrix kernels over weight blocks"};
  double mib = 64;
  int threads = 1;
  std::string types = "F32,F16,BF16,Q4_0,Q4_1,Q5_0,Q5_1,Q8_0,Q4_K,Q5_K,Q6_K";
  app.add_option("--mib", mib, "Weight bytes per matrix (MiB)");
  app.add_option("--threads", threads, "Threads");
  app.add_option("--types", types, "Comma-separated weight types");
  // 1536: a multiple of 256 (K-quants) and SmolLM2's FFN width; 576 is its hidden width.
  int64_t cols = 1536;
  app.add_option("--cols", cols, "Columns of every matrix (a multiple of each type's block)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  std::printf("kernels: %s; threads %d; cols %lld\n", k::IsaName(k::BestIsa()), threads,
              static_cast<long long>(cols));
  // memcpy of the same bytes, single thread, best of 5.
  const size_t bytes = static_cast<size_t>(mib * 1048576);
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 1e30;
  for (int r = 0; r < 6; ++r) {
    const double t0 = Now();
    std::memcpy(b.data(), a.data(), bytes);
    if (r > 0) best = std::min(best, Now() - t0);
  }
  const double memcpy_gbps = bytes / best / 1e9;
  std::printf("single-thread memcpy of %.0f MiB: %.2f GB/s\n\n", mib, memcpy_gbps);
  std::printf("%-6s %-7s %12s %10s %13s %14s %14s %14s\n", "type", "isa", "matvec GB/s",
              "vs memcpy", "packed GB/s", "4 rows GMAC/s", "16 rows GMAC/s", "32 rows GMAC/s");
  for (absl::string_view name : absl::StrSplit(types, ',')) {
    k::WeightType t = k::WeightType::kF32;
    bool found = false;
    for (uint32_t v = 0; v < 64; ++v) {
      if (k::IsSupportedWeightType(v) && name == k::WeightTypeName(static_cast<k::WeightType>(v))) {
        t = static_cast<k::WeightType>(v);
        found = true;
      }
    }
    if (!found) {
      std::fprintf(stderr, "unknown type %s\n", std::string(name).c_str());
      return 1;
    }
    const k::BlockFormat f = k::WeightBlockFormat(t).value();
    const int64_t rows = static_cast<int64_t>(bytes / (cols / f.values * f.bytes));
    const auto w = Blocks(t, rows, cols);
    const auto view = k::MakeWeightView(t, w.data(), w.size(), rows, cols).value();
    // The packed layout of the same matrix (where the type has one): its matvec is the
    // "packed" column, next to the blocks' own.
    std::vector<uint8_t> packed(static_cast<size_t>(k::PackedWeightBytes(view)));
    k::WeightView packed_view = view;
    if (!packed.empty() && k::PackWeights(view, absl::MakeSpan(packed)).ok())
      packed_view.packed = packed.data();
    std::vector<float> x(32 * cols), y(32 * rows);
    std::mt19937_64 rng(2);
    std::normal_distribution<float> g;
    for (auto& v : x) v = g(rng);
    for (k::Isa isa : k::SupportedIsas()) {
      k::MatMulOptions o;
      o.isa = static_cast<int>(isa);
      o.threads = threads;
      // Best of 3 (after a warm-up) of one matrix-vector product over `v`.
      auto matvec_seconds = [&](const k::WeightView& v) {
        double best_s = 1e30;
        for (int r = 0; r < 4; ++r) {
          const double t0 = Now();
          if (!k::MatMul(v, x.data(), 1, cols, y.data(), rows, o).ok()) return -1.0;
          if (r > 0) best_s = std::min(best_s, Now() - t0);
        }
        return best_s;
      };
      const double mv = matvec_seconds(view);
      const double mvp =
          packed_view.packed != nullptr && isa == k::Isa::kAvx512 ? matvec_seconds(packed_view) : 0;
      if (mv < 0 || mvp < 0) return 1;
      double gmac[3];
      const int64_t ns[3] = {4, 16, 32};
      for (int i = 0; i < 3; ++i) {
        double tb = 1e30;
        for (int r = 0; r < 2; ++r) {
          const double t0 = Now();
          if (!k::MatMul(view, x.data(), ns[i], cols, y.data(), rows, o).ok()) return 1;
          tb = std::min(tb, Now() - t0);
        }
        gmac[i] = static_cast<double>(rows) * cols * ns[i] / tb / 1e9;
      }
      const double gbps = view.bytes() / mv / 1e9;
      char packed_col[32] = "-";
      if (mvp > 0) std::snprintf(packed_col, sizeof(packed_col), "%.2f", view.bytes() / mvp / 1e9);
      std::printf("%-6s %-7s %12.2f %9.0f%% %13s %14.1f %14.1f %14.1f\n", std::string(name).c_str(),
                  k::IsaName(isa), gbps, 100 * gbps / memcpy_gbps, packed_col, gmac[0], gmac[1],
                  gmac[2]);
    }
  }
  return 0;
}
