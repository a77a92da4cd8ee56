// Lloyd-Max codebooks for N(0,1), computed by Lloyd's algorithm in double and cached.
#include <array>
#include <cmath>
#include <mutex>
#include <optional>

#include "absl/strings/str_cat.h"
#include "internal.h"

namespace polykv::kernels {
namespace {

double Pdf(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI); }
double Cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

// Lloyd's algorithm on the N(0,1) density: thresholds are midpoints of adjacent levels,
// levels are the conditional means E[x | a < x < b] = (phi(a) - phi(b)) / (Phi(b) - Phi(a))
// of their cells. Starts from uniform levels on [-2.5, 2.5] (symmetric, so the result is
// symmetric) and iterates until no level moves by more than 1e-13.
std::vector<double> LloydMax(int bits) {
  const int n = 1 << bits;
  std::vector<double> level(n), t(n + 1);
  for (int i = 0; i < n; ++i) level[i] = n == 1 ? 0.0 : -2.5 + 5.0 * i / (n - 1);
  for (int iter = 0; iter < 100000; ++iter) {
    t[0] = -INFINITY;
    t[n] = INFINITY;
    for (int i = 1; i < n; ++i) t[i] = 0.5 * (level[i - 1] + level[i]);
    double moved = 0.0;
    for (int i = 0; i < n; ++i) {
      const double a = t[i], b = t[i + 1];
      const double pa = std::isinf(a) ? 0.0 : Pdf(a), pb = std::isinf(b) ? 0.0 : Pdf(b);
      // Phi(b) - Phi(a) via the tail that keeps precision.
      const double mass = a >= 0 ? Cdf(-a) - Cdf(-b) : Cdf(b) - Cdf(a);
      const double c = (pa - pb) / mass;
      moved = std::max(moved, std::fabs(c - level[i]));
      level[i] = c;
    }
    if (moved < 1e-13) break;
  }
  return level;
}

}  // namespace

StatusOr<std::vector<float>> LloydMaxCodebook(int32_t bits) {
  POLYKV_ASSIGN_OR_RETURN(math::ValueCodebook cb, internal::GetValueCodebook(bits));
  return std::vector<float>(cb.levels, cb.levels + (1 << bits));
}

namespace internal {

StatusOr<math::ValueCodebook> GetValueCodebook(int32_t bits) {
  if (bits < 1 || bits > math::kMaxValueBits) {
    return absl::InvalidArgumentError(
        absl::StrCat("value bits must be in 1..4 for a Lloyd-Max codebook, got ", bits));
  }
  static std::mutex mu;
  static std::array<std::optional<math::ValueCodebook>, math::kMaxValueBits + 1> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (!cache[bits]) {
    const std::vector<double> l = LloydMax(bits);
    math::ValueCodebook cb;
    cb.bits = bits;
    const int n = 1 << bits;
    for (int i = 0; i < n; ++i) cb.levels[i] = static_cast<float>(l[i]);
    for (int i = 0; i + 1 < n; ++i) cb.thresholds[i] = static_cast<float>(0.5 * (l[i] + l[i + 1]));
    cache[bits] = cb;
  }
  return *cache[bits];
}

}  // namespace internal
}  // namespace polykv::kernels
