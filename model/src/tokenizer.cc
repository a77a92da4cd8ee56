// Tokenizer factories (GGUF metadata, tokenizer.json, tokenizer.model, folders) and the
// parts shared by every vocabulary-based tokenizer: special tokens, BOS, chat template,
// end-of-generation ids and the fingerprint.
#include "polykv/model/tokenizer.h"

#include <openssl/evp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "polykv/model/gguf.h"
#include "tokenizer_internal.h"

namespace polykv::model {
namespace tok {

std::string Sha256Hex(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    hex += kHex[md[i] >> 4];
    hex += kHex[md[i] & 15];
  }
  return hex;
}

Status Vocab::Finish() {
  if (tokens.empty()) return absl::InvalidArgumentError("tokenizer vocabulary is empty");
  if (types.empty()) types.assign(tokens.size(), kNormal);
  if (types.size() != tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer has ", tokens.size(), " tokens but ",
                                                   types.size(), " token types"));
  }
  const auto n = static_cast<int32_t>(tokens.size());
  for (int32_t* id : {&bos, &eos, &unk, &eot}) {
    if (*id >= n || *id < -1) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer special token id ", *id, " is outside the vocabulary of ", n));
    }
  }
  token_to_id.reserve(tokens.size());
  for (int32_t i = 0; i < n; ++i) token_to_id.emplace(tokens[i], i);
  return absl::OkStatus();
}

VocabTokenizer::VocabTokenizer(Vocab vocab) : vocab_(std::move(vocab)) {
  special_by_byte_.resize(256);
  for (int32_t i = 0; i < vocab_size(); ++i) {
    const int32_t t = vocab_.types[i];
    if ((t == kControl || t == kUserDefined || t == kUnknown) && !vocab_.tokens[i].empty()) {
      special_by_byte_[static_cast<unsigned char>(vocab_.tokens[i][0])].push_back(
          {vocab_.tokens[i], i});
    }
  }
  for (auto& v : special_by_byte_) {
    std::stable_sort(v.begin(), v.end(), [](const Special& a, const Special& b) {
      return a.text.size() > b.text.size();
    });
  }
  // End of generation: EOS, EOT and the end-of-turn tokens of common chat formats.
  if (vocab_.eos >= 0) eog_.insert(vocab_.eos);
  if (vocab_.eot >= 0) eog_.insert(vocab_.eot);
  for (const char* t : {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<|eom_id|>",
                        "<end_of_turn>", "<EOT>"}) {
    auto it = vocab_.token_to_id.find(t);
    if (it != vocab_.token_to_id.end() && vocab_.types[it->second] != kNormal) {
      eog_.insert(it->second);
    }
  }
}

void VocabTokenizer::SetFingerprint(const std::string& kind, const std::string& extra) {
  std::string data = "polykv-tokenizer-v1\n" + kind + "\n";
  for (size_t i = 0; i < vocab_.tokens.size(); ++i) {
    absl::StrAppend(&data, vocab_.types[i], " ", vocab_.tokens[i].size(), " ", vocab_.tokens[i],
                    "\n");
  }
  absl::StrAppend(&data, "bos ", vocab_.bos, " eos ", vocab_.eos, " add_bos ",
                  vocab_.add_bos ? 1 : 0, "\n");
  data += extra;
  fingerprint_ = Sha256Hex(data);
}

StatusOr<std::vector<int32_t>> VocabTokenizer::Encode(std::string_view text, bool add_bos) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && adds_bos()) out.push_back(vocab_.bos);
  bool after_special = true;
  size_t start = 0, i = 0;
  while (i < text.size()) {
    const auto& cands = special_by_byte_[static_cast<unsigned char>(text[i])];
    const Special* hit = nullptr;
    for (const Special& s : cands) {
      if (text.compare(i, s.text.size(), s.text) == 0) {
        hit = &s;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    if (i > start) {
      POLYKV_RETURN_IF_ERROR(EncodeText(text.substr(start, i - start), after_special, &out));
    }
    out.push_back(hit->id);
    after_special = true;
    i += hit->text.size();
    start = i;
  }
  if (start < text.size()) {
    POLYKV_RETURN_IF_ERROR(EncodeText(text.substr(start), after_special, &out));
  }
  return out;
}

StatusOr<std::string> VocabTokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::string out;
  bool first = true;
  for (size_t k = 0; k < ids.size(); ++k) {
    const int32_t id = ids[k];
    if (id < 0 || id >= vocab_size()) {
      return absl::OutOfRangeError(absl::StrCat("token id ", id, " at position ", k,
                                                " is outside the vocabulary of ", vocab_size()));
    }
    if (k == 0 && id == vocab_.bos && adds_bos()) continue;  // the BOS Encode added
    if (vocab_.types[id] == kControl) {
      out += vocab_.tokens[id];
    } else {
      DecodeToken(id, first, &out);
    }
    first = false;
  }
  return out;
}

std::string VocabTokenizer::TokenText(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  if (vocab_.types[id] == kControl) return vocab_.tokens[id];
  std::string out;
  DecodeToken(id, /*first=*/false, &out);
  return out;
}

StatusOr<std::string> RenderChatTemplate(const std::string& chat_template,
                                         absl::Span<const ChatMessage> messages,
                                         bool add_generation_prompt, const std::string& bos_token,
                                         const std::string& eos_token) {
  if (chat_template.empty()) {
    return absl::UnimplementedError("the model has no chat template (tokenizer.chat_template)");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role.empty() || m.role.find_first_of("\n<>") != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("chat message ", i, " has an invalid role '", m.role, "'"));
    }
  }
  POLYKV_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::Parse(chat_template));
  ChatRenderOptions opt;
  opt.add_generation_prompt = add_generation_prompt;
  opt.bos_token = bos_token;
  opt.eos_token = eos_token;
  return t.Render(messages, opt);
}

}  // namespace tok

StatusOr<std::string> Tokenizer::ApplyChatTemplate(absl::Span<const ChatMessage> messages,
                                                   bool add_generation_prompt) const {
  return ApplyChatTemplate(messages, add_generation_prompt, chat_template());
}

StatusOr<std::string> Tokenizer::ApplyChatTemplate(absl::Span<const ChatMessage> messages,
                                                   bool add_generation_prompt,
                                                   const std::string& template_source) const {
  return tok::RenderChatTemplate(template_source, messages, add_generation_prompt,
                                 TokenText(bos_id()), TokenText(eos_id()));
}

StatusOr<std::unique_ptr<Tokenizer>> TokenizerFromGguf(const GgufFile& gguf) {
  if (!gguf.Has("tokenizer.ggml.model")) {
    return absl::NotFoundError(
        absl::StrCat(gguf.path(), " has no tokenizer (tokenizer.ggml.model missing)"));
  }
  POLYKV_ASSIGN_OR_RETURN(std::string model, gguf.GetString("tokenizer.ggml.model"));
  tok::Vocab v;
  POLYKV_ASSIGN_OR_RETURN(v.tokens, gguf.GetStringArray("tokenizer.ggml.tokens"));
  if (gguf.Has("tokenizer.ggml.token_type")) {
    POLYKV_ASSIGN_OR_RETURN(v.types, gguf.GetIntArray("tokenizer.ggml.token_type"));
  }
  struct IdKey {
    const char* key;
    int32_t* dst;
  };
  for (IdKey k :
       {IdKey{"tokenizer.ggml.bos_token_id", &v.bos}, IdKey{"tokenizer.ggml.eos_token_id", &v.eos},
        IdKey{"tokenizer.ggml.unknown_token_id", &v.unk},
        IdKey{"tokenizer.ggml.eot_token_id", &v.eot}}) {
    if (gguf.Has(k.key)) {
      POLYKV_ASSIGN_OR_RETURN(int64_t id, gguf.GetInt(k.key));
      if (id < -1 || id > static_cast<int64_t>(v.tokens.size())) {
        return absl::InvalidArgumentError(absl::StrCat(k.key, " = ", id, " is outside the ",
                                                       v.tokens.size(), "-token vocabulary"));
      }
      *k.dst = static_cast<int32_t>(id);
    }
  }
  if (gguf.Has("tokenizer.chat_template")) {
    POLYKV_ASSIGN_OR_RETURN(v.chat_template, gguf.GetString("tokenizer.chat_template"));
  }
  std::string pre = "default";
  if (gguf.Has("tokenizer.ggml.pre")) {
    POLYKV_ASSIGN_OR_RETURN(pre, gguf.GetString("tokenizer.ggml.pre"));
  }
  std::optional<bool> add_bos;
  if (gguf.Has("tokenizer.ggml.add_bos_token")) {
    POLYKV_ASSIGN_OR_RETURN(add_bos, gguf.GetBool("tokenizer.ggml.add_bos_token"));
  }

  if (model == "gpt2") {
    POLYKV_ASSIGN_OR_RETURN(bpe::PreTokenizer pt, bpe::PreTokenizer::FromName(pre));
    POLYKV_ASSIGN_OR_RETURN(std::vector<std::string> merges,
                            gguf.GetStringArray("tokenizer.ggml.merges"));
    v.add_bos = add_bos.value_or(pt.add_bos());
    const bool ignore_merges = pt.ignore_merges();
    return tok::MakeBpeTokenizer(std::move(v), merges, std::move(pt), ignore_merges);
  }
  if (model == "llama") {
    std::vector<float> scores;
    if (gguf.Has("tokenizer.ggml.scores")) {
      POLYKV_ASSIGN_OR_RETURN(scores, gguf.GetFloatArray("tokenizer.ggml.scores"));
    }
    bool add_space_prefix = true;
    if (gguf.Has("tokenizer.ggml.add_space_prefix")) {
      POLYKV_ASSIGN_OR_RETURN(add_space_prefix, gguf.GetBool("tokenizer.ggml.add_space_prefix"));
    }
    v.add_bos = add_bos.value_or(true);
    return tok::MakeSpmTokenizer(std::move(v), std::move(scores), add_space_prefix);
  }
  return absl::UnimplementedError(absl::StrCat("tokenizer.ggml.model '", model,
                                               "' is not supported by PolyKV (supported: gpt2, "
                                               "llama)"));
}

namespace {
bool IsDir(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool IsFile(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool HasGgufMagic(const std::string& p) {
  FILE* f = std::fopen(p.c_str(), "rb");
  if (!f) return false;
  char m[4] = {0, 0, 0, 0};
  size_t n = std::fread(m, 1, 4, f);
  std::fclose(f);
  return n == 4 && std::memcmp(m, "GGUF", 4) == 0;
}
}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path) {
  if (IsDir(path)) {
    std::string dir = EndsWith(path, "/") ? path : path + "/";
    if (IsFile(dir + "tokenizer.json")) return tok::LoadHfTokenizerJson(dir + "tokenizer.json");
    if (IsFile(dir + "tokenizer.model"))
      return tok::LoadSentencePieceModel(dir + "tokenizer.model");
    return absl::NotFoundError(
        absl::StrCat("no tokenizer.json or tokenizer.model in folder ", path));
  }
  if (!IsFile(path))
    return absl::NotFoundError(absl::StrCat("tokenizer file ", path, " not found"));
  if (HasGgufMagic(path)) {
    POLYKV_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> g, GgufFile::Open(path));
    return TokenizerFromGguf(*g);
  }
  if (EndsWith(path, ".json")) return tok::LoadHfTokenizerJson(path);
  if (EndsWith(path, ".model")) return tok::LoadSentencePieceModel(path);
  return absl::InvalidArgumentError(absl::StrCat(
      path, " is not a tokenizer file (expected a GGUF file, tokenizer.json or tokenizer.model)"));
}

}  // namespace polykv::model
