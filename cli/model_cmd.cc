// `polykv-cli generate` and `polykv-cli ppl`: run the local Llama runtime (no daemon).
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "commands.h"
#include "polykv/model/llama.h"
#include "polykv/model/perplexity.h"
#include "util/files.h"
#include "util/token_ids.h"

namespace polykv::cli {
namespace {

struct GenerateArgs {
  std::string model;
  std::string prompt;
  std::string prompt_ids;
  int max_new_tokens = 64;
  bool greedy = false;
  float temperature = 0.8f;
  uint64_t seed = 0;
  float top_p = 0.95f;
  bool chat = false;
  bool print_ids = false;
  int threads = 0;
  std::string weights = "auto";
};

struct PplArgs {
  std::string model;
  std::string file;
  int64_t context = 0;
  int64_t stride = 0;
  int64_t max_tokens = 0;
  int threads = 0;
  int64_t chunks = -1;
  bool second_half = false;
  int64_t batch = 512;
  std::string weights = "auto";
};

StatusOr<model::WeightStorage> ParseWeights(const std::string& w) {
  if (w == "auto") return model::WeightStorage::kAuto;
  if (w == "mapped") return model::WeightStorage::kMapped;
  if (w == "copy")
    return absl::InvalidArgumentError(
        "--weights copy: the libtorch f32 reference runtime is not part of polykv-cli (it is "
        "linked only by tests and bench_model, target polykv_model_torch); use mapped");
  return absl::InvalidArgumentError(absl::StrCat("--weights '", w, "' (expected auto or mapped)"));
}

StatusOr<std::unique_ptr<model::LlamaModel>> LoadModel(const std::string& path, int threads,
                                                       const std::string& weights = "auto") {
  model::LoadOptions o;
  o.threads = threads;
  POLYKV_ASSIGN_OR_RETURN(o.weights, ParseWeights(weights));
  return model::LlamaModel::Load(path, o);
}

Status RunGenerate(const GenerateArgs& a, bool temperature_given) {
  if (a.greedy && temperature_given)
    return absl::InvalidArgumentError("--greedy and --temperature are mutually exclusive");
  POLYKV_ASSIGN_OR_RETURN(auto m, LoadModel(a.model, a.threads, a.weights));
  const model::Tokenizer* tok = m->tokenizer();
  std::vector<int32_t> ids;
  if (!a.prompt_ids.empty()) {
    if (a.chat) return absl::InvalidArgumentError("--chat needs --prompt (text), not --prompt-ids");
    POLYKV_ASSIGN_OR_RETURN(ids, ParseTokenIds(a.prompt_ids, "--prompt-ids"));
  } else {
    if (tok == nullptr)
      return absl::InvalidArgumentError(
          absl::StrCat(a.model, " ships no tokenizer: use --prompt-ids instead of --prompt"));
    std::string text = a.prompt;
    if (a.chat) {
      const model::ChatMessage msg{"user", a.prompt};
      POLYKV_ASSIGN_OR_RETURN(text, tok->ApplyChatTemplate(absl::MakeConstSpan(&msg, 1), true));
    }
    POLYKV_ASSIGN_OR_RETURN(ids, tok->Encode(text, tok->adds_bos()));
    if (ids.empty()) return absl::InvalidArgumentError("--prompt encodes to no tokens");
  }
  model::SamplingOptions s;
  s.max_new_tokens = a.max_new_tokens;
  s.greedy = !temperature_given;
  s.temperature = a.temperature;
  s.top_p = a.top_p;
  s.seed = a.seed;
  model::KvCache cache = m->NewCache(static_cast<int64_t>(ids.size()) + a.max_new_tokens);
  POLYKV_ASSIGN_OR_RETURN(model::GenerateResult r, m->Generate(cache, ids, s));
  if (a.print_ids || tok == nullptr) {
    std::cout << absl::StrJoin(r.tokens, " ") << std::endl;
  } else {
    POLYKV_ASSIGN_OR_RETURN(std::string out, tok->Decode(r.tokens));
    std::cout << out << std::endl;
  }
  const double decode_ms = r.total_ms - r.first_token_ms;
  std::fprintf(stderr, "[%zu prompt tokens, %zu new; first token %.1f ms; %.1f tokens/s decode]\n",
               ids.size(), r.tokens.size(), r.first_token_ms,
               r.tokens.size() > 1 && decode_ms > 0 ? r.tokens.size() * 1000.0 / decode_ms : 0.0);
  return absl::OkStatus();
}

// llama-perplexity's protocol (model/perplexity.h): the whole file at once, chunks of N,
// second half of each chunk scored.
Status RunChunkedPpl(const PplArgs& a, model::LlamaModel& m, std::string text) {
  const model::Tokenizer* tok = m.tokenizer();
  // llama.cpp's -f drops one trailing newline of the file.
  if (!text.empty() && text.back() == '\n') text.pop_back();
  POLYKV_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->Encode(text, /*add_bos=*/true));
  const bool add_bos = tok->adds_bos();
  model::ChunkedPerplexityOptions o;
  o.context = a.context;
  o.chunks = a.chunks;
  o.replace_bos = add_bos;
  o.bos_id = tok->bos_id();
  o.rows = a.batch;
  std::printf(
      "tokens: %zu (BOS %s), context %lld, chunks %lld of %lld, %lld scored per chunk\n",
      ids.size(), add_bos ? "added and put first in every chunk" : "not used",
      static_cast<long long>(a.context),
      static_cast<long long>(a.chunks < 0 ? static_cast<int64_t>(ids.size()) / a.context
                                          : std::min<int64_t>(a.chunks, ids.size() / a.context)),
      static_cast<long long>(ids.size() / a.context),
      static_cast<long long>(a.context - a.context / 2 - 1));
  std::fflush(stdout);
  o.progress = [](int64_t i, double ppl) {
    std::printf("[%lld]%.4f,", static_cast<long long>(i), ppl);
    std::fflush(stdout);
  };
  POLYKV_ASSIGN_OR_RETURN(model::ChunkedPerplexityResult r, model::ChunkedPerplexity(m, ids, o));
  std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", r.ppl(), r.stderr_ppl());
  std::printf("tokens scored: %lld\nmean NLL: %.6f\n", static_cast<long long>(r.count),
              r.nll / static_cast<double>(r.count));
  return absl::OkStatus();
}

Status RunPpl(const PplArgs& a, bool chunks_given) {
  if (a.context < 1) return absl::InvalidArgumentError("--context must be >= 1");
  if (chunks_given && !a.second_half)
    return absl::InvalidArgumentError(
        "--chunks belongs to the llama-perplexity protocol: add --score-second-half");
  if (a.second_half && (a.stride > 0 || a.max_tokens > 0))
    return absl::InvalidArgumentError(
        "--score-second-half tokenizes the whole file and scores chunks: --stride and "
        "--max-tokens belong to the sliding-window mode");
  const int64_t stride = a.stride > 0 ? a.stride : a.context;
  if (stride > a.context) return absl::InvalidArgumentError("--stride must be <= --context");
  POLYKV_ASSIGN_OR_RETURN(std::string text, ReadFile(a.file));
  POLYKV_ASSIGN_OR_RETURN(auto m, LoadModel(a.model, a.threads, a.weights));
  const model::Tokenizer* tok = m->tokenizer();
  if (tok == nullptr)
    return absl::InvalidArgumentError(
        absl::StrCat(a.model, " ships no tokenizer: cannot tokenize ", a.file));
  if (a.second_half) return RunChunkedPpl(a, *m, std::move(text));
  // Large files: tokenize only a prefix long enough for --max-tokens (a token is rarely
  // more than 16 bytes), then cut to exactly max_tokens.
  if (a.max_tokens > 0 && static_cast<int64_t>(text.size()) > a.max_tokens * 16)
    text.resize(static_cast<size_t>(a.max_tokens * 16));
  POLYKV_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->Encode(text, false));
  if (a.max_tokens > 0 && static_cast<int64_t>(ids.size()) > a.max_tokens) ids.resize(a.max_tokens);
  POLYKV_ASSIGN_OR_RETURN(model::PerplexityResult r, m->Perplexity(ids, a.context, stride));
  std::printf("tokens scored: %lld\nmean NLL: %.6f\nperplexity: %.4f\n",
              static_cast<long long>(r.tokens_scored), r.mean_nll, r.perplexity);
  return absl::OkStatus();
}

}  // namespace

void RegisterModelCommands(CLI::App& app) {
  auto ga = std::make_shared<GenerateArgs>();
  CLI::App* gen = app.add_subcommand("generate", "Generate text with a local model (no daemon)");
  gen->add_option("--model", ga->model, "Model: .gguf file or HF folder")->required();
  auto* p = gen->add_option("--prompt", ga->prompt, "Prompt text (needs the model's tokenizer)");
  auto* pi = gen->add_option("--prompt-ids", ga->prompt_ids, "Prompt token ids, e.g. 1,2,3");
  p->excludes(pi);
  gen->add_option("--max-new-tokens", ga->max_new_tokens, "Tokens to generate")
      ->check(CLI::NonNegativeNumber);
  gen->add_flag("--greedy", ga->greedy, "Argmax decoding (the default)");
  auto* temp = gen->add_option("--temperature", ga->temperature, "Sampling temperature (> 0)")
                   ->check(CLI::PositiveNumber);
  gen->add_option("--seed", ga->seed, "Sampling seed");
  gen->add_option("--top-p", ga->top_p, "Nucleus sampling mass in (0, 1]")
      ->check(CLI::Range(0.0, 1.0));
  gen->add_flag("--chat", ga->chat, "Wrap --prompt in the model's chat template as a user turn");
  gen->add_flag("--print-ids", ga->print_ids, "Print generated token ids instead of text");
  gen->add_option("--threads", ga->threads, "Compute threads (0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  gen->add_option("--weights", ga->weights,
                  "Weights: mapped (kernels over the file's own blocks, the default) or auto");
  gen->callback([ga, p, pi, temp]() {
    if (p->count() == 0 && pi->count() == 0) {
      return FailWith(absl::InvalidArgumentError("one of --prompt or --prompt-ids is required"));
    }
    if (Status s = RunGenerate(*ga, temp->count() > 0); !s.ok()) FailWith(s);
  });

  auto pa = std::make_shared<PplArgs>();
  CLI::App* ppl = app.add_subcommand(
      "ppl",
      "Perplexity of a text file.\n"
      "Default: sliding windows of --context tokens advancing by --stride; every token after "
      "the first is scored once (no BOS).\n"
      "--score-second-half [--chunks K]: llama.cpp's llama-perplexity protocol, number for "
      "number: the whole file tokenized at once (one trailing newline dropped, BOS in front "
      "only when the model's metadata asks for it), split into floor(tokens / N) consecutive "
      "chunks of N = --context tokens (at most K; at least 2N tokens needed); when the model "
      "adds BOS the first token of each chunk is replaced by BOS; each chunk runs from an "
      "empty cache and positions N/2 .. N-2 predict tokens N/2+1 .. N-1 (N - N/2 - 1 scored "
      "per chunk). Prints the running PPL after each chunk ([i]ppl,) and 'Final estimate: "
      "PPL = X +/- Y' with that tool's standard error.");
  ppl->add_option("--model", pa->model, "Model: .gguf file or HF folder")->required();
  ppl->add_option("--file", pa->file, "UTF-8 text file")->required();
  ppl->add_option("--context", pa->context, "Window (or chunk) length in tokens")
      ->required()
      ->check(CLI::PositiveNumber);
  ppl->add_option("--stride", pa->stride, "Window step in tokens (default: --context)")
      ->check(CLI::PositiveNumber);
  ppl->add_option("--max-tokens", pa->max_tokens, "Score only the first N tokens of the file")
      ->check(CLI::PositiveNumber);
  auto* chunks = ppl->add_option("--chunks", pa->chunks,
                                 "llama-perplexity protocol: at most K chunks (default all)")
                     ->check(CLI::PositiveNumber);
  ppl->add_flag("--score-second-half", pa->second_half,
                "llama-perplexity protocol (see above) instead of sliding windows");
  ppl->add_option("--batch", pa->batch,
                  "llama-perplexity protocol: rows per forward (llama.cpp's -ub, default 512)")
      ->check(CLI::PositiveNumber);
  ppl->add_option("--threads", pa->threads, "Compute threads (0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  ppl->add_option("--weights", pa->weights, "Weights: mapped or auto");
  ppl->callback([pa, chunks]() {
    if (Status s = RunPpl(*pa, chunks->count() > 0); !s.ok()) FailWith(s);
  });
}

}  // namespace polykv::cli
