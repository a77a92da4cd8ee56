// Values of the chat-template Jinja engine: Python's None/bool/int/float/str/list/tuple/dict
// plus Jinja's Undefined, namespaces and callables, with Python semantics for str(), repr(),
// json.dumps(), truthiness, equality and ordering.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "polykv/status.h"

namespace polykv::model::jinja {

class Value;

/// An insertion-ordered str-keyed dict (Python 3.7+ dict order, which json.dumps keeps).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* Find(std::string_view key) const;
  void Set(const std::string& key, Value v);
};

/// Arguments of a call: positional then keyword, as written; `line` of the call site.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  int line = 0;
  /// Keyword `name`, else positional `index`, else nullptr.
  const Value* Get(size_t index, std::string_view name) const;
};

using Function = std::function<StatusOr<Value>(const CallArgs&)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Value() = default;  // Undefined
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value Str(std::string s);
  static Value List(std::vector<Value> items, bool tuple = false);
  static Value MakeDict(Dict d = {});
  /// A jinja2 namespace(): a dict whose attributes `set ns.x = ...` may assign.
  static Value Namespace(Dict d = {});
  static Value Fn(std::string name, Function f);
  /// Undefined that remembers what was looked up, for error messages.
  static Value Undefined(std::string what);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }
  bool is_namespace() const { return kind_ == Kind::kDict && namespace_; }
  bool is_number() const {
    return kind_ == Kind::kBool || kind_ == Kind::kInt || kind_ == Kind::kFloat;
  }
  bool is_integer() const { return kind_ == Kind::kInt || kind_ == Kind::kBool; }

  bool b() const { return i_ != 0; }
  int64_t i() const { return i_; }
  double f() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(i_); }
  const std::string& s() const { return s_; }  // string text; name of a function/undefined
  const std::vector<Value>& list() const { return *list_; }
  const Dict& dict() const { return *dict_; }
  Dict& mutable_dict() const { return *dict_; }
  const Function& fn() const { return *fn_; }

  /// Python bool(x); Undefined is false.
  bool Truthy() const;
  /// Python type name ("str", "int", "list", "dict", "NoneType", "Undefined" ...).
  std::string TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool tuple_ = false;
  bool namespace_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<std::vector<Value>> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Function> fn_;
};

/// Python str(v) (Undefined renders as ""; None as "None"; lists as their repr).
std::string ToStr(const Value& v);
/// Python repr(v).
std::string Repr(const Value& v);
/// Python repr() of a float ("1.0", "0.1", "1e-05", "inf").
std::string FloatRepr(double f);

/// json.dumps(v, ensure_ascii=False, indent=..., separators=..., sort_keys=...), as the
/// tojson filter transformers installs. `indent` empty: one line. Errors: kInvalidArgument for
/// Undefined and functions (not JSON serializable).
struct JsonOptions {
  bool indent_set = false;
  std::string indent;  ///< per-level indent text (json.dumps turns an int n into n spaces)
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};
StatusOr<std::string> ToJson(const Value& v, const JsonOptions& opt);

/// Parses JSON text into values (objects keep their key order). Errors: kInvalidArgument.
StatusOr<Value> FromJson(std::string_view json);

/// Python ==.
bool Equal(const Value& a, const Value& b);
/// Python a < b for numbers, strings and lists; kInvalidArgument otherwise.
StatusOr<bool> Less(const Value& a, const Value& b);

}  // namespace polykv::model::jinja
