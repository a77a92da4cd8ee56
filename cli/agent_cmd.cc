// `polykv-cli agent`: one agent process that attaches a pool, attends to it in place (or
// decodes it into its own KV cache) and answers one prompt (PooledAgent); optionally compares
// with re-prefilling.
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "polykv/agent.h"
#include "util/token_ids.h"

namespace polykv::cli {
namespace {

struct AgentArgs {
  std::string pool;
  std::string model;
  std::string prompt;
  std::string prompt_ids;
  bool chat = false;
  int max_new_tokens = 64;
  float temperature = 0;  // 0 = greedy
  float top_p = 0.95f;
  uint64_t seed = 0;
  bool stats = false;
  bool json = false;
  std::string endpoint;
  int timeout_ms = 5000;
  int threads = 0;
  bool baseline = false;
  bool ignore_eos = false;
  int debug_pause_layer = -1;
  int debug_pause_step = -1;
  int debug_pause_ms = 0;
  std::string attend = "in-place";
  std::string device = "cpu";
  bool allow_copy = false;
  std::string weights = "auto";
  std::string hold_file;
  std::string score_ids;
};

nlohmann::json StatsJson(const client::AgentStats& s) {
  return {{"attach_ms", s.attach_ms},
          {"decode_ms", s.decode_ms},
          {"prompt_first_token_ms", s.prompt_first_token_ms},
          {"ttft_ms", s.ttft_ms},
          {"generation_ms", s.generation_ms},
          {"tokens_per_s", s.tokens_per_s},
          {"document_tokens", s.document_tokens},
          {"prompt_tokens", s.prompt_tokens},
          {"new_tokens", s.new_tokens},
          {"pool_bytes", s.pool_bytes},
          {"pool_bf16_bytes", s.pool_bf16_bytes},
          {"private_kv_bytes", s.private_kv_bytes},
          {"prefix_bytes_per_token", s.prefix_bytes_per_token},
          {"rss_bytes", s.memory.rss},
          {"pss_bytes", s.memory.pss},
          {"private_bytes", s.memory.private_bytes},
          {"anonymous_bytes", s.memory.anonymous},
          {"peak_rss_bytes", s.peak_rss_bytes},
          {"device_bytes", s.device_bytes}};
}

std::string IdsString(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ' ';
    s += std::to_string(ids[i]);
  }
  return s;
}

// --hold-file and the --debug-pause-* hooks (tests and memory measurements).
void InstallHooks(const AgentArgs& a, client::PooledAgent* agent) {
  client::AgentHooks hold_hooks;
  if (!a.hold_file.empty()) {
    // For memory measurements: N agents alive at once, each attached after answering.
    const std::string file = a.hold_file;
    hold_hooks.before_detach = [file] {
      std::fprintf(stderr, "agent: answered; holding the pool while %s exists\n", file.c_str());
      std::fflush(stderr);
      while (access(file.c_str(), F_OK) == 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    };
    agent->set_hooks(hold_hooks);
  }
  if (a.debug_pause_layer >= 0 || a.debug_pause_step >= 0) {
    const int layer = a.debug_pause_layer, step = a.debug_pause_step, ms = a.debug_pause_ms;
    client::AgentHooks hooks = hold_hooks;
    hooks.after_layer_decoded = [layer, ms](uint32_t l) {
      if (static_cast<int>(l) != layer) return;
      std::fprintf(stderr, "agent: paused after decoding layer %u\n", l);
      std::fflush(stderr);
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    };
    hooks.after_step = [step, ms](int64_t s) {
      if (s != step) return;
      std::fprintf(stderr, "agent: paused after forward step %lld\n", static_cast<long long>(s));
      std::fflush(stderr);
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    };
    agent->set_hooks(std::move(hooks));
  }
}

// --score-ids: the mean NLL of a continuation over the pool, as JSON (one line).
Status ScoreIds(const AgentArgs& a, client::PooledAgent* agent) {
  // polykv-cli eval's agents section: continuation t_C .. t_L; inputs t_C .. t_{L-1}
  // predict t_{C+1} .. t_L.
  POLYKV_ASSIGN_OR_RETURN(std::vector<int32_t> cont, ParseTokenIds(a.score_ids, "--score-ids"));
  if (cont.size() < 2) return absl::InvalidArgumentError("--score-ids needs >= 2 ids");
  std::vector<int32_t> in(cont.begin(), cont.end() - 1), tgt(cont.begin() + 1, cont.end());
  POLYKV_ASSIGN_OR_RETURN(std::vector<double> nll, agent->Score(a.pool, in, tgt));
  double sum = 0;
  for (double x : nll) sum += x;
  nlohmann::json j = {{"pool", a.pool},
                      {"pid", static_cast<int64_t>(getpid())},
                      {"scored", nll.size()},
                      {"mean_nll", sum / static_cast<double>(nll.size())}};
  std::cout << j.dump() << std::endl;
  return absl::OkStatus();
}

// The prompt's token ids: --prompt-ids, or --prompt encoded (in the chat template with --chat).
StatusOr<std::vector<int32_t>> PromptIds(const AgentArgs& a, client::PooledAgent* agent) {
  std::vector<int32_t> prompt_ids;
  if (!a.prompt_ids.empty()) {
    POLYKV_ASSIGN_OR_RETURN(prompt_ids, ParseTokenIds(a.prompt_ids, "--prompt-ids"));
  } else {
    std::string text = a.prompt;
    if (a.chat) {
      // The model's own chat template (ChatML when it ships none).
      const model::ChatMessage msg{"user", a.prompt};
      POLYKV_ASSIGN_OR_RETURN(text, client::ChatTurnsAfterDocument(agent->model().tokenizer(),
                                                                   absl::MakeConstSpan(&msg, 1)));
    }
    POLYKV_ASSIGN_OR_RETURN(prompt_ids, agent->EncodePrompt(text));
  }
  return prompt_ids;
}

// --stats: the answer's timings, sizes and memory, one figure a line.
void PrintStats(const AgentArgs& a, const client::AgentResult& r, double load_ms,
                const std::string& weights_layout) {
  const auto& s = r.stats;
  std::printf(
      "pool %s codec %s, attended %s: %lld document tokens, %lld prompt tokens, "
      "%lld new tokens\n",
      a.pool.c_str(), r.codec.c_str(), client::AttendName(r.attend), (long long)s.document_tokens,
      (long long)s.prompt_tokens, (long long)s.new_tokens);
  std::printf("  model load          %10.1f ms\n", load_ms);
  std::printf("  attach              %10.1f ms\n", s.attach_ms);
  std::printf("  %-19s %10.1f ms\n",
              r.attend == client::Attend::kInPlace ? "map pool view" : "decode pool", s.decode_ms);
  std::printf("  prompt + 1st token  %10.1f ms\n", s.prompt_first_token_ms);
  std::printf("  TTFT                %10.1f ms  (attach + %s + prompt + first token)\n", s.ttft_ms,
              r.attend == client::Attend::kInPlace ? "view" : "decode");
  std::printf("  generation          %10.1f ms  (%.1f tokens/s)\n", s.generation_ms,
              s.tokens_per_s);
  std::printf("  shared pool         %10.2f MiB (bf16 private equivalent %.2f MiB)\n",
              s.pool_bytes / 1048576.0, s.pool_bf16_bytes / 1048576.0);
  std::printf("  private KV cache    %10.2f MiB%s\n", s.private_kv_bytes / 1048576.0,
              r.attend == client::Attend::kInPlace ? " (prompt + answer only)" : "");
  if (s.prefix_bytes_per_token > 0)
    std::printf("  prefix read/token   %10.2f MiB (in place, every layer)\n",
                s.prefix_bytes_per_token / 1048576.0);
  std::printf("  process memory      %10.1f MiB RSS, %.1f MiB PSS, %.1f MiB private\n",
              s.memory.rss / 1048576.0, s.memory.pss / 1048576.0,
              s.memory.private_bytes / 1048576.0);
  std::printf("  peak RSS            %10.1f MiB\n", client::PeakRssBytes() / 1048576.0);
  std::printf("  weights             %s\n", weights_layout.c_str());
}

Status RunAgent(const AgentArgs& a) {
  client::AgentOptions opts;
  opts.model_path = a.model;
  opts.endpoint = a.endpoint;
  opts.timeout_ms = a.timeout_ms;
  opts.threads = a.threads;
  POLYKV_ASSIGN_OR_RETURN(opts.attend, client::ParseAttend(a.attend));
  POLYKV_ASSIGN_OR_RETURN(opts.device, client::ParseAgentDevice(a.device));
  opts.allow_copy = a.allow_copy;
  if (a.weights == "mapped") opts.load.weights = model::WeightStorage::kMapped;
  auto t_load = std::chrono::steady_clock::now();
  POLYKV_ASSIGN_OR_RETURN(std::unique_ptr<client::PooledAgent> agent,
                          client::PooledAgent::Create(opts));
  const double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_load).count();
  InstallHooks(a, agent.get());

  if (!a.score_ids.empty()) return ScoreIds(a, agent.get());
  POLYKV_ASSIGN_OR_RETURN(std::vector<int32_t> prompt_ids, PromptIds(a, agent.get()));
  model::SamplingOptions sampling;
  sampling.max_new_tokens = a.max_new_tokens;
  sampling.greedy = a.temperature <= 0;
  sampling.temperature = a.temperature;
  sampling.top_p = a.top_p;
  sampling.seed = a.seed;
  sampling.stop_at_eos = !a.ignore_eos;

  POLYKV_ASSIGN_OR_RETURN(client::AgentResult r, agent->Run(a.pool, prompt_ids, sampling));
  std::optional<client::BaselineResult> base;
  if (a.baseline) {
    POLYKV_ASSIGN_OR_RETURN(std::vector<int32_t> doc, agent->PoolTokenIds(a.pool));
    POLYKV_ASSIGN_OR_RETURN(base, agent->RunBaseline(doc, prompt_ids, sampling));
  }
  const bool has_tok = agent->model().tokenizer() != nullptr;

  if (a.json) {
    nlohmann::json j = {{"pool", a.pool},
                        {"pid", static_cast<int64_t>(getpid())},
                        {"codec", r.codec},
                        {"attend", client::AttendName(r.attend)},
                        {"route", client::PoolRouteName(r.route)},
                        {"model_load_ms", load_ms},
                        {"weights_layout", agent->model().weights_layout()},
                        {"prompt_ids", r.prompt_ids},
                        {"answer_ids", r.answer_ids},
                        {"answer", r.answer_text},
                        {"stats", StatsJson(r.stats)}};
    j["stats"]["peak_rss_bytes"] = client::PeakRssBytes();
    if (base) {
      j["baseline"] = {{"answer_ids", base->answer_ids},
                       {"answer", base->answer_text},
                       {"prefill_ms", base->prefill_ms},
                       {"prompt_first_token_ms", base->prompt_first_token_ms},
                       {"ttft_ms", base->ttft_ms},
                       {"generation_ms", base->generation_ms},
                       {"private_kv_bytes", base->private_kv_bytes},
                       {"match", base->answer_ids == r.answer_ids}};
    }
    std::cout << j.dump() << std::endl;
    return absl::OkStatus();
  }
  std::cout << (has_tok ? r.answer_text : IdsString(r.answer_ids)) << std::endl;
  if (a.stats) PrintStats(a, r, load_ms, agent->model().weights_layout());
  if (base) {
    std::printf(
        "baseline (re-prefill the document): TTFT %.1f ms (prefill %.1f ms + prompt "
        "%.1f ms) vs pool %.1f ms; greedy outputs %s\n",
        base->ttft_ms, base->prefill_ms, base->prompt_first_token_ms, r.stats.ttft_ms,
        base->answer_ids == r.answer_ids ? "match" : "differ");
    if (base->answer_ids != r.answer_ids) {
      std::cout << "baseline answer: "
                << (has_tok ? base->answer_text : IdsString(base->answer_ids)) << std::endl;
    }
  }
  return absl::OkStatus();
}

}  // namespace

void RegisterAgentCommands(CLI::App& app) {
  auto args = std::make_shared<AgentArgs>();
  CLI::App* cmd = app.add_subcommand(
      "agent", "Run one agent: attach a pool, attend to it in place, answer a prompt");
  cmd->add_option("--pool", args->pool, "pool id (64 hex)")->required();
  cmd->add_option("--model", args->model, "the pool's model (HF folder or .gguf)")->required();
  auto* p = cmd->add_option("--prompt", args->prompt, "prompt text (needs a tokenizer)");
  auto* pi = cmd->add_option("--prompt-ids", args->prompt_ids, "prompt token ids: 1,2,3");
  p->excludes(pi);
  cmd->add_flag(
      "--chat", args->chat,
      "wrap --prompt as a user turn + assistant prompt with the model's own chat template "
      "(ChatML when it has none), after the pool's system turn");
  cmd->add_option("--max-new-tokens", args->max_new_tokens, "tokens to generate")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--temperature", args->temperature, "sampling temperature (0 = greedy)")
      ->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-p", args->top_p, "nucleus sampling")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--seed", args->seed, "sampling seed");
  cmd->add_flag("--ignore-eos", args->ignore_eos, "do not stop at end-of-generation tokens");
  cmd->add_flag("--stats", args->stats, "print timings and memory");
  cmd->add_flag("--json", args->json, "machine-readable output");
  AddDaemonOptions(cmd, &args->endpoint, &args->timeout_ms);
  AddThreadsOption(cmd, &args->threads, "compute threads (0 = all cores)");
  cmd->add_flag("--baseline-prefill", args->baseline,
                "also prefill document + prompt locally and compare TTFT and outputs");
  cmd->add_option("--attend", args->attend,
                  "in-place (default: attend to the mapped pool; host pools, mapped weights) or "
                  "decompressed (decode the pool into a private cache first)")
      ->check(CLI::IsMember({"in-place", "decompressed"}));
  cmd->add_option(
      "--device", args->device,
      "cpu (default), cuda or cuda:N: where the agent computes; a cuda agent attends "
      "to a cuda pool in place. No silent CPU fallback: an unusable device is an error");
  cmd->add_flag("--allow-copy", args->allow_copy,
                "a CPU agent may read a pool that lies in CUDA memory by copying it into a "
                "private host cache (one log line says the cost); without it that is an error");
  cmd->add_option("--weights", args->weights,
                  "mapped (the default: compute on the model file's own blocks, shared by every "
                  "process); the libtorch f32 copy is a test and benchmark reference only")
      ->check(CLI::IsMember({"auto", "mapped"}));
  cmd->add_option("--hold-while-exists", args->hold_file,
                  "after answering, keep the pool attached until FILE no longer exists "
                  "(memory measurements with many agents alive at once)");
  cmd->add_option("--score-ids", args->score_ids,
                  "instead of answering: score a continuation of the document, ids "
                  "t_C..t_L (inputs t_C..t_{L-1} predict t_{C+1}..t_L); prints JSON with "
                  "mean_nll (polykv-cli eval's agents section)");
  cmd->add_option("--debug-pause-after-layer", args->debug_pause_layer)->group("");
  cmd->add_option("--debug-pause-after-step", args->debug_pause_step)->group("");
  cmd->add_option("--debug-pause-ms", args->debug_pause_ms)->group("");
  cmd->callback([args] {
    if (args->prompt.empty() && args->prompt_ids.empty() && args->score_ids.empty()) {
      return FailWith(absl::InvalidArgumentError("give --prompt TEXT or --prompt-ids IDS"));
    }
    if (Status s = RunAgent(*args); !s.ok()) FailWith(s);
  });
}

}  // namespace polykv::cli
