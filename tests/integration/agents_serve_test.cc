// `polykv-cli agents serve` as a process next to polykvd: the host's greedy answers (several
// requests at once, batched) equal those of single `polykv-cli agent` processes; streaming
// (SSE chunks, [DONE], usage with the pool's cached tokens), /v1/models, /health, /metrics,
// OpenAI-style errors, a client that disconnects frees its session, and SIGTERM leaves no
// pool mapping behind (Daemon::Stop's leak check). stories260K (token-id prompts) always;
// SmolLM2 chat answers against `polykv-cli agent --chat` when POLYKV_SMOLLM2_GGUF is set.
#include <gtest/gtest.h>
#include <httplib.h>

#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "polykv/agent.h"
#include "polykv/kernels/device_ops.h"
#include "serve_host.h"

namespace polykv::testing {
namespace {

using nlohmann::json;

StoriesInputs& Stories() {
  return SharedStoriesInputs(/*doc_seed=*/71, /*doc_tokens=*/300, /*prompt_seed=*/900,
                             /*prompts=*/6);
}

// The host of these tests: SIGTERM-stopped `agents serve` over `pool` on 2 threads.
class Host : public ServeHost {
 public:
  Host(const Daemon& d, const std::string& pool, const std::string& model, int min_step_ms = 0)
      : ServeHost(d.dir(),
                  {"--pool", pool, "--model", model, "--endpoint", d.endpoint(), "--threads", "2",
                   "--alias", "doc", "--min-step-ms", std::to_string(min_step_ms)}) {}
};

// POSTs `body` with `receive` getting the response body as it arrives (false: hang up).
void PostReceiving(int port, const std::string& path, const json& body,
                   std::function<bool(const char*, size_t)> receive) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(300, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [receive](const char* data, size_t n, uint64_t, uint64_t) {
    return receive(data, n);
  };
  (void)c.send(req);
}

// A streamed request: the "data:" payloads in order (the last should be "[DONE]").
std::vector<std::string> PostStream(int port, const std::string& path, const json& body) {
  std::string buf;
  PostReceiving(port, path, body, [&](const char* data, size_t n) {
    buf.append(data, n);
    return true;
  });
  std::vector<std::string> events;
  size_t pos = 0;
  for (size_t end; (end = buf.find("\n\n", pos)) != std::string::npos; pos = end + 2) {
    const std::string ev = buf.substr(pos, end - pos);
    if (ev.rfind("data: ", 0) == 0) events.push_back(ev.substr(6));
  }
  return events;
}

std::string Get(int port, const std::string& path, int* status) {
  httplib::Client c("127.0.0.1", port);
  auto r = c.Get(path.c_str());
  *status = r ? r->status : -1;
  return r ? r->body : "";
}

double Metric(const std::string& text, const std::string& name) {
  const std::regex re("\n" + name + " ([0-9.e+]+)");
  std::smatch m;
  return std::regex_search(text, m, re) ? std::stod(m[1]) : -1;
}

class AgentsServe : public DaemonTest {
 protected:
  AgentsServe() : DaemonTest(/*lease_seconds=*/10) {}
  std::vector<int32_t> SingleAgent(const std::string& pool, const std::string& model,
                                   const std::vector<int32_t>& prompt, int tokens) {
    ProcessResult r =
        RunProcess({CliPath(), "agent", "--pool", pool, "--model", model, "--endpoint",
                    daemon_->endpoint(), "--prompt-ids", JoinIds(prompt), "--max-new-tokens",
                    std::to_string(tokens), "--ignore-eos", "--json", "--threads", "1"},
                   daemon_->dir());
    return AgentAnswerIds(r);
  }
  // The stories260K document (Stories()) created as a pool, its id in *pool; the model must
  // have loaded and the create succeeded.
  void CreateStoriesPool(std::string* pool) {
    ASSERT_NE(Stories().model, nullptr);
    std::string err;
    *pool = daemon_->CreatePool(StoriesPath(), Stories().document, "", &err);
    ASSERT_FALSE(pool->empty()) << err;
  }
};

// Polls the host's /metrics every 100 ms (10 s at most) until `cancelled` sessions were
// cancelled and none is running, and expects exactly that.
void ExpectCancelledAndIdle(int port, double cancelled) {
  double seen = 0, running = 1;
  int status = 0;
  for (int i = 0; i < 100 && (seen < cancelled || running != 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const std::string m = Get(port, "/metrics", &status);
    seen = Metric(m, "polykv_host_sessions_cancelled_total");
    running = Metric(m, "polykv_host_sessions_running");
  }
  EXPECT_EQ(seen, cancelled);
  EXPECT_EQ(running, 0);
}

TEST_F(AgentsServe, StoriesGreedyAnswersEqualSingleAgents) {
  StoriesInputs& in = Stories();
  std::string pool;
  ASSERT_NO_FATAL_FAILURE(CreateStoriesPool(&pool));
  Host host(*daemon_, pool, StoriesPath());
  ASSERT_GT(host.port(), 0);
  constexpr int kTokens = 24;
  // Six requests at once: the host decodes them in shared steps.
  std::vector<json> bodies;
  for (const std::vector<int32_t>& p : in.prompts) {
    bodies.push_back({{"model", "doc"},
                      {"prompt", p},
                      {"max_tokens", kTokens},
                      {"temperature", 0},
                      {"ignore_eos", true},
                      {"return_token_ids", true}});
  }
  std::vector<std::future<json>> answers = PostConcurrently(host.port(), "/v1/completions", bodies);
  for (size_t i = 0; i < answers.size(); ++i) {
    const json j = answers[i].get();
    ASSERT_TRUE(j.contains("choices")) << j.dump();
    const std::vector<int32_t> ids = j["choices"][0]["token_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(ids, SingleAgent(pool, StoriesPath(), in.prompts[i], kTokens)) << "prompt " << i;
    EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(j["object"], "text_completion");
    EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], in.document.size());
    EXPECT_EQ(j["usage"]["prompt_tokens"], in.document.size() + in.prompts[i].size());
    EXPECT_EQ(j["usage"]["completion_tokens"], kTokens);
  }
  int status = 0;
  const std::string metrics = Get(host.port(), "/metrics", &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(Metric(metrics, "polykv_host_sessions_finished_total"), 6);
  EXPECT_GT(Metric(metrics, "polykv_host_step_rows_total"),
            Metric(metrics, "polykv_host_steps_total"))
      << "no step decoded two sessions together:\n"
      << metrics;
  EXPECT_EQ(host.Stop(), 0) << host.log();
}

// --device cuda where no GPU is usable (this CI host) or CUDA is not built: refused before
// anything is served, naming why; never a CPU host in its place.
TEST_F(AgentsServe, DeviceCudaWithoutAUsableGpuIsRefused) {
  if (kernels::CheckDeviceAvailable(kernels::Device::kCuda).ok())
    GTEST_SKIP() << "a CUDA device is usable here (integration_agents_cuda_test serves on it)";
  std::string pool;
  ASSERT_NO_FATAL_FAILURE(CreateStoriesPool(&pool));
  ProcessResult r =
      RunProcess({CliPath(), "agents", "serve", "--pool", pool, "--model", StoriesPath(),
                  "--endpoint", daemon_->endpoint(), "--listen", "127.0.0.1:0", "--device", "cuda"},
                 daemon_->dir(), 60000);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.out.find("listening"), std::string::npos) << r.out;
  EXPECT_TRUE(r.err.find("FAILED_PRECONDITION") != std::string::npos ||
              r.err.find("UNIMPLEMENTED") != std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("CUDA"), std::string::npos) << r.err;
}

TEST_F(AgentsServe, StoriesStreamingErrorsAndDisconnect) {
  StoriesInputs& in = Stories();
  std::string pool;
  ASSERT_NO_FATAL_FAILURE(CreateStoriesPool(&pool));
  Host host(*daemon_, pool, StoriesPath(), /*min_step_ms=*/30);  // sessions outlive a hang-up
  ASSERT_GT(host.port(), 0);
  // Streaming: chunks whose token ids add up to the whole answer, a finish chunk, usage, [DONE].
  const json body = {{"prompt", in.prompts[0]},
                     {"max_tokens", 12},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"return_token_ids", true},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
  const std::vector<std::string> events = PostStream(host.port(), "/v1/completions", body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::vector<int32_t> streamed;
  std::string finish;
  json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json c = json::parse(events[i]);
    if (c.contains("usage")) {
      usage = c["usage"];
      continue;
    }
    const json& ch = c["choices"][0];
    if (ch.contains("token_ids"))
      for (int32_t id : ch["token_ids"].get<std::vector<int32_t>>()) streamed.push_back(id);
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_EQ(streamed, SingleAgent(pool, StoriesPath(), in.prompts[0], 12));
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"], in.document.size());
  // Errors, OpenAI style.
  int status = 0;
  json e = PostJson(host.port(), "/v1/completions", json("not an object"), &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  e = PostJson(host.port(), "/v1/completions", {{"prompt", {1, 2}}, {"temperature", 7}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(e["error"]["param"], "temperature");
  e = PostJson(host.port(), "/v1/completions", {{"model", "nope"}, {"prompt", {1}}}, &status);
  EXPECT_EQ(status, 404);
  EXPECT_EQ(e["error"]["code"], "model_not_found");
  e = PostJson(host.port(), "/v1/completions", {{"prompt", "text"}}, &status);
  EXPECT_EQ(status, 400) << "stories260K has no tokenizer: text prompts are refused";
  e = PostJson(host.port(), "/v1/completions", {{"prompt", {1}}, {"max_tokens", 1 << 19}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(e["error"]["code"], "context_length_exceeded");
  // /v1/models and /health.
  const json models = json::parse(Get(host.port(), "/v1/models", &status));
  EXPECT_EQ(status, 200);
  EXPECT_EQ(models["data"][0]["id"], "doc");
  const json health = json::parse(Get(host.port(), "/health", &status));
  EXPECT_EQ(health["status"], "ok");
  EXPECT_EQ(health["cached_tokens"], in.document.size());
  // A client that reads two chunks and hangs up: its session is cancelled, not run to 150.
  {
    int chunks = 0;
    json long_body = body;
    long_body["max_tokens"] = 190;
    long_body["prompt"] = in.prompts[1];
    PostReceiving(host.port(), "/v1/completions", long_body,
                  [&](const char*, size_t) { return ++chunks < 2; });
  }
  ExpectCancelledAndIdle(host.port(), 1);
  // A whole (non-streamed) response whose client gives up after 0.5 s: noticed by the
  // keep-alive space the server writes once a second, cancelled long before 190 tokens.
  {
    httplib::Client c("127.0.0.1", host.port());
    c.set_read_timeout(0, 500000);
    json whole = body;
    whole.erase("stream");
    whole.erase("stream_options");
    whole["max_tokens"] = 190;
    whole["prompt"] = in.prompts[2];
    EXPECT_FALSE(c.Post("/v1/completions", whole.dump(), "application/json"));
  }
  ExpectCancelledAndIdle(host.port(), 2);
  EXPECT_EQ(host.Stop(), 0) << host.log();
}

TEST_F(AgentsServe, SmolLM2ChatAnswersEqualSingleAgents) {
  if (SmolLM2Path().empty()) GTEST_SKIP() << "POLYKV_SMOLLM2_GGUF is not set";
  std::string err;
  const std::string doc =
      client::ChatDocument(ReadFile(SourceDir() + "/data/wikitext-2/robert_boulter.txt"));
  const std::string pool = daemon_->CreatePool(SmolLM2Path(), {}, "", &err, doc, false);
  ASSERT_FALSE(pool.empty()) << err;
  Host host(*daemon_, pool, SmolLM2Path());
  ASSERT_GT(host.port(), 0);
  const std::vector<std::string> questions = {
      "Who is Robert Boulter?", "Which theatre staged Herons in 2001?",
      "Who wrote the play Herons?", "Who directed Mercury Fur?"};
  constexpr int kTokens = 32;
  std::vector<json> bodies;
  for (const std::string& q : questions) {
    bodies.push_back({{"model", "doc"},
                      {"messages", {{{"role", "user"}, {"content", q}}}},
                      {"max_tokens", kTokens},
                      {"temperature", 0}});
  }
  std::vector<std::future<json>> answers =
      PostConcurrently(host.port(), "/v1/chat/completions", bodies);
  for (size_t i = 0; i < questions.size(); ++i) {
    const json j = answers[i].get();
    ASSERT_TRUE(j.contains("choices")) << j.dump();
    ProcessResult r =
        RunProcess({CliPath(), "agent", "--pool", pool, "--model", SmolLM2Path(), "--endpoint",
                    daemon_->endpoint(), "--prompt", questions[i], "--chat", "--max-new-tokens",
                    std::to_string(kTokens), "--json", "--threads", "1"},
                   daemon_->dir());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json single = json::parse(r.out);
    EXPECT_EQ(j["choices"][0]["message"]["content"], single["answer"]) << questions[i];
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_GT(j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 1000);
  }
  EXPECT_EQ(host.Stop(), 0) << host.log();
}

}  // namespace
}  // namespace polykv::testing
