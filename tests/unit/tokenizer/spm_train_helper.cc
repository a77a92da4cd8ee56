// Test helper: tiny SentencePiece training (see spm_train_helper.h).
#include "spm_train_helper.h"

#include <sentencepiece_trainer.h>

namespace polykv::model::testing {

bool TrainSentencePiece(const std::string& input_file, const std::string& model_prefix,
                        int vocab_size, std::string* error) {
  const std::string args = "--input=" + input_file + " --model_prefix=" + model_prefix +
                           " --vocab_size=" + std::to_string(vocab_size) +
                           " --model_type=bpe --byte_fallback=true --character_coverage=1.0"
                           " --normalization_rule_name=identity --remove_extra_whitespaces=false"
                           " --split_digits=true --num_threads=1 --minloglevel=2";
  auto st = sentencepiece::SentencePieceTrainer::Train(args);
  if (!st.ok()) *error = st.ToString();
  return st.ok();
}

}  // namespace polykv::model::testing
