// A small Unicode regex engine for BPE pre-tokenizer patterns (llama.cpp's regex lists and HF
// tokenizer.json Split patterns): Oniguruma semantics over code points, leftmost-first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "polykv/status.h"
#include "unicode_data.h"

namespace polykv::model::bpe {

/// Text as the regex sees it: code points with their general categories, computed once.
struct Subject {
  explicit Subject(const std::vector<uint32_t>& cps);
  const std::vector<uint32_t>& cps;
  std::vector<unicode::GeneralCategory> gc;  ///< per code point
  std::vector<uint8_t> ws;                   ///< per code point: White_Space
};

/// A compiled pattern. Supported syntax (Oniguruma, as HF tokenizers uses it):
///  - literals (UTF-8), escapes \t \n \r \f \v \a \e \0 \xHH \x{H..} \uHHHH and escaped
///    punctuation; `.` (any but \n);
///  - classes [..] with ranges, negation, nested classes (union) and && (intersection);
///    \s \S (White_Space), \d \D (Nd), \w \W (L, M, N, Pc), \h \H (hex digit),
///    \p{..} \P{..} \p{^..} with general categories L Lu Ll Lt Lm Lo LC M Mn Mc Me N Nd Nl No
///    P Pc Pd Ps Pe Pi Pf Po S Sm Sc Sk So Z Zs Zl Zp C Cc Cf Cs Co Cn (and their long names);
///  - groups (..), (?:..), (?<name>..), (?i:..) / (?-i:..) / (?i) (simple case folding of
///    ASCII letters, U+017F and U+212A, as Oniguruma), lookahead (?=..) (?!..);
///  - anchors ^ $ (line), \A \z \Z, \b \B (Unicode word boundary, word = L M N Pc);
///  - quantifiers * + ? {n} {n,} {n,m}, lazy (..?) and, on single characters or classes,
///    possessive (..+).
/// Not supported (kUnimplemented naming the construct): lookbehind, atomic groups,
/// backreferences, scripts (\p{Han}), POSIX brackets, unbounded loops over bodies that can
/// match the empty string.
class Regex {
 public:
  [[nodiscard]] static StatusOr<std::shared_ptr<const Regex>> Compile(std::string_view pattern);
  ~Regex();

  /// All matches in cps[begin, end) left to right, as std::regex_iterator / HF find_iter:
  /// each search starts where the previous match ended; after an empty match the next one
  /// must be non-empty at that position or start later. The range is the whole subject
  /// (anchors and lookahead do not see beyond it). Pairs are [start, end) in code points.
  void FindAll(const Subject& s, size_t begin, size_t end,
               std::vector<std::pair<size_t, size_t>>* out) const;

  const std::string& pattern() const { return pattern_; }

  struct Impl;

 private:
  Regex() = default;
  std::string pattern_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace polykv::model::bpe
