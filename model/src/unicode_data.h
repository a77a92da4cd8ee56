// Unicode helpers for the tokenizers: general category lookup, White_Space, UTF-8 coding.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace polykv::model::unicode {

/// Unicode general category (UnicodeData.txt field 2), Unicode 15.1 (the version of
/// llama.cpp's tables). The order is that of model/tools/gen_unicode_data.py.
enum class GeneralCategory : uint8_t {
  kCn = 0,  ///< unassigned
  kLu,
  kLl,
  kLt,
  kLm,
  kLo,
  kMn,
  kMc,
  kMe,
  kNd,
  kNl,
  kNo,
  kPc,
  kPd,
  kPs,
  kPe,
  kPi,
  kPf,
  kPo,
  kSm,
  kSc,
  kSk,
  kSo,
  kZs,
  kZl,
  kZp,
  kCc,
  kCf,
  kCs,
  kCo,
};
constexpr int kNumGeneralCategories = 30;

/// Unicode version of the tables ("15.1.0").
extern const char kUnicodeVersion[];

/// General category of `cp`. Invalid-byte markers above U+10FFFF (see DecodeUtf8) are So,
/// like the U+FFFD that llama.cpp substitutes for invalid UTF-8.
GeneralCategory GetGeneralCategory(uint32_t cp);

/// Major Unicode general category of a code point (first letter of the category name).
enum class Category : uint8_t {
  kOther = 0,        ///< C*: control, format, unassigned, private use, surrogate
  kLetter = 1,       ///< L*  (regex \p{L})
  kNumber = 2,       ///< N*  (regex \p{N})
  kPunctuation = 3,  ///< P*  (regex \p{P})
  kSymbol = 4,       ///< S*  (regex \p{S}; also the invalid-byte markers)
  kMark = 5,         ///< M*  (regex \p{M})
  kSeparator = 6,    ///< Z*  (regex \p{Z})
};

/// Major category of each general category, indexed by GeneralCategory.
inline constexpr Category kMajorCategory[kNumGeneralCategories] = {
    Category::kOther,                                                        // Cn
    Category::kLetter,      Category::kLetter,      Category::kLetter,       // Lu Ll Lt
    Category::kLetter,      Category::kLetter,                               // Lm Lo
    Category::kMark,        Category::kMark,        Category::kMark,         // Mn Mc Me
    Category::kNumber,      Category::kNumber,      Category::kNumber,       // Nd Nl No
    Category::kPunctuation, Category::kPunctuation, Category::kPunctuation,  // Pc Pd Ps
    Category::kPunctuation, Category::kPunctuation, Category::kPunctuation,  // Pe Pi Pf
    Category::kPunctuation,                                                  // Po
    Category::kSymbol,      Category::kSymbol,      Category::kSymbol,       // Sm Sc Sk
    Category::kSymbol,                                                       // So
    Category::kSeparator,   Category::kSeparator,   Category::kSeparator,    // Zs Zl Zp
    Category::kOther,       Category::kOther,       Category::kOther,        // Cc Cf Cs
    Category::kOther,                                                        // Co
};

/// Major category of a general category.
constexpr Category MajorCategory(GeneralCategory gc) {
  return kMajorCategory[static_cast<int>(gc)];
}

/// Major category of `cp` (MajorCategory(GetGeneralCategory(cp))).
inline Category GetCategory(uint32_t cp) { return MajorCategory(GetGeneralCategory(cp)); }

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
