// Built-ins of the chat-template Jinja engine: jinja2 filters and tests, Python str/dict/list
// methods, and the globals transformers provides (range, namespace, raise_exception,
// strftime_now).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "jinja/value.h"

namespace polykv::model::jinja {

bool IsKnownFilter(std::string_view name);
bool IsKnownTest(std::string_view name);

/// Applies filter `name` to `args.pos[0]`. Errors: kInvalidArgument for bad operands.
[[nodiscard]] StatusOr<Value> ApplyFilter(const std::string& name, const CallArgs& args);
/// Runs test `name` on `args.pos[0]`.
[[nodiscard]] StatusOr<bool> ApplyTest(const std::string& name, const CallArgs& args);

/// `obj.name` as jinja2's getattr: a Python method of a str/dict/list (bound), else the dict
/// item; Undefined when there is none. Errors: kInvalidArgument for an attribute of Undefined.
[[nodiscard]] StatusOr<Value> GetAttr(const Value& obj, const std::string& name);
/// `obj[key]` as jinja2's getitem: the item, else the attribute; Undefined when missing.
[[nodiscard]] StatusOr<Value> GetItem(const Value& obj, const Value& key);
/// `obj[start:stop:step]` with Python slice semantics (strings by code point).
[[nodiscard]] StatusOr<Value> Slice(const Value& obj, const Value& start, const Value& stop,
                                    const Value& step);

/// The global `name` (range, namespace, dict, raise_exception, strftime_now), or Undefined.
Value Global(const std::string& name);

/// Elements of an iterable as a for loop sees them: list items, dict keys, string characters;
/// Undefined is empty. Errors: kInvalidArgument for other values.
[[nodiscard]] StatusOr<std::vector<Value>> Iterate(const Value& v);

/// Python len(). Errors: kInvalidArgument for values without a length.
[[nodiscard]] StatusOr<int64_t> Length(const Value& v);

/// Message of a raise_exception() call: errors carrying it start with this prefix.
inline constexpr char kRaisedPrefix[] = "template raised an exception: ";

}  // namespace polykv::model::jinja
