// Jinja built-ins other than filters: attribute and item access (jinja2's getattr/getitem),
// slices, iteration, Python str/dict/list methods, tests and globals.
#include "jinja/builtins.h"

#include <ctime>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "jinja/pystr.h"

namespace polykv::model::jinja {
namespace {

Status ArgError(const CallArgs& a, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("line ", a.line, ": ", what));
}

StatusOr<std::string> StrArg(const CallArgs& a, size_t i, const char* name, const char* fn) {
  const Value* v = a.Get(i, name);
  if (v == nullptr || !v->is_string()) {
    return ArgError(a, absl::StrCat(fn, "() needs a string argument '", name, "'"));
  }
  return v->s();
}

int64_t IntArg(const CallArgs& a, size_t i, const char* name, int64_t dflt) {
  const Value* v = a.Get(i, name);
  return v != nullptr && v->is_integer() ? v->i() : dflt;
}

// startswith/endswith: a string or a tuple of strings.
StatusOr<Value> AffixMethod(const std::string& s, const CallArgs& a, bool prefix) {
  const Value* arg = a.Get(0, "prefix");
  std::vector<std::string> options;
  if (arg != nullptr && arg->is_string()) {
    options.push_back(arg->s());
  } else if (arg != nullptr && arg->is_list()) {
    for (const Value& x : arg->list()) {
      if (x.is_string()) options.push_back(x.s());
    }
  } else {
    return ArgError(a, "startswith/endswith needs a string or a tuple of strings");
  }
  for (const std::string& o : options) {
    if (o.size() <= s.size() && s.compare(prefix ? 0 : s.size() - o.size(), o.size(), o) == 0) {
      return Value::Bool(true);
    }
  }
  return Value::Bool(false);
}

StatusOr<Value> StrMethod(const std::string& s, const std::string& m, const CallArgs& a) {
  using pystr::Side;
  if (m == "strip" || m == "lstrip" || m == "rstrip") {
    const Value* c = a.Get(0, "chars");
    const std::string* chars = c != nullptr && c->is_string() ? &c->s() : nullptr;
    Side side = m == "strip" ? Side::kBoth : m == "lstrip" ? Side::kLeft : Side::kRight;
    return Value::Str(pystr::Strip(s, chars, side));
  }
  if (m == "split") {
    const Value* sep = a.Get(0, "sep");
    const std::string* sp = sep != nullptr && sep->is_string() ? &sep->s() : nullptr;
    if (sp != nullptr && sp->empty()) return ArgError(a, "split(): empty separator");
    std::vector<Value> parts;
    for (std::string& p : pystr::Split(s, sp, IntArg(a, 1, "maxsplit", -1))) {
      parts.push_back(Value::Str(std::move(p)));
    }
    return Value::List(std::move(parts));
  }
  if (m == "startswith" || m == "endswith") return AffixMethod(s, a, m == "startswith");
  if (m == "upper") return Value::Str(pystr::Upper(s));
  if (m == "lower") return Value::Str(pystr::Lower(s));
  if (m == "title") return Value::Str(pystr::TitleMethod(s));
  if (m == "capitalize") return Value::Str(pystr::Capitalize(s));
  if (m == "replace") {
    POLYKV_ASSIGN_OR_RETURN(std::string from, StrArg(a, 0, "old", "replace"));
    POLYKV_ASSIGN_OR_RETURN(std::string to, StrArg(a, 1, "new", "replace"));
    return Value::Str(pystr::Replace(s, from, to, IntArg(a, 2, "count", -1)));
  }
  if (m == "find" || m == "count") {
    POLYKV_ASSIGN_OR_RETURN(std::string sub, StrArg(a, 0, "sub", m.c_str()));
    if (m == "find") {
      size_t p = s.find(sub);
      return Value::Int(p == std::string::npos ? -1 : pystr::Length(s.substr(0, p)));
    }
    if (sub.empty()) return Value::Int(pystr::Length(s) + 1);
    int64_t n = 0;
    for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
    return Value::Int(n);
  }
  if (m == "removeprefix" || m == "removesuffix") {
    POLYKV_ASSIGN_OR_RETURN(std::string x, StrArg(a, 0, "affix", m.c_str()));
    const bool pre = m == "removeprefix";
    if (x.size() <= s.size() && s.compare(pre ? 0 : s.size() - x.size(), x.size(), x) == 0) {
      return Value::Str(pre ? s.substr(x.size()) : s.substr(0, s.size() - x.size()));
    }
    return Value::Str(s);
  }
  if (m == "join") {
    const Value* it = a.Get(0, "iterable");
    if (it == nullptr) return ArgError(a, "join() needs an iterable");
    POLYKV_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*it));
    std::string out;
    for (size_t k = 0; k < items.size(); ++k) {
      if (!items[k].is_string()) {
        return ArgError(a,
                        absl::StrCat("join(): item ", k, " is ", items[k].TypeName(), ", not str"));
      }
      if (k) out += s;
      out += items[k].s();
    }
    return Value::Str(out);
  }
  // isdigit / isalpha / isspace / islower / isupper on ASCII text.
  auto all = [&](auto pred) {
    if (s.empty()) return Value::Bool(false);
    for (char c : s) {
      if (!pred(c)) return Value::Bool(false);
    }
    return Value::Bool(true);
  };
  if (m == "isdigit") return all([](char c) { return c >= '0' && c <= '9'; });
  if (m == "isalpha") {
    return all([](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); });
  }
  if (m == "isspace") return all([](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); });
  if (m == "islower") return Value::Bool(pystr::Lower(s) == s && pystr::Upper(s) != s);
  if (m == "isupper") return Value::Bool(pystr::Upper(s) == s && pystr::Lower(s) != s);
  return absl::UnimplementedError(
      absl::StrCat("line ", a.line, ": unsupported str method '", m, "'"));
}

StatusOr<Value> DictMethod(const Value& d, const std::string& m, const CallArgs& a) {
  if (m == "get") {
    const Value* key = a.Get(0, "key");
    if (key == nullptr) return ArgError(a, "get() needs a key");
    if (key->is_string()) {
      if (const Value* v = d.dict().Find(key->s())) return *v;
    }
    const Value* dflt = a.Get(1, "default");
    return dflt != nullptr ? *dflt : Value::None();
  }
  std::vector<Value> out;
  for (const auto& [k, v] : d.dict().items) {
    if (m == "keys") {
      out.push_back(Value::Str(k));
    } else if (m == "values") {
      out.push_back(v);
    } else {
      out.push_back(Value::List({Value::Str(k), v}, /*tuple=*/true));
    }
  }
  return Value::List(std::move(out));
}

StatusOr<Value> ListMethod(const Value& l, const std::string& m, const CallArgs& a) {
  const Value* x = a.Get(0, "value");
  if (x == nullptr) return ArgError(a, absl::StrCat(m, "() needs an argument"));
  int64_t n = 0;
  for (size_t k = 0; k < l.list().size(); ++k) {
    if (!Equal(l.list()[k], *x)) continue;
    if (m == "index") return Value::Int(static_cast<int64_t>(k));
    ++n;
  }
  if (m == "index") return ArgError(a, absl::StrCat(Repr(*x), " is not in list"));
  return Value::Int(n);
}

Value Bound(const Value& self, const std::string& name,
            StatusOr<Value> (*method)(const Value&, const std::string&, const CallArgs&)) {
  return Value::Fn(name, [self, name, method](const CallArgs& a) { return method(self, name, a); });
}

StatusOr<Value> StrMethodOnValue(const Value& self, const std::string& m, const CallArgs& a) {
  return StrMethod(self.s(), m, a);
}

Value ObjectName(const Value& v, const std::string& what) {
  return Value::Undefined(
      absl::StrCat("'", v.TypeName(), " object' has no attribute '", what, "'"));
}

}  // namespace

StatusOr<Value> GetAttr(const Value& obj, const std::string& name) {
  static const std::set<std::string> kStrMethods = {
      "strip",        "lstrip",       "rstrip",     "split",   "startswith", "endswith", "upper",
      "lower",        "title",        "capitalize", "replace", "find",       "count",    "join",
      "removeprefix", "removesuffix", "isdigit",    "isalpha", "isspace",    "islower",  "isupper"};
  static const std::set<std::string> kStrOther = {
      "casefold",   "center",    "encode",    "expandtabs",   "format",    "format_map",  "index",
      "isalnum",    "isascii",   "isdecimal", "isidentifier", "isnumeric", "isprintable", "istitle",
      "ljust",      "partition", "rfind",     "rindex",       "rjust",     "rpartition",  "rsplit",
      "splitlines", "swapcase",  "translate", "zfill"};
  static const std::set<std::string> kDictOther = {"clear",   "copy",       "fromkeys", "pop",
                                                   "popitem", "setdefault", "update"};
  static const std::set<std::string> kListOther = {
      "append", "clear", "copy", "extend", "insert", "pop", "remove", "reverse", "sort"};
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      return absl::InvalidArgumentError(absl::StrCat(
          obj.s().empty() ? "value is undefined" : obj.s(), " (reading '.", name, "')"));
    case Value::Kind::kString:
      if (kStrMethods.count(name)) return Bound(obj, name, &StrMethodOnValue);
      if (kStrOther.count(name)) {
        return absl::UnimplementedError(absl::StrCat("unsupported str method '", name, "'"));
      }
      return ObjectName(obj, name);
    case Value::Kind::kDict:
      if (!obj.is_namespace()) {
        if (name == "get" || name == "items" || name == "keys" || name == "values") {
          return Bound(obj, name, &DictMethod);
        }
        if (kDictOther.count(name)) {
          return absl::UnimplementedError(absl::StrCat("unsupported dict method '", name, "'"));
        }
      }
      if (const Value* v = obj.dict().Find(name)) return *v;
      return ObjectName(obj, name);
    case Value::Kind::kList:
      if (name == "count" || name == "index") return Bound(obj, name, &ListMethod);
      if (kListOther.count(name)) {
        return absl::UnimplementedError(absl::StrCat("unsupported list method '", name, "'"));
      }
      return ObjectName(obj, name);
    default:
      return ObjectName(obj, name);
  }
}

StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) {
    return absl::InvalidArgumentError(absl::StrCat(obj.s().empty() ? "value is undefined" : obj.s(),
                                                   " (reading [", Repr(key), "])"));
  }
  if (obj.is_dict() && key.is_string()) {
    if (const Value* v = obj.dict().Find(key.s())) return *v;
    return Value::Undefined(absl::StrCat("'dict object' has no attribute '", key.s(), "'"));
  }
  if ((obj.is_list() || obj.is_string()) && key.is_integer()) {
    std::vector<std::string> cps;
    if (obj.is_string()) cps = pystr::CodePoints(obj.s());
    const int64_t n = obj.is_list() ? obj.list().size() : cps.size();
    int64_t i = key.i() < 0 ? key.i() + n : key.i();
    if (i < 0 || i >= n) {
      return Value::Undefined(absl::StrCat(obj.TypeName(), " index ", key.i(), " out of range"));
    }
    return obj.is_list() ? obj.list()[i] : Value::Str(cps[i]);
  }
  if (key.is_string()) return GetAttr(obj, key.s());
  return Value::Undefined(absl::StrCat("'", obj.TypeName(), " object' has no item ", Repr(key)));
}

StatusOr<Value> Slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (!obj.is_list() && !obj.is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot slice a ", obj.TypeName()));
  }
  auto bound = [](const Value& v) -> StatusOr<std::optional<int64_t>> {
    if (v.is_undefined() || v.is_none()) return std::optional<int64_t>();
    if (!v.is_integer()) return absl::InvalidArgumentError("slice indices must be integers");
    return std::optional<int64_t>(v.i());
  };
  POLYKV_ASSIGN_OR_RETURN(auto b, bound(start));
  POLYKV_ASSIGN_OR_RETURN(auto e, bound(stop));
  POLYKV_ASSIGN_OR_RETURN(auto s, bound(step));
  const int64_t st = s.value_or(1);
  if (st == 0) return absl::InvalidArgumentError("slice step cannot be zero");
  std::vector<std::string> cps;
  if (obj.is_string()) cps = pystr::CodePoints(obj.s());
  const int64_t n = obj.is_list() ? obj.list().size() : cps.size();
  // Python's slice.indices().
  auto clamp = [&](std::optional<int64_t> x, int64_t dflt) {
    if (!x) return dflt;
    int64_t v = *x < 0 ? *x + n : *x;
    if (v < 0) return st < 0 ? int64_t{-1} : int64_t{0};
    if (v >= n) return st < 0 ? n - 1 : n;
    return v;
  };
  const int64_t lo = clamp(b, st < 0 ? n - 1 : 0);
  const int64_t hi = clamp(e, st < 0 ? -1 : n);
  std::vector<Value> items;
  std::string text;
  for (int64_t k = lo; st > 0 ? k < hi : k > hi; k += st) {
    if (obj.is_list()) {
      items.push_back(obj.list()[k]);
    } else {
      text += cps[k];
    }
  }
  if (obj.is_string()) return Value::Str(text);
  return Value::List(std::move(items), obj.is_tuple());
}

StatusOr<std::vector<Value>> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return std::vector<Value>{};
    case Value::Kind::kList:
      return v.list();
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& kv : v.dict().items) keys.push_back(Value::Str(kv.first));
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      for (std::string& c : pystr::CodePoints(v.s())) chars.push_back(Value::Str(std::move(c)));
      return chars;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("'", v.TypeName(), "' object is not iterable"));
  }
}

StatusOr<int64_t> Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return pystr::Length(v.s());
    case Value::Kind::kList:
      return static_cast<int64_t>(v.list().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(v.dict().items.size());
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("object of type '", v.TypeName(), "' has no len()"));
  }
}

bool IsKnownTest(std::string_view name) {
  static const std::set<std::string_view> kTests = {
      "defined",  "undefined", "none",   "boolean",     "true",     "false",
      "integer",  "float",     "number", "string",      "mapping",  "iterable",
      "sequence", "callable",  "sameas", "equalto",     "eq",       "==",
      "ne",       "!=",        "lt",     "<",           "lessthan", "le",
      "<=",       "gt",        ">",      "greaterthan", "ge",       ">=",
      "in",       "odd",       "even",   "divisibleby", "lower",    "upper"};
  return kTests.count(name) > 0;
}

StatusOr<bool> ApplyTest(const std::string& t, const CallArgs& a) {
  const Value& v = a.pos[0];
  const Value none;
  const Value& arg = a.pos.size() > 1 ? a.pos[1] : (a.kw.empty() ? none : a.kw[0].second);
  using K = Value::Kind;
  if (t == "defined") return !v.is_undefined();
  if (t == "undefined") return v.is_undefined();
  if (t == "none") return v.is_none();
  if (t == "boolean") return v.kind() == K::kBool;
  if (t == "true" || t == "false") return v.kind() == K::kBool && v.b() == (t == "true");
  if (t == "integer") return v.kind() == K::kInt;
  if (t == "float") return v.kind() == K::kFloat;
  if (t == "number") return v.is_number();
  if (t == "string") return v.is_string();
  if (t == "mapping") return v.is_dict() && !v.is_namespace();
  if (t == "iterable") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  if (t == "sequence") return v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace());
  if (t == "callable") return v.kind() == K::kFunction;
  if (t == "lower") return v.is_string() && pystr::Lower(v.s()) == v.s();
  if (t == "upper") return v.is_string() && pystr::Upper(v.s()) == v.s();
  if (t == "sameas") {
    if (v.kind() != arg.kind()) return false;
    if (v.is_list() || v.is_dict() || v.kind() == K::kFunction) return Equal(v, arg);
    return Equal(v, arg);
  }
  if (t == "equalto" || t == "eq" || t == "==") return Equal(v, arg);
  if (t == "ne" || t == "!=") return !Equal(v, arg);
  if (t == "lt" || t == "<" || t == "lessthan") return Less(v, arg);
  if (t == "gt" || t == ">" || t == "greaterthan") return Less(arg, v);
  if (t == "le" || t == "<=") {
    POLYKV_ASSIGN_OR_RETURN(bool gt, Less(arg, v));
    return !gt;
  }
  if (t == "ge" || t == ">=") {
    POLYKV_ASSIGN_OR_RETURN(bool lt, Less(v, arg));
    return !lt;
  }
  if (t == "in") {
    if (arg.is_string() && v.is_string()) return arg.s().find(v.s()) != std::string::npos;
    POLYKV_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(arg));
    for (const Value& x : items) {
      if (Equal(x, v)) return true;
    }
    return false;
  }
  if (t == "odd" || t == "even" || t == "divisibleby") {
    if (!v.is_integer()) return ArgError(a, absl::StrCat("test '", t, "' needs an integer"));
    if (t == "divisibleby") {
      if (!arg.is_integer() || arg.i() == 0) return ArgError(a, "divisibleby needs a non-zero int");
      return v.i() % arg.i() == 0;
    }
    return (v.i() % 2 != 0) == (t == "odd");
  }
  return absl::UnimplementedError(absl::StrCat("line ", a.line, ": unsupported test '", t, "'"));
}

namespace {

StatusOr<Value> Range(const CallArgs& a) {
  std::vector<int64_t> p;
  for (const Value& v : a.pos) {
    if (!v.is_integer()) return ArgError(a, "range() takes integers");
    p.push_back(v.i());
  }
  if (p.empty() || p.size() > 3) return ArgError(a, "range() takes 1 to 3 arguments");
  int64_t start = p.size() == 1 ? 0 : p[0];
  int64_t stop = p.size() == 1 ? p[0] : p[1];
  int64_t step = p.size() == 3 ? p[2] : 1;
  if (step == 0) return ArgError(a, "range() step must not be zero");
  std::vector<Value> out;
  for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
    if (out.size() >= 100000) return ArgError(a, "range() too big (jinja2 allows 100000 items)");
    out.push_back(Value::Int(k));
  }
  return Value::List(std::move(out));
}

StatusOr<Value> MakeNamespace(const CallArgs& a, bool ns) {
  Dict d;
  for (const Value& v : a.pos) {
    if (!v.is_dict()) return ArgError(a, "namespace()/dict() take a mapping or keywords");
    for (const auto& [k, x] : v.dict().items) d.Set(k, x);
  }
  for (const auto& [k, x] : a.kw) d.Set(k, x);
  return ns ? Value::Namespace(std::move(d)) : Value::MakeDict(std::move(d));
}

StatusOr<Value> StrftimeNow(const CallArgs& a) {
  POLYKV_ASSIGN_OR_RETURN(std::string fmt, StrArg(a, 0, "format", "strftime_now"));
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[256];
  size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &local);
  if (n == 0 && !fmt.empty()) return ArgError(a, "strftime_now(): empty or too long result");
  return Value::Str(std::string(buf, n));
}

}  // namespace

Value Global(const std::string& name) {
  if (name == "range") return Value::Fn(name, Range);
  if (name == "namespace") {
    return Value::Fn(name, [](const CallArgs& a) { return MakeNamespace(a, true); });
  }
  if (name == "dict") {
    return Value::Fn(name, [](const CallArgs& a) { return MakeNamespace(a, false); });
  }
  if (name == "raise_exception") {
    return Value::Fn(name, [](const CallArgs& a) -> StatusOr<Value> {
      std::string msg = a.pos.empty() ? "" : ToStr(a.pos[0]);
      return absl::InvalidArgumentError(absl::StrCat("line ", a.line, ": ", kRaisedPrefix, msg));
    });
  }
  if (name == "strftime_now") return Value::Fn(name, StrftimeNow);
  return Value::Undefined(absl::StrCat("'", name, "' is undefined"));
}

}  // namespace polykv::model::jinja
