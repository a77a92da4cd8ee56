// libsentencepiece wrapper (see spm_processor.h for why it is isolated).
#include "spm_processor.h"

#include <sentencepiece_processor.h>

namespace polykv::model::spm {

struct Processor::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

Processor::Processor() : impl_(new Impl) {}
Processor::~Processor() = default;

bool Processor::Load(const std::string& path, std::string* error) {
  auto st = impl_->sp.Load(path);
  if (!st.ok()) *error = st.ToString();
  return st.ok();
}

bool Processor::Encode(std::string_view text, std::vector<int>* ids, std::string* error) const {
  auto st = impl_->sp.Encode(std::string(text), ids);
  if (!st.ok()) *error = st.ToString();
  return st.ok();
}

bool Processor::Decode(const std::vector<int>& ids, std::string* text, std::string* error) const {
  auto st = impl_->sp.Decode(ids, text);
  if (!st.ok()) *error = st.ToString();
  return st.ok();
}

int Processor::PieceSize() const { return impl_->sp.GetPieceSize(); }
int Processor::BosId() const { return impl_->sp.bos_id(); }
int Processor::EosId() const { return impl_->sp.eos_id(); }
std::string Processor::IdToPiece(int id) const { return impl_->sp.IdToPiece(id); }
std::string Processor::SerializedModel() const { return impl_->sp.serialized_model_proto(); }

}  // namespace polykv::model::spm
