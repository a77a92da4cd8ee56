// LlamaModel on the real tiny stories260K checkpoint: reference greedy ids, cache
// consistency (prefill vs full forward, injected cache, empty-prompt recompute),
// sampling determinism and sliding-window perplexity.
#include "polykv/model/llama.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "model_test_util.h"

namespace polykv::model {
namespace {

using testing::LoadModel;

const char* kStories = POLYKV_TEST_DATA_DIR "/models/stories260K";

class StoriesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = LoadModel(kStories, 1);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(m).value().release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  static std::vector<int32_t> Greedy(const std::vector<int32_t>& prompt, int n) {
    KvCache cache = model_->NewCache(8);
    SamplingOptions s;
    s.max_new_tokens = n;
    s.stop_at_eos = false;
    auto r = model_->Generate(cache, prompt, s);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->tokens : std::vector<int32_t>{};
  }
  static LlamaModel* model_;
};
LlamaModel* StoriesTest::model_ = nullptr;

TEST_F(StoriesTest, ConfigMatchesCheckpoint) {
  const ModelConfig& c = model_->config();
  EXPECT_EQ(c.architecture, "llama");
  // layers, hidden, heads, kv_heads, head_dim, ffn, vocab, bos, eos
  testing::ExpectDims(c, {5, 64, 8, 4, 8, 172, 512, 1, 2});
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(model_->tokenizer(), nullptr);
  EXPECT_EQ(model_->fingerprint().size(), 64u);
}

TEST_F(StoriesTest, FingerprintIsStableAcrossLoads) {
  auto again = LlamaModel::Load(kStories, {});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->fingerprint(), model_->fingerprint());
}

TEST_F(StoriesTest, GreedyFromBosMatchesReference) {
  const std::vector<int32_t> expected = {461, 461, 401, 401, 401, 461, 378, 455, 473, 456};
  std::vector<int32_t> got = Greedy({1}, 40);
  ASSERT_EQ(got.size(), 40u);
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + 10), expected);
  // Deterministic continuation, also with a cache that must grow from capacity 8.
  EXPECT_EQ(Greedy({1}, 40), got);
}

TEST_F(StoriesTest, PrefillThenDecodeEqualsFullForward) {
  std::vector<int32_t> seq = {1};
  {
    auto g = Greedy({1}, 30);
    seq.insert(seq.end(), g.begin(), g.end());
  }
  const int64_t n = static_cast<int64_t>(seq.size());
  KvCache full = model_->NewCache(n);
  auto all = model_->Forward(seq, full, /*all_logits=*/true);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->rows, n);
  ASSERT_EQ(all->vocab, 512);
  ASSERT_EQ(all->values.size(), static_cast<size_t>(n * 512));

  // Prefill of the first 20 tokens in chunks of 7, then token-by-token decode.
  std::vector<int32_t> head(seq.begin(), seq.begin() + 20);
  std::vector<std::pair<int64_t, int64_t>> progress;
  auto pre = model_->Prefill(head, 7, [&](int64_t d, int64_t t) { progress.emplace_back(d, t); });
  ASSERT_TRUE(pre.ok()) << pre.status();
  EXPECT_EQ(progress, (std::vector<std::pair<int64_t, int64_t>>{{7, 20}, {14, 20}, {20, 20}}));
  ASSERT_EQ(pre->k.size(), 5u);
  EXPECT_EQ(pre->k[0].size(), 4u * 20 * 8);
  EXPECT_EQ(pre->tokens, 20);
  using testing::CacheRows;
  using testing::MaxAbsDiff;
  EXPECT_LT(MaxAbsDiff(pre->last_logits, all->row(19)), 1e-4f);
  for (int l = 0; l < 5; ++l) {
    EXPECT_LT(MaxAbsDiff(pre->k[l], CacheRows(full, full.k[l], 4, 8, 20)), 1e-4f);
    EXPECT_LT(MaxAbsDiff(pre->v[l], CacheRows(full, full.v[l], 4, 8, 20)), 1e-4f);
  }
  KvCache inc = model_->NewCache(4);  // grows
  ASSERT_TRUE(model_->Forward(head, inc).ok());
  for (int64_t i = 20; i < n; ++i) {
    auto step = model_->Forward({seq[i]}, inc);
    ASSERT_TRUE(step.ok()) << step.status();
    ASSERT_EQ(step->rows, 1);
    EXPECT_LT(MaxAbsDiff(step->row(0), all->row(i)), 1e-4f) << "position " << i;
  }
  EXPECT_EQ(inc.length, n);
  EXPECT_EQ(inc.tokens, seq);
}

TEST_F(StoriesTest, InjectedCacheDecodesLikeOwnCache) {
  const std::vector<int32_t> prompt = {1, 461, 461, 401, 401, 401, 461, 378, 455};
  KvCache own = model_->NewCache(16);
  ASSERT_TRUE(model_->Forward(prompt, own).ok());
  // A fresh cache of another capacity whose tensors are copied from `own`.
  KvCache injected = model_->NewCache(100);
  testing::CopyCacheRows(own, injected, 4, 8, own.length);
  injected.length = own.length;
  injected.tokens = own.tokens;
  SamplingOptions s;
  s.max_new_tokens = 64;
  s.stop_at_eos = false;
  auto a = model_->Generate(own, {473}, s);
  auto b = model_->Generate(injected, {473}, s);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->tokens.size(), 64u);
  EXPECT_EQ(a->tokens, b->tokens);
  // Sampled decoding with the same seed also agrees.
  KvCache own2 = model_->NewCache(4), inj2 = model_->NewCache(64);
  ASSERT_TRUE(model_->Forward(prompt, own2).ok());
  testing::CopyCacheRows(own2, inj2, 4, 8, 9);
  inj2.length = 9;
  inj2.tokens = prompt;
  s.greedy = false;
  s.seed = 42;
  auto c = model_->Generate(own2, {}, s);
  auto d = model_->Generate(inj2, {}, s);
  ASSERT_TRUE(c.ok() && d.ok());
  EXPECT_EQ(c->tokens, d->tokens);
}

TEST_F(StoriesTest, EmptyPromptRecomputesLastToken) {
  const std::vector<int32_t> prompt = {1, 461, 461, 401};
  SamplingOptions s;
  s.max_new_tokens = 12;
  s.stop_at_eos = false;
  KvCache a = model_->NewCache(8);
  auto ra = model_->Generate(a, prompt, s);
  KvCache b = model_->NewCache(8);
  ASSERT_TRUE(model_->Forward(prompt, b).ok());
  ASSERT_EQ(b.length, 4);
  auto rb = model_->Generate(b, {}, s);
  ASSERT_TRUE(ra.ok() && rb.ok()) << rb.status();
  EXPECT_EQ(ra->tokens, rb->tokens);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.length, b.length);
  EXPECT_EQ(a.length, 4 + 12);  // prompt + every returned token
  // Continuing with an empty prompt picks up exactly where one longer run would be.
  auto more = model_->Generate(a, {}, s);
  ASSERT_TRUE(more.ok());
  std::vector<int32_t> joined = ra->tokens;
  joined.insert(joined.end(), more->tokens.begin(), more->tokens.end());
  s.max_new_tokens = 24;
  KvCache c = model_->NewCache(8);
  auto longer = model_->Generate(c, prompt, s);
  ASSERT_TRUE(longer.ok());
  EXPECT_EQ(joined, longer->tokens);
  KvCache empty = model_->NewCache(4);
  auto bad = model_->Generate(empty, {}, s);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

// Sampling (not greedy) at temperature 1 with nucleus `top_p`, up to `max_new_tokens`.
SamplingOptions Sampled(float top_p, int max_new_tokens) {
  SamplingOptions s;
  s.greedy = false;
  s.temperature = 1.0f;
  s.top_p = top_p;
  s.max_new_tokens = max_new_tokens;
  return s;
}

TEST_F(StoriesTest, SamplingIsSeededAndGreedyAtLowTemperature) {
  SamplingOptions s = Sampled(0.9f, 32);
  s.stop_at_eos = false;
  const auto run = [&](uint64_t seed) {
    s.seed = seed;
    KvCache c = model_->NewCache(8);
    auto r = model_->Generate(c, {1}, s);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->tokens : std::vector<int32_t>{};
  };
  const auto a = run(7);
  EXPECT_EQ(a.size(), 32u);
  EXPECT_EQ(run(7), a);
  EXPECT_NE(run(8), a);  // 32 tokens at T=1: two seeds agreeing on all would be a bug
  // Tiny top_p keeps only the most likely token: greedy.
  s.top_p = 1e-6f;
  s.max_new_tokens = 10;
  EXPECT_EQ(run(3), (std::vector<int32_t>{461, 461, 401, 401, 401, 461, 378, 455, 473, 456}));
  s.temperature = 0;
  KvCache c = model_->NewCache(8);
  EXPECT_EQ(model_->Generate(c, {1}, s).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(StoriesTest, StopsAtEos) {
  // Sampled stories end with EOS (id 2) within a few hundred tokens for most seeds.
  SamplingOptions s = Sampled(1.0f, 300);
  int stopped = 0;
  for (uint64_t seed = 0; seed < 10 && stopped == 0; ++seed) {
    s.seed = seed;
    s.stop_at_eos = true;
    KvCache c = model_->NewCache(8);
    auto r = model_->Generate(c, {1}, s);
    ASSERT_TRUE(r.ok()) << r.status();
    for (int32_t t : r->tokens) EXPECT_NE(t, 2);
    if (r->tokens.size() == 300u) continue;
    ++stopped;
    // The same seed without the stop: identical prefix, then EOS exactly where it stopped.
    s.stop_at_eos = false;
    KvCache c2 = model_->NewCache(8);
    auto full = model_->Generate(c2, {1}, s);
    ASSERT_TRUE(full.ok());
    ASSERT_GT(full->tokens.size(), r->tokens.size());
    EXPECT_EQ(full->tokens[r->tokens.size()], 2) << "seed " << seed;
    EXPECT_EQ(std::vector<int32_t>(full->tokens.begin(), full->tokens.begin() + r->tokens.size()),
              r->tokens);
    // The cache holds the prompt and all returned tokens, not the EOS.
    EXPECT_EQ(c.length, static_cast<int64_t>(1 + r->tokens.size()));
    EXPECT_EQ(c.tokens.back(), r->tokens.back());
  }
  EXPECT_EQ(stopped, 1) << "no seed in 0..9 produced EOS within 300 tokens";
}

TEST_F(StoriesTest, OnTokenSeesEveryTokenAndCanStop) {
  const std::vector<int32_t> want = Greedy({1}, 12);
  ASSERT_EQ(want.size(), 12u);
  // Sees every token in order, as soon as it is sampled.
  std::vector<int32_t> seen;
  SamplingOptions s;
  s.max_new_tokens = 12;
  s.stop_at_eos = false;
  s.on_token = [&seen](int32_t t) {
    seen.push_back(t);
    return true;
  };
  KvCache c = model_->NewCache(8);
  auto r = model_->Generate(c, {1}, s);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens, want);
  EXPECT_EQ(seen, want);
  // Returning false stops after that token: it is returned, not fed to the cache.
  seen.clear();
  s.on_token = [&seen](int32_t t) {
    seen.push_back(t);
    return seen.size() < 5;
  };
  KvCache c2 = model_->NewCache(8);
  auto stopped = model_->Generate(c2, {1}, s);
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(stopped->tokens, std::vector<int32_t>(want.begin(), want.begin() + 5));
  EXPECT_EQ(seen, stopped->tokens);
  EXPECT_EQ(c2.length, 1 + 4);
}

TEST_F(StoriesTest, PerplexityScoresEveryTargetOnce) {
  std::vector<int32_t> seq = {1};
  {
    auto g = Greedy({1, 300}, 60);
    seq.push_back(300);
    seq.insert(seq.end(), g.begin(), g.end());
  }
  const int64_t n = static_cast<int64_t>(seq.size());  // 62
  for (auto [ctx, stride] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {4, 4}, {8, 3}, {16, 16}, {16, 1}, {61, 5}, {62, 62}, {100, 7}}) {
    auto r = model_->Perplexity(seq, ctx, stride);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->tokens_scored, n - 1) << "context " << ctx << " stride " << stride;
    EXPECT_TRUE(std::isfinite(r->perplexity));
    EXPECT_NEAR(r->perplexity, std::exp(r->mean_nll), 1e-9 * r->perplexity);
  }
  EXPECT_EQ(model_->Perplexity({1}, 4, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->Perplexity(seq, 4, 5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->Perplexity(seq, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

// Mean NLL of targets [from+1, to] with the window fed tokens [begin, to).
double DirectNll(LlamaModel& m, const std::vector<int32_t>& seq, int64_t begin, int64_t from,
                 int64_t to) {
  KvCache c = m.NewCache(to - begin);
  std::vector<int32_t> in(seq.begin() + begin, seq.begin() + to);
  auto logits = m.Forward(in, c, true);
  EXPECT_TRUE(logits.ok());
  double s = 0;
  for (int64_t p = from; p < to; ++p)
    s -= testing::LogSoftmaxF64(logits->row(p - begin), seq[p + 1]);
  return s;
}

TEST_F(StoriesTest, PerplexityMatchesDirectComputation) {
  const std::vector<int32_t> seq = {1, 461, 461, 401, 401, 401, 461, 378, 455, 473, 456, 300};
  const int64_t n = 12;
  // One window covering everything.
  auto one = model_->Perplexity(seq, 64, 64);
  ASSERT_TRUE(one.ok());
  EXPECT_NEAR(one->mean_nll, DirectNll(*model_, seq, 0, 0, n - 1) / (n - 1), 1e-5);
  // context 6, stride 4: windows feed [0,6) [4,10) [8,11); score positions [0,6) [6,10) [10,11).
  auto slid = model_->Perplexity(seq, 6, 4);
  ASSERT_TRUE(slid.ok());
  const double direct = DirectNll(*model_, seq, 0, 0, 6) + DirectNll(*model_, seq, 4, 6, 10) +
                        DirectNll(*model_, seq, 8, 10, 11);
  EXPECT_NEAR(slid->mean_nll, direct / (n - 1), 1e-5);
  EXPECT_EQ(slid->tokens_scored, n - 1);
}

TEST_F(StoriesTest, ForwardRejectsBadInput) {
  KvCache c = model_->NewCache(4);
  EXPECT_EQ(model_->Forward({}, c).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->Forward({512}, c).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->Forward({-1}, c).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.length, 0);
  KvCache wrong = model_->NewCache(4);
  wrong.k.pop_back();
  EXPECT_EQ(model_->Forward({1}, wrong).status().code(), absl::StatusCode::kInvalidArgument);
  KvCache mism = model_->NewCache(4);
  mism.length = 2;  // tokens not filled in
  EXPECT_EQ(model_->Forward({1}, mism).status().code(), absl::StatusCode::kInvalidArgument);
  KvCache dflt;  // default-constructed: allocated on demand
  auto r = model_->Forward({1, 461}, dflt);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(dflt.length, 2);
}

}  // namespace
// Argmax against its definition (the first index of the largest logit by `>`): random
// vocabularies of every length around the 16-lane blocks, ties, +-0, infinities and NaNs.
TEST(ArgmaxTest, EqualsTheFirstLargestByStrictGreater) {
  auto reference = [](const std::vector<float>& x) {
    size_t best = 0;
    for (size_t i = 1; i < x.size(); ++i)
      if (x[i] > x[best]) best = i;
    return static_cast<int32_t>(best);
  };
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> small(-3, 3);
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN};
  for (size_t n :
       {size_t{1}, size_t{2}, size_t{15}, size_t{16}, size_t{17}, size_t{33}, size_t{49152}}) {
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<float> x(n);
      for (float& v : x) v = static_cast<float>(small(rng));  // many ties
      if (trial % 3 == 1)
        for (int k = 0; k < 3; ++k) x[rng() % n] = specials[rng() % 5];
      if (trial % 7 == 2) x[0] = NAN;
      auto got = Argmax(x);
      ASSERT_TRUE(got.ok());
      ASSERT_EQ(*got, reference(x)) << "n " << n << " trial " << trial;
    }
  }
  EXPECT_EQ(Argmax({}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace polykv::model
