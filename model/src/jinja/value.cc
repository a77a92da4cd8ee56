// Jinja values with Python semantics: str()/repr(), json.dumps(), ==, < and truthiness.
#include "jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "polykv/enum_names.h"

namespace polykv::model::jinja {

const Value* Dict::Find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::Set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

const Value* CallArgs::Get(size_t index, std::string_view name) const {
  for (const auto& [k, v] : kw) {
    if (k == name) return &v;
  }
  return index < pos.size() ? &pos[index] : nullptr;
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.i_ = b ? 1 : 0;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}
Value Value::Str(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::move(s);
  return v;
}
Value Value::List(std::vector<Value> items, bool tuple) {
  Value v;
  v.kind_ = Kind::kList;
  v.tuple_ = tuple;
  v.list_ = std::make_shared<std::vector<Value>>(std::move(items));
  return v;
}
Value Value::MakeDict(Dict d) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<Dict>(std::move(d));
  return v;
}
Value Value::Namespace(Dict d) {
  Value v = MakeDict(std::move(d));
  v.namespace_ = true;
  return v;
}
Value Value::Fn(std::string name, Function f) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.s_ = std::move(name);
  v.fn_ = std::make_shared<Function>(std::move(f));
  return v;
}
Value Value::Undefined(std::string what) {
  Value v;
  v.s_ = std::move(what);
  return v;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0;
    case Kind::kString:
      return !s_.empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return namespace_ || !dict_->items.empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string Value::TypeName() const {
  // Python's type names; a tuple is a kList and a namespace a kDict.
  static constexpr EnumName<Kind> kNames[] = {
      {Kind::kUndefined, "Undefined"}, {Kind::kNone, "NoneType"},
      {Kind::kBool, "bool"},           {Kind::kInt, "int"},
      {Kind::kFloat, "float"},         {Kind::kString, "str"},
      {Kind::kList, "list"},           {Kind::kDict, "dict"},
      {Kind::kFunction, "function"}};
  if (kind_ == Kind::kList && tuple_) return "tuple";
  if (kind_ == Kind::kDict && namespace_) return "Namespace";
  return EnumToName(kNames, kind_, "?");
}

std::string FloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, then Python's layout: scientific when exp < -4 or >= 16.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  int exp = std::stoi(sci.substr(e + 1));
  bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits += c;
  }
  std::string out = neg ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) absl::StrAppend(&out, ".", digits.substr(1));
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + eb;
  }
  if (exp < 0) return absl::StrCat(out, "0.", std::string(-exp - 1, '0'), digits);
  if (static_cast<int>(digits.size()) <= exp + 1) {
    return absl::StrCat(out, digits, std::string(exp + 1 - digits.size(), '0'), ".0");
  }
  return absl::StrCat(out, digits.substr(0, exp + 1), ".", digits.substr(exp + 1));
}

namespace {

std::string StrRepr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == q) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += q;
  return out;
}

void JsonString(const std::string& s, std::string* out) {
  *out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof(b), "\\u%04x", c);
          *out += b;
        } else {
          *out += static_cast<char>(c);
        }
    }
  }
  *out += '"';
}

Status JsonAppend(const Value& v, const JsonOptions& opt, int depth, std::string* out) {
  auto newline = [&](int d) {
    if (!opt.indent_set) return;
    *out += '\n';
    for (int k = 0; k < d; ++k) *out += opt.indent;
  };
  // With an indent json.dumps uses ',' between items unless separators says otherwise.
  const std::string& item_sep = opt.item_sep;
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kFunction:
      return absl::InvalidArgumentError(
          absl::StrCat("Object of type ", v.TypeName(), " is not JSON serializable"));
    case Value::Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Value::Kind::kBool:
      *out += v.b() ? "true" : "false";
      return absl::OkStatus();
    case Value::Kind::kInt:
      absl::StrAppend(out, v.i());
      return absl::OkStatus();
    case Value::Kind::kFloat: {
      double f = v.f();
      if (std::isnan(f)) {
        *out += "NaN";
      } else if (std::isinf(f)) {
        *out += f > 0 ? "Infinity" : "-Infinity";
      } else {
        *out += FloatRepr(f);
      }
      return absl::OkStatus();
    }
    case Value::Kind::kString:
      JsonString(v.s(), out);
      return absl::OkStatus();
    case Value::Kind::kList: {
      if (v.list().empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      *out += '[';
      bool first = true;
      for (const Value& x : v.list()) {
        if (!first) *out += item_sep;
        first = false;
        newline(depth + 1);
        POLYKV_RETURN_IF_ERROR(JsonAppend(x, opt, depth + 1, out));
      }
      newline(depth);
      *out += ']';
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      if (v.dict().items.empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict().items) items.push_back(&kv);
      if (opt.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      *out += '{';
      bool first = true;
      for (const auto* kv : items) {
        if (!first) *out += item_sep;
        first = false;
        newline(depth + 1);
        JsonString(kv->first, out);
        *out += opt.key_sep;
        POLYKV_RETURN_IF_ERROR(JsonAppend(kv->second, opt, depth + 1, out));
      }
      newline(depth);
      *out += '}';
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

Value FromNlohmann(const nlohmann::ordered_json& j) {
  if (j.is_null()) return Value::None();
  if (j.is_boolean()) return Value::Bool(j.get<bool>());
  if (j.is_number_integer()) return Value::Int(j.get<int64_t>());
  if (j.is_number_unsigned()) return Value::Int(static_cast<int64_t>(j.get<uint64_t>()));
  if (j.is_number_float()) return Value::Float(j.get<double>());
  if (j.is_string()) return Value::Str(j.get<std::string>());
  if (j.is_array()) {
    std::vector<Value> items;
    for (const auto& x : j) items.push_back(FromNlohmann(x));
    return Value::List(std::move(items));
  }
  Dict d;
  for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(it.key(), FromNlohmann(*it));
  return Value::MakeDict(std::move(d));
}

}  // namespace

std::string Repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString:
      return StrRepr(v.s());
    case Value::Kind::kList: {
      std::string out = v.is_tuple() ? "(" : "[";
      for (size_t k = 0; k < v.list().size(); ++k) {
        if (k) out += ", ";
        out += Repr(v.list()[k]);
      }
      if (v.is_tuple() && v.list().size() == 1) out += ",";
      return out + (v.is_tuple() ? ")" : "]");
    }
    case Value::Kind::kDict: {
      std::string out = v.is_namespace() ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, x] : v.dict().items) {
        if (!first) out += ", ";
        first = false;
        absl::StrAppend(&out, StrRepr(k), ": ", Repr(x));
      }
      return out + (v.is_namespace() ? "}>" : "}");
    }
    default:
      return ToStr(v);
  }
}

std::string ToStr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.b() ? "True" : "False";
    case Value::Kind::kInt:
      return absl::StrCat(v.i());
    case Value::Kind::kFloat:
      return FloatRepr(v.f());
    case Value::Kind::kString:
      return v.s();
    case Value::Kind::kFunction:
      return absl::StrCat("<function ", v.s(), ">");
    default:
      return Repr(v);
  }
}

StatusOr<std::string> ToJson(const Value& v, const JsonOptions& opt) {
  std::string out;
  POLYKV_RETURN_IF_ERROR(JsonAppend(v, opt, 0, &out));
  return out;
}

StatusOr<Value> FromJson(std::string_view json) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(json, nullptr, false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed JSON: ", std::string(json.substr(0, 80))));
  }
  return FromNlohmann(j);
}

bool Equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind() == K::kFloat || b.kind() == K::kFloat) return a.f() == b.f();
    return a.i() == b.i();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.s() == b.s();
    case K::kList: {
      if (a.is_tuple() != b.is_tuple() || a.list().size() != b.list().size()) return false;
      for (size_t k = 0; k < a.list().size(); ++k) {
        if (!Equal(a.list()[k], b.list()[k])) return false;
      }
      return true;
    }
    case K::kDict: {
      if (a.is_namespace() || b.is_namespace()) return &a.dict() == &b.dict();
      if (a.dict().items.size() != b.dict().items.size()) return false;
      for (const auto& [k, v] : a.dict().items) {
        const Value* o = b.dict().Find(k);
        if (o == nullptr || !Equal(v, *o)) return false;
      }
      return true;
    }
    case K::kFunction:
      return &a.fn() == &b.fn();
    default:
      return false;
  }
}

StatusOr<bool> Less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat) return a.f() < b.f();
    return a.i() < b.i();
  }
  if (a.is_string() && b.is_string()) return a.s() < b.s();  // UTF-8 order = code point order
  if (a.is_list() && b.is_list()) {
    const auto& x = a.list();
    const auto& y = b.list();
    for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (Equal(x[k], y[k])) continue;
      return Less(x[k], y[k]);
    }
    return x.size() < y.size();
  }
  return absl::InvalidArgumentError(absl::StrCat("'<' not supported between instances of '",
                                                 a.TypeName(), "' and '", b.TypeName(), "'"));
}

}  // namespace polykv::model::jinja
