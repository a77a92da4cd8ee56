// Jinja lexer: splits a template into text and tag tokens following jinja2's lexer.py rules
// for trim_blocks, lstrip_blocks and the '-'/'+' whitespace markers.
#include "jinja/lexer.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace polykv::model::jinja {
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

int HexVal(char c) {
  if (IsDigit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python "unicode-escape" decoding of a string literal body, as jinja2 does.
StatusOr<std::string> DecodeEscapes(const std::string& body, int line) {
  std::string out;
  for (size_t k = 0; k < body.size(); ++k) {
    char c = body[k];
    if (c != '\\' || k + 1 == body.size()) {
      out += c;
      continue;
    }
    char e = body[++k];
    switch (e) {
      case '\n':
        break;  // line continuation
      case '\\':
      case '\'':
      case '"':
        out += e;
        break;
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
      case 'u':
      case 'U': {
        size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (size_t d = 0; d < n; ++d) {
          int h = k + 1 + d < body.size() ? HexVal(body[k + 1 + d]) : -1;
          if (h < 0) {
            return absl::InvalidArgumentError(
                absl::StrCat("line ", line, ": truncated \\", std::string(1, e), " escape"));
          }
          cp = cp * 16 + h;
        }
        k += n;
        AppendUtf8(cp, &out);
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          uint32_t cp = e - '0';
          for (int d = 0; d < 2 && k + 1 < body.size() && body[k + 1] >= '0' && body[k + 1] <= '7';
               ++d) {
            cp = cp * 8 + (body[++k] - '0');
          }
          AppendUtf8(cp, &out);
        } else if (e == 'N') {
          return absl::UnimplementedError(
              absl::StrCat("line ", line, ": unsupported \\N{...} escape in a string literal"));
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(const std::string& src) : src_(src) {}

  StatusOr<std::vector<Token>> Run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t p = NextOpener(pos_);
      std::string text = src_.substr(pos_, (p == std::string::npos ? src_.size() : p) - pos_);
      if (p == std::string::npos) {
        Emit(TokKind::kText, text, pos_);
        break;
      }
      const char kind = src_[p + 1];
      const char sign =
          p + 2 < src_.size() && (src_[p + 2] == '-' || src_[p + 2] == '+') ? src_[p + 2] : '\0';
      if (sign == '-') {
        while (!text.empty() && IsSpace(text.back())) text.pop_back();
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: drop spaces/tabs between the start of the line and the tag.
        size_t l = text.rfind('\n');
        l = l == std::string::npos ? 0 : l + 1;
        if ((l > 0 || line_starting) && l < text.size()) {
          bool ws = true;
          for (size_t k = l; k < text.size(); ++k) ws = ws && IsSpace(text[k]);
          if (ws) text.resize(l);
        }
      }
      if (!text.empty()) Emit(TokKind::kText, text, pos_);
      size_t start = p + 2 + (sign ? 1 : 0);
      size_t after = 0;
      if (kind == '#') {
        POLYKV_ASSIGN_OR_RETURN(after, Comment(p, start));
      } else {
        POLYKV_ASSIGN_OR_RETURN(after, Tag(p, start, kind == '%'));
      }
      line_starting = after > 0 && src_[after - 1] == '\n';
      pos_ = after;
    }
    Emit(TokKind::kEof, "", src_.size());
    return std::move(out_);
  }

 private:
  size_t NextOpener(size_t from) const {
    for (size_t p = src_.find('{', from); p != std::string::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) {
        return p;
      }
    }
    return std::string::npos;
  }

  int LineAt(size_t p) {
    for (; line_pos_ < p && line_pos_ < src_.size(); ++line_pos_) {
      if (src_[line_pos_] == '\n') ++line_;
    }
    return line_;
  }

  void Emit(TokKind kind, std::string text, size_t at) {
    Token t;
    t.kind = kind;
    t.text = std::move(text);
    t.line = LineAt(at);
    out_.push_back(std::move(t));
  }

  // Trims whitespace after a closer: '-' strips all of it, a block/comment end without '+'
  // drops one newline (trim_blocks).
  size_t AfterClose(size_t end, char marker, bool trim_block) const {
    if (marker == '-') {
      while (end < src_.size() && IsSpace(src_[end])) ++end;
    } else if (marker != '+' && trim_block && end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    return end;
  }

  StatusOr<size_t> Comment(size_t open, size_t start) {
    size_t q = src_.find("#}", start);
    if (q == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", LineAt(open), ": unterminated comment ({# without #})"));
    }
    char marker = q > start && src_[q - 1] == '-' ? '-' : '\0';
    return AfterClose(q + 2, marker, true);
  }

  StatusOr<size_t> Tag(size_t open, size_t start, bool block) {
    Emit(block ? TokKind::kBlockBegin : TokKind::kVarBegin, block ? "{%" : "{{", open);
    if (block) {
      size_t k = start;
      while (k < src_.size() && IsSpace(src_[k])) ++k;
      if (src_.compare(k, 3, "raw") == 0 && (k + 3 >= src_.size() || !IsNameChar(src_[k + 3]))) {
        return absl::UnimplementedError(
            absl::StrCat("line ", LineAt(open), ": unsupported tag 'raw'"));
      }
    }
    int depth = 0;
    size_t p = start;
    while (true) {
      while (p < src_.size() && IsSpace(src_[p])) ++p;
      if (p >= src_.size()) {
        return absl::InvalidArgumentError(absl::StrCat("line ", LineAt(open), ": unterminated ",
                                                       block ? "{% tag" : "{{ expression"));
      }
      if (depth == 0) {
        const char* close = block ? "%}" : "}}";
        char marker = (src_[p] == '-' || (block && src_[p] == '+')) ? src_[p] : '\0';
        if (src_.compare(p + (marker ? 1 : 0), 2, close) == 0) {
          Emit(block ? TokKind::kBlockEnd : TokKind::kVarEnd, close, p);
          return AfterClose(p + (marker ? 3 : 2), marker, block);
        }
      }
      POLYKV_ASSIGN_OR_RETURN(p, Expr(p, &depth));
    }
  }

  // Lexes one expression token at `p`; returns the position after it.
  StatusOr<size_t> Expr(size_t p, int* depth) {
    const char c = src_[p];
    if (IsNameStart(c)) {
      size_t e = p;
      while (e < src_.size() && IsNameChar(src_[e])) ++e;
      Emit(TokKind::kName, src_.substr(p, e - p), p);
      return e;
    }
    if (IsDigit(c)) return Number(p);
    if (c == '\'' || c == '"') return String(p);
    static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                 "/",  "%",  "~",  "(",  ")",  "[",  "]", "{", "}",
                                 ".",  ",",  ":",  "|",  "=",  "<",  ">", ";"};
    for (const char* op : kOps) {
      size_t n = std::strlen(op);
      if (src_.compare(p, n, op) == 0) {
        if (n == 1 && (c == '(' || c == '[' || c == '{')) ++*depth;
        if (n == 1 && (c == ')' || c == ']' || c == '}') && *depth > 0) --*depth;
        Emit(TokKind::kOp, op, p);
        return p + n;
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat("line ", LineAt(p), ": unexpected character '", std::string(1, c), "'"));
  }

  StatusOr<size_t> Number(size_t p) {
    auto digits = [&](size_t q) {
      while (q < src_.size() && (IsDigit(src_[q]) ||
                                 (src_[q] == '_' && q + 1 < src_.size() && IsDigit(src_[q + 1])))) {
        ++q;
      }
      return q;
    };
    size_t e = digits(p);
    bool is_float = false;
    const bool after_dot =
        !out_.empty() && out_.back().kind == TokKind::kOp && out_.back().text == ".";
    if (!after_dot && e + 1 < src_.size() && src_[e] == '.' && IsDigit(src_[e + 1])) {
      e = digits(e + 1);
      is_float = true;
    }
    if (!after_dot && e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t q = e + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && IsDigit(src_[q])) {
        e = digits(q);
        is_float = true;
      }
    }
    std::string text;
    for (size_t k = p; k < e; ++k) {
      if (src_[k] != '_') text += src_[k];
    }
    Emit(is_float ? TokKind::kFloat : TokKind::kInt, text, p);
    if (is_float) {
      out_.back().f = std::stod(text);
    } else {
      try {
        out_.back().i = std::stoll(text);
      } catch (const std::exception&) {
        return absl::UnimplementedError(
            absl::StrCat("line ", LineAt(p), ": integer literal ", text, " exceeds 64 bits"));
      }
    }
    return e;
  }

  StatusOr<size_t> String(size_t p) {
    const char q = src_[p];
    size_t e = p + 1;
    while (e < src_.size() && src_[e] != q) e += src_[e] == '\\' ? 2 : 1;
    if (e >= src_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", LineAt(p), ": unterminated string literal"));
    }
    int line = LineAt(p);
    POLYKV_ASSIGN_OR_RETURN(std::string value, DecodeEscapes(src_.substr(p + 1, e - p - 1), line));
    Emit(TokKind::kString, std::move(value), p);
    return e + 1;
  }

  const std::string& src_;
  size_t pos_ = 0;
  size_t line_pos_ = 0;
  int line_ = 1;
  std::vector<Token> out_;
};

}  // namespace

StatusOr<std::vector<Token>> Lex(const std::string& source) {
  // jinja2: newlines become "\n" and one trailing newline is dropped (keep_trailing_newline).
  std::string src;
  src.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      src += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      src += source[k];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(src).Run();
}

}  // namespace polykv::model::jinja
