// ChatTemplate: the public face of the Jinja engine in jinja/ (parse once, render messages
// with the variables transformers' apply_chat_template passes).
#include "polykv/model/chat_template.h"

#include "absl/strings/str_cat.h"
#include "jinja/evaluator.h"

namespace polykv::model {
namespace {

Status Prefixed(const Status& s) {
  return Status(s.code(), absl::StrCat("chat template ", s.message()));
}

StatusOr<std::string> RenderValues(const jinja::Template& t, jinja::Value messages,
                                   const ChatRenderOptions& o) {
  jinja::Dict vars;
  vars.Set("messages", std::move(messages));
  vars.Set("tools", jinja::Value::None());
  vars.Set("documents", jinja::Value::None());
  vars.Set("add_generation_prompt", jinja::Value::Bool(o.add_generation_prompt));
  vars.Set("bos_token", jinja::Value::Str(o.bos_token));
  vars.Set("eos_token", jinja::Value::Str(o.eos_token));
  for (const auto& [name, json] : o.extra_json) {
    auto v = jinja::FromJson(json);
    if (!v.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chat template variable '", name, "': ", v.status().message()));
    }
    vars.Set(name, *std::move(v));
  }
  auto out = t.Render(vars);
  if (!out.ok()) return Prefixed(out.status());
  return out;
}

}  // namespace

StatusOr<ChatTemplate> ChatTemplate::Parse(std::string source) {
  auto t = jinja::Template::Compile(source);
  if (!t.ok()) return Prefixed(t.status());
  ChatTemplate c;
  c.source_ = std::move(source);
  c.impl_ = *std::move(t);
  return c;
}

StatusOr<std::string> ChatTemplate::Render(absl::Span<const ChatMessage> messages,
                                           const ChatRenderOptions& options) const {
  std::vector<jinja::Value> list;
  for (const ChatMessage& m : messages) {
    jinja::Dict d;
    d.Set("role", jinja::Value::Str(m.role));
    d.Set("content", jinja::Value::Str(m.content));
    list.push_back(jinja::Value::MakeDict(std::move(d)));
  }
  return RenderValues(*impl_, jinja::Value::List(std::move(list)), options);
}

StatusOr<std::string> ChatTemplate::RenderJson(std::string_view messages_json,
                                               const ChatRenderOptions& options) const {
  auto v = jinja::FromJson(messages_json);
  if (!v.ok())
    return absl::InvalidArgumentError(absl::StrCat("chat messages: ", v.status().message()));
  if (!v->is_list()) return absl::InvalidArgumentError("chat messages: expected a JSON array");
  return RenderValues(*impl_, *std::move(v), options);
}

}  // namespace polykv::model
