// The OpenAI wire format of `agents serve` (cli/serve/openai_api.h): request parsing into
// engine sessions (sampling, stop, token-id prompts), OpenAI-style errors naming the field,
// usage with cached tokens, response and chunk objects; the chat continuation rendered by
// SmolLM2's own template equals the single agent's ChatML question prompt (skipped unless
// POLYKV_SMOLLM2_GGUF is set).
#include "serve/openai_api.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>

#include "polykv/model/batch_engine.h"
#include "polykv/model/llama.h"

namespace polykv::cli::serve {
namespace {

using nlohmann::json;

// stories260K as the engine's model (no prefix): what ParseRequest reads.
const model::BatchModel& Stories() {
  static std::unique_ptr<model::LlamaModel> m = [] {
    auto r = model::LlamaModel::Load(POLYKV_TEST_DATA_DIR "/models/stories260K");
    EXPECT_TRUE(r.ok()) << r.status();
    return std::move(*r);
  }();
  static std::unique_ptr<model::BatchModel> batch = model::NewLlamaBatchModel(*m, nullptr, {});
  return *batch;
}

ServeIdentity Id() {
  ServeIdentity id;
  id.model_alias = "doc";
  id.pool_id = "abcd";
  id.default_max_tokens = 77;
  return id;
}

TEST(OpenAiApi, ParsesCompletionWithTokenIds) {
  ParsedRequest r;
  ApiError e;
  ASSERT_TRUE(ParseRequest(ApiKind::kCompletion,
                           R"({"model":"doc","prompt":[5,6,7],"max_tokens":9,"temperature":0,
                               "stop":["a","b"],"stream":true,"seed":3,
                               "stream_options":{"include_usage":true},"ignore_eos":true,
                               "return_token_ids":true,"user":"ignored","logprobs":null,
                               "echo":false,"best_of":1})",
                           Stories(), Id(), &r, &e))
      << e.message;
  EXPECT_EQ(r.session.prompt, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(r.session.sampling.max_new_tokens, 9);
  EXPECT_TRUE(r.session.sampling.greedy);
  EXPECT_FALSE(r.session.sampling.stop_at_eos);
  EXPECT_EQ(r.session.sampling.seed, 3u);
  EXPECT_EQ(r.session.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.return_token_ids);
  ParsedRequest d;
  ASSERT_TRUE(ParseRequest(ApiKind::kCompletion, R"({"prompt":[1],"temperature":0.7,"top_p":0.5})",
                           Stories(), Id(), &d, &e));
  EXPECT_EQ(d.session.sampling.max_new_tokens, 77);  // the server's default
  EXPECT_FALSE(d.session.sampling.greedy);
  EXPECT_FLOAT_EQ(d.session.sampling.temperature, 0.7f);
  EXPECT_FLOAT_EQ(d.session.sampling.top_p, 0.5f);
  EXPECT_TRUE(d.session.sampling.stop_at_eos);
}

TEST(OpenAiApi, ErrorsNameTheField) {
  struct Case {
    ApiKind kind;
    const char* body;
    int status;
    const char* param;
  };
  const Case cases[] = {
      {ApiKind::kCompletion, "{not json", 400, ""},
      {ApiKind::kCompletion, R"({"prompt":[1],"model":"other"})", 404, "model"},
      {ApiKind::kCompletion, R"({})", 400, "prompt"},
      {ApiKind::kCompletion, R"({"prompt":[1, 99999]})", 400, "prompt"},
      {ApiKind::kCompletion, R"({"prompt":"text"})", 400, "prompt"},  // no tokenizer
      {ApiKind::kCompletion, R"({"prompt":[1],"temperature":3})", 400, "temperature"},
      {ApiKind::kCompletion, R"({"prompt":[1],"top_p":0})", 400, "top_p"},
      {ApiKind::kCompletion, R"({"prompt":[1],"max_tokens":-1})", 400, "max_tokens"},
      {ApiKind::kCompletion, R"({"prompt":[1],"max_tokens":1.5})", 400, "max_tokens"},
      {ApiKind::kCompletion, R"({"prompt":[1],"n":2})", 400, "n"},
      {ApiKind::kCompletion, R"({"prompt":[1],"stop":["a","b","c","d","e"]})", 400, "stop"},
      {ApiKind::kCompletion, R"({"prompt":[1],"stream":"yes"})", 400, "stream"},
      {ApiKind::kCompletion, R"({"prompt":[1],"logprobs":2})", 400, "logprobs"},
      {ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],"logprobs":true})", 400,
       "logprobs"},
      {ApiKind::kChat, R"({"messages":[]})", 400, "messages"},
      {ApiKind::kChat, R"({"messages":[{"role":"tool","content":"x"}]})", 400, "messages[0].role"},
      {ApiKind::kChat, R"({"messages":[{"role":"user","content":5}]})", 400, "messages[0].content"},
  };
  for (const Case& c : cases) {
    ParsedRequest r;
    ApiError e;
    EXPECT_FALSE(ParseRequest(c.kind, c.body, Stories(), Id(), &r, &e)) << c.body;
    EXPECT_EQ(e.http_status, c.status) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.message;
    EXPECT_FALSE(e.message.empty());
    const json j = ErrorJson(e);
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_TRUE(j["error"].contains("code"));
    EXPECT_EQ(j["error"]["param"].is_null(), std::string(c.param).empty());
  }
}

TEST(OpenAiApi, UsageResponseAndChunks) {
  const json u = UsageJson(1469, 20, 48);
  EXPECT_EQ(u["prompt_tokens"], 1489);
  EXPECT_EQ(u["total_tokens"], 1537);
  EXPECT_EQ(u["prompt_tokens_details"]["cached_tokens"], 1469);
  const json chat =
      ResponseJson(ApiKind::kChat, "x", 5, "doc", "hi", model::FinishReason::kLength, u);
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"]["content"], "hi");
  EXPECT_EQ(chat["choices"][0]["finish_reason"], "length");
  const json text =
      ResponseJson(ApiKind::kCompletion, "x", 5, "doc", "hi", model::FinishReason::kStop, u);
  EXPECT_EQ(text["choices"][0]["text"], "hi");
  EXPECT_EQ(text["choices"][0]["finish_reason"], "stop");
  const json first = ChunkJson(ApiKind::kChat, "x", 5, "doc", "a", true, "");
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "a");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  const json last = ChunkJson(ApiKind::kChat, "x", 5, "doc", "", false, "stop");
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(last["choices"][0]["delta"].contains("role"));
}

TEST(OpenAiApi, SmolLM2ChatContinuationIsTheAgentsChatPrompt) {
  const char* p = std::getenv("POLYKV_SMOLLM2_GGUF");
  if (p == nullptr || !std::filesystem::exists(p)) GTEST_SKIP() << "POLYKV_SMOLLM2_GGUF is not set";
  auto m = model::LlamaModel::Load(p);
  ASSERT_TRUE(m.ok()) << m.status();
  auto text = RenderChatContinuation(*(*m)->tokenizer(), {{"user", "Who is Robert Boulter?"}});
  ASSERT_TRUE(text.ok()) << text.status();
  // client::ChatQuestionPrompt, what `polykv-cli agent --chat` feeds after the pool.
  EXPECT_EQ(*text, "<|im_start|>user\nWho is Robert Boulter?<|im_end|>\n<|im_start|>assistant\n");
  ParsedRequest r;
  ApiError e;
  ServeIdentity id = Id();
  const std::unique_ptr<model::BatchModel> batch = model::NewLlamaBatchModel(**m, nullptr, {});
  ASSERT_TRUE(ParseRequest(ApiKind::kChat,
                           R"({"messages":[{"role":"user","content":[{"type":"text",
                               "text":"Who is Robert Boulter?"}]}]})",
                           *batch, id, &r, &e))
      << e.message;
  EXPECT_EQ(r.session.prompt, *(*m)->tokenizer()->Encode(*text, false));
}

}  // namespace
}  // namespace polykv::cli::serve
