// CPU next-token choice: greedy argmax and temperature + top-p sampling (sampling.h).
#include "polykv/kernels/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "polykv/kernels/ops_math.h"

namespace polykv::kernels {

int32_t ArgmaxLogits(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (opmath::LogitBeats(logits[i], i, logits[best], best)) best = i;
  return static_cast<int32_t>(best);
}

StatusOr<int32_t> SampleTopP(const float* logits, int64_t vocab, float temperature, float top_p,
                             double u) {
  if (vocab < 1 || vocab > INT32_MAX || logits == nullptr)
    return absl::InvalidArgumentError(
        absl::StrCat("SampleTopP: vocab ", vocab, " (1..2^31-1) with non-null logits"));
  if (!(temperature > 0.0f))
    return absl::InvalidArgumentError(
        absl::StrCat("SampleTopP: temperature must be > 0, got ", temperature));
  if (!(top_p > 0.0f && top_p <= 1.0f))
    return absl::InvalidArgumentError(
        absl::StrCat("SampleTopP: top_p must be in (0, 1], got ", top_p));
  if (!(u >= 0.0 && u < 1.0))
    return absl::InvalidArgumentError(absl::StrCat("SampleTopP: u must be in [0, 1), got ", u));
  return SampleTopPUnchecked(logits, vocab, temperature, top_p, u);
}

int32_t SampleTopPUnchecked(const float* logits, int64_t vocab, float temperature, float top_p,
                            double u) {
  const double t = temperature;
  double mx = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, static_cast<double>(logits[i]) / t);
  std::vector<double> p(static_cast<size_t>(vocab));
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    p[i] = std::exp(static_cast<double>(logits[i]) / t - mx);
    sum += p[i];
  }
  for (double& v : p) v /= sum;
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  double cum = 0;
  int64_t keep = 0;
  while (keep < vocab) {
    cum += p[idx[keep++]];
    if (cum >= top_p) break;
  }
  double r = u * cum;
  for (int64_t i = 0; i < keep; ++i) {
    r -= p[idx[i]];
    if (r < 0) return idx[i];
  }
  return idx[keep - 1];
}

}  // namespace polykv::kernels
