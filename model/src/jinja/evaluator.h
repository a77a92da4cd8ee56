// Evaluator of the chat-template Jinja engine: renders a parsed template with a set of
// variables, following jinja2's scoping (for-loop bodies and macros have their own scope;
// namespace() objects are shared) and transformers' sandboxed environment.
#pragma once

#include <memory>
#include <string>

#include "jinja/ast.h"
#include "jinja/value.h"

namespace polykv::model::jinja {

class Template {
 public:
  /// Lexes and parses `source` (see Lex and Parse for the errors).
  [[nodiscard]] static StatusOr<std::shared_ptr<const Template>> Compile(const std::string& source);

  /// Renders with `vars` as the template's context. Thread-safe (no shared mutable state).
  /// Errors: kInvalidArgument naming the line for runtime errors (undefined values used,
  /// type errors, raise_exception(msg) whose message starts with kRaisedPrefix);
  /// kUnimplemented for unsupported operations found at run time (str % args ...).
  [[nodiscard]] StatusOr<std::string> Render(const Dict& vars) const;

 private:
  Body body_;
};

}  // namespace polykv::model::jinja
