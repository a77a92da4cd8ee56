// Hugging Face folder loader: config.json (LlamaConfig fields) + model.safetensors or a
// sharded model.safetensors.index.json; F32/F16/BF16 tensors.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "llama_internal.h"
#include "safetensors.h"

namespace polykv::model::internal {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Typed getters for config.json fields, each naming the field on error.
class ConfigReader {
 public:
  ConfigReader(const json& j, std::string source) : j_(j), source_(std::move(source)) {}
  bool Present(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  StatusOr<int32_t> Int(const char* key, std::optional<int32_t> def = std::nullopt) const {
    if (!Present(key)) {
      if (def) return *def;
      return Missing(key);
    }
    const auto& v = j_[key];
    if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX)
      return Bad(key, "must be a 32-bit integer");
    return v.get<int32_t>();
  }
  StatusOr<double> Float(const char* key, std::optional<double> def = std::nullopt) const {
    if (!Present(key)) {
      if (def) return *def;
      return Missing(key);
    }
    if (!j_[key].is_number()) return Bad(key, "must be a number");
    return j_[key].get<double>();
  }
  StatusOr<bool> Bool(const char* key, bool def) const {
    if (!Present(key)) return def;
    if (!j_[key].is_boolean()) return Bad(key, "must be true or false");
    return j_[key].get<bool>();
  }
  StatusOr<std::string> String(const char* key, std::optional<std::string> def = std::nullopt) const {
    if (!Present(key)) {
      if (def) return *def;
      return Missing(key);
    }
    if (!j_[key].is_string()) return Bad(key, "must be a string");
    return j_[key].get<std::string>();
  }
  Status Missing(const char* key) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": missing required field '", key, "'"));
  }
  Status Bad(const char* key, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": field '", key, "' ", what));
  }
  Status Unsupported(const char* key, const std::string& what) const {
    return absl::UnimplementedError(absl::StrCat(source_, ": unsupported field '", key, "': ", what));
  }

 private:
  const json& j_;
  std::string source_;
};

StatusOr<ModelConfig> ParseHfConfig(const std::string& text, const std::string& source) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  ConfigReader r(j, source);
  ModelConfig c;
  POLYKV_ASSIGN_OR_RETURN(c.architecture, r.String("model_type", std::string()));
  if (c.architecture.empty()) {
    if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
        j["architectures"][0].is_string()) {
      const std::string a = j["architectures"][0].get<std::string>();
      if (a == "LlamaForCausalLM") c.architecture = "llama";
      else if (a == "MistralForCausalLM") c.architecture = "mistral";
      else return r.Unsupported("architectures", a + " (supported: LlamaForCausalLM, MistralForCausalLM)");
    } else {
      return r.Missing("model_type");
    }
  }
  if (c.architecture != "llama" && c.architecture != "mistral")
    return r.Unsupported("model_type", absl::StrCat("'", c.architecture, "' (supported: llama, mistral)"));
  if (r.Present("sliding_window"))
    return r.Unsupported("sliding_window", "sliding-window attention is not implemented");
  POLYKV_ASSIGN_OR_RETURN(bool attn_bias, r.Bool("attention_bias", false));
  if (attn_bias) return r.Unsupported("attention_bias", "attention projections with bias");
  POLYKV_ASSIGN_OR_RETURN(bool mlp_bias, r.Bool("mlp_bias", false));
  if (mlp_bias) return r.Unsupported("mlp_bias", "MLP projections with bias");
  POLYKV_ASSIGN_OR_RETURN(std::string act, r.String("hidden_act", std::string("silu")));
  if (act != "silu") return r.Unsupported("hidden_act", absl::StrCat("'", act, "' (only silu)"));
  if (r.Present("quantization_config"))
    return r.Unsupported("quantization_config", "quantized HF checkpoints (use F32/F16/BF16)");
  if (r.Present("rope_scaling")) {
    const json& rs = j["rope_scaling"];
    if (!rs.is_object()) return r.Bad("rope_scaling", "must be an object or null");
    std::string type;
    if (rs.contains("rope_type") && rs["rope_type"].is_string()) type = rs["rope_type"];
    else if (rs.contains("type") && rs["type"].is_string()) type = rs["type"];
    if (type == "linear") {
      if (!rs.contains("factor") || !rs["factor"].is_number())
        return r.Bad("rope_scaling", "linear scaling needs a numeric 'factor'");
      c.rope_linear_scale = rs["factor"].get<float>();
    } else if (type != "default") {
      return r.Unsupported("rope_scaling", absl::StrCat("type '", type, "' (supported: linear)"));
    }
  }
  POLYKV_ASSIGN_OR_RETURN(c.layers, r.Int("num_hidden_layers"));
  POLYKV_ASSIGN_OR_RETURN(c.hidden, r.Int("hidden_size"));
  POLYKV_ASSIGN_OR_RETURN(c.heads, r.Int("num_attention_heads"));
  POLYKV_ASSIGN_OR_RETURN(c.kv_heads, r.Int("num_key_value_heads", c.heads));
  POLYKV_ASSIGN_OR_RETURN(c.ffn, r.Int("intermediate_size"));
  POLYKV_ASSIGN_OR_RETURN(c.vocab, r.Int("vocab_size"));
  POLYKV_ASSIGN_OR_RETURN(c.max_positions, r.Int("max_position_embeddings", 2048));
  if (c.heads > 0 && c.hidden % c.heads != 0 && !r.Present("head_dim"))
    return r.Bad("hidden_size", absl::StrCat(c.hidden, " is not a multiple of num_attention_heads ", c.heads));
  POLYKV_ASSIGN_OR_RETURN(c.head_dim, r.Int("head_dim", c.heads > 0 ? c.hidden / c.heads : 0));
  POLYKV_ASSIGN_OR_RETURN(double theta, r.Float("rope_theta", 10000.0));
  c.rope_theta = static_cast<float>(theta);
  POLYKV_ASSIGN_OR_RETURN(double eps, r.Float("rms_norm_eps", 1e-6));
  c.rms_eps = static_cast<float>(eps);
  POLYKV_ASSIGN_OR_RETURN(c.tied_embeddings, r.Bool("tie_word_embeddings", false));
  POLYKV_ASSIGN_OR_RETURN(c.bos_id, r.Int("bos_token_id", -1));
  if (r.Present("eos_token_id") && j["eos_token_id"].is_array()) {
    if (!j["eos_token_id"].empty() && j["eos_token_id"][0].is_number_integer())
      c.eos_id = j["eos_token_id"][0].get<int32_t>();
  } else {
    POLYKV_ASSIGN_OR_RETURN(c.eos_id, r.Int("eos_token_id", -1));
  }
  POLYKV_RETURN_IF_ERROR(ValidateConfig(c, source));
  return c;
}

// Maps roles to HF tensor names across one or more safetensors files.
class HfReader : public WeightReader {
 public:
  HfReader(std::vector<std::shared_ptr<const SafetensorsFile>> files,
           std::map<std::string, const SafetensorsFile*> where)
      : files_(std::move(files)), where_(std::move(where)) {}

  static std::string Name(const std::string& role, int layer) {
    if (role == "embed") return "model.embed_tokens.weight";
    if (role == "norm") return "model.norm.weight";
    if (role == "output") return "lm_head.weight";
    const std::string p = absl::StrCat("model.layers.", layer, ".");
    if (role == "attn_norm") return p + "input_layernorm.weight";
    if (role == "ffn_norm") return p + "post_attention_layernorm.weight";
    if (role == "q" || role == "k" || role == "v" || role == "o")
      return absl::StrCat(p, "self_attn.", role, "_proj.weight");
    return absl::StrCat(p, "mlp.", role, "_proj.weight");  // gate, up, down
  }

  StatusOr<torch::Tensor> Get(const std::string& role, int layer,
                              const std::vector<int64_t>& shape) override {
    const std::string name = Name(role, layer);
    auto it = where_.find(name);
    const SafetensorsEntry* e = it == where_.end() ? nullptr : it->second->Find(name);
    if (e == nullptr) return absl::InvalidArgumentError(absl::StrCat("missing tensor '", name, "'"));
    if (e->shape != shape)
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has shape [",
                                                     absl::StrJoin(e->shape, ", "), "], expected [",
                                                     absl::StrJoin(shape, ", "), "]"));
    return it->second->Read(*e);
  }
  bool HasOutput() override { return where_.count("lm_head.weight") > 0; }

  StatusOr<RawTensor> GetRaw(const std::string& role, int layer,
                             const std::vector<int64_t>& shape) override {
    const std::string name = Name(role, layer);
    auto it = where_.find(name);
    const SafetensorsEntry* e = it == where_.end() ? nullptr : it->second->Find(name);
    if (e == nullptr) return absl::InvalidArgumentError(absl::StrCat("missing tensor '", name, "'"));
    if (e->shape != shape)
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has shape [",
                                                     absl::StrJoin(e->shape, ", "), "], expected [",
                                                     absl::StrJoin(shape, ", "), "]"));
    RawTensor t;
    if (e->dtype == "F32") {
      t.type = static_cast<uint32_t>(kernels::WeightType::kF32);
    } else if (e->dtype == "F16") {
      t.type = static_cast<uint32_t>(kernels::WeightType::kF16);
    } else if (e->dtype == "BF16") {
      t.type = static_cast<uint32_t>(kernels::WeightType::kBF16);
    } else {
      return absl::UnimplementedError(absl::StrCat(it->second->path(), ": tensor '", name,
                                                   "' has dtype ", e->dtype,
                                                   "; only F32, F16, BF16 are supported"));
    }
    const auto data = it->second->Data(*e);
    if (data.size() != e->nbytes)
      return absl::DataLossError(absl::StrCat("tensor '", name, "' lies outside its file"));
    t.data = data.data();
    t.bytes = data.size();
    return t;
  }
  std::vector<std::shared_ptr<const void>> Mappings() override {
    return std::vector<std::shared_ptr<const void>>(files_.begin(), files_.end());
  }

 private:
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
};

}  // namespace

StatusOr<LoadedModel> LoadHfFolder(const std::string& dir, const LoadOptions& options) {
  const std::string config_path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(config_path))
    return absl::NotFoundError(absl::StrCat(dir, ": no config.json in the model folder"));
  POLYKV_ASSIGN_OR_RETURN(std::string config_text, ReadTextFile(config_path));
  LoadedModel m;
  POLYKV_ASSIGN_OR_RETURN(m.config, ParseHfConfig(config_text, config_path));

  // Weight files: single or sharded.
  std::vector<std::string> files;
  std::map<std::string, std::string> name_to_file;  // sharded only
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(single)) {
    files.push_back(single.string());
  } else if (fs::exists(index)) {
    POLYKV_ASSIGN_OR_RETURN(std::string text, ReadTextFile(index.string()));
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      return absl::InvalidArgumentError(absl::StrCat(index.string(), ": missing object 'weight_map'"));
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        return absl::InvalidArgumentError(absl::StrCat(index.string(), ": weight_map['", it.key(),
                                                       "'] is not a file name"));
      const std::string f = it.value().get<std::string>();
      if (f.find('/') != std::string::npos || f == "..")
        return absl::InvalidArgumentError(absl::StrCat(index.string(), ": shard name '", f,
                                                       "' must be a plain file name"));
      name_to_file[it.key()] = (fs::path(dir) / f).string();
      files.push_back((fs::path(dir) / f).string());
    }
    std::sort(files.begin(), files.end());
    files.erase(std::unique(files.begin(), files.end()), files.end());
  } else {
    return absl::NotFoundError(
        absl::StrCat(dir, ": neither model.safetensors nor model.safetensors.index.json"));
  }
  std::vector<std::shared_ptr<const SafetensorsFile>> opened;
  std::map<std::string, const SafetensorsFile*> where;
  for (const auto& f : files) {
    POLYKV_ASSIGN_OR_RETURN(auto sf, SafetensorsFile::Open(f));
    for (const auto& e : sf->entries()) {
      auto nf = name_to_file.find(e.name);
      if (name_to_file.empty() || (nf != name_to_file.end() && nf->second == f)) where[e.name] = sf.get();
    }
    opened.push_back(std::move(sf));
  }
  HfReader reader(std::move(opened), std::move(where));
  if (options.weights == WeightStorage::kMapped) {
    m.mapped = std::make_unique<MappedWeights>();
    POLYKV_RETURN_IF_ERROR(BuildMappedWeights(m.config, reader, m.mapped.get()));
  } else {
    POLYKV_RETURN_IF_ERROR(BuildWeights(m.config, reader, options, &m.weights));
  }

  // Tokenizer: optional (stories260K ships none).
  const bool has_tok = fs::exists(fs::path(dir) / "tokenizer.json") ||
                       fs::exists(fs::path(dir) / "tokenizer.model");
  if (has_tok) {
    auto tok = LoadTokenizer(dir);
    if (!tok.ok()) return tok.status();
    m.tokenizer = std::move(tok).value();
  }
  POLYKV_ASSIGN_OR_RETURN(m.fingerprint, Sha256OfFiles(config_text + "\n", files));
  return m;
}

}  // namespace polykv::model::internal
