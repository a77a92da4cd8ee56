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
#include "polykv/status.h"

namespace polykv::model {

class GgufFile;

/// One chat turn for ApplyChatTemplate.
struct ChatMessage {
  std::string role;  ///< "system", "user" or "assistant"
  std::string content;
};

/// Text <-> token ids. Implementations are immutable and thread-safe after load.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// Token ids of `text`, with BOS first when `add_bos` and the model uses one.
  /// Errors: kInvalidArgument for text that cannot be encoded (invalid UTF-8 is encoded
  /// byte-wise where the vocabulary allows it).
  virtual StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_bos) const = 0;

  /// Text of `ids`. Errors: kOutOfRange naming an id >= vocab_size.
  virtual StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const = 0;

  virtual int32_t vocab_size() const = 0;
  /// -1 when the model has no such token.
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  /// Whether Encode(..., add_bos=true) prepends BOS (GGUF tokenizer.ggml.add_bos_token).
  virtual bool adds_bos() const = 0;
  /// True for ids that end generation (EOS, <|im_end|>, <|endoftext|> ...).
  virtual bool IsEndOfGeneration(int32_t id) const = 0;

  /// Formats a conversation with the model's chat template (ChatML for SmolLM2-Instruct:
  /// "<|im_start|>role\ncontent<|im_end|>\n" ... then "<|im_start|>assistant\n" when
  /// `add_generation_prompt`). Errors: kUnimplemented for an unknown template.
  virtual StatusOr<std::string> ApplyChatTemplate(absl::Span<const ChatMessage> messages,
                                                  bool add_generation_prompt) const = 0;

  /// Hex SHA-256 over the vocabulary, merges/scores and pre-tokenizer: part of a pool id.
  virtual std::string Fingerprint() const = 0;
};

/// Tokenizer from a GGUF file's metadata (tokenizer.ggml.*). The pre-tokenizer is chosen
/// from tokenizer.ggml.pre. Errors: kUnimplemented naming an unknown tokenizer.ggml.model
/// or tokenizer.ggml.pre; kInvalidArgument for inconsistent arrays.
StatusOr<std::unique_ptr<Tokenizer>> TokenizerFromGguf(const GgufFile& gguf);

/// Tokenizer from a path: a .gguf file (vocabulary-only GGUF is fine), a tokenizer.json,
/// a tokenizer.model, or a folder holding one of those.
/// Errors: kNotFound when there is none; other codes as above.
StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path);

}  // namespace polykv::model
