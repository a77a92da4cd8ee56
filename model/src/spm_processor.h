// Thin wrapper over sentencepiece::SentencePieceProcessor. Its header declares its own
// absl::string_view, which clashes with Abseil's, so it is only included in
// spm_processor.cc, which includes no Abseil header.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace polykv::model::spm {

/// A loaded tokenizer.model. Methods return false and set *error on failure.
class Processor {
 public:
  Processor();
  ~Processor();
  bool Load(const std::string& path, std::string* error);
  bool Encode(std::string_view text, std::vector<int>* ids, std::string* error) const;
  bool Decode(const std::vector<int>& ids, std::string* text, std::string* error) const;
  int PieceSize() const;
  int BosId() const;
  int EosId() const;
  /// Text of piece `id` ("<s>", "▁the").
  std::string IdToPiece(int id) const;
  std::string SerializedModel() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace polykv::model::spm
