// Multi-process integration on stories260K: polykvd + `polykv-cli agent` processes.
// Codec none must reproduce the single-process run token for token; k8v3 agreement is
// measured; the pool must be unchanged by agents, survive a SIGKILLed agent, and an evicted
// pool must give a clear error.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "harness.h"
#include "polykv/agent.h"
#include "polykv/model/llama.h"

namespace polykv::testing {
namespace {

using nlohmann::json;

constexpr int kNewTokens = 64;

// Everything derived from the model, computed once per test process: a 160-token document
// and 16 prompts of 8 tokens.
StoriesInputs& GetStories() { return SharedStoriesInputs(7, 159, 100, 16); }

// The single-process reference (PrefixReference): the document prefilled in one forward,
// greedy from the prompt without stopping at EOS.
std::vector<int32_t> Reference(const std::vector<int32_t>& doc, const std::vector<int32_t>& prompt,
                               int new_tokens = kNewTokens) {
  return PrefixReference(*GetStories().model, doc, prompt, new_tokens, false, doc.size());
}

std::vector<std::string> AgentArgv(const Daemon& d, const std::string& pool,
                                   const std::vector<int32_t>& prompt,
                                   int new_tokens = kNewTokens) {
  return {CliPath(),      "agent",         "--pool",           pool,
          "--model",      StoriesPath(),   "--endpoint",       d.endpoint(),
          "--prompt-ids", JoinIds(prompt), "--max-new-tokens", std::to_string(new_tokens),
          "--ignore-eos", "--json",        "--threads",        "1"};
}

// Runs one agent process; returns its parsed JSON (fails the test on error).
json RunAgentProcess(const Daemon& d, const std::string& pool, const std::vector<int32_t>& prompt,
                     int new_tokens = kNewTokens) {
  return SucceededJson(RunProcess(AgentArgv(d, pool, prompt, new_tokens), d.dir(), 120000));
}

std::vector<int32_t> Ids(const json& j, const char* key = "answer_ids") {
  if (!j.contains(key)) return {};
  return j[key].get<std::vector<int32_t>>();
}

class AgentsStories : public DaemonTest {
 public:  // (helpers below call Create)
  AgentsStories() : DaemonTest(/*lease_seconds=*/2) {}
  void BeforeDaemon() override { ASSERT_NE(GetStories().model, nullptr); }
  std::string Create(const std::string& codec) {
    std::string err;
    std::string id = daemon_->CreatePool(StoriesPath(), GetStories().document, codec, &err);
    EXPECT_FALSE(id.empty()) << "create " << codec << ": " << err << "\n" << daemon_->log();
    return id;
  }
};

TEST_F(AgentsStories, NoneCodecAgentEqualsSingleProcessRun) {
  const std::string pool = Create("none");
  ASSERT_FALSE(pool.empty());
  const auto& st = GetStories();
  for (int i = 0; i < 2; ++i) {
    json j = RunAgentProcess(*daemon_, pool, st.prompts[i]);
    std::vector<int32_t> ref = Reference(st.document, st.prompts[i]);
    ASSERT_EQ(ref.size(), static_cast<size_t>(kNewTokens));
    EXPECT_EQ(Ids(j), ref) << "prompt " << i;
    EXPECT_EQ(j["stats"]["document_tokens"].get<int64_t>(),
              static_cast<int64_t>(st.document.size()));
    EXPECT_EQ(j["codec"].get<std::string>(), "none");
  }
}

// Relative L2 error of every layer's decoded K and V of `pool` against the raw pool `ref`.
void DecodeErrors(const Daemon& d, const std::string& pool, const std::string& ref, double* k_err,
                  double* v_err) {
  polykv_client* c = nullptr;
  ASSERT_EQ(polykv_connect(d.endpoint().c_str(), 5000, &c), POLYKV_OK);
  polykv_pool *p = nullptr, *r = nullptr;
  ASSERT_EQ(polykv_attach(c, pool.c_str(), &p), POLYKV_OK) << polykv_last_error();
  ASSERT_EQ(polykv_attach(c, ref.c_str(), &r), POLYKV_OK) << polykv_last_error();
  polykv_pool_info info = polykv_pool_info_init();
  ASSERT_EQ(polykv_pool_get_info(p, &info), POLYKV_OK);
  const size_t n = polykv_pool_layer_elements(p);
  std::vector<float> k(n), v(n), rk(n), rv(n);
  double dk = 0, nk = 0, dv = 0, nv = 0;
  for (uint32_t l = 0; l < info.layers; ++l) {
    ASSERT_EQ(polykv_decode_layer(p, l, k.data(), v.data(), POLYKV_DTYPE_F32), POLYKV_OK);
    ASSERT_EQ(polykv_decode_layer(r, l, rk.data(), rv.data(), POLYKV_DTYPE_F32), POLYKV_OK);
    for (size_t i = 0; i < n; ++i) {
      dk += (k[i] - rk[i]) * (k[i] - rk[i]);
      nk += rk[i] * rk[i];
      dv += (v[i] - rv[i]) * (v[i] - rv[i]);
      nv += rv[i] * rv[i];
    }
  }
  *k_err = std::sqrt(dk / nk);
  *v_err = std::sqrt(dv / nv);
  polykv_detach(p);
  polykv_detach(r);
  polykv_disconnect(c);
}

TEST_F(AgentsStories, K8V3GreedyAgreementOver64Tokens) {
  const std::string pool = Create("k8v3");
  ASSERT_FALSE(pool.empty());
  const std::string raw = Create("none");
  ASSERT_FALSE(raw.empty());
  const auto& st = GetStories();
  double k_err = 0, v_err = 0;
  DecodeErrors(*daemon_, pool, raw, &k_err, &v_err);
  std::printf("k8v3 pool vs raw pool: relative L2 error K %.4f, V %.4f\n", k_err, v_err);
  // int8 keys: |err| <= scale/2 per element; 3-bit TurboQuant-MSE on 8-dim vectors: the
  // Lloyd-Max MSE of N(0,1) at 3 bits is 0.0345, i.e. ~0.19 relative L2 (0.3 allows for
  // the small block).
  EXPECT_LT(k_err, 0.02);
  EXPECT_LT(v_err, 0.30);
  int agree = 0, prefix = 0;
  const int kPrompts = 4;
  for (int i = 0; i < kPrompts; ++i) {
    json j = RunAgentProcess(*daemon_, pool, st.prompts[i]);
    std::vector<int32_t> ref = Reference(st.document, st.prompts[i]);
    int a = AgreeCount(Ids(j), ref, kNewTokens);
    int p = CommonPrefix(Ids(j), ref);
    std::printf("k8v3 vs full precision, prompt %d: %d/%d positions agree, common prefix %d\n", i,
                a, kNewTokens, p);
    agree += a;
    prefix += p;
  }
  const double rate = static_cast<double>(agree) / (kPrompts * kNewTokens);
  std::printf("k8v3 greedy agreement over %d x %d tokens: %.3f (mean common prefix %.1f)\n",
              kPrompts, kNewTokens, rate, static_cast<double>(prefix) / kPrompts);
  // Floor, measured first: stories260K (260K parameters, head_dim 8) has nearly flat
  // next-token distributions, and with 8-dim vectors 3-bit values keep ~17% relative error
  // (asserted above: the codec itself works as specified), so greedy paths diverge at once;
  // measured 0.02 agreement (5/256), mean common prefix 0.5. The floor is therefore only
  // "above chance" (1/512 per position): at least 2 of 256 positions. The meaningful
  // agreement floor is asserted on SmolLM2 (agents_smollm2_test).
  EXPECT_GE(agree, 2);
}

TEST_F(AgentsStories, PoolUnchangedByAgentsAndLateAgentMatchesFirst) {
  const std::string pool = Create("k8v3");
  ASSERT_FALSE(pool.empty());
  const auto& st = GetStories();
  const uint64_t digest_before = PoolDigest(daemon_->endpoint(), pool);
  ASSERT_NE(digest_before, 0u) << "cannot map pool " << pool;
  polykv_client* c = nullptr;
  ASSERT_EQ(polykv_connect(daemon_->endpoint().c_str(), 5000, &c), POLYKV_OK);
  polykv_pool* p = nullptr;
  ASSERT_EQ(polykv_attach(c, pool.c_str(), &p), POLYKV_OK) << polykv_last_error();
  EXPECT_EQ(polykv_pool_verify(p), POLYKV_OK) << polykv_last_error();

  json first = RunAgentProcess(*daemon_, pool, st.prompts[0]);
  // 10 other agents with other prompts, run by the launcher (2 at a time).
  TempDir qdir;
  {
    std::ofstream q(qdir.path() + "/prompts.txt");
    for (int i = 1; i <= 10; ++i) q << JoinIds(st.prompts[i % st.prompts.size()]) << "\n";
  }
  ProcessResult r = RunProcess({CliPath(),
                                "agents",
                                "run",
                                "--pool",
                                pool,
                                "--model",
                                StoriesPath(),
                                "--endpoint",
                                daemon_->endpoint(),
                                "--questions",
                                qdir.path() + "/prompts.txt",
                                "--ids",
                                "-n",
                                "10",
                                "-j",
                                "2",
                                "--max-new-tokens",
                                "16",
                                "--no-baseline",
                                "--json"},
                               daemon_->dir(), 300000);
  EXPECT_EQ(r.exit_code, 0) << r.err << r.out;
  json late = RunAgentProcess(*daemon_, pool, st.prompts[0]);
  EXPECT_EQ(Ids(late), Ids(first));
  EXPECT_EQ(Ids(first).size(), static_cast<size_t>(kNewTokens));

  EXPECT_EQ(polykv_pool_verify(p), POLYKV_OK) << polykv_last_error();
  EXPECT_EQ(PoolDigest(daemon_->endpoint(), pool), digest_before);
  polykv_detach(p);
  polykv_disconnect(c);
}

void RunManyAgents(AgentsStories* t, Daemon& d, const std::string& pool, int n) {
  const auto& st = GetStories();
  TempDir qdir;
  const int distinct = std::min<int>(n, 4);
  {
    std::ofstream q(qdir.path() + "/prompts.txt");
    for (int i = 0; i < distinct; ++i) q << JoinIds(st.prompts[i]) << "\n";
  }
  const int kTokens = 16;
  ProcessResult r = RunProcess(
      {CliPath(), "agents", "run", "--pool", pool, "--model", StoriesPath(), "--endpoint",
       d.endpoint(), "--questions", qdir.path() + "/prompts.txt", "--ids", "-n", std::to_string(n),
       "-j", "2", "--max-new-tokens", std::to_string(kTokens), "--json"},
      d.dir(), 600000);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  json out = json::parse(r.out);
  ASSERT_EQ(out["agents"].size(), static_cast<size_t>(n));
  std::vector<std::vector<int32_t>> refs;
  for (int i = 0; i < distinct; ++i) refs.push_back(Reference(st.document, st.prompts[i], kTokens));
  std::set<int64_t> pids;
  for (int i = 0; i < n; ++i) {
    const json& a = out["agents"][i];
    ASSERT_TRUE(a.contains("result")) << a.dump();
    // Codec none: every agent reproduces the single-process run (EOS may stop it early).
    std::vector<int32_t> got = Ids(a["result"]);
    const auto& ref = refs[i % distinct];
    ASSERT_LE(got.size(), ref.size());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), ref.begin())) << "agent " << i;
    EXPECT_GT(a["peak_rss_bytes"].get<uint64_t>(), 0u);
    pids.insert(a["pid"].get<int64_t>());
  }
  EXPECT_EQ(pids.size(), static_cast<size_t>(n)) << "agents must be separate processes";
  const json& s = out["summary"];
  EXPECT_EQ(s["agents_ok"].get<int>(), n);
  EXPECT_EQ(s["n_private_bf16_bytes"].get<uint64_t>(),
            s["bf16_cache_bytes_per_agent"].get<uint64_t>() * n);
  EXPECT_TRUE(s["baseline_outputs_match"].get<bool>());
  std::printf(
      "%d agents: pool %llu bytes, N x bf16 %llu bytes, mean TTFT %.1f ms, solo pool "
      "TTFT %.1f ms vs re-prefill %.1f ms\n",
      n, (unsigned long long)s["pool_bytes"].get<uint64_t>(),
      (unsigned long long)s["n_private_bf16_bytes"].get<uint64_t>(),
      s["mean_ttft_ms"].get<double>(), s["solo_pool_ttft_ms"].get<double>(),
      s["solo_prefill_ttft_ms"].get<double>());
  (void)t;
}

TEST_F(AgentsStories, OneAgent) {
  const std::string pool = Create("none");
  ASSERT_FALSE(pool.empty());
  RunManyAgents(this, *daemon_, pool, 1);
}
TEST_F(AgentsStories, FourAgents) {
  const std::string pool = Create("none");
  ASSERT_FALSE(pool.empty());
  RunManyAgents(this, *daemon_, pool, 4);
}
TEST_F(AgentsStories, SixteenAgents) {
  const std::string pool = Create("none");
  ASSERT_FALSE(pool.empty());
  RunManyAgents(this, *daemon_, pool, 16);
}

// Both ways of reading the pool: in place (the eviction lands between forward steps) and
// decompressed (between decoded layers).
void ForceEvictMidRun(AgentsStories* t, Daemon& daemon, client::Attend attend) {
  const std::string pool = t->Create("none");
  ASSERT_FALSE(pool.empty());
  const auto& st = GetStories();
  client::AgentOptions o;
  o.model_path = StoriesPath();
  o.endpoint = daemon.endpoint();
  o.threads = 1;
  o.attend = attend;
  auto agent = client::PooledAgent::Create(o);
  ASSERT_TRUE(agent.ok()) << agent.status();
  Daemon* d = &daemon;
  const auto evict = [d, &pool] {
    EXPECT_EQ(d->Evict(pool, /*force=*/true), POLYKV_OK) << polykv_last_error();
    // Give the lease renewal thread (every lease/3 = 0.67 s) time to see the eviction.
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  };
  client::AgentHooks hooks;
  hooks.after_layer_decoded = [evict](uint32_t layer) {
    if (layer == 0) evict();
  };
  hooks.after_step = [evict](int64_t step) {
    if (step == 1) evict();  // after the prompt and the first generated token
  };
  (*agent)->set_hooks(hooks);
  model::SamplingOptions s;
  s.max_new_tokens = 8;
  auto r = (*agent)->Run(pool, st.prompts[0], s);
  ASSERT_FALSE(r.ok()) << "an evicted pool must not produce an answer";
  EXPECT_TRUE(r.status().code() == absl::StatusCode::kNotFound ||
              r.status().code() == absl::StatusCode::kFailedPrecondition)
      << r.status();
  EXPECT_NE(r.status().message().find(pool.substr(0, 16)), std::string::npos) << r.status();
  std::printf("evicted mid-run: %s\n", r.status().ToString().c_str());

  // Re-create and re-attach with the same agent: works and equals the reference.
  (*agent)->set_hooks({});
  auto again = (*agent)->Run(pool, st.prompts[0], s);
  EXPECT_FALSE(again.ok());  // pool is gone
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound) << again.status();
  const std::string pool2 = t->Create("none");
  ASSERT_EQ(pool2, pool) << "pools are content-addressed";
  s.stop_at_eos = false;
  auto ok = (*agent)->Run(pool2, st.prompts[0], s);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->attend, attend);
  EXPECT_EQ(ok->answer_ids, Reference(st.document, st.prompts[0], 8));
}

TEST_F(AgentsStories, ForceEvictMidRunGivesClearErrorThenReattachWorks) {
  ForceEvictMidRun(this, *daemon_, client::Attend::kInPlace);
}

TEST_F(AgentsStories, ForceEvictMidDecompressGivesClearErrorThenReattachWorks) {
  ForceEvictMidRun(this, *daemon_, client::Attend::kDecompressed);
}

TEST_F(AgentsStories, SigkilledAgentLeavesPoolIntactAndLeaseExpires) {
  const std::string pool = Create("k8v3");
  ASSERT_FALSE(pool.empty());
  const auto& st = GetStories();
  json first = RunAgentProcess(*daemon_, pool, st.prompts[1]);
  const uint64_t digest = PoolDigest(daemon_->endpoint(), pool);
  ASSERT_NE(digest, 0u);

  Process victim;
  std::vector<std::string> argv = AgentArgv(*daemon_, pool, st.prompts[1]);
  argv.insert(argv.end(), {"--debug-pause-after-step", "1", "--debug-pause-ms", "60000"});
  ASSERT_TRUE(
      victim.Start(argv, daemon_->dir() + "/victim.out", daemon_->dir() + "/victim.err").ok());
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (victim.err().find("paused after forward step 1") == std::string::npos) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << victim.err();
    ASSERT_FALSE(victim.Wait(50)) << "agent ended early: " << victim.err();
  }
  EXPECT_GE(daemon_->Info(pool).leases, 1u);
  victim.Kill(SIGKILL);
  ASSERT_TRUE(victim.Wait(10000));

  EXPECT_EQ(PoolDigest(daemon_->endpoint(), pool), digest);
  json next = RunAgentProcess(*daemon_, pool, st.prompts[1]);
  EXPECT_EQ(Ids(next), Ids(first));
  // The dead agent's lease (2 s) expires and is swept.
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  uint32_t leases = 1;
  while (std::chrono::steady_clock::now() < deadline) {
    polykv_pool_info info = daemon_->Info(pool);
    ASSERT_STREQ(info.id, pool.c_str());
    leases = info.leases;
    if (leases == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(leases, 0u) << "the SIGKILLed agent's lease did not expire";
  // Nothing else changed: a polite evict now succeeds.
  EXPECT_EQ(daemon_->Evict(pool, false), POLYKV_OK) << polykv_last_error();
}

TEST_F(AgentsStories, ClearErrorsForUnknownPoolBadPromptAndDeadDaemon) {
  const std::string pool = Create("none");
  ASSERT_FALSE(pool.empty());
  const auto& st = GetStories();
  client::AgentOptions o;
  o.model_path = StoriesPath();
  o.endpoint = daemon_->endpoint();
  o.threads = 1;
  o.timeout_ms = 500;
  auto agent = client::PooledAgent::Create(o);
  ASSERT_TRUE(agent.ok()) << agent.status();
  model::SamplingOptions s;
  s.max_new_tokens = 4;
  const std::string unknown(64, 'a');
  auto r = (*agent)->Run(unknown, st.prompts[0], s);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  auto bad = (*agent)->Run(pool, std::vector<int32_t>{5, 100000}, s);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find("100000"), std::string::npos);
  auto text = (*agent)->RunText(pool, "hello", s);
  EXPECT_EQ(text.status().code(), absl::StatusCode::kFailedPrecondition) << text.status();

  EXPECT_EQ(daemon_->Stop(), 0);
  daemon_.reset();
  auto gone = (*agent)->Run(pool, st.prompts[0], s);
  ASSERT_FALSE(gone.ok());
  EXPECT_TRUE(gone.status().code() == absl::StatusCode::kUnavailable ||
              gone.status().code() == absl::StatusCode::kDeadlineExceeded ||
              gone.status().code() == absl::StatusCode::kNotFound)
      << gone.status();
  std::printf("daemon gone: %s\n", gone.status().ToString().c_str());
}

}  // namespace
}  // namespace polykv::testing
