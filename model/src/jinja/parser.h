// Parser of the chat-template Jinja engine: tokens -> statement tree, with jinja2's operator
// precedence (parser.py) and compile-time checks for unknown filters and tests.
#pragma once

#include <vector>

#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace polykv::model::jinja {

/// The template's top-level statements. Errors: kInvalidArgument naming the line of a syntax
/// error (unexpected token, unclosed or mismatched block, unknown tag); kUnimplemented naming
/// a jinja2 construct this engine does not support (include, call blocks, unknown filters or
/// tests, chained comparisons, *args ...) and its line.
[[nodiscard]] StatusOr<Body> Parse(const std::vector<Token>& tokens);

}  // namespace polykv::model::jinja
