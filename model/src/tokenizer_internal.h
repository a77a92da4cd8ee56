// Internals shared by the tokenizer implementations (tokenizer*.cc): the vocabulary, the
// special-token partition and the common Tokenizer base.
#pragma once

#include <cstdint>
#include <memory>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "bpe_pretokenize.h"
#include "polykv/model/tokenizer.h"
#include "unicode_data.h"

namespace polykv::model::tok {

/// Token types of tokenizer.ggml.token_type (llama.cpp llama_token_type).
enum TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

/// A vocabulary as read from GGUF metadata or tokenizer.json.
struct Vocab {
  std::vector<std::string> tokens;  ///< id -> text (byte-level encoded for BPE)
  std::vector<int32_t> types;       ///< id -> TokenType
  std::unordered_map<std::string, int32_t> token_to_id;
  int32_t bos = -1;
  int32_t eos = -1;
  int32_t unk = -1;
  int32_t eot = -1;
  bool add_bos = false;
  std::string chat_template;  ///< Jinja source, may be empty

  /// Fills token_to_id (first id wins for duplicates) and checks array sizes and special ids.
  /// Errors: kInvalidArgument naming the inconsistency.
  [[nodiscard]] Status Finish();
};

/// Tokenizer over a Vocab: special-token partition (control, user-defined and unknown
/// tokens in the text become single ids), BOS, chat template, end-of-generation set.
class VocabTokenizer : public Tokenizer {
 public:
  explicit VocabTokenizer(Vocab vocab);

  [[nodiscard]] StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                                      bool add_bos) const override;
  [[nodiscard]] StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(vocab_.tokens.size()); }
  int32_t bos_id() const override { return vocab_.bos; }
  int32_t eos_id() const override { return vocab_.eos; }
  bool adds_bos() const override { return vocab_.add_bos && vocab_.bos >= 0; }
  bool IsEndOfGeneration(int32_t id) const override { return eog_.count(id) > 0; }
  std::string chat_template() const override { return vocab_.chat_template; }
  std::string TokenText(int32_t id) const override;
  std::string Fingerprint() const override { return fingerprint_; }

 protected:
  /// Encodes one run of plain text (no special tokens in it). `after_special` is true at
  /// the start of the text and right after a special token.
  [[nodiscard]] virtual Status EncodeText(std::string_view text, bool after_special,
                                          std::vector<int32_t>* out) const = 0;
  /// Appends the text of one non-control token; `first` for the first token rendered
  /// (SentencePiece strips the space it prefixed).
  virtual void DecodeToken(int32_t id, bool first, std::string* out) const = 0;
  /// Sets the fingerprint from a model-specific payload (kind, pre, merges or scores).
  void SetFingerprint(const std::string& kind, const std::string& extra);

  Vocab vocab_;

 private:
  struct Special {
    std::string text;
    int32_t id;
  };
  std::vector<std::vector<Special>> special_by_byte_;  // first byte -> longest first
  std::unordered_set<int32_t> eog_;
  std::string fingerprint_;
};

/// Hex SHA-256 of `data`.
std::string Sha256Hex(std::string_view data);

/// Byte-level BPE (GPT-2 family) from a vocabulary, its merges ("a b" strings, rank order)
/// and a pre-tokenizer. `ignore_merges`: a whole pre-token found in the vocabulary is one
/// token (llama3). `nfc`: text between special tokens is NFC-normalized first (a
/// tokenizer.json NFC normalizer). Errors: kInvalidArgument for malformed merges.
[[nodiscard]] StatusOr<std::unique_ptr<Tokenizer>> MakeBpeTokenizer(
    Vocab vocab, const std::vector<std::string>& merges, bpe::PreTokenizer pre, bool ignore_merges,
    bool nfc = false);

/// SentencePiece BPE over a GGUF "llama" vocabulary (llama.cpp llm_tokenizer_spm).
[[nodiscard]] StatusOr<std::unique_ptr<Tokenizer>> MakeSpmTokenizer(Vocab vocab,
                                                                    std::vector<float> scores,
                                                                    bool add_space_prefix);

/// tokenizer.json (HF tokenizers, BPE model with a byte-level pre-tokenizer).
[[nodiscard]] StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizerJson(const std::string& path);
/// tokenizer.model through libsentencepiece.
[[nodiscard]] StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceModel(const std::string& path);

/// Renders `chat_template` (Jinja, see ChatTemplate) with `messages` and the model's BOS/EOS
/// token texts. Errors: kUnimplemented when `chat_template` is empty or uses an unsupported
/// construct; kInvalidArgument for an empty role or one holding '\n', '<' or '>', template
/// syntax errors and raise_exception().
[[nodiscard]] StatusOr<std::string> RenderChatTemplate(const std::string& chat_template,
                                                       absl::Span<const ChatMessage> messages,
                                                       bool add_generation_prompt,
                                                       const std::string& bos_token,
                                                       const std::string& eos_token);

/// One symbol of a word being merged: a byte span of the text, in a doubly-linked list.
struct MergeSymbol {
  size_t start;
  size_t n;  ///< bytes; 0 once merged into its left neighbour
  int prev;
  int next;
};

/// One symbol per UTF-8 character of `text`, linked in order (last `next` is -1).
inline std::vector<MergeSymbol> Utf8Symbols(std::string_view text) {
  std::vector<MergeSymbol> sym;
  for (size_t off = 0; off < text.size();) {
    size_t len =
        std::min(unicode::Utf8Len(static_cast<unsigned char>(text[off])), text.size() - off);
    sym.push_back({off, len, static_cast<int>(sym.size()) - 1, static_cast<int>(sym.size()) + 1});
    off += len;
  }
  if (!sym.empty()) sym.back().next = -1;
  return sym;
}

/// Greedy pairwise merging shared by byte-level BPE (lowest merge rank first) and
/// SentencePiece (highest score first). `Bigram` has int `left`, `right`, size_t `size` and an
/// operator< that puts the pair to merge next on top of a std::priority_queue;
/// `make(left, right, &bigram)` fills it, or returns false when the pair does not merge.
template <typename Bigram, typename MakeBigram>
void MergeSymbols(std::vector<MergeSymbol>& sym, MakeBigram make) {
  std::priority_queue<Bigram> queue;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    Bigram b;
    if (make(left, right, &b)) queue.push(b);
  };
  for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) try_add(i, i + 1);
  while (!queue.empty()) {
    Bigram b = queue.top();
    queue.pop();
    MergeSymbol& l = sym[b.left];
    MergeSymbol& r = sym[b.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size || l.next != b.right) continue;
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
}

/// After MergeSymbols over the non-empty `sym` of `text`: appends the id of each merged
/// symbol that is a token of `vocab`; for every other one, `fallback(symbol)` appends what
/// stands for it, or returns an error, which ends the walk.
template <typename Fallback>
[[nodiscard]] Status EmitMergedSymbols(const Vocab& vocab, const std::string& text,
                                       const std::vector<MergeSymbol>& sym,
                                       std::vector<int32_t>* out, Fallback fallback) {
  for (int i = 0; i >= 0; i = sym[i].next) {
    const MergeSymbol& s = sym[i];
    auto it = vocab.token_to_id.find(text.substr(s.start, s.n));
    if (it != vocab.token_to_id.end()) {
      out->push_back(it->second);
      continue;
    }
    POLYKV_RETURN_IF_ERROR(fallback(s));
  }
  return absl::OkStatus();
}

}  // namespace polykv::model::tok
