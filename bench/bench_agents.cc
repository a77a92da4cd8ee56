// bench_agents: what sharing one pool saves. (1) Memory for N = 1, 3, 10, 15, 64 agent
// processes on one pool: the pool's bytes (constant in N) and the KV bytes the agents hold
// (measured from each agent's own report) versus N private bf16 caches. (2) Time to first
// token of an agent via the pool (attach + decode + prompt + first token) versus prefilling
// the document itself, for 512, 2048 and 4096-token documents (first tokens of WikiText-2).
// Uses SmolLM2 ($POLYKV_SMOLLM2_GGUF or --model), else stories260K (short documents).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "polykv/agent.h"
#include "polykv/client.h"
#include "polykv/model/llama.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
namespace client = polykv::client;
namespace model = polykv::model;

std::string ExeDir() {
  std::error_code ec;
  return fs::read_symlink("/proc/self/exe", ec).parent_path().string();
}

std::string FindUp(const std::string& rel) {
  if (fs::exists(rel)) return rel;
  for (fs::path d = ExeDir(); !d.empty() && d != d.root_path(); d = d.parent_path()) {
    if (fs::exists(d / rel)) return (d / rel).string();
  }
  return rel;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

pid_t Spawn(const std::vector<std::string>& argv, const std::string& out, const std::string& err) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::vector<char*> c;
  for (const auto& s : argv) c.push_back(const_cast<char*>(s.c_str()));
  c.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, c[0], &fa, nullptr, c.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

// polykvd child on a private endpoint; SIGTERM on destruction.
struct DaemonGuard {
  std::string dir, endpoint;
  pid_t pid = -1;
  ~DaemonGuard() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      for (int i = 0; i < 100; ++i) {
        if (waitpid(pid, nullptr, WNOHANG) == pid) { pid = -1; break; }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      if (pid > 0) { kill(pid, SIGKILL); waitpid(pid, nullptr, 0); }
    }
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }
};

std::string MiB(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", b / 1048576.0);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_agents: memory and TTFT of agents sharing one pool"};
  const char* env = std::getenv("POLYKV_SMOLLM2_GGUF");
  std::string model_path = env ? env : "";
  std::vector<int> agent_counts = {1, 3, 10, 15, 64};
  std::vector<int64_t> doc_sizes = {512, 2048, 4096};
  int jobs = 2;
  int new_tokens = 8;
  std::string codec = "k8v3";
  bool skip_memory = false, skip_ttft = false;
  app.add_option("--model", model_path, "model (default $POLYKV_SMOLLM2_GGUF, else stories260K)");
  app.add_option("--agents", agent_counts, "agent counts")->delimiter(',');
  app.add_option("--doc-tokens", doc_sizes, "document sizes for the TTFT table")->delimiter(',');
  app.add_option("-j,--jobs", jobs, "agent processes alive at once");
  app.add_option("--max-new-tokens", new_tokens, "tokens per answer");
  app.add_option("--codec", codec, "pool codec");
  app.add_flag("--skip-memory", skip_memory);
  app.add_flag("--skip-ttft", skip_ttft);
  CLI11_PARSE(app, argc, argv);
  if (model_path.empty()) model_path = FindUp("tests/data/models/stories260K");
  const std::string daemon_bin = ExeDir() + "/../daemon/polykvd";
  const std::string cli_bin = ExeDir() + "/../cli/polykv-cli";
  if (!fs::exists(daemon_bin) || !fs::exists(cli_bin)) {
    std::fprintf(stderr, "error: needs %s and %s (build polykvd and polykv-cli)\n",
                 daemon_bin.c_str(), cli_bin.c_str());
    return 1;
  }

  // In-process agent: tokenizes, and runs the TTFT comparison.
  client::AgentOptions ao;
  ao.model_path = model_path;
  auto agent_or = client::PooledAgent::Create(ao);
  if (!agent_or.ok()) {
    std::fprintf(stderr, "error: %s\n", agent_or.status().ToString().c_str());
    return 1;
  }
  client::PooledAgent& agent = **agent_or;
  const model::Tokenizer* tok = agent.model().tokenizer();
  const int64_t max_pos = agent.model().config().max_positions;

  DaemonGuard d;
  {
    char tmpl[] = "/tmp/polykv-bench-XXXXXX";
    d.dir = mkdtemp(tmpl);
  }
  d.endpoint = "ipc://" + d.dir + "/control.sock";
  d.pid = Spawn({daemon_bin, "--endpoint", d.endpoint, "--backend", "host", "--log-level", "warn"},
                d.dir + "/polykvd.out", d.dir + "/polykvd.err");
  polykv_client* c = nullptr;
  for (int i = 0; i < 100 && polykv_connect(d.endpoint.c_str(), 500, &c) != POLYKV_OK; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (c == nullptr) {
    std::fprintf(stderr, "error: polykvd did not start:\n%s\n", ReadFile(d.dir + "/polykvd.err").c_str());
    return 1;
  }
  setenv("POLYKV_ENDPOINT", d.endpoint.c_str(), 1);
  ao.endpoint = d.endpoint;

  // Document ids: WikiText-2 tokens with a tokenizer, else deterministic ids.
  std::vector<int32_t> corpus;
  int64_t need = std::max<int64_t>(2048, *std::max_element(doc_sizes.begin(), doc_sizes.end()));
  if (tok != nullptr) {
    std::string text = ReadFile(FindUp("data/wikitext-2/wiki.test.raw"));
    text.resize(std::min<size_t>(text.size(), need * 8));
    auto ids = tok->Encode(text, false);
    if (ids.ok()) corpus = *ids;
  }
  if (corpus.empty()) {
    for (int64_t i = 0; i < need; ++i) corpus.push_back(static_cast<int32_t>(3 + (i * 7919) % 500));
  }
  auto create = [&](const std::vector<int32_t>& ids, std::string* id) -> bool {
    polykv_create_options o;
    polykv_create_options_init(&o);
    o.model = model_path.c_str();
    o.token_ids = ids.data();
    o.token_count = ids.size();
    o.codec = codec.c_str();
    polykv_pool_info info{};
    if (polykv_create_pool(c, &o, nullptr, nullptr, &info, nullptr) != POLYKV_OK) {
      std::fprintf(stderr, "error: create pool: %s\n", polykv_last_error());
      return false;
    }
    *id = info.id;
    return true;
  };
  auto prompt_for = [&](int i) -> std::vector<int32_t> {
    if (tok != nullptr) {
      auto p = agent.EncodePrompt(client::ChatQuestionPrompt(
          i % 2 ? "What is this text about?" : "Summarize the text in one sentence."));
      if (p.ok()) return *p;
    }
    return {static_cast<int32_t>(10 + i), 20, 30, 40};
  };

  std::printf("bench_agents: model %s, codec %s, %u cores\n", model_path.c_str(), codec.c_str(),
              std::thread::hardware_concurrency());

  // ---- (1) memory vs N ----
  if (!skip_memory) {
    const int64_t doc_n = std::min<int64_t>(2048, max_pos > 0 ? max_pos - 64 : 2048);
    std::vector<int32_t> doc(corpus.begin(), corpus.begin() + std::min<int64_t>(doc_n, corpus.size()));
    std::string pool;
    if (!create(doc, &pool)) return 1;
    const std::string qfile = d.dir + "/q.txt";
    {
      std::ofstream q(qfile);
      for (int i = 0; i < 4; ++i) {
        std::vector<int32_t> p = prompt_for(i);
        for (size_t k = 0; k < p.size(); ++k) q << (k ? "," : "") << p[k];
        q << "\n";
      }
    }
    std::printf("\n(1) memory: %zu-token document, %d new tokens per agent, -j %d\n", doc.size(),
                new_tokens, jobs);
    std::printf("%6s %12s %14s %14s %14s %10s %14s %12s %10s\n", "agents", "pool MiB",
                "agents' KV MiB", "pool+agents", "N x bf16 MiB", "ratio", "peak at once",
                "max RSS MiB", "wall s");
    std::printf("%6s %12s %14s %14s %14s %10s %14s %12s %10s\n", "", "(shared)",
                "(measured sum)", "MiB", "(baseline)", "bf16/pool", "MiB (-j)", "(wait4)", "");
    for (int n : agent_counts) {
      const std::string out = d.dir + "/agents.json", err = d.dir + "/agents.err";
      auto t0 = std::chrono::steady_clock::now();
      pid_t pid = Spawn({cli_bin, "agents", "run", "--pool", pool, "--model", model_path,
                         "--questions", qfile, "--ids", "-n", std::to_string(n), "-j",
                         std::to_string(jobs), "--max-new-tokens", std::to_string(new_tokens),
                         "--no-baseline", "--json", "--endpoint", d.endpoint},
                        out, err);
      int status = 0;
      waitpid(pid, &status, 0);
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      json j;
      try {
        j = json::parse(ReadFile(out));
      } catch (...) {
        std::fprintf(stderr, "error: agents run -n %d failed:\n%s\n", n, ReadFile(err).c_str());
        return 1;
      }
      const json& s = j["summary"];
      const double pool_b = s["pool_bytes"].get<double>();
      const double sum_b = s["agents_private_kv_bytes_sum"].get<double>();
      const double nbf16 = s["n_private_bf16_bytes"].get<double>();
      std::printf("%6d %12s %14s %14s %14s %9.2fx %14s %12s %10.1f\n", n, MiB(pool_b).c_str(),
                  MiB(sum_b).c_str(), MiB(pool_b + sum_b).c_str(), MiB(nbf16).c_str(),
                  nbf16 / pool_b, MiB(s["peak_concurrent_kv_bytes"].get<double>()).c_str(),
                  MiB(s["max_agent_peak_rss_bytes"].get<double>()).c_str(), wall);
      std::fflush(stdout);
      if (s["agents_ok"].get<int>() != n) {
        std::fprintf(stderr, "warning: only %d of %d agents succeeded\n", s["agents_ok"].get<int>(), n);
      }
    }
    std::printf("agents' KV = each agent's own decode cache (model dtype, capacity = document + "
                "prompt + new tokens), alive only while it runs; at most -j at once.\n");
  }

  // ---- (2) TTFT via pool vs re-prefill ----
  if (!skip_ttft) {
    std::printf("\n(2) time to first token: agent via the pool vs prefilling the document itself\n");
    std::printf("%8s %10s %10s %12s %12s %14s %9s %8s\n", "doc tok", "attach ms", "decode ms",
                "TTFT pool", "prefill ms", "TTFT prefill", "speedup", "greedy");
    model::SamplingOptions s;
    s.max_new_tokens = new_tokens;
    for (int64_t n : doc_sizes) {
      if (max_pos > 0 && n + 64 > max_pos) {
        std::printf("%8lld skipped: model context is %lld\n", (long long)n, (long long)max_pos);
        continue;
      }
      if (n > static_cast<int64_t>(corpus.size())) {
        std::printf("%8lld skipped: corpus has %zu tokens\n", (long long)n, corpus.size());
        continue;
      }
      std::vector<int32_t> doc(corpus.begin(), corpus.begin() + n);
      std::string pool;
      if (!create(doc, &pool)) return 1;
      std::vector<int32_t> prompt = prompt_for(0);
      auto r = agent.Run(pool, prompt, s);
      auto b = agent.RunBaseline(doc, prompt, s);
      if (!r.ok() || !b.ok()) {
        std::fprintf(stderr, "error: %s\n", (!r.ok() ? r.status() : b.status()).ToString().c_str());
        return 1;
      }
      std::printf("%8lld %10.1f %10.1f %12.1f %12.1f %14.1f %8.2fx %8s\n", (long long)n,
                  r->stats.attach_ms, r->stats.decode_ms, r->stats.ttft_ms, b->prefill_ms,
                  b->ttft_ms, b->ttft_ms / r->stats.ttft_ms,
                  r->answer_ids == b->answer_ids ? "same" : "differs");
      std::fflush(stdout);
      polykv_evict(c, pool.c_str(), 1);
    }
    std::printf("TTFT pool = attach + decode all layers + prompt forward + first token; TTFT "
                "prefill = document forward (chunks of 512) + prompt forward + first token.\n");
  }
  polykv_disconnect(c);
  return 0;
}
