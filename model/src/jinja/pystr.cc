// Python str operations on UTF-8 text (see pystr.h).
#include "jinja/pystr.h"

#include <algorithm>

namespace polykv::model::jinja::pystr {
namespace {

size_t CpLen(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;
}

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' ||
         (c >= 0x1c && c <= 0x1f);
}
char Up(char c) { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c; }
char Low(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; }
bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

}  // namespace

std::vector<std::string> CodePoints(std::string_view s) {
  std::vector<std::string> out;
  for (size_t k = 0; k < s.size();) {
    size_t n = std::min(CpLen(static_cast<unsigned char>(s[k])), s.size() - k);
    out.emplace_back(s.substr(k, n));
    k += n;
  }
  return out;
}

int64_t Length(std::string_view s) {
  int64_t n = 0;
  for (size_t k = 0; k < s.size();
       k += std::min(CpLen(static_cast<unsigned char>(s[k])), s.size() - k)) {
    ++n;
  }
  return n;
}

bool IsSpace(std::string_view cp) {
  if (cp.size() == 1) return IsAsciiSpace(cp[0]);
  static const char* kSpaces[] = {"\xc2\x85",     "\xc2\xa0",     "\xe1\x9a\x80", "\xe2\x80\x80",
                                  "\xe2\x80\x81", "\xe2\x80\x82", "\xe2\x80\x83", "\xe2\x80\x84",
                                  "\xe2\x80\x85", "\xe2\x80\x86", "\xe2\x80\x87", "\xe2\x80\x88",
                                  "\xe2\x80\x89", "\xe2\x80\x8a", "\xe2\x80\xa8", "\xe2\x80\xa9",
                                  "\xe2\x80\xaf", "\xe2\x81\x9f", "\xe3\x80\x80"};
  for (const char* sp : kSpaces) {
    if (cp == sp) return true;
  }
  return false;
}

std::string Strip(std::string_view s, const std::string* chars, Side side) {
  std::vector<std::string> cps = CodePoints(s);
  std::vector<std::string> set;
  if (chars != nullptr) set = CodePoints(*chars);
  auto strip_it = [&](const std::string& cp) {
    if (chars == nullptr) return IsSpace(cp);
    return std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (side != Side::kRight) {
    while (b < e && strip_it(cps[b])) ++b;
  }
  if (side != Side::kLeft) {
    while (e > b && strip_it(cps[e - 1])) --e;
  }
  std::string out;
  for (size_t k = b; k < e; ++k) out += cps[k];
  return out;
}

std::vector<std::string> Split(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep != nullptr) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      size_t p = s.find(*sep, start);
      if (p == std::string_view::npos) break;
      out.emplace_back(s.substr(start, p - start));
      start = p + sep->size();
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  std::vector<std::string> cps = CodePoints(s);
  size_t k = 0;
  while (k < cps.size()) {
    while (k < cps.size() && IsSpace(cps[k])) ++k;
    if (k == cps.size()) break;
    std::string word;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      // The rest, with trailing whitespace stripped, is the last part.
      for (; k < cps.size(); ++k) word += cps[k];
      out.push_back(Strip(word, nullptr, Side::kRight));
      break;
    }
    while (k < cps.size() && !IsSpace(cps[k])) word += cps[k++];
    out.push_back(std::move(word));
  }
  return out;
}

std::string Replace(std::string_view s, std::string_view from, std::string_view to, int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between code points (and at both ends).
    std::vector<std::string> cps = CodePoints(s);
    int64_t done = 0;
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (k < cps.size()) out += cps[k];
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t p = s.find(from, start);
    if (p == std::string_view::npos) break;
    out.append(s.substr(start, p - start));
    out.append(to);
    start = p + from.size();
    ++done;
  }
  out.append(s.substr(start));
  return out;
}

std::string Upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = Up(c);
  return out;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = Low(c);
  return out;
}

std::string Capitalize(std::string_view s) {
  std::string out = Lower(s);
  if (!out.empty()) out[0] = Up(out[0]);
  return out;
}

std::string TitleMethod(std::string_view s) {
  std::string out(s);
  bool prev_cased = false;
  for (char& c : out) {
    if (IsAlpha(c)) {
      c = prev_cased ? Low(c) : Up(c);
      prev_cased = true;
    } else {
      prev_cased = false;
    }
  }
  return out;
}

std::string TitleFilter(std::string_view s) {
  // jinja2: words split at runs of [-\s({[<]; each word is capitalized.
  std::string out;
  bool start = true;
  for (char c : s) {
    const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || IsAsciiSpace(c);
    if (sep) {
      out += c;
      start = true;
    } else {
      out += start ? Up(c) : Low(c);
      start = false;
    }
  }
  return out;
}

}  // namespace polykv::model::jinja::pystr
