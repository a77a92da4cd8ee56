// Unicode Normalization Form C (canonical decomposition, canonical ordering, canonical
// composition; UAX #15), for tokenizer.json files whose normalizer is NFC (Qwen2 and others).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace polykv::model::unicode {

/// NFC of UTF-8 `text`, Unicode 15.1 (the tables of unicode_nfc.cc and
/// unicode_nfc_compose.cc). Bytes that are not valid UTF-8 are kept as they are (each one ends
/// any composition).
std::string NormalizeNfc(std::string_view text);

/// Canonical combining class of `cp` (0 for starters).
uint8_t CombiningClass(uint32_t cp);

namespace nfc_data {
struct Decomp {
  uint32_t cp;
  uint32_t offset;  ///< into kDecompCps
  uint32_t len;
};
struct CccRange {
  uint32_t first;
  uint32_t last;
  uint8_t ccc;
};
struct Compose {
  uint32_t first;
  uint32_t second;
  uint32_t composite;
};
extern const Decomp kDecomp[];
extern const size_t kDecompCount;
extern const uint32_t kDecompCps[];
extern const CccRange kCcc[];
extern const size_t kCccCount;
extern const Compose kCompose[];
extern const size_t kComposeCount;
}  // namespace nfc_data

}  // namespace polykv::model::unicode
