// Jinja filters (jinja2 3.1 semantics; tojson as transformers overrides it: json.dumps with
// ensure_ascii=False).
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "jinja/builtins.h"
#include "jinja/pystr.h"

namespace polykv::model::jinja {
namespace {

Status FilterError(const CallArgs& a, const std::string& name, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("line ", a.line, ": filter '", name, "': ", what));
}

// jinja2's make_attrgetter: "a.b.0" looks up each part with getitem (ints as indexes).
StatusOr<Value> AttrPath(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    POLYKV_ASSIGN_OR_RETURN(cur,
                            GetItem(cur, digits ? Value::Int(std::stoll(part)) : Value::Str(part)));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

StatusOr<Value> ToJsonFilter(const CallArgs& a) {
  JsonOptions opt;
  if (const Value* ind = a.Get(1, "indent"); ind != nullptr && !ind->is_none()) {
    opt.indent_set = true;
    if (ind->is_integer()) {
      opt.indent = std::string(std::max<int64_t>(ind->i(), 0), ' ');
    } else if (ind->is_string()) {
      opt.indent = ind->s();
    } else {
      return FilterError(a, "tojson", "indent must be an int or a string");
    }
    opt.item_sep = ",";
  }
  if (const Value* sep = a.Get(2, "separators"); sep != nullptr && !sep->is_none()) {
    if (!sep->is_list() || sep->list().size() != 2 || !sep->list()[0].is_string() ||
        !sep->list()[1].is_string()) {
      return FilterError(a, "tojson", "separators must be a (item, key) pair of strings");
    }
    opt.item_sep = sep->list()[0].s();
    opt.key_sep = sep->list()[1].s();
  }
  if (const Value* sk = a.Get(3, "sort_keys"); sk != nullptr) opt.sort_keys = sk->Truthy();
  if (const Value* ea = a.Get(99, "ensure_ascii"); ea != nullptr && ea->Truthy()) {
    return absl::UnimplementedError(
        absl::StrCat("line ", a.line, ": unsupported tojson(ensure_ascii=true)"));
  }
  auto s = ToJson(a.pos[0], opt);
  if (!s.ok()) return FilterError(a, "tojson", std::string(s.status().message()));
  return Value::Str(*std::move(s));
}

// int(value, default, base): base as the third argument.
int64_t BaseArg(const CallArgs& a) {
  const Value* b = a.Get(2, "base");
  return b != nullptr && b->is_integer() ? b->i() : 10;
}

StatusOr<Value> IntFilter(const CallArgs& a, bool to_float) {
  const Value& v = a.pos[0];
  const Value* dflt = a.Get(1, "default");
  Value fallback = dflt != nullptr ? *dflt : to_float ? Value::Float(0) : Value::Int(0);
  if (v.is_number()) {
    return to_float ? Value::Float(v.f())
                    : Value::Int(v.kind() == Value::Kind::kFloat
                                     ? static_cast<int64_t>(std::trunc(v.f()))
                                     : v.i());
  }
  if (!v.is_string()) return fallback;
  std::string s = pystr::Strip(v.s(), nullptr, pystr::Side::kBoth);
  try {
    size_t used = 0;
    if (!to_float) {
      int64_t i = std::stoll(s, &used, static_cast<int>(BaseArg(a)));
      if (used == s.size()) return Value::Int(i);
    }
    double f = std::stod(s, &used);
    if (used == s.size()) {
      return to_float ? Value::Float(f) : Value::Int(static_cast<int64_t>(std::trunc(f)));
    }
  } catch (const std::exception&) {
  }
  return fallback;
}

// select/reject (attr empty) and selectattr/rejectattr.
StatusOr<Value> SelectFilter(const CallArgs& a, bool keep, bool by_attr) {
  POLYKV_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(a.pos[0]));
  size_t next = 1;
  std::string attr;
  if (by_attr) {
    if (a.pos.size() < 2 || !a.pos[1].is_string()) {
      return FilterError(a, keep ? "selectattr" : "rejectattr", "needs an attribute name");
    }
    attr = a.pos[1].s();
    next = 2;
  }
  std::string test;
  if (a.pos.size() > next) {
    if (!a.pos[next].is_string()) return FilterError(a, "select", "the test name must be a string");
    test = a.pos[next].s();
    if (!IsKnownTest(test)) {
      return absl::UnimplementedError(
          absl::StrCat("line ", a.line, ": unsupported test '", test, "'"));
    }
  }
  std::vector<Value> out;
  for (const Value& item : items) {
    Value subject = item;
    if (by_attr) {
      POLYKV_ASSIGN_OR_RETURN(subject, AttrPath(item, attr));
    }
    bool pass;
    if (test.empty()) {
      pass = subject.Truthy();
    } else {
      CallArgs targs;
      targs.line = a.line;
      targs.pos.push_back(subject);
      for (size_t k = next + 1; k < a.pos.size(); ++k) targs.pos.push_back(a.pos[k]);
      POLYKV_ASSIGN_OR_RETURN(pass, ApplyTest(test, targs));
    }
    if (pass == keep) out.push_back(item);
  }
  return Value::List(std::move(out));
}

StatusOr<Value> MapFilter(const CallArgs& a) {
  POLYKV_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(a.pos[0]));
  std::vector<Value> out;
  if (const Value* attr = a.Get(99, "attribute")) {
    if (!attr->is_string()) return FilterError(a, "map", "attribute must be a string");
    const Value* dflt = a.Get(99, "default");
    for (const Value& item : items) {
      POLYKV_ASSIGN_OR_RETURN(Value v, AttrPath(item, attr->s()));
      out.push_back(v.is_undefined() && dflt != nullptr ? *dflt : v);
    }
    return Value::List(std::move(out));
  }
  if (a.pos.size() < 2 || !a.pos[1].is_string()) {
    return FilterError(a, "map", "needs a filter name or attribute=");
  }
  const std::string filter = a.pos[1].s();
  if (!IsKnownFilter(filter)) {
    return absl::UnimplementedError(
        absl::StrCat("line ", a.line, ": unsupported filter '", filter, "'"));
  }
  for (const Value& item : items) {
    CallArgs fargs;
    fargs.line = a.line;
    fargs.pos.push_back(item);
    for (size_t k = 2; k < a.pos.size(); ++k) fargs.pos.push_back(a.pos[k]);
    fargs.kw = a.kw;
    POLYKV_ASSIGN_OR_RETURN(Value v, ApplyFilter(filter, fargs));
    out.push_back(std::move(v));
  }
  return Value::List(std::move(out));
}

StatusOr<Value> JoinFilter(const CallArgs& a) {
  POLYKV_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(a.pos[0]));
  const Value* sep = a.Get(1, "d");
  const Value* attr = a.Get(2, "attribute");
  std::string out;
  for (size_t k = 0; k < items.size(); ++k) {
    Value v = items[k];
    if (attr != nullptr && attr->is_string()) {
      POLYKV_ASSIGN_OR_RETURN(v, AttrPath(v, attr->s()));
    }
    if (k && sep != nullptr) out += ToStr(*sep);
    out += ToStr(v);
  }
  return Value::Str(out);
}

StatusOr<Value> StringFilter(const std::string& f, const CallArgs& a) {
  const std::string s = ToStr(a.pos[0]);
  if (f == "trim") {
    const Value* c = a.Get(1, "chars");
    return Value::Str(
        pystr::Strip(s, c != nullptr && c->is_string() ? &c->s() : nullptr, pystr::Side::kBoth));
  }
  if (f == "upper") return Value::Str(pystr::Upper(s));
  if (f == "lower") return Value::Str(pystr::Lower(s));
  if (f == "capitalize") return Value::Str(pystr::Capitalize(s));
  if (f == "title") return Value::Str(pystr::TitleFilter(s));
  if (f == "string") return Value::Str(s);
  // replace
  const Value* from = a.Get(1, "old");
  const Value* to = a.Get(2, "new");
  if (from == nullptr || to == nullptr) return FilterError(a, f, "needs old and new strings");
  const Value* count = a.Get(3, "count");
  return Value::Str(pystr::Replace(s, ToStr(*from), ToStr(*to),
                                   count != nullptr && count->is_integer() ? count->i() : -1));
}

}  // namespace

bool IsKnownFilter(std::string_view name) {
  static const std::set<std::string_view> kFilters = {
      "abs",        "capitalize", "count",      "d",       "default", "first", "float",
      "int",        "items",      "join",       "last",    "length",  "list",  "lower",
      "map",        "reject",     "rejectattr", "replace", "reverse", "safe",  "select",
      "selectattr", "string",     "title",      "tojson",  "trim",    "upper"};
  return kFilters.count(name) > 0;
}

StatusOr<Value> ApplyFilter(const std::string& f, const CallArgs& a) {
  const Value& v = a.pos[0];
  if (f == "default" || f == "d") {
    const Value* dflt = a.Get(1, "default_value");
    const Value* boolean = a.Get(2, "boolean");
    const bool use = v.is_undefined() || (boolean != nullptr && boolean->Truthy() && !v.Truthy());
    return use ? (dflt != nullptr ? *dflt : Value::Str("")) : v;
  }
  if (f == "trim" || f == "upper" || f == "lower" || f == "capitalize" || f == "title" ||
      f == "string" || f == "replace") {
    return StringFilter(f, a);
  }
  if (f == "length" || f == "count") {
    POLYKV_ASSIGN_OR_RETURN(int64_t n, Length(v));
    return Value::Int(n);
  }
  if (f == "tojson") return ToJsonFilter(a);
  if (f == "join") return JoinFilter(a);
  if (f == "int") return IntFilter(a, false);
  if (f == "float") return IntFilter(a, true);
  if (f == "safe") return v;
  if (f == "abs") {
    if (v.kind() == Value::Kind::kFloat) return Value::Float(std::fabs(v.f()));
    if (v.is_integer()) return Value::Int(v.i() < 0 ? -v.i() : v.i());
    return FilterError(a, f, absl::StrCat("bad operand type ", v.TypeName()));
  }
  if (f == "first" || f == "last" || f == "list" || f == "reverse") {
    POLYKV_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    if (f == "list") return Value::List(std::move(items));
    if (f == "reverse") {
      if (v.is_string()) {
        std::string r;
        for (auto it = items.rbegin(); it != items.rend(); ++it) r += it->s();
        return Value::Str(r);
      }
      return Value::List(std::vector<Value>(items.rbegin(), items.rend()));
    }
    if (items.empty()) return Value::Undefined(absl::StrCat("'", f, "' of an empty sequence"));
    return f == "first" ? items.front() : items.back();
  }
  if (f == "items") {
    if (v.is_undefined()) return Value::List({});
    if (!v.is_dict()) return FilterError(a, f, "needs a mapping");
    std::vector<Value> out;
    for (const auto& [k, x] : v.dict().items) {
      out.push_back(Value::List({Value::Str(k), x}, /*tuple=*/true));
    }
    return Value::List(std::move(out));
  }
  if (f == "select" || f == "reject") return SelectFilter(a, f == "select", false);
  if (f == "selectattr" || f == "rejectattr") return SelectFilter(a, f == "selectattr", true);
  if (f == "map") return MapFilter(a);
  return absl::UnimplementedError(absl::StrCat("line ", a.line, ": unsupported filter '", f, "'"));
}

}  // namespace polykv::model::jinja
