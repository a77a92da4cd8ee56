// OpenAI-compatible request parsing and response JSON of `polykv-cli agents serve`.
#include "serve/openai_api.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "polykv/model/chat_template.h"
#include "polykv/model/tokenizer.h"

namespace polykv::cli::serve {
namespace {

using nlohmann::json;

json NullOr(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

bool Fail(ApiError* e, std::string message, std::string param, int status = 400,
          std::string code = "") {
  e->http_status = status;
  e->message = std::move(message);
  e->param = std::move(param);
  e->code = std::move(code);
  e->type = "invalid_request_error";
  return false;
}

// A number field within [lo, hi], or absent (keeps *out).
bool NumberField(const json& body, const char* name, double lo, double hi, double* out,
                 ApiError* e) {
  if (!body.contains(name) || body[name].is_null()) return true;
  if (!body[name].is_number()) return Fail(e, absl::StrCat("'", name, "' must be a number"), name);
  const double v = body[name].get<double>();
  if (!(v >= lo && v <= hi))
    return Fail(e, absl::StrCat("'", name, "' must be in [", lo, ", ", hi, "], got ", v), name);
  *out = v;
  return true;
}

// Text of a message's content: a string, or an array of {"type":"text","text":...} parts.
bool ContentText(const json& content, size_t index, std::string* out, ApiError* e) {
  const std::string param = absl::StrCat("messages[", index, "].content");
  if (content.is_string()) {
    *out = content.get<std::string>();
    return true;
  }
  if (content.is_array()) {
    out->clear();
    for (const json& part : content) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
          !part["text"].is_string())
        return Fail(e, "only text content parts ({\"type\":\"text\",\"text\":...}) are supported",
                    param);
      *out += part["text"].get<std::string>();
    }
    return true;
  }
  return Fail(e, "message content must be a string or an array of text parts", param);
}

bool ParsePrompt(ApiKind kind, const json& body, const model::BatchModel& model,
                 std::vector<int32_t>* prompt, ApiError* e) {
  const model::Tokenizer* tok = model.tokenizer();
  std::string text;
  if (kind == ApiKind::kChat) {
    if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
      return Fail(e, "'messages' must be a non-empty array", "messages");
    std::vector<model::ChatMessage> messages;
    for (size_t i = 0; i < body["messages"].size(); ++i) {
      const json& m = body["messages"][i];
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        return Fail(e, absl::StrCat("messages[", i, "] needs a string 'role'"),
                    absl::StrCat("messages[", i, "].role"));
      model::ChatMessage cm;
      cm.role = m["role"].get<std::string>();
      if (cm.role != "system" && cm.role != "user" && cm.role != "assistant" &&
          cm.role != "developer")
        return Fail(e, absl::StrCat("messages[", i, "].role '", cm.role, "' is not supported"),
                    absl::StrCat("messages[", i, "].role"));
      if (cm.role == "developer") cm.role = "system";
      if (!m.contains("content") || !ContentText(m["content"], i, &cm.content, e)) {
        if (e->message.empty()) Fail(e, "message without content", "messages");
        return false;
      }
      messages.push_back(std::move(cm));
    }
    if (tok == nullptr) return Fail(e, "this model has no tokenizer: use /v1/completions", "");
    StatusOr<std::string> rendered = RenderChatContinuation(*tok, messages);
    if (!rendered.ok()) return Fail(e, std::string(rendered.status().message()), "messages");
    text = std::move(*rendered);
  } else {
    if (!body.contains("prompt")) return Fail(e, "'prompt' is required", "prompt");
    const json& p = body["prompt"];
    if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      text = p[0].get<std::string>();
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      for (const json& id : p) {
        if (!id.is_number_integer())
          return Fail(e, "a token-id prompt holds integers only", "prompt");
        const int64_t v = id.get<int64_t>();
        if (v < 0 || v >= model.config().vocab)
          return Fail(e, absl::StrCat("token id ", v, " is outside the vocabulary"), "prompt");
        prompt->push_back(static_cast<int32_t>(v));
      }
      return true;
    } else if (p.is_string()) {
      text = p.get<std::string>();
    } else {
      return Fail(e, "'prompt' must be a string, [string] or an array of token ids", "prompt");
    }
    if (tok == nullptr)
      return Fail(e, "this model has no tokenizer: give the prompt as token ids", "prompt");
  }
  StatusOr<std::vector<int32_t>> ids = tok->Encode(text, /*add_bos=*/false);
  if (!ids.ok()) return Fail(e, std::string(ids.status().message()), "prompt");
  if (ids->empty())
    return Fail(e, "the prompt is empty", kind == ApiKind::kChat ? "messages" : "prompt");
  *prompt = std::move(*ids);
  return true;
}

bool ParseStop(const json& body, std::vector<std::string>* stop, ApiError* e) {
  if (!body.contains("stop") || body["stop"].is_null()) return true;
  const json& s = body["stop"];
  if (s.is_string()) {
    stop->push_back(s.get<std::string>());
  } else if (s.is_array() && s.size() <= 4) {
    for (const json& x : s) {
      if (!x.is_string()) return Fail(e, "'stop' entries must be strings", "stop");
      stop->push_back(x.get<std::string>());
    }
  } else {
    return Fail(e, "'stop' must be a string or an array of up to 4 strings", "stop");
  }
  for (const std::string& x : *stop)
    if (x.empty()) return Fail(e, "'stop' strings must not be empty", "stop");
  return true;
}

}  // namespace

json ErrorJson(const ApiError& e) {
  return json{{"error",
               {{"message", e.message},
                {"type", e.type},
                {"param", NullOr(e.param)},
                {"code", NullOr(e.code)}}}};
}

StatusOr<std::string> RenderChatContinuation(const model::Tokenizer& tokenizer,
                                             const std::vector<model::ChatMessage>& messages) {
  // The document's system turn is already in the pool: render it with and without the
  // request's messages and keep what they add.
  const model::ChatMessage anchor{"system", "polykv-document"};
  std::vector<model::ChatMessage> with = {anchor};
  with.insert(with.end(), messages.begin(), messages.end());
  StatusOr<std::string> full = tokenizer.ApplyChatTemplate(with, true);
  StatusOr<std::string> head = tokenizer.ApplyChatTemplate({anchor}, false);
  if (full.ok() && head.ok() && full->compare(0, head->size(), *head) == 0)
    return full->substr(head->size());
  if (!full.ok() && full.status().code() != absl::StatusCode::kUnimplemented) return full.status();
  // No template (or one that does not extend its own prefix): ChatML.
  std::string out;
  for (const model::ChatMessage& m : messages)
    absl::StrAppend(&out, "<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n");
  absl::StrAppend(&out, "<|im_start|>assistant\n");
  return out;
}

bool ParseRequest(ApiKind kind, const std::string& body_text, const model::BatchModel& model,
                  const ServeIdentity& id, ParsedRequest* out, ApiError* e) {
  const json body = json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object())
    return Fail(e, "the request body must be a JSON object", "");
  if (body.contains("model") && !body["model"].is_null()) {
    if (!body["model"].is_string()) return Fail(e, "'model' must be a string", "model");
    out->model = body["model"].get<std::string>();
    if (out->model != id.model_alias && out->model != id.pool_id)
      return Fail(e,
                  absl::StrCat("The model '", out->model, "' does not exist (this server has '",
                               id.model_alias, "' on pool ", id.pool_id, ")"),
                  "model", 404, "model_not_found");
  }
  if (body.contains("n") && !(body["n"].is_number_integer() && body["n"].get<int64_t>() == 1))
    return Fail(e, "only n = 1 is supported", "n");
  for (const char* name : {"logprobs", "top_logprobs", "echo", "best_of", "tools", "suffix"}) {
    const bool asked = body.contains(name) && !body[name].is_null() &&
                       !(body[name].is_boolean() && !body[name].get<bool>()) &&
                       !(std::string(name) == "best_of" && body[name] == 1) &&
                       !(std::string(name) == "tools" && body[name].empty());
    if (asked) return Fail(e, absl::StrCat("'", name, "' is not supported by this server"), name);
  }
  if (!ParsePrompt(kind, body, model, &out->session.prompt, e)) return false;
  model::SamplingOptions& s = out->session.sampling;
  double max_tokens = id.default_max_tokens, temperature = 1, top_p = 1;
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    if (body.contains(name) && !body[name].is_null() && !body[name].is_number_integer())
      return Fail(e, absl::StrCat("'", name, "' must be an integer"), name);
    if (!NumberField(body, name, 0, 1 << 20, &max_tokens, e)) return false;
  }
  if (!NumberField(body, "temperature", 0, 2, &temperature, e)) return false;
  if (!NumberField(body, "top_p", 0, 1, &top_p, e)) return false;
  if (top_p == 0) return Fail(e, "'top_p' must be > 0", "top_p");
  s.max_new_tokens = static_cast<int32_t>(max_tokens);
  s.greedy = temperature == 0;
  s.temperature = static_cast<float>(temperature);
  s.top_p = static_cast<float>(top_p);
  if (body.contains("seed") && !body["seed"].is_null()) {
    if (!body["seed"].is_number_integer()) return Fail(e, "'seed' must be an integer", "seed");
    s.seed = static_cast<uint64_t>(body["seed"].get<int64_t>());
  } else {
    s.seed = std::random_device{}();
  }
  s.stop_at_eos = true;
  for (const char* name : {"ignore_eos", "return_token_ids"}) {
    if (body.contains(name) && !body[name].is_null() && !body[name].is_boolean())
      return Fail(e, absl::StrCat("'", name, "' must be a boolean"), name);
  }
  if (body.value("ignore_eos", false)) s.stop_at_eos = false;
  out->return_token_ids = body.value("return_token_ids", false);
  if (!ParseStop(body, &out->session.stop, e)) return false;
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) return Fail(e, "'stream' must be a boolean", "stream");
    out->stream = body["stream"].get<bool>();
  }
  if (body.contains("stream_options") && body["stream_options"].is_object())
    out->include_usage = body["stream_options"].value("include_usage", false);
  return true;
}

json UsageJson(int64_t cached_tokens, int64_t prompt_tokens, int64_t completion_tokens) {
  return json{{"prompt_tokens", cached_tokens + prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", cached_tokens + prompt_tokens + completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

std::string FinishReasonWord(model::FinishReason r) {
  return r == model::FinishReason::kLength ? "length" : "stop";
}

namespace {

// What a response and a chunk share: id, object, created, model and their one choice.
json CompletionJson(const std::string& id, const char* object, int64_t created,
                    const std::string& model, json choice) {
  return json{{"id", id},
              {"object", object},
              {"created", created},
              {"model", model},
              {"choices", json::array({std::move(choice)})}};
}

}  // namespace

json ResponseJson(ApiKind kind, const std::string& id, int64_t created, const std::string& model,
                  const std::string& text, model::FinishReason finish, const json& usage) {
  json choice = {{"index", 0}, {"finish_reason", FinishReasonWord(finish)}, {"logprobs", nullptr}};
  if (kind == ApiKind::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  json j = CompletionJson(id, kind == ApiKind::kChat ? "chat.completion" : "text_completion",
                          created, model, std::move(choice));
  j["usage"] = usage;
  return j;
}

json ChunkJson(ApiKind kind, const std::string& id, int64_t created, const std::string& model,
               const std::string& text, bool first, const std::string& finish) {
  json choice = {{"index", 0}, {"finish_reason", NullOr(finish)}, {"logprobs", nullptr}};
  if (kind == ApiKind::kChat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || finish.empty()) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  return CompletionJson(id, kind == ApiKind::kChat ? "chat.completion.chunk" : "text_completion",
                        created, model, std::move(choice));
}

}  // namespace polykv::cli::serve
