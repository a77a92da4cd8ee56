// Multi-process integration on SmolLM2-135M-Instruct (env POLYKV_SMOLLM2_GGUF): polykvd
// prefills the chat-framed demo article; `polykv-cli agent` processes answer questions.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness.h"
#include "polykv/agent.h"
#include "polykv/model/llama.h"

namespace polykv::testing {
namespace {

using nlohmann::json;

const char* kQuestions[] = {"Who is Robert Boulter?", "Which theatre staged Herons in 2001?",
                            "Who wrote the play Herons?", "Who directed Mercury Fur?"};

std::string Document() {
  return client::ChatDocument(ReadFile(SourceDir() + "/data/wikitext-2/robert_boulter.txt"));
}

model::LlamaModel* Model() {
  static std::unique_ptr<model::LlamaModel> m = [] {
    model::LoadOptions lo;
    lo.threads = 1;
    auto r = model::LlamaModel::Load(SmolLM2Path(), lo);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? std::move(*r) : nullptr;
  }();
  return m.get();
}

std::vector<int32_t> PoolIds(const Daemon& d, const std::string& pool) {
  polykv_client* c = nullptr;
  std::vector<int32_t> ids;
  if (polykv_connect(d.endpoint().c_str(), 5000, &c) != POLYKV_OK) return ids;
  polykv_pool* p = nullptr;
  if (polykv_attach(c, pool.c_str(), &p) == POLYKV_OK) {
    polykv_pool_info info = polykv_pool_info_init();
    polykv_pool_get_info(p, &info);
    ids.resize(info.tokens);
    polykv_pool_token_ids(p, ids.data(), ids.size());
    polykv_detach(p);
  }
  polykv_disconnect(c);
  return ids;
}

// The single-process reference (PrefixReference), the document prefilled 512 tokens at a time.
std::vector<int32_t> Reference(const std::vector<int32_t>& doc, const std::vector<int32_t>& prompt,
                               int new_tokens, bool stop_at_eos) {
  return PrefixReference(*Model(), doc, prompt, new_tokens, stop_at_eos, 512);
}

std::vector<int32_t> Ids(const json& j, const char* key = "answer_ids") {
  if (!j.contains(key)) return {};
  return j[key].get<std::vector<int32_t>>();
}

class AgentsSmolLM2 : public DaemonTest {
 protected:
  AgentsSmolLM2() : DaemonTest(/*lease_seconds=*/10) {}
  void BeforeDaemon() override {
    if (SmolLM2Path().empty()) {
      GTEST_SKIP() << "POLYKV_SMOLLM2_GGUF is not set (run scripts/fetch-model.sh and export "
                      "POLYKV_SMOLLM2_GGUF=<path>.gguf)";
    }
  }
  std::string Create(const std::string& codec) {
    std::string err;
    std::string id = daemon_->CreatePool(SmolLM2Path(), {}, codec, &err, Document(),
                                         /*add_bos=*/false);
    EXPECT_FALSE(id.empty()) << "create " << codec << ": " << err << "\n" << daemon_->log();
    return id;
  }
  json Agent(const std::string& pool, const std::string& question, int new_tokens,
             bool ignore_eos) {
    std::vector<std::string> argv = {CliPath(),
                                     "agent",
                                     "--pool",
                                     pool,
                                     "--model",
                                     SmolLM2Path(),
                                     "--endpoint",
                                     daemon_->endpoint(),
                                     "--prompt",
                                     question,
                                     "--chat",
                                     "--max-new-tokens",
                                     std::to_string(new_tokens),
                                     "--json",
                                     "--threads",
                                     "1"};
    if (ignore_eos) argv.push_back("--ignore-eos");
    return SucceededJson(RunProcess(argv, daemon_->dir(), 300000));
  }
};

TEST_F(AgentsSmolLM2, NoneCodecAgentEqualsSingleProcessRun) {
  const std::string pool = Create("none");
  ASSERT_FALSE(pool.empty());
  const std::vector<int32_t> doc = PoolIds(*daemon_, pool);
  ASSERT_GT(doc.size(), 500u);
  ASSERT_NE(Model(), nullptr);
  for (int q = 0; q < 2; ++q) {
    json j = Agent(pool, kQuestions[q], 32, false);
    std::printf("Q: %s\nA: %s\n", kQuestions[q], j.value("answer", std::string()).c_str());
    std::vector<int32_t> ref = Reference(doc, Ids(j, "prompt_ids"), 32, true);
    EXPECT_EQ(Ids(j), ref) << kQuestions[q];
    EXPECT_FALSE(Ids(j).empty());
    // The agent says where its products read the weights: the packed file this process's
    // model maps too (same user, same folder), or the blocks and why.
    EXPECT_EQ(j.value("weights_layout", std::string("(missing)")), Model()->weights_layout());
  }
}

TEST_F(AgentsSmolLM2, ChildOfNonePoolEqualsOnePoolOfTheConcatenatedText) {
  // A pool tree on real text: the article (system turn) as the parent, an agent's task
  // prefix (a second system turn) as a child pool. The concatenated text splits at the
  // special token <|im_start|>, so the child chain holds exactly the whole pool's tokens, and
  // codec none gives the same greedy answers.
  const std::string task =
      "<|im_start|>system\nYou are a careful assistant: answer in one short sentence.<|im_end|>\n";
  std::string err;
  const std::string parent =
      daemon_->CreatePool(SmolLM2Path(), {}, "none", &err, Document(), false);
  ASSERT_FALSE(parent.empty()) << err;
  const std::string child = daemon_->CreatePool("", {}, "", &err, task, false, parent);
  ASSERT_FALSE(child.empty()) << err << daemon_->log();
  const std::string whole =
      daemon_->CreatePool(SmolLM2Path(), {}, "none", &err, Document() + task, false);
  ASSERT_FALSE(whole.empty()) << err;
  std::vector<int32_t> chain = PoolIds(*daemon_, parent);
  const std::vector<int32_t> own = PoolIds(*daemon_, child);
  chain.insert(chain.end(), own.begin(), own.end());
  EXPECT_EQ(chain, PoolIds(*daemon_, whole));
  const polykv_pool_info ci = daemon_->Info(child);
  EXPECT_EQ(ci.parent_tokens + ci.tokens, daemon_->Info(whole).tokens);
  for (int q = 0; q < 2; ++q) {
    json c = Agent(child, kQuestions[q], 32, /*ignore_eos=*/true);
    json w = Agent(whole, kQuestions[q], 32, /*ignore_eos=*/true);
    ASSERT_EQ(Ids(w).size(), 32u);
    EXPECT_EQ(Ids(c), Ids(w)) << kQuestions[q] << ": " << c["answer"] << " vs " << w["answer"];
    EXPECT_EQ(c["stats"]["document_tokens"], w["stats"]["document_tokens"]);
  }
}

TEST_F(AgentsSmolLM2, K8V3GreedyAgreementOver64Tokens) {
  const std::string pool = Create("k8v3");
  ASSERT_FALSE(pool.empty());
  const std::vector<int32_t> doc = PoolIds(*daemon_, pool);
  ASSERT_NE(Model(), nullptr);
  int agree = 0, prefix = 0;
  const int n = 2;
  for (int q = 0; q < n; ++q) {
    json j = Agent(pool, kQuestions[q], 64, true);
    std::vector<int32_t> ref = Reference(doc, Ids(j, "prompt_ids"), 64, false);
    int a = AgreeCount(Ids(j), ref, 64), p = CommonPrefix(Ids(j), ref);
    std::printf("k8v3 vs full precision, \"%s\": %d/64 agree, common prefix %d\n  k8v3: %s\n",
                kQuestions[q], a, p, j.value("answer", std::string()).c_str());
    agree += a;
    prefix += p;
  }
  const double rate = agree / (64.0 * n);
  std::printf("SmolLM2 k8v3 greedy agreement: %.3f, mean common prefix %.1f\n", rate,
              prefix / static_cast<double>(n));
  // README (Answers): 0.742 agreement, mean common prefix 36.0, measured by this test on the
  // 2-core AVX-512 development machine (2026-12-04; the same with POLYKV_ISA=avx2 and
  // scalar). Slack: one late greedy flip more than measured (about 0.04 and 4 tokens).
  EXPECT_GE(prefix / static_cast<double>(n), 32.0);
  EXPECT_GE(rate, 0.70);
}

void ManyAgents(Daemon& d, const std::string& pool, int n, bool baseline) {
  TempDir qdir;
  {
    std::ofstream q(qdir.path() + "/q.txt");
    for (const char* s : kQuestions) q << s << "\n";
  }
  std::vector<std::string> argv = {CliPath(),
                                   "agents",
                                   "run",
                                   "--pool",
                                   pool,
                                   "--model",
                                   SmolLM2Path(),
                                   "--endpoint",
                                   d.endpoint(),
                                   "--questions",
                                   qdir.path() + "/q.txt",
                                   "-n",
                                   std::to_string(n),
                                   "-j",
                                   "2",
                                   "--max-new-tokens",
                                   "8",
                                   "--json"};
  if (!baseline) argv.push_back("--no-baseline");
  ProcessResult r = RunProcess(argv, d.dir(), 1500000);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  json out = json::parse(r.out);
  ASSERT_EQ(out["agents"].size(), static_cast<size_t>(n));
  std::map<std::string, std::vector<int32_t>> by_question;
  for (const json& a : out["agents"]) {
    ASSERT_TRUE(a.contains("result")) << a.dump();
    std::vector<int32_t> ids = Ids(a["result"]);
    EXPECT_FALSE(ids.empty());
    auto [it, fresh] = by_question.emplace(a["prompt"].get<std::string>(), ids);
    if (!fresh) {
      EXPECT_EQ(ids, it->second) << "same question, different answer";
    }
  }
  const json& s = out["summary"];
  std::printf(
      "SmolLM2 %d agents: pool %.2f MiB, N x bf16 %.2f MiB (%.2fx), max RSS %.0f MiB, "
      "mean TTFT %.0f ms\n",
      n, s["pool_bytes"].get<double>() / 1048576, s["n_private_bf16_bytes"].get<double>() / 1048576,
      s["ratio_n_bf16_over_pool"].get<double>(),
      s["max_agent_peak_rss_bytes"].get<double>() / 1048576, s["mean_ttft_ms"].get<double>());
  if (baseline) {
    std::printf("  solo TTFT via pool %.0f ms vs re-prefill %.0f ms; outputs %s\n",
                s["solo_pool_ttft_ms"].get<double>(), s["solo_prefill_ttft_ms"].get<double>(),
                s["baseline_outputs_match"].get<bool>() ? "match" : "differ");
  }
}

TEST_F(AgentsSmolLM2, OneAgent) {
  const std::string pool = Create("k8v3");
  ASSERT_FALSE(pool.empty());
  ManyAgents(*daemon_, pool, 1, true);
}
TEST_F(AgentsSmolLM2, FourAgents) {
  const std::string pool = Create("k8v3");
  ASSERT_FALSE(pool.empty());
  ManyAgents(*daemon_, pool, 4, true);
}
TEST_F(AgentsSmolLM2, SixteenAgents) {
  const std::string pool = Create("k8v3");
  ASSERT_FALSE(pool.empty());
  ManyAgents(*daemon_, pool, 16, false);
}

}  // namespace
}  // namespace polykv::testing
