// `polykv-cli agents run`: launches N separate `polykv-cli agent --json` processes against
// one pool (posix_spawn, bounded concurrency), collects their answers and peak RSS
// (wait4 rusage) and prints the memory/TTFT summary against a re-prefill baseline.
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "commands.h"
#include "polykv/agent_device.h"
#include "polykv/client.h"
#include "polykv/status.h"
#include "util/files.h"
#include "util/processes.h"

namespace polykv::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct AgentsArgs {
  std::string pool;
  std::string model;
  std::string questions;
  bool ids = false;  // question lines are token ids
  bool raw = false;  // do not wrap questions in the chat template
  int n = 4;
  int jobs = 0;
  int max_new_tokens = 48;
  int threads = 0;  // per agent; 0 = cores / jobs
  bool baseline = true;
  bool json_out = false;
  std::string endpoint;
  int timeout_ms = 5000;
  std::string attend = "in-place";
  std::string device = "cpu";  // every agent's --device
  bool allow_copy = false;     // every agent's --allow-copy
};

StatusOr<std::vector<std::string>> ReadQuestions(const std::string& path) {
  POLYKV_ASSIGN_OR_RETURN(const std::string text, ReadFile(path, "questions file"));
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    if (line.empty() || line[0] == '#') continue;
    out.emplace_back(line);
  }
  if (out.empty())
    return absl::InvalidArgumentError("questions file " + path + " has no questions");
  return out;
}

StatusOr<polykv_pool_info> FindPool(const AgentsArgs& a) {
  polykv_client* c = nullptr;
  polykv_status s =
      polykv_connect(a.endpoint.empty() ? nullptr : a.endpoint.c_str(), a.timeout_ms, &c);
  if (s != POLYKV_OK) {
    return Status(static_cast<absl::StatusCode>(s),
                  std::string("cannot reach polykvd: ") + polykv_last_error());
  }
  polykv_pool_info info = polykv_pool_info_init();
  s = polykv_pool_info_by_id(c, a.pool.c_str(), &info);
  std::string detail = polykv_last_error();
  polykv_disconnect(c);
  if (s == POLYKV_NOT_FOUND) {
    return absl::NotFoundError("unknown pool " + a.pool + " (see `polykv-cli pools list`)");
  }
  if (s != POLYKV_OK) {
    return Status(static_cast<absl::StatusCode>(s), "pool " + a.pool + ": " + detail);
  }
  if (std::string(info.state) == "quarantined") {
    return absl::FailedPreconditionError(
        "pool " + a.pool +
        " is quarantined (a corrupt pool file, never served): " + std::string(info.state_detail));
  }
  return info;
}

std::vector<std::string> AgentArgv(const AgentsArgs& a, const std::string& exe,
                                   const std::string& prompt, int threads, bool baseline) {
  std::vector<std::string> v = {exe,
                                "agent",
                                "--pool",
                                a.pool,
                                "--model",
                                a.model,
                                "--json",
                                "--max-new-tokens",
                                std::to_string(a.max_new_tokens),
                                "--threads",
                                std::to_string(threads),
                                "--timeout-ms",
                                std::to_string(a.timeout_ms),
                                "--attend",
                                a.attend,
                                "--device",
                                a.device};
  if (a.allow_copy) v.push_back("--allow-copy");
  if (!a.endpoint.empty()) v.insert(v.end(), {"--endpoint", a.endpoint});
  if (a.ids) {
    v.insert(v.end(), {"--prompt-ids", prompt});
  } else {
    v.insert(v.end(), {"--prompt", prompt});
    if (!a.raw) v.push_back("--chat");
  }
  if (baseline) v.push_back("--baseline-prefill");
  return v;
}

double Mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double s = 0;
  for (double x : v) s += x;
  return s / v.size();
}

std::string MiB(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", b / 1048576.0);
  return buf;
}

std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

/// The finished agent processes of one `agents run`.
struct AgentsRun {
  int jobs = 0;     ///< agents alive at once
  int threads = 0;  ///< compute threads per agent
  std::vector<Child> children;
  std::vector<Child> base;  ///< the baseline agent; empty with --no-baseline
  double all_ms = 0;        ///< wall time of the N agents
};

/// What the N agents measured, summed over the ones that succeeded (peak RSS over all).
struct AgentTotals {
  int ok = 0;
  uint64_t private_sum = 0, private_max = 0, rss_max = 0, mem_private_max = 0;
  std::vector<double> ttft, attach, decode, tps;
};

/// Runs the N agents (`run->jobs` at once) on `questions` (cycled), then, unless
/// --no-baseline, one agent alone with the re-prefill baseline; outputs go under `dir`.
Status LaunchAgents(const AgentsArgs& a, const std::vector<std::string>& questions,
                    const std::string& dir, AgentsRun* run) {
  const std::string exe = SelfExe();
  std::vector<Child>& children = run->children;
  children.resize(a.n);
  for (int i = 0; i < a.n; ++i) {
    children[i].index = i;
    children[i].prompt = questions[i % questions.size()];
    children[i].out_path = dir + "/agent" + std::to_string(i) + ".out";
    children[i].err_path = dir + "/agent" + std::to_string(i) + ".err";
  }
  auto t0 = std::chrono::steady_clock::now();
  POLYKV_RETURN_IF_ERROR(RunAll(children, run->jobs, [&](const Child& c) {
    return AgentArgv(a, exe, c.prompt, run->threads, false);
  }));
  run->all_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  // Baseline in the same run: one agent alone (same threads), pool path then re-prefill.
  run->base.resize(a.baseline ? 1 : 0);
  if (a.baseline) {
    Child& b = run->base[0];
    b.index = -1;
    b.prompt = questions[0];
    b.out_path = dir + "/baseline.out";
    b.err_path = dir + "/baseline.err";
    POLYKV_RETURN_IF_ERROR(RunAll(run->base, 1, [&](const Child& c) {
      return AgentArgv(a, exe, c.prompt, run->threads, true);
    }));
  }
  return absl::OkStatus();
}

/// Sums the agents' stats (see AgentTotals).
AgentTotals CollectTotals(const std::vector<Child>& children) {
  AgentTotals t;
  for (const Child& c : children) {
    t.rss_max = std::max(t.rss_max, c.max_rss_bytes);
    if (!c.error.empty()) continue;
    ++t.ok;
    const json& s = c.result["stats"];
    uint64_t pk = s.value("private_kv_bytes", uint64_t{0});
    t.mem_private_max = std::max(t.mem_private_max, s.value("private_bytes", uint64_t{0}));
    t.private_sum += pk;
    t.private_max = std::max(t.private_max, pk);
    t.ttft.push_back(s.value("ttft_ms", 0.0));
    t.attach.push_back(s.value("attach_ms", 0.0));
    t.decode.push_back(s.value("decode_ms", 0.0));
    t.tps.push_back(s.value("tokens_per_s", 0.0));
  }
  return t;
}

/// The run's summary object (the "summary" of --json; the table reads the baseline from it).
json Summary(const AgentsArgs& a, const polykv_pool_info& info, const AgentsRun& run,
             const AgentTotals& t) {
  const uint64_t n_bf16 = info.bf16_bytes * static_cast<uint64_t>(a.n);
  const int concurrent = std::min(run.jobs, a.n);
  json summary = {{"pool_id", info.id},
                  {"codec", info.codec},
                  {"document_tokens", info.tokens},
                  {"agents", a.n},
                  {"agents_ok", t.ok},
                  {"jobs", run.jobs},
                  {"threads_per_agent", run.threads},
                  {"wall_ms", run.all_ms},
                  {"pool_bytes", info.total_bytes},
                  {"bf16_cache_bytes_per_agent", info.bf16_bytes},
                  {"n_private_bf16_bytes", n_bf16},
                  {"ratio_n_bf16_over_pool",
                   info.total_bytes ? static_cast<double>(n_bf16) / info.total_bytes : 0.0},
                  {"agents_private_kv_bytes_sum", t.private_sum},
                  {"agents_private_kv_bytes_max", t.private_max},
                  {"peak_concurrent_kv_bytes", info.total_bytes + t.private_max * concurrent},
                  {"max_agent_peak_rss_bytes", t.rss_max},
                  {"max_agent_private_bytes", t.mem_private_max},
                  {"attend", a.attend},
                  {"mean_attach_ms", Mean(t.attach)},
                  {"mean_decode_ms", Mean(t.decode)},
                  {"mean_ttft_ms", Mean(t.ttft)},
                  {"mean_tokens_per_s", Mean(t.tps)}};
  const std::vector<Child>& base = run.base;
  if (a.baseline && base[0].error.empty() && base[0].result.contains("baseline")) {
    const json& b = base[0].result["baseline"];
    summary["solo_pool_ttft_ms"] = base[0].result["stats"].value("ttft_ms", 0.0);
    summary["solo_prefill_ttft_ms"] = b.value("ttft_ms", 0.0);
    summary["solo_prefill_ms"] = b.value("prefill_ms", 0.0);
    summary["baseline_outputs_match"] = b.value("match", false);
    summary["baseline_private_kv_bytes"] = b.value("private_kv_bytes", uint64_t{0});
  } else if (a.baseline) {
    summary["baseline_error"] = base[0].error;
  }
  return summary;
}

/// --json: the summary, every agent's result (or error) and the baseline's.
void PrintJson(const AgentsArgs& a, const AgentsRun& run, const json& summary) {
  json agents = json::array();
  for (const Child& c : run.children) {
    json j = {{"index", c.index},         {"prompt", c.prompt}, {"pid", c.pid},
              {"exit_code", c.exit_code}, {"signal", c.signal}, {"peak_rss_bytes", c.max_rss_bytes},
              {"wall_ms", c.wall_ms}};
    if (c.error.empty())
      j["result"] = c.result;
    else
      j["error"] = c.error;
    agents.push_back(j);
  }
  json out = {{"summary", summary}, {"agents", agents}};
  if (a.baseline) {
    const Child& b = run.base[0];
    out["baseline"] = b.error.empty() ? b.result : json{{"error", b.error}};
  }
  std::cout << out.dump(2) << std::endl;
}

/// Each agent's question and answer (token ids when there is no text), or why it failed.
void PrintAnswers(const std::vector<Child>& children) {
  for (const Child& c : children) {
    std::printf("[agent %d] Q: %s\n", c.index, OneLine(c.prompt).c_str());
    if (c.error.empty()) {
      std::string ans = c.result.value("answer", std::string());
      if (ans.empty()) {
        ans.clear();
        for (int id : c.result["answer_ids"]) ans += std::to_string(id) + " ";
      }
      std::printf("[agent %d] A: %s\n", c.index, OneLine(ans).c_str());
    } else {
      std::printf("[agent %d] FAILED: %s\n", c.index, c.error.c_str());
    }
  }
}

/// One row per agent: tokens, timings, throughput and memory.
void PrintAgentTable(const AgentsArgs& a, const std::vector<Child>& children) {
  std::printf("\n%-6s %-8s %7s %7s %9s %9s %9s %9s %8s %12s %12s %12s\n", "agent", "pid", "prompt",
              "new", "attach", a.attend == "in-place" ? "view" : "decode", "TTFT", "gen", "tok/s",
              "private KV", "private mem", "peak RSS");
  std::printf("%-6s %-8s %7s %7s %9s %9s %9s %9s %8s %12s %12s %12s\n", "", "", "tokens", "tokens",
              "ms", "ms", "ms", "ms", "", "MiB", "MiB", "MiB");
  for (const Child& c : children) {
    if (!c.error.empty()) {
      std::printf("%-6d %-8d FAILED (%s)\n", c.index, static_cast<int>(c.pid), c.error.c_str());
      continue;
    }
    const json& s = c.result["stats"];
    std::printf("%-6d %-8d %7lld %7lld %9.1f %9.1f %9.1f %9.1f %8.1f %12.2f %12.1f %12.1f\n",
                c.index, static_cast<int>(c.pid), s.value("prompt_tokens", 0LL),
                s.value("new_tokens", 0LL), s.value("attach_ms", 0.0), s.value("decode_ms", 0.0),
                s.value("ttft_ms", 0.0), s.value("generation_ms", 0.0),
                s.value("tokens_per_s", 0.0), s.value("private_kv_bytes", uint64_t{0}) / 1048576.0,
                s.value("private_bytes", uint64_t{0}) / 1048576.0, c.max_rss_bytes / 1048576.0);
  }
}

/// The memory / TTFT figures of the run against N private bf16 caches and the baseline.
void PrintFigures(const AgentsArgs& a, const polykv_pool_info& info, const AgentsRun& run,
                  const AgentTotals& t, const json& summary) {
  const uint64_t n_bf16 = info.bf16_bytes * static_cast<uint64_t>(a.n);
  const int concurrent = std::min(run.jobs, a.n);
  std::printf("\n%-58s %s\n", "figure", "value");
  std::printf("%-58s %s (%s, %llu tokens, one copy for all agents)\n", "shared pool",
              MiB(info.total_bytes).c_str(), info.codec, (unsigned long long)info.tokens);
  std::printf("%-58s %s\n", "N private bf16 caches of the document (N x bf16)",
              MiB(n_bf16).c_str());
  std::printf("%-58s %.2fx\n", "ratio N x bf16 / pool",
              info.total_bytes ? static_cast<double>(n_bf16) / info.total_bytes : 0.0);
  std::printf("%-58s %s per agent (%s summed over %d agents)\n",
              a.attend == "in-place" ? "agents' private KV (prompt + answer only, measured)"
                                     : "agents' private decoded caches (measured)",
              MiB(t.private_max).c_str(), MiB(t.private_sum).c_str(), t.ok);
  std::printf("%-58s %s\n", "max agent private memory (smaps Private_*)",
              MiB(t.mem_private_max).c_str());
  std::printf("%-58s %s (pool + %d concurrent agents)\n", "peak KV bytes at once (-j bound)",
              MiB(info.total_bytes + t.private_max * concurrent).c_str(), concurrent);
  std::printf("%-58s %.1f MiB\n", "max agent peak RSS (wait4)", t.rss_max / 1048576.0);
  std::printf("%-58s %.1f / %.1f / %.1f ms\n",
              a.attend == "in-place" ? "mean attach / pool view / TTFT (N agents)"
                                     : "mean attach / decode / TTFT (N agents)",
              Mean(t.attach), Mean(t.decode), Mean(t.ttft));
  if (summary.contains("solo_pool_ttft_ms")) {
    const double pool_ttft = summary["solo_pool_ttft_ms"], pre = summary["solo_prefill_ttft_ms"];
    std::printf("%-58s %.1f ms\n", "TTFT via pool, agent alone (attach+decode+prompt+1st)",
                pool_ttft);
    std::printf("%-58s %.1f ms (prefill %.1f ms)\n", "TTFT re-prefilling the document, same run",
                pre, summary["solo_prefill_ms"].get<double>());
    std::printf("%-58s %.2fx\n", "TTFT speedup (re-prefill / pool)",
                pool_ttft > 0 ? pre / pool_ttft : 0.0);
    std::printf("%-58s %s\n", "greedy outputs pool vs re-prefill",
                summary["baseline_outputs_match"].get<bool>() ? "match" : "differ");
  } else if (summary.contains("baseline_error")) {
    std::printf("%-58s FAILED: %s\n", "baseline",
                summary["baseline_error"].get<std::string>().c_str());
  }
  std::printf("%-58s %d of %d in %.1f s (-j %d, %d threads each)\n", "agents succeeded", t.ok, a.n,
              run.all_ms / 1000.0, run.jobs, run.threads);
}

Status RunAgents(const AgentsArgs& a) {
  POLYKV_ASSIGN_OR_RETURN(polykv_pool_info info, FindPool(a));
  if (info.backend[0] != '\0') {  // refuse before spawning N agents that would all fail
    // (a persisted pool not restored yet reports no backend: each agent decides on attach)
    client::RouteInput route;
    POLYKV_ASSIGN_OR_RETURN(route.device, client::ParseAgentDevice(a.device));
    route.in_place = a.attend == "in-place";
    route.allow_copy = a.allow_copy;
    route.backend = info.backend;
    route.pool_id = a.pool;
    POLYKV_RETURN_IF_ERROR(client::RoutePool(route).status());
  }
  POLYKV_ASSIGN_OR_RETURN(std::vector<std::string> questions, ReadQuestions(a.questions));
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  AgentsRun run;
  run.jobs = a.jobs > 0 ? a.jobs : cores;
  run.threads = a.threads > 0 ? a.threads : std::max(1, cores / run.jobs);

  char tmpl[] = "/tmp/polykv-agents-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp failed");
  const std::string dir = tmpl;
  struct DirCleanup {
    std::string d;
    ~DirCleanup() {
      std::error_code ec;
      fs::remove_all(d, ec);
    }
  } cleanup{dir};
  POLYKV_RETURN_IF_ERROR(LaunchAgents(a, questions, dir, &run));

  const AgentTotals totals = CollectTotals(run.children);
  const json summary = Summary(a, info, run, totals);
  if (a.json_out) {
    PrintJson(a, run, summary);
  } else {
    PrintAnswers(run.children);
    PrintAgentTable(a, run.children);
    PrintFigures(a, info, run, totals, summary);
  }
  if (totals.ok != a.n) {
    return absl::AbortedError(std::to_string(a.n - totals.ok) + " of " + std::to_string(a.n) +
                              " agents failed");
  }
  return absl::OkStatus();
}

}  // namespace

void RegisterAgentsCommands(CLI::App& app) {
  auto args = std::make_shared<AgentsArgs>();
  CLI::App* grp = app.add_subcommand("agents", "Launch many agent processes on one pool");
  grp->require_subcommand(1);
  CLI::App* run = grp->add_subcommand(
      "run", "Start N separate `polykv-cli agent` processes, print answers and a summary table");
  run->add_option("--pool", args->pool, "pool id")->required();
  run->add_option("--model", args->model, "the pool's model")->required();
  run->add_option("--questions", args->questions,
                  "file with one question per line (cycled when N exceeds it)")
      ->required();
  run->add_flag("--ids", args->ids, "question lines are prompt token ids (1,2,3)");
  run->add_flag("--raw", args->raw, "do not wrap questions in the model's chat template");
  run->add_option("-n,--agents", args->n, "number of agent processes")->check(CLI::Range(1, 4096));
  run->add_option("-j,--jobs", args->jobs, "agents alive at once (default: cores)")
      ->check(CLI::Range(0, 4096));
  run->add_option("--max-new-tokens", args->max_new_tokens, "tokens per answer")
      ->check(CLI::Range(0, 1 << 20));
  AddThreadsOption(run, &args->threads, "compute threads per agent (0 = cores/-j)");
  run->add_flag("!--no-baseline", args->baseline,
                "skip the re-prefill baseline agent run after the N agents");
  run->add_flag("--json", args->json_out, "machine-readable output");
  run->add_option("--attend", args->attend,
                  "in-place (default) or decompressed: how each agent reads the pool")
      ->check(CLI::IsMember({"in-place", "decompressed"}));
  run->add_option("--device", args->device,
                  "cpu (default), cuda or cuda:N: where each agent computes (polykv-cli agent)");
  run->add_flag("--allow-copy", args->allow_copy,
                "let CPU agents copy a pool that lies in CUDA memory (logged with its cost)");
  AddDaemonOptions(run, &args->endpoint, &args->timeout_ms);
  run->callback([args] {
    if (Status s = RunAgents(*args); !s.ok()) FailWith(s);
  });
  RegisterAgentsServeCommand(*grp);
}

}  // namespace polykv::cli
