// Multi-process test harness: temp dirs and child processes (tests/support: posix_spawn,
// output to files, bounded waits), a polykvd process guard that always cleans up (SIGTERM, then
// SIGKILL, then removes its socket and any named segment an older daemon would have left), and
// helpers over the C client API and the raw control protocol.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "polykv/client.h"
#include "polykv/ipc/pool_layout.h"
#include "polykv/ipc/protocol.h"
#include "polykv/ipc/sealed_region.h"
#include "polykv/model/llama.h"
#include "support/files.h"
#include "support/leaks.h"
#include "support/process.h"
#include "unit/daemon/test_util.h"

namespace polykv::testing {

namespace fs = std::filesystem;

inline std::string BinaryDir() { return POLYKV_BINARY_DIR; }
inline std::string SourceDir() { return POLYKV_SOURCE_DIR; }
inline std::string DaemonPath() { return BinaryDir() + "/daemon/polykvd"; }
inline std::string CliPath() { return BinaryDir() + "/cli/polykv-cli"; }
inline std::string StoriesPath() {
  return std::string(POLYKV_TEST_DATA_DIR) + "/models/stories260K";
}
/// SmolLM2 GGUF from $POLYKV_SMOLLM2_GGUF, or "" when unset/missing.
inline std::string SmolLM2Path() {
  const char* p = std::getenv("POLYKV_SMOLLM2_GGUF");
  if (p == nullptr || !fs::exists(p)) return "";
  return p;
}

using support::Process;
using support::ReadFile;
/// The result of RunProcess: exit_code (128 + signal when killed; -1 when it did not start),
/// out, err, timed_out.
using ProcessResult = support::RunResult;

/// A private temp directory /tmp/polykv-itest-XXXXXX, removed recursively on destruction.
class TempDir : public support::TempDir {
 public:
  TempDir() : support::TempDir("polykv-itest-") {}
};

/// Runs a command to completion (killed after `timeout_ms`), output captured through files
/// in `dir`.
inline ProcessResult RunProcess(const std::vector<std::string>& argv, const std::string& dir,
                                int timeout_ms = 300000) {
  return support::RunProcess(argv, dir, timeout_ms);
}

/// The shm name prefix this test process gives its daemons (--shm-prefix): unique per
/// process, so tests running in parallel (ctest -j) never share or remove each other's pools
/// (identical documents give identical pool ids).
inline const std::string& ShmPrefix() {
  static const std::string prefix = "/polykv-it" + std::to_string(getpid()) + "-";
  return prefix;
}

/// A fresh --shm-prefix for each daemon this process starts (ShmPrefix() + a count), so the
/// pool memfds of one daemon ("memfd:<prefix><id16>") are told apart from another's.
inline std::string NextDaemonPrefix() {
  static int count = 0;
  return ShmPrefix() + std::to_string(++count) + "-";
}

/// The pool memfds with `prefix` that any process (a daemon, an agent) still holds as a
/// descriptor or a mapping, after up to `timeout_ms` for them to go; "none" when there are
/// none. The leak check of every integration test (Daemon::Stop runs it).
inline std::string PoolMemoryLeft(const std::string& prefix, int timeout_ms = 10000) {
  return support::DescribeMemfdUses(support::MemfdUsesSettled(prefix, timeout_ms));
}

/// Checksum64 over a whole host pool (header included), read through the same sealed
/// memfd agents map (ATTACH, descriptor socket, DETACH); 0 when it cannot be read.
inline uint64_t PoolDigest(const std::string& endpoint, const std::string& pool_id) {
  daemon::testing::RawClient c(endpoint);
  auto a = c.Attach(pool_id, 5000);
  if (!a.ok() || !a->ok || !a->memory) return 0;
  uint64_t digest = 0;
  auto region = daemon::testing::MapPool(a->memory->fd_socket, a->lease_id);
  if (region.ok()) digest = ipc::Checksum64(region->data(), region->size());
  (void)c.Detach(a->lease_id, 5000);
  return digest;
}

/// polykvd as a child process on a private endpoint; always cleaned up.
class Daemon {
 public:
  /// Starts polykvd (host backend) and waits until it answers PING. `prefix` runs it under
  /// another command (e.g. {"/usr/sbin/ip", "netns", "exec", NAME}, which execs polykvd).
  explicit Daemon(int lease_seconds = 30, std::vector<std::string> extra = {},
                  std::vector<std::string> prefix = {}) {
    endpoint_ = "ipc://" + dir_.path() + "/control.sock";
    shm_prefix_ = NextDaemonPrefix();
    std::vector<std::string> argv = std::move(prefix);
    for (const std::string& a :
         {DaemonPath(), std::string("--endpoint"), endpoint_, std::string("--backend"),
          std::string("host"), std::string("--lease-seconds"), std::to_string(lease_seconds),
          std::string("--threads"), std::string("1"), std::string("--log-level"),
          std::string("warn"), std::string("--shm-prefix"), shm_prefix_}) {
      argv.push_back(a);
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    if (!proc_.Start(argv, dir_.path() + "/polykvd.out", dir_.path() + "/polykvd.err").ok()) return;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline && proc_.running()) {
      polykv_client* c = nullptr;
      if (polykv_connect(endpoint_.c_str(), 500, &c) == POLYKV_OK) {
        polykv_disconnect(c);
        ready_ = true;
        return;
      }
      if (proc_.Wait(100)) break;
    }
  }
  ~Daemon() { Stop(); }

  /// SIGTERM (then SIGKILL after 10 s), then the leak check: once the daemon has ended (and
  /// the agents the test ran), no process may hold or map one of its pools' memfds (a test
  /// failure names who does). Returns the exit code (or -1 when it had to be killed).
  int Stop() {
    const bool was_running = proc_.running();
    const int code = proc_.Stop(10000);
    if (was_running && ready_) {
      EXPECT_EQ(PoolMemoryLeft(shm_prefix_), "none")
          << "pool memory of the stopped polykvd at " << endpoint_ << " is still held";
    }
    return code;
  }
  /// The daemon's --shm-prefix (its pools' memfds are "memfd:<prefix without '/'><id16>").
  const std::string& shm_prefix() const { return shm_prefix_; }
  bool ready() const { return ready_; }
  const std::string& endpoint() const { return endpoint_; }
  const std::string& dir() const { return dir_.path(); }
  std::string log() const { return proc_.err() + proc_.out(); }
  Process& process() { return proc_; }

  /// Creates a pool from token ids (or document text when `ids` is empty).
  /// Returns the pool id, or "" with `error` set.
  std::string CreatePool(const std::string& model, const std::vector<int32_t>& ids,
                         const std::string& codec, std::string* error,
                         const std::string& document = "", bool add_bos = true,
                         const std::string& parent = "") {
    polykv_client* c = nullptr;
    if (polykv_connect(endpoint_.c_str(), 5000, &c) != POLYKV_OK) {
      if (error) *error = std::string("connect: ") + polykv_last_error();
      return "";
    }
    polykv_create_options o;
    polykv_create_options_init(&o);
    o.model = model.c_str();
    if (ids.empty()) {
      o.document = document.c_str();
    } else {
      o.token_ids = ids.data();
      o.token_count = ids.size();
    }
    o.codec = codec.empty() ? nullptr : codec.c_str();
    o.add_bos = add_bos ? 1 : 0;
    o.parent = parent.empty() ? nullptr : parent.c_str();
    polykv_pool_info info = polykv_pool_info_init();
    polykv_status s = polykv_create_pool(c, &o, nullptr, nullptr, &info, nullptr);
    std::string err = polykv_last_error();
    polykv_disconnect(c);
    if (s != POLYKV_OK) {
      if (error) *error = std::string(polykv_status_string(s)) + ": " + err;
      return "";
    }
    pools_.push_back(info.id);
    return info.id;
  }

  /// Forced or polite eviction; returns the C status.
  polykv_status Evict(const std::string& id, bool force) {
    polykv_client* c = nullptr;
    polykv_status s = polykv_connect(endpoint_.c_str(), 5000, &c);
    if (s != POLYKV_OK) return s;
    s = polykv_evict(c, id.c_str(), force ? 1 : 0);
    polykv_disconnect(c);
    return s;
  }

  /// Pool info (STATS), or a default struct with id "" when unknown.
  polykv_pool_info Info(const std::string& id) {
    polykv_pool_info info = polykv_pool_info_init();
    polykv_client* c = nullptr;
    if (polykv_connect(endpoint_.c_str(), 5000, &c) != POLYKV_OK) return info;
    if (polykv_pool_info_by_id(c, id.c_str(), &info) != POLYKV_OK) info.id[0] = '\0';
    polykv_disconnect(c);
    return info;
  }

 private:
  TempDir dir_;
  std::string endpoint_, shm_prefix_;
  Process proc_;
  bool ready_ = false;
  std::vector<std::string> pools_;
};

/// A fixture with one polykvd (host backend, `lease_seconds`) per test in daemon_: skipped
/// when polykvd or polykv-cli is not built; BeforeDaemon (the test's own requirements) runs
/// before the start; the daemon must exit 0 on SIGTERM at TearDown.
class DaemonTest : public ::testing::Test {
 public:
  explicit DaemonTest(int lease_seconds) : lease_seconds_(lease_seconds) {}
  void SetUp() override {
    if (!fs::exists(DaemonPath()) || !fs::exists(CliPath())) {
      GTEST_SKIP() << "polykvd or polykv-cli not built";
    }
    BeforeDaemon();
    if (HasFatalFailure() || IsSkipped()) return;
    daemon_ = std::make_unique<Daemon>(lease_seconds_);
    ASSERT_TRUE(daemon_->ready()) << "polykvd did not start:\n" << daemon_->log();
  }
  void TearDown() override {
    if (daemon_) {
      EXPECT_EQ(daemon_->Stop(), 0) << "polykvd did not exit cleanly on SIGTERM:\n"
                                    << daemon_->log();
    }
  }
  /// The test's requirements, checked before the daemon starts (a fatal failure or a skip
  /// stops SetUp there).
  virtual void BeforeDaemon() {}

  std::unique_ptr<Daemon> daemon_;  ///< public: the tests' free helpers use it

 private:
  int lease_seconds_;
};

/// `n` tokens sampled from `m` after BOS (id 1; temperature 1, top-p 1, seeded): stories260K
/// text as the model writes it, for documents and prompts that look like real input.
inline std::vector<int32_t> SampleTokens(model::LlamaModel& m, uint64_t seed, int n) {
  model::KvCache cache = m.NewCache(n + 2);
  model::SamplingOptions s;
  s.greedy = false;
  s.temperature = 1.0f;
  s.top_p = 1.0f;
  s.seed = seed;
  s.max_new_tokens = n;
  s.stop_at_eos = false;
  std::vector<int32_t> bos = {1};
  auto r = m.Generate(cache, bos, s);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->tokens : std::vector<int32_t>{};
}

/// The single-process reference of an agent's answer: `doc` prefilled (`chunk` tokens per
/// forward), held as the read-only prefix of the cache (as an agent holds the pool: the same
/// split attention, so codec none is bit-exact), then up to `new_tokens` greedy tokens after
/// `prompt`; {} (and a test failure) on an error.
inline std::vector<int32_t> PrefixReference(model::LlamaModel& m, const std::vector<int32_t>& doc,
                                            const std::vector<int32_t>& prompt, int new_tokens,
                                            bool stop_at_eos, size_t chunk) {
  model::KvCache cache = m.NewCache(doc.size());
  for (size_t off = 0; off < doc.size(); off += chunk) {
    const size_t len = std::min(chunk, doc.size() - off);
    auto r = m.Forward(absl::MakeConstSpan(doc).subspan(off, len), cache, false);
    EXPECT_TRUE(r.ok()) << r.status();
  }
  auto frozen = m.FreezeAsPrefix(std::move(cache), prompt.size() + new_tokens + 1);
  EXPECT_TRUE(frozen.ok()) << frozen.status();
  if (!frozen.ok()) return {};
  cache = std::move(*frozen);
  model::SamplingOptions s;
  s.max_new_tokens = new_tokens;
  s.stop_at_eos = stop_at_eos;
  auto r = m.Generate(cache, prompt, s);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->tokens : std::vector<int32_t>{};
}

/// stories260K loaded once (1 thread), a document of BOS + `doc_tokens` sampled tokens
/// (seed `doc_seed`) and `prompts` 8-token prompts (seeds prompt_seed, prompt_seed + 1, ...).
struct StoriesInputs {
  std::unique_ptr<model::LlamaModel> model;  ///< null (and a test failure) if it did not load
  std::vector<int32_t> document;
  std::vector<std::vector<int32_t>> prompts;
};

/// The StoriesInputs of these arguments, made on the first call and kept for the rest of the
/// test process (a model that did not load is kept too: null, one test failure).
inline StoriesInputs& SharedStoriesInputs(uint64_t doc_seed, int doc_tokens, uint64_t prompt_seed,
                                          int prompts) {
  static std::mutex mu;
  static auto* made = new std::map<std::tuple<uint64_t, int, uint64_t, int>, StoriesInputs>;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(doc_seed, doc_tokens, prompt_seed, prompts);
  if (auto it = made->find(key); it != made->end()) return it->second;
  StoriesInputs& st = (*made)[key];
  model::LoadOptions lo;
  lo.threads = 1;
  auto m = model::LlamaModel::Load(StoriesPath(), lo);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return st;
  st.model = std::move(*m);
  st.document = {1};
  auto body = SampleTokens(*st.model, doc_seed, doc_tokens);
  st.document.insert(st.document.end(), body.begin(), body.end());
  for (int i = 0; i < prompts; ++i)
    st.prompts.push_back(SampleTokens(*st.model, prompt_seed + i, 8));
  return st;
}

/// The JSON on the stdout of a run that must have succeeded: a test failure (with its stderr
/// and stdout) and an empty object when it did not exit 0 or printed something else.
inline nlohmann::json SucceededJson(const ProcessResult& r) {
  EXPECT_EQ(r.exit_code, 0) << r.err << r.out;
  if (r.exit_code != 0) return nlohmann::json::object();
  try {
    return nlohmann::json::parse(r.out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "output is not JSON: " << e.what() << "\n" << r.out;
    return nlohmann::json::object();
  }
}

/// The "answer_ids" of a `polykv-cli agent --json` run that must have succeeded (a test
/// failure, and {}, otherwise).
inline std::vector<int32_t> AgentAnswerIds(const ProcessResult& r) {
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (r.exit_code != 0) return {};
  try {
    return nlohmann::json::parse(r.out).at("answer_ids").get<std::vector<int32_t>>();
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what() << "\n" << r.out;
    return {};
  }
}

/// Comma-separated ids for --prompt-ids.
inline std::string JoinIds(const std::vector<int32_t>& ids) { return absl::StrJoin(ids, ","); }

/// Positions where a and b agree, over the first `n` positions (missing counts as differ).
inline int AgreeCount(const std::vector<int32_t>& a, const std::vector<int32_t>& b, int n) {
  int same = 0;
  for (int i = 0; i < n; ++i) {
    if (i < static_cast<int>(a.size()) && i < static_cast<int>(b.size()) && a[i] == b[i]) ++same;
  }
  return same;
}
/// Length of the common prefix.
inline int CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return static_cast<int>(i);
}

}  // namespace polykv::testing
