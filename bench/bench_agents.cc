// bench_agents: what sharing one pool costs each agent, in one run on one
// machine. (1) Memory with N agent processes alive at the same time on one pool
// (each attached and
//     after its answer): MemAvailable drop per agent, for two set-ups measured
//     in the same run: "mapped + decompressed" (weights shared through the
//     mapping, the pool decoded into a private cache: the baseline) and "mapped
//     + in place" (the default: nothing of the document copied). Every agent
//     asks the same question greedily: each answer is checked against the first
//     agent's of the run (single-agent answer), and the largest agent private
//     memory (smaps Private_*) is printed next to the mean. Next to it the
//     paper's table (pool vs N private bf16 caches) and the whole-system figure
//     (pool + weights once + N x per-agent memory).
// (2) Time to first token via the pool (attach + prompt + first token;
// decompressed adds the
//     decode) vs prefilling the document itself.
// (3) Decode tokens/s with a 1.4K and a 4K-token prefix, in place vs
// decompressed, 1 and 2
//     threads.
// Uses SmolLM2 ($POLYKV_SMOLLM2_GGUF or --model), else stories260K (short
// documents).
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
#include "polykv/ipc/pool_memory.h"
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

std::string FindUp(const std::string &rel) {
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

// The command line.
struct Options {
  std::string model_path;
  std::vector<int> inplace_counts = {1, 4, 16, 64};
  std::vector<int> decompressed_counts = {1, 8, 16};
  std::vector<int64_t> doc_sizes = {512, 1451, 2048, 4096};
  int new_tokens = 8, decode_tokens = 64;
  std::string codec = "default";  // the demo's codec
  bool skip_memory = false, skip_ttft = false, skip_decode = false;
};

// Parses the flags into *o: -1 to go on, else main's exit code (--help, a bad
// flag).
int ParseOptions(int argc, char **argv, Options *o) {
  CLI::App app{"bench_agents: memory, TTFT and decode speed of agents sharing one pool"};
  const char *env = std::getenv("POLYKV_SMOLLM2_GGUF");
  o->model_path = env ? env : "";
  app.add_option("--model", o->model_path,
                 "model (default $POLYKV_SMOLLM2_GGUF, else stories260K)");
  app.add_option("--in-place-agents", o->inplace_counts, "agent counts, in place")->delimiter(',');
  app.add_option("--decompressed-agents", o->decompressed_counts,
                 "agent counts, mapped + decompressed")
      ->delimiter(',');
  app.add_option("--doc-tokens", o->doc_sizes, "document sizes for the TTFT table")->delimiter(',');
  app.add_option("--max-new-tokens", o->new_tokens, "tokens per answer (memory, TTFT)");
  app.add_option("--decode-tokens", o->decode_tokens, "tokens per decode measurement");
  app.add_option("--codec", o->codec, "pool codec");
  app.add_flag("--skip-memory", o->skip_memory);
  app.add_flag("--skip-ttft", o->skip_ttft);
  app.add_flag("--skip-decode", o->skip_decode);
  CLI11_PARSE(app, argc, argv);
  if (o->model_path.empty()) o->model_path = FindUp("tests/data/models/stories260K");
  return -1;
}

// polykvd child on a private endpoint, stopped (SIGTERM, SIGKILL after 10 s) on
// the way out before its folder is removed.
struct DaemonGuard {
  polykv::support::TempDir tmp{"polykv-bench-"};
  std::string dir = tmp.path(), endpoint;
  polykv::support::Process proc;
  ~DaemonGuard() { proc.Stop(10000); }
};

// Starts `daemon_bin` in d's folder and connects to it (also exported as
// $POLYKV_ENDPOINT); nullptr after printing why not.
polykv_client *StartDaemon(const std::string &daemon_bin, DaemonGuard &d) {
  if (!d.tmp.ok()) {
    std::fprintf(stderr, "error: cannot create a temporary folder under /tmp\n");
    return nullptr;
  }
  d.endpoint = "ipc://" + d.dir + "/control.sock";
  if (absl::Status s = d.proc.Start(
          {daemon_bin, "--endpoint", d.endpoint, "--backend",
           polykv::ipc::PoolMemoryName(polykv::ipc::PoolMemory::kHost), "--log-level", "warn"},
          d.dir + "/polykvd.out", d.dir + "/polykvd.err");
      !s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return nullptr;
  }
  polykv_client *c = nullptr;
  for (int i = 0; i < 100 && polykv_connect(d.endpoint.c_str(), 500, &c) != POLYKV_OK; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (c == nullptr) {
    std::fprintf(stderr, "error: polykvd did not start:\n%s\n",
                 ReadFile(d.dir + "/polykvd.err").c_str());
    return nullptr;
  }
  setenv("POLYKV_ENDPOINT", d.endpoint.c_str(), 1);
  return c;
}

// What the three sections share: the daemon, the in-process agents (one per way
// of reading the pool), and the documents.
struct Bench {
  const Options &o;
  std::string cli_bin;
  const DaemonGuard &d;
  polykv_client *c = nullptr;
  client::PooledAgent *agent = nullptr;   // in place
  client::PooledAgent *decomp = nullptr;  // decompressed
  const model::Tokenizer *tok = nullptr;
  int64_t max_pos = 0;
  // The chat-framed Robert Boulter article (the demo's, 1,451 tokens for
  // SmolLM2) for the 1.4K rows; WikiText-2 test tokens otherwise; deterministic
  // ids without a tokenizer.
  std::vector<int32_t> corpus, article;

  void LoadDocuments() {
    int64_t need =
        std::max<int64_t>(4096, *std::max_element(o.doc_sizes.begin(), o.doc_sizes.end()));
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
      for (int64_t i = 0; i < need; ++i)
        corpus.push_back(static_cast<int32_t>(3 + (i * 7919) % 500));
    }
  }
  // An n-token document: the article when it has n tokens, else the corpus's
  // first n.
  std::vector<int32_t> Document(int64_t n) const {
    if (static_cast<int64_t>(article.size()) == n) return article;
    return std::vector<int32_t>(corpus.begin(),
                                corpus.begin() + std::min<int64_t>(n, corpus.size()));
  }
  // Creates a pool of `ids` with the bench's codec: false after printing why
  // not.
  bool CreatePool(const std::vector<int32_t> &ids, std::string *id, polykv_pool_info *out) const {
    polykv_create_options co;
    polykv_create_options_init(&co);
    co.model = o.model_path.c_str();
    co.token_ids = ids.data();
    co.token_count = ids.size();
    co.codec = o.codec.c_str();
    polykv_pool_info info = polykv_pool_info_init();
    if (polykv_create_pool(c, &co, nullptr, nullptr, &info, nullptr) != POLYKV_OK) {
      std::fprintf(stderr, "error: create pool: %s\n", polykv_last_error());
      return false;
    }
    *id = info.id;
    if (out != nullptr) *out = info;
    return true;
  }
  // Agent i's question (two alternate), or fixed ids without a tokenizer.
  std::vector<int32_t> PromptFor(int i) const {
    if (tok != nullptr) {
      auto p = agent->EncodePrompt(client::ChatQuestionPrompt(
          i % 2 ? "What is this text about?" : "Summarize the text in one sentence."));
      if (p.ok()) return *p;
    }
    return {static_cast<int32_t>(10 + i), 20, 30, 40};
  }
};

// One way the agent processes of section (1) read the pool.
struct Setup {
  const char *name;
  std::vector<std::string> flags;
  const std::vector<int> *counts;
};

// Starts n `polykv-cli agent` processes on `pool` that hold while `hold`
// exists; false when one did not start.
bool StartAgents(const Bench &b, const Setup &su, const std::string &pool,
                 const std::string &prompt_ids, const std::string &hold,
                 std::vector<polykv::support::Process> &agents) {
  const DaemonGuard &d = b.d;
  bool failed = false;
  for (size_t i = 0; i < agents.size(); ++i) {
    std::vector<std::string> argv = {b.cli_bin,
                                     "agent",
                                     "--pool",
                                     pool,
                                     "--model",
                                     b.o.model_path,
                                     "--prompt-ids",
                                     prompt_ids,
                                     "--max-new-tokens",
                                     std::to_string(b.o.new_tokens),
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
      std::fprintf(stderr, "agent %zu: %s\n", i, s.ToString().c_str());
      failed = true;
    }
  }
  return !failed;
}

// Waits until every agent answered and holds: false when one died.
bool WaitUntilHolding(const std::string &dir, std::vector<polykv::support::Process> &agents) {
  const int n = static_cast<int>(agents.size());
  for (;;) {
    int holding = 0;
    bool failed = false;
    for (int i = 0; i < n; ++i) {
      if (polykv::support::FileContains(dir + "/a" + std::to_string(i) + ".err", "holding"))
        ++holding;
      if (agents[i].running() && agents[i].Wait(0)) {
        std::fprintf(stderr, "agent %d exited early:\n%s\n", i, agents[i].err().c_str());
        failed = true;
      }
    }
    if (failed) return false;
    if (holding == n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// Section (1), one row: n agents of set-up `su` alive at once on `pool`.
// `reference_answer` is the set-up's first agent's greedy answer (set by the
// first row).
void MeasureAgents(const Bench &b, const Setup &su, int n, const std::string &pool,
                   const polykv_pool_info &info, const std::string &prompt_ids,
                   double weights_bytes, std::vector<int32_t> &reference_answer) {
  const std::string &dir = b.d.dir;
  const std::string hold = dir + "/hold";
  std::ofstream(hold).put('1');
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double before = MemAvailable();
  std::vector<polykv::support::Process> agents(n);
  bool failed = !StartAgents(b, su, pool, prompt_ids, hold, agents);
  if (!failed) failed = !WaitUntilHolding(dir, agents);
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
      json j = json::parse(ReadFile(dir + "/a" + std::to_string(i) + ".out"));
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
    return;
  }
  const double drop = before - during, per = drop / n;
  // The model file's pages are in the page cache once for the whole host.
  const double system = info.total_bytes + weights_bytes + drop;
  std::printf("%-26s %6d %14s %12s %12s %12s %12s %18s %9d/%d\n", su.name, n, MiB(drop).c_str(),
              MiB(per).c_str(), MiB(pss / n).c_str(), MiB(priv / n).c_str(), MiB(priv_max).c_str(),
              MiB(system).c_str(), same, n);
  std::fflush(stdout);
}

// The paper's table: the pool vs N private bf16 caches of a `tokens`-token
// document.
void PrintPaperTable(size_t tokens, const polykv_pool_info &info) {
  std::printf(
      "\npaper's table (pool vs N private bf16 caches of the %zu-token "
      "document):\n",
      tokens);
  std::printf("%6s %12s %16s %10s\n", "agents", "pool MiB", "N x bf16 MiB", "ratio");
  for (int n : {1, 3, 10, 15, 64}) {
    std::printf("%6d %12s %16s %9.2fx\n", n, MiB(info.total_bytes).c_str(),
                MiB(static_cast<double>(info.bf16_bytes) * n).c_str(),
                static_cast<double>(info.bf16_bytes) * n / info.total_bytes);
  }
}

// ---- (1) memory with N agents alive at once ---- main's exit code on failure,
// else -1.
int RunMemory(const Bench &b) {
  const Options &o = b.o;
  const int64_t doc_n = b.article.empty() ? std::min<int64_t>(1451, b.max_pos - 64)
                                          : static_cast<int64_t>(b.article.size());
  const std::vector<int32_t> doc = b.Document(doc_n);
  std::string pool;
  polykv_pool_info info = polykv_pool_info_init();
  if (!b.CreatePool(doc, &pool, &info)) return 1;
  const double weights_bytes =
      static_cast<double>(fs::is_directory(o.model_path) ? 0 : fs::file_size(o.model_path));
  std::printf(
      "\n(1) memory: %zu-token document, pool %s MiB, %d new tokens "
      "per agent; every "
      "agent alive at once, attached, after answering\n",
      doc.size(), MiB(info.total_bytes).c_str(), o.new_tokens);
  std::printf("%-26s %6s %14s %12s %12s %12s %12s %18s %11s\n", "set-up", "agents", "MemAvail drop",
              "per agent", "agent PSS", "agent priv.", "max priv.", "system (pool + w +",
              "same answer");
  std::printf("%-26s %6s %14s %12s %12s %12s %12s %18s %11s\n", "", "", "MiB", "MiB", "MiB", "MiB",
              "MiB", "N x agent) MiB", "as the first");
  const Setup setups[] = {
      {"mapped + decompressed", {"--attend", "decompressed"}, &o.decompressed_counts},
      {"mapped + in place", {"--attend", "in-place"}, &o.inplace_counts},
  };
  const std::vector<int32_t> prompt = b.PromptFor(0);
  std::string prompt_ids;
  for (size_t k = 0; k < prompt.size(); ++k)
    prompt_ids += (k ? "," : "") + std::to_string(prompt[k]);
  for (const Setup &su : setups) {
    std::vector<int32_t> reference_answer;  // the set-up's first agent's greedy answer
    for (int n : *su.counts)
      MeasureAgents(b, su, n, pool, info, prompt_ids, weights_bytes, reference_answer);
  }
  std::printf(
      "MemAvail drop = MemAvailable before the agents start - while "
      "all N hold (mean of "
      "3 samples); agent PSS / private from each agent's smaps_rollup "
      "after its answer.\n"
      "system = pool + model file (mapped set-ups: its pages are in "
      "the page cache "
      "once for the host) + the measured drop.\n");
  PrintPaperTable(doc.size(), info);
  polykv_evict(b.c, pool.c_str(), 1);
  return -1;
}

// ---- (2) TTFT via the pool vs re-prefill ---- main's exit code on failure,
// else -1.
int RunTtft(const Bench &b) {
  model::SamplingOptions s;
  s.max_new_tokens = b.o.new_tokens;
  std::printf(
      "\n(2) time to first token, 1 thread: via the pool vs prefilling "
      "the document itself\n");
  std::printf("%8s %10s %12s %12s %14s %14s %10s %9s\n", "doc tok", "attach ms", "TTFT place",
              "TTFT decomp", "prefill ms", "TTFT prefill", "prefill /", "greedy");
  std::printf("%8s %10s %12s %12s %14s %14s %10s %9s\n", "", "", "ms", "ms", "", "ms", "place", "");
  for (int64_t n : b.o.doc_sizes) {
    if (b.max_pos > 0 && n + 64 > b.max_pos) {
      std::printf("%8lld skipped: model context is %lld\n", (long long)n, (long long)b.max_pos);
      continue;
    }
    const std::vector<int32_t> doc = b.Document(n);
    if (static_cast<int64_t>(doc.size()) < n) continue;
    std::string pool;
    if (!b.CreatePool(doc, &pool, nullptr)) return 1;
    std::vector<int32_t> prompt = b.PromptFor(0);
    auto r = b.agent->Run(pool, prompt, s);
    auto rd = b.decomp->Run(pool, prompt, s);
    auto base = b.agent->RunBaseline(doc, prompt, s);
    if (!r.ok() || !rd.ok() || !base.ok()) {
      std::fprintf(stderr, "error: %s\n",
                   (!r.ok()    ? r.status()
                    : !rd.ok() ? rd.status()
                               : base.status())
                       .ToString()
                       .c_str());
      return 1;
    }
    std::printf("%8lld %10.1f %12.1f %12.1f %14.1f %14.1f %9.1fx %9s\n", (long long)n,
                r->stats.attach_ms, r->stats.ttft_ms, rd->stats.ttft_ms, base->prefill_ms,
                base->ttft_ms, base->ttft_ms / r->stats.ttft_ms,
                r->answer_ids == base->answer_ids ? "same" : "differs");
    std::fflush(stdout);
    polykv_evict(b.c, pool.c_str(), 1);
  }
  std::printf(
      "TTFT in place = attach + prompt forward + first token; "
      "decompressed adds decoding "
      "every layer; prefill = document forward (chunks of 512) + "
      "prompt + first token.\n"
      "greedy: in-place answer vs the re-prefill answer (codec %s).\n",
      b.o.codec.c_str());
  return -1;
}

// Decode rate after the first token (the prompt forward excluded), tokens/s.
double DecodeRate(const client::AgentStats &st) {
  const double ms = st.generation_ms - st.prompt_first_token_ms;
  return st.new_tokens > 1 && ms > 0 ? (st.new_tokens - 1) * 1000.0 / ms : 0.0;
}

// ---- (3) decode speed, in place vs decompressed ---- main's exit code on
// failure, else -1.
int RunDecode(const Bench &b) {
  const int decode_tokens = b.o.decode_tokens;
  std::printf(
      "\n(3) decode tokens/s after the prompt (%d tokens, greedy, EOS "
      "ignored)\n",
      decode_tokens);
  std::printf("%8s %8s %14s %14s %8s %16s\n", "prefix", "threads", "in place", "decompressed",
              "ratio", "prefix MiB/token");
  model::SamplingOptions ds;
  ds.max_new_tokens = decode_tokens;
  ds.stop_at_eos = false;
  for (int64_t n : {int64_t{1451}, int64_t{4096}}) {
    if (b.max_pos > 0 && n + decode_tokens + 64 > b.max_pos) continue;
    const std::vector<int32_t> doc = b.Document(n);
    std::string pool;
    if (!b.CreatePool(doc, &pool, nullptr)) return 1;
    for (int threads : {1, 2}) {
      model::SetComputeThreads(threads);
      auto r = b.agent->Run(pool, b.PromptFor(1), ds);
      auto rd = b.decomp->Run(pool, b.PromptFor(1), ds);
      if (!r.ok() || !rd.ok()) {
        std::fprintf(stderr, "error: %s\n",
                     (!r.ok() ? r.status() : rd.status()).ToString().c_str());
        return 1;
      }
      std::printf("%8zu %8d %14.1f %14.1f %7.2fx %16.2f\n", doc.size(), threads,
                  DecodeRate(r->stats), DecodeRate(rd->stats),
                  DecodeRate(r->stats) / DecodeRate(rd->stats),
                  r->stats.prefix_bytes_per_token / 1048576.0);
      std::fflush(stdout);
    }
    model::SetComputeThreads(1);
    polykv_evict(b.c, pool.c_str(), 1);
  }
  return -1;
}

}  // namespace

int main(int argc, char **argv) {
  Options o;
  if (int rc = ParseOptions(argc, argv, &o); rc >= 0) return rc;
  const std::string daemon_bin = ExeDir() + "/../daemon/polykvd";
  const std::string cli_bin = ExeDir() + "/../cli/polykv-cli";
  if (!fs::exists(daemon_bin) || !fs::exists(cli_bin)) {
    std::fprintf(stderr, "error: needs %s and %s (build polykvd and polykv-cli)\n",
                 daemon_bin.c_str(), cli_bin.c_str());
    return 1;
  }
  DaemonGuard d;
  polykv_client *c = StartDaemon(daemon_bin, d);
  if (c == nullptr) return 1;

  // In-process agents (one per way of reading the pool): tokenize, TTFT and
  // decode tables.
  client::AgentOptions ao;
  ao.model_path = o.model_path;
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
  Bench b{o, cli_bin, d, c, inplace_or->get(), decomp_or->get(), nullptr, 0, {}, {}};
  b.tok = b.agent->model().tokenizer();
  b.max_pos = b.agent->model().config().max_positions;
  b.LoadDocuments();
  std::printf("bench_agents: model %s, codec %s, %u cores\n", o.model_path.c_str(), o.codec.c_str(),
              std::thread::hardware_concurrency());

  if (!o.skip_memory) {
    if (int rc = RunMemory(b); rc >= 0) return rc;
  }
  if (!o.skip_ttft) {
    if (int rc = RunTtft(b); rc >= 0) return rc;
  }
  if (!o.skip_decode) {
    if (int rc = RunDecode(b); rc >= 0) return rc;
  }
  polykv_disconnect(c);
  return 0;
}
