// Pareto table, greedy agreement with full precision, answers for the similarity step.
#include "eval/eval_extra.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "polykv/agent.h"
#include "polykv/model/prefill.h"
#include "util/files.h"

namespace polykv::eval {

std::string ParetoMarkdown(const std::vector<PplRow>& in) {
  std::vector<PplRow> rows = in;
  std::sort(rows.begin(), rows.end(), [](const PplRow& a, const PplRow& b) {
    return a.size.bits_per_value < b.size.bits_per_value;
  });
  std::string s =
      "| codec | spec | bits/value | ratio | PPL change | 95% interval | Pareto |\n"
      "|---|---|---|---|---|---|---|\n";
  for (const PplRow& r : rows) {
    bool dominated = false;
    for (const PplRow& o : rows) {
      if (&o == &r) continue;
      const bool le =
          o.size.bits_per_value <= r.size.bits_per_value && o.change.mean <= r.change.mean;
      const bool lt =
          o.size.bits_per_value < r.size.bits_per_value || o.change.mean < r.change.mean;
      if (le && lt) dominated = true;
    }
    absl::StrAppendFormat(&s, "| %s | %s | %.3f | %.3fx | %s | %s |\n", r.codec, r.spec,
                          r.size.bits_per_value, r.size.ratio, PercentChangeCells(r.change),
                          dominated ? "" : "yes");
  }
  return s;
}

StatusOr<std::vector<GreedyRow>> GreedyAgreement(model::LlamaModel& m,
                                                 const std::vector<CodecSpec>& codecs,
                                                 const GreedyOptions& o) {
  const model::Tokenizer* tok = m.tokenizer();
  if (tok == nullptr) return absl::InvalidArgumentError("greedy: the model ships no tokenizer");
  POLYKV_ASSIGN_OR_RETURN(const std::string doc, cli::ReadFile(o.document));
  POLYKV_ASSIGN_OR_RETURN(const std::string questions, cli::ReadFile(o.questions));
  std::vector<std::string> qs;
  for (absl::string_view line : absl::StrSplit(questions, '\n')) {
    if (static_cast<int>(qs.size()) >= o.count) break;
    if (!line.empty() && line[0] != '#') qs.emplace_back(line);  // '#': a comment, as `agents run`
  }
  POLYKV_ASSIGN_OR_RETURN(std::vector<int32_t> doc_ids,
                          tok->Encode(client::ChatDocument(doc), tok->adds_bos()));
  const model::ModelConfig& cfg = m.config();
  POLYKV_ASSIGN_OR_RETURN(model::PrefillResult pre, m.Prefill(doc_ids, 512));
  const kernels::LayerShape shape{cfg.kv_heads, static_cast<int64_t>(doc_ids.size()), cfg.head_dim};
  model::SamplingOptions so;
  so.greedy = true;
  so.max_new_tokens = o.max_new_tokens;
  so.stop_at_eos = false;
  auto answer = [&](const CodecSpec& spec,
                    const std::vector<int32_t>& prompt) -> StatusOr<std::vector<int32_t>> {
    std::vector<std::vector<float>> ks, vs;
    for (int l = 0; l < cfg.layers; ++l) {
      std::vector<float> ko(pre.k[l].size()), vo(pre.v[l].size());
      POLYKV_RETURN_IF_ERROR(RoundTripLayer(spec, l, cfg.layers, pre.k[l].data(), pre.v[l].data(),
                                            shape, ko.data(), vo.data()));
      ks.push_back(std::move(ko));
      vs.push_back(std::move(vo));
    }
    POLYKV_ASSIGN_OR_RETURN(std::shared_ptr<model::KvPrefix> prefix,
                            model::MakeRawPrefix(cfg, shape.tokens, std::move(ks), std::move(vs)));
    POLYKV_ASSIGN_OR_RETURN(
        model::KvCache cache,
        m.NewCacheWithPrefix(prefix, doc_ids,
                             static_cast<int64_t>(prompt.size()) + o.max_new_tokens + 1));
    POLYKV_ASSIGN_OR_RETURN(model::GenerateResult g, m.Generate(cache, prompt, so));
    return g.tokens;
  };
  auto text_of = [&](const std::vector<int32_t>& ids) {
    std::vector<int32_t> cut;
    for (int32_t t : ids) {
      if (tok->IsEndOfGeneration(t)) break;
      cut.push_back(t);
    }
    auto s = tok->Decode(cut);
    return s.ok() ? *s : std::string();
  };
  std::vector<GreedyRow> rows;
  const CodecSpec none = ParseCodecSpec("none").value();
  for (const std::string& q : qs) {
    POLYKV_ASSIGN_OR_RETURN(std::vector<int32_t> prompt,
                            tok->Encode(client::ChatQuestionPrompt(q), false));
    POLYKV_ASSIGN_OR_RETURN(std::vector<int32_t> full, answer(none, prompt));
    for (const CodecSpec& c : codecs) {
      if (c.none) continue;
      GreedyRow r;
      r.codec = c.name;
      r.spec = c.Canonical();
      r.question = q;
      r.full_ids = full;
      POLYKV_ASSIGN_OR_RETURN(r.codec_ids, answer(c, prompt));
      const size_t n = static_cast<size_t>(o.max_new_tokens);
      int same = 0;
      bool diverged = false;
      for (size_t i = 0; i < n; ++i) {
        const bool eq = i < full.size() && i < r.codec_ids.size() && full[i] == r.codec_ids[i];
        same += eq ? 1 : 0;
        if (!eq) diverged = true;
        if (!diverged) r.common_prefix++;
      }
      r.agreement = n > 0 ? static_cast<double>(same) / n : 0;
      r.full_text = text_of(full);
      r.codec_text = text_of(r.codec_ids);
      if (o.log)
        o.log(absl::StrFormat("greedy %s, \"%s\": agreement %.2f, common prefix %d", c.name, q,
                              r.agreement, r.common_prefix));
      rows.push_back(std::move(r));
    }
  }
  return rows;
}

namespace {
std::string CsvField(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"') o += '"';
    o += c == '\n' ? ' ' : c;
  }
  return o + "\"";
}
}  // namespace

std::string GreedyCsv(const std::vector<GreedyRow>& rows) {
  std::string s = absl::StrCat(kGreedyCsvHeader, "\n");
  for (const GreedyRow& r : rows)
    absl::StrAppendFormat(&s, "%s,%s,%s,%.4f,%d,%d\n", r.codec, r.spec, CsvField(r.question),
                          r.agreement, r.common_prefix, r.full_ids.size());
  return s;
}

std::string GreedyMarkdown(const std::vector<GreedyRow>& rows) {
  std::map<std::string, std::vector<const GreedyRow*>> by;
  std::vector<std::string> order;
  for (const GreedyRow& r : rows) {
    if (!by.count(r.codec)) order.push_back(r.codec);
    by[r.codec].push_back(&r);
  }
  std::string s =
      "| codec | questions | token agreement | mean common prefix |\n|---|---|---|---|\n";
  for (const std::string& c : order) {
    double a = 0, p = 0;
    for (const GreedyRow* r : by[c]) {
      a += r->agreement;
      p += r->common_prefix;
    }
    const double n = static_cast<double>(by[c].size());
    absl::StrAppendFormat(&s, "| %s (%s) | %d | %.3f | %.1f |\n", c, by[c][0]->spec, by[c].size(),
                          a / n, p / n);
  }
  return s;
}

std::string AnswersJsonl(const std::vector<GreedyRow>& rows) {
  std::string s;
  for (const GreedyRow& r : rows) {
    nlohmann::json j = {{"codec", r.codec},
                        {"spec", r.spec},
                        {"question", r.question},
                        {"full", r.full_text},
                        {"answer", r.codec_text},
                        {"agreement", r.agreement},
                        {"common_prefix", r.common_prefix}};
    s += j.dump() + "\n";
  }
  return s;
}

std::string FindScript(const std::string& rel) {
  namespace fs = std::filesystem;
  if (fs::exists(rel)) return rel;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  for (fs::path d = exe.parent_path(); !ec && !d.empty() && d != d.root_path(); d = d.parent_path())
    if (fs::exists(d / rel)) return (d / rel).string();
  return "";
}

}  // namespace polykv::eval
