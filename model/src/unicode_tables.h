// The two forms of the generated Unicode tables (model/tools/gen_unicode_data.py writes
// unicode_data.cc, unicode_nfc.cc and unicode_nfc_compose.cc) and the one lookup of each.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace polykv::model::unicode::tables {

// A range table gives every code point U+0000..U+10FFFF a byte value: sorted 32-bit words
// (first << 8) | value, one per run of code points with equal values, each run lasting to the
// next word's first; the first word's first is U+0000.
//
//   bit 31 ............ 8 7 ..... 0
//       first code point     value

/// The value of `cp` (at most U+10FFFF) in the range table `words[0, count)`.
inline uint8_t RangeValue(const uint32_t* words, size_t count, uint32_t cp) {
  const uint32_t* it = std::upper_bound(words, words + count, (cp << 8) | 0xFFu);
  return static_cast<uint8_t>(it[-1] & 0xFFu);
}

// A packed map maps a key to a value, together three 21-bit code points in one sorted word
// (key, then value, from bit 62 down): (cp, first, second) for the decompositions, where the
// key is one code point and the value two, and (first, second, composite) for the
// compositions, where the key is two and the value one.

/// Finds the word of `words[0, count)` whose bits above `value_bits` equal `key`; stores its
/// low `value_bits` bits in `*value`. False when there is none.
inline bool FindPacked(const uint64_t* words, size_t count, uint64_t key, int value_bits,
                       uint64_t* value) {
  const uint64_t* end = words + count;
  const uint64_t* it = std::lower_bound(words, end, key << value_bits);
  if (it == end || (*it >> value_bits) != key) return false;
  *value = *it & ((uint64_t{1} << value_bits) - 1);
  return true;
}

/// Bits of one code point in a packed map.
inline constexpr int kCodePointBits = 21;

/// General category (GeneralCategory's numbering) of every code point: a range table
/// (unicode_data.cc).
extern const uint32_t kCategory[];
extern const size_t kCategoryCount;
/// Canonical combining class of every code point: a range table (unicode_nfc_compose.cc).
extern const uint32_t kCcc[];
extern const size_t kCccCount;
/// One-level canonical decompositions, cp -> (first, second; 0 for a singleton): a packed
/// map (unicode_nfc.cc). Hangul syllables are algorithmic and not in it.
extern const uint64_t kDecomp[];
extern const size_t kDecompCount;
/// Primary composites, (first, second) -> composite: a packed map (unicode_nfc_compose.cc).
extern const uint64_t kCompose[];
extern const size_t kComposeCount;

}  // namespace polykv::model::unicode::tables
