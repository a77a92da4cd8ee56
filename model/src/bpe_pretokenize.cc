// Byte-level BPE pre-tokenizers: llama.cpp's regex lists per tokenizer.ggml.pre value (the
// HF tokenizer.json originals where llama.cpp rewrote a pattern for std::regex), HF Split
// behaviors, and hand-written matchers for the GPT-2 and Llama 3 regexes (the common ones),
// equivalent to llama.cpp's unicode_regex_split_custom_* functions.
#include "bpe_pretokenize.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "polykv/enum_names.h"

namespace polykv::model::bpe {

const char kGpt2Regex[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char kLlama3Regex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

// llama.cpp's spellings of the same two regexes: GPT-2 without the final \s+ (equivalent:
// the only text it leaves unmatched is a single whitespace before a non-space, which becomes
// a piece of its own either way) and Llama 3 with (?i:) spelled out.
constexpr char kGpt2RegexNoTail[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
constexpr char kLlama3RegexAdapted[] =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

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

// Case folding for the Llama 3 contractions: ASCII letters, and U+017F LONG S, which folds
// to 's' (Oniguruma, and so HF tokenizers, match (?i:'s) on "'\u017f"; llama.cpp does not).
inline uint32_t AsciiLower(uint32_t c) {
  if (c == 0x17F) return 's';
  return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

// The runs of GPT-2's \p{L}+, \p{N}+ and [^\s\p{L}\p{N}]+ (inside the piece); kNone for
// whitespace and outside the piece.
enum class RunKind { kNone, kLetter, kNumber, kOther };
inline RunKind RunKindOf(const Flags& f) {
  if (f.letter) return RunKind::kLetter;
  if (f.number) return RunKind::kNumber;
  return !f.whitespace && f.valid ? RunKind::kOther : RunKind::kNone;
}

// One piece being split by a hand-written matcher: code points [ini, end) of cps, with the
// lengths of the pieces cut so far appended to *out.
class Scanner {
 public:
  Scanner(const std::vector<uint32_t>& cps, size_t ini, size_t end, std::vector<size_t>* out)
      : cps_(cps), ini_(ini), end_(end), prev_(ini), out_(out) {}

  /// Code point at p, kOutOfRange outside the piece.
  uint32_t cpt(size_t p) const { return (p >= ini_ && p < end_) ? cps_[p] : kOutOfRange; }
  /// Flags of the code point at p (not valid outside the piece).
  Flags flags(size_t p) const { return (p >= ini_ && p < end_) ? FlagsOf(cps_[p]) : Flags{}; }

  /// Cuts a piece ending at e (nothing when empty); returns its length.
  size_t add(size_t e) {
    size_t len = e - prev_;
    if (len > 0) out_->push_back(len);
    prev_ = e;
    return len;
  }

  /// Length of the contraction at pos: 2 for 's 't 'm 'd, 3 for 're 've 'll, 0 for none.
  /// `fold_case` matches them case-insensitively (Llama 3's (?i:...), see AsciiLower).
  size_t Contraction(size_t pos, bool fold_case) const {
    if (cpt(pos) != '\'' || pos + 1 >= end_) return 0;
    const auto at = [&](size_t p) { return fold_case ? AsciiLower(cpt(p)) : cpt(p); };
    const uint32_t n1 = at(pos + 1);
    if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') return 2;
    if (pos + 2 < end_) {
      const uint32_t n2 = at(pos + 2);
      if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
        return 3;
      }
    }
    return 0;
  }

  /// \s+(?!\S), else \s+, over the `nws` whitespace code points at *pos: cuts that piece,
  /// moves *pos past it and returns true; false when nws is 0.
  bool CutWhitespace(size_t* pos, size_t nws) {
    if (nws > 1 && cpt(*pos + nws) != kOutOfRange) {  // \s+(?!\S)
      *pos += nws - 1;
      add(*pos);
      return true;
    }
    if (nws > 0) {  // \s+
      *pos += nws;
      add(*pos);
      return true;
    }
    return false;
  }

 private:
  const std::vector<uint32_t>& cps_;
  const size_t ini_;
  const size_t end_;
  size_t prev_;
  std::vector<size_t>* out_;
};

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void MatchGpt2(const std::vector<uint32_t>& cps, size_t ini, size_t end, std::vector<size_t>* out) {
  Scanner s(cps, ini, end, out);
  for (size_t pos = ini; pos < end;) {
    const uint32_t c = s.cpt(pos);
    const Flags f = s.flags(pos);
    if (const size_t n = s.Contraction(pos, /*fold_case=*/false)) {
      pos += s.add(pos + n);
      continue;
    }
    // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`: the run of one kind after an optional space.
    const RunKind kind = RunKindOf(c == ' ' ? s.flags(pos + 1) : f);
    if (kind != RunKind::kNone) {
      pos += (c == ' ');
      while (RunKindOf(s.flags(pos)) == kind) ++pos;
      s.add(pos);
      continue;
    }
    size_t nws = 0;
    while (s.flags(pos + nws).whitespace) ++nws;
    if (s.CutWhitespace(&pos, nws)) continue;
    s.add(++pos);  // no match
  }
}

// Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
void MatchLlama3(const std::vector<uint32_t>& cps, size_t ini, size_t end,
                 std::vector<size_t>* out) {
  Scanner s(cps, ini, end, out);
  for (size_t pos = ini; pos < end;) {
    const uint32_t c = s.cpt(pos);
    const Flags f = s.flags(pos);
    if (const size_t n = s.Contraction(pos, /*fold_case=*/true)) {
      pos += s.add(pos + n);
      continue;
    }
    if (!(c == '\r' || c == '\n' || f.number)) {
      if (f.letter || s.flags(pos + 1).letter) {
        ++pos;
        while (s.flags(pos).letter) ++pos;
        s.add(pos);
        continue;
      }
    }
    if (f.number) {
      size_t first = pos;
      while (s.flags(pos).number) {
        if (++pos - first >= 3) {
          s.add(pos);
          first = pos;
        }
      }
      s.add(pos);
      continue;
    }
    Flags f2 = c == ' ' ? s.flags(pos + 1) : f;
    if (!(f2.whitespace || f2.letter || f2.number) && f.valid) {
      pos += (c == ' ');
      while (!(f2.whitespace || f2.letter || f2.number) && f2.valid) f2 = s.flags(++pos);
      uint32_t c2 = s.cpt(pos);
      while (c2 == '\r' || c2 == '\n') c2 = s.cpt(++pos);
      s.add(pos);
      continue;
    }
    size_t nws = 0, last_rn = 0;
    while (s.flags(pos + nws).whitespace) {
      const uint32_t c2 = s.cpt(pos + nws);
      if (c2 == '\r' || c2 == '\n') last_rn = pos + nws + 1;
      ++nws;
    }
    if (last_rn > 0) {  // \s*[\r\n]+
      pos = last_rn;
      s.add(pos);
      continue;
    }
    if (s.CutWhitespace(&pos, nws)) continue;
    s.add(++pos);  // no match
  }
}

// --- llama.cpp's pre-tokenizer families ---------------------------------------------------

constexpr char kDigit[] = R"(\p{N})";
constexpr char kQwen2Regex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// BLOOM / Poro / GPT3-Finnish: the class excludes '(', '|', ')', whitespace and . , ! ? and
// U+2026 U+3002 U+FF0C U+3001 U+0964 U+06D4 U+060C (as written in those tokenizers).
constexpr char kBloomRegex[] =
    R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+)";
// GPT-4o / Llama 4 (also the second regex of Tiny Aya), as in tokenizer.json.
constexpr char kGpt4oRegex[] =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek LLM / Coder: CJK ideographs, U+0800..U+4E00 and Hangul.
constexpr char kDeepseekCjk[] = R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";
// DeepSeek V3 / Spark: CJK ideographs, Hiragana, Katakana.
constexpr char kCjkKana[] = R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)";
constexpr char kDeepseekV3Main[] =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Family {
  const char* name;                  // canonical (fingerprints, family())
  std::vector<const char*> aliases;  // other tokenizer.ggml.pre values
  std::vector<const char*> regexes;  // applied in order
  bool ignore_merges = false;
  bool add_bos = false;
};

const std::vector<Family>& Families() {
  static const std::vector<Family>* kFamilies = new std::vector<Family>{
      {"default", {}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2Regex, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
      {"gpt-2",
       {"gpt2", "phi-2", "roberta-bpe", "jina-v1-en", "jina-v2-code", "jina-es", "jina-de",
        "jina-v2-es", "jina-v2-de", "gigachat", "a.x-4.0", "mellum", "modern-bert"},
       {kGpt2Regex}},
      {"mpt", {}, {kGpt2Regex}},
      {"olmo", {}, {kGpt2Regex}},
      {"jais", {}, {kGpt2Regex}},
      {"trillion", {}, {kGpt2Regex}},
      {"granite-docling", {}, {kGpt2Regex}},
      {"exaone4", {}, {kGpt2Regex}},
      // Digits one by one, then GPT-2 (HF: Digits(individual_digits) + ByteLevel).
      {"smollm", {}, {kDigit, kGpt2Regex}},
      {"starcoder", {}, {kDigit, kGpt2Regex}},
      {"refact", {}, {kDigit, kGpt2Regex}},
      {"command-r", {}, {kDigit, kGpt2Regex}},
      {"codeshell", {}, {kDigit, kGpt2Regex}},
      {"exaone", {}, {kDigit, kGpt2Regex}},
      {"minerva-7b", {"minerva"}, {kDigit, kGpt2Regex}},
      {"mellum2", {}, {kDigit, kGpt2Regex}},
      {"llama3", {"llama-v3", "llama-bpe"}, {kLlama3Regex}, true, true},
      {"falcon3", {}, {kLlama3Regex}, true, true},
      {"falcon-h1", {}, {kLlama3Regex}, true, true},
      {"pixtral", {}, {kLlama3Regex}, true, true},
      {"midm-2.0", {}, {kLlama3Regex}, true, true},
      {"lfm2", {}, {kLlama3Regex}, true, true},
      {"jina-v5-nano", {}, {kLlama3Regex}, true, true},
      {"dbrx", {}, {kLlama3Regex}},
      {"smaug-bpe", {"smaug"}, {kLlama3Regex}},
      {"chatglm4", {"chatglm-bpe", "glm4"}, {kLlama3Regex}},
      {"falcon", {}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2Regex, "[0-9][0-9][0-9]"}},
      {"deepseek-llm",
       {},
       {R"([\r\n])",
        R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293})"
        R"(\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A})"
        R"(\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556})"
        R"(\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF})"
        R"(\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D})"
        R"(\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D})"
        R"(\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4})"
        R"(\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4})"
        R"(\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124})"
        R"(\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F})"
        R"(\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
        R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F})"
        R"(\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17})"
        R"(\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3})"
        R"(\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF})"
        R"(\x{1E900}-\x{1E943}]+)",
        R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)",
        R"(\s+$)", kDeepseekCjk, R"(\p{N}+)"}},
      {"deepseek-coder", {}, {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, kDigit}},
      {"deepseek-v3", {}, {R"(\p{N}{1,3})", kCjkKana, kDeepseekV3Main}},
      {"hunyuan-dense", {}, {R"(\p{N}{1,3})", kCjkKana, kDeepseekV3Main}},
      {"joyai-llm", {}, {R"(\p{N}{1,3})", kCjkKana, kDeepseekV3Main}},
      {"hy_v4", {}, {R"(\p{N}{1,3})", kCjkKana, kDeepseekV3Main}},
      {"qwen2", {"deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"}, {kQwen2Regex}},
      {"stablelm2", {}, {kQwen2Regex}},
      {"hunyuan", {}, {kQwen2Regex}},
      {"solar-open", {}, {kQwen2Regex}},
      {"grok-2", {}, {kQwen2Regex}},
      {"qwen35",
       {},
       {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      {"poro-chat", {"poro"}, {kBloomRegex}},
      {"bloom", {}, {kBloomRegex}},
      {"gpt3-finnish", {}, {kBloomRegex}},
      {"viking", {}, {kBloomRegex, kDigit}},
      {"tekken",
       {},
       {R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
       true,
       true},
      {"chameleon",
       {},
       {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", kDigit,
        R"([\p{P}!-/:-@\[-`{-~])", kGpt2Regex},
       false,
       true},
      {"gpt-4o", {"llama4", "kanana2", "talkie", "minimax-m2"}, {kGpt4oRegex}},
      {"tiny_aya", {"cohere2moe"}, {R"(\d{1,3}(?=(?:\d{3})*\b))", kGpt4oRegex}},
      {"jais-2",
       {},
       {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1})"}},
      {"exaone-moe",
       {},
       {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+)"}},
      {"spark2_5",
       {},
       {R"(\p{N}{1,3})", kCjkKana,
        R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+)",
        kDigit}},
      {"youtu",
       {},
       {R"([\x{AC00}-\x{D7A3}\x{3131}-\x{318E}]+|[\x{FF01}\x{2026}\x{201C}\x{201D}\x{2018}\x{2019}\x{2014}\x{FF1A}\x{FF1B}\x{FF0C}\x{3001}-\x{303F}\x{FE30}-\x{FE4F}]+|[\x{3105}-\x{312F}]+|[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)",
        R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
       true},
      {"superbpe", {}, {R"(\p{N}+)", R"((?=(\d{3})+(?!\d)))"}},
      {"bailingmoe",
       {"bailingmoe2", "llada-moe"},
       {R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)"}},
      {"seed-coder",
       {},
       {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      {"ufakzeka",
       {},
       {R"([^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      // AFMoE: digit runs as a 1-2 digit head then groups of three (llama.cpp does this in
      // code; the lookahead says the same), CJK and South-East Asian blocks, then the
      // DeepSeek V3 regex.
      {"afmoe",
       {},
       {R"(\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N})))",
        R"([\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{F900}-\x{FAFF}\x{3040}-\x{309F}\x{30A0}-\x{30FF})"
        R"(\x{FF65}-\x{FF9F}\x{2F00}-\x{2FDF}\x{E00}-\x{E7F}\x{E80}-\x{EFF}\x{1780}-\x{17FF})"
        R"(\x{1000}-\x{109F}\x{AA60}-\x{AA7F}\x{A9E0}-\x{A9FF}\x{AC00}-\x{D7AF}\x{1100}-\x{11FF}]+)",
        kDeepseekV3Main}},
      {"laguna", {}, {R"([^\n]+|[\n]+)", kQwen2Regex}},
      {"minicpm5",
       {},
       {R"(\p{N}{1,3})",
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
       true},
  };
  return *kFamilies;
}

const char* BehaviorName(SplitBehavior b) {
  static constexpr EnumName<SplitBehavior> kNames[] = {
      {SplitBehavior::kIsolated, "isolated"},
      {SplitBehavior::kRemoved, "removed"},
      {SplitBehavior::kMergedWithPrevious, "merged_with_previous"},
      {SplitBehavior::kMergedWithNext, "merged_with_next"},
      {SplitBehavior::kContiguous, "contiguous"}};
  return EnumToName(kNames, b, "?");
}

std::string StepSignature(const PreStep& s) {
  const char* kind = s.kind == PreStep::Kind::kGpt2     ? "gpt2"
                     : s.kind == PreStep::Kind::kLlama3 ? "llama3"
                                                        : "regex";
  return absl::StrCat(kind, " ", BehaviorName(s.behavior), s.invert ? " invert " : " ", s.pattern);
}

// Appends the (span, is_match) parts in order to `splits` as kept spans, except that a part
// for which merge(is_match, previous is_match) holds extends the last split instead.
template <typename Merge>
void MergeForward(const std::vector<std::pair<Piece, bool>>& parts, Merge merge,
                  std::vector<std::pair<Piece, bool>>* splits) {
  bool prev = false;
  for (const auto& p : parts) {
    if (merge(p.second, prev) && !splits->empty()) {
      Piece& last = splits->back().first;
      last.len = p.first.start + p.first.len - last.start;
    } else {
      splits->push_back({p.first, false});
    }
    prev = p.second;
  }
}

// Applies HF's SplitDelimiterBehavior to the (span, is_match) list of one piece and appends
// the kept, non-empty spans.
void ApplyBehavior(const std::vector<std::pair<Piece, bool>>& parts, SplitBehavior behavior,
                   std::vector<Piece>* out) {
  std::vector<std::pair<Piece, bool>> splits;  // (span, remove)
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& p : parts) splits.push_back({p.first, false});
      break;
    case SplitBehavior::kRemoved:
      splits = parts;
      break;
    case SplitBehavior::kContiguous:  // runs of matches and runs of non-matches
      MergeForward(
          parts, [](bool match, bool prev) { return match == prev; }, &splits);
      break;
    case SplitBehavior::kMergedWithPrevious:  // a match joins the non-match before it
      MergeForward(
          parts, [](bool match, bool prev) { return match && !prev; }, &splits);
      break;
    case SplitBehavior::kMergedWithNext: {
      bool prev = false;
      for (size_t k = parts.size(); k-- > 0;) {
        const auto& p = parts[k];
        if (p.second && !prev && !splits.empty()) {
          Piece& last = splits.back().first;
          last.len = last.start + last.len - p.first.start;
          last.start = p.first.start;
        } else {
          splits.push_back({p.first, false});
        }
        prev = p.second;
      }
      std::reverse(splits.begin(), splits.end());
      break;
    }
  }
  for (const auto& s : splits) {
    if (!s.second && s.first.len > 0) out->push_back(s.first);
  }
}

}  // namespace

StatusOr<PreStep> MakeRegexStep(const std::string& pattern, SplitBehavior behavior, bool invert) {
  PreStep s;
  s.behavior = behavior;
  s.invert = invert;
  const bool plain = behavior == SplitBehavior::kIsolated && !invert;
  if (plain && (pattern == kGpt2Regex || pattern == kGpt2RegexNoTail)) {
    s.kind = PreStep::Kind::kGpt2;
    s.pattern = kGpt2Regex;
    return s;
  }
  if (plain && (pattern == kLlama3Regex || pattern == kLlama3RegexAdapted)) {
    s.kind = PreStep::Kind::kLlama3;
    s.pattern = kLlama3Regex;
    return s;
  }
  s.kind = PreStep::Kind::kRegex;
  s.pattern = pattern;
  POLYKV_ASSIGN_OR_RETURN(s.regex, Regex::Compile(pattern));
  return s;
}

StatusOr<PreTokenizer> PreTokenizer::FromName(const std::string& pre) {
  for (const Family& f : Families()) {
    bool hit = pre == f.name;
    for (const char* a : f.aliases) hit = hit || pre == a;
    if (!hit) continue;
    PreTokenizer p;
    p.name_ = f.name;
    p.ignore_merges_ = f.ignore_merges;
    p.add_bos_ = f.add_bos;
    for (const char* r : f.regexes) {
      auto step = MakeRegexStep(r);
      if (!step.ok()) {  // a broken built-in table is a programming error
        return absl::InternalError(
            absl::StrCat("pre-tokenizer '", f.name, "': ", step.status().message()));
      }
      p.steps_.push_back(std::move(step).value());
    }
    return p;
  }
  return absl::UnimplementedError(
      absl::StrCat("tokenizer.ggml.pre '", pre,
                   "' is not supported by PolyKV (supported: ", SupportedNames(), ")"));
}

PreTokenizer PreTokenizer::FromSteps(std::vector<PreStep> steps) {
  PreTokenizer p;
  p.steps_ = std::move(steps);
  const std::string sig = p.Signature();
  for (const Family& f : Families()) {
    std::vector<std::string> parts;
    for (const char* r : f.regexes) {
      PreStep s;
      const std::string pat = r;
      s.kind = (pat == kGpt2Regex || pat == kGpt2RegexNoTail)        ? PreStep::Kind::kGpt2
               : (pat == kLlama3Regex || pat == kLlama3RegexAdapted) ? PreStep::Kind::kLlama3
                                                                     : PreStep::Kind::kRegex;
      s.pattern = s.kind == PreStep::Kind::kGpt2     ? kGpt2Regex
                  : s.kind == PreStep::Kind::kLlama3 ? kLlama3Regex
                                                     : pat;
      parts.push_back(StepSignature(s));
    }
    if (absl::StrJoin(parts, "\n") == sig) {
      p.name_ = f.name;
      break;
    }
  }
  return p;
}

std::string PreTokenizer::SupportedNames() {
  std::vector<std::string> names;
  for (const Family& f : Families()) {
    names.push_back(f.name);
    for (const char* a : f.aliases) names.push_back(a);
  }
  return absl::StrJoin(names, ", ");
}

std::string PreTokenizer::Signature() const {
  std::vector<std::string> parts;
  for (const PreStep& s : steps_) parts.push_back(StepSignature(s));
  return absl::StrJoin(parts, "\n");
}

std::vector<Piece> PreTokenizer::Split(const std::vector<uint32_t>& cps) const {
  std::vector<Piece> pieces;
  if (cps.empty()) return pieces;
  pieces.push_back({0, cps.size()});
  std::unique_ptr<Subject> subject;
  std::vector<size_t> lens;
  std::vector<std::pair<size_t, size_t>> matches;
  std::vector<std::pair<Piece, bool>> parts;
  for (const PreStep& step : steps_) {
    std::vector<Piece> next;
    next.reserve(pieces.size() * 2);
    for (const Piece& piece : pieces) {
      const size_t b = piece.start, e = piece.start + piece.len;
      if (step.kind != PreStep::Kind::kRegex) {
        lens.clear();
        if (step.kind == PreStep::Kind::kGpt2) {
          MatchGpt2(cps, b, e, &lens);
        } else {
          MatchLlama3(cps, b, e, &lens);
        }
        size_t at = b;
        for (size_t len : lens) {
          next.push_back({at, len});
          at += len;
        }
        continue;
      }
      if (!subject) subject = std::make_unique<Subject>(cps);
      matches.clear();
      step.regex->FindAll(*subject, b, e, &matches);
      // HF find_matches: gaps and matches (empty matches included) covering the piece.
      parts.clear();
      size_t prev = b;
      for (const auto& m : matches) {
        if (m.first > prev) parts.push_back({{prev, m.first - prev}, step.invert});
        parts.push_back({{m.first, m.second - m.first}, !step.invert});
        prev = m.second;
      }
      if (prev < e) parts.push_back({{prev, e - prev}, step.invert});
      ApplyBehavior(parts, step.behavior, &next);
    }
    pieces = std::move(next);
  }
  return pieces;
}

}  // namespace polykv::model::bpe
