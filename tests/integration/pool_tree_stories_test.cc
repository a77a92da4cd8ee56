// A pool tree on stories260K: child pools hold only their own tokens' compressed KV on top of
// a parent (`pools create --parent`), prefilled attending to the parent's KV in place, and
// agents (`polykv-cli agent` processes) attend to parent + child where they lie.
//  - codec none: a chain parent -> child -> grandchild gives exactly the K/V (within float
//    rounding) and the same greedy continuation as one pool of the concatenated tokens;
//  - k8v3: the child takes the parent's codec, costs only its own tokens, and answers;
//  - a parent is not evicted while it has children (without --force, which drops the
//    subtree); `pools list` shows the tree; a restarted daemon restores a child's parent.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness.h"
#include "polykv/model/llama.h"

namespace polykv::testing {
namespace {

using nlohmann::json;

constexpr int kNewTokens = 48;

// The model, a 200-token document and 3 prompts of 8 tokens, once per test process.
StoriesInputs& GetStories() { return SharedStoriesInputs(11, 199, 200, 3); }

std::vector<int32_t> Slice(const std::vector<int32_t>& v, size_t from, size_t to) {
  return std::vector<int32_t>(v.begin() + from, v.begin() + to);
}

json RunJson(const std::vector<std::string>& argv, const std::string& dir) {
  return SucceededJson(RunProcess(argv, dir, 120000));
}

json RunAgent(const Daemon& d, const std::string& pool, const std::vector<int32_t>& prompt) {
  return RunJson({CliPath(), "agent", "--pool", pool, "--model", StoriesPath(), "--endpoint",
                  d.endpoint(), "--prompt-ids", JoinIds(prompt), "--max-new-tokens",
                  std::to_string(kNewTokens), "--ignore-eos", "--json", "--threads", "1"},
                 d.dir());
}

std::vector<int32_t> Answer(const json& j) {
  return j.contains("answer_ids") ? j["answer_ids"].get<std::vector<int32_t>>()
                                  : std::vector<int32_t>{};
}

// Decoded K and V of every layer of `pool`: [layers][kv_heads][tokens][head_dim] f32.
void DecodeAll(const Daemon& d, const std::string& pool, std::vector<float>* k,
               std::vector<float>* v, polykv_pool_info* info) {
  polykv_client* c = nullptr;
  ASSERT_EQ(polykv_connect(d.endpoint().c_str(), 5000, &c), POLYKV_OK);
  polykv_pool* p = nullptr;
  ASSERT_EQ(polykv_attach(c, pool.c_str(), &p), POLYKV_OK) << polykv_last_error();
  ASSERT_EQ(polykv_pool_get_info(p, info), POLYKV_OK);
  const size_t n = polykv_pool_layer_elements(p);
  k->resize(n * info->layers);
  v->resize(n * info->layers);
  for (uint32_t l = 0; l < info->layers; ++l) {
    ASSERT_EQ(polykv_decode_layer(p, l, k->data() + l * n, v->data() + l * n, POLYKV_DTYPE_F32),
              POLYKV_OK);
  }
  polykv_detach(p);
  polykv_disconnect(c);
}

class PoolTreeStories : public DaemonTest {
 protected:
  PoolTreeStories() : DaemonTest(/*lease_seconds=*/5) {}
  void BeforeDaemon() override { ASSERT_NE(GetStories().model, nullptr); }
  std::string Create(const std::vector<int32_t>& ids, const std::string& codec,
                     const std::string& parent = "", std::string* error = nullptr) {
    std::string err;
    std::string id = daemon_->CreatePool(StoriesPath(), ids, codec, &err, "", true, parent);
    if (error != nullptr) {
      *error = err;
    } else {
      EXPECT_FALSE(id.empty()) << "create: " << err << "\n" << daemon_->log();
    }
    return id;
  }
};

TEST_F(PoolTreeStories, NoneChainEqualsOnePoolOfTheConcatenation) {
  const auto& st = GetStories();
  const auto& doc = st.document;
  const std::string whole = Create(doc, "none");
  const std::string root = Create(Slice(doc, 0, 90), "none");
  const std::string child = Create(Slice(doc, 90, 150), "", root);
  const std::string grandchild = Create(Slice(doc, 150, 200), "", child);
  ASSERT_FALSE(whole.empty() || root.empty() || child.empty() || grandchild.empty());
  EXPECT_NE(child, Create(Slice(doc, 90, 150), "none")) << "a child's id covers its parent";

  // The tree as the daemon describes it.
  const polykv_pool_info ci = daemon_->Info(child), gi = daemon_->Info(grandchild);
  EXPECT_EQ(std::string(ci.parent), root);
  EXPECT_EQ(ci.parent_tokens, 90u);
  EXPECT_EQ(ci.tokens, 60u);
  EXPECT_EQ(std::string(ci.codec), "none");
  EXPECT_EQ(std::string(gi.parent), child);
  EXPECT_EQ(gi.parent_tokens, 150u);
  EXPECT_EQ(gi.tokens, 50u);
  EXPECT_EQ(std::string(daemon_->Info(root).parent), "");

  // The child's and grandchild's K/V are those of the whole document's pool at their
  // positions: prefilled attending to the parent chain (float rounding only).
  std::vector<float> wk, wv, k, v;
  polykv_pool_info wi = polykv_pool_info_init(), pi = polykv_pool_info_init();
  DecodeAll(*daemon_, whole, &wk, &wv, &wi);
  for (const auto& [id, from] :
       {std::pair<std::string, uint64_t>{root, 0}, {child, 90}, {grandchild, 150}}) {
    SCOPED_TRACE(id);
    DecodeAll(*daemon_, id, &k, &v, &pi);
    const uint64_t hd = wi.head_dim, T = wi.tokens, t = pi.tokens;
    double dk = 0, nk = 0, dv = 0, nv = 0;
    for (uint64_t l = 0; l < wi.layers; ++l)
      for (uint64_t h = 0; h < wi.kv_heads; ++h)
        for (uint64_t i = 0; i < t; ++i)
          for (uint64_t d = 0; d < hd; ++d) {
            const size_t a = ((l * wi.kv_heads + h) * t + i) * hd + d;
            const size_t b = ((l * wi.kv_heads + h) * T + from + i) * hd + d;
            dk += (k[a] - wk[b]) * (k[a] - wk[b]);
            nk += wk[b] * wk[b];
            dv += (v[a] - wv[b]) * (v[a] - wv[b]);
            nv += wv[b] * wv[b];
          }
    EXPECT_LT(std::sqrt(dk / nk), 1e-5);
    EXPECT_LT(std::sqrt(dv / nv), 1e-5);
  }

  // Agents of the child and of the grandchild answer as agents of the whole pool do.
  for (size_t i = 0; i < 2; ++i) {
    const json w = RunAgent(*daemon_, whole, st.prompts[i]);
    const json c = RunAgent(*daemon_, child, st.prompts[i]);
    const json g = RunAgent(*daemon_, grandchild, st.prompts[i]);
    ASSERT_EQ(Answer(w).size(), static_cast<size_t>(kNewTokens));
    // The child's context is its parent chain + its own tokens: 150 positions.
    const json cw = RunAgent(*daemon_, Create(Slice(doc, 0, 150), "none"), st.prompts[i]);
    EXPECT_EQ(Answer(c), Answer(cw)) << "prompt " << i;
    EXPECT_EQ(Answer(g), Answer(w)) << "prompt " << i;
    EXPECT_EQ(g["stats"]["document_tokens"].get<int64_t>(), 200);
    EXPECT_EQ(c["stats"]["document_tokens"].get<int64_t>(), 150);
    EXPECT_EQ(g["attend"].get<std::string>(), "in-place");
  }
}

TEST_F(PoolTreeStories, K8V3ChildTakesParentCodecAndCostsOnlyItsTokens) {
  const auto& st = GetStories();
  const auto& doc = st.document;
  const std::string root = Create(Slice(doc, 0, 120), "k8v3");
  const std::string child = Create(Slice(doc, 120, 200), "", root);
  const std::string whole = Create(doc, "k8v3");
  ASSERT_FALSE(root.empty() || child.empty() || whole.empty());
  const polykv_pool_info ri = daemon_->Info(root), ci = daemon_->Info(child),
                         wi = daemon_->Info(whole);
  EXPECT_EQ(std::string(ci.codec), "k8v3");
  EXPECT_EQ(ci.tokens, 80u);
  // Only its own 80 tokens: codes and norms split exactly between root and child (each pool
  // has its own per-tensor key scales and header).
  EXPECT_EQ(ci.key_codes_bytes + ri.key_codes_bytes, wi.key_codes_bytes);
  EXPECT_EQ(ci.value_codes_bytes + ri.value_codes_bytes, wi.value_codes_bytes);
  EXPECT_EQ(ci.value_norms_bytes + ri.value_norms_bytes, wi.value_norms_bytes);
  EXPECT_EQ(ci.key_scales_bytes, wi.key_scales_bytes);
  EXPECT_LT(ci.total_bytes, wi.total_bytes / 2);

  // Another codec than the parent's is refused, naming both.
  std::string err;
  EXPECT_TRUE(Create(Slice(doc, 120, 200), "none", root, &err).empty());
  EXPECT_NE(err.find("INVALID_ARGUMENT"), std::string::npos) << err;
  EXPECT_NE(err.find("k8v3"), std::string::npos) << err;
  // An unknown parent is NOT_FOUND.
  EXPECT_TRUE(Create(Slice(doc, 120, 200), "", std::string(64, 'a'), &err).empty());
  EXPECT_NE(err.find("NOT_FOUND"), std::string::npos) << err;
  // Parent chain + document beyond the model's context (512 for stories260K).
  EXPECT_TRUE(Create(std::vector<int32_t>(400, 5), "", root, &err).empty());
  EXPECT_NE(err.find("context"), std::string::npos) << err;

  // Agents of the child answer (64 of 64 tokens) over all 200 positions, in place.
  for (size_t i = 0; i < 2; ++i) {
    const json c = RunAgent(*daemon_, child, st.prompts[i]);
    EXPECT_EQ(Answer(c).size(), static_cast<size_t>(kNewTokens));
    EXPECT_EQ(c["stats"]["document_tokens"].get<int64_t>(), 200);
    EXPECT_EQ(c["attend"].get<std::string>(), "in-place");
    EXPECT_EQ(c["stats"]["pool_bytes"].get<uint64_t>(), ri.total_bytes + ci.total_bytes);
  }
}

TEST_F(PoolTreeStories, EvictRulesListTreeAndCli) {
  const auto& doc = GetStories().document;
  const std::string root = Create(Slice(doc, 0, 100), "k8v3");
  const std::string child = Create(Slice(doc, 100, 140), "", root);
  const std::string other = Create(Slice(doc, 0, 60), "k8v3");
  ASSERT_FALSE(root.empty() || child.empty() || other.empty());
  // `pools create --parent PREFIX` from the CLI: no --model needed, codec inherited.
  const json made =
      RunJson({CliPath(), "pools", "create", "--parent", root.substr(0, 12), "--token-ids",
               JoinIds(Slice(doc, 100, 180)), "--endpoint", daemon_->endpoint(), "--json"},
              daemon_->dir());
  ASSERT_TRUE(made.contains("id"));
  const std::string child2 = made["id"].get<std::string>();
  EXPECT_EQ(made["parent"].get<std::string>(), root);
  EXPECT_EQ(made["parent_tokens"].get<uint64_t>(), 100u);
  EXPECT_EQ(made["codec"].get<std::string>(), "k8v3");

  // `pools list` prints each child right under its parent, indented.
  ProcessResult list = RunProcess({CliPath(), "pools", "list", "--endpoint", daemon_->endpoint()},
                                  daemon_->dir(), 30000);
  ASSERT_EQ(list.exit_code, 0) << list.err;
  std::vector<std::string> lines;
  for (size_t a = 0, b; (b = list.out.find('\n', a)) != std::string::npos; a = b + 1)
    lines.push_back(list.out.substr(a, b - a));
  auto line_of = [&](const std::string& id) {
    for (size_t i = 0; i < lines.size(); ++i)
      if (lines[i].find(id) != std::string::npos) return static_cast<int>(i);
    return -1;
  };
  const int lr = line_of(root), lc = line_of(child), lc2 = line_of(child2), lo = line_of(other);
  ASSERT_GE(lr, 1) << list.out;
  EXPECT_EQ(lines[lr].rfind(root, 0), 0u) << list.out;
  EXPECT_EQ(lines[lc].rfind("└─ " + child, 0), 0u) << list.out;
  EXPECT_EQ(lines[lc2].rfind("└─ " + child2, 0), 0u) << list.out;
  EXPECT_TRUE((lc == lr + 1 && lc2 == lr + 2) || (lc2 == lr + 1 && lc == lr + 2)) << list.out;
  EXPECT_TRUE(lo < lr || lo > lr + 2) << list.out;
  ProcessResult show =
      RunProcess({CliPath(), "pools", "show", child, "--endpoint", daemon_->endpoint()},
                 daemon_->dir(), 30000);
  EXPECT_NE(show.out.find("parent             " + root), std::string::npos) << show.out;
  EXPECT_NE(show.out.find("100 .. 139"), std::string::npos) << show.out;

  // The parent stays while it has children; the children go first, or all with --force.
  EXPECT_EQ(daemon_->Evict(root, false), POLYKV_FAILED_PRECONDITION);
  ProcessResult refused =
      RunProcess({CliPath(), "pools", "evict", root, "--endpoint", daemon_->endpoint()},
                 daemon_->dir(), 30000);
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("child pool"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find(child.substr(0, 16)), std::string::npos) << refused.err;
  EXPECT_EQ(std::string(daemon_->Info(root).id), root);
  EXPECT_EQ(daemon_->Evict(child, false), POLYKV_OK);
  EXPECT_EQ(std::string(daemon_->Info(child).id), "");
  EXPECT_EQ(daemon_->Evict(root, false), POLYKV_FAILED_PRECONDITION);  // child2 is left
  EXPECT_EQ(daemon_->Evict(root, true), POLYKV_OK);
  EXPECT_EQ(std::string(daemon_->Info(root).id), "");
  EXPECT_EQ(std::string(daemon_->Info(child2).id), "") << "a forced evict drops the subtree";
  EXPECT_EQ(std::string(daemon_->Info(other).id), other);
  // Agents of an evicted child get a clear error.
  ProcessResult gone =
      RunProcess({CliPath(), "agent", "--pool", child2, "--model", StoriesPath(), "--endpoint",
                  daemon_->endpoint(), "--prompt-ids", "1,2,3", "--threads", "1"},
                 daemon_->dir(), 60000);
  EXPECT_NE(gone.exit_code, 0);
  EXPECT_NE(gone.err.find("NOT_FOUND"), std::string::npos) << gone.err;
}

TEST_F(PoolTreeStories, RestartRestoresAChildWithItsParent) {
  const auto& st = GetStories();
  const auto& doc = st.document;
  TempDir state;
  daemon_->Stop();
  daemon_ = std::make_unique<Daemon>(5, std::vector<std::string>{"--state-dir", state.path()});
  ASSERT_TRUE(daemon_->ready()) << daemon_->log();
  const std::string root = Create(Slice(doc, 0, 110), "none");
  const std::string child = Create(Slice(doc, 110, 200), "", root);
  ASSERT_FALSE(root.empty() || child.empty());
  const json before = RunAgent(*daemon_, child, st.prompts[0]);
  ASSERT_EQ(Answer(before).size(), static_cast<size_t>(kNewTokens));
  const uint64_t digest_root = PoolDigest(daemon_->endpoint(), root);
  const uint64_t digest_child = PoolDigest(daemon_->endpoint(), child);
  ASSERT_NE(digest_child, 0u);
  EXPECT_EQ(daemon_->Stop(), 0);
  daemon_ = std::make_unique<Daemon>(5, std::vector<std::string>{"--state-dir", state.path()});
  ASSERT_TRUE(daemon_->ready()) << daemon_->log();
  // Attaching the child restores the parent first (lazily, from the state folder).
  const json after = RunAgent(*daemon_, child, st.prompts[0]);
  EXPECT_EQ(Answer(after), Answer(before));
  EXPECT_EQ(PoolDigest(daemon_->endpoint(), root), digest_root);
  EXPECT_EQ(PoolDigest(daemon_->endpoint(), child), digest_child);
  EXPECT_EQ(std::string(daemon_->Info(child).parent), root);
  // Evicting the parent with force removes the child's file too: after another restart
  // neither comes back.
  EXPECT_EQ(daemon_->Evict(root, true), POLYKV_OK);
  EXPECT_EQ(daemon_->Stop(), 0);
  daemon_ = std::make_unique<Daemon>(
      5, std::vector<std::string>{"--state-dir", state.path(), "--preload"});
  ASSERT_TRUE(daemon_->ready()) << daemon_->log();
  EXPECT_EQ(std::string(daemon_->Info(child).id), "");
  EXPECT_EQ(std::string(daemon_->Info(root).id), "");
}

}  // namespace
}  // namespace polykv::testing
