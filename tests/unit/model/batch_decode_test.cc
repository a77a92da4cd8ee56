// LlamaModel::ForwardBatch (S sessions, one token each, one shared prefix) against S separate
// Forward calls: next-token logits within a stated tolerance and equal greedy tokens over a
// decode of several steps, with sessions of different private lengths, for a prefix of codec
// none (the process's own prefill, FreezeAsPrefix) and of the default pool codec
// (k7c-v3-e4x2-nc-n16, written in memory as the daemon writes it), on stories260K and SmolLM2
// (skipped unless POLYKV_SMOLLM2_GGUF names the GGUF). Plus the argument errors. And
// LlamaModel::ForwardPrompts (S sessions' prompts in one forward) against S separate Forward
// calls: last-row logits, the caches' K/V, and greedy decoding continued from the caches.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "memory_pool.h"
#include "model_test_util.h"
#include "polykv/ipc/codec_spec.h"
#include "polykv/ipc/pool_layout.h"
#include "polykv/model/llama.h"

namespace polykv::model {
namespace {

using testing::LoadModel;
using testing::SmolLM2Path;
using testing::Tokens;

const char* kStories = POLYKV_TEST_DATA_DIR "/models/stories260K";

// A pool of the document written in memory with codec spec `spec`, kept alive by the
// returned prefix's owner.
std::shared_ptr<KvPrefix> PoolPrefix(LlamaModel& m, const std::vector<int32_t>& doc,
                                     const char* spec) {
  ipc::PoolParams p;
  p.codec = ipc::PoolCodec::kK8V;
  return testing::PoolPrefix(m, doc, p, spec);
}

// The document as the process's own raw prefix (codec none).
std::shared_ptr<const KvPrefix> OwnPrefix(LlamaModel& m, const std::vector<int32_t>& doc) {
  KvCache own = m.NewCache(static_cast<int64_t>(doc.size()));
  EXPECT_TRUE(m.Forward(doc, own, false).ok());
  auto frozen = m.FreezeAsPrefix(std::move(own), 1);
  EXPECT_TRUE(frozen.ok()) << frozen.status();
  return frozen->prefix;
}

// S sessions after the prefix, each with its own prompt (lengths differ), decoded greedily
// for `steps` steps in batches and separately; returns max |dlogit| and checks the tokens.
float CompareBatchWithSeparate(LlamaModel& m, std::shared_ptr<const KvPrefix> prefix,
                               const std::vector<int32_t>& doc, const std::string& what,
                               int steps) {
  const int32_t vocab = m.config().vocab;
  const std::vector<int64_t> prompt_lengths = {1, 3, 7, 2, 11};
  const size_t S = prompt_lengths.size();
  std::vector<KvCache> batch(S), single(S);
  std::vector<int32_t> next_batch(S), next_single(S);
  for (size_t i = 0; i < S; ++i) {
    auto c = m.NewCacheWithPrefix(prefix, doc, 4);  // small: the steps grow it
    EXPECT_TRUE(c.ok()) << c.status();
    batch[i] = std::move(*c);
    auto logits =
        m.Forward(Tokens(prompt_lengths[i], vocab, static_cast<int32_t>(10 + i)), batch[i], false);
    EXPECT_TRUE(logits.ok()) << logits.status();
    single[i] = batch[i];
    next_batch[i] = next_single[i] = *Argmax(logits->row(0));
  }
  float worst = 0, mag = 0;
  for (int step = 0; step < steps; ++step) {
    std::vector<KvCache*> ptrs;
    for (KvCache& c : batch) ptrs.push_back(&c);
    auto b = m.ForwardBatch(ptrs, next_batch);
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok()) return 1e30f;
    EXPECT_EQ(b->rows, static_cast<int64_t>(S));
    for (size_t i = 0; i < S; ++i) {
      const int32_t one[1] = {next_single[i]};
      auto s = m.Forward(absl::MakeConstSpan(one, 1), single[i], false);
      EXPECT_TRUE(s.ok()) << s.status();
      worst = std::max(worst, testing::MaxAbsDiff(b->row(static_cast<int64_t>(i)), s->row(0)));
      for (float x : s->row(0)) mag = std::max(mag, std::abs(x));
      EXPECT_EQ(batch[i].length, single[i].length);
      next_batch[i] = *Argmax(b->row(static_cast<int64_t>(i)));
      next_single[i] = *Argmax(s->row(0));
      EXPECT_EQ(next_batch[i], next_single[i]) << what << " session " << i << " step " << step;
    }
  }
  for (size_t i = 0; i < S; ++i) EXPECT_EQ(batch[i].tokens, single[i].tokens) << what;
  std::printf(
      "%s: %zu sessions x %d steps, max |dlogit| batch vs separate %.2e (|logit| <= %.1f)\n",
      what.c_str(), S, steps, worst, mag);
  return worst;
}

// CompareBatchWithSeparate within `tolerance` for `steps` steps, after a 300-token document
// held as m's own prefix and as a k7c-v3-e4x2-nc-n16 pool; `name` labels the model.
void ExpectBatchEqualsSeparate(LlamaModel& m, const std::string& name, int steps, float tolerance) {
  const std::vector<int32_t> doc = Tokens(300, m.config().vocab, 1);
  EXPECT_LE(CompareBatchWithSeparate(m, OwnPrefix(m, doc), doc, name + " none", steps), tolerance);
  EXPECT_LE(CompareBatchWithSeparate(m, PoolPrefix(m, doc, "k7c-v3-e4x2-nc-n16"), doc,
                                     name + " k7c-v3-e4x2-nc-n16", steps),
            tolerance);
}

TEST(BatchDecode, StoriesEqualsSeparateForwards) {
  auto m = LoadModel(kStories, 2);
  ASSERT_TRUE(m.ok()) << m.status();
  // Stated tolerance: 1e-4 absolute (logits of stories260K are <= ~20).
  ExpectBatchEqualsSeparate(**m, "stories260K", 24, 1e-4f);
}

TEST(BatchDecode, StoriesWithoutPrefix) {
  auto m = LoadModel(kStories, 1);
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<KvCache> c(3);
  std::vector<KvCache> ref(3);
  std::vector<int32_t> next(3);
  for (size_t i = 0; i < 3; ++i) {
    auto l = (*m)->Forward(
        Tokens(static_cast<int64_t>(2 + 4 * i), (*m)->config().vocab, static_cast<int32_t>(i)),
        c[i], false);
    ASSERT_TRUE(l.ok()) << l.status();
    ref[i] = c[i];
    next[i] = *Argmax(l->row(0));
  }
  auto b = (*m)->ForwardBatch({&c[0], &c[1], &c[2]}, next);
  ASSERT_TRUE(b.ok()) << b.status();
  for (size_t i = 0; i < 3; ++i) {
    const int32_t one[1] = {next[i]};
    auto s = (*m)->Forward(absl::MakeConstSpan(one, 1), ref[i], false);
    ASSERT_TRUE(s.ok());
    EXPECT_LE(testing::MaxAbsDiff(b->row(static_cast<int64_t>(i)), s->row(0)), 1e-4f);
  }
}

TEST(BatchDecode, Errors) {
  auto m = LoadModel(kStories, 1);
  ASSERT_TRUE(m.ok()) << m.status();
  LlamaModel& model = **m;
  const std::vector<int32_t> doc = Tokens(40, model.config().vocab, 2);
  auto p1 = OwnPrefix(model, doc);
  auto p2 = OwnPrefix(model, doc);
  KvCache a = *model.NewCacheWithPrefix(p1, doc, 4);
  KvCache b = *model.NewCacheWithPrefix(p1, doc, 4);
  KvCache other = *model.NewCacheWithPrefix(p2, doc, 4);
  const std::vector<int32_t> two = {5, 6};
  EXPECT_EQ(model.ForwardBatch({}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.ForwardBatch({&a}, two).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.ForwardBatch({&a, &a}, two).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.ForwardBatch({&a, &other}, two).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.ForwardBatch({&a, nullptr}, two).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> bad = {5, model.config().vocab};
  EXPECT_EQ(model.ForwardBatch({&a, &b}, bad).status().code(), absl::StatusCode::kInvalidArgument);
  // A failed step changed no cache.
  EXPECT_EQ(a.length, 40);
  EXPECT_EQ(b.length, 40);
  EXPECT_EQ(a.tokens.size(), 40u);
  // A prefix whose check fails fails the step, and the caches keep their lengths.
  auto failing = std::make_shared<KvPrefix>(*p1);
  failing->check = [] { return absl::NotFoundError("pool was evicted"); };
  KvCache f1 = *model.NewCacheWithPrefix(failing, doc, 4);
  KvCache f2 = *model.NewCacheWithPrefix(failing, doc, 4);
  auto r = model.ForwardBatch({&f1, &f2}, two);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(f1.length, 40);
  EXPECT_EQ(f2.tokens.size(), 40u);
  // And a good step works.
  auto ok = model.ForwardBatch({&a, &b}, two);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(a.length, 41);
  EXPECT_EQ(b.tokens.back(), 6);
}

TEST(BatchDecode, SmolLM2EqualsSeparateForwards) {
  if (SmolLM2Path().empty()) GTEST_SKIP() << "POLYKV_SMOLLM2_GGUF is not set";
  auto m = LoadModel(SmolLM2Path(), 2);  // default quantized_rows: the agents' configuration
  ASSERT_TRUE(m.ok()) << m.status();
  // Stated tolerance: 1e-2 absolute on logits of magnitude ~40 (measured 3.6e-3): the
  // many-row Q4_1 kernels and the one-row ones differ by float reassociation (matmul.h).
  ExpectBatchEqualsSeparate(**m, "SmolLM2", 12, 1e-2f);
}

// ForwardPrompts of sessions with prompts of `prompt_lengths` (session 1 first holds 4
// private tokens) against one Forward each: returns max |dlogit| over the prompts' last rows
// and `steps` greedy steps continued from both sets of caches (Forward, one token), and checks
// equal greedy tokens and the caches' K/V within `tolerance`.
float ComparePromptsWithSeparate(LlamaModel& m, std::shared_ptr<const KvPrefix> prefix,
                                 const std::vector<int32_t>& doc,
                                 const std::vector<int64_t>& prompt_lengths,
                                 const std::string& what, int steps, float tolerance) {
  const int32_t vocab = m.config().vocab;
  const size_t S = prompt_lengths.size();
  std::vector<KvCache> batch(S), single(S);
  std::vector<std::vector<int32_t>> prompts(S);
  for (size_t i = 0; i < S; ++i) {
    if (prefix) {
      auto c = m.NewCacheWithPrefix(prefix, doc, 2);  // small: the forwards grow it
      EXPECT_TRUE(c.ok()) << c.status();
      batch[i] = std::move(*c);
    }
    if (i == 1) {
      EXPECT_TRUE(m.Forward(Tokens(4, vocab, 77), batch[i], false).ok());
    }
    single[i] = batch[i];
    prompts[i] = Tokens(prompt_lengths[i], vocab, static_cast<int32_t>(20 + i));
  }
  std::vector<KvCache*> ptrs;
  std::vector<absl::Span<const int32_t>> spans;
  for (size_t i = 0; i < S; ++i) {
    ptrs.push_back(&batch[i]);
    spans.push_back(prompts[i]);
  }
  auto b = m.ForwardPrompts(ptrs, spans);
  EXPECT_TRUE(b.ok()) << b.status();
  if (!b.ok()) return 1e30f;
  EXPECT_EQ(b->rows, static_cast<int64_t>(S));
  float worst = 0, worst_kv = 0;
  std::vector<int32_t> next_batch(S), next_single(S);
  const int64_t KV = m.config().kv_heads, hd = m.config().head_dim;
  for (size_t i = 0; i < S; ++i) {
    auto s = m.Forward(prompts[i], single[i], false);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return 1e30f;
    worst = std::max(worst, testing::MaxAbsDiff(b->row(static_cast<int64_t>(i)), s->row(0)));
    EXPECT_EQ(batch[i].length, single[i].length) << what;
    EXPECT_EQ(batch[i].tokens, single[i].tokens) << what;
    for (size_t l = 0; l < batch[i].k.size(); ++l) {
      const int64_t n = single[i].suffix_length();
      for (auto buf : {&KvCache::k, &KvCache::v})
        worst_kv = std::max(
            worst_kv,
            testing::MaxAbsDiff(testing::CacheRows(batch[i], (batch[i].*buf)[l], KV, hd, n),
                                testing::CacheRows(single[i], (single[i].*buf)[l], KV, hd, n)));
    }
    next_batch[i] = *Argmax(b->row(static_cast<int64_t>(i)));
    next_single[i] = *Argmax(s->row(0));
    EXPECT_EQ(next_batch[i], next_single[i]) << what << " session " << i;
  }
  EXPECT_LE(worst_kv, tolerance) << what << ": K/V of the prompts";
  for (int step = 0; step < steps; ++step) {
    for (size_t i = 0; i < S; ++i) {
      const int32_t one_b[1] = {next_batch[i]}, one_s[1] = {next_single[i]};
      auto lb = m.Forward(absl::MakeConstSpan(one_b, 1), batch[i], false);
      auto ls = m.Forward(absl::MakeConstSpan(one_s, 1), single[i], false);
      EXPECT_TRUE(lb.ok() && ls.ok()) << what;
      if (!lb.ok() || !ls.ok()) return 1e30f;
      worst = std::max(worst, testing::MaxAbsDiff(lb->row(0), ls->row(0)));
      next_batch[i] = *Argmax(lb->row(0));
      next_single[i] = *Argmax(ls->row(0));
      EXPECT_EQ(next_batch[i], next_single[i]) << what << " session " << i << " step " << step;
    }
  }
  for (size_t i = 0; i < S; ++i) EXPECT_EQ(batch[i].tokens, single[i].tokens) << what;
  std::printf(
      "%s: ForwardPrompts of %zu sessions + %d steps, max |dlogit| vs separate %.2e, "
      "max |dK|,|dV| %.2e\n",
      what.c_str(), S, steps, worst, worst_kv);
  return worst;
}

// ComparePromptsWithSeparate within `tolerance` after a 300-token document held as m's own
// prefix and as a k7c-v3-e4x2-nc-n16 pool, for short prompts (16 sessions, 5 to 24 rows:
// more rows in all than kMappedGemmRows, fewer each) and for prompts of which one is longer
// than kMappedGemmRows.
void ExpectPromptsEqualSeparate(LlamaModel& m, const std::string& name, int steps,
                                float tolerance) {
  const std::vector<int32_t> doc = Tokens(300, m.config().vocab, 1);
  std::vector<int64_t> many;
  for (int64_t i = 0; i < 16; ++i) many.push_back(5 + (i * 7) % 20);
  const std::vector<int64_t> mixed = {1, 60, 9};
  for (auto [prefix, label] :
       {std::pair{OwnPrefix(m, doc), std::string(" none")},
        std::pair{std::shared_ptr<const KvPrefix>(PoolPrefix(m, doc, "k7c-v3-e4x2-nc-n16")),
                  std::string(" k7c-v3-e4x2-nc-n16")}}) {
    EXPECT_LE(ComparePromptsWithSeparate(m, prefix, doc, many, name + label + " 16 prompts", steps,
                                         tolerance),
              tolerance);
    EXPECT_LE(ComparePromptsWithSeparate(m, prefix, doc, mixed, name + label + " 1/60/9 rows",
                                         steps, tolerance),
              tolerance);
  }
}

TEST(BatchPrompts, StoriesEqualsSeparateForwards) {
  auto m = LoadModel(kStories, 2);
  ASSERT_TRUE(m.ok()) << m.status();
  // Stated tolerance: 1e-4 absolute, as ForwardBatch's.
  ExpectPromptsEqualSeparate(**m, "stories260K", 8, 1e-4f);
}

TEST(BatchPrompts, StoriesWithoutPrefix) {
  auto m = LoadModel(kStories, 2);
  ASSERT_TRUE(m.ok()) << m.status();
  // No prefix: the 60-row prompt takes the sgemm attention, as in its own Forward.
  EXPECT_LE(
      ComparePromptsWithSeparate(**m, nullptr, {}, {3, 60, 12}, "stories260K no prefix", 8, 1e-4f),
      1e-4f);
}

TEST(BatchPrompts, Errors) {
  auto m = LoadModel(kStories, 1);
  ASSERT_TRUE(m.ok()) << m.status();
  LlamaModel& model = **m;
  const std::vector<int32_t> doc = Tokens(40, model.config().vocab, 2);
  auto p1 = OwnPrefix(model, doc);
  auto p2 = OwnPrefix(model, doc);
  KvCache a = *model.NewCacheWithPrefix(p1, doc, 4);
  KvCache b = *model.NewCacheWithPrefix(p1, doc, 4);
  KvCache other = *model.NewCacheWithPrefix(p2, doc, 4);
  const std::vector<int32_t> x = {5, 6, 7}, y = {8}, bad = {5, model.config().vocab}, empty;
  using P = std::vector<absl::Span<const int32_t>>;
  const auto code = [&](std::vector<KvCache*> caches, const P& prompts) {
    return model.ForwardPrompts(caches, prompts).status().code();
  };
  EXPECT_EQ(code({}, {}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({&a}, P{x, y}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({&a, &a}, P{x, y}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({&a, &other}, P{x, y}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({&a, nullptr}, P{x, y}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({&a, &b}, P{x, empty}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({&a, &b}, P{x, bad}), absl::StatusCode::kInvalidArgument);
  // A prefix whose check fails fails the forward, and the caches keep their lengths.
  auto failing = std::make_shared<KvPrefix>(*p1);
  failing->check = [] { return absl::NotFoundError("pool was evicted"); };
  KvCache f1 = *model.NewCacheWithPrefix(failing, doc, 4);
  KvCache f2 = *model.NewCacheWithPrefix(failing, doc, 4);
  EXPECT_EQ(code({&f1, &f2}, P{x, y}), absl::StatusCode::kNotFound);
  EXPECT_EQ(f1.length, 40);
  EXPECT_EQ(f2.tokens.size(), 40u);
  // No failed call changed a cache; a good one appends every prompt.
  EXPECT_EQ(a.length, 40);
  EXPECT_EQ(b.tokens.size(), 40u);
  auto ok = model.ForwardPrompts({&a, &b}, P{x, y});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->rows, 2);
  EXPECT_EQ(a.length, 43);
  EXPECT_EQ(b.length, 41);
  EXPECT_EQ(b.tokens.back(), 8);
}

// A LlamaModel that only delegates to `m`, so ForwardPrompts is LlamaModel's default (one
// Forward per session).
class Delegate final : public LlamaModel {
 public:
  explicit Delegate(LlamaModel& m) : m_(m) {}
  const ModelConfig& config() const override { return m_.config(); }
  const Tokenizer* tokenizer() const override { return m_.tokenizer(); }
  const std::string& fingerprint() const override { return m_.fingerprint(); }
  kernels::DType dtype() const override { return m_.dtype(); }
  KvCache NewCache(int64_t capacity) const override { return m_.NewCache(capacity); }
  StatusOr<KvCache> NewCacheWithPrefix(std::shared_ptr<const KvPrefix> prefix,
                                       std::vector<int32_t> tokens,
                                       int64_t capacity) const override {
    return m_.NewCacheWithPrefix(std::move(prefix), std::move(tokens), capacity);
  }
  StatusOr<KvCache> FreezeAsPrefix(KvCache&& cache, int64_t capacity) const override {
    return m_.FreezeAsPrefix(std::move(cache), capacity);
  }
  WeightStorage weight_storage() const override { return m_.weight_storage(); }
  int64_t WeightBytesPerToken() const override { return m_.WeightBytesPerToken(); }
  StatusOr<Logits> Forward(absl::Span<const int32_t> tokens, KvCache& cache,
                           bool all_logits) override {
    return m_.Forward(tokens, cache, all_logits);
  }
  StatusOr<Logits> ForwardBatch(absl::Span<KvCache* const> caches,
                                absl::Span<const int32_t> tokens) override {
    return m_.ForwardBatch(caches, tokens);
  }
  StatusOr<PrefillResult> Prefill(absl::Span<const int32_t> tokens, int64_t chunk,
                                  const std::function<void(int64_t, int64_t)>& progress) override {
    return m_.Prefill(tokens, chunk, progress);
  }
  StatusOr<GenerateResult> Generate(KvCache& cache, absl::Span<const int32_t> prompt,
                                    const SamplingOptions& options) override {
    return m_.Generate(cache, prompt, options);
  }
  StatusOr<PerplexityResult> Perplexity(absl::Span<const int32_t> tokens, int64_t context,
                                        int64_t stride) override {
    return m_.Perplexity(tokens, context, stride);
  }

 private:
  LlamaModel& m_;
};

TEST(BatchPrompts, DefaultLoopsForward) {
  auto m = LoadModel(kStories, 1);
  ASSERT_TRUE(m.ok()) << m.status();
  Delegate d(**m);
  const std::vector<int32_t> doc = Tokens(40, d.config().vocab, 2);
  auto prefix = OwnPrefix(d, doc);
  std::vector<KvCache> c(2), ref(2);
  for (size_t i = 0; i < 2; ++i) c[i] = ref[i] = *d.NewCacheWithPrefix(prefix, doc, 4);
  const std::vector<int32_t> x = {5, 6, 7}, y = {8}, bad = {d.config().vocab};
  using P = std::vector<absl::Span<const int32_t>>;
  // A failing session rolls back the ones already run.
  auto failed = d.ForwardPrompts({&c[0], &c[1]}, P{x, bad});
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c[0].length, 40);
  EXPECT_EQ(c[0].tokens.size(), 40u);
  EXPECT_EQ(d.ForwardPrompts({&c[0], &c[0]}, P{x, y}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto got = d.ForwardPrompts({&c[0], &c[1]}, P{x, y});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->rows, 2);
  for (size_t i = 0; i < 2; ++i) {
    auto one = (*m)->Forward(i == 0 ? x : y, ref[i], false);
    ASSERT_TRUE(one.ok()) << one.status();
    EXPECT_EQ(testing::MaxAbsDiff(got->row(static_cast<int64_t>(i)), one->row(0)), 0.f);
    EXPECT_EQ(c[i].tokens, ref[i].tokens);
  }
}

TEST(BatchPrompts, SmolLM2EqualsSeparateForwards) {
  if (SmolLM2Path().empty()) GTEST_SKIP() << "POLYKV_SMOLLM2_GGUF is not set";
  auto m = LoadModel(SmolLM2Path(), 2);  // default quantized_rows: the agents' configuration
  ASSERT_TRUE(m.ok()) << m.status();
  // Stated tolerance: 1e-2 absolute on logits of magnitude ~40, as ForwardBatch's. Measured
  // max |dlogit| 2.6e-3 with AMX (16 prompts: K/V equal, logits 1.9e-5) and 4.8e-3 with
  // POLYKV_AMX=0 (the many-row f32 GEMM against the few-row quantized kernels).
  ExpectPromptsEqualSeparate(**m, "SmolLM2", 6, 1e-2f);
}

}  // namespace
}  // namespace polykv::model
