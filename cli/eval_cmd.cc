// `polykv-cli eval`: the PolyKV paper's fidelity tables (PPL change vs context with paired
// 95% intervals, ablations, per-layer reconstruction error, greedy agreement, agents) for a
// model, a text and codec configurations; CSV + markdown + PNG plots in --out.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "commands.h"
#include "eval/eval.h"
#include "eval/eval_agents.h"
#include "eval/eval_extra.h"
#include "polykv/ipc/codec_spec.h"
#include "polykv/model/llama.h"
#include "util/files.h"
#include "util/processes.h"

namespace polykv::cli {
namespace {

struct EvalArgs {
  std::string model;
  std::string text = "data/wikitext-2/wiki.test.raw";
  std::string out;
  std::string codecs = "paper,default";
  std::vector<int64_t> contexts = {600, 1851, 2048, 4096, 7194};
  int windows = 8;
  double score_fraction = 0.5;
  int64_t offset = 0;
  int threads = 0;
  std::string sections = "ppl,layers";
  // Ablations (each varies one factor of --base at --ablation-context).
  std::string base = "default";
  int64_t ablation_context = 2048;
  int ablation_windows = 0;  // 0 = --windows
  std::string ab_key_bits, ab_key_scale, ab_value_bits, ab_edge_bits, ab_rotation,
      ab_norm_correction, ab_norm_dtype, ab_seeds, ab_extra;
  // Greedy agreement / semantic similarity / agents.
  std::string document = "data/wikitext-2/robert_boulter.txt";
  std::string questions = "data/questions.txt";
  int questions_n = 4;
  int greedy_tokens = 64;
  std::vector<int> agents = {1, 3, 10, 15};
  int agent_windows = 2;
  int64_t agent_context = 2048;
  std::string endpoint;
  std::string daemon;
  std::string python;  // empty: EvalPython()
};

void Log(const std::string& line) {
  std::fprintf(stderr, "eval: %s\n", line.c_str());
  std::fflush(stderr);
}

// The Python that runs scripts/eval_post.py: --python, else $POLYKV_EVAL_PYTHON, else the venv
// scripts/install-eval-deps.sh makes (${POLYKV_EVAL_VENV:-$HOME/.cache/polykv/eval-venv}/bin/
// python) when it exists, else python3.
std::string EvalPython(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* p = std::getenv("POLYKV_EVAL_PYTHON"); p != nullptr && *p != '\0') return p;
  std::string venv;
  if (const char* v = std::getenv("POLYKV_EVAL_VENV"); v != nullptr && *v != '\0') {
    venv = v;
  } else if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') {
    venv = absl::StrCat(h, "/.cache/polykv/eval-venv");
  }
  const std::string py = venv + "/bin/python";
  if (!venv.empty() && access(py.c_str(), X_OK) == 0) return py;
  return "python3";
}

// Single-quoted for /bin/sh.
std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// `text` as an int in [lo, hi] into *out.
bool IntIn(const std::string& text, int lo, int hi, int* out) {
  return absl::SimpleAtoi(text, out) && *out >= lo && *out <= hi;
}

// `text` as one of two words into *out (true for `yes`).
bool OneOf(const std::string& text, const char* yes, const char* no, bool* out) {
  if (text != yes && text != no) return false;
  *out = text == yes;
  return true;
}

// One ablated factor of `eval --ablate-*`: the flag, the EvalArgs member holding its comma
// list, its help, the label prefix of its specs, and how one value sets a spec (false: a bad
// value). The error quotes the value and then the hint in parentheses when `quote`, else it
// gives the hint alone.
struct AblationFactor {
  const char* flag;
  std::string EvalArgs::*values;
  const char* help;
  const char* label;
  bool quote;
  const char* hint;
  bool (*set)(const std::string& value, eval::CodecSpec* spec);
};

// The one table of ablated factors, in the order their specs are listed.
const AblationFactor kAblationFactors[] = {
    {"--ablate-key-bits", &EvalArgs::ab_key_bits, "Ablation: key bits, e.g. 8,7,6,5,4", "key-bits",
     true, "4..8",
     [](const std::string& v, eval::CodecSpec* s) { return IntIn(v, 4, 8, &s->key_bits); }},
    {"--ablate-key-scale", &EvalArgs::ab_key_scale, "Ablation: tensor,head,channel", "key-scale",
     true, "",
     [](const std::string& v, eval::CodecSpec* s) {
       std::optional<kernels::KeyScaleMode> mode = ipc::ParseKeyScaleName(v);
       if (mode) s->key_scale = *mode;
       return mode.has_value();
     }},
    {"--ablate-value-bits", &EvalArgs::ab_value_bits, "Ablation: 2,3,4", "value-bits", true, "2..4",
     [](const std::string& v, eval::CodecSpec* s) { return IntIn(v, 2, 4, &s->value_bits); }},
    {"--ablate-edge-bits", &EvalArgs::ab_edge_bits,
     "Ablation: first/last layers' value bits, e.g. 4,4x2 (0 = as the others)", "edge-bits", true,
     "bits[xN]",
     [](const std::string& v, eval::CodecSpec* s) {
       std::vector<std::string> p = absl::StrSplit(v, 'x');
       return IntIn(p[0], 0, 4, &s->edge_value_bits) &&
              (p.size() != 2 || absl::SimpleAtoi(p[1], &s->edge_layers));
     }},
    {"--ablate-rotation", &EvalArgs::ab_rotation, "Ablation: on,off", "rotation", false, "on,off",
     [](const std::string& v, eval::CodecSpec* s) { return OneOf(v, "on", "off", &s->rotation); }},
    {"--ablate-norm-correction", &EvalArgs::ab_norm_correction, "Ablation: on,off",
     "norm-correction", false, "on,off",
     [](const std::string& v, eval::CodecSpec* s) {
       return OneOf(v, "on", "off", &s->norm_correction);
     }},
    {"--ablate-norm-dtype", &EvalArgs::ab_norm_dtype, "Ablation: f32,f16", "norm-dtype", false,
     "f16,f32",
     [](const std::string& v, eval::CodecSpec* s) {
       return OneOf(v, "f16", "f32", &s->f16_norms);
     }},
    {"--ablate-seeds", &EvalArgs::ab_seeds, "Ablation: rotation seeds (hex)", "seed", false, "hex",
     [](const std::string& v, eval::CodecSpec* s) { return absl::SimpleHexAtoi(v, &s->seed); }},
};

// Ablation specs: `base` with one factor changed per value of each given list.
StatusOr<std::vector<eval::CodecSpec>> Ablations(const EvalArgs& a, const eval::CodecSpec& base) {
  std::vector<eval::CodecSpec> out;
  std::set<std::string> seen;
  auto add = [&](eval::CodecSpec s, const std::string& label) {
    s.name = label;
    if (seen.insert(s.Canonical()).second) out.push_back(std::move(s));
  };
  add(base, "base");
  for (const AblationFactor& f : kAblationFactors) {
    for (absl::string_view item : absl::StrSplit(a.*f.values, ',', absl::SkipEmpty())) {
      const std::string v(item);
      eval::CodecSpec s = base;
      if (!f.set(v, &s)) {
        if (!f.quote) return absl::InvalidArgumentError(absl::StrCat(f.flag, ": ", f.hint));
        return absl::InvalidArgumentError(
            absl::StrCat(f.flag, ": '", v, "'", *f.hint ? " (" : "", f.hint, *f.hint ? ")" : ""));
      }
      add(s, absl::StrCat(f.label, "=", v));
    }
  }
  if (!a.ab_extra.empty()) {
    POLYKV_ASSIGN_OR_RETURN(std::vector<eval::CodecSpec> extra, eval::ParseCodecList(a.ab_extra));
    for (auto& s : extra) add(s, s.name);
  }
  return out;
}

StatusOr<std::vector<int32_t>> TokenizeText(const model::LlamaModel& m, const std::string& path,
                                            int64_t need) {
  POLYKV_ASSIGN_OR_RETURN(std::string text,
                          ReadFilePrefix(path, static_cast<size_t>(need * 8 + 4096)));
  if (m.tokenizer() == nullptr)
    return absl::InvalidArgumentError("the model ships no tokenizer: cannot tokenize the text");
  return m.tokenizer()->Encode(text, /*add_bos=*/false);
}

Status RunEval(const EvalArgs& a) {
  if (a.out.empty()) return absl::InvalidArgumentError("--out is required");
  std::error_code ec;
  std::filesystem::create_directories(a.out, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(a.out, ": ", ec.message()));
  std::set<std::string> sections;
  for (absl::string_view s : absl::StrSplit(a.sections, ',', absl::SkipEmpty()))
    sections.insert(std::string(s));
  for (const std::string& s : sections)
    if (s != "ppl" && s != "ablations" && s != "layers" && s != "greedy" && s != "agents" &&
        s != "semantic" && s != "plots")
      return absl::InvalidArgumentError(
          absl::StrCat("--sections: unknown '", s,
                       "' (ppl, ablations, layers, greedy, agents, semantic, plots)"));
  POLYKV_ASSIGN_OR_RETURN(std::vector<eval::CodecSpec> codecs, eval::ParseCodecList(a.codecs));
  POLYKV_ASSIGN_OR_RETURN(eval::CodecSpec base, eval::ParseCodecSpec(a.base));
  model::LoadOptions lo;
  lo.threads = a.threads;
  POLYKV_ASSIGN_OR_RETURN(auto m, model::LlamaModel::Load(a.model, lo));
  int64_t lmax = a.ablation_context;
  for (int64_t c : a.contexts) lmax = std::max(lmax, c);
  int wmax = std::max(a.windows, a.ablation_windows);
  if (sections.count("agents")) {
    lmax = std::max(lmax, a.agent_context);
    wmax = std::max(wmax, a.agent_windows);
  }
  POLYKV_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                          TokenizeText(*m, a.text, a.offset + wmax * (lmax + 1) + 16));
  Log(absl::StrCat(a.text, ": ", ids.size(), " tokens read"));
  std::string report = absl::StrCat("# polykv-cli eval\n\nmodel `", a.model, "`, text `", a.text,
                                    "`, codecs ", a.codecs, "\n\n");
  std::vector<eval::PplRow> all_rows;
  eval::PplOptions po;
  po.contexts = a.contexts;
  po.windows = a.windows;
  po.score_fraction = a.score_fraction;
  po.offset = a.offset;
  po.log = Log;
  if (sections.count("ppl")) {
    POLYKV_ASSIGN_OR_RETURN(std::vector<eval::PplRow> rows,
                            eval::PplVsContext(*m, ids, codecs, po));
    POLYKV_RETURN_IF_ERROR(WriteFile(a.out + "/ppl_vs_context.csv", eval::PplCsv(rows)));
    absl::StrAppend(&report, "## PPL change vs context (paired 95% interval over windows)\n\n",
                    eval::PplMarkdown(rows), "\n");
    all_rows.insert(all_rows.end(), rows.begin(), rows.end());
  }
  if (sections.count("ablations")) {
    POLYKV_ASSIGN_OR_RETURN(std::vector<eval::CodecSpec> ab, Ablations(a, base));
    eval::PplOptions ao = po;
    ao.contexts = {a.ablation_context};
    if (a.ablation_windows > 0) ao.windows = a.ablation_windows;
    POLYKV_ASSIGN_OR_RETURN(std::vector<eval::PplRow> rows, eval::PplVsContext(*m, ids, ab, ao));
    POLYKV_RETURN_IF_ERROR(WriteFile(a.out + "/ablations.csv", eval::PplCsv(rows, "ablation")));
    absl::StrAppend(&report, "## Ablations around ", base.Canonical(), " at context ",
                    a.ablation_context, "\n\n", eval::PplMarkdown(rows), "\n",
                    "## Pareto: bits per value vs PPL change\n\n", eval::ParetoMarkdown(rows),
                    "\n");
  }
  if (sections.count("layers")) {
    std::vector<int32_t> ctx(
        ids.begin() + a.offset,
        ids.begin() + a.offset + std::min<int64_t>(1024, ids.size() - a.offset));
    std::string csv = "codec,spec,layer,key_rel_mse,value_rel_mse\n";
    std::string md = "| layer |";
    std::vector<std::vector<eval::LayerError>> errs;
    for (const auto& c : codecs) {
      if (c.none) continue;
      POLYKV_ASSIGN_OR_RETURN(auto e, eval::LayerErrors(*m, ctx, c));
      for (size_t l = 0; l < e.size(); ++l)
        absl::StrAppendFormat(&csv, "%s,%s,%d,%.6e,%.6e\n", c.name, c.Canonical(), l,
                              e[l].key_rel_mse, e[l].value_rel_mse);
      absl::StrAppend(&md, " ", c.name, " K | ", c.name, " V |");
      errs.push_back(std::move(e));
    }
    POLYKV_RETURN_IF_ERROR(WriteFile(a.out + "/layers.csv", csv));
    if (!errs.empty()) {
      md += "\n|---|";
      for (size_t i = 0; i < errs.size(); ++i) md += "---|---|";
      md += "\n";
      for (size_t l = 0; l < errs[0].size(); ++l) {
        absl::StrAppend(&md, "| ", l, " |");
        for (const auto& e : errs)
          absl::StrAppendFormat(&md, " %.2e | %.2e |", e[l].key_rel_mse, e[l].value_rel_mse);
        md += "\n";
      }
      absl::StrAppend(&report, "## Per-layer reconstruction error (relative MSE, ", ctx.size(),
                      "-token prefill)\n\n", md, "\n");
    }
  }
  if (sections.count("agents")) {
    eval::AgentEvalOptions ao;
    ao.model_path = a.model;
    ao.cli = SelfExe();
    ao.daemon = a.daemon;
    ao.endpoint = a.endpoint;
    ao.work_dir = a.out + "/agents_work";
    ao.counts = a.agents;
    ao.windows = a.agent_windows;
    ao.context = a.agent_context;
    ao.score_fraction = a.score_fraction;
    ao.offset = a.offset;
    ao.log = Log;
    POLYKV_ASSIGN_OR_RETURN(std::vector<eval::AgentRow> rows,
                            eval::AgentInvariance(ids, codecs, ao));
    POLYKV_RETURN_IF_ERROR(WriteFile(a.out + "/agents.csv", eval::AgentCsv(rows)));
    absl::StrAppend(&report, "## Agent-count invariance (N agents at once on one pool per codec, ",
                    a.agent_windows, " window(s) of ", a.agent_context, " tokens)\n\n",
                    eval::AgentMarkdown(rows), "\n");
  }
  if (sections.count("greedy") || sections.count("semantic")) {
    eval::GreedyOptions go;
    go.document = a.document;
    go.questions = a.questions;
    go.count = a.questions_n;
    go.max_new_tokens = a.greedy_tokens;
    go.log = Log;
    POLYKV_ASSIGN_OR_RETURN(std::vector<eval::GreedyRow> rows,
                            eval::GreedyAgreement(*m, codecs, go));
    POLYKV_RETURN_IF_ERROR(WriteFile(a.out + "/greedy.csv", eval::GreedyCsv(rows)));
    POLYKV_RETURN_IF_ERROR(WriteFile(a.out + "/answers.jsonl", eval::AnswersJsonl(rows)));
    absl::StrAppend(&report, "## Greedy agreement with full precision (", a.greedy_tokens,
                    " tokens)\n\n", eval::GreedyMarkdown(rows), "\n");
  }
  POLYKV_RETURN_IF_ERROR(WriteFile(a.out + "/report.md", report));
  const std::string script = eval::FindScript("scripts/eval_post.py");
  if ((sections.count("plots") || sections.count("semantic")) && script.empty())
    Log("scripts/eval_post.py not found (looked in the current folder and above polykv-cli): "
        "no plots or semantic similarity");
  if ((sections.count("plots") || sections.count("semantic")) && !script.empty()) {
    const std::string cmd = absl::StrCat(
        ShellQuote(EvalPython(a.python)), " ", ShellQuote(script), " --out ", ShellQuote(a.out),
        sections.count("semantic") ? " --semantic" : "", sections.count("plots") ? " --plots" : "");
    Log(absl::StrCat("running ", cmd));
    const int rc = std::system(cmd.c_str());
    if (rc != 0)
      Log(absl::StrCat("the Python step failed (exit ", rc,
                       "; bash scripts/install-eval-deps.sh "
                       "installs its packages); CSV and markdown are written"));
  }
  std::cout << report;
  Log(absl::StrCat("wrote ", a.out, "/report.md and CSVs"));
  return absl::OkStatus();
}

}  // namespace

void RegisterEvalCommands(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* cmd = app.add_subcommand(
      "eval",
      "Fidelity tables of codecs: PPL change vs context with paired 95% intervals over windows, "
      "ablations, per-layer K/V reconstruction error, greedy agreement, agents; CSV, markdown "
      "and PNG plots in --out.\n"
      "Window protocol at context L (S = round(L * --score-fraction) scored, C = L - S "
      "compressed): L + 1 consecutive tokens; the first C are prefilled in full precision and "
      "their K/V taken through the codec (a read-only prefix attended to in place); tokens "
      "C..L-1 are run over it and predict C+1..L. Every codec scores the same windows; the "
      "interval is Student t over per-window mean-NLL differences, shown as exp(d) - 1.\n"
      "Codec specs: none, paper (= k8t-v3), default, k8v2/k8v3/k8v4, or "
      "k<4..8><t|h|c>-v<2..4>[-e<bits>[x<n>]][-nc][-n16][-norot][-s<hex>]");
  cmd->add_option("--model", a->model, "Model: .gguf file or HF folder")->required();
  cmd->add_option("--text", a->text, "Text to score (default WikiText-2 test)");
  cmd->add_option("--out", a->out, "Output folder (created)")->required();
  cmd->add_option("--codecs", a->codecs, "Comma-separated codec specs (default paper,default)");
  cmd->add_option("--contexts", a->contexts, "Context lengths L (tokens per window)")
      ->delimiter(',');
  cmd->add_option("--windows", a->windows, "Windows per context")->check(CLI::PositiveNumber);
  cmd->add_option("--score-fraction", a->score_fraction,
                  "Scored share of each window (0.5: the 2K "
                  "setting is 1,024 compressed + 1,024 scored)")
      ->check(CLI::Range(0.01, 0.99));
  cmd->add_option("--offset", a->offset, "First token of the first window")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--threads", a->threads, "Compute threads (0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--sections", a->sections,
                  "Comma list of ppl, ablations, layers, greedy, agents, semantic, plots");
  cmd->add_option("--base", a->base,
                  "Ablations: the codec whose factors are varied (default: default)");
  cmd->add_option("--ablation-context", a->ablation_context, "Ablations: context length L");
  cmd->add_option("--ablation-windows", a->ablation_windows, "Ablations: windows (0 = --windows)");
  for (const AblationFactor& f : kAblationFactors) cmd->add_option(f.flag, (*a).*f.values, f.help);
  cmd->add_option("--ablate-codecs", a->ab_extra, "Ablation: extra full codec specs");
  cmd->add_option("--document", a->document, "Greedy/semantic: the shared document");
  cmd->add_option("--questions", a->questions, "Greedy/semantic: one question per line");
  cmd->add_option("--questions-n", a->questions_n, "Greedy/semantic: questions used");
  cmd->add_option("--greedy-tokens", a->greedy_tokens, "Greedy: tokens generated per answer");
  cmd->add_option("--agents", a->agents,
                  "Agents: agent counts, e.g. 1,3,10,15 (each count's agents run at once, one "
                  "`polykv-cli agent --score-ids` process each, on one pool per codec and window)")
      ->delimiter(',');
  cmd->add_option("--agent-windows", a->agent_windows, "Agents: windows scored by every agent");
  cmd->add_option("--agent-context", a->agent_context, "Agents: context length L");
  cmd->add_option("--endpoint", a->endpoint, "Agents: a running polykvd (default: start one)");
  cmd->add_option("--daemon", a->daemon, "Agents: polykvd binary (default: next to polykv-cli)");
  cmd->add_option("--python", a->python,
                  "Python for plots and semantic similarity (scripts/eval_post.py). Default: "
                  "$POLYKV_EVAL_PYTHON, else the venv of scripts/install-eval-deps.sh "
                  "(${POLYKV_EVAL_VENV:-$HOME/.cache/polykv/eval-venv}/bin/python) if it "
                  "exists, else python3");
  cmd->callback([a]() {
    if (Status s = RunEval(*a); !s.ok()) FailWith(s);
  });
}

}  // namespace polykv::cli
