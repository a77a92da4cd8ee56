// The OpenAI-compatible wire format of `polykv-cli agents serve`: request bodies of
// POST /v1/completions and /v1/chat/completions parsed into a model::SessionRequest, and the
// response objects (whole and streamed chunks) and error objects built as JSON. Pure
// functions: no socket, no engine (tests/unit/cli/openai_api_test.cc).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "polykv/model/batch_engine.h"
#include "polykv/model/llama.h"
#include "polykv/status.h"

namespace polykv::cli::serve {

/// Which endpoint a request came to.
enum class ApiKind : uint8_t {
  kCompletion = 0,  ///< POST /v1/completions (prompt: text or token ids)
  kChat = 1,        ///< POST /v1/chat/completions (messages, rendered by the chat template)
};

/// A request error as OpenAI reports it: HTTP status, message, type, the field at fault and
/// a code ({"error":{"message","type","param","code"}}).
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  ///< "" = null
  std::string code;   ///< "" = null
};

/// {"error":{...}} of `e`.
nlohmann::json ErrorJson(const ApiError& e);

/// A parsed request.
struct ParsedRequest {
  model::SessionRequest session;
  bool stream = false;
  bool include_usage = false;  ///< stream_options.include_usage
  std::string model;           ///< as sent ("" when absent)
  /// PolyKV extension "return_token_ids": choices[0].token_ids carries the generated ids
  /// (whole responses: all; chunks: the chunk's).
  bool return_token_ids = false;
};

/// What the server is: the names a request's `model` may use and its defaults.
struct ServeIdentity {
  std::string model_alias;  ///< the id listed by GET /v1/models
  std::string pool_id;      ///< also accepted as `model`
  int32_t default_max_tokens = 256;
};

/// Renders chat `messages` as the continuation of the pool's document with the model's chat
/// template: the text the template adds after a system turn (the document's own turn, already
/// in the pool) for these messages and the assistant generation prompt. For SmolLM2 that is
/// "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n" (the single agent's --chat
/// prompt). Models without a template get ChatML. Errors: kInvalidArgument naming the
/// message at fault.
[[nodiscard]] StatusOr<std::string> RenderChatContinuation(
    const model::Tokenizer& tokenizer, const std::vector<model::ChatMessage>& messages);

/// Parses a request body of `kind`: model, prompt (text, or an array of token ids) or
/// messages (content as text or [{"type":"text","text":...}]), max_tokens /
/// max_completion_tokens, temperature (0 = greedy; default 1), top_p, seed, stop (string or
/// up to 4 strings), n (1 only), stream, stream_options.include_usage; and the extensions
/// ignore_eos (vLLM's: do not stop at end-of-generation tokens) and return_token_ids.
/// logprobs, top_logprobs, echo, best_of > 1, tools and suffix are refused (400 naming the
/// field); other unknown fields are ignored. `model` is the engine's (BatchEngine::model): its
/// tokenizer encodes text, its vocabulary bounds token ids. Returns an ApiError (400, or 404 for
/// an unknown model) for bad input.
[[nodiscard]] bool ParseRequest(ApiKind kind, const std::string& body,
                                const model::BatchModel& model, const ServeIdentity& id,
                                ParsedRequest* out, ApiError* error);

/// The usage object: prompt_tokens counts the pool's tokens too (cached_tokens of them).
nlohmann::json UsageJson(int64_t cached_tokens, int64_t prompt_tokens, int64_t completion_tokens);

/// A whole (non-streamed) response: "text_completion" or "chat.completion".
nlohmann::json ResponseJson(ApiKind kind, const std::string& id, int64_t created,
                            const std::string& model, const std::string& text,
                            model::FinishReason finish, const nlohmann::json& usage);

/// One streamed chunk: `text` as choices[0].text (completion) or choices[0].delta.content
/// (chat; the first chunk also carries role "assistant"); finish "" = null.
nlohmann::json ChunkJson(ApiKind kind, const std::string& id, int64_t created,
                         const std::string& model, const std::string& text, bool first,
                         const std::string& finish);

/// OpenAI's finish_reason for an engine reason: "stop" or "length" ("stop" otherwise).
std::string FinishReasonWord(model::FinishReason r);

}  // namespace polykv::cli::serve
