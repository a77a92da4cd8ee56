// llama.cpp's perplexity protocol on the public LlamaModel API (see perplexity.h).
#include "polykv/model/perplexity.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace polykv::model {

double ChunkedPerplexityResult::ppl() const {
  return count > 0 ? std::exp(nll / static_cast<double>(count)) : 0;
}

double ChunkedPerplexityResult::stderr_ppl() const {
  if (count < 2) return 0;
  const double mean = nll / static_cast<double>(count);
  const double var = nll2 / static_cast<double>(count) - mean * mean;
  if (!(var > 0)) return 0;
  return std::sqrt(var / static_cast<double>(count - 1)) * std::exp(mean);
}

StatusOr<std::vector<ChunkPlan>> PlanChunks(int64_t n, int64_t context, int64_t chunks) {
  if (context < 2)
    return absl::InvalidArgumentError(absl::StrCat("context must be >= 2, got ", context));
  if (n < 2 * context)
    return absl::InvalidArgumentError(absl::StrCat(
        "you need at least ", 2 * context, " tokens to evaluate perplexity with a context of ",
        context, "; the text tokenizes to only ", n));
  int64_t k = n / context;
  if (chunks >= 0) k = std::min(k, chunks);
  std::vector<ChunkPlan> out;
  for (int64_t i = 0; i < k; ++i) {
    ChunkPlan p;
    p.start = i * context;
    p.first = context / 2;
    p.scored = context - p.first - 1;
    out.push_back(p);
  }
  return out;
}

StatusOr<std::vector<double>> ScoreTokens(LlamaModel& m, KvCache& cache,
                                          absl::Span<const int32_t> input,
                                          absl::Span<const int32_t> targets, int64_t rows) {
  if (input.empty() || input.size() != targets.size())
    return absl::InvalidArgumentError(absl::StrCat("score: ", input.size(), " inputs and ",
                                                   targets.size(), " targets (need equal, > 0)"));
  for (int32_t t : targets)
    if (t < 0 || t >= m.config().vocab)
      return absl::InvalidArgumentError(absl::StrCat(
          "score: target token id ", t, " outside the vocabulary [0, ", m.config().vocab, ")"));
  rows = std::max<int64_t>(rows, 1);
  std::vector<double> nll;
  nll.reserve(input.size());
  for (size_t done = 0; done < input.size();) {
    const size_t n = std::min<size_t>(static_cast<size_t>(rows), input.size() - done);
    POLYKV_ASSIGN_OR_RETURN(Logits logits,
                            m.Forward(input.subspan(done, n), cache, /*all_logits=*/true));
    for (size_t i = 0; i < n; ++i)
      nll.push_back(-LogProb(logits.row(static_cast<int64_t>(i)), targets[done + i]));
    done += n;
  }
  return nll;
}

StatusOr<ChunkedPerplexityResult> ChunkedPerplexity(LlamaModel& m, absl::Span<const int32_t> tokens,
                                                    const ChunkedPerplexityOptions& o) {
  POLYKV_ASSIGN_OR_RETURN(std::vector<ChunkPlan> plan,
                          PlanChunks(static_cast<int64_t>(tokens.size()), o.context, o.chunks));
  if (o.replace_bos && o.bos_id < 0)
    return absl::InvalidArgumentError("replace_bos needs the model's BOS id");
  const int64_t rows = std::max<int64_t>(1, o.rows);
  const int64_t n_ctx = o.context;
  ChunkedPerplexityResult r;
  try {
    for (const ChunkPlan& p : plan) {
      std::vector<int32_t> chunk(tokens.begin() + p.start, tokens.begin() + p.start + n_ctx);
      if (o.replace_bos) chunk[0] = o.bos_id;
      KvCache cache = m.NewCache(n_ctx);
      const int64_t end_scored = p.first + p.scored;  // one past the last scored position
      for (int64_t b = 0; b < n_ctx; b += rows) {
        const int64_t e = std::min(n_ctx, b + rows);
        const bool need = e > p.first && b < end_scored;
        POLYKV_ASSIGN_OR_RETURN(
            Logits logits,
            m.Forward(absl::MakeConstSpan(chunk).subspan(b, e - b), cache, /*all_logits=*/need));
        if (!need) continue;
        for (int64_t pos = std::max(b, p.first); pos < std::min(e, end_scored); ++pos) {
          const int32_t target = tokens[p.start + pos + 1];
          const double lp = LogProb(logits.row(pos - b), target);
          r.nll += -lp;
          r.nll2 += lp * lp;
          r.token_nll.push_back(-lp);
          ++r.count;
        }
      }
      ++r.chunks;
      r.running.push_back(r.ppl());
      if (o.progress) o.progress(r.chunks, r.ppl());
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("ChunkedPerplexity: ", e.what()));
  }
  return r;
}

}  // namespace polykv::model
