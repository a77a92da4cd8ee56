// The regex engine's recursive-descent parser: a pre-tokenizer pattern to an AST of character
// classes, concatenations, alternations, repeats, lookaheads and assertions (see bpe_regex.h
// for the syntax).
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bpe_regex_internal.h"

namespace polykv::model::bpe::regex_internal {
namespace {

// \p{..} names of the general categories, indexed by unicode::GeneralCategory (whose bit in a
// category mask is 1 << index): the two-letter name and the long one ("" where Oniguruma
// has none that pre-tokenizers use).
struct CategoryName {
  const char* name;
  const char* long_name;
};
constexpr CategoryName kCategoryNames[] = {{"Cn", ""},
                                           {"Lu", "Uppercase_Letter"},
                                           {"Ll", "Lowercase_Letter"},
                                           {"Lt", "Titlecase_Letter"},
                                           {"Lm", "Modifier_Letter"},
                                           {"Lo", "Other_Letter"},
                                           {"Mn", ""},
                                           {"Mc", ""},
                                           {"Me", ""},
                                           {"Nd", "Decimal_Number"},
                                           {"Nl", ""},
                                           {"No", ""},
                                           {"Pc", ""},
                                           {"Pd", ""},
                                           {"Ps", ""},
                                           {"Pe", ""},
                                           {"Pi", ""},
                                           {"Pf", ""},
                                           {"Po", ""},
                                           {"Sm", ""},
                                           {"Sc", ""},
                                           {"Sk", ""},
                                           {"So", ""},
                                           {"Zs", ""},
                                           {"Zl", ""},
                                           {"Zp", ""},
                                           {"Cc", ""},
                                           {"Cf", ""},
                                           {"Cs", ""},
                                           {"Co", ""}};
static_assert(sizeof(kCategoryNames) / sizeof(kCategoryNames[0]) == unicode::kNumGeneralCategories);

// \p{..} names of the groups of categories: the short name, the long one and the mask.
struct GroupName {
  const char* name;
  const char* long_name;
  uint32_t mask;
};
constexpr GroupName kGroupNames[] = {
    {"L", "Letter", kMaskL},      {"LC", "L&", (1u << 1) | (1u << 2) | (1u << 3)},
    {"M", "Mark", kMaskM},        {"N", "Number", kMaskN},
    {"P", "Punctuation", kMaskP}, {"S", "Symbol", kMaskS},
    {"Z", "Separator", kMaskZ},   {"C", "Other", kMaskC}};

// General-category mask of a \p{..} name, 0 when unknown.
uint32_t CategoryMask(std::string_view name) {
  for (const GroupName& g : kGroupNames) {
    if (name == g.name || name == g.long_name) return g.mask;
  }
  for (int i = 0; i < unicode::kNumGeneralCategories; ++i) {
    const CategoryName& c = kCategoryNames[i];
    if (name == c.name || (c.long_name[0] != '\0' && name == c.long_name)) return 1u << i;
  }
  return 0;
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
    // Escapes of one control character: \t \n \r \f \v \a (BEL) \e (ESC) \0 (NUL).
    static constexpr std::pair<char, char> kControls[] = {{'t', '\t'}, {'n', '\n'}, {'r', '\r'},
                                                          {'f', '\f'}, {'v', '\v'}, {'a', 0x07},
                                                          {'e', 0x1B}, {'0', 0}};
    for (const auto& [name, control] : kControls) {
      if (c == static_cast<uint32_t>(name)) {
        *literal = static_cast<uint32_t>(control);
        return true;
      }
    }
    // Escapes that set one flag of the class: \s \S \w \W.
    static constexpr std::pair<char, bool CharClass::*> kFlags[] = {{'s', &CharClass::ws},
                                                                    {'S', &CharClass::not_ws},
                                                                    {'w', &CharClass::word},
                                                                    {'W', &CharClass::not_word}};
    for (const auto& [name, flag] : kFlags) {
      if (c == static_cast<uint32_t>(name)) {
        cc->*flag = true;
        return false;
      }
    }
    switch (c) {
      case 'd':
        cc->gc_mask |= 1u << 9;
        return false;
      case 'D':
        cc->not_gc_masks.push_back(1u << 9);
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
        POLYKV_RETURN_IF_ERROR(ParseProperty(c == 'P', cc));
        return false;
      }
      case 'x': {
        POLYKV_ASSIGN_OR_RETURN(*literal, ParseHexEscape());
        return true;
      }
      case 'u': {
        POLYKV_ASSIGN_OR_RETURN(*literal, ParseU4Escape());
        return true;
      }
      case 'b':
      case 'B':
      case 'A':
      case 'z':
      case 'Z':
        return ParseAnchorEscape(c, literal, assert_node);
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

  // \p{..}, \P{..} (`upper`) or \p{^..} after the letter: a general category, or its
  // complement, into `cc`.
  Status ParseProperty(bool upper, CharClass* cc) {
    if (!More() || Peek() != '{') return Error("\\p without {name}");
    ++i_;
    bool neg = upper;
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
    return absl::OkStatus();
  }

  // \xHH or \x{H..} after the 'x'.
  StatusOr<uint32_t> ParseHexEscape() {
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
    return v;
  }

  // \uHHHH after the 'u'.
  StatusOr<uint32_t> ParseU4Escape() {
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
    return v;
  }

  // \b \B \A \z \Z: an assertion node, or (in a class, `assert_node` null) backspace for
  // \b and an error for the others.
  StatusOr<bool> ParseAnchorEscape(uint32_t c, uint32_t* literal,
                                   std::unique_ptr<Node>* assert_node) {
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

}  // namespace

StatusOr<std::unique_ptr<Node>> ParsePattern(std::string_view pattern,
                                             std::vector<CharClass>* classes) {
  Parser parser(pattern, classes);
  return parser.Parse();
}

}  // namespace polykv::model::bpe::regex_internal
