// Chat templates: the Jinja template a model ships (GGUF tokenizer.chat_template, HF
// tokenizer_config.json chat_template) rendered by a small Jinja engine inside PolyKV, with
// the environment transformers' apply_chat_template uses (jinja2 sandbox, trim_blocks and
// lstrip_blocks, loop controls, raise_exception, strftime_now, tojson without HTML escaping).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "polykv/status.h"

namespace polykv::model {

namespace jinja {
class Template;
}

/// One chat turn.
struct ChatMessage {
  std::string role;  ///< "system", "user" or "assistant"
  std::string content;
};

/// What a template is rendered with besides the messages.
struct ChatRenderOptions {
  /// Append the opening of an assistant turn (the template's add_generation_prompt).
  bool add_generation_prompt = true;
  std::string bos_token;  ///< text of the model's BOS token ("" when it has none)
  std::string eos_token;  ///< text of the model's EOS token
  /// More template variables: name -> JSON text, e.g. {"tools", "[{...}]"} or
  /// {"date_string", "\"26 Jul 2024\""}. `tools` and `documents` default to none, as
  /// transformers passes them.
  std::vector<std::pair<std::string, std::string>> extra_json;
};

/// A parsed chat template; cheap to copy, immutable, thread-safe.
///
/// Supported jinja2 subset: {{ }}, {% %}, {# #}, '-'/'+' whitespace control; if/elif/else,
/// for (loop.index/index0/revindex/first/last/length/previtem/nextitem/cycle, `if` filter,
/// else, tuple targets), set (names, tuples, ns.attr, block set), macro, break/continue,
/// {% generation %}; literals, lists, tuples, dicts; + - * / // % ** ~, comparisons, in /
/// not in, and/or/not, inline if/else, subscripts and slices, attribute access; filters
/// abs capitalize count default/d first float int items join last length list lower map
/// reject rejectattr replace reverse safe select selectattr string title tojson trim upper;
/// tests defined undefined none boolean true false integer float number string mapping
/// iterable sequence callable sameas equalto/eq ne lt le gt ge in odd even divisibleby lower
/// upper; str methods strip lstrip rstrip split startswith endswith upper lower title
/// capitalize replace find count join removeprefix removesuffix isdigit isalpha isspace
/// islower isupper; dict items keys values get; list count index; globals range namespace
/// dict raise_exception strftime_now. Case mapping covers ASCII letters only.
class ChatTemplate {
 public:
  /// Parses `source`. Errors: kInvalidArgument "chat template line N: ..." for syntax
  /// errors; kUnimplemented "chat template line N: unsupported ..." naming a jinja2
  /// construct outside the subset (a tag, filter, test, chained comparison ...).
  [[nodiscard]] static StatusOr<ChatTemplate> Parse(std::string source);

  /// Renders `messages` (each a {"role", "content"} dict). Errors: kInvalidArgument naming
  /// the line for runtime errors, and "chat template line N: template raised an exception:
  /// MSG" for raise_exception(MSG); kInvalidArgument for malformed extra_json;
  /// kUnimplemented for unsupported operations met at run time.
  [[nodiscard]] StatusOr<std::string> Render(absl::Span<const ChatMessage> messages,
                                             const ChatRenderOptions& options) const;

  /// As Render, with the messages as a JSON array of objects (tool_calls and any other
  /// fields the template reads). Errors: also kInvalidArgument for malformed JSON.
  [[nodiscard]] StatusOr<std::string> RenderJson(std::string_view messages_json,
                                                 const ChatRenderOptions& options) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::shared_ptr<const jinja::Template> impl_;
};

}  // namespace polykv::model
