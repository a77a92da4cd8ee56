// Syntax tree of the chat-template Jinja engine: expressions and statements, each with the
// template line it came from (for error messages).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace polykv::model::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  ///< value
    kName,     ///< name
    kList,     ///< kids
    kTuple,    ///< kids
    kDict,     ///< kids: key0, value0, key1, value1 ...
    kGetAttr,  ///< kids[0].name
    kGetItem,  ///< kids[0][kids[1]]
    kSlice,    ///< kids[0][kids[1]:kids[2]:kids[3]] (null kids are omitted bounds)
    kCall,     ///< kids[0](kids[1..], kw_names for the trailing keyword kids)
    kFilter,   ///< kids[0] | name(kids[1..])
    kTest,     ///< kids[0] is [not] name(kids[1..]); negate
    kUnary,    ///< op kids[0]: "not", "-", "+"
    kBinary,   ///< kids[0] op kids[1]: + - * / // % ** ~ == != < > <= >= in "not in"
    kAnd,      ///< kids[0] and kids[1]
    kOr,       ///< kids[0] or kids[1]
    kCond,     ///< kids[0] if kids[1] else kids[2] (kids[2] null: undefined)
  };
  Kind kind;
  int line = 0;
  std::string name;  ///< name, attribute, filter/test name or operator
  Value value;       ///< literal
  bool negate = false;
  std::vector<ExprPtr> kids;
  std::vector<std::string> kw_names;  ///< call/filter/test keyword names for the last kids
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

/// An assignment target: a name, `ns.attr`, or a tuple of names.
struct Target {
  std::vector<std::string> names;  ///< one name, or several for tuple unpacking
  std::string attr;                ///< non-empty for `set ns.attr = ...`
};

struct Stmt {
  enum class Kind {
    kText,    ///< text
    kOutput,  ///< {{ expr }}
    kIf,      ///< branches: (cond, body)...; else_body
    kFor,     ///< target in expr [if filter]: body; else_body
    kSet,     ///< target = expr, or block set (expr null: body rendered)
    kMacro,   ///< name(params = defaults): body
    kBreak,
    kContinue,
    kGeneration,  ///< transformers' {% generation %}: body rendered as is
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;  ///< for-loop `if` filter
  Target target;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::string name;                 ///< macro name
  std::vector<std::string> params;  ///< macro parameters
  std::vector<ExprPtr> defaults;    ///< one per parameter (null: no default)
};

}  // namespace polykv::model::jinja
