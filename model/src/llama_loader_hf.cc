// Hugging Face folder loader: config.json (LlamaConfig, MistralConfig, Qwen2Config fields:
// each one read, known not to change the forward pass, or refused by name) +
// model.safetensors or a sharded model.safetensors.index.json; F32/F16/BF16 tensors, each
// one used or refused by name.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
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
  StatusOr<std::string> String(const char* key,
                               std::optional<std::string> def = std::nullopt) const {
    if (!Present(key)) {
      if (def) return *def;
      return Missing(key);
    }
    if (!j_[key].is_string()) return Bad(key, "must be a string");
    return j_[key].get<std::string>();
  }
  Status Missing(const char* key) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": missing required field '", key, "'"));
  }
  Status Bad(const char* key, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": field '", key, "' ", what));
  }
  Status Unsupported(const char* key, const std::string& what) const {
    return absl::UnimplementedError(
        absl::StrCat(source_, ": unsupported field '", key, "': ", what));
  }
  const std::string& source() const { return source_; }

 private:
  const json& j_;
  std::string source_;
};

// What differs between the HF architectures this loader reads.
struct HfArch {
  const char* model_type;
  const char* class_name;
};
constexpr HfArch kHfArchs[] = {{"llama", "LlamaForCausalLM"},
                               {"mistral", "MistralForCausalLM"},
                               {"qwen2", "Qwen2ForCausalLM"}};

// PretrainedConfig fields that do not change the forward pass: generation defaults, labels,
// training-only settings, provenance (older transformers versions write all of them), and
// pretraining_tp (tensor-parallel slicing of the same products: identical math in HF).
const std::set<std::string>& InertHfFields() {
  // clang-format off
  static const std::set<std::string> k = {
      "_name_or_path", "_commit_hash", "_attn_implementation_autoset", "transformers_version",
      "torch_dtype", "dtype", "use_cache", "initializer_range", "attention_dropout",
      "pretraining_tp", "pad_token_id", "sep_token_id", "unk_token_id", "decoder_start_token_id",
      "return_dict", "output_hidden_states", "output_attentions", "torchscript",
      "use_bfloat16", "tf_legacy_loss", "pruned_heads", "tie_encoder_decoder", "is_decoder",
      "is_encoder_decoder", "cross_attention_hidden_size", "add_cross_attention",
      "chunk_size_feed_forward", "max_length", "min_length", "do_sample", "early_stopping",
      "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p",
      "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
      "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
      "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id",
      "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
      "begin_suppress_tokens", "finetuning_task", "id2label", "label2id", "tokenizer_class",
      "prefix", "task_specific_params", "problem_type"};
  // clang-format on
  return k;
}

// Fields each architecture's config class defines and this parser reads (checked below).
bool ReadsHfField(const std::string& arch, const std::string& f) {
  static const std::set<std::string> common = {"model_type",
                                               "architectures",
                                               "hidden_size",
                                               "intermediate_size",
                                               "num_hidden_layers",
                                               "num_attention_heads",
                                               "num_key_value_heads",
                                               "head_dim",
                                               "vocab_size",
                                               "max_position_embeddings",
                                               "rms_norm_eps",
                                               "rope_theta",
                                               "rope_scaling",
                                               "rope_parameters",
                                               "partial_rotary_factor",
                                               "tie_word_embeddings",
                                               "bos_token_id",
                                               "eos_token_id",
                                               "hidden_act",
                                               "quantization_config",
                                               "auto_map"};
  if (common.count(f) > 0) return true;
  if (arch == "llama") return f == "attention_bias" || f == "mlp_bias";
  if (arch == "mistral") return f == "sliding_window";
  if (arch == "qwen2")
    return f == "sliding_window" || f == "use_sliding_window" || f == "max_window_layers" ||
           f == "layer_types";
  return false;
}

// rope_scaling / rope_parameters: the type and, per type, the keys it may carry.
Status ParseRopeScaling(const json& rs, const char* field, const ConfigReader& r, ModelConfig* c) {
  if (!rs.is_object()) return r.Bad(field, "must be an object or null");
  std::string type;
  if (rs.contains("rope_type") && rs["rope_type"].is_string())
    type = rs["rope_type"];
  else if (rs.contains("type") && rs["type"].is_string())
    type = rs["type"];
  else
    return r.Bad(field, "needs a string 'rope_type' (or 'type')");
  std::set<std::string> allowed = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};
  if (type == "linear") allowed.insert("factor");
  if (type == "llama3")
    allowed.insert(
        {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  if (type == "yarn")
    allowed.insert({"factor", "original_max_position_embeddings", "attention_factor", "mscale",
                    "mscale_all_dim", "beta_fast", "beta_slow", "truncate"});
  if (type != "default" && type != "linear" && type != "llama3" && type != "yarn")
    return r.Unsupported(
        field, absl::StrCat("type '", type, "' (supported: default, linear, llama3, yarn)"));
  for (auto it = rs.begin(); it != rs.end(); ++it)
    if (allowed.count(it.key()) == 0 && !it.value().is_null())
      return absl::UnimplementedError(absl::StrCat(r.source(), ": unsupported field '", field, ".",
                                                   it.key(), "' for rope type '", type, "'"));
  const auto num = [&](const char* k, std::optional<double> def) -> StatusOr<double> {
    if (!rs.contains(k) || rs[k].is_null()) {
      if (def) return *def;
      return absl::InvalidArgumentError(absl::StrCat(r.source(), ": field '", field, "' of type '",
                                                     type, "' needs a numeric '", k, "'"));
    }
    if (!rs[k].is_number())
      return absl::InvalidArgumentError(
          absl::StrCat(r.source(), ": field '", field, ".", k, "' must be a number"));
    return rs[k].get<double>();
  };
  if (rs.contains("partial_rotary_factor") && !rs["partial_rotary_factor"].is_null()) {
    POLYKV_ASSIGN_OR_RETURN(double prf, num("partial_rotary_factor", 1.0));
    if (prf != 1) return r.Unsupported(field, "partial_rotary_factor != 1 (partial RoPE)");
  }
  if (rs.contains("rope_theta") && !rs["rope_theta"].is_null()) {
    POLYKV_ASSIGN_OR_RETURN(double theta, num("rope_theta", std::nullopt));
    c->rope_theta = static_cast<float>(theta);
  }
  RopeScaling& out = c->rope_scaling;
  if (type == "linear") {
    POLYKV_ASSIGN_OR_RETURN(double f, num("factor", std::nullopt));
    c->rope_linear_scale = static_cast<float>(f);
    out.type = RopeScalingType::kLinear;
  } else if (type == "llama3") {
    out.type = RopeScalingType::kLlama3;
    POLYKV_ASSIGN_OR_RETURN(out.factor, num("factor", std::nullopt));
    POLYKV_ASSIGN_OR_RETURN(out.low_freq_factor, num("low_freq_factor", std::nullopt));
    POLYKV_ASSIGN_OR_RETURN(out.high_freq_factor, num("high_freq_factor", std::nullopt));
    POLYKV_ASSIGN_OR_RETURN(double orig, num("original_max_position_embeddings", std::nullopt));
    out.original_max_positions = static_cast<int32_t>(orig);
  } else if (type == "yarn") {
    out.type = RopeScalingType::kYarn;
    POLYKV_ASSIGN_OR_RETURN(out.factor, num("factor", std::nullopt));
    // The pre-training context (HF: max_position_embeddings when not given). Newer
    // transformers releases derive the factor from max_position_embeddings / original when
    // both are given; PolyKV, like llama.cpp and vLLM, uses `factor` as written.
    POLYKV_ASSIGN_OR_RETURN(double orig, num("original_max_position_embeddings",
                                             static_cast<double>(c->max_positions)));
    out.original_max_positions = static_cast<int32_t>(orig);
    POLYKV_ASSIGN_OR_RETURN(out.beta_fast, num("beta_fast", 32.0));
    POLYKV_ASSIGN_OR_RETURN(out.beta_slow, num("beta_slow", 1.0));
    if (rs.contains("truncate") && !rs["truncate"].is_null()) {
      if (!rs["truncate"].is_boolean())
        return absl::InvalidArgumentError(
            absl::StrCat(r.source(), ": field '", field, ".truncate' must be true or false"));
      out.truncate = rs["truncate"].get<bool>();
    }
    const auto get_mscale = [](double scale, double m) {
      return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
    };
    if (rs.contains("attention_factor") && !rs["attention_factor"].is_null()) {
      POLYKV_ASSIGN_OR_RETURN(out.attention_factor, num("attention_factor", std::nullopt));
    } else {
      POLYKV_ASSIGN_OR_RETURN(double mscale, num("mscale", 0.0));
      POLYKV_ASSIGN_OR_RETURN(double mscale_all_dim, num("mscale_all_dim", 0.0));
      out.attention_factor =
          mscale != 0 && mscale_all_dim != 0
              ? get_mscale(out.factor, mscale) / get_mscale(out.factor, mscale_all_dim)
              : get_mscale(out.factor, 1.0);
    }
  }
  return absl::OkStatus();
}

StatusOr<ModelConfig> ParseHfConfig(const std::string& text, const std::string& source) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  if (!j.is_object())
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  ConfigReader r(j, source);
  ModelConfig c;
  std::string classes;
  for (const HfArch& a : kHfArchs)
    absl::StrAppend(&classes, classes.empty() ? "" : ", ", a.class_name);
  // architectures: every class named must be one of ours (a ForSequenceClassification head,
  // say, has other weights).
  std::string from_class;
  if (r.Present("architectures")) {
    if (!j["architectures"].is_array())
      return r.Bad("architectures", "must be a list of class names");
    for (const json& a : j["architectures"]) {
      const std::string name = a.is_string() ? a.get<std::string>() : a.dump();
      const HfArch* found = nullptr;
      for (const HfArch& h : kHfArchs)
        if (name == h.class_name) found = &h;
      if (found == nullptr)
        return r.Unsupported("architectures", absl::StrCat(name, " (supported: ", classes, ")"));
      if (from_class.empty()) from_class = found->model_type;
    }
  }
  POLYKV_ASSIGN_OR_RETURN(c.architecture, r.String("model_type", from_class));
  if (c.architecture.empty()) return r.Missing("model_type");
  if (c.architecture != "llama" && c.architecture != "mistral" && c.architecture != "qwen2")
    return r.Unsupported("model_type",
                         absl::StrCat("'", c.architecture, "' (supported: llama, mistral, qwen2)"));
  const std::string& arch = c.architecture;

  // Every field is read below, known not to change the forward pass, or refused by name.
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (ReadsHfField(arch, it.key()) || InertHfFields().count(it.key()) > 0) continue;
    return absl::UnimplementedError(
        absl::StrCat(source, ": unsupported field '", it.key(),
                     "' (PolyKV does not implement what it changes in a ", arch, " model)"));
  }
  if (r.Present("auto_map"))
    return r.Unsupported("auto_map", "the model ships its own modeling code");
  if (r.Present("quantization_config"))
    return r.Unsupported("quantization_config", "quantized HF checkpoints (use F32/F16/BF16)");
  POLYKV_ASSIGN_OR_RETURN(std::string act, r.String("hidden_act", std::string("silu")));
  if (act != "silu") return r.Unsupported("hidden_act", absl::StrCat("'", act, "' (only silu)"));
  if (arch == "llama") {
    POLYKV_ASSIGN_OR_RETURN(bool attn_bias, r.Bool("attention_bias", false));
    c.qkv_bias = c.o_bias = attn_bias;  // LlamaAttention: q, k, v and o projections
    POLYKV_ASSIGN_OR_RETURN(bool mlp_bias, r.Bool("mlp_bias", false));
    if (mlp_bias) return r.Unsupported("mlp_bias", "MLP projections with bias");
  } else if (arch == "qwen2") {
    c.qkv_bias = true;  // Qwen2Attention: q, k, v with bias, o without
  }

  POLYKV_ASSIGN_OR_RETURN(c.layers, r.Int("num_hidden_layers"));
  POLYKV_ASSIGN_OR_RETURN(c.hidden, r.Int("hidden_size"));
  POLYKV_ASSIGN_OR_RETURN(c.heads, r.Int("num_attention_heads"));
  POLYKV_ASSIGN_OR_RETURN(c.kv_heads, r.Int("num_key_value_heads", c.heads));
  POLYKV_ASSIGN_OR_RETURN(c.ffn, r.Int("intermediate_size"));
  POLYKV_ASSIGN_OR_RETURN(c.vocab, r.Int("vocab_size"));
  POLYKV_ASSIGN_OR_RETURN(c.max_positions, r.Int("max_position_embeddings", 2048));
  if (c.heads > 0 && c.hidden % c.heads != 0 && !r.Present("head_dim"))
    return r.Bad("hidden_size",
                 absl::StrCat(c.hidden, " is not a multiple of num_attention_heads ", c.heads));
  POLYKV_ASSIGN_OR_RETURN(c.head_dim, r.Int("head_dim", c.heads > 0 ? c.hidden / c.heads : 0));
  POLYKV_ASSIGN_OR_RETURN(double theta, r.Float("rope_theta", 10000.0));
  c.rope_theta = static_cast<float>(theta);
  if (r.Present("partial_rotary_factor")) {
    POLYKV_ASSIGN_OR_RETURN(double prf, r.Float("partial_rotary_factor"));
    if (prf != 1) return r.Unsupported("partial_rotary_factor", "partial RoPE");
  }
  if (r.Present("rope_scaling") && r.Present("rope_parameters"))
    return r.Bad("rope_parameters", "given together with 'rope_scaling' (one of them only)");
  for (const char* f : {"rope_scaling", "rope_parameters"})
    if (r.Present(f)) POLYKV_RETURN_IF_ERROR(ParseRopeScaling(j[f], f, r, &c));
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

  // Sliding-window attention: Mistral (MistralConfig's default window is 4096; null = none);
  // Qwen2 only with use_sliding_window, on layers >= max_window_layers (or as layer_types
  // says).
  if (arch == "mistral") {
    if (!j.contains("sliding_window"))
      c.sliding_window = 4096;
    else if (!j["sliding_window"].is_null()) {
      POLYKV_ASSIGN_OR_RETURN(c.sliding_window, r.Int("sliding_window"));
      if (c.sliding_window <= 0) return r.Bad("sliding_window", "must be > 0 or null");
    }
  } else if (arch == "qwen2") {
    POLYKV_ASSIGN_OR_RETURN(bool use_swa, r.Bool("use_sliding_window", false));
    bool any_sliding = false;
    if (r.Present("layer_types")) {
      if (!j["layer_types"].is_array() || j["layer_types"].size() != static_cast<size_t>(c.layers))
        return r.Bad("layer_types", absl::StrCat("must list ", c.layers, " layer types"));
      for (const json& t : j["layer_types"]) {
        if (t == "sliding_attention")
          any_sliding = true;
        else if (t != "full_attention")
          return r.Unsupported("layer_types", absl::StrCat("layer type ", t.dump()));
      }
    } else if (use_swa) {
      POLYKV_ASSIGN_OR_RETURN(int32_t mwl, r.Int("max_window_layers", 28));
      any_sliding = mwl < c.layers;
    }
    if (any_sliding) {
      if (!r.Present("sliding_window")) return r.Missing("sliding_window");
      POLYKV_ASSIGN_OR_RETURN(c.sliding_window, r.Int("sliding_window"));
      if (c.sliding_window <= 0) return r.Bad("sliding_window", "must be > 0");
    }
  }
  POLYKV_RETURN_IF_ERROR(ValidateConfig(c, source));
  return c;
}

// Maps roles to HF tensor names across one or more safetensors files.
class HfReader : public WeightReader {
 public:
  HfReader(std::vector<std::shared_ptr<const SafetensorsFile>> files,
           std::map<std::string, const SafetensorsFile*> where, const ModelConfig& c)
      : files_(std::move(files)), where_(std::move(where)), c_(c) {}

  static std::string Name(const std::string& role, int layer) {
    if (role == "embed") return "model.embed_tokens.weight";
    if (role == "norm") return "model.norm.weight";
    if (role == "output") return "lm_head.weight";
    const std::string p = absl::StrCat("model.layers.", layer, ".");
    if (role == "attn_norm") return p + "input_layernorm.weight";
    if (role == "ffn_norm") return p + "post_attention_layernorm.weight";
    if (role == "q" || role == "k" || role == "v" || role == "o")
      return absl::StrCat(p, "self_attn.", role, "_proj.weight");
    if (role == "q_bias" || role == "k_bias" || role == "v_bias" || role == "o_bias")
      return absl::StrCat(p, "self_attn.", role.substr(0, 1), "_proj.bias");
    return absl::StrCat(p, "mlp.", role, "_proj.weight");  // gate, up, down
  }

  bool HasOutput() override { return where_.count("lm_head.weight") > 0; }

  StatusOr<RawTensor> GetRaw(const std::string& role, int layer,
                             const std::vector<int64_t>& shape) override {
    POLYKV_ASSIGN_OR_RETURN(auto found, Find(role, layer, shape));
    const SafetensorsFile* file = found.first;
    const SafetensorsEntry* e = found.second;
    RawTensor t;
    if (e->dtype == "F32") {
      t.type = static_cast<uint32_t>(kernels::WeightType::kF32);
    } else if (e->dtype == "F16") {
      t.type = static_cast<uint32_t>(kernels::WeightType::kF16);
    } else if (e->dtype == "BF16") {
      t.type = static_cast<uint32_t>(kernels::WeightType::kBF16);
    } else {
      return absl::UnimplementedError(absl::StrCat(file->path(), ": tensor '", e->name,
                                                   "' has dtype ", e->dtype,
                                                   "; only F32, F16, BF16 are supported"));
    }
    const auto data = file->Data(*e);
    if (data.size() != e->nbytes)
      return absl::DataLossError(absl::StrCat("tensor '", e->name, "' lies outside its file"));
    t.data = data.data();
    t.bytes = data.size();
    return t;
  }
  std::vector<std::shared_ptr<const void>> Mappings() override {
    return std::vector<std::shared_ptr<const void>>(files_.begin(), files_.end());
  }

  Status CheckAllTensorsUsed() const override {
    for (const auto& [name, file] : where_) {
      if (used_.count(name) > 0) continue;
      // Not weights: old checkpoints saved RoPE's inv_freq buffer (recomputed from the
      // config, as HF does); a tied model's lm_head is the embedding (HF ties it on load).
      if (absl::EndsWith(name, ".self_attn.rotary_emb.inv_freq")) continue;
      if (c_.tied_embeddings && name == "lm_head.weight") continue;
      return absl::UnimplementedError(absl::StrCat(
          file->path(), ": unsupported tensor '", name, "': PolyKV's ", c_.architecture,
          " model does not compute with it (a tensor of another architecture or feature, e.g. "
          "QK-norm, MLP biases or experts, or a bias the config does not announce)"));
    }
    return absl::OkStatus();
  }

 private:
  StatusOr<std::pair<const SafetensorsFile*, const SafetensorsEntry*>> Find(
      const std::string& role, int layer, const std::vector<int64_t>& shape) {
    const std::string name = Name(role, layer);
    auto it = where_.find(name);
    const SafetensorsEntry* e = it == where_.end() ? nullptr : it->second->Find(name);
    if (e == nullptr)
      return absl::InvalidArgumentError(absl::StrCat("missing tensor '", name, "'"));
    if (e->shape != shape)
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has shape [",
                                                     absl::StrJoin(e->shape, ", "), "], expected [",
                                                     absl::StrJoin(shape, ", "), "]"));
    used_.insert(name);
    return std::make_pair(it->second, e);
  }

  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
  const ModelConfig& c_;
  std::set<std::string> used_;
};

}  // namespace

StatusOr<LoadedModel> LoadHfFolder(const std::string& dir, const LoadOptions& /*options*/) {
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
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
        !j["weight_map"].is_object())
      return absl::InvalidArgumentError(
          absl::StrCat(index.string(), ": missing object 'weight_map'"));
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        return absl::InvalidArgumentError(
            absl::StrCat(index.string(), ": weight_map['", it.key(), "'] is not a file name"));
      const std::string f = it.value().get<std::string>();
      if (f.find('/') != std::string::npos || f == "..")
        return absl::InvalidArgumentError(
            absl::StrCat(index.string(), ": shard name '", f, "' must be a plain file name"));
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
      if (name_to_file.empty() || (nf != name_to_file.end() && nf->second == f))
        where[e.name] = sf.get();
    }
    opened.push_back(std::move(sf));
  }
  HfReader reader(std::move(opened), std::move(where), m.config);
  m.mapped = std::make_unique<MappedWeights>();
  POLYKV_RETURN_IF_ERROR(BuildMappedWeights(m.config, reader, m.mapped.get()));
  POLYKV_RETURN_IF_ERROR(reader.CheckAllTensorsUsed());

  // Tokenizer: optional (stories260K ships none).
  const bool has_tok =
      fs::exists(fs::path(dir) / "tokenizer.json") || fs::exists(fs::path(dir) / "tokenizer.model");
  if (has_tok) {
    auto tok = LoadTokenizer(dir);
    if (!tok.ok()) return tok.status();
    m.tokenizer = std::move(tok).value();
  }
  POLYKV_ASSIGN_OR_RETURN(m.fingerprint, Sha256OfFiles(config_text + "\n", files));
  return m;
}

}  // namespace polykv::model::internal
