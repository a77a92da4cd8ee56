// GGUF loader for general.architecture "llama" (Llama 2/3/3.1/3.2, SmolLM2, Mistral) and
// "qwen2" (Qwen2/Qwen2.5): {arch}.* metadata, where every key is either used or refused by
// name; ggml tensor names, where every tensor is either used or refused by name;
// dequantization to f32 tensor by tensor; the inverse of llama.cpp's Q/K row permute (llama
// only: llama.cpp stores qwen2 Q/K rows in HF order); the rope_freqs tensor (Llama 3.1).
#include <cmath>
#include <map>
#include <memory>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "llama_internal.h"
#include "polykv/model/gguf.h"

namespace polykv::model::internal {
namespace {

// What differs between the architectures this loader reads.
struct GgufArch {
  const char* name;
  bool permuted_qk;        // llama.cpp's convert script permuted q/k rows for interleaved RoPE
  bool qkv_bias_required;  // blk.N.attn_{q,k,v}.bias always present
};
constexpr GgufArch kGgufArchs[] = {{"llama", true, false}, {"qwen2", false, true}};

class GgufReader : public WeightReader {
 public:
  GgufReader(std::shared_ptr<const GgufFile> file, const ModelConfig& c, bool permuted_qk)
      : file_(std::move(file)), g_(*file_), c_(c), permuted_qk_(permuted_qk) {}

  static std::string Name(const std::string& role, int layer) {
    if (role == "embed") return "token_embd.weight";
    if (role == "norm") return "output_norm.weight";
    if (role == "output") return "output.weight";
    static const std::map<std::string, std::string> kLayer = {{"attn_norm", "attn_norm.weight"},
                                                              {"q", "attn_q.weight"},
                                                              {"k", "attn_k.weight"},
                                                              {"v", "attn_v.weight"},
                                                              {"o", "attn_output.weight"},
                                                              {"q_bias", "attn_q.bias"},
                                                              {"k_bias", "attn_k.bias"},
                                                              {"v_bias", "attn_v.bias"},
                                                              {"o_bias", "attn_output.bias"},
                                                              {"ffn_norm", "ffn_norm.weight"},
                                                              {"gate", "ffn_gate.weight"},
                                                              {"up", "ffn_up.weight"},
                                                              {"down", "ffn_down.weight"}};
    return absl::StrCat("blk.", layer, ".", kLayer.at(role));
  }

  bool HasOutput() override { return g_.FindTensor("output.weight") != nullptr; }

  StatusOr<RawTensor> GetRaw(const std::string& role, int layer,
                             const std::vector<int64_t>& shape) override {
    POLYKV_ASSIGN_OR_RETURN(const GgufTensorInfo* info, Find(role, layer, shape));
    const auto data = g_.TensorData(*info);
    if (data.empty() && info->nbytes > 0)
      return absl::DataLossError(
          absl::StrCat(g_.path(), ": tensor '", info->name, "' lies outside the file"));
    RawTensor t;
    t.type = info->type;
    t.data = data.data();
    t.bytes = data.size();
    // Biases keep the file's order too: the mapped runtime adds them before it
    // de-interleaves the product.
    t.interleaved_qk = permuted_qk_ && (role == "q" || role == "k");
    return t;
  }
  std::vector<std::shared_ptr<const void>> Mappings() override { return {file_}; }

  // A tensor read outside the roles (rope_freqs.weight, read with the config).
  void MarkUsed(const std::string& name) { used_.insert(name); }

  Status CheckAllTensorsUsed() const override {
    for (const GgufTensorInfo& t : g_.tensors())
      if (used_.count(t.name) == 0)
        return absl::UnimplementedError(absl::StrCat(
            g_.path(), ": unsupported tensor '", t.name, "': PolyKV's ", c_.architecture,
            " model does not compute with it (a tensor of another architecture or feature, "
            "e.g. QK-norm, MLP biases or experts)"));
    return absl::OkStatus();
  }

 private:
  StatusOr<const GgufTensorInfo*> Find(const std::string& role, int layer,
                                       const std::vector<int64_t>& shape) {
    const std::string name = Name(role, layer);
    const GgufTensorInfo* info = g_.FindTensor(name);
    if (info == nullptr)
      return absl::InvalidArgumentError(absl::StrCat(g_.path(), ": missing tensor '", name, "'"));
    // ggml dims are reversed: dims[0] is the row length (input features).
    std::vector<int64_t> torch_shape(info->dims.rbegin(), info->dims.rend());
    if (torch_shape != shape)
      return absl::InvalidArgumentError(absl::StrCat(
          g_.path(), ": tensor '", name, "' has shape [", absl::StrJoin(torch_shape, ", "),
          "] (PyTorch order), expected [", absl::StrJoin(shape, ", "), "]"));
    used_.insert(name);
    return info;
  }

  std::shared_ptr<const GgufFile> file_;
  const GgufFile& g_;
  const ModelConfig& c_;
  bool permuted_qk_;
  std::set<std::string> used_;
};

// Keys of the {arch}. namespace that this loader reads (each is checked below); any other
// key there is refused by name.
const std::set<std::string>& HandledArchKeys() {
  static const std::set<std::string> k = {
      "context_length", "embedding_length", "block_count", "feed_forward_length", "vocab_size",
      "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
      "attention.key_length", "attention.value_length", "attention.sliding_window",
      "attention.causal", "rope.freq_base", "rope.dimension_count", "rope.scale_linear",
      "rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length",
      "rope.scaling.attn_factor", "rope.scaling.finetuned", "rope.scaling.yarn_ext_factor",
      "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow",
      "rope.scaling.yarn_log_multiplier", "expert_count", "expert_used_count",
      // Written by the old convert.py for Meta's original checkpoints; the tensors end in the
      // same interleaved order either way.
      "tensor_data_layout"};
  return k;
}

// The {arch}.* metadata of one GGUF file, read with the file's name in every error.
class GgufMeta {
 public:
  GgufMeta(const GgufFile& g, const std::string& architecture)
      : g(g), src(g.path()), p(absl::StrCat(architecture, ".")) {}

  std::string key(const char* suffix) const { return p + suffix; }
  Status unsupported(const std::string& k, const std::string& why) const {
    return absl::UnimplementedError(absl::StrCat(src, ": unsupported metadata '", k, "'", why));
  }
  StatusOr<int32_t> need_int(const std::string& k) const {
    auto v = g.GetInt(k);
    if (!v.ok())
      return absl::InvalidArgumentError(
          absl::StrCat(src, ": metadata '", k, "': ", v.status().message()));
    if (*v < INT32_MIN || *v > INT32_MAX)
      return absl::InvalidArgumentError(absl::StrCat(src, ": metadata '", k, "' out of range"));
    return static_cast<int32_t>(*v);
  }
  StatusOr<int32_t> opt_int(const std::string& k, int32_t def) const {
    if (!g.Has(k)) return def;
    return need_int(k);
  }
  StatusOr<double> opt_float(const std::string& k, double def) const {
    if (!g.Has(k)) return def;
    auto v = g.GetFloat(k);
    if (!v.ok())
      return absl::InvalidArgumentError(
          absl::StrCat(src, ": metadata '", k, "': ", v.status().message()));
    return *v;
  }

  const GgufFile& g;
  const std::string src;
  const std::string p;  ///< "<architecture>."
};

// Every key is used, belongs to another reader, or is refused.
Status CheckGgufKeys(const GgufMeta& m, const std::string& architecture) {
  const GgufFile& g = m.g;
  const std::string& p = m.p;
  for (const std::string& k : g.Keys()) {
    if (absl::StartsWith(k, "general.") || absl::StartsWith(k, "tokenizer.") ||
        absl::StartsWith(k, "quantize."))
      continue;  // descriptive; the tokenizer's; llama-quantize's imatrix records
    if (k == "split.no" || k == "split.tensors.count") continue;
    if (k == "split.count") {
      auto n = g.GetInt(k);
      if (n.ok() && *n <= 1) continue;
      return m.unsupported(k,
                           ": a model split over several GGUF files (merge them first, e.g. "
                           "with llama-gguf-split --merge)");
    }
    if (absl::StartsWith(k, p) && HandledArchKeys().count(k.substr(p.size())) > 0) continue;
    if (absl::StartsWith(k, p))
      return m.unsupported(k, absl::StrCat(" (PolyKV does not implement what it changes in a ",
                                           architecture, " model)"));
    return m.unsupported(k, absl::StrCat(": outside the namespaces read for this model "
                                         "(general., tokenizer., quantize., split., ",
                                         p, ")"));
  }
  return absl::OkStatus();
}

// Layers, widths, heads, head size, context, RoPE base and RMSNorm epsilon; refuses mixture
// of experts, non-causal attention, different key and value head sizes and partial RoPE.
Status ReadGgufShape(const GgufMeta& m, ModelConfig* out) {
  const GgufFile& g = m.g;
  const std::string& src = m.src;
  const auto key = [&](const char* suffix) { return m.key(suffix); };
  ModelConfig& c = *out;
  for (const char* s : {"expert_count", "expert_used_count"}) {
    POLYKV_ASSIGN_OR_RETURN(int32_t experts, m.opt_int(key(s), 0));
    if (experts > 0)
      return m.unsupported(key(s), absl::StrCat(" = ", experts, " (mixture of experts)"));
  }
  if (g.Has(key("attention.causal"))) {
    auto causal = g.GetBool(key("attention.causal"));
    if (!causal.ok())
      return absl::InvalidArgumentError(absl::StrCat(src, ": metadata '", key("attention.causal"),
                                                     "': ", causal.status().message()));
    if (!*causal) return m.unsupported(key("attention.causal"), " = false (non-causal attention)");
  }
  POLYKV_ASSIGN_OR_RETURN(c.layers, m.need_int(key("block_count")));
  POLYKV_ASSIGN_OR_RETURN(c.hidden, m.need_int(key("embedding_length")));
  POLYKV_ASSIGN_OR_RETURN(c.heads, m.need_int(key("attention.head_count")));
  POLYKV_ASSIGN_OR_RETURN(c.kv_heads, m.opt_int(key("attention.head_count_kv"), c.heads));
  POLYKV_ASSIGN_OR_RETURN(c.ffn, m.need_int(key("feed_forward_length")));
  POLYKV_ASSIGN_OR_RETURN(c.max_positions, m.opt_int(key("context_length"), 2048));
  POLYKV_ASSIGN_OR_RETURN(double theta, m.opt_float(key("rope.freq_base"), 10000.0));
  c.rope_theta = static_cast<float>(theta);
  {
    const std::string k = key("attention.layer_norm_rms_epsilon");
    auto eps = g.GetFloat(k);
    if (!eps.ok())
      return absl::InvalidArgumentError(
          absl::StrCat(src, ": metadata '", k, "': ", eps.status().message()));
    c.rms_eps = static_cast<float>(*eps);
  }
  // Head size: attention.key_length when given (it may differ from hidden / heads).
  if (g.Has(key("attention.key_length"))) {
    POLYKV_ASSIGN_OR_RETURN(c.head_dim, m.need_int(key("attention.key_length")));
    POLYKV_ASSIGN_OR_RETURN(int32_t vl, m.opt_int(key("attention.value_length"), c.head_dim));
    if (vl != c.head_dim)
      return m.unsupported(key("attention.value_length"),
                           absl::StrCat(" = ", vl, " != key_length ", c.head_dim,
                                        " (different key and value head sizes)"));
  } else {
    if (c.heads <= 0 || c.hidden % c.heads != 0)
      return absl::InvalidArgumentError(absl::StrCat(src, ": ", key("embedding_length"), " ",
                                                     c.hidden, " is not a multiple of ",
                                                     key("attention.head_count"), " ", c.heads));
    c.head_dim = c.hidden / c.heads;
    POLYKV_ASSIGN_OR_RETURN(int32_t vl, m.opt_int(key("attention.value_length"), c.head_dim));
    if (vl != c.head_dim)
      return m.unsupported(key("attention.value_length"),
                           absl::StrCat(" = ", vl, " != head_dim ", c.head_dim,
                                        " (different key and value head sizes)"));
  }
  if (g.Has(key("rope.dimension_count"))) {
    POLYKV_ASSIGN_OR_RETURN(int32_t rd, m.need_int(key("rope.dimension_count")));
    if (rd != c.head_dim)
      return absl::UnimplementedError(absl::StrCat(src, ": ", key("rope.dimension_count"), " ", rd,
                                                   " != head_dim ", c.head_dim, " (partial RoPE)"));
  }
  POLYKV_ASSIGN_OR_RETURN(c.sliding_window, m.opt_int(key("attention.sliding_window"), 0));
  return absl::OkStatus();
}

// RoPE scaling, as llama.cpp reads it: type (default linear), factor (or the old
// scale_linear; 0 = none), YaRN's original context, attention factor and betas; then Llama
// 3.1's per-frequency divisors in the tensor rope_freqs.weight (*uses_rope_freqs).
Status ReadGgufRopeScaling(const GgufMeta& m, ModelConfig* out, bool* uses_rope_freqs) {
  const GgufFile& g = m.g;
  const std::string& src = m.src;
  const auto key = [&](const char* suffix) { return m.key(suffix); };
  ModelConfig& c = *out;
  std::string type = "linear";
  if (g.Has(key("rope.scaling.type"))) {
    POLYKV_ASSIGN_OR_RETURN(type, g.GetString(key("rope.scaling.type")));
  }
  double factor = 0;
  if (g.Has(key("rope.scaling.factor"))) {
    POLYKV_ASSIGN_OR_RETURN(factor, m.opt_float(key("rope.scaling.factor"), 0.0));
  } else {
    POLYKV_ASSIGN_OR_RETURN(factor, m.opt_float(key("rope.scale_linear"), 0.0));
  }
  if (factor == 0) factor = 1;
  if (type == "none") {
    // llama.cpp never scales with type none, whatever the factor says.
  } else if (type == "linear") {
    c.rope_linear_scale = static_cast<float>(factor);
    if (factor != 1) c.rope_scaling.type = RopeScalingType::kLinear;
  } else if (type == "yarn") {
    RopeScaling& rs = c.rope_scaling;
    rs.type = RopeScalingType::kYarn;
    rs.factor = factor;
    POLYKV_ASSIGN_OR_RETURN(
        rs.original_max_positions,
        m.opt_int(key("rope.scaling.original_context_length"), c.max_positions));
    POLYKV_ASSIGN_OR_RETURN(rs.beta_fast, m.opt_float(key("rope.scaling.yarn_beta_fast"), 32.0));
    POLYKV_ASSIGN_OR_RETURN(rs.beta_slow, m.opt_float(key("rope.scaling.yarn_beta_slow"), 1.0));
    POLYKV_ASSIGN_OR_RETURN(double ext, m.opt_float(key("rope.scaling.yarn_ext_factor"), 1.0));
    if (ext != 1)
      return m.unsupported(
          key("rope.scaling.yarn_ext_factor"),
          absl::StrCat(" = ", ext, " (only the standard YaRN mix, 1, is implemented)"));
    POLYKV_ASSIGN_OR_RETURN(double log_mul,
                            m.opt_float(key("rope.scaling.yarn_log_multiplier"), 0.0));
    if (log_mul != 0)
      return m.unsupported(key("rope.scaling.yarn_log_multiplier"),
                           absl::StrCat(" = ", log_mul, " (DeepSeek-style attention factor)"));
    // ggml: cos/sin times attn_factor * (1 + 0.1 ln(factor)).
    POLYKV_ASSIGN_OR_RETURN(double attn, m.opt_float(key("rope.scaling.attn_factor"), 1.0));
    rs.attention_factor = attn * (factor > 1 ? 1.0 + 0.1 * std::log(factor) : 1.0);
  } else {
    return absl::UnimplementedError(absl::StrCat(src, ": unsupported ", key("rope.scaling.type"),
                                                 " '", type, "' (supported: none, linear, yarn)"));
  }
  // (original_context_length is informational without YaRN, as in llama.cpp.)
  if (c.rope_scaling.type != RopeScalingType::kYarn) {
    for (const char* s :
         {"rope.scaling.attn_factor", "rope.scaling.yarn_ext_factor", "rope.scaling.yarn_beta_fast",
          "rope.scaling.yarn_beta_slow", "rope.scaling.yarn_log_multiplier"})
      if (g.Has(key(s)))
        return m.unsupported(key(s), absl::StrCat(": a YaRN parameter with ",
                                                  key("rope.scaling.type"), " '", type, "'"));
  }

  // Llama 3.1 scaling as llama.cpp stores it: per-frequency divisors in rope_freqs.weight.
  *uses_rope_freqs = false;
  if (const GgufTensorInfo* rf = g.FindTensor("rope_freqs.weight")) {
    if (c.rope_scaling.type != RopeScalingType::kNone)
      return absl::UnimplementedError(absl::StrCat(
          src, ": tensor 'rope_freqs.weight' together with ", key("rope.scaling.type"), " '", type,
          "' (factor ", factor, "): combined frequency scalings are not implemented"));
    if (rf->dims.size() != 1 || rf->dims[0] != c.head_dim / 2)
      return absl::InvalidArgumentError(absl::StrCat(
          src, ": tensor 'rope_freqs.weight' must hold head_dim / 2 = ", c.head_dim / 2,
          " values"));
    std::vector<float> f(static_cast<size_t>(c.head_dim / 2));
    const auto data = g.TensorData(*rf);
    Status s = DequantizeToF32(rf->type, data.data(), data.size(), static_cast<int64_t>(f.size()),
                               f.data());
    if (!s.ok())
      return Status(s.code(), absl::StrCat(src, ": tensor 'rope_freqs.weight': ", s.message()));
    c.rope_scaling.type = RopeScalingType::kFreqFactors;
    c.rope_scaling.freq_factors = std::move(f);
    *uses_rope_freqs = true;
  }
  return absl::OkStatus();
}

StatusOr<ModelConfig> ConfigFromGguf(const GgufFile& g, const GgufArch** arch_out,
                                     bool* uses_rope_freqs) {
  const std::string src = g.path();
  ModelConfig c;
  POLYKV_ASSIGN_OR_RETURN(c.architecture, g.GetString("general.architecture"));
  const GgufArch* arch = nullptr;
  for (const GgufArch& a : kGgufArchs)
    if (c.architecture == a.name) arch = &a;
  if (arch == nullptr)
    return absl::UnimplementedError(absl::StrCat(src, ": unsupported general.architecture '",
                                                 c.architecture, "' (supported: llama, qwen2)"));
  *arch_out = arch;
  const GgufMeta m(g, c.architecture);
  const auto key = [&](const char* suffix) { return m.key(suffix); };
  POLYKV_RETURN_IF_ERROR(CheckGgufKeys(m, c.architecture));
  POLYKV_RETURN_IF_ERROR(ReadGgufShape(m, &c));
  POLYKV_RETURN_IF_ERROR(ReadGgufRopeScaling(m, &c, uses_rope_freqs));

  const GgufTensorInfo* embd = g.FindTensor("token_embd.weight");
  if (embd == nullptr || embd->dims.size() != 2)
    return absl::InvalidArgumentError(
        absl::StrCat(src, ": missing 2-D tensor 'token_embd.weight'"));
  c.vocab = static_cast<int32_t>(embd->dims[1]);
  if (g.Has(key("vocab_size"))) {
    POLYKV_ASSIGN_OR_RETURN(int32_t v, m.need_int(key("vocab_size")));
    if (v != c.vocab)
      return absl::InvalidArgumentError(absl::StrCat(src, ": ", key("vocab_size"), " ", v,
                                                     " != token_embd.weight rows ", c.vocab));
  }
  c.tied_embeddings = g.FindTensor("output.weight") == nullptr;
  // Biases: qwen2 always has q/k/v biases; llama may (llama.cpp loads them when present).
  c.qkv_bias = arch->qkv_bias_required || g.FindTensor("blk.0.attn_q.bias") != nullptr;
  c.o_bias = g.FindTensor("blk.0.attn_output.bias") != nullptr;
  POLYKV_ASSIGN_OR_RETURN(c.bos_id, m.opt_int("tokenizer.ggml.bos_token_id", -1));
  POLYKV_ASSIGN_OR_RETURN(c.eos_id, m.opt_int("tokenizer.ggml.eos_token_id", -1));
  POLYKV_RETURN_IF_ERROR(ValidateConfig(c, src));
  return c;
}

}  // namespace

StatusOr<LoadedModel> LoadGgufModel(const std::string& path, const LoadOptions& /*options*/) {
  LoadedModel m;
  {
    POLYKV_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> opened, GgufFile::Open(path));
    std::shared_ptr<const GgufFile> g(std::move(opened));
    const GgufArch* arch = nullptr;
    bool uses_rope_freqs = false;
    POLYKV_ASSIGN_OR_RETURN(m.config, ConfigFromGguf(*g, &arch, &uses_rope_freqs));
    GgufReader reader(g, m.config, arch->permuted_qk);
    if (uses_rope_freqs) reader.MarkUsed("rope_freqs.weight");
    m.mapped = std::make_unique<MappedWeights>();
    POLYKV_RETURN_IF_ERROR(BuildMappedWeights(m.config, reader, m.mapped.get()));
    POLYKV_RETURN_IF_ERROR(reader.CheckAllTensorsUsed());
    if (g->Has("tokenizer.ggml.model")) {
      auto tok = TokenizerFromGguf(*g);
      if (!tok.ok())
        return Status(tok.status().code(),
                      absl::StrCat(path, ": tokenizer: ", tok.status().message()));
      m.tokenizer = std::move(tok).value();
    }
  }  // the mapped weights keep the file mapped
  POLYKV_ASSIGN_OR_RETURN(m.fingerprint, Sha256OfFiles("gguf\n", {path}));
  return m;
}

}  // namespace polykv::model::internal
