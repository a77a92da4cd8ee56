// Internals shared by the tokenizer implementations (tokenizer*.cc): the vocabulary, the
// special-token partition and the common Tokenizer base.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "bpe_pretokenize.h"
#include "polykv/model/tokenizer.h"

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
  Status Finish();
};

/// Tokenizer over a Vocab: special-token partition (control, user-defined and unknown
/// tokens in the text become single ids), BOS, chat template, end-of-generation set.
class VocabTokenizer : public Tokenizer {
 public:
  explicit VocabTokenizer(Vocab vocab);

  StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_bos) const override;
  StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(vocab_.tokens.size()); }
  int32_t bos_id() const override { return vocab_.bos; }
  int32_t eos_id() const override { return vocab_.eos; }
  bool adds_bos() const override { return vocab_.add_bos && vocab_.bos >= 0; }
  bool IsEndOfGeneration(int32_t id) const override { return eog_.count(id) > 0; }
  StatusOr<std::string> ApplyChatTemplate(absl::Span<const ChatMessage> messages,
                                          bool add_generation_prompt) const override;
  std::string Fingerprint() const override { return fingerprint_; }

 protected:
  /// Encodes one run of plain text (no special tokens in it). `after_special` is true at
  /// the start of the text and right after a special token.
  virtual Status EncodeText(std::string_view text, bool after_special,
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
/// token (llama3). Errors: kInvalidArgument for malformed merges.
StatusOr<std::unique_ptr<Tokenizer>> MakeBpeTokenizer(Vocab vocab,
                                                      const std::vector<std::string>& merges,
                                                      bpe::PreType pre, bool ignore_merges);

/// SentencePiece BPE over a GGUF "llama" vocabulary (llama.cpp llm_tokenizer_spm).
StatusOr<std::unique_ptr<Tokenizer>> MakeSpmTokenizer(Vocab vocab, std::vector<float> scores,
                                                      bool add_space_prefix);

/// tokenizer.json (HF tokenizers, BPE model with a byte-level pre-tokenizer).
StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizerJson(const std::string& path);
/// tokenizer.model through libsentencepiece.
StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceModel(const std::string& path);

/// ChatML rendering ("<|im_start|>role\ncontent<|im_end|>\n"...), with the default system
/// prompt the template inserts when the first message is not a system message (if any).
/// kUnimplemented when `chat_template` is not ChatML.
StatusOr<std::string> RenderChatTemplate(const std::string& chat_template,
                                         absl::Span<const ChatMessage> messages,
                                         bool add_generation_prompt);

}  // namespace polykv::model::tok
