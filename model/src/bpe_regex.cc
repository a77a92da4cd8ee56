// Regex engine for pre-tokenizer patterns: a recursive-descent parser to an AST, a compiler
// to a small backtracking program, and an explicit-stack matcher with a (state, position)
// memo so that patterns stay linear on long whitespace or letter runs.
#include "bpe_regex.h"

#include <algorithm>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace polykv::model::bpe {

using unicode::GeneralCategory;

Subject::Subject(const std::vector<uint32_t>& c) : cps(c) {
  gc.resize(cps.size());
  ws.resize(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) {
    gc[i] = unicode::GetGeneralCategory(cps[i]);
    ws[i] = unicode::IsWhitespace(cps[i]) ? 1 : 0;
  }
}

namespace {

constexpr uint32_t kInf = 0xFFFFFFFFu;
constexpr size_t kMaxProgram = 200000;

uint32_t GcBit(GeneralCategory g) { return 1u << static_cast<int>(g); }

constexpr uint32_t kMaskL = (1u << 1) | (1u << 2) | (1u << 3) | (1u << 4) | (1u << 5);
constexpr uint32_t kMaskM = (1u << 6) | (1u << 7) | (1u << 8);
constexpr uint32_t kMaskN = (1u << 9) | (1u << 10) | (1u << 11);
constexpr uint32_t kMaskP = 0x7Fu << 12;
constexpr uint32_t kMaskS = 0xFu << 19;
constexpr uint32_t kMaskZ = 0x7u << 23;
constexpr uint32_t kMaskC = 1u | (0xFu << 26);
constexpr uint32_t kMaskWord = kMaskL | kMaskM | kMaskN | (1u << 12);  // L M N Pc (Onig \w)

// General-category mask of a \p{..} name, 0 when unknown.
uint32_t CategoryMask(std::string_view name) {
  struct Entry {
    const char* name;
    uint32_t mask;
  };
  static const Entry kEntries[] = {
      {"L", kMaskL},
      {"Letter", kMaskL},
      {"Lu", 1u << 1},
      {"Uppercase_Letter", 1u << 1},
      {"Ll", 1u << 2},
      {"Lowercase_Letter", 1u << 2},
      {"Lt", 1u << 3},
      {"Titlecase_Letter", 1u << 3},
      {"Lm", 1u << 4},
      {"Modifier_Letter", 1u << 4},
      {"Lo", 1u << 5},
      {"Other_Letter", 1u << 5},
      {"LC", (1u << 1) | (1u << 2) | (1u << 3)},
      {"L&", (1u << 1) | (1u << 2) | (1u << 3)},
      {"M", kMaskM},
      {"Mark", kMaskM},
      {"Mn", 1u << 6},
      {"Mc", 1u << 7},
      {"Me", 1u << 8},
      {"N", kMaskN},
      {"Number", kMaskN},
      {"Nd", 1u << 9},
      {"Decimal_Number", 1u << 9},
      {"Nl", 1u << 10},
      {"No", 1u << 11},
      {"P", kMaskP},
      {"Punctuation", kMaskP},
      {"Pc", 1u << 12},
      {"Pd", 1u << 13},
      {"Ps", 1u << 14},
      {"Pe", 1u << 15},
      {"Pi", 1u << 16},
      {"Pf", 1u << 17},
      {"Po", 1u << 18},
      {"S", kMaskS},
      {"Symbol", kMaskS},
      {"Sm", 1u << 19},
      {"Sc", 1u << 20},
      {"Sk", 1u << 21},
      {"So", 1u << 22},
      {"Z", kMaskZ},
      {"Separator", kMaskZ},
      {"Zs", 1u << 23},
      {"Zl", 1u << 24},
      {"Zp", 1u << 25},
      {"C", kMaskC},
      {"Other", kMaskC},
      {"Cc", 1u << 26},
      {"Cf", 1u << 27},
      {"Cs", 1u << 28},
      {"Co", 1u << 29},
      {"Cn", 1u},
  };
  for (const Entry& e : kEntries) {
    if (name == e.name) return e.mask;
  }
  return 0;
}

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

bool Nullable(const Node& n) {
  switch (n.kind) {
    case NodeKind::kEmpty:
    case NodeKind::kLook:
    case NodeKind::kAssert:
      return true;
    case NodeKind::kClass:
      return false;
    case NodeKind::kConcat:
      for (const auto& k : n.kids) {
        if (!Nullable(*k)) return false;
      }
      return true;
    case NodeKind::kAlt:
      for (const auto& k : n.kids) {
        if (Nullable(*k)) return true;
      }
      return false;
    case NodeKind::kRepeat:
      return n.min == 0 || Nullable(*n.kids[0]);
  }
  return true;
}

class Parser {
 public:
  Parser(std::string_view pattern, std::vector<CharClass>* classes)
      : classes_(classes), pattern_(pattern) {
    unicode::CodePoints cps = unicode::DecodeUtf8(pattern);
    p_ = std::move(cps.cps);
  }

  StatusOr<std::unique_ptr<Node>> Parse() {
    POLYKV_ASSIGN_OR_RETURN(auto n, ParseAlt(false));
    if (i_ < p_.size()) return Error("unbalanced ')'");
    return n;
  }

 private:
  Status Error(std::string_view what) const {
    return absl::UnimplementedError(absl::StrCat("pre-tokenizer regex '", pattern_,
                                                 "': ", std::string(what), " at code point ", i_));
  }
  bool More() const { return i_ < p_.size(); }
  uint32_t Peek(size_t k = 0) const { return i_ + k < p_.size() ? p_[i_ + k] : 0xFFFFFFFFu; }

  int AddClass(CharClass c) {
    if (icase_) c.AddCaseVariants();
    c.Finish();
    classes_->push_back(std::move(c));
    return static_cast<int>(classes_->size()) - 1;
  }
  std::unique_ptr<Node> ClassNode(CharClass c) {
    auto n = std::make_unique<Node>();
    n->kind = NodeKind::kClass;
    n->cls = AddClass(std::move(c));
    return n;
  }
  std::unique_ptr<Node> LiteralNode(uint32_t c) {
    CharClass cc;
    cc.ranges.push_back({c, c});
    return ClassNode(std::move(cc));
  }

  StatusOr<std::unique_ptr<Node>> ParseAlt(bool in_group) {
    const bool saved_icase = icase_;
    std::vector<std::unique_ptr<Node>> alts;
    while (true) {
      POLYKV_ASSIGN_OR_RETURN(auto seq, ParseConcat());
      alts.push_back(std::move(seq));
      if (More() && Peek() == '|') {
        ++i_;
        continue;
      }
      break;
    }
    if (More() && Peek() == ')' && !in_group) return Error("unbalanced ')'");
    icase_ = saved_icase;  // (?i) lasts to the end of the enclosing group
    if (alts.size() == 1) return std::move(alts[0]);
    auto n = std::make_unique<Node>();
    n->kind = NodeKind::kAlt;
    n->kids = std::move(alts);
    return n;
  }

  StatusOr<std::unique_ptr<Node>> ParseConcat() {
    auto cat = std::make_unique<Node>();
    cat->kind = NodeKind::kConcat;
    while (More() && Peek() != '|' && Peek() != ')') {
      POLYKV_ASSIGN_OR_RETURN(auto atom, ParseAtom());
      if (atom == nullptr) continue;  // (?i) flag group
      POLYKV_ASSIGN_OR_RETURN(atom, ParseQuantifiers(std::move(atom)));
      cat->kids.push_back(std::move(atom));
    }
    if (cat->kids.size() == 1) return std::move(cat->kids[0]);
    if (cat->kids.empty()) cat->kind = NodeKind::kEmpty;
    return cat;
  }

  // Parses "{n}", "{n,}", "{n,m}" at i_; false (i_ unchanged) when it is not a quantifier.
  bool ParseBraces(uint32_t* mn, uint32_t* mx) {
    size_t j = i_ + 1;
    auto num = [&](uint32_t* v) {
      size_t s = j;
      uint64_t x = 0;
      while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9') {
        x = x * 10 + (p_[j] - '0');
        if (x > 100000) return false;
        ++j;
      }
      *v = static_cast<uint32_t>(x);
      return j > s;
    };
    uint32_t a = 0, b = 0;
    bool has_a = num(&a);
    if (j < p_.size() && p_[j] == '}') {
      if (!has_a) return false;
      *mn = *mx = a;
      i_ = j + 1;
      return true;
    }
    if (j >= p_.size() || p_[j] != ',') return false;
    ++j;
    bool has_b = num(&b);
    if (j >= p_.size() || p_[j] != '}') return false;
    if (!has_a) a = 0;  // Onig: {,n} is {0,n}
    if (!has_a && !has_b) return false;
    *mn = a;
    *mx = has_b ? b : kInf;
    if (*mx < *mn) return false;
    i_ = j + 1;
    return true;
  }

  StatusOr<std::unique_ptr<Node>> ParseQuantifiers(std::unique_ptr<Node> atom) {
    while (More()) {
      uint32_t mn, mx;
      const uint32_t c = Peek();
      if (c == '*') {
        mn = 0, mx = kInf, ++i_;
      } else if (c == '+') {
        mn = 1, mx = kInf, ++i_;
      } else if (c == '?') {
        mn = 0, mx = 1, ++i_;
      } else if (c == '{' && ParseBraces(&mn, &mx)) {
      } else {
        break;
      }
      RepMode mode = RepMode::kGreedy;
      if (More() && Peek() == '?') {
        mode = RepMode::kLazy;
        ++i_;
      } else if (More() && Peek() == '+') {
        mode = RepMode::kPossessive;
        ++i_;
      }
      if (atom->kind == NodeKind::kLook || atom->kind == NodeKind::kAssert) {
        return Error("quantifier on an assertion");
      }
      auto r = std::make_unique<Node>();
      r->kind = NodeKind::kRepeat;
      r->min = mn;
      r->max = mx;
      r->mode = mode;
      r->kids.push_back(std::move(atom));
      atom = std::move(r);
    }
    return atom;
  }

  // Escape after '\' (i_ at the char after the backslash). In a class, `cc` receives class
  // items; outside, a node is returned. Sets *literal for plain characters.
  StatusOr<bool> ParseEscape(CharClass* cc, uint32_t* literal, std::unique_ptr<Node>* assert_node) {
    if (!More()) return Error("trailing backslash");
    const uint32_t c = p_[i_++];
    switch (c) {
      case 't':
        *literal = '\t';
        return true;
      case 'n':
        *literal = '\n';
        return true;
      case 'r':
        *literal = '\r';
        return true;
      case 'f':
        *literal = '\f';
        return true;
      case 'v':
        *literal = '\v';
        return true;
      case 'a':
        *literal = 0x07;
        return true;
      case 'e':
        *literal = 0x1B;
        return true;
      case '0':
        *literal = 0;
        return true;
      case 's':
        cc->ws = true;
        return false;
      case 'S':
        cc->not_ws = true;
        return false;
      case 'd':
        cc->gc_mask |= 1u << 9;
        return false;
      case 'D':
        cc->not_gc_masks.push_back(1u << 9);
        return false;
      case 'w':
        cc->word = true;
        return false;
      case 'W':
        cc->not_word = true;
        return false;
      case 'h':
        cc->ranges.insert(cc->ranges.end(), {{'0', '9'}, {'a', 'f'}, {'A', 'F'}});
        return false;
      case 'H': {
        CharClass h;
        h.negated = true;
        h.ranges = {{'0', '9'}, {'a', 'f'}, {'A', 'F'}};
        h.Finish();
        cc->nested.push_back(std::move(h));
        return false;
      }
      case 'p':
      case 'P': {
        if (!More() || Peek() != '{') return Error("\\p without {name}");
        ++i_;
        bool neg = c == 'P';
        if (More() && Peek() == '^') {
          neg = !neg;
          ++i_;
        }
        std::string name;
        while (More() && Peek() != '}') name += static_cast<char>(p_[i_++] & 0x7F);
        if (!More()) return Error("unterminated \\p{");
        ++i_;
        const uint32_t mask = CategoryMask(name);
        if (mask == 0) return Error(absl::StrCat("unsupported property \\p{", name, "}"));
        if (neg) {
          cc->not_gc_masks.push_back(mask);
        } else {
          cc->gc_mask |= mask;
        }
        return false;
      }
      case 'x': {
        uint32_t v = 0;
        int digits = 0;
        auto hex = [](uint32_t h) -> int {
          if (h >= '0' && h <= '9') return h - '0';
          if (h >= 'a' && h <= 'f') return h - 'a' + 10;
          if (h >= 'A' && h <= 'F') return h - 'A' + 10;
          return -1;
        };
        if (More() && Peek() == '{') {
          ++i_;
          while (More() && Peek() != '}' && hex(Peek()) >= 0 && digits < 8) {
            v = v * 16 + hex(p_[i_++]);
            ++digits;
          }
          if (!More() || Peek() != '}' || digits == 0) return Error("bad \\x{..}");
          ++i_;
        } else {
          while (More() && digits < 2 && hex(Peek()) >= 0) {
            v = v * 16 + hex(p_[i_++]);
            ++digits;
          }
          if (digits == 0) return Error("bad \\x");
        }
        *literal = v;
        return true;
      }
      case 'u': {
        uint32_t v = 0;
        for (int k = 0; k < 4; ++k) {
          const uint32_t h = Peek();
          int d = (h >= '0' && h <= '9')   ? int(h - '0')
                  : (h >= 'a' && h <= 'f') ? int(h - 'a' + 10)
                  : (h >= 'A' && h <= 'F') ? int(h - 'A' + 10)
                                           : -1;
          if (d < 0) return Error("bad \\u");
          v = v * 16 + d;
          ++i_;
        }
        *literal = v;
        return true;
      }
      case 'b':
      case 'B':
      case 'A':
      case 'z':
      case 'Z': {
        if (assert_node == nullptr) {
          if (c == 'b') {  // \b in a class is backspace
            *literal = 0x08;
            return true;
          }
          return Error(absl::StrCat("\\", std::string(1, static_cast<char>(c)), " in a class"));
        }
        auto n = std::make_unique<Node>();
        n->kind = NodeKind::kAssert;
        n->assert_kind = c == 'b'   ? AssertKind::kWordB
                         : c == 'B' ? AssertKind::kNotWordB
                         : c == 'A' ? AssertKind::kBeginText
                         : c == 'z' ? AssertKind::kEndText
                                    : AssertKind::kEndTextNl;
        *assert_node = std::move(n);
        return false;
      }
      default:
        if ((c >= '1' && c <= '9') || c == 'k' || c == 'g') {
          return Error("backreferences and subexpression calls");
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
          return Error(absl::StrCat("unsupported escape \\", std::string(1, static_cast<char>(c))));
        }
        *literal = c;  // escaped punctuation or any other character
        return true;
    }
  }

  // Parses a class body after '['. Handles nesting and &&.
  StatusOr<CharClass> ParseClass() {
    CharClass cc;
    if (More() && Peek() == '^') {
      cc.negated = true;
      ++i_;
    }
    if (More() && Peek() == '[' && Peek(1) == ':') return Error("POSIX bracket expressions");
    CharClass* cur = &cc;  // the operand being filled (left of a pending &&)
    CharClass operand;     // used after the first &&
    bool in_intersection = false;
    bool first = true;
    while (true) {
      if (!More()) return Error("unterminated character class");
      uint32_t c = Peek();
      if (c == ']' && !first) {
        ++i_;
        break;
      }
      first = false;
      if (c == '&' && Peek(1) == '&') {
        i_ += 2;
        if (!in_intersection) {
          // Everything so far becomes the first operand.
          CharClass left;
          std::swap(left.ranges, cc.ranges);
          left.gc_mask = cc.gc_mask, cc.gc_mask = 0;
          std::swap(left.not_gc_masks, cc.not_gc_masks);
          left.ws = cc.ws, left.not_ws = cc.not_ws, left.word = cc.word,
          left.not_word = cc.not_word;
          cc.ws = cc.not_ws = cc.word = cc.not_word = false;
          std::swap(left.nested, cc.nested);
          left.Finish();
          cc.nested.push_back(std::move(left));
          in_intersection = true;
        } else {
          operand.Finish();
          cc.intersect.push_back(std::move(operand));
          operand = CharClass();
        }
        cur = &operand;
        continue;
      }
      if (c == '[') {
        ++i_;
        POLYKV_ASSIGN_OR_RETURN(CharClass nested, ParseClass());
        cur->nested.push_back(std::move(nested));
        continue;
      }
      uint32_t lo;
      if (c == '\\') {
        ++i_;
        uint32_t lit = 0;
        POLYKV_ASSIGN_OR_RETURN(bool is_lit, ParseEscape(cur, &lit, nullptr));
        if (!is_lit) continue;
        lo = lit;
      } else {
        lo = c;
        ++i_;
      }
      uint32_t hi = lo;
      if (More() && Peek() == '-' && Peek(1) != ']' && Peek(1) != 0xFFFFFFFFu) {
        const size_t save = i_;
        ++i_;
        uint32_t c2 = Peek();
        if (c2 == '\\') {
          ++i_;
          uint32_t lit = 0;
          CharClass dummy;
          POLYKV_ASSIGN_OR_RETURN(bool is_lit, ParseEscape(&dummy, &lit, nullptr));
          if (!is_lit) return Error("class range ending in a class escape");
          hi = lit;
        } else if (c2 == '[') {
          i_ = save;  // '-' literal followed by a nested class
          cur->ranges.push_back({lo, lo});
          continue;
        } else {
          hi = c2;
          ++i_;
        }
        if (hi < lo) return Error("class range out of order");
      }
      cur->ranges.push_back({lo, hi});
    }
    if (in_intersection) {
      operand.Finish();
      cc.intersect.push_back(std::move(operand));
    }
    return cc;
  }

  // One atom; nullptr for a flag-only group such as (?i).
  StatusOr<std::unique_ptr<Node>> ParseAtom() {
    const uint32_t c = p_[i_++];
    switch (c) {
      case '(': {
        bool look = false, negative = false;
        const bool saved_icase = icase_;
        if (More() && Peek() == '?') {
          ++i_;
          const uint32_t k = Peek();
          if (k == ':') {
            ++i_;
          } else if (k == '=' || k == '!') {
            look = true;
            negative = k == '!';
            ++i_;
          } else if (k == '<' && (Peek(1) == '=' || Peek(1) == '!')) {
            return Error("lookbehind");
          } else if (k == '<' || k == '\'' || k == 'P') {
            // Named group: skip the name.
            if (k == 'P') ++i_;
            const uint32_t close = Peek() == '\'' ? '\'' : '>';
            ++i_;
            while (More() && Peek() != close) ++i_;
            if (!More()) return Error("unterminated group name");
            ++i_;
          } else if (k == '>') {
            return Error("atomic groups");
          } else if (k == 'i' || k == '-') {
            bool on = true;
            while (More() && (Peek() == 'i' || Peek() == '-')) {
              if (Peek() == '-') on = false;
              if (Peek() == 'i') icase_ = on;
              ++i_;
            }
            if (More() && Peek() == ')') {  // (?i): applies to the rest of the group
              ++i_;
              return std::unique_ptr<Node>();
            }
            if (!More() || Peek() != ':') return Error("unsupported group option");
            ++i_;
          } else {
            return Error("unsupported group syntax");
          }
        }
        POLYKV_ASSIGN_OR_RETURN(auto body, ParseAlt(true));
        icase_ = saved_icase;
        if (!More() || Peek() != ')') return Error("missing ')'");
        ++i_;
        if (!look) return body;
        auto n = std::make_unique<Node>();
        n->kind = NodeKind::kLook;
        n->negative = negative;
        n->kids.push_back(std::move(body));
        return n;
      }
      case '[': {
        POLYKV_ASSIGN_OR_RETURN(CharClass cc, ParseClass());
        return ClassNode(std::move(cc));
      }
      case '.': {
        CharClass cc;
        cc.not_newline = true;
        return ClassNode(std::move(cc));
      }
      case '^':
      case '$': {
        auto n = std::make_unique<Node>();
        n->kind = NodeKind::kAssert;
        n->assert_kind = c == '^' ? AssertKind::kBol : AssertKind::kEol;
        return n;
      }
      case '\\': {
        CharClass cc;
        uint32_t lit = 0;
        std::unique_ptr<Node> assert_node;
        POLYKV_ASSIGN_OR_RETURN(bool is_lit, ParseEscape(&cc, &lit, &assert_node));
        if (assert_node) return assert_node;
        if (is_lit) return LiteralNode(lit);
        return ClassNode(std::move(cc));
      }
      case '*':
      case '+':
      case '?':
        return Error("quantifier without an operand");
      default:
        return LiteralNode(c);
    }
  }

  std::vector<CharClass>* classes_;
  std::string pattern_;
  std::vector<uint32_t> p_;
  size_t i_ = 0;
  bool icase_ = false;
};

enum class Op : uint8_t { kChar, kRun, kSplit, kJmp, kAssert, kLook, kMatch };

struct Inst {
  Op op;
  RepMode mode = RepMode::kGreedy;
  AssertKind assert_kind = AssertKind::kBol;
  bool negative = false;
  int cls = -1;
  int x = 0, y = 0;  // kSplit: prefer x; kJmp: x; kLook: body at x, continue at y
  uint32_t min = 0, max = 0;
};

class Compiler {
 public:
  explicit Compiler(std::vector<Inst>* prog) : prog_(prog) {}

  Status Emit(const Node& n) {
    if (prog_->size() > kMaxProgram) {
      return absl::UnimplementedError("pre-tokenizer regex is too large once compiled");
    }
    switch (n.kind) {
      case NodeKind::kEmpty:
        return absl::OkStatus();
      case NodeKind::kClass:
        Add({Op::kChar, RepMode::kGreedy, AssertKind::kBol, false, n.cls});
        return absl::OkStatus();
      case NodeKind::kConcat:
        for (const auto& k : n.kids) POLYKV_RETURN_IF_ERROR(Emit(*k));
        return absl::OkStatus();
      case NodeKind::kAlt: {
        std::vector<int> jumps;
        for (size_t i = 0; i < n.kids.size(); ++i) {
          if (i + 1 < n.kids.size()) {
            const int split = Add({Op::kSplit});
            (*prog_)[split].x = split + 1;
            POLYKV_RETURN_IF_ERROR(Emit(*n.kids[i]));
            jumps.push_back(Add({Op::kJmp}));
            (*prog_)[split].y = Size();
          } else {
            POLYKV_RETURN_IF_ERROR(Emit(*n.kids[i]));
          }
        }
        for (int j : jumps) (*prog_)[j].x = Size();
        return absl::OkStatus();
      }
      case NodeKind::kAssert: {
        Inst in{Op::kAssert};
        in.assert_kind = n.assert_kind;
        Add(in);
        return absl::OkStatus();
      }
      case NodeKind::kLook: {
        const int look = Add({Op::kLook});
        (*prog_)[look].negative = n.negative;
        (*prog_)[look].x = Size();
        POLYKV_RETURN_IF_ERROR(Emit(*n.kids[0]));
        Add({Op::kMatch});
        (*prog_)[look].y = Size();
        return absl::OkStatus();
      }
      case NodeKind::kRepeat:
        return EmitRepeat(n);
    }
    return absl::OkStatus();
  }

 private:
  int Size() const { return static_cast<int>(prog_->size()); }
  int Add(Inst in) {
    prog_->push_back(in);
    return Size() - 1;
  }

  Status EmitRepeat(const Node& n) {
    const Node& body = *n.kids[0];
    if (body.kind == NodeKind::kClass) {
      Inst in{Op::kRun, n.mode, AssertKind::kBol, false, body.cls};
      in.min = n.min;
      in.max = n.max;
      Add(in);
      return absl::OkStatus();
    }
    if (n.mode == RepMode::kPossessive) {
      return absl::UnimplementedError("possessive quantifier on a group in a pre-tokenizer regex");
    }
    if (n.max == kInf && Nullable(body)) {
      return absl::UnimplementedError(
          "unbounded quantifier over a body that can match the empty string");
    }
    const bool lazy = n.mode == RepMode::kLazy;
    for (uint32_t i = 0; i < n.min; ++i) POLYKV_RETURN_IF_ERROR(Emit(body));
    if (n.max == kInf) {
      const int split = Add({Op::kSplit});
      POLYKV_RETURN_IF_ERROR(Emit(body));
      const int jmp = Add({Op::kJmp});
      (*prog_)[jmp].x = split;
      SetSplit(split, split + 1, Size(), lazy);
      return absl::OkStatus();
    }
    std::vector<int> splits;
    for (uint32_t i = n.min; i < n.max; ++i) {
      splits.push_back(Add({Op::kSplit}));
      POLYKV_RETURN_IF_ERROR(Emit(body));
      if (prog_->size() > kMaxProgram) {
        return absl::UnimplementedError("pre-tokenizer regex is too large once compiled");
      }
    }
    for (int s : splits) SetSplit(s, s + 1, Size(), lazy);
    return absl::OkStatus();
  }
  void SetSplit(int s, int body, int out, bool lazy) {
    (*prog_)[s].x = lazy ? out : body;
    (*prog_)[s].y = lazy ? body : out;
  }

  std::vector<Inst>* prog_;
};

}  // namespace

struct Regex::Impl {
  std::vector<CharClass> classes;
  std::vector<Inst> prog;

  struct Frame {
    int pc;
    uint32_t pos;
    uint32_t bound;  // kRunBack: lowest position; kRunFwd: highest
    uint8_t kind;    // 0 alt, 1 run back (greedy), 2 run forward (lazy)
  };

  struct Search {
    const Subject* s;
    size_t b, e;
    std::vector<uint64_t> memo;  // (pc, pos - b) visited, empty when disabled
    size_t row_words = 0;
    std::unordered_map<uint64_t, bool> look_cache;
    std::vector<Frame> stack;
    // Greedy or possessive unbounded runs (min >= 1) already started at run_from[pc] and
    // reaching run_end[pc] (top-level only). A later start inside that run has a subset of
    // its continuations, which have all failed or are being explored (greedy tries the
    // longest first), so it fails at once: without this a run re-scanned from every position
    // of a long whitespace run makes "\s+$" quadratic.
    std::vector<uint32_t> run_from, run_end;
  };

  bool IsWord(const Subject& s, size_t i) const { return (kMaskWord & GcBit(s.gc[i])) != 0; }

  bool Assert(const Search& sr, AssertKind k, size_t pos) const {
    const auto& cps = sr.s->cps;
    switch (k) {
      case AssertKind::kBol:
        return pos == sr.b || cps[pos - 1] == '\n';
      case AssertKind::kEol:
        return pos == sr.e || cps[pos] == '\n';
      case AssertKind::kBeginText:
        return pos == sr.b;
      case AssertKind::kEndText:
        return pos == sr.e;
      case AssertKind::kEndTextNl:
        return pos == sr.e || (pos + 1 == sr.e && cps[pos] == '\n');
      case AssertKind::kWordB:
      case AssertKind::kNotWordB: {
        const bool before = pos > sr.b && IsWord(*sr.s, pos - 1);
        const bool after = pos < sr.e && IsWord(*sr.s, pos);
        return (before != after) == (k == AssertKind::kWordB);
      }
    }
    return false;
  }

  bool ClassAt(const Subject& s, int cls, size_t pos) const {
    return classes[cls].Match(s.cps[pos], s.gc[pos], s.ws[pos] != 0);
  }
  bool ClassAt(const Search& sr, int cls, size_t pos) const { return ClassAt(*sr.s, cls, pos); }

  // Runs the program from (pc0, pos0) anchored; true with *end on a match. `memo`: use the
  // search memo (top-level only). `start_nonempty`: reject a match that ends at pos0.
  bool Run(Search& sr, int pc0, size_t pos0, bool memo, bool start_nonempty, size_t* end) const {
    std::vector<Frame> local;
    std::vector<Frame>& st = memo ? sr.stack : local;
    const size_t base = st.size();
    st.push_back({pc0, static_cast<uint32_t>(pos0), 0, 0});
    while (st.size() > base) {
      Frame f = st.back();
      st.pop_back();
      int pc = f.pc;
      size_t pos = f.pos;
      if (f.kind == 1) {
        if (f.pos > f.bound) st.push_back({f.pc, f.pos - 1, f.bound, 1});
      } else if (f.kind == 2) {
        if (f.pos < f.bound) st.push_back({f.pc, f.pos + 1, f.bound, 2});
      }
      while (true) {
        if (memo && !sr.memo.empty()) {
          const size_t bit = static_cast<size_t>(pc) * sr.row_words * 64 + (pos - sr.b);
          uint64_t& w = sr.memo[bit >> 6];
          const uint64_t m = uint64_t{1} << (bit & 63);
          if (w & m) break;
          w |= m;
        }
        const Inst& in = prog[pc];
        bool ok = true;
        switch (in.op) {
          case Op::kChar:
            if (pos < sr.e && ClassAt(sr, in.cls, pos)) {
              ++pc, ++pos;
            } else {
              ok = false;
            }
            break;
          case Op::kRun: {
            const bool prunable =
                memo && in.max == kInf && in.min >= 1 && in.mode != RepMode::kLazy;
            if (prunable && sr.run_from[pc] != kInf && sr.run_from[pc] < pos &&
                pos <= sr.run_end[pc]) {
              ok = false;
              break;
            }
            size_t k = 0;
            while (pos + k < sr.e && k < in.max && ClassAt(sr, in.cls, pos + k)) ++k;
            if (prunable) {
              sr.run_from[pc] = static_cast<uint32_t>(pos);
              sr.run_end[pc] = static_cast<uint32_t>(pos + k);
            }
            if (k < in.min) {
              ok = false;
              break;
            }
            if (in.mode == RepMode::kGreedy) {
              if (k > in.min) {
                st.push_back({pc + 1, static_cast<uint32_t>(pos + k - 1),
                              static_cast<uint32_t>(pos + in.min), 1});
              }
              pos += k;
            } else if (in.mode == RepMode::kLazy) {
              if (k > in.min) {
                st.push_back({pc + 1, static_cast<uint32_t>(pos + in.min + 1),
                              static_cast<uint32_t>(pos + k), 2});
              }
              pos += in.min;
            } else {
              pos += k;
            }
            ++pc;
            break;
          }
          case Op::kSplit:
            st.push_back({in.y, static_cast<uint32_t>(pos), 0, 0});
            pc = in.x;
            break;
          case Op::kJmp:
            pc = in.x;
            break;
          case Op::kAssert:
            if (Assert(sr, in.assert_kind, pos)) {
              ++pc;
            } else {
              ok = false;
            }
            break;
          case Op::kLook: {
            const uint64_t key = (static_cast<uint64_t>(pc) << 32) | pos;
            auto it = sr.look_cache.find(key);
            bool r;
            if (it != sr.look_cache.end()) {
              r = it->second;
            } else {
              size_t unused;
              r = Run(sr, in.x, pos, false, false, &unused);
              sr.look_cache.emplace(key, r);
            }
            if (r != in.negative) {
              pc = in.y;
            } else {
              ok = false;
            }
            break;
          }
          case Op::kMatch:
            if (start_nonempty && pos == pos0) {
              ok = false;
              break;
            }
            *end = pos;
            st.resize(base);
            return true;
        }
        if (!ok) break;
      }
    }
    return false;
  }
};

Regex::~Regex() = default;

StatusOr<std::shared_ptr<const Regex>> Regex::Compile(std::string_view pattern) {
  std::shared_ptr<Regex> r(new Regex());
  r->pattern_ = std::string(pattern);
  r->impl_ = std::make_unique<Impl>();
  Parser parser(pattern, &r->impl_->classes);
  POLYKV_ASSIGN_OR_RETURN(std::unique_ptr<Node> root, parser.Parse());
  Compiler compiler(&r->impl_->prog);
  POLYKV_RETURN_IF_ERROR(compiler.Emit(*root));
  r->impl_->prog.push_back({Op::kMatch});
  return std::shared_ptr<const Regex>(std::move(r));
}

void Regex::FindAll(const Subject& s, size_t begin, size_t end,
                    std::vector<std::pair<size_t, size_t>>* out) const {
  // Fast path: the whole pattern is one class, once or as a greedy/possessive run with
  // min >= 1 (\p{N}, \p{N}+, \p{N}{1,3} ...): scan directly.
  const auto& prog = impl_->prog;
  if (prog.size() == 2 && prog[1].op == Op::kMatch &&
      (prog[0].op == Op::kChar ||
       (prog[0].op == Op::kRun && prog[0].min >= 1 && prog[0].mode != RepMode::kLazy))) {
    const Inst& in = prog[0];
    const uint32_t mn = in.op == Op::kChar ? 1 : in.min;
    const uint32_t mx = in.op == Op::kChar ? 1 : in.max;
    for (size_t pos = begin; pos < end;) {
      size_t k = 0;
      while (pos + k < end && k < mx && impl_->ClassAt(s, in.cls, pos + k)) ++k;
      if (k >= mn) {
        out->push_back({pos, pos + k});
        pos += k;
      } else {
        ++pos;  // too short a run here; a later start is shorter still until it ends
      }
    }
    return;
  }
  Impl::Search sr;
  sr.s = &s;
  sr.b = begin;
  sr.e = end;
  const size_t n = end - begin;
  const size_t bits = impl_->prog.size() * (n + 1);
  if (bits <= (size_t{1} << 28)) {  // at most 32 MiB of memo
    // Layout: pc-major rows of (n + 1) bits rounded up to whole words.
    sr.row_words = (n + 1 + 63) / 64;
    sr.memo.assign(impl_->prog.size() * sr.row_words, 0);
  }
  sr.run_from.assign(impl_->prog.size(), kInf);
  sr.run_end.assign(impl_->prog.size(), kInf);
  auto clear_column = [&](size_t pos) {
    std::fill(sr.run_from.begin(), sr.run_from.end(), kInf);
    if (sr.memo.empty()) return;
    const size_t col = pos - sr.b;
    for (size_t pc = 0; pc < impl_->prog.size(); ++pc) {
      const size_t bit = pc * sr.row_words * 64 + col;
      sr.memo[bit >> 6] &= ~(uint64_t{1} << (bit & 63));
    }
  };
  size_t pos = begin;
  bool nonempty = false;  // the previous match was empty and ended at pos
  while (pos <= end) {
    size_t m_end = 0;
    if (impl_->Run(sr, 0, pos, true, nonempty, &m_end)) {
      out->push_back({pos, m_end});
      // States on the successful path at m_end may be reached again by the next search.
      clear_column(m_end);
      nonempty = m_end == pos;
      pos = m_end;
      continue;
    }
    nonempty = false;
    ++pos;
  }
}

}  // namespace polykv::model::bpe
