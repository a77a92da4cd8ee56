// SentencePiece BPE over a GGUF "llama" vocabulary (tokens + scores + types) with byte
// fallback (<0xNN> tokens) and the U+2581 whitespace escape (llama.cpp llm_tokenizer_spm).
#include <cmath>
#include <cstring>
#include <queue>

#include "absl/strings/str_cat.h"
#include "tokenizer_internal.h"
#include "unicode_data.h"

namespace polykv::model::tok {
namespace {

constexpr char kSpace[] = "\xe2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

class SpmTokenizer final : public VocabTokenizer {
 public:
  std::string family() const override { return "spm"; }

  SpmTokenizer(Vocab vocab, std::vector<float> scores, bool add_space_prefix)
      : VocabTokenizer(std::move(vocab)),
        scores_(std::move(scores)),
        add_space_prefix_(add_space_prefix) {
    for (int& b : byte_token_) b = -1;
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      auto it = vocab_.token_to_id.find(name);
      if (it != vocab_.token_to_id.end()) byte_token_[b] = it->second;
    }
    std::string extra = absl::StrCat("add_space_prefix ", add_space_prefix_ ? 1 : 0, "\n");
    for (float s : scores_) {
      uint32_t bits;
      std::memcpy(&bits, &s, 4);
      absl::StrAppend(&extra, bits, "\n");
    }
    SetFingerprint("spm", extra);
  }

 protected:
  Status EncodeText(std::string_view raw, bool after_special,
                    std::vector<int32_t>* out) const override {
    std::string text;
    text.reserve(raw.size() + 8);
    if (add_space_prefix_ && after_special) text += kSpace;
    for (char c : raw) {
      if (c == ' ') {
        text += kSpace;
      } else {
        text += c;
      }
    }
    // One symbol per UTF-8 character.
    std::vector<MergeSymbol> sym = Utf8Symbols(text);
    if (sym.empty()) return absl::OkStatus();
    MergeSymbols<Bigram>(sym, [&](int left, int right, Bigram* b) {
      auto it = vocab_.token_to_id.find(text.substr(sym[left].start, sym[left].n + sym[right].n));
      if (it == vocab_.token_to_id.end()) return false;
      *b = {Score(it->second), left, right, sym[left].n + sym[right].n};
      return true;
    });
    return EmitMergedSymbols(vocab_, text, sym, out, [&](const MergeSymbol& s) {
      for (size_t k = s.start; k < s.start + s.n; ++k) {  // byte fallback
        int id = byte_token_[static_cast<unsigned char>(text[k])];
        if (id < 0) id = vocab_.unk;
        if (id < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "SentencePiece vocabulary has no byte token for 0x",
              absl::Hex(static_cast<unsigned char>(text[k])), " and no unknown token"));
        }
        out->push_back(id);
      }
      return absl::OkStatus();
    });
  }

  void DecodeToken(int32_t id, bool first, std::string* out) const override {
    const std::string& t = vocab_.tokens[id];
    switch (vocab_.types[id]) {
      case kByte:
        if (t.size() == 6 && t.compare(0, 3, "<0x") == 0) {
          *out += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
        }
        return;
      case kUnknown:
        *out += "\xe2\x96\x85";  // U+2585, as llama.cpp renders <unk>
        return;
      case kUserDefined:
        *out += t;
        return;
      default: {
        std::string piece;
        for (size_t i = 0; i < t.size();) {
          if (t.compare(i, 3, kSpace) == 0) {
            piece += ' ';
            i += 3;
          } else {
            piece += t[i++];
          }
        }
        if (first && add_space_prefix_ && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
        *out += piece;
      }
    }
  }

 private:
  struct Bigram {
    float score;
    int left;
    int right;
    size_t size;
    bool operator<(const Bigram& o) const {  // top = highest score, leftmost
      return score < o.score || (score == o.score && left > o.left);
    }
  };
  float Score(int32_t id) const {
    return id < static_cast<int32_t>(scores_.size()) ? scores_[id] : 0.0f;
  }

  std::vector<float> scores_;
  bool add_space_prefix_;
  int byte_token_[256];
};

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> MakeSpmTokenizer(Vocab vocab, std::vector<float> scores,
                                                      bool add_space_prefix) {
  POLYKV_RETURN_IF_ERROR(vocab.Finish());
  if (!scores.empty() && scores.size() != vocab.tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("SentencePiece vocabulary has ",
                                                   vocab.tokens.size(), " tokens but ",
                                                   scores.size(), " scores"));
  }
  for (size_t i = 0; i < scores.size(); ++i) {
    if (!std::isfinite(scores[i])) {
      return absl::InvalidArgumentError(absl::StrCat("token score #", i, " is not finite"));
    }
  }
  return std::unique_ptr<Tokenizer>(
      new SpmTokenizer(std::move(vocab), std::move(scores), add_space_prefix));
}

}  // namespace polykv::model::tok
