// Helpers shared by the tokenizer tests: paths under tests/data and printable test strings.
#pragma once

#include <string>

namespace polykv::model::testing {

/// `rel` under tests/data (POLYKV_TEST_DATA_DIR).
inline std::string DataPath(const std::string& rel) {
  return std::string(POLYKV_TEST_DATA_DIR) + "/" + rel;
}

/// `s` with newlines, tabs and carriage returns written as \n, \t and \r, for failure
/// messages.
inline std::string Escape(const std::string& s) {
  std::string r;
  for (unsigned char c : s) {
    if (c == '\n') {
      r += "\\n";
    } else if (c == '\t') {
      r += "\\t";
    } else if (c == '\r') {
      r += "\\r";
    } else {
      r += static_cast<char>(c);
    }
  }
  return r;
}

}  // namespace polykv::model::testing
