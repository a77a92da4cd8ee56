// The regex engine's parts shared by its parser (bpe_regex_parse.cc) and its compiler and
// matcher (bpe_regex.cc): general-category masks, character classes and the pattern's AST.
// Not installed.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "bpe_regex.h"
#include "polykv/status.h"
#include "unicode_data.h"

namespace polykv::model::bpe::regex_internal {

using unicode::GeneralCategory;

inline constexpr uint32_t kInf = 0xFFFFFFFFu;
inline uint32_t GcBit(GeneralCategory g) { return 1u << static_cast<int>(g); }

inline constexpr uint32_t kMaskL = (1u << 1) | (1u << 2) | (1u << 3) | (1u << 4) | (1u << 5);
inline constexpr uint32_t kMaskM = (1u << 6) | (1u << 7) | (1u << 8);
inline constexpr uint32_t kMaskN = (1u << 9) | (1u << 10) | (1u << 11);
inline constexpr uint32_t kMaskP = 0x7Fu << 12;
inline constexpr uint32_t kMaskS = 0xFu << 19;
inline constexpr uint32_t kMaskZ = 0x7u << 23;
inline constexpr uint32_t kMaskC = 1u | (0xFu << 26);
inline constexpr uint32_t kMaskWord = kMaskL | kMaskM | kMaskN | (1u << 12);  // L M N Pc (Onig \w)

// A character class: union of ranges, category masks and property items, optionally
// intersected with other classes, optionally negated.
struct CharClass {
  bool negated = false;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  uint32_t gc_mask = 0;
  std::vector<uint32_t> not_gc_masks;  // \P{..} items: match when the category is outside
  bool ws = false, not_ws = false;
  bool word = false, not_word = false;
  bool not_newline = false;          // `.`
  std::vector<CharClass> nested;     // unions
  std::vector<CharClass> intersect;  // && operands
  bool ascii[128] = {};

  bool Slow(uint32_t c, GeneralCategory g, bool is_ws) const {
    bool m = false;
    for (const auto& r : ranges) {
      if (c >= r.first && c <= r.second) {
        m = true;
        break;
      }
    }
    const uint32_t bit = GcBit(g);
    if (!m && (gc_mask & bit)) m = true;
    if (!m) {
      for (uint32_t nm : not_gc_masks) {
        if (!(nm & bit)) {
          m = true;
          break;
        }
      }
    }
    if (!m && ((ws && is_ws) || (not_ws && !is_ws))) m = true;
    if (!m && ((word && (kMaskWord & bit)) || (not_word && !(kMaskWord & bit)))) m = true;
    if (!m && not_newline && c != '\n') m = true;
    if (!m) {
      for (const CharClass& n : nested) {
        if (n.Match(c, g, is_ws)) {
          m = true;
          break;
        }
      }
    }
    if (m) {
      for (const CharClass& n : intersect) {
        if (!n.Match(c, g, is_ws)) {
          m = false;
          break;
        }
      }
    }
    return m != negated;
  }
  bool Match(uint32_t c, GeneralCategory g, bool is_ws) const {
    return c < 128 ? ascii[c] : Slow(c, g, is_ws);
  }
  void Finish() {
    for (CharClass& n : nested) n.Finish();
    for (CharClass& n : intersect) n.Finish();
    for (uint32_t c = 0; c < 128; ++c) {
      ascii[c] = Slow(c, unicode::GetGeneralCategory(c), unicode::IsWhitespace(c));
    }
  }
  // Adds the case variants of the ranges (for (?i)): ASCII letters and the two non-ASCII
  // code points whose simple case folding is ASCII, U+017F LONG S (s) and U+212A KELVIN
  // SIGN (k), as Oniguruma folds them (HF tokenizers: (?i:'s) matches "'\u017f").
  void AddCaseVariants() {
    std::vector<std::pair<uint32_t, uint32_t>> extra;
    auto has = [&](uint32_t c) {
      for (const auto& r : ranges) {
        if (c >= r.first && c <= r.second) return true;
      }
      return false;
    };
    for (uint32_t c = 'A'; c <= 'Z'; ++c) {
      if (has(c) || has(c + 32)) {
        extra.push_back({c, c});
        extra.push_back({c + 32, c + 32});
      }
    }
    for (const auto& [lower, other] : {std::pair<uint32_t, uint32_t>{'s', 0x17F}, {'k', 0x212A}}) {
      if (has(lower) || has(lower - 32) || has(other)) {
        extra.insert(extra.end(), {{lower, lower}, {lower - 32, lower - 32}, {other, other}});
      }
    }
    ranges.insert(ranges.end(), extra.begin(), extra.end());
  }
};

enum class NodeKind { kEmpty, kClass, kConcat, kAlt, kRepeat, kLook, kAssert };
enum class AssertKind { kBol, kEol, kBeginText, kEndText, kEndTextNl, kWordB, kNotWordB };
enum class RepMode { kGreedy, kLazy, kPossessive };

struct Node {
  NodeKind kind = NodeKind::kEmpty;
  int cls = -1;  // kClass
  std::vector<std::unique_ptr<Node>> kids;
  uint32_t min = 0, max = 0;  // kRepeat
  RepMode mode = RepMode::kGreedy;
  bool negative = false;  // kLook
  AssertKind assert_kind = AssertKind::kBol;
};

/// Parses `pattern` (the syntax Regex documents) into its AST; the character classes are
/// appended to `*classes` (Node::cls indexes them), finished (ASCII table) and, under (?i),
/// with their case variants. Errors: kUnimplemented naming the construct and its position.
[[nodiscard]] StatusOr<std::unique_ptr<Node>> ParsePattern(std::string_view pattern,
                                                           std::vector<CharClass>* classes);

}  // namespace polykv::model::bpe::regex_internal
