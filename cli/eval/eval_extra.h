// polykv-cli eval, the parts beyond perplexity: the Pareto table, greedy agreement of answers
// to questions about a shared document, and helpers.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "eval/eval.h"

namespace polykv::eval {

/// Rows sorted by bits per value, a "yes" on those not dominated (no other row has fewer or
/// equal bits and a lower or equal PPL change, one of them strictly).
std::string ParetoMarkdown(const std::vector<PplRow>& rows);

/// Options of GreedyAgreement.
struct GreedyOptions {
  std::string document;   ///< text file, framed as the agents frame it (ChatDocument)
  std::string questions;  ///< one question per line (ChatQuestionPrompt)
  int count = 4;          ///< first `count` questions
  int max_new_tokens = 64;
  std::function<void(const std::string&)> log;
};

/// One (question, codec) answer compared with the full-precision answer.
struct GreedyRow {
  std::string codec, spec, question;
  std::vector<int32_t> full_ids, codec_ids;  ///< max_new_tokens each (EOS not stopping)
  std::string full_text, codec_text;         ///< up to the first end-of-generation token
  double agreement = 0;   ///< share of positions i < max_new_tokens with equal tokens
  int common_prefix = 0;  ///< tokens before the first difference
};

/// Prefills the framed document once, then answers every question greedily with the full
/// cache and with each codec's reconstruction of it (attended to in place).
[[nodiscard]] StatusOr<std::vector<GreedyRow>> GreedyAgreement(model::LlamaModel& m,
                                                               const std::vector<CodecSpec>& codecs,
                                                               const GreedyOptions& o);

/// "codec,spec,question,agreement,common_prefix,tokens" CSV.
inline constexpr char kGreedyCsvHeader[] = "codec,spec,question,agreement,common_prefix,tokens";
std::string GreedyCsv(const std::vector<GreedyRow>& rows);
/// Per codec: mean agreement, mean common prefix.
std::string GreedyMarkdown(const std::vector<GreedyRow>& rows);
/// One JSON object per line: codec, spec, question, full, answer (for the similarity step).
std::string AnswersJsonl(const std::vector<GreedyRow>& rows);

/// `rel` found from the working directory or above the executable (the source tree), or "".
std::string FindScript(const std::string& rel);

}  // namespace polykv::eval
