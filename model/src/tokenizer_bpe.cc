// Byte-level BPE (GPT-2 family: SmolLM2, Llama 3, Qwen2, DeepSeek ...): pre-tokenize, map
// bytes to the GPT-2 byte-to-unicode alphabet, apply merges by rank (llama.cpp
// llm_tokenizer_bpe).
#include <queue>

#include "absl/strings/str_cat.h"
#include "tokenizer_internal.h"
#include "unicode_data.h"
#include "unicode_nfc.h"

namespace polykv::model::tok {
namespace {

// GPT-2 bytes_to_unicode: printable bytes map to themselves, the rest to U+0100 onwards.
void ByteMaps(std::string byte_to_str[256], std::unordered_map<uint32_t, uint8_t>* str_to_byte) {
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const uint32_t cp = printable ? static_cast<uint32_t>(b) : 256u + n++;
    byte_to_str[b] = unicode::EncodeUtf8(cp);
    (*str_to_byte)[cp] = static_cast<uint8_t>(b);
  }
}

class BpeTokenizer final : public VocabTokenizer {
 public:
  BpeTokenizer(Vocab vocab, bpe::PreTokenizer pre, bool ignore_merges, bool nfc)
      : VocabTokenizer(std::move(vocab)),
        pre_(std::move(pre)),
        ignore_merges_(ignore_merges),
        nfc_(nfc) {
    ByteMaps(byte_to_str_, &str_to_byte_);
  }

  Status Init(const std::vector<std::string>& merges) {
    ranks_.reserve(merges.size());
    // Named families keep the form "pre <name> ignore_merges <0|1>"; a custom
    // (tokenizer.json) pre-tokenizer adds its steps.
    std::string fp_extra =
        absl::StrCat("pre ", pre_.name(), " ignore_merges ", ignore_merges_ ? 1 : 0, "\n");
    if (pre_.name() == "custom") absl::StrAppend(&fp_extra, pre_.Signature(), "\n");
    if (nfc_) fp_extra += "normalizer nfc\n";
    for (size_t i = 0; i < merges.size(); ++i) {
      const std::string& m = merges[i];
      size_t sp = m.find(' ', 1);
      if (sp == std::string::npos || sp + 1 >= m.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("BPE merge #", i, " '", m, "' is not of the form 'left right'"));
      }
      ranks_.emplace(m, static_cast<int32_t>(i));  // first (lowest) rank wins
      absl::StrAppend(&fp_extra, m, "\n");
    }
    SetFingerprint("bpe", fp_extra);
    return absl::OkStatus();
  }

 protected:
  Status EncodeText(std::string_view text, bool after_special,
                    std::vector<int32_t>* out) const override {
    (void)after_special;
    std::string normalized;
    if (nfc_) {
      normalized = unicode::NormalizeNfc(text);
      text = normalized;
    }
    unicode::CodePoints cps = unicode::DecodeUtf8(text);
    std::vector<bpe::Piece> pieces = pre_.Split(cps.cps);
    std::vector<size_t> byte_at(cps.lens.size() + 1, 0);  // code point -> byte offset
    for (size_t k = 0; k < cps.lens.size(); ++k) byte_at[k + 1] = byte_at[k] + cps.lens[k];
    std::string word;
    for (const bpe::Piece& piece : pieces) {
      word.clear();
      for (size_t b = byte_at[piece.start]; b < byte_at[piece.start + piece.len]; ++b) {
        word += byte_to_str_[static_cast<unsigned char>(text[b])];
      }
      POLYKV_RETURN_IF_ERROR(EncodeWord(word, out));
    }
    return absl::OkStatus();
  }

  std::string family() const override { return "bpe/" + pre_.name(); }

  void DecodeToken(int32_t id, bool first, std::string* out) const override {
    (void)first;
    const std::string& t = vocab_.tokens[id];
    const int32_t type = vocab_.types[id];
    if (type == kUserDefined || type == kUnknown) {
      *out += t;
      return;
    }
    if (type == kByte && t.size() == 6 && t.compare(0, 3, "<0x") == 0) {
      *out += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
      return;
    }
    unicode::CodePoints cps = unicode::DecodeUtf8(t);
    size_t off = 0;
    for (size_t k = 0; k < cps.cps.size(); ++k) {
      auto it = str_to_byte_.find(cps.cps[k]);
      if (it != str_to_byte_.end()) {
        *out += static_cast<char>(it->second);
      } else {
        out->append(t, off, cps.lens[k]);  // not in the byte alphabet: copy as is
      }
      off += cps.lens[k];
    }
  }

 private:
  struct Bigram {
    int32_t rank;
    int left;
    int right;
    size_t size;
    bool operator<(const Bigram& o) const {  // priority_queue: top = lowest rank, leftmost
      return rank > o.rank || (rank == o.rank && left > o.left);
    }
  };

  Status EncodeWord(const std::string& word, std::vector<int32_t>* out) const {
    if (word.empty()) return absl::OkStatus();
    if (ignore_merges_) {
      auto it = vocab_.token_to_id.find(word);
      if (it != vocab_.token_to_id.end()) {
        out->push_back(it->second);
        return absl::OkStatus();
      }
    }
    std::vector<MergeSymbol> sym = Utf8Symbols(word);
    std::string key;
    MergeSymbols<Bigram>(sym, [&](int left, int right, Bigram* b) {
      key.assign(word, sym[left].start, sym[left].n);
      key += ' ';
      key.append(word, sym[right].start, sym[right].n);
      auto it = ranks_.find(key);
      if (it == ranks_.end()) return false;
      *b = {it->second, left, right, sym[left].n + sym[right].n};
      return true;
    });
    // Symbols that are not tokens fall back to their single byte-characters.
    return EmitMergedSymbols(vocab_, word, sym, out, [&](const MergeSymbol& s) {
      for (size_t off = s.start; off < s.start + s.n;) {
        size_t len =
            std::min(unicode::Utf8Len(static_cast<unsigned char>(word[off])), s.start + s.n - off);
        auto bt = vocab_.token_to_id.find(word.substr(off, len));
        if (bt != vocab_.token_to_id.end()) {
          out->push_back(bt->second);
        } else if (vocab_.unk >= 0) {
          out->push_back(vocab_.unk);
        } else {
          return absl::InvalidArgumentError(
              absl::StrCat("BPE vocabulary has no token for byte-level piece '",
                           word.substr(off, len), "' and no unknown token"));
        }
        off += len;
      }
      return absl::OkStatus();
    });
  }

  bpe::PreTokenizer pre_;
  bool ignore_merges_;
  bool nfc_;
  std::unordered_map<std::string, int32_t> ranks_;
  std::string byte_to_str_[256];
  std::unordered_map<uint32_t, uint8_t> str_to_byte_;
};

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> MakeBpeTokenizer(Vocab vocab,
                                                      const std::vector<std::string>& merges,
                                                      bpe::PreTokenizer pre, bool ignore_merges,
                                                      bool nfc) {
  POLYKV_RETURN_IF_ERROR(vocab.Finish());
  auto t = std::make_unique<BpeTokenizer>(std::move(vocab), std::move(pre), ignore_merges, nfc);
  POLYKV_RETURN_IF_ERROR(t->Init(merges));
  return std::unique_ptr<Tokenizer>(std::move(t));
}

}  // namespace polykv::model::tok
