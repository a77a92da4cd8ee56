// Tokenizers for Llama-family models: byte-level BPE (GPT-2 style: SmolLM2, Llama 3) from
// GGUF metadata or tokenizer.json, and SentencePiece (tokenizer.model via libsentencepiece,
// or a GGUF-embedded "llama" vocabulary with byte fallback).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "polykv/model/chat_template.h"
#include "polykv/status.h"

namespace polykv::model {

class GgufFile;

/// Text <-> token ids. Implementations are immutable and thread-safe after load.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// Token ids of `text`, with BOS first when `add_bos` and the model uses one
  /// (adds_bos()). Special tokens written in the text (control, user-defined and unknown
  /// tokens such as "<|im_start|>") become single ids, as llama.cpp's parse_special, so the
  /// output of ApplyChatTemplate encodes correctly; the rest follows llama.cpp (byte-level
  /// BPE: pre-tokenizer regex set + merges; SentencePiece: U+2581 escape, space prefix,
  /// byte fallback). Errors: kInvalidArgument for text that cannot be encoded (invalid UTF-8
  /// is encoded byte-wise where the vocabulary allows it).
  [[nodiscard]] virtual StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                                              bool add_bos) const = 0;

  /// Text of `ids`: control tokens are rendered as their text ("<|im_end|>"), except a
  /// leading BOS when adds_bos(); SentencePiece drops the prefix space it added, so
  /// Decode(Encode(t, b)) == t. Errors: kOutOfRange naming an id < 0 or >= vocab_size.
  [[nodiscard]] virtual StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const = 0;

  virtual int32_t vocab_size() const = 0;
  /// -1 when the model has no such token.
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  /// Whether Encode(..., add_bos=true) prepends BOS (GGUF tokenizer.ggml.add_bos_token).
  virtual bool adds_bos() const = 0;
  /// True for ids that end generation (EOS, <|im_end|>, <|endoftext|> ...).
  virtual bool IsEndOfGeneration(int32_t id) const = 0;

  /// Formats a conversation with the model's chat template (GGUF tokenizer.chat_template or
  /// tokenizer_config.json chat_template), rendered by ChatTemplate with this model's BOS and
  /// EOS token texts; for SmolLM2-Instruct that is "<|im_start|>role\ncontent<|im_end|>\n"
  /// ... then "<|im_start|>assistant\n" when `add_generation_prompt`. Errors:
  /// kUnimplemented when the model has no template or it uses an unsupported construct;
  /// kInvalidArgument for an empty role or one holding '\n', '<' or '>', for template
  /// syntax errors and raise_exception() (see ChatTemplate).
  [[nodiscard]] StatusOr<std::string> ApplyChatTemplate(absl::Span<const ChatMessage> messages,
                                                        bool add_generation_prompt) const;
  /// As above with `template_source` (e.g. a --chat-template file) instead of the model's own.
  [[nodiscard]] StatusOr<std::string> ApplyChatTemplate(absl::Span<const ChatMessage> messages,
                                                        bool add_generation_prompt,
                                                        const std::string& template_source) const;

  /// Jinja source of the model's chat template; "" when it has none.
  virtual std::string chat_template() const { return ""; }
  /// Text of token `id` as chat templates see it (bos_token, eos_token: "<|im_start|>",
  /// "<s>"); "" for -1 or an id outside the vocabulary.
  virtual std::string TokenText(int32_t id) const = 0;

  /// Hex SHA-256 (64 lowercase hex digits) over the tokenizer kind, token texts and types,
  /// BOS/EOS, merges or scores and the pre-tokenizer: part of a pool id. Equal for the same
  /// vocabulary loaded twice; any change to tokens/merges/scores changes it.
  virtual std::string Fingerprint() const = 0;

  /// Tokenizer family, for recording with a pool: "bpe/<pre-tokenizer>" for byte-level BPE
  /// (the llama.cpp name of its pre-tokenizer: "bpe/llama3", "bpe/qwen2", "bpe/smollm" ...,
  /// or "bpe/custom" for a tokenizer.json pre-tokenizer that is none of them) and "spm" for
  /// SentencePiece (GGUF "llama" vocabularies and tokenizer.model files).
  virtual std::string family() const { return "unknown"; }
};

/// Tokenizer from a GGUF file's metadata (tokenizer.ggml.*). tokenizer.ggml.model "gpt2" is
/// byte-level BPE with the pre-tokenizer chosen from tokenizer.ggml.pre: every name llama.cpp
/// knows for decoder models (default, gpt-2, llama3/llama-bpe, smollm, starcoder, refact,
/// falcon, mpt, deepseek-llm, deepseek-coder, deepseek-v3, qwen2, stablelm2, command-r, olmo,
/// dbrx, smaug-bpe, poro-chat, chatglm-bpe, viking, jais, tekken, bloom, gpt3-finnish, exaone,
/// chameleon, minerva-7b, gpt-4o and the rest; the error for an unknown name lists them all),
/// with that family's regex list and its llama.cpp defaults (ignore_merges and BOS for
/// llama3/tekken ...); "llama" is SentencePiece BPE (scores, byte fallback,
/// tokenizer.ggml.add_space_prefix). The tokenizer copies what it needs: `gguf` may be
/// closed afterwards. Errors: kNotFound when the file has no tokenizer.ggml.model;
/// kUnimplemented naming an unknown tokenizer.ggml.model or tokenizer.ggml.pre;
/// kInvalidArgument for inconsistent arrays, malformed merges or special ids outside the
/// vocabulary.
[[nodiscard]] StatusOr<std::unique_ptr<Tokenizer>> TokenizerFromGguf(const GgufFile& gguf);

/// Tokenizer from a path: a .gguf file (vocabulary-only GGUF is fine; recognized by its
/// magic), a tokenizer.json (HF tokenizers byte-level BPE; its pre_tokenizer is run as
/// described: Split (Regex or String pattern, any behavior, invert), ByteLevel (use_regex),
/// Digits and Sequence of them, ending in ByteLevel; normalizer none or NFC; ids, BOS/EOS and
/// chat template from a tokenizer_config.json beside it), a tokenizer.model
/// (libsentencepiece), or a folder holding tokenizer.json or tokenizer.model (in that order
/// of preference).
/// Errors: kNotFound when there is none; kUnimplemented naming an unsupported model type,
/// normalizer or pre_tokenizer; kInvalidArgument for malformed files.
[[nodiscard]] StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path);

}  // namespace polykv::model
