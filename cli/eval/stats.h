// Statistics of the evaluation: paired differences over windows, Student-t intervals, and
// llama-perplexity's standard error of a perplexity.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace polykv::eval {

/// Regularized incomplete beta function I_x(a, b) (continued fraction, Numerical Recipes
/// 6.4), for a, b > 0 and x in [0, 1]; |error| < 1e-12.
double RegularizedBeta(double a, double b, double x);

/// Student t cumulative distribution function with `df` >= 1 degrees of freedom.
double StudentTCdf(double t, double df);

/// The p-quantile (0 < p < 1) of Student's t with `df` >= 1 degrees of freedom (bisection
/// on StudentTCdf to 1e-12): 0.975 -> 12.706 (df 1), 2.262 (df 9), 1.960 as df -> inf.
double StudentTQuantile(double p, double df);

/// Mean of paired differences d_i = treated_i - baseline_i with a two-sided `level`
/// confidence interval: mean +- t_{(1+level)/2, n-1} * sd / sqrt(n) (sd with n - 1). With one
/// sample the interval is unbounded (lo = -inf, hi = +inf).
struct PairedInterval {
  int64_t n = 0;
  double mean = 0;
  double sd = 0;  ///< sample standard deviation of the differences
  double lo = 0;  ///< interval on the mean difference
  double hi = 0;
};
PairedInterval PairedMeanInterval(const std::vector<double>& treated,
                                  const std::vector<double>& baseline, double level = 0.95);

/// The same interval expressed as a perplexity change in percent when the differences are of
/// mean NLL per window (windows with equal token counts): 100 * (exp(d) - 1) for d in
/// {mean, lo, hi}.
struct PercentChange {
  double mean = 0, lo = 0, hi = 0;
};
PercentChange AsPplChangePercent(const PairedInterval& nll_diff);

/// The two markdown table cells of a change, e.g. "+0.46% | [+0.31%, +0.61%]".
std::string PercentChangeCells(const PercentChange& change);

/// llama-perplexity's estimate over scored tokens with negative log-likelihoods nll_i:
/// PPL = exp(mean), and its standard error exp(mean) * sqrt((mean(nll^2) - mean^2) / (n - 1))
/// (tools/perplexity/perplexity.cpp, "Final estimate: PPL = X +/- Y").
struct PplEstimate {
  int64_t count = 0;
  double nll = 0;   ///< sum of nll_i
  double nll2 = 0;  ///< sum of nll_i^2
  double Ppl() const;
  double StdErr() const;  ///< 0 when count < 2 or the variance is not positive
};

}  // namespace polykv::eval
