// Python str operations on UTF-8 text for the Jinja engine: strip/split with Python's
// whitespace set, code-point indexing, case mapping (ASCII letters only).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace polykv::model::jinja::pystr {

/// UTF-8 code points of `s` as substrings (an invalid byte is one code point).
std::vector<std::string> CodePoints(std::string_view s);
/// Number of code points.
int64_t Length(std::string_view s);
/// Python str.isspace() for one code point (UTF-8).
bool IsSpace(std::string_view cp);

enum class Side { kBoth, kLeft, kRight };
/// str.strip()/lstrip()/rstrip(): whitespace when `chars` is null, else the code points in it.
std::string Strip(std::string_view s, const std::string* chars, Side side);
/// str.split(sep, maxsplit): whitespace runs when `sep` is null (empty parts dropped).
std::vector<std::string> Split(std::string_view s, const std::string* sep, int64_t maxsplit);
/// str.replace(old, new, count); count < 0 replaces all.
std::string Replace(std::string_view s, std::string_view from, std::string_view to, int64_t count);
/// str.upper()/lower()/capitalize()/title() (ASCII letters; other text unchanged).
std::string Upper(std::string_view s);
std::string Lower(std::string_view s);
std::string Capitalize(std::string_view s);
std::string TitleMethod(std::string_view s);
/// jinja2's title filter: first letter of each word upper, the rest lower.
std::string TitleFilter(std::string_view s);

}  // namespace polykv::model::jinja::pystr
