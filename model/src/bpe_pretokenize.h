// Pre-tokenizers of byte-level BPE models: llama.cpp's regex lists selected by
// tokenizer.ggml.pre, and HF tokenizer.json pre_tokenizer descriptions (Split, ByteLevel,
// Digits, Sequence), both run by one splitter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bpe_regex.h"
#include "polykv/status.h"

namespace polykv::model::bpe {

/// What a split does with the matches of its pattern (HF SplitDelimiterBehavior).
enum class SplitBehavior {
  kIsolated,            ///< matches and the text between them are separate pieces
  kRemoved,             ///< matches are dropped
  kMergedWithPrevious,  ///< a match joins the piece before it
  kMergedWithNext,      ///< a match joins the piece after it
  kContiguous,          ///< adjacent matches form one piece
};

/// One step of a pre-tokenizer; each step splits every piece the previous steps produced.
struct PreStep {
  enum class Kind {
    kGpt2,    ///< the GPT-2 regex (HF ByteLevel use_regex), hand-written matcher
    kLlama3,  ///< the Llama 3 regex, hand-written matcher
    kRegex,   ///< any other pattern, through bpe::Regex
  };
  Kind kind = Kind::kRegex;
  std::string pattern;  ///< the regex (canonical text for kGpt2 / kLlama3)
  std::shared_ptr<const Regex> regex;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;  ///< HF Split invert: the pattern matches the pieces, not delimiters
};

/// A span of the text, in code points.
struct Piece {
  size_t start;
  size_t len;
};

/// The GPT-2 regex: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
extern const char kGpt2Regex[];
/// The Llama 3 regex: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
///  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
extern const char kLlama3Regex[];

/// A regex step. Patterns equal to the GPT-2 or Llama 3 regex (also llama.cpp's spellings of
/// them) use the hand-written matchers. Errors: kUnimplemented naming an unsupported
/// construct.
[[nodiscard]] StatusOr<PreStep> MakeRegexStep(const std::string& pattern,
                                              SplitBehavior behavior = SplitBehavior::kIsolated,
                                              bool invert = false);

/// A byte-level BPE pre-tokenizer: a named list of steps.
class PreTokenizer {
 public:
  /// llama.cpp's pre-tokenizer for a tokenizer.ggml.pre value (its regex list, in order).
  /// Errors: kUnimplemented naming the value and listing the supported names.
  [[nodiscard]] static StatusOr<PreTokenizer> FromName(const std::string& pre);

  /// A pre-tokenizer from explicit steps (tokenizer.json). name() is the llama.cpp family
  /// whose steps are identical (e.g. "llama3", "qwen2", "smollm"), else "custom".
  static PreTokenizer FromSteps(std::vector<PreStep> steps);

  /// Every tokenizer.ggml.pre value FromName accepts, comma separated.
  static std::string SupportedNames();

  /// Canonical family name ("gpt-2", "llama3", "qwen2", ..., or "custom").
  const std::string& name() const { return name_; }
  /// llama.cpp's defaults for the family: whole pre-tokens found in the vocabulary skip the
  /// merges (llama3, tekken, ...), and whether BOS is added when the GGUF does not say.
  bool ignore_merges() const { return ignore_merges_; }
  bool add_bos() const { return add_bos_; }
  const std::vector<PreStep>& steps() const { return steps_; }

  /// The steps as text (patterns, behaviors), for fingerprints and comparisons.
  std::string Signature() const;

  /// Splits `cps` into pre-tokens, left to right. Pieces never overlap and are never empty;
  /// text is missing only where a step removes it (SplitBehavior::kRemoved).
  std::vector<Piece> Split(const std::vector<uint32_t>& cps) const;

 private:
  std::string name_ = "custom";
  bool ignore_merges_ = false;
  bool add_bos_ = false;
  std::vector<PreStep> steps_;
};

}  // namespace polykv::model::bpe
