// Unicode helpers for the tokenizers: general category lookup, White_Space, UTF-8 coding.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace polykv::model::unicode {

/// Major Unicode general category of a code point (first letter of the category name).
enum class Category : uint8_t {
  kOther = 0,        ///< C*: control, format, unassigned, private use (and invalid bytes)
  kLetter = 1,       ///< L*  (regex \p{L})
  kNumber = 2,       ///< N*  (regex \p{N})
  kPunctuation = 3,  ///< P*  (regex \p{P})
  kSymbol = 4,       ///< S*  (regex \p{S})
  kMark = 5,         ///< M*  (regex \p{M})
  kSeparator = 6,    ///< Z*  (regex \p{Z})
};

/// Category of `cp`; kOther for anything above U+10FFFF (e.g. invalid-byte markers).
Category GetCategory(uint32_t cp);

/// Unicode White_Space property (regex \s in llama.cpp's pre-tokenizers).
bool IsWhitespace(uint32_t cp);

/// Code points of UTF-8 `text` with the byte length of each. Invalid or truncated
/// sequences yield one marker code point 0x110000 + byte per offending byte (length 1), so
/// decoding never fails and byte-level BPE stays lossless.
struct CodePoints {
  std::vector<uint32_t> cps;
  std::vector<uint8_t> lens;
};
CodePoints DecodeUtf8(std::string_view text);

/// UTF-8 encoding of a valid code point (< 0x110000).
std::string EncodeUtf8(uint32_t cp);

/// Length of the UTF-8 sequence starting with byte `c` (1 for invalid lead bytes).
inline size_t Utf8Len(unsigned char c) {
  static const uint8_t kLookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLookup[c >> 4];
}

}  // namespace polykv::model::unicode
