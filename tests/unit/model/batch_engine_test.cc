// BatchEngine (continuous batching over one shared prefix): every session's tokens equal
// LlamaModel::Generate's for the same prompt and sampling (greedy and seeded top-p), with
// sessions joining between steps (their prompts in one forward, in groups of
// max_prompt_rows, or one forward each); cancellation (Cancel and a callback returning false),
// Submit's errors, shutdown of a running engine thread; stop strings and streamed text on
// SmolLM2 (skipped unless POLYKV_SMOLLM2_GGUF names the GGUF).
#include "polykv/model/batch_engine.h"

#include <gtest/gtest.h>

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
