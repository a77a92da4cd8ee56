// Byte-level BPE pre-tokenizers: hand-written matchers equivalent to the regexes llama.cpp
// uses for tokenizer.ggml.pre = default / gpt-2 / smollm / llama3 (std::regex cannot do
// \p{..} and is slow). Matching follows llama.cpp's unicode_regex_split_custom_* semantics.
#include "bpe_pretokenize.h"

#include "absl/strings/str_cat.h"

namespace polykv::model::bpe {
namespace {

using unicode::Category;

constexpr uint32_t kOutOfRange = 0xFFFFFFFFu;

struct Flags {
  bool valid = false;  // false outside the current piece
  bool letter = false;
  bool number = false;
  bool whitespace = false;
};

inline Flags FlagsOf(uint32_t cp) {
  Flags f;
  f.valid = true;
  Category c = unicode::GetCategory(cp);
  f.letter = c == Category::kLetter;
  f.number = c == Category::kNumber;
  f.whitespace = unicode::IsWhitespace(cp);
  return f;
}

inline uint32_t AsciiLower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

// Shared driver: runs `match` over each piece [ini, end) of `pieces`, collecting lengths.
template <typename MatchFn>
std::vector<size_t> SplitPieces(const std::vector<uint32_t>& cps, const std::vector<size_t>& pieces,
                                MatchFn match) {
  std::vector<size_t> out;
  out.reserve(pieces.size() * 2);
  size_t start = 0;
  for (size_t piece : pieces) {
    const size_t ini = start, end = start + piece;
    start = end;
    match(cps, ini, end, &out);
  }
  return out;
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void MatchGpt2(const std::vector<uint32_t>& cps, size_t ini, size_t end, std::vector<size_t>* out) {
  auto cpt = [&](size_t p) { return (p >= ini && p < end) ? cps[p] : kOutOfRange; };
  auto flags = [&](size_t p) { return (p >= ini && p < end) ? FlagsOf(cps[p]) : Flags{}; };
  size_t prev = ini;
  auto add = [&](size_t e) {
    size_t len = e - prev;
    if (len > 0) out->push_back(len);
    prev = e;
    return len;
  };
  for (size_t pos = ini; pos < end;) {
    const uint32_t c = cpt(pos);
    const Flags f = flags(pos);
    if (c == '\'' && pos + 1 < end) {
      const uint32_t n1 = cpt(pos + 1);
      if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
        pos += add(pos + 2);
        continue;
      }
      if (pos + 2 < end) {
        const uint32_t n2 = cpt(pos + 2);
        if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
          pos += add(pos + 3);
          continue;
        }
      }
    }
    Flags f2 = c == ' ' ? flags(pos + 1) : f;
    if (f2.letter) {
      pos += (c == ' ');
      while (f2.letter) f2 = flags(++pos);
      add(pos);
      continue;
    }
    if (f2.number) {
      pos += (c == ' ');
      while (f2.number) f2 = flags(++pos);
      add(pos);
      continue;
    }
    if (!(f2.whitespace || f2.letter || f2.number) && f2.valid) {
      pos += (c == ' ');
      while (!(f2.whitespace || f2.letter || f2.number) && f2.valid) f2 = flags(++pos);
      add(pos);
      continue;
    }
    size_t nws = 0;
    while (flags(pos + nws).whitespace) ++nws;
    if (nws > 1 && cpt(pos + nws) != kOutOfRange) {  // \s+(?!\S)
      pos += nws - 1;
      add(pos);
      continue;
    }
    if (nws > 0) {  // \s+
      pos += nws;
      add(pos);
      continue;
    }
    add(++pos);  // no match
  }
}

// Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
void MatchLlama3(const std::vector<uint32_t>& cps, size_t ini, size_t end,
                 std::vector<size_t>* out) {
  auto cpt = [&](size_t p) { return (p >= ini && p < end) ? cps[p] : kOutOfRange; };
  auto flags = [&](size_t p) { return (p >= ini && p < end) ? FlagsOf(cps[p]) : Flags{}; };
  size_t prev = ini;
  auto add = [&](size_t e) {
    size_t len = e - prev;
    if (len > 0) out->push_back(len);
    prev = e;
    return len;
  };
  for (size_t pos = ini; pos < end;) {
    const uint32_t c = cpt(pos);
    const Flags f = flags(pos);
    if (c == '\'' && pos + 1 < end) {
      const uint32_t n1 = AsciiLower(cpt(pos + 1));
      if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
        pos += add(pos + 2);
        continue;
      }
      if (pos + 2 < end) {
        const uint32_t n2 = AsciiLower(cpt(pos + 2));
        if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
          pos += add(pos + 3);
          continue;
        }
      }
    }
    if (!(c == '\r' || c == '\n' || f.number)) {
      if (f.letter || flags(pos + 1).letter) {
        ++pos;
        while (flags(pos).letter) ++pos;
        add(pos);
        continue;
      }
    }
    if (f.number) {
      size_t first = pos;
      while (flags(pos).number) {
        if (++pos - first >= 3) {
          add(pos);
          first = pos;
        }
      }
      add(pos);
      continue;
    }
    Flags f2 = c == ' ' ? flags(pos + 1) : f;
    if (!(f2.whitespace || f2.letter || f2.number) && f.valid) {
      pos += (c == ' ');
      while (!(f2.whitespace || f2.letter || f2.number) && f2.valid) f2 = flags(++pos);
      uint32_t c2 = cpt(pos);
      while (c2 == '\r' || c2 == '\n') c2 = cpt(++pos);
      add(pos);
      continue;
    }
    size_t nws = 0, last_rn = 0;
    while (flags(pos + nws).whitespace) {
      const uint32_t c2 = cpt(pos + nws);
      if (c2 == '\r' || c2 == '\n') last_rn = pos + nws + 1;
      ++nws;
    }
    if (last_rn > 0) {  // \s*[\r\n]+
      pos = last_rn;
      add(pos);
      continue;
    }
    if (nws > 1 && cpt(pos + nws) != kOutOfRange) {
      pos += nws - 1;
      add(pos);
      continue;
    }
    if (nws > 0) {
      pos += nws;
      add(pos);
      continue;
    }
    add(++pos);
  }
}

// A single-code-point class regex (e.g. "\p{N}"): each match is its own piece, and the text
// between matches stays one piece.
template <typename Pred>
void MatchEach(const std::vector<uint32_t>& cps, size_t ini, size_t end, std::vector<size_t>* out,
               Pred pred) {
  size_t gap = ini;
  for (size_t p = ini; p < end; ++p) {
    if (pred(cps[p])) {
      if (p > gap) out->push_back(p - gap);
      out->push_back(1);
      gap = p + 1;
    }
  }
  if (end > gap) out->push_back(end - gap);
}

// "class+": maximal runs of matching code points are pieces, gaps stay whole. With
// max_run > 0 each run is cut into pieces of exactly max_run; a shorter tail is not a match
// (regex "[0-9][0-9][0-9]") and joins the gap.
template <typename Pred>
void MatchRuns(const std::vector<uint32_t>& cps, size_t ini, size_t end, std::vector<size_t>* out,
               Pred pred, size_t exact = 0) {
  size_t gap = ini;
  size_t p = ini;
  while (p < end) {
    if (!pred(cps[p])) {
      ++p;
      continue;
    }
    size_t q = p;
    while (q < end && pred(cps[q])) ++q;
    if (exact == 0) {
      if (p > gap) out->push_back(p - gap);
      out->push_back(q - p);
      gap = q;
    } else {
      size_t k = p;
      while (q - k >= exact) {
        if (k > gap) out->push_back(k - gap);
        out->push_back(exact);
        k += exact;
        gap = k;
      }
    }
    p = q;
  }
  if (end > gap) out->push_back(end - gap);
}

bool IsNumber(uint32_t cp) { return unicode::GetCategory(cp) == Category::kNumber; }

}  // namespace

StatusOr<PreType> PreTypeFromName(const std::string& pre) {
  if (pre == "default") return PreType::kDefault;
  if (pre == "gpt-2" || pre == "gpt2" || pre == "phi-2" || pre == "roberta-bpe") {
    return PreType::kGpt2;
  }
  if (pre == "smollm") return PreType::kSmolLm;
  if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe") return PreType::kLlama3;
  return absl::UnimplementedError(absl::StrCat(
      "tokenizer.ggml.pre '", pre,
      "' is not supported by PolyKV (supported: default, gpt-2, smollm, llama3/llama-bpe)"));
}

const char* PreTypeName(PreType t) {
  switch (t) {
    case PreType::kDefault:
      return "default";
    case PreType::kGpt2:
      return "gpt-2";
    case PreType::kSmolLm:
      return "smollm";
    case PreType::kLlama3:
      return "llama3";
  }
  return "?";
}

std::vector<size_t> PreTokenize(PreType type, const std::vector<uint32_t>& cps) {
  std::vector<size_t> pieces;
  if (cps.empty()) return pieces;
  pieces.push_back(cps.size());
  switch (type) {
    case PreType::kGpt2:
      return SplitPieces(cps, pieces, MatchGpt2);
    case PreType::kSmolLm:
      pieces = SplitPieces(cps, pieces, [](const auto& c, size_t i, size_t e, auto* o) {
        MatchEach(c, i, e, o, IsNumber);
      });
      return SplitPieces(cps, pieces, MatchGpt2);
    case PreType::kLlama3:
      return SplitPieces(cps, pieces, MatchLlama3);
    case PreType::kDefault: {
      auto is_punct = [](uint32_t cp) {
        switch (cp) {
          case '$':
          case '+':
          case '<':
          case '=':
          case '>':
          case '^':
          case '`':
          case '|':
          case '~':
            return true;
          default:
            return unicode::GetCategory(cp) == Category::kPunctuation;
        }
      };
      pieces = SplitPieces(cps, pieces, [&](const auto& c, size_t i, size_t e, auto* o) {
        MatchEach(c, i, e, o, is_punct);
      });
      pieces = SplitPieces(cps, pieces, MatchGpt2);
      pieces = SplitPieces(cps, pieces, [](const auto& c, size_t i, size_t e, auto* o) {
        MatchRuns(c, i, e, o, IsNumber);
      });
      return SplitPieces(cps, pieces, [](const auto& c, size_t i, size_t e, auto* o) {
        MatchRuns(
            c, i, e, o, [](uint32_t cp) { return cp >= '0' && cp <= '9'; }, 3);
      });
    }
  }
  return pieces;
}

}  // namespace polykv::model::bpe
