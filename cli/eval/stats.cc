// Paired intervals (Student t) and llama-perplexity's standard error.
#include "eval/stats.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"

namespace polykv::eval {
namespace {

// Continued fraction of the incomplete beta function (modified Lentz).
double BetaContinuedFraction(double a, double b, double x) {
  constexpr double kTiny = 1e-300;
  const double qab = a + b, qap = a + 1, qam = a - 1;
  double c = 1, d = 1 - qab * x / qap;
  if (std::fabs(d) < kTiny) d = kTiny;
  d = 1 / d;
  double h = d;
  for (int m = 1; m <= 10000; ++m) {
    const int m2 = 2 * m;
    double aa = m * (b - m) * x / ((qam + m2) * (a + m2));
    d = 1 + aa * d;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = 1 + aa / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1 / d;
    h *= d * c;
    aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
    d = 1 + aa * d;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = 1 + aa / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1) < 1e-15) break;
  }
  return h;
}

}  // namespace

double RegularizedBeta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double lbt =
      std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x);
  const double bt = std::exp(lbt);
  if (x < (a + 1) / (a + b + 2)) return bt * BetaContinuedFraction(a, b, x) / a;
  return 1 - bt * BetaContinuedFraction(b, a, 1 - x) / b;
}

double StudentTCdf(double t, double df) {
  const double x = df / (df + t * t);
  const double tail = 0.5 * RegularizedBeta(df / 2, 0.5, x);  // P(T > |t|)
  return t >= 0 ? 1 - tail : tail;
}

double StudentTQuantile(double p, double df) {
  if (p == 0.5) return 0;
  double lo = -1e4, hi = 1e4;
  for (int i = 0; i < 200 && hi - lo > 1e-12; ++i) {
    const double mid = 0.5 * (lo + hi);
    if (StudentTCdf(mid, df) < p) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return 0.5 * (lo + hi);
}

PairedInterval PairedMeanInterval(const std::vector<double>& treated,
                                  const std::vector<double>& baseline, double level) {
  PairedInterval r;
  const size_t n = std::min(treated.size(), baseline.size());
  r.n = static_cast<int64_t>(n);
  if (n == 0) return r;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += treated[i] - baseline[i];
  r.mean = sum / static_cast<double>(n);
  if (n < 2) {
    r.lo = -std::numeric_limits<double>::infinity();
    r.hi = std::numeric_limits<double>::infinity();
    return r;
  }
  double ss = 0;
  for (size_t i = 0; i < n; ++i) {
    const double e = treated[i] - baseline[i] - r.mean;
    ss += e * e;
  }
  r.sd = std::sqrt(ss / static_cast<double>(n - 1));
  const double t = StudentTQuantile(0.5 + level / 2, static_cast<double>(n - 1));
  const double half = t * r.sd / std::sqrt(static_cast<double>(n));
  r.lo = r.mean - half;
  r.hi = r.mean + half;
  return r;
}

std::string PercentChangeCells(const PercentChange& c) {
  return absl::StrFormat("%+.2f%% | [%+.2f%%, %+.2f%%]", c.mean, c.lo, c.hi);
}

PercentChange AsPplChangePercent(const PairedInterval& d) {
  return {100 * std::expm1(d.mean), 100 * std::expm1(d.lo), 100 * std::expm1(d.hi)};
}

double PplEstimate::Ppl() const { return count > 0 ? std::exp(nll / count) : 0; }

double PplEstimate::StdErr() const {
  if (count < 2) return 0;
  const double mean = nll / count;
  const double var = nll2 / count - mean * mean;
  if (!(var > 0)) return 0;
  return std::sqrt(var / (count - 1)) * std::exp(mean);
}

}  // namespace polykv::eval
