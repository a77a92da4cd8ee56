// bench_agents: what sharing one pool costs each agent, in one run on one machine.
// (1) Memory with N agent processes alive at the same time on one pool (each attached and
//     after its answer): MemAvailable drop per agent, for two set-ups measured in the same
//     run: "mapped + decompressed" (weights shared through the mapping, the pool decoded
//     into a private cache: the baseline) and "mapped + in place" (the default: nothing of
//     the document copied). Every agent asks the same question greedily: each answer is
//     checked against the first agent's of the run (single-agent answer), and the largest
//     agent private memory (smaps Private_*) is printed next to the mean.
//     Next to it the paper's table (pool vs N private bf16 caches) and the whole-system
//     figure (pool + weights once + N x per-agent memory).
// (2) Time to first token via the pool (attach + prompt + first token; decompressed adds the
//     decode) vs prefilling the document itself.
// (3) Decode tokens/s with a 1.4K and a 4K-token prefix, in place vs decompressed, 1 and 2
//     threads.
// Uses SmolLM2 ($POLYKV_SMOLLM2_GGUF or --model), else stories260K (short documents).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "polykv/agent.h"
#include "polykv/client.h"
#include "polykv/model/llama.h"
#include "support/files.h"
#include "support/process.h"

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

using polykv::support::ReadFile;

// MemAvailable from /proc/meminfo, bytes.
double MemAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string k;
  double v = 0;
  std::string unit;
  while (in >> k >> v >> unit)
    if (k == "MemAvailable:") return v * 1024;
  return 0;
}

std::string MiB(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", b / 1048576.0);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_agents: memory, TTFT and decode speed of agents sharing one pool"};
  const char* env = std::getenv("POLYKV_SMOLLM2_GGUF");
  std::string model_path = env ? env : "";
  std::vector<int> inplace_counts = {1, 4, 16, 64};
  std::vector<int> decompressed_counts = {1, 8, 16};
  std::vector<int64_t> doc_sizes = {512, 1451, 2048, 4096};
  int new_tokens = 8, decode_tokens = 64;
  std::string codec = "default";  // the demo's codec
  bool skip_memory = false, skip_ttft = false, skip_decode = false;
  app.add_option("--model", model_path, "model (default $POLYKV_SMOLLM2_GGUF, else stories260K)");
  app.add_option("--in-place-agents", inplace_counts, "agent counts, in place")->delimiter(',');
  app.add_option("--decompressed-agents", decompressed_counts,
                 "agent counts, mapped + decompressed")
      ->delimiter(',');
  app.add_option("--doc-tokens", doc_sizes, "document sizes for the TTFT table")->delimiter(',');
  app.add_option("--max-new-tokens", new_tokens, "tokens per answer (memory, TTFT)");
  app.add_option("--decode-tokens", decode_tokens, "tokens per decode measurement");
  app.add_option("--codec", codec, "pool codec");
  app.add_flag("--skip-memory", skip_memory);
  app.add_flag("--skip-ttft", skip_ttft);
  app.add_flag("--skip-decode", skip_decode);
  CLI11_PARSE(app, argc, argv);
  if (model_path.empty()) model_path = FindUp("tests/data/models/stories260K");
  const std::string daemon_bin = ExeDir() + "/../daemon/polykvd";
  const std::string cli_bin = ExeDir() + "/../cli/polykv-cli";
  if (!fs::exists(daemon_bin) || !fs::exists(cli_bin)) {
    std::fprintf(stderr, "error: needs %s and %s (build polykvd and polykv-cli)\n",
                 daemon_bin.c_str(), cli_bin.c_str());
    return 1;
  }

  // polykvd child on a private endpoint, stopped (SIGTERM, SIGKILL after 10 s) on the way out
  // before its folder is removed.
  struct DaemonGuard {
    polykv::support::TempDir tmp{"polykv-bench-"};
    std::string dir = tmp.path(), endpoint;
    polykv::support::Process proc;
    ~DaemonGuard() { proc.Stop(10000); }
  } d;
  if (!d.tmp.ok()) {
    std::fprintf(stderr, "error: cannot create a temporary folder under /tmp\n");
    return 1;
  }
  d.endpoint = "ipc://" + d.dir + "/control.sock";
  if (absl::Status s = d.proc.Start(
          {daemon_bin, "--endpoint", d.endpoint, "--backend", "host", "--log-level", "warn"},
          d.dir + "/polykvd.out", d.dir + "/polykvd.err");
      !s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return 1;
  }
  polykv_client* c = nullptr;
  for (int i = 0; i < 100 && polykv_connect(d.endpoint.c_str(), 500, &c) != POLYKV_OK; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (c == nullptr) {
    std::fprintf(stderr, "error: polykvd did not start:\n%s\n",
                 ReadFile(d.dir + "/polykvd.err").c_str());
    return 1;
  }
  setenv("POLYKV_ENDPOINT", d.endpoint.c_str(), 1);

  // In-process agents (one per way of reading the pool): tokenize, TTFT and decode tables.
  client::AgentOptions ao;
  ao.model_path = model_path;
  ao.endpoint = d.endpoint;
  ao.threads = 1;
  auto inplace_or = client::PooledAgent::Create(ao);
  client::AgentOptions ad = ao;
  ad.attend = client::Attend::kDecompressed;
  auto decomp_or = client::PooledAgent::Create(ad);
  if (!inplace_or.ok() || !decomp_or.ok()) {
    std::fprintf(stderr, "error: %s\n",
                 (!inplace_or.ok() ? inplace_or.status() : decomp_or.status()).ToString().c_str());
    return 1;
  }
  client::PooledAgent& agent = **inplace_or;
  client::PooledAgent& decomp = **decomp_or;
  const model::Tokenizer* tok = agent.model().tokenizer();
  const int64_t max_pos = agent.model().config().max_positions;

  // Documents: the chat-framed Robert Boulter article (the demo's, 1,451 tokens for SmolLM2)
  // for the 1.4K rows; WikiText-2 test tokens otherwise; deterministic ids without a tokenizer.
  std::vector<int32_t> corpus, article;
  int64_t need = std::max<int64_t>(4096, *std::max_element(doc_sizes.begin(), doc_sizes.end()));
  if (tok != nullptr) {
    std::string text = ReadFile(FindUp("data/wikitext-2/wiki.test.raw"));
    text.resize(std::min<size_t>(text.size(), need * 8));
    auto ids = tok->Encode(text, false);
    if (ids.ok()) corpus = *ids;
    auto a = tok->Encode(
        client::ChatDocument(ReadFile(FindUp("data/wikitext-2/robert_boulter.txt"))), false);
    if (a.ok()) article = *a;
  }
  if (corpus.empty()) {
    for (int64_t i = 0; i < need; ++i) corpus.push_back(static_cast<int32_t>(3 + (i * 7919) % 500));
  }
  auto document = [&](int64_t n) -> std::vector<int32_t> {
    if (static_cast<int64_t>(article.size()) == n) return article;
    return std::vector<int32_t>(corpus.begin(),
                                corpus.begin() + std::min<int64_t>(n, corpus.size()));
  };
  auto create = [&](const std::vector<int32_t>& ids, std::string* id,
                    polykv_pool_info* out) -> bool {
    polykv_create_options o;
    polykv_create_options_init(&o);
    o.model = model_path.c_str();
    o.token_ids = ids.data();
    o.token_count = ids.size();
    o.codec = codec.c_str();
    polykv_pool_info info = polykv_pool_info_init();
    if (polykv_create_pool(c, &o, nullptr, nullptr, &info, nullptr) != POLYKV_OK) {
      std::fprintf(stderr, "error: create pool: %s\n", polykv_last_error());
      return false;
    }
    *id = info.id;
    if (out != nullptr) *out = info;
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

  // ---- (1) memory with N agents alive at once ----
  if (!skip_memory) {
    const int64_t doc_n = article.empty() ? std::min<int64_t>(1451, max_pos - 64)
                                          : static_cast<int64_t>(article.size());
    const std::vector<int32_t> doc = document(doc_n);
    std::string pool;
    polykv_pool_info info = polykv_pool_info_init();
    if (!create(doc, &pool, &info)) return 1;
    const double weights_bytes =
        static_cast<double>(fs::is_directory(model_path) ? 0 : fs::file_size(model_path));
    std::printf(
        "\n(1) memory: %zu-token document, pool %s MiB, %d new tokens per agent; every "
        "agent alive at once, attached, after answering\n",
        doc.size(), MiB(info.total_bytes).c_str(), new_tokens);
    std::printf("%-26s %6s %14s %12s %12s %12s %12s %18s %11s\n", "set-up", "agents",
                "MemAvail drop", "per agent", "agent PSS", "agent priv.", "max priv.",
                "system (pool + w +", "same answer");
    std::printf("%-26s %6s %14s %12s %12s %12s %12s %18s %11s\n", "", "", "MiB", "MiB", "MiB",
                "MiB", "MiB", "N x agent) MiB", "as the first");
    struct Setup {
      const char* name;
      std::vector<std::string> flags;
      const std::vector<int>* counts;
    };
    const Setup setups[] = {
        {"mapped + decompressed", {"--attend", "decompressed"}, &decompressed_counts},
        {"mapped + in place", {"--attend", "in-place"}, &inplace_counts},
    };
    const std::vector<int32_t> prompt = prompt_for(0);
    std::string prompt_ids;
    for (size_t k = 0; k < prompt.size(); ++k)
      prompt_ids += (k ? "," : "") + std::to_string(prompt[k]);
    for (const Setup& su : setups) {
      std::vector<int32_t> reference_answer;  // the set-up's first agent's greedy answer
      for (int n : *su.counts) {
        const std::string hold = d.dir + "/hold";
        std::ofstream(hold).put('1');
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        const double before = MemAvailable();
        std::vector<polykv::support::Process> agents(n);
        bool failed = false;
        for (int i = 0; i < n; ++i) {
          std::vector<std::string> argv = {cli_bin,
                                           "agent",
                                           "--pool",
                                           pool,
                                           "--model",
                                           model_path,
                                           "--prompt-ids",
                                           prompt_ids,
                                           "--max-new-tokens",
                                           std::to_string(new_tokens),
                                           "--json",
                                           "--threads",
                                           "1",
                                           "--endpoint",
                                           d.endpoint,
                                           "--timeout-ms",
                                           "60000",
                                           "--hold-while-exists",
                                           hold};
          argv.insert(argv.end(), su.flags.begin(), su.flags.end());
          if (absl::Status s = agents[i].Start(argv, d.dir + "/a" + std::to_string(i) + ".out",
                                               d.dir + "/a" + std::to_string(i) + ".err");
              !s.ok()) {
            std::fprintf(stderr, "agent %d: %s\n", i, s.ToString().c_str());
            failed = true;
          }
        }
        // Wait until every agent answered and holds (or one died).
        while (!failed) {
          int holding = 0;
          for (int i = 0; i < n; ++i) {
            if (polykv::support::FileContains(d.dir + "/a" + std::to_string(i) + ".err", "holding"))
              ++holding;
            if (agents[i].running() && agents[i].Wait(0)) {
              std::fprintf(stderr, "agent %d exited early:\n%s\n", i, agents[i].err().c_str());
              failed = true;
            }
          }
          if (failed || holding == n) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        double during = 0;
        for (int k = 0; k < 3; ++k) {
          during += MemAvailable() / 3;
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        fs::remove(hold);
        double pss = 0, priv = 0, priv_max = 0;
        int ok = 0, same = 0;
        for (int i = 0; i < n; ++i) {
          agents[i].Wait(-1);
          try {
            json j = json::parse(ReadFile(d.dir + "/a" + std::to_string(i) + ".out"));
            pss += j["stats"]["pss_bytes"].get<double>();
            const double p = j["stats"]["private_bytes"].get<double>();
            priv += p;
            priv_max = std::max(priv_max, p);
            const auto ids = j["answer_ids"].get<std::vector<int32_t>>();
            if (reference_answer.empty()) reference_answer = ids;
            same += ids == reference_answer ? 1 : 0;
            ++ok;
          } catch (...) {
          }
        }
        if (failed || ok != n) {
          std::printf("%-26s %6d FAILED (%d of %d answered)\n", su.name, n, ok, n);
          continue;
        }
        const double drop = before - during, per = drop / n;
        // The model file's pages are in the page cache once for the whole host.
        const double system = info.total_bytes + weights_bytes + drop;
        std::printf("%-26s %6d %14s %12s %12s %12s %12s %18s %9d/%d\n", su.name, n,
                    MiB(drop).c_str(), MiB(per).c_str(), MiB(pss / n).c_str(),
                    MiB(priv / n).c_str(), MiB(priv_max).c_str(), MiB(system).c_str(), same, n);
        std::fflush(stdout);
      }
    }
    std::printf(
        "MemAvail drop = MemAvailable before the agents start - while all N hold (mean of "
        "3 samples); agent PSS / private from each agent's smaps_rollup after its answer.\n"
        "system = pool + model file (mapped set-ups: its pages are in the page cache "
        "once for the host) + the measured drop.\n");
    std::printf("\npaper's table (pool vs N private bf16 caches of the %zu-token document):\n",
                doc.size());
    std::printf("%6s %12s %16s %10s\n", "agents", "pool MiB", "N x bf16 MiB", "ratio");
    for (int n : {1, 3, 10, 15, 64}) {
      std::printf("%6d %12s %16s %9.2fx\n", n, MiB(info.total_bytes).c_str(),
                  MiB(static_cast<double>(info.bf16_bytes) * n).c_str(),
                  static_cast<double>(info.bf16_bytes) * n / info.total_bytes);
    }
    polykv_evict(c, pool.c_str(), 1);
  }

  // ---- (2) TTFT via the pool vs re-prefill ----
  model::SamplingOptions s;
  s.max_new_tokens = new_tokens;
  if (!skip_ttft) {
    std::printf(
        "\n(2) time to first token, 1 thread: via the pool vs prefilling the document itself\n");
    std::printf("%8s %10s %12s %12s %14s %14s %10s %9s\n", "doc tok", "attach ms", "TTFT place",
                "TTFT decomp", "prefill ms", "TTFT prefill", "prefill /", "greedy");
    std::printf("%8s %10s %12s %12s %14s %14s %10s %9s\n", "", "", "ms", "ms", "", "ms", "place",
                "");
    for (int64_t n : doc_sizes) {
      if (max_pos > 0 && n + 64 > max_pos) {
        std::printf("%8lld skipped: model context is %lld\n", (long long)n, (long long)max_pos);
        continue;
      }
      const std::vector<int32_t> doc = document(n);
      if (static_cast<int64_t>(doc.size()) < n) continue;
      std::string pool;
      if (!create(doc, &pool, nullptr)) return 1;
      std::vector<int32_t> prompt = prompt_for(0);
      auto r = agent.Run(pool, prompt, s);
      auto rd = decomp.Run(pool, prompt, s);
      auto b = agent.RunBaseline(doc, prompt, s);
      if (!r.ok() || !rd.ok() || !b.ok()) {
        std::fprintf(stderr, "error: %s\n",
                     (!r.ok()    ? r.status()
                      : !rd.ok() ? rd.status()
                                 : b.status())
                         .ToString()
                         .c_str());
        return 1;
      }
      std::printf("%8lld %10.1f %12.1f %12.1f %14.1f %14.1f %9.1fx %9s\n", (long long)n,
                  r->stats.attach_ms, r->stats.ttft_ms, rd->stats.ttft_ms, b->prefill_ms,
                  b->ttft_ms, b->ttft_ms / r->stats.ttft_ms,
                  r->answer_ids == b->answer_ids ? "same" : "differs");
      std::fflush(stdout);
      polykv_evict(c, pool.c_str(), 1);
    }
    std::printf(
        "TTFT in place = attach + prompt forward + first token; decompressed adds decoding "
        "every layer; prefill = document forward (chunks of 512) + prompt + first token.\n"
        "greedy: in-place answer vs the re-prefill answer (codec %s).\n",
        codec.c_str());
  }

  // ---- (3) decode speed, in place vs decompressed ----
  if (!skip_decode) {
    std::printf("\n(3) decode tokens/s after the prompt (%d tokens, greedy, EOS ignored)\n",
                decode_tokens);
    std::printf("%8s %8s %14s %14s %8s %16s\n", "prefix", "threads", "in place", "decompressed",
                "ratio", "prefix MiB/token");
    model::SamplingOptions ds;
    ds.max_new_tokens = decode_tokens;
    ds.stop_at_eos = false;
    for (int64_t n : {int64_t{1451}, int64_t{4096}}) {
      if (max_pos > 0 && n + decode_tokens + 64 > max_pos) continue;
      const std::vector<int32_t> doc = document(n);
      std::string pool;
      if (!create(doc, &pool, nullptr)) return 1;
      for (int threads : {1, 2}) {
        model::SetComputeThreads(threads);
        auto r = agent.Run(pool, prompt_for(1), ds);
        auto rd = decomp.Run(pool, prompt_for(1), ds);
        if (!r.ok() || !rd.ok()) {
          std::fprintf(stderr, "error: %s\n",
                       (!r.ok() ? r.status() : rd.status()).ToString().c_str());
          return 1;
        }
        // Decode rate after the first token (the prompt forward excluded).
        const auto rate = [](const client::AgentStats& st) {
          const double ms = st.generation_ms - st.prompt_first_token_ms;
          return st.new_tokens > 1 && ms > 0 ? (st.new_tokens - 1) * 1000.0 / ms : 0.0;
        };
        std::printf("%8zu %8d %14.1f %14.1f %7.2fx %16.2f\n", doc.size(), threads, rate(r->stats),
                    rate(rd->stats), rate(r->stats) / rate(rd->stats),
                    r->stats.prefix_bytes_per_token / 1048576.0);
        std::fflush(stdout);
      }
      model::SetComputeThreads(1);
      polykv_evict(c, pool.c_str(), 1);
    }
  }
  polykv_disconnect(c);
  return 0;
}
