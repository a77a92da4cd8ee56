// General category and White_Space of a code point, over the generated range table of
// unicode_data.cc.
#include "unicode_data.h"
#include "unicode_tables.h"

namespace polykv::model::unicode {

GeneralCategory GetGeneralCategory(uint32_t cp) {
  if (cp < 0x80) {
    // Fast path for ASCII letters and digits.
    if (cp >= 'a' && cp <= 'z') return GeneralCategory::kLl;
    if (cp >= 'A' && cp <= 'Z') return GeneralCategory::kLu;
    if (cp >= '0' && cp <= '9') return GeneralCategory::kNd;
  }
  // Invalid-byte markers (see DecodeUtf8) behave like U+FFFD REPLACEMENT CHARACTER (So),
  // which llama.cpp substitutes for invalid UTF-8.
  if (cp > 0x10FFFF) return GeneralCategory::kSo;
  return static_cast<GeneralCategory>(
      tables::RangeValue(tables::kCategory, tables::kCategoryCount, cp));
}

bool IsWhitespace(uint32_t cp) {
  // Unicode White_Space property (PropList.txt).
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

}  // namespace polykv::model::unicode
