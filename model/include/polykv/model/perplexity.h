// llama.cpp's perplexity protocol (tools/perplexity/perplexity.cpp, the default mode of
// `llama-perplexity -f F -c N --chunks K`), so that our figures compare number for number.
//
// Protocol, for tokens t_0 .. t_{n-1} of the WHOLE file tokenized at once (with BOS in front
// only when the model's metadata asks for it: Tokenizer::adds_bos()):
//  - n_chunk = min(K, floor(n / N)) chunks; chunk i is t_{iN} .. t_{iN+N-1} (consecutive,
//    non-overlapping, the tail that does not fill a chunk is dropped); n < 2N is an error;
//  - when the model adds BOS, the chunk's first token is replaced by BOS (the text keeps its
//    token for the other chunks' sake; chunk 0 already starts with BOS);
//  - each chunk is evaluated from an empty cache, positions 0 .. N-1;
//  - with first = floor(N / 2), positions first .. N-2 predict t_{iN+first+1} .. t_{iN+N-1}:
//    N - first - 1 scored tokens per chunk (the last position's prediction is not used);
//  - nll = sum of -log softmax(logits)[target] (f32 logits, the softmax sum in f64 as
//    llama.cpp), nll2 = sum of squares; PPL = exp(nll / count) and the standard error
//    PPL * sqrt((nll2 / count - (nll / count)^2) / (count - 1)) ("PPL = X +/- Y").
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/types/span.h"
#include "polykv/model/llama.h"
#include "polykv/status.h"

namespace polykv::model {

/// Options of ChunkedPerplexity.
struct ChunkedPerplexityOptions {
  int64_t context = 512;     ///< N
  int64_t chunks = -1;       ///< K; < 0 = all
  bool replace_bos = false;  ///< replace each chunk's first token by `bos_id` (model adds BOS)
  int32_t bos_id = -1;
  /// Rows per forward (llama.cpp's physical batch, -ub, is 512): the chunk runs in pieces of
  /// this many rows over its growing cache; only pieces with scored positions return logits.
  int64_t rows = 512;
  /// Called after each chunk with (chunks done, running PPL over all tokens scored so far).
  std::function<void(int64_t, double)> progress;
};

/// Which positions one chunk scores (for tests and documentation).
struct ChunkPlan {
  int64_t start = 0;   ///< index of the chunk's first token in the text
  int64_t first = 0;   ///< first scored position (N / 2)
  int64_t scored = 0;  ///< N - first - 1
  /// Position p in [first, first + scored) of the chunk predicts text token start + p + 1.
};

/// The chunks ChunkedPerplexity evaluates for `n` tokens. kInvalidArgument for N < 2 or
/// n < 2N (as llama.cpp: "you need at least 2N tokens").
[[nodiscard]] StatusOr<std::vector<ChunkPlan>> PlanChunks(int64_t n, int64_t context,
                                                          int64_t chunks);

/// Result of ChunkedPerplexity.
struct ChunkedPerplexityResult {
  int64_t chunks = 0;
  int64_t count = 0;              ///< scored tokens
  double nll = 0;                 ///< sum of -log p
  double nll2 = 0;                ///< sum of (log p)^2
  std::vector<double> running;    ///< PPL after each chunk
  std::vector<double> token_nll;  ///< -log p of every scored token, in order
  double ppl() const;
  double stderr_ppl() const;  ///< llama.cpp's "+/-" (0 when undefined)
};

/// The one scoring loop: feeds `input` at cache.length.. in forwards of at most `rows` rows
/// (at least 1) and returns -log p(targets[i] | positions up to input[i]) for every i, by
/// LogProb. Errors: kInvalidArgument when the spans differ in size, are empty or a target
/// is outside the vocabulary; the model's Forward errors.
[[nodiscard]] StatusOr<std::vector<double>> ScoreTokens(LlamaModel& m, KvCache& cache,
                                                        absl::Span<const int32_t> input,
                                                        absl::Span<const int32_t> targets,
                                                        int64_t rows);

/// Runs the protocol above. Errors: those of PlanChunks, kInvalidArgument for replace_bos
/// with bos_id < 0, and the model's Forward errors.
[[nodiscard]] StatusOr<ChunkedPerplexityResult> ChunkedPerplexity(
    LlamaModel& m, absl::Span<const int32_t> tokens, const ChunkedPerplexityOptions& o);

}  // namespace polykv::model
