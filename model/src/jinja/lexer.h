// Lexer of the chat-template Jinja engine: template text -> tokens, with jinja2's whitespace
// rules as transformers configures them (trim_blocks=True, lstrip_blocks=True, '-'/'+'
// markers, keep_trailing_newline=False, newlines normalized to "\n").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "polykv/status.h"

namespace polykv::model::jinja {

enum class TokKind {
  kText,        ///< literal template text (already whitespace-processed)
  kVarBegin,    ///< {{
  kVarEnd,      ///< }}
  kBlockBegin,  ///< {%
  kBlockEnd,    ///< %}
  kName,
  kString,  ///< text is the decoded string value
  kInt,
  kFloat,
  kOp,  ///< operator or punctuation: + - * / // % ** ~ == != < > <= >= = ( ) [ ] { } . , : |
  kEof,
};

struct Token {
  TokKind kind;
  std::string text;
  int64_t i = 0;
  double f = 0;
  int line = 1;
};

/// Tokens of `source`, ending with kEof. Errors: kInvalidArgument naming the line of an
/// unterminated tag, comment or string or an unexpected character; kUnimplemented for
/// {% raw %} blocks and line statements.
[[nodiscard]] StatusOr<std::vector<Token>> Lex(const std::string& source);

}  // namespace polykv::model::jinja
