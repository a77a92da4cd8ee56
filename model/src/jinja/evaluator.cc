// Jinja evaluator: executes statements and evaluates expressions over Values.
#include "jinja/evaluator.h"

#include <cmath>
#include <unordered_map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "jinja/builtins.h"
#include "jinja/lexer.h"
#include "jinja/parser.h"

namespace polykv::model::jinja {
namespace {

using Frame = std::unordered_map<std::string, Value>;

// Prefixes "line N: " unless the message already names a line.
Status AtLine(const Status& s, int line) {
  if (s.ok() || absl::StartsWith(s.message(), "line ")) return s;
  return Status(s.code(), absl::StrCat("line ", line, ": ", s.message()));
}

#define JINJA_ASSIGN_AT(lhs, expr, line)                         \
  auto POLYKV_CONCAT_(jv_, __LINE__) = (expr);                   \
  if (!POLYKV_CONCAT_(jv_, __LINE__).ok()) {                     \
    return AtLine(POLYKV_CONCAT_(jv_, __LINE__).status(), line); \
  }                                                              \
  lhs = std::move(POLYKV_CONCAT_(jv_, __LINE__)).value()

Status UndefinedUse(const Value& v, int line) {
  return absl::InvalidArgumentError(
      absl::StrCat("line ", line, ": ", v.s().empty() ? "value is undefined" : v.s()));
}

Status TypeError(const char* op, const Value& a, const Value& b, int line) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line,
                                                 ": unsupported operand type(s) for ", op, ": '",
                                                 a.TypeName(), "' and '", b.TypeName(), "'"));
}

StatusOr<Value> Arithmetic(const std::string& op, const Value& a, const Value& b, int line) {
  if (a.is_undefined()) return UndefinedUse(a, line);
  if (b.is_undefined()) return UndefinedUse(b, line);
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value::Str(a.s() + b.s());
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      std::vector<Value> items = a.list();
      items.insert(items.end(), b.list().begin(), b.list().end());
      return Value::List(std::move(items), a.is_tuple());
    }
  }
  if (op == "*" && ((a.is_string() || a.is_list()) && b.is_integer())) {
    std::vector<Value> items;
    std::string s;
    for (int64_t k = 0; k < b.i(); ++k) {
      if (a.is_string()) {
        s += a.s();
      } else {
        items.insert(items.end(), a.list().begin(), a.list().end());
      }
    }
    return a.is_string() ? Value::Str(s) : Value::List(std::move(items), a.is_tuple());
  }
  if (op == "%" && a.is_string()) {
    return absl::UnimplementedError(
        absl::StrCat("line ", line, ": unsupported printf-style '%' formatting"));
  }
  if (!a.is_number() || !b.is_number()) return TypeError(op.c_str(), a, b, line);
  const bool ints = a.is_integer() && b.is_integer();
  if ((op == "/" || op == "//" || op == "%") && (ints ? b.i() == 0 : b.f() == 0)) {
    return absl::InvalidArgumentError(absl::StrCat("line ", line, ": division by zero"));
  }
  if (op == "/") return Value::Float(a.f() / b.f());
  if (ints) {
    const int64_t x = a.i(), y = b.i();
    if (op == "+") return Value::Int(x + y);
    if (op == "-") return Value::Int(x - y);
    if (op == "*") return Value::Int(x * y);
    if (op == "//" || op == "%") {
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        --q;
        r += y;
      }
      return Value::Int(op == "//" ? q : r);
    }
    if (op == "**" && y >= 0) {
      int64_t p = 1;
      for (int64_t k = 0; k < y; ++k) p *= x;
      return Value::Int(p);
    }
  }
  const double x = a.f(), y = b.f();
  if (op == "+") return Value::Float(x + y);
  if (op == "-") return Value::Float(x - y);
  if (op == "*") return Value::Float(x * y);
  if (op == "//") return Value::Float(std::floor(x / y));
  if (op == "%") {
    double r = std::fmod(x, y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return Value::Float(r);
  }
  if (op == "**") return Value::Float(std::pow(x, y));
  return TypeError(op.c_str(), a, b, line);
}

StatusOr<bool> Contains(const Value& container, const Value& item, int line) {
  if (container.is_undefined()) return false;
  if (container.is_string()) {
    if (!item.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "line ", line, ": 'in <string>' requires string as left operand, not ", item.TypeName()));
    }
    return container.s().find(item.s()) != std::string::npos;
  }
  if (container.is_dict()) return item.is_string() && container.dict().Find(item.s()) != nullptr;
  if (container.is_list()) {
    for (const Value& x : container.list()) {
      if (Equal(x, item)) return true;
    }
    return false;
  }
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": argument of type '",
                                                 container.TypeName(), "' is not iterable"));
}

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  Renderer(const Dict& vars, std::string* out) : out_(out) {
    auto top = std::make_shared<Frame>();
    for (const auto& [k, v] : vars.items) (*top)[k] = v;
    frames_.push_back(std::move(top));
  }

  StatusOr<Flow> ExecBody(const Body& body) {
    for (const StmtPtr& s : body) {
      POLYKV_ASSIGN_OR_RETURN(Flow f, Exec(*s));
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

 private:
  StatusOr<Flow> Exec(const Stmt& s) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        *out_ += s.text;
        return Flow::kNormal;
      case Stmt::Kind::kOutput: {
        POLYKV_ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        *out_ += ToStr(v);
        return Flow::kNormal;
      }
      case Stmt::Kind::kIf:
        for (const auto& [cond, body] : s.branches) {
          POLYKV_ASSIGN_OR_RETURN(Value c, Eval(*cond));
          if (c.Truthy()) return ExecBody(body);
        }
        return ExecBody(s.else_body);
      case Stmt::Kind::kFor:
        return ExecFor(s);
      case Stmt::Kind::kSet:
        return ExecSet(s);
      case Stmt::Kind::kMacro:
        DefineMacro(s);
        return Flow::kNormal;
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kGeneration:
        return ExecBody(s.body);
    }
    return Flow::kNormal;
  }

  Status Bind(const Target& t, const Value& v, Frame* frame, int line) {
    if (t.names.size() == 1) {
      (*frame)[t.names[0]] = v;
      return absl::OkStatus();
    }
    JINJA_ASSIGN_AT(std::vector<Value> items, Iterate(v), line);
    if (items.size() != t.names.size()) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line, ": cannot unpack ",
                                                     items.size(), " values into ", t.names.size(),
                                                     " names"));
    }
    for (size_t k = 0; k < items.size(); ++k) (*frame)[t.names[k]] = items[k];
    return absl::OkStatus();
  }

  StatusOr<Flow> ExecFor(const Stmt& s) {
    POLYKV_ASSIGN_OR_RETURN(Value seq, Eval(*s.expr));
    JINJA_ASSIGN_AT(std::vector<Value> all, Iterate(seq), s.line);
    std::vector<Value> items;
    for (const Value& item : all) {
      if (s.filter) {
        frames_.push_back(std::make_shared<Frame>());
        Status st = Bind(s.target, item, frames_.back().get(), s.line);
        StatusOr<Value> keep = st.ok() ? Eval(*s.filter) : StatusOr<Value>(st);
        frames_.pop_back();
        if (!keep.ok()) return keep.status();
        if (!keep->Truthy()) continue;
      }
      items.push_back(item);
    }
    if (items.empty()) return ExecBody(s.else_body);
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      auto frame = std::make_shared<Frame>();
      POLYKV_RETURN_IF_ERROR(Bind(s.target, items[k], frame.get(), s.line));
      (*frame)["loop"] = LoopObject(items, k);
      frames_.push_back(std::move(frame));
      StatusOr<Flow> f = ExecBody(s.body);
      frames_.pop_back();
      if (!f.ok()) return f.status();
      if (*f == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  static Value LoopObject(const std::vector<Value>& items, int64_t k) {
    const int64_t n = static_cast<int64_t>(items.size());
    Dict d;
    d.Set("index", Value::Int(k + 1));
    d.Set("index0", Value::Int(k));
    d.Set("revindex", Value::Int(n - k));
    d.Set("revindex0", Value::Int(n - k - 1));
    d.Set("first", Value::Bool(k == 0));
    d.Set("last", Value::Bool(k == n - 1));
    d.Set("length", Value::Int(n));
    d.Set("depth", Value::Int(1));
    d.Set("depth0", Value::Int(0));
    d.Set("previtem", k > 0 ? items[k - 1] : Value::Undefined("there is no previous item"));
    d.Set("nextitem", k + 1 < n ? items[k + 1] : Value::Undefined("there is no next item"));
    d.Set("cycle", Value::Fn("loop.cycle", [k](const CallArgs& a) -> StatusOr<Value> {
            if (a.pos.empty()) return absl::InvalidArgumentError("loop.cycle() needs arguments");
            return a.pos[k % a.pos.size()];
          }));
    return Value::Namespace(std::move(d));
  }

  StatusOr<Flow> ExecSet(const Stmt& s) {
    Value v;
    if (s.expr) {
      POLYKV_ASSIGN_OR_RETURN(v, Eval(*s.expr));
    } else {
      std::string rendered;
      std::string* saved = out_;
      out_ = &rendered;
      StatusOr<Flow> f = ExecBody(s.body);
      out_ = saved;
      if (!f.ok()) return f.status();
      v = Value::Str(std::move(rendered));
    }
    if (!s.target.attr.empty()) {
      Value ns = Lookup(s.target.names[0]);
      if (!ns.is_namespace()) {
        return absl::InvalidArgumentError(
            absl::StrCat("line ", s.line, ": cannot assign attribute '", s.target.attr, "' on '",
                         s.target.names[0], "', which is not a namespace()"));
      }
      ns.mutable_dict().Set(s.target.attr, std::move(v));
      return Flow::kNormal;
    }
    POLYKV_RETURN_IF_ERROR(Bind(s.target, v, frames_.back().get(), s.line));
    return Flow::kNormal;
  }

  void DefineMacro(const Stmt& s) {
    const Stmt* def = &s;
    (*frames_.back())[s.name] =
        Value::Fn(s.name, [this, def](const CallArgs& a) { return CallMacro(*def, a); });
  }

  StatusOr<Value> CallMacro(const Stmt& def, const CallArgs& a) {
    if (a.pos.size() > def.params.size()) {
      return absl::InvalidArgumentError(absl::StrCat("line ", a.line, ": macro '", def.name,
                                                     "' takes not more than ", def.params.size(),
                                                     " argument(s)"));
    }
    auto frame = std::make_shared<Frame>();
    std::vector<std::shared_ptr<Frame>> saved = {frames_.front(), frame};
    saved.swap(frames_);
    Status st;
    for (size_t k = 0; k < def.params.size() && st.ok(); ++k) {
      const Value* given = a.Get(k < a.pos.size() ? k : a.pos.size() + 1000, def.params[k]);
      if (given != nullptr) {
        (*frame)[def.params[k]] = *given;
      } else if (def.defaults[k]) {
        StatusOr<Value> d = Eval(*def.defaults[k]);
        if (d.ok()) {
          (*frame)[def.params[k]] = *d;
        } else {
          st = d.status();
        }
      } else {
        (*frame)[def.params[k]] =
            Value::Undefined(absl::StrCat("parameter '", def.params[k], "' was not provided"));
      }
    }
    std::string rendered;
    std::string* saved_out = out_;
    out_ = &rendered;
    if (st.ok()) st = ExecBody(def.body).status();
    out_ = saved_out;
    saved.swap(frames_);
    if (!st.ok()) return st;
    return Value::Str(std::move(rendered));
  }

  Value Lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      auto f = (*it)->find(name);
      if (f != (*it)->end()) return f->second;
    }
    return Global(name);
  }

  StatusOr<CallArgs> EvalArgs(const Expr& e, size_t first) {
    CallArgs a;
    a.line = e.line;
    const size_t n_kw = e.kw_names.size();
    const size_t n_pos = e.kids.size() - first - n_kw;
    for (size_t k = first; k < e.kids.size(); ++k) {
      POLYKV_ASSIGN_OR_RETURN(Value v, Eval(*e.kids[k]));
      if (k - first < n_pos) {
        a.pos.push_back(std::move(v));
      } else {
        a.kw.emplace_back(e.kw_names[k - first - n_pos], std::move(v));
      }
    }
    return a;
  }

  StatusOr<Value> EvalCall(const Expr& e) {
    POLYKV_ASSIGN_OR_RETURN(Value callee, Eval(*e.kids[0]));
    if (callee.is_undefined()) return UndefinedUse(callee, e.line);
    if (callee.kind() != Value::Kind::kFunction) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", e.line, ": '", callee.TypeName(), "' object is not callable"));
    }
    POLYKV_ASSIGN_OR_RETURN(CallArgs a, EvalArgs(e, 1));
    JINJA_ASSIGN_AT(Value r, callee.fn()(a), e.line);
    return r;
  }

  StatusOr<Value> EvalFilterOrTest(const Expr& e) {
    POLYKV_ASSIGN_OR_RETURN(Value subject, Eval(*e.kids[0]));
    POLYKV_ASSIGN_OR_RETURN(CallArgs a, EvalArgs(e, 1));
    a.pos.insert(a.pos.begin(), std::move(subject));
    if (e.kind == Expr::Kind::kFilter) {
      JINJA_ASSIGN_AT(Value r, ApplyFilter(e.name, a), e.line);
      return r;
    }
    JINJA_ASSIGN_AT(bool r, ApplyTest(e.name, a), e.line);
    return Value::Bool(r != e.negate);
  }

  StatusOr<Value> EvalBinary(const Expr& e) {
    POLYKV_ASSIGN_OR_RETURN(Value a, Eval(*e.kids[0]));
    POLYKV_ASSIGN_OR_RETURN(Value b, Eval(*e.kids[1]));
    const std::string& op = e.name;
    if (op == "~") return Value::Str(ToStr(a) + ToStr(b));
    if (op == "==") return Value::Bool(Equal(a, b));
    if (op == "!=") return Value::Bool(!Equal(a, b));
    if (op == "in" || op == "not in") {
      POLYKV_ASSIGN_OR_RETURN(bool in, Contains(b, a, e.line));
      return Value::Bool(in == (op == "in"));
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      if (a.is_undefined()) return UndefinedUse(a, e.line);
      if (b.is_undefined()) return UndefinedUse(b, e.line);
      const bool swap = op == ">" || op == "<=";
      JINJA_ASSIGN_AT(bool lt, swap ? Less(b, a) : Less(a, b), e.line);
      return Value::Bool(op == "<" || op == ">" ? lt : !lt);
    }
    return Arithmetic(op, a, b, e.line);
  }

  StatusOr<Value> EvalUnary(const Expr& e) {
    POLYKV_ASSIGN_OR_RETURN(Value v, Eval(*e.kids[0]));
    if (e.name == "not") return Value::Bool(!v.Truthy());
    if (v.is_undefined()) return UndefinedUse(v, e.line);
    if (!v.is_number()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "line ", e.line, ": bad operand type for unary ", e.name, ": '", v.TypeName(), "'"));
    }
    if (e.name == "+") return v.kind() == Value::Kind::kBool ? Value::Int(v.i()) : v;
    return v.kind() == Value::Kind::kFloat ? Value::Float(-v.f()) : Value::Int(-v.i());
  }

  StatusOr<Value> EvalCollection(const Expr& e) {
    std::vector<Value> items;
    for (const ExprPtr& k : e.kids) {
      POLYKV_ASSIGN_OR_RETURN(Value v, Eval(*k));
      items.push_back(std::move(v));
    }
    if (e.kind != Expr::Kind::kDict)
      return Value::List(std::move(items), e.kind == Expr::Kind::kTuple);
    Dict d;
    for (size_t k = 0; k + 1 < items.size(); k += 2) {
      if (!items[k].is_string()) {
        return absl::UnimplementedError(
            absl::StrCat("line ", e.line, ": unsupported dict key of type ", items[k].TypeName()));
      }
      d.Set(items[k].s(), items[k + 1]);
    }
    return Value::MakeDict(std::move(d));
  }

  StatusOr<Value> Eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName:
        return Lookup(e.name);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple:
      case Expr::Kind::kDict:
        return EvalCollection(e);
      case Expr::Kind::kGetAttr: {
        POLYKV_ASSIGN_OR_RETURN(Value obj, Eval(*e.kids[0]));
        JINJA_ASSIGN_AT(Value r, GetAttr(obj, e.name), e.line);
        return r;
      }
      case Expr::Kind::kGetItem: {
        POLYKV_ASSIGN_OR_RETURN(Value obj, Eval(*e.kids[0]));
        POLYKV_ASSIGN_OR_RETURN(Value key, Eval(*e.kids[1]));
        JINJA_ASSIGN_AT(Value r, GetItem(obj, key), e.line);
        return r;
      }
      case Expr::Kind::kSlice: {
        POLYKV_ASSIGN_OR_RETURN(Value obj, Eval(*e.kids[0]));
        Value bounds[3];
        for (int k = 0; k < 3; ++k) {
          if (e.kids[k + 1]) {
            POLYKV_ASSIGN_OR_RETURN(bounds[k], Eval(*e.kids[k + 1]));
          }
        }
        JINJA_ASSIGN_AT(Value r, Slice(obj, bounds[0], bounds[1], bounds[2]), e.line);
        return r;
      }
      case Expr::Kind::kCall:
        return EvalCall(e);
      case Expr::Kind::kFilter:
      case Expr::Kind::kTest:
        return EvalFilterOrTest(e);
      case Expr::Kind::kUnary:
        return EvalUnary(e);
      case Expr::Kind::kBinary:
        return EvalBinary(e);
      case Expr::Kind::kAnd:
      case Expr::Kind::kOr: {
        POLYKV_ASSIGN_OR_RETURN(Value a, Eval(*e.kids[0]));
        if (a.Truthy() == (e.kind == Expr::Kind::kOr)) return a;
        return Eval(*e.kids[1]);
      }
      case Expr::Kind::kCond: {
        POLYKV_ASSIGN_OR_RETURN(Value c, Eval(*e.kids[1]));
        if (c.Truthy()) return Eval(*e.kids[0]);
        if (e.kids[2]) return Eval(*e.kids[2]);
        return Value::Undefined("the inline if had no else branch");
      }
    }
    return Value();
  }

  std::string* out_;
  std::vector<std::shared_ptr<Frame>> frames_;
};

}  // namespace

StatusOr<std::shared_ptr<const Template>> Template::Compile(const std::string& source) {
  POLYKV_ASSIGN_OR_RETURN(std::vector<Token> tokens, Lex(source));
  auto t = std::shared_ptr<Template>(new Template());
  POLYKV_ASSIGN_OR_RETURN(t->body_, Parse(tokens));
  return std::shared_ptr<const Template>(std::move(t));
}

StatusOr<std::string> Template::Render(const Dict& vars) const {
  std::string out;
  Renderer r(vars, &out);
  POLYKV_ASSIGN_OR_RETURN(Flow f, r.ExecBody(body_));
  (void)f;
  return out;
}

}  // namespace polykv::model::jinja
