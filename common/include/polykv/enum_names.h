// Enum <-> name tables: each vocabulary is one constexpr table of {value, name} pairs, from
// which both the name of a value and the value of a name are looked up.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace polykv {

/// One row of an enum's name table.
template <typename E>
struct EnumName {
  E value;
  const char* name;  ///< static storage
};

/// The name of `value` in `table`, or `fallback` when no row has it.
template <typename E, size_t N>
constexpr const char* EnumToName(const EnumName<E> (&table)[N], E value,
                                 const char* fallback = "unknown") {
  for (const EnumName<E>& row : table) {
    if (row.value == value) return row.name;
  }
  return fallback;
}

/// The value named `name` in `table` (exact, case-sensitive), or nullopt.
template <typename E, size_t N>
constexpr std::optional<E> EnumFromName(const EnumName<E> (&table)[N], std::string_view name) {
  for (const EnumName<E>& row : table) {
    if (name == row.name) return row.value;
  }
  return std::nullopt;
}

/// The table's names as prose for error messages: "a", "a or b", "a, b or c".
template <typename E, size_t N>
std::string EnumNameList(const EnumName<E> (&table)[N]) {
  std::string out;
  for (size_t i = 0; i < N; ++i) {
    if (i > 0) out += i + 1 == N ? " or " : ", ";
    out += table[i].name;
  }
  return out;
}

}  // namespace polykv
