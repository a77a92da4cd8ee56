// Test helper: trains a tiny SentencePiece model with libsentencepiece_train. Kept in its own
// file because sentencepiece headers clash with Abseil's absl::string_view.
#pragma once

#include <string>

namespace polykv::model::testing {

/// Trains a model from `input_file` into `model_prefix`.model; false and *error on failure.
bool TrainSentencePiece(const std::string& input_file, const std::string& model_prefix,
                        int vocab_size, std::string* error);

}  // namespace polykv::model::testing
