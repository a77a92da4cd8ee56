// Jinja parser: recursive descent over the lexer's tokens, following jinja2's parser.py
// (condexpr > or > and > not > compare > + - > ~ > * / // % > ** > unary > postfix/filters).
#include "jinja/parser.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "jinja/builtins.h"

namespace polykv::model::jinja {
namespace {

class Parser {
 public:
  explicit Parser(const std::vector<Token>& t) : t_(t) {}

  StatusOr<Body> Top() {
    std::string end;
    POLYKV_ASSIGN_OR_RETURN(Body body, ParseBody({}, &end));
    return body;
  }

 private:
  const Token& Cur() const { return t_[pos_]; }
  const Token& Peek(size_t ahead = 1) const { return t_[std::min(pos_ + ahead, t_.size() - 1)]; }
  void Advance() {
    if (pos_ + 1 < t_.size()) ++pos_;
  }
  bool IsOp(const char* op) const { return Cur().kind == TokKind::kOp && Cur().text == op; }
  bool IsName(const char* n) const { return Cur().kind == TokKind::kName && Cur().text == n; }

  Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat("line ", Cur().line, ": ", what));
  }
  Status Unsupported(const std::string& what, int line) const {
    return absl::UnimplementedError(absl::StrCat("line ", line, ": unsupported ", what));
  }
  std::string Describe(const Token& t) const {
    switch (t.kind) {
      case TokKind::kEof:
        return "end of template";
      case TokKind::kBlockEnd:
        return "'%}'";
      case TokKind::kVarEnd:
        return "'}}'";
      case TokKind::kString:
        return "string literal";
      default:
        return absl::StrCat("'", t.text, "'");
    }
  }
  Status ExpectOp(const char* op) {
    if (!IsOp(op)) return Error(absl::StrCat("expected '", op, "', found ", Describe(Cur())));
    Advance();
    return absl::OkStatus();
  }
  Status ExpectBlockEnd() {
    if (Cur().kind != TokKind::kBlockEnd) {
      return Error(absl::StrCat("expected '%}', found ", Describe(Cur())));
    }
    Advance();
    return absl::OkStatus();
  }
  StatusOr<std::string> ExpectName() {
    if (Cur().kind != TokKind::kName) {
      return Error(absl::StrCat("expected a name, found ", Describe(Cur())));
    }
    std::string n = Cur().text;
    Advance();
    return n;
  }

  ExprPtr Node(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // Statements until a {% tag %} named in `ends` (consumed up to and including its name;
  // its name goes to *end). With no `ends`, runs to the end of the template.
  StatusOr<Body> ParseBody(const std::set<std::string>& ends, std::string* end) {
    Body body;
    while (true) {
      const Token& tok = Cur();
      if (tok.kind == TokKind::kEof) {
        if (ends.empty()) return body;
        return Error(absl::StrCat("unexpected end of template, expected ",
                                  absl::StrJoin(ends, " or "), " for the block opened at line ",
                                  open_lines_.empty() ? 0 : open_lines_.back()));
      }
      if (tok.kind == TokKind::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->line = tok.line;
        s->text = tok.text;
        body.push_back(std::move(s));
        Advance();
      } else if (tok.kind == TokKind::kVarBegin) {
        Advance();
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->line = tok.line;
        POLYKV_ASSIGN_OR_RETURN(s->expr, ParseTuple(true));
        if (Cur().kind != TokKind::kVarEnd) {
          return Error(absl::StrCat("expected '}}', found ", Describe(Cur())));
        }
        Advance();
        body.push_back(std::move(s));
      } else if (tok.kind == TokKind::kBlockBegin) {
        Advance();
        if (Cur().kind != TokKind::kName) return Error("expected a tag name after '{%'");
        const std::string name = Cur().text;
        if (ends.count(name)) {
          Advance();
          *end = name;
          return body;
        }
        POLYKV_ASSIGN_OR_RETURN(StmtPtr s, ParseStatement());
        body.push_back(std::move(s));
      } else {
        return Error(absl::StrCat("unexpected ", Describe(tok)));
      }
    }
  }

  StatusOr<StmtPtr> ParseStatement() {
    const int line = Cur().line;
    const std::string tag = Cur().text;
    Advance();
    auto s = std::make_unique<Stmt>();
    s->line = line;
    if (tag == "if") return ParseIf(std::move(s));
    if (tag == "for") return ParseFor(std::move(s));
    if (tag == "set") return ParseSet(std::move(s));
    if (tag == "macro") return ParseMacro(std::move(s));
    if (tag == "break" || tag == "continue") {
      s->kind = tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      if (loop_depth_ == 0) return Error(absl::StrCat("'", tag, "' outside of a for loop"));
      POLYKV_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (tag == "generation") {
      s->kind = Stmt::Kind::kGeneration;
      POLYKV_RETURN_IF_ERROR(ExpectBlockEnd());
      std::string end;
      open_lines_.push_back(line);
      POLYKV_ASSIGN_OR_RETURN(s->body, ParseBody({"endgeneration"}, &end));
      open_lines_.pop_back();
      POLYKV_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    static const std::set<std::string> kJinjaTags = {
        "call", "filter",     "include", "import", "from",      "extends", "block",
        "with", "autoescape", "do",      "trans",  "pluralize", "print"};
    if (kJinjaTags.count(tag)) return Unsupported(absl::StrCat("tag '", tag, "'"), line);
    return absl::InvalidArgumentError(absl::StrCat("line ", line, ": unknown tag '", tag, "'"));
  }

  // The end of an if or for block whose branches ended at the tag `end`: an {% else %} body
  // up to `closer` when `end` is "else", then the closing tag's end; pops the block's line.
  StatusOr<StmtPtr> FinishBlock(StmtPtr s, std::string end, const char* closer) {
    if (end == "else") {
      POLYKV_RETURN_IF_ERROR(ExpectBlockEnd());
      POLYKV_ASSIGN_OR_RETURN(s->else_body, ParseBody({closer}, &end));
    }
    open_lines_.pop_back();
    POLYKV_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  StatusOr<StmtPtr> ParseIf(StmtPtr s) {
    s->kind = Stmt::Kind::kIf;
    open_lines_.push_back(s->line);
    std::string end = "if";
    while (end == "if" || end == "elif") {
      POLYKV_ASSIGN_OR_RETURN(ExprPtr cond, ParseTuple(true));
      POLYKV_RETURN_IF_ERROR(ExpectBlockEnd());
      POLYKV_ASSIGN_OR_RETURN(Body body, ParseBody({"elif", "else", "endif"}, &end));
      s->branches.emplace_back(std::move(cond), std::move(body));
    }
    return FinishBlock(std::move(s), end, "endif");
  }

  StatusOr<Target> ParseTarget(bool allow_attr) {
    Target t;
    POLYKV_ASSIGN_OR_RETURN(std::string first, ExpectName());
    t.names.push_back(first);
    if (allow_attr && IsOp(".")) {
      Advance();
      POLYKV_ASSIGN_OR_RETURN(t.attr, ExpectName());
      return t;
    }
    while (IsOp(",")) {
      Advance();
      if (Cur().kind != TokKind::kName) break;
      POLYKV_ASSIGN_OR_RETURN(std::string n, ExpectName());
      t.names.push_back(n);
    }
    return t;
  }

  StatusOr<StmtPtr> ParseFor(StmtPtr s) {
    s->kind = Stmt::Kind::kFor;
    if (IsOp("(")) return Unsupported("parenthesized for-loop target", s->line);
    POLYKV_ASSIGN_OR_RETURN(s->target, ParseTarget(false));
    if (!IsName("in")) return Error(absl::StrCat("expected 'in', found ", Describe(Cur())));
    Advance();
    POLYKV_ASSIGN_OR_RETURN(s->expr, ParseTuple(false));
    if (IsName("if")) {
      Advance();
      POLYKV_ASSIGN_OR_RETURN(s->filter, ParseExpr(true));
    }
    if (IsName("recursive")) return Unsupported("recursive for loop", s->line);
    POLYKV_RETURN_IF_ERROR(ExpectBlockEnd());
    open_lines_.push_back(s->line);
    ++loop_depth_;
    std::string end;
    POLYKV_ASSIGN_OR_RETURN(s->body, ParseBody({"else", "endfor"}, &end));
    --loop_depth_;
    return FinishBlock(std::move(s), end, "endfor");
  }

  StatusOr<StmtPtr> ParseSet(StmtPtr s) {
    s->kind = Stmt::Kind::kSet;
    POLYKV_ASSIGN_OR_RETURN(s->target, ParseTarget(true));
    if (IsOp("=")) {
      Advance();
      POLYKV_ASSIGN_OR_RETURN(s->expr, ParseTuple(true));
      POLYKV_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (IsOp("|")) return Unsupported("filtered block set", s->line);
    if (s->target.names.size() != 1 || !s->target.attr.empty()) {
      return Error("a block set assigns one name");
    }
    POLYKV_RETURN_IF_ERROR(ExpectBlockEnd());
    open_lines_.push_back(s->line);
    std::string end;
    POLYKV_ASSIGN_OR_RETURN(s->body, ParseBody({"endset"}, &end));
    open_lines_.pop_back();
    POLYKV_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  StatusOr<StmtPtr> ParseMacro(StmtPtr s) {
    s->kind = Stmt::Kind::kMacro;
    POLYKV_ASSIGN_OR_RETURN(s->name, ExpectName());
    POLYKV_RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      POLYKV_ASSIGN_OR_RETURN(std::string p, ExpectName());
      s->params.push_back(p);
      ExprPtr def;
      if (IsOp("=")) {
        Advance();
        POLYKV_ASSIGN_OR_RETURN(def, ParseExpr(true));
      }
      s->defaults.push_back(std::move(def));
      if (!IsOp(",")) break;
      Advance();
    }
    POLYKV_RETURN_IF_ERROR(ExpectOp(")"));
    POLYKV_RETURN_IF_ERROR(ExpectBlockEnd());
    open_lines_.push_back(s->line);
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    std::string end;
    POLYKV_ASSIGN_OR_RETURN(s->body, ParseBody({"endmacro"}, &end));
    loop_depth_ = saved_loops;
    open_lines_.pop_back();
    POLYKV_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  // expr [, expr ...] -> a tuple when there is a comma.
  StatusOr<ExprPtr> ParseTuple(bool condexpr) {
    const int line = Cur().line;
    POLYKV_ASSIGN_OR_RETURN(ExprPtr first, ParseExpr(condexpr));
    if (!IsOp(",")) return first;
    ExprPtr t = Node(Expr::Kind::kTuple, line);
    t->kids.push_back(std::move(first));
    while (IsOp(",")) {
      Advance();
      if (Cur().kind == TokKind::kBlockEnd || Cur().kind == TokKind::kVarEnd || IsOp(")")) break;
      POLYKV_ASSIGN_OR_RETURN(ExprPtr e, ParseExpr(condexpr));
      t->kids.push_back(std::move(e));
    }
    return t;
  }

  StatusOr<ExprPtr> ParseExpr(bool condexpr) {
    if (!condexpr) return ParseOr();
    const int line = Cur().line;
    POLYKV_ASSIGN_OR_RETURN(ExprPtr e, ParseOr());
    while (IsName("if")) {
      Advance();
      ExprPtr c = Node(Expr::Kind::kCond, line);
      POLYKV_ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
      ExprPtr other;
      if (IsName("else")) {
        Advance();
        POLYKV_ASSIGN_OR_RETURN(other, ParseExpr(true));
      }
      c->kids.push_back(std::move(e));
      c->kids.push_back(std::move(cond));
      c->kids.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  StatusOr<ExprPtr> ParseOr() {
    return ParseChain(
        Expr::Kind::kOr, [&] { return IsName("or"); }, &Parser::ParseAnd);
  }
  StatusOr<ExprPtr> ParseAnd() {
    return ParseChain(
        Expr::Kind::kAnd, [&] { return IsName("and"); }, &Parser::ParseNot);
  }

  StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      ExprPtr n = Node(Expr::Kind::kUnary, Cur().line);
      n->name = "not";
      Advance();
      POLYKV_ASSIGN_OR_RETURN(ExprPtr x, ParseNot());
      n->kids.push_back(std::move(x));
      return n;
    }
    return ParseCompare();
  }

  // Returns the comparison operator at the cursor ("" if none), consuming it.
  std::string TakeCompareOp() {
    static const std::set<std::string> kOps = {"==", "!=", "<", ">", "<=", ">="};
    if (Cur().kind == TokKind::kOp && kOps.count(Cur().text)) {
      std::string op = Cur().text;
      Advance();
      return op;
    }
    if (IsName("in")) {
      Advance();
      return "in";
    }
    if (IsName("not") && Peek().kind == TokKind::kName && Peek().text == "in") {
      Advance();
      Advance();
      return "not in";
    }
    return "";
  }

  StatusOr<ExprPtr> ParseCompare() {
    const int line = Cur().line;
    POLYKV_ASSIGN_OR_RETURN(ExprPtr e, ParseMath1());
    std::string op = TakeCompareOp();
    if (op.empty()) return e;
    ExprPtr n = Node(Expr::Kind::kBinary, line);
    n->name = op;
    POLYKV_ASSIGN_OR_RETURN(ExprPtr r, ParseMath1());
    n->kids.push_back(std::move(e));
    n->kids.push_back(std::move(r));
    if (!TakeCompareOp().empty()) return Unsupported("chained comparison", line);
    return n;
  }

  // A left-associative chain `next (operator next)*`: `at_operator` says whether the token at
  // the cursor is one of the chain's operators; each becomes a node of `kind` (a kBinary node
  // is named by its operator).
  template <typename AtOperator, typename Next>
  StatusOr<ExprPtr> ParseChain(Expr::Kind kind, AtOperator at_operator, Next next) {
    POLYKV_ASSIGN_OR_RETURN(ExprPtr e, (this->*next)());
    while (at_operator()) {
      ExprPtr n = Node(kind, Cur().line);
      if (kind == Expr::Kind::kBinary) n->name = Cur().text;
      Advance();
      POLYKV_ASSIGN_OR_RETURN(ExprPtr r, (this->*next)());
      n->kids.push_back(std::move(e));
      n->kids.push_back(std::move(r));
      e = std::move(n);
    }
    return e;
  }
  template <typename Next>
  StatusOr<ExprPtr> ParseLeftAssoc(const std::set<std::string>& ops, Next next) {
    return ParseChain(
        Expr::Kind::kBinary,
        [&] { return Cur().kind == TokKind::kOp && ops.count(Cur().text) > 0; }, next);
  }
  StatusOr<ExprPtr> ParseMath1() { return ParseLeftAssoc({"+", "-"}, &Parser::ParseConcat); }
  StatusOr<ExprPtr> ParseConcat() { return ParseLeftAssoc({"~"}, &Parser::ParseMath2); }
  StatusOr<ExprPtr> ParseMath2() {
    return ParseLeftAssoc({"*", "/", "//", "%"}, &Parser::ParsePow);
  }
  StatusOr<ExprPtr> ParsePow() { return ParseLeftAssoc({"**"}, &Parser::ParseUnaryFiltered); }
  StatusOr<ExprPtr> ParseUnaryFiltered() { return ParseUnary(true); }

  StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      e = Node(Expr::Kind::kUnary, Cur().line);
      e->name = Cur().text;
      Advance();
      POLYKV_ASSIGN_OR_RETURN(ExprPtr x, ParseUnary(false));
      e->kids.push_back(std::move(x));
    } else {
      POLYKV_ASSIGN_OR_RETURN(e, ParsePrimary());
      POLYKV_ASSIGN_OR_RETURN(e, ParsePostfix(std::move(e)));
    }
    if (with_filter) return ParseFilters(std::move(e));
    return e;
  }

  StatusOr<ExprPtr> ParsePrimary() {
    const Token& tok = Cur();
    const int line = tok.line;
    ExprPtr e = Node(Expr::Kind::kLiteral, line);
    switch (tok.kind) {
      case TokKind::kName:
        if (tok.text == "true" || tok.text == "True") {
          e->value = Value::Bool(true);
        } else if (tok.text == "false" || tok.text == "False") {
          e->value = Value::Bool(false);
        } else if (tok.text == "none" || tok.text == "None") {
          e->value = Value::None();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = tok.text;
        }
        Advance();
        return e;
      case TokKind::kString: {
        std::string s;
        while (Cur().kind == TokKind::kString) {
          s += Cur().text;
          Advance();
        }
        e->value = Value::Str(std::move(s));
        return e;
      }
      case TokKind::kInt:
        e->value = Value::Int(tok.i);
        Advance();
        return e;
      case TokKind::kFloat:
        e->value = Value::Float(tok.f);
        Advance();
        return e;
      default:
        break;
    }
    if (IsOp("(")) {
      Advance();
      if (IsOp(")")) {
        Advance();
        e->kind = Expr::Kind::kTuple;
        return e;
      }
      POLYKV_ASSIGN_OR_RETURN(ExprPtr inner, ParseTuple(true));
      POLYKV_RETURN_IF_ERROR(ExpectOp(")"));
      return inner;
    }
    if (IsOp("[") || IsOp("{")) {
      const bool dict = IsOp("{");
      e->kind = dict ? Expr::Kind::kDict : Expr::Kind::kList;
      Advance();
      const char* close = dict ? "}" : "]";
      while (!IsOp(close)) {
        POLYKV_ASSIGN_OR_RETURN(ExprPtr item, ParseExpr(true));
        e->kids.push_back(std::move(item));
        if (dict) {
          POLYKV_RETURN_IF_ERROR(ExpectOp(":"));
          POLYKV_ASSIGN_OR_RETURN(ExprPtr v, ParseExpr(true));
          e->kids.push_back(std::move(v));
        }
        if (!IsOp(",")) break;
        Advance();
      }
      POLYKV_RETURN_IF_ERROR(ExpectOp(close));
      return e;
    }
    return Error(absl::StrCat("unexpected ", Describe(tok)));
  }

  StatusOr<ExprPtr> ParsePostfix(ExprPtr e) {
    while (true) {
      const int line = Cur().line;
      if (IsOp(".")) {
        Advance();
        ExprPtr n;
        if (Cur().kind == TokKind::kInt) {
          n = Node(Expr::Kind::kGetItem, line);
          n->kids.push_back(std::move(e));
          ExprPtr idx = Node(Expr::Kind::kLiteral, line);
          idx->value = Value::Int(Cur().i);
          n->kids.push_back(std::move(idx));
          Advance();
        } else {
          n = Node(Expr::Kind::kGetAttr, line);
          POLYKV_ASSIGN_OR_RETURN(n->name, ExpectName());
          n->kids.push_back(std::move(e));
        }
        e = std::move(n);
      } else if (IsOp("[")) {
        Advance();
        POLYKV_ASSIGN_OR_RETURN(e, ParseSubscript(std::move(e), line));
      } else if (IsOp("(")) {
        POLYKV_ASSIGN_OR_RETURN(e, ParseCall(std::move(e), Expr::Kind::kCall, line));
      } else {
        return e;
      }
    }
  }

  StatusOr<ExprPtr> ParseSubscript(ExprPtr obj, int line) {
    ExprPtr parts[3];
    int n = 0;
    bool slice = false;
    while (true) {
      if (IsOp(":")) {
        slice = true;
        if (++n > 2) return Error("too many ':' in a slice");
        Advance();
        continue;
      }
      if (IsOp("]")) break;
      if (parts[n]) return Error(absl::StrCat("expected ']', found ", Describe(Cur())));
      POLYKV_ASSIGN_OR_RETURN(parts[n], ParseExpr(true));
    }
    Advance();
    ExprPtr e = Node(slice ? Expr::Kind::kSlice : Expr::Kind::kGetItem, line);
    e->kids.push_back(std::move(obj));
    if (!slice && !parts[0]) return Error("empty subscript");
    for (int k = 0; k < (slice ? 3 : 1); ++k) e->kids.push_back(std::move(parts[k]));
    return e;
  }

  // Appends `(args)` to a call/filter/test node whose kids already hold the callee/operand.
  Status ParseArgs(Expr* n) {
    POLYKV_RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (IsOp("*") || IsOp("**")) return Unsupported("*args/**kwargs in a call", Cur().line);
      if (Cur().kind == TokKind::kName && Peek().kind == TokKind::kOp && Peek().text == "=") {
        n->kw_names.push_back(Cur().text);
        Advance();
        Advance();
      } else if (!n->kw_names.empty()) {
        return Error("positional argument after a keyword argument");
      }
      POLYKV_ASSIGN_OR_RETURN(ExprPtr a, ParseExpr(true));
      n->kids.push_back(std::move(a));
      if (!IsOp(",")) break;
      Advance();
    }
    return ExpectOp(")");
  }

  StatusOr<ExprPtr> ParseCall(ExprPtr callee, Expr::Kind kind, int line) {
    ExprPtr n = Node(kind, line);
    n->kids.push_back(std::move(callee));
    POLYKV_RETURN_IF_ERROR(ParseArgs(n.get()));
    return n;
  }

  StatusOr<ExprPtr> ParseFilters(ExprPtr e) {
    while (true) {
      const int line = Cur().line;
      if (IsOp("|")) {
        Advance();
        POLYKV_ASSIGN_OR_RETURN(std::string name, ExpectName());
        if (!IsKnownFilter(name)) return Unsupported(absl::StrCat("filter '", name, "'"), line);
        ExprPtr n = Node(Expr::Kind::kFilter, line);
        n->name = name;
        n->kids.push_back(std::move(e));
        if (IsOp("(")) {
          POLYKV_RETURN_IF_ERROR(ParseArgs(n.get()));
        }
        e = std::move(n);
      } else if (IsName("is")) {
        Advance();
        ExprPtr n = Node(Expr::Kind::kTest, line);
        if (IsName("not")) {
          n->negate = true;
          Advance();
        }
        POLYKV_ASSIGN_OR_RETURN(n->name, ExpectName());
        if (!IsKnownTest(n->name)) return Unsupported(absl::StrCat("test '", n->name, "'"), line);
        n->kids.push_back(std::move(e));
        if (IsOp("(")) {
          POLYKV_RETURN_IF_ERROR(ParseArgs(n.get()));
        } else if ((Cur().kind == TokKind::kName && !IsName("else") && !IsName("or") &&
                    !IsName("and") && !IsName("if") && !IsName("in") && !IsName("not")) ||
                   Cur().kind == TokKind::kString || Cur().kind == TokKind::kInt ||
                   Cur().kind == TokKind::kFloat || IsOp("[") || IsOp("{")) {
          POLYKV_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          POLYKV_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
          n->kids.push_back(std::move(arg));
        }
        e = std::move(n);
      } else if (IsOp("(")) {
        POLYKV_ASSIGN_OR_RETURN(e, ParseCall(std::move(e), Expr::Kind::kCall, line));
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
  std::vector<int> open_lines_;
};

}  // namespace

StatusOr<Body> Parse(const std::vector<Token>& tokens) { return Parser(tokens).Top(); }

}  // namespace polykv::model::jinja
