// Unicode Normalization Form C (canonical decomposition, canonical ordering, canonical
// composition; UAX #15), for tokenizer.json files whose normalizer is NFC (Qwen2 and others).
#pragma once

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

}  // namespace polykv::model::unicode
