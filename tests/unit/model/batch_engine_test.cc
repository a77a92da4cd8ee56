// BatchEngine (continuous batching over one shared prefix): every session's tokens equal
// LlamaModel::Generate's for the same prompt and sampling (greedy and seeded top-p), with
// sessions joining between steps (their prompts in one forward, in groups of
// max_prompt_rows, or one forward each); a BatchModel that returns argmax ids itself gives the
// same tokens (greedy sessions take its ids, sampled ones get real logits); cancellation (Cancel
// and a callback returning false), Submit's errors, shutdown of a running engine thread; stop
// strings and streamed text on SmolLM2 (skipped unless POLYKV_SMOLLM2_GGUF names the GGUF).
#include "polykv/model/batch_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "model_test_util.h"
#include "polykv/model/llama.h"

namespace polykv::model {
namespace {

using testing::LoadModel;
using testing::SmolLM2Path;
using testing::Tokens;

const char* kStories = POLYKV_TEST_DATA_DIR "/models/stories260K";

struct Fixture {
  std::unique_ptr<LlamaModel> model;
  std::vector<int32_t> doc;
  std::shared_ptr<const KvPrefix> prefix;
};

Fixture Load(const std::string& path, int64_t doc_tokens) {
  Fixture f;
  auto m = LoadModel(path, 2);
  EXPECT_TRUE(m.ok()) << m.status();
  f.model = std::move(*m);
  f.doc = Tokens(doc_tokens, f.model->config().vocab, 1);
  KvCache own = f.model->NewCache(doc_tokens);
  EXPECT_TRUE(f.model->Forward(f.doc, own, false).ok());
  auto frozen = f.model->FreezeAsPrefix(std::move(own), 1);
  EXPECT_TRUE(frozen.ok()) << frozen.status();
  f.prefix = frozen->prefix;
  return f;
}

// What a single agent generates: Generate on its own cache over the same prefix.
std::vector<int32_t> Single(Fixture& f, const std::vector<int32_t>& prompt,
                            const SamplingOptions& o) {
  auto cache = f.model->NewCacheWithPrefix(f.prefix, f.doc, 8);
  EXPECT_TRUE(cache.ok());
  auto r = f.model->Generate(*cache, prompt, o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->tokens : std::vector<int32_t>{};
}

struct Collected {
  std::vector<int32_t> ids;
  std::string text;
  int events = 0;
  bool done = false;
  FinishReason finish = FinishReason::kNone;
  int64_t cached = 0, prompt = 0, completion = 0;
};

SessionCallback Collect(Collected* c) {
  return [c](const SessionEvent& e) {
    c->ids.insert(c->ids.end(), e.new_ids.begin(), e.new_ids.end());
    c->text += e.text_delta;
    ++c->events;
    if (e.done) {
      c->done = true;
      c->finish = e.finish;
      c->cached = e.cached_tokens;
      c->prompt = e.prompt_tokens;
      c->completion = e.completion_tokens;
    }
    return true;
  };
}

// Six sessions, three joining while three decode, each equal to a single Generate; the
// joining prompts (1, 4, 7 then 10, 13, 16 rows) run with BatchEngineOptions::max_prompt_rows
// `rows`, in `forwards` prompt forwards in all.
void ExpectSessionsEqualGenerateWhileJoining(int64_t rows, uint64_t forwards) {
  Fixture f = Load(kStories, 200);
  BatchEngineOptions o;
  o.max_prompt_rows = rows;
  BatchEngine engine(*f.model, f.prefix, f.doc, 0, o);
  const int32_t vocab = f.model->config().vocab;
  std::vector<SessionRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    SessionRequest r;
    r.prompt = Tokens(1 + 3 * i, vocab, 20 + i);
    r.sampling.max_new_tokens = 10 + 3 * i;
    r.sampling.stop_at_eos = false;
    if (i % 3 == 2) {  // seeded top-p sampling
      r.sampling.greedy = false;
      r.sampling.temperature = 0.9f;
      r.sampling.top_p = 0.9f;
      r.sampling.seed = 1234 + i;
    }
    reqs.push_back(r);
  }
  std::vector<Collected> got(reqs.size());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(engine.Submit(reqs[i], Collect(&got[i])).ok());
  EXPECT_TRUE(engine.Step());
  EXPECT_TRUE(engine.Step());
  for (size_t i = 3; i < reqs.size(); ++i)  // join while the first three decode
    ASSERT_TRUE(engine.Submit(reqs[i], Collect(&got[i])).ok());
  for (int guard = 0; guard < 100 && engine.Step(); ++guard) {
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(got[i].done) << i;
    EXPECT_EQ(got[i].finish, FinishReason::kLength) << i;
    EXPECT_EQ(got[i].ids, Single(f, reqs[i].prompt, reqs[i].sampling)) << "session " << i;
    EXPECT_EQ(got[i].cached, 200);
    EXPECT_EQ(got[i].prompt, static_cast<int64_t>(reqs[i].prompt.size()));
    EXPECT_EQ(got[i].completion, reqs[i].sampling.max_new_tokens);
  }
  const BatchEngineStats st = engine.stats();
  EXPECT_EQ(st.sessions_submitted, 6u);
  EXPECT_EQ(st.sessions_finished, 6u);
  EXPECT_EQ(st.running, 0);
  EXPECT_GT(st.step_rows, st.steps);  // steps did batch several sessions
  EXPECT_EQ(st.prompt_forwards, forwards) << "max_prompt_rows " << rows;
  EXPECT_EQ(st.prompt_tokens, 51u);
}

TEST(BatchEngine, SessionsEqualGenerateWhileJoining) {
  ExpectSessionsEqualGenerateWhileJoining(BatchEngineOptions().max_prompt_rows, 2);
}

TEST(BatchEngine, PromptRowsGroupJoiningSessions) {
  ExpectSessionsEqualGenerateWhileJoining(5, 5);  // {1, 4}, {7}; {10}, {13}, {16}
  ExpectSessionsEqualGenerateWhileJoining(0, 6);  // one Forward per session
}

// A BatchModel answering as a GPU runtime may: NewLlamaBatchModel's forwards, then every row's
// argmax filled by the model and the rows whose need_logits is 0 zeroed. It records each
// session's need_logits flags (sessions in the order of their NewCache calls) in `flags`.
class ArgmaxBatchModel : public BatchModel {
 public:
  // *empty counts the answers without any logits (no row needed them), as the CUDA model
  // returns them.
  ArgmaxBatchModel(std::unique_ptr<BatchModel> inner, std::vector<std::vector<uint8_t>>* flags,
                   int* empty)
      : inner_(std::move(inner)), flags_(flags), empty_(empty) {}

  const ModelConfig& config() const override { return inner_->config(); }
  const Tokenizer* tokenizer() const override { return inner_->tokenizer(); }
  uint64_t WeightBytesPerStep() const override { return inner_->WeightBytesPerStep(); }
  int64_t prefix_tokens() const override { return inner_->prefix_tokens(); }

  StatusOr<std::unique_ptr<BatchCache>> NewCache(int64_t capacity) override {
    auto c = std::make_unique<Cache>();
    POLYKV_ASSIGN_OR_RETURN(c->inner, inner_->NewCache(capacity));
    c->session = flags_->size();
    flags_->emplace_back();
    return std::unique_ptr<BatchCache>(std::move(c));
  }

  StatusOr<BatchLogits> ForwardPrompts(absl::Span<BatchCache* const> caches,
                                       absl::Span<const absl::Span<const int32_t>> prompts,
                                       absl::Span<const uint8_t> need_logits,
                                       bool joined) override {
    return Answer(need_logits,
                  inner_->ForwardPrompts(Unwrap(caches, need_logits), prompts, need_logits, joined),
                  empty_);
  }

  StatusOr<BatchLogits> ForwardBatch(absl::Span<BatchCache* const> caches,
                                     absl::Span<const int32_t> tokens,
                                     absl::Span<const uint8_t> need_logits) override {
    return Answer(need_logits,
                  inner_->ForwardBatch(Unwrap(caches, need_logits), tokens, need_logits), empty_);
  }

 private:
  struct Cache : BatchCache {
    std::unique_ptr<BatchCache> inner;
    size_t session = 0;
  };

  // The inner caches; records need_logits per session.
  std::vector<BatchCache*> Unwrap(absl::Span<BatchCache* const> caches,
                                  absl::Span<const uint8_t> need_logits) {
    EXPECT_EQ(need_logits.size(), caches.size());
    std::vector<BatchCache*> inner;
    for (size_t i = 0; i < caches.size(); ++i) {
      auto* c = static_cast<Cache*>(caches[i]);
      (*flags_)[c->session].push_back(need_logits.at(i));
      inner.push_back(c->inner.get());
    }
    return inner;
  }

  // Argmax ids for every row; rows nobody needs zeroed, or no logits at all when no row
  // needs them.
  static StatusOr<BatchLogits> Answer(absl::Span<const uint8_t> need_logits,
                                      StatusOr<BatchLogits> out, int* empty) {
    if (!out.ok()) return out;
    Logits& l = out->logits;
    bool any = false;
    for (int64_t i = 0; i < l.rows; ++i) {
      POLYKV_ASSIGN_OR_RETURN(int32_t id, Argmax(l.row(i)));
      out->argmax.push_back(id);
      if (need_logits.at(static_cast<size_t>(i)) == 0) {
        const auto row = l.values.begin() + static_cast<std::ptrdiff_t>(i) * l.vocab;
        std::fill(row, row + l.vocab, 0.0f);
      } else {
        any = true;
      }
    }
    if (!any) {
      l.values.clear();
      ++*empty;
    }
    return out;
  }

  std::unique_ptr<BatchModel> inner_;
  std::vector<std::vector<uint8_t>>* flags_;
  int* empty_;
};

// Through a model that returns argmax ids (and zeroes the logits greedy sessions do not need,
// or returns none when no session needs them), every session gets the tokens the CPU adapter
// gives it: greedy ones take the model's ids,
// seeded top-p ones in the same batches sample real logits; the engine asks for logits exactly
// for the sampled sessions. Prompts joined and one per forward.
TEST(BatchEngine, ModelArgmaxGivesTheSameTokens) {
  Fixture f = Load(kStories, 100);
  const int32_t vocab = f.model->config().vocab;
  std::vector<SessionRequest> reqs;
  for (int i = 0; i < 5; ++i) {
    SessionRequest r;
    r.prompt = Tokens(2 + 3 * i, vocab, 40 + i);
    r.sampling.max_new_tokens = 8 + 2 * i;
    r.sampling.stop_at_eos = false;
    if (i % 2 == 1) {
      r.sampling.greedy = false;
      r.sampling.temperature = 0.9f;
      r.sampling.top_p = 0.9f;
      r.sampling.seed = 77 + i;
    }
    reqs.push_back(r);
  }
  // Three sessions, then the other two join while they decode.
  const auto run = [&](BatchEngine& engine) {
    std::vector<Collected> got(reqs.size());
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(engine.Submit(reqs[i], Collect(&got[i])).ok());
    engine.Step();
    engine.Step();
    for (size_t i = 3; i < reqs.size(); ++i)
      EXPECT_TRUE(engine.Submit(reqs[i], Collect(&got[i])).ok());
    for (int guard = 0; guard < 100 && engine.Step(); ++guard) {
    }
    return got;
  };
  for (const int64_t rows : {BatchEngineOptions().max_prompt_rows, int64_t{0}}) {
    BatchEngineOptions o;
    o.max_prompt_rows = rows;
    BatchEngine plain(*f.model, f.prefix, f.doc, 0, o);
    const std::vector<Collected> want = run(plain);
    std::vector<std::vector<uint8_t>> flags;
    int empty = 0;
    BatchEngine engine(std::make_unique<ArgmaxBatchModel>(
                           NewLlamaBatchModel(*f.model, f.prefix, f.doc), &flags, &empty),
                       0, o);
    const std::vector<Collected> got = run(engine);
    // The last steps decode only greedy session 4: answers without logits were taken.
    EXPECT_GT(empty, 0) << "max_prompt_rows " << rows;
    ASSERT_EQ(flags.size(), reqs.size()) << "max_prompt_rows " << rows;
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_TRUE(got[i].done) << i;
      EXPECT_EQ(got[i].finish, FinishReason::kLength) << i;
      EXPECT_EQ(got[i].ids, want[i].ids) << "session " << i << ", max_prompt_rows " << rows;
      EXPECT_EQ(got[i].ids.size(), static_cast<size_t>(reqs[i].sampling.max_new_tokens));
      // The prompt forward and every step but the last token's (which is not fed).
      EXPECT_EQ(flags[i].size(), got[i].ids.size()) << i;
      const uint8_t need = reqs[i].sampling.greedy ? 0 : 1;
      for (uint8_t flag : flags[i]) EXPECT_EQ(flag, need) << "session " << i;
    }
    const BatchEngineStats a = plain.stats(), b = engine.stats();
    EXPECT_EQ(b.prompt_forwards, a.prompt_forwards);
    EXPECT_EQ(b.steps, a.steps);
    EXPECT_EQ(b.step_rows, a.step_rows);
    EXPECT_EQ(b.generated_tokens, a.generated_tokens);
  }
}

TEST(BatchEngine, CancelFreesSession) {
  Fixture f = Load(kStories, 64);
  BatchEngine engine(*f.model, f.prefix, f.doc, 0);
  SessionRequest r;
  r.prompt = {5, 6, 7};
  r.sampling.max_new_tokens = 50;
  r.sampling.stop_at_eos = false;
  Collected a, b;
  auto ida = engine.Submit(r, Collect(&a));
  ASSERT_TRUE(ida.ok());
  int calls = 0;
  auto idb = engine.Submit(r, [&](const SessionEvent&) { return ++calls < 3; });
  ASSERT_TRUE(idb.ok());
  engine.Step();
  engine.Step();
  const int before = a.events;
  engine.Cancel(*ida);
  for (int i = 0; i < 10; ++i) engine.Step();
  EXPECT_EQ(a.events, before);  // nothing after the cancel
  EXPECT_FALSE(a.done);
  EXPECT_EQ(calls, 3);  // the callback's false stopped the session
  EXPECT_EQ(engine.stats().sessions_cancelled, 2u);
  EXPECT_EQ(engine.stats().running, 0);
  EXPECT_FALSE(engine.Step());
}

TEST(BatchEngine, SubmitErrors) {
  Fixture f = Load(kStories, 16);
  BatchEngine engine(*f.model, f.prefix, f.doc, 0);
  SessionRequest r;
  EXPECT_EQ(engine.Submit(r, Collect(nullptr)).status().code(), absl::StatusCode::kInvalidArgument);
  r.prompt = {f.model->config().vocab};
  EXPECT_EQ(engine.Submit(r, Collect(nullptr)).status().code(), absl::StatusCode::kInvalidArgument);
  r.prompt = {1};
  r.sampling.greedy = false;
  r.sampling.temperature = 0;
  EXPECT_EQ(engine.Submit(r, Collect(nullptr)).status().code(), absl::StatusCode::kInvalidArgument);
  r.sampling.greedy = true;
  r.stop = {"x"};  // stories260K has no tokenizer
  EXPECT_EQ(engine.Submit(r, Collect(nullptr)).status().code(), absl::StatusCode::kInvalidArgument);
  r.stop.clear();
  r.sampling.max_new_tokens = 1 << 20;
  EXPECT_EQ(engine.Submit(r, Collect(nullptr)).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(BatchEngine, ThreadRunsAndShutsDown) {
  Fixture f = Load(kStories, 32);
  BatchEngine engine(*f.model, f.prefix, f.doc, 0);
  std::thread t([&] { engine.RunUntilStopped(); });
  std::mutex mu;
  std::condition_variable cv;
  Collected done_one;
  SessionRequest r;
  r.prompt = {3, 4};
  r.sampling.max_new_tokens = 5;
  r.sampling.stop_at_eos = false;
  ASSERT_TRUE(engine
                  .Submit(r,
                          [&](const SessionEvent& e) {
                            std::lock_guard<std::mutex> l(mu);
                            Collect (&done_one)(e);
                            cv.notify_all();
                            return true;
                          })
                  .ok());
  {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return done_one.done; });
  }
  EXPECT_EQ(done_one.ids, Single(f, r.prompt, r.sampling));
  engine.Shutdown();
  t.join();
  EXPECT_EQ(engine.Submit(r, Collect(nullptr)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(BatchEngine, SmolLM2StopStringsAndText) {
  if (SmolLM2Path().empty()) GTEST_SKIP() << "POLYKV_SMOLLM2_GGUF is not set";
  Fixture f = Load(SmolLM2Path(), 40);
  const Tokenizer* tok = f.model->tokenizer();
  ASSERT_NE(tok, nullptr);
  auto prompt = tok->Encode(
      "<|im_start|>user\nWrite a list of three colors.<|im_end|>\n"
      "<|im_start|>assistant\n",
      false);
  ASSERT_TRUE(prompt.ok());
  SessionRequest r;
  r.prompt = *prompt;
  r.sampling.max_new_tokens = 24;
  const std::vector<int32_t> single = Single(f, r.prompt, r.sampling);
  auto full = tok->Decode(single);
  ASSERT_TRUE(full.ok());
  ASSERT_GE(full->size(), 6u);
  // A stop string taken from the middle of the single answer: the engine's text ends
  // right before it.
  const std::string stop = full->substr(full->size() / 2, 3);
  const std::string expect_text = full->substr(0, full->find(stop));
  BatchEngine engine(*f.model, f.prefix, f.doc, 0);
  Collected plain, stopped;
  ASSERT_TRUE(engine.Submit(r, Collect(&plain)).ok());
  SessionRequest rs = r;
  rs.stop = {stop, "never-appears-here"};
  ASSERT_TRUE(engine.Submit(rs, Collect(&stopped)).ok());
  for (int guard = 0; guard < 100 && engine.Step(); ++guard) {
  }
  EXPECT_EQ(plain.ids, single);
  EXPECT_EQ(plain.text, *full);
  EXPECT_TRUE(stopped.done);
  EXPECT_EQ(stopped.finish, FinishReason::kStop);
  EXPECT_EQ(stopped.text, expect_text);
}

}  // namespace
}  // namespace polykv::model
