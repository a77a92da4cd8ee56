// Tokenizers from Hugging Face files: tokenizer.json (byte-level BPE, reusing the BPE core)
// and tokenizer.model (SentencePiece, through libsentencepiece).
#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "spm_processor.h"
#include "tokenizer_internal.h"

namespace polykv::model::tok {
namespace {

using nlohmann::json;

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string DirOf(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string("./") : path.substr(0, slash + 1);
}

std::string Short(const json& j) {
  std::string s = j.dump();
  return s.size() > 200 ? s.substr(0, 200) + "..." : s;
}

// Regex matching `literal` exactly (HF Split with a String pattern).
std::string EscapeRegex(const std::string& literal) {
  std::string r;
  for (char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u) && u != ' ' && u >= 0x21) r += '\\';
    r += c;
  }
  return r;
}

constexpr char kSupportedPre[] =
    "supported: Sequence of Split (Regex or String pattern), Digits and ByteLevel, ending in "
    "ByteLevel without add_prefix_space";

// Appends the steps of one HF pre_tokenizer; sets *byte_level once a ByteLevel was seen (it
// must come last: HF maps the text to the byte alphabet there).
Status AddJsonSteps(const json& pre, std::vector<bpe::PreStep>* steps, bool* byte_level) {
  auto unsupported = [&](const std::string& why) {
    return absl::UnimplementedError(absl::StrCat("tokenizer.json pre_tokenizer ", why,
                                                 " is not supported by PolyKV (", kSupportedPre,
                                                 "): ", Short(pre)));
  };
  if (!pre.is_object()) return unsupported("that is not an object");
  if (*byte_level) return unsupported("after ByteLevel");
  const std::string type = pre.value("type", "");
  if (type == "Sequence") {
    if (!pre.contains("pretokenizers") || !pre["pretokenizers"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer.json Sequence pre_tokenizer without a pretokenizers array: ", Short(pre)));
    }
    for (const json& p : pre["pretokenizers"])
      POLYKV_RETURN_IF_ERROR(AddJsonSteps(p, steps, byte_level));
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    if (pre.value("add_prefix_space", false)) return unsupported("ByteLevel with add_prefix_space");
    if (pre.value("use_regex", true)) {
      POLYKV_ASSIGN_OR_RETURN(bpe::PreStep step, bpe::MakeRegexStep(bpe::kGpt2Regex));
      steps->push_back(std::move(step));
    }
    *byte_level = true;
    return absl::OkStatus();
  }
  if (type == "Digits") {
    POLYKV_ASSIGN_OR_RETURN(
        bpe::PreStep step,
        bpe::MakeRegexStep(pre.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+"));
    steps->push_back(std::move(step));
    return absl::OkStatus();
  }
  if (type == "Split") {
    const json pattern = pre.contains("pattern") ? pre["pattern"] : json();
    std::string regex;
    if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
      regex = pattern["Regex"].get<std::string>();
    } else if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
      regex = EscapeRegex(pattern["String"].get<std::string>());
      if (regex.empty()) return unsupported("Split with an empty String pattern");
    } else {
      return unsupported("Split without a Regex or String pattern");
    }
    const std::string behavior = pre.value("behavior", "Isolated");
    bpe::SplitBehavior b;
    if (behavior == "Isolated") {
      b = bpe::SplitBehavior::kIsolated;
    } else if (behavior == "Removed") {
      b = bpe::SplitBehavior::kRemoved;
    } else if (behavior == "MergedWithPrevious") {
      b = bpe::SplitBehavior::kMergedWithPrevious;
    } else if (behavior == "MergedWithNext") {
      b = bpe::SplitBehavior::kMergedWithNext;
    } else if (behavior == "Contiguous") {
      b = bpe::SplitBehavior::kContiguous;
    } else {
      return unsupported(absl::StrCat("Split behavior '", behavior, "'"));
    }
    auto step = bpe::MakeRegexStep(regex, b, pre.value("invert", false));
    if (!step.ok()) return unsupported(absl::StrCat("Split (", step.status().message(), ")"));
    steps->push_back(std::move(step).value());
    return absl::OkStatus();
  }
  return unsupported(absl::StrCat("'", type, "'"));
}

// Runs an HF pre_tokenizer description as our steps; named after the llama.cpp family with
// the same steps when there is one.
StatusOr<bpe::PreTokenizer> PreTokenizerFromJson(const json& pre) {
  std::vector<bpe::PreStep> steps;
  bool byte_level = false;
  if (pre.is_null()) {
    return absl::UnimplementedError(absl::StrCat(
        "tokenizer.json without a pre_tokenizer is not supported by PolyKV (", kSupportedPre, ")"));
  }
  POLYKV_RETURN_IF_ERROR(AddJsonSteps(pre, &steps, &byte_level));
  if (!byte_level) {
    return absl::UnimplementedError(
        absl::StrCat("tokenizer.json pre_tokenizer has no ByteLevel step (only byte-level BPE "
                     "is supported; ",
                     kSupportedPre, "): ", Short(pre)));
  }
  return bpe::PreTokenizer::FromSteps(std::move(steps));
}

// Token content of a tokenizer_config.json special-token entry (string or {"content": ..}).
std::string TokenContent(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) {
    return j["content"].get<std::string>();
  }
  return "";
}

// ---------------------------------------------------------------------------------------
// tokenizer.model via libsentencepiece.
class SentencePieceTokenizer final : public Tokenizer {
 public:
  Status Load(const std::string& path) {
    std::string err;
    if (!sp_.Load(path, &err)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot load SentencePiece model ", path, ": ", err));
    }
    fingerprint_ = Sha256Hex("polykv-tokenizer-v1\nsentencepiece\n" + sp_.SerializedModel());
    // Chat template from a tokenizer_config.json next to it, when present.
    auto cfg = ReadFile(DirOf(path) + "tokenizer_config.json");
    if (cfg.ok()) {
      json j = json::parse(*cfg, nullptr, false);
      if (j.is_object()) {
        if (j.contains("chat_template") && j["chat_template"].is_string()) {
          chat_template_ = j["chat_template"].get<std::string>();
        }
        if (j.contains("add_bos_token") && j["add_bos_token"].is_boolean()) {
          add_bos_ = j["add_bos_token"].get<bool>();
        }
      }
    }
    return absl::OkStatus();
  }

  StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_bos) const override {
    std::vector<int> ids;
    std::string err;
    if (!sp_.Encode(text, &ids, &err)) return absl::InvalidArgumentError(err);
    std::vector<int32_t> out;
    if (add_bos && adds_bos()) out.push_back(bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  }
  StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const override {
    std::vector<int> v;
    for (size_t k = 0; k < ids.size(); ++k) {
      if (ids[k] < 0 || ids[k] >= vocab_size()) {
        return absl::OutOfRangeError(absl::StrCat("token id ", ids[k], " at position ", k,
                                                  " is outside the vocabulary of ", vocab_size()));
      }
      if (k == 0 && ids[k] == bos_id() && adds_bos()) continue;
      v.push_back(ids[k]);
    }
    std::string out;
    std::string err;
    if (!sp_.Decode(v, &out, &err)) return absl::InvalidArgumentError(err);
    return out;
  }
  int32_t vocab_size() const override { return sp_.PieceSize(); }
  int32_t bos_id() const override { return sp_.BosId(); }
  int32_t eos_id() const override { return sp_.EosId(); }
  bool adds_bos() const override { return add_bos_ && bos_id() >= 0; }
  bool IsEndOfGeneration(int32_t id) const override { return id >= 0 && id == eos_id(); }
  std::string chat_template() const override { return chat_template_; }
  std::string TokenText(int32_t id) const override {
    if (id < 0 || id >= vocab_size()) return "";
    return sp_.IdToPiece(id);
  }
  std::string Fingerprint() const override { return fingerprint_; }
  std::string family() const override { return "spm"; }

 private:
  spm::Processor sp_;
  bool add_bos_ = true;
  std::string chat_template_;
  std::string fingerprint_;
};

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceModel(const std::string& path) {
  auto t = std::make_unique<SentencePieceTokenizer>();
  POLYKV_RETURN_IF_ERROR(t->Load(path));
  return std::unique_ptr<Tokenizer>(std::move(t));
}

StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizerJson(const std::string& path) {
  POLYKV_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not valid JSON"));
  }
  try {
    if (!j.contains("model") || !j["model"].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": no \"model\" object"));
    }
    const json& model = j["model"];
    const std::string type = model.value("type", "");
    if (type != "BPE") {
      return absl::UnimplementedError(absl::StrCat(path, ": tokenizer.json model type '", type,
                                                   "' is not supported (only BPE)"));
    }
    // Normalizers: none, or NFC (alone or as the only member of a Sequence).
    bool nfc = false;
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
      const json& n = j["normalizer"];
      std::vector<json> parts;
      if (n.is_object() && n.value("type", "") == "Sequence" && n.contains("normalizers") &&
          n["normalizers"].is_array()) {
        for (const json& m : n["normalizers"]) parts.push_back(m);
      } else {
        parts.push_back(n);
      }
      for (const json& m : parts) {
        if (m.is_object() && m.value("type", "") == "NFC") {
          nfc = true;
        } else {
          return absl::UnimplementedError(
              absl::StrCat(path,
                           ": tokenizer.json normalizer is not supported (supported: none, "
                           "NFC): ",
                           Short(n)));
        }
      }
    }
    POLYKV_ASSIGN_OR_RETURN(
        bpe::PreTokenizer pre,
        PreTokenizerFromJson(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json()));
    if (!model.contains("vocab") || !model["vocab"].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": model.vocab is not an object"));
    }
    Vocab v;
    auto put = [&](int64_t id, const std::string& content, int32_t ttype) -> Status {
      if (id < 0 || id > 10'000'000) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": token id ", id, " out of range"));
      }
      if (static_cast<size_t>(id) >= v.tokens.size()) {
        v.tokens.resize(id + 1);
        v.types.resize(id + 1, kUnused);
      }
      v.tokens[id] = content;
      v.types[id] = ttype;
      return absl::OkStatus();
    };
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
      if (!it.value().is_number_integer()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": model.vocab['", it.key(), "'] is not an integer id"));
      }
      POLYKV_RETURN_IF_ERROR(put(it.value().get<int64_t>(), it.key(), kNormal));
    }
    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
      for (const json& a : j["added_tokens"]) {
        if (!a.is_object() || !a.contains("id") || !a.contains("content")) continue;
        // An id written as a float (or too large for an integer, which the parser reads as
        // a float) must not be converted: that conversion is undefined behaviour.
        if (!a["id"].is_number_integer()) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ": added_tokens id ", Short(a["id"]), " is not an integer id"));
        }
        POLYKV_RETURN_IF_ERROR(put(a["id"].get<int64_t>(), a["content"].get<std::string>(),
                                   a.value("special", false) ? kControl : kUserDefined));
      }
    }
    std::vector<std::string> merges;
    if (model.contains("merges") && model["merges"].is_array()) {
      for (const json& m : model["merges"]) {
        if (m.is_string()) {
          merges.push_back(m.get<std::string>());
        } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
          merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
        } else {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ": malformed merge entry ", Short(m)));
        }
      }
    }
    // Special ids and template from tokenizer_config.json (same folder), when present.
    auto id_of = [&](const std::string& s) -> int32_t {
      for (size_t i = 0; i < v.tokens.size(); ++i) {
        if (!s.empty() && v.tokens[i] == s) return static_cast<int32_t>(i);
      }
      return -1;
    };
    auto cfg_text = ReadFile(DirOf(path) + "tokenizer_config.json");
    if (cfg_text.ok()) {
      json cfg = json::parse(*cfg_text, nullptr, false);
      if (cfg.is_object()) {
        if (cfg.contains("bos_token")) v.bos = id_of(TokenContent(cfg["bos_token"]));
        if (cfg.contains("eos_token")) v.eos = id_of(TokenContent(cfg["eos_token"]));
        if (cfg.contains("unk_token")) v.unk = id_of(TokenContent(cfg["unk_token"]));
        if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) {
          v.add_bos = cfg["add_bos_token"].get<bool>();
        }
        if (cfg.contains("chat_template") && cfg["chat_template"].is_string()) {
          v.chat_template = cfg["chat_template"].get<std::string>();
        }
      }
    }
    if (v.eos < 0) v.eos = id_of("<|endoftext|>");
    bool ignore_merges = model.value("ignore_merges", false);
    return MakeBpeTokenizer(std::move(v), merges, std::move(pre), ignore_merges, nfc);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": malformed tokenizer.json: ", e.what()));
  }
}

}  // namespace polykv::model::tok
