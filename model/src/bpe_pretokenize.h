// Pre-tokenizers of byte-level BPE models (llama.cpp's regex sets, hand-written matchers).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "polykv/status.h"
#include "unicode_data.h"

namespace polykv::model::bpe {

/// Pre-tokenizer regex sets (llama.cpp llm_tokenizer_bpe). Each is applied in order; every
/// one splits the pieces the previous one produced (matches and the text between them).
enum class PreType {
  kDefault,  ///< "[\p{P}\$\+<=>\^`\|~]", GPT-2 regex, "\p{N}+", "[0-9][0-9][0-9]"
  kGpt2,     ///< 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kSmolLm,   ///< "\p{N}" (single digits), then the GPT-2 regex
  kLlama3,   ///< (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
             ///<  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
};

/// Maps a tokenizer.ggml.pre value to its regex set. kUnimplemented naming unknown values.
StatusOr<PreType> PreTypeFromName(const std::string& pre);
/// Canonical name of a pre type (used in fingerprints).
const char* PreTypeName(PreType t);

/// Splits `text` (already decoded to code points) into pre-token lengths, in code points.
/// The lengths sum to cps.size(); no length is 0.
std::vector<size_t> PreTokenize(PreType type, const std::vector<uint32_t>& cps);

}  // namespace polykv::model::bpe
