// GGUF loader for general.architecture == "llama": llama.* metadata, ggml tensor names,
// dequantization to f32 tensor by tensor, and the inverse of llama.cpp's Q/K row permute.
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "llama_internal.h"
#include "polykv/model/gguf.h"

namespace polykv::model::internal {
namespace {

// llama.cpp's convert script reorders the rows of q_proj / k_proj for interleaved-pair
// RoPE: W_gguf = W_hf.reshape(n_head, 2, hd/2, in).swapaxes(1, 2). This is its inverse,
// giving back HF rotate_half rows. `w` is [n_head*hd][in].
torch::Tensor UnpermuteQk(const torch::Tensor& w, int64_t n_head) {
  const int64_t rows = w.size(0), in = w.size(1), hd = rows / n_head;
  return w.reshape({n_head, hd / 2, 2, in}).transpose(1, 2).reshape({rows, in}).contiguous();
}

class GgufReader : public WeightReader {
 public:
  GgufReader(std::shared_ptr<const GgufFile> file, const ModelConfig& c)
      : file_(std::move(file)), g_(*file_), c_(c) {}

  static std::string Name(const std::string& role, int layer) {
    if (role == "embed") return "token_embd.weight";
    if (role == "norm") return "output_norm.weight";
    if (role == "output") return "output.weight";
    static const std::map<std::string, std::string> kLayer = {
        {"attn_norm", "attn_norm"}, {"q", "attn_q"},     {"k", "attn_k"},
        {"v", "attn_v"},            {"o", "attn_output"}, {"ffn_norm", "ffn_norm"},
        {"gate", "ffn_gate"},       {"up", "ffn_up"},     {"down", "ffn_down"}};
    return absl::StrCat("blk.", layer, ".", kLayer.at(role), ".weight");
  }

  StatusOr<torch::Tensor> Get(const std::string& role, int layer,
                              const std::vector<int64_t>& shape) override {
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
    torch::Tensor t = torch::empty(shape, torch::kFloat32);
    const auto data = g_.TensorData(*info);
    Status s = DequantizeToF32(info->type, data.data(), data.size(), t.numel(), t.data_ptr<float>());
    if (!s.ok())
      return Status(s.code(), absl::StrCat(g_.path(), ": tensor '", name, "': ", s.message()));
    if (role == "q") return UnpermuteQk(t, c_.heads);
    if (role == "k") return UnpermuteQk(t, c_.kv_heads);
    return t;
  }
  bool HasOutput() override { return g_.FindTensor("output.weight") != nullptr; }

  StatusOr<RawTensor> GetRaw(const std::string& role, int layer,
                             const std::vector<int64_t>& shape) override {
    const std::string name = Name(role, layer);
    const GgufTensorInfo* info = g_.FindTensor(name);
    if (info == nullptr)
      return absl::InvalidArgumentError(absl::StrCat(g_.path(), ": missing tensor '", name, "'"));
    std::vector<int64_t> torch_shape(info->dims.rbegin(), info->dims.rend());
    if (torch_shape != shape)
      return absl::InvalidArgumentError(absl::StrCat(
          g_.path(), ": tensor '", name, "' has shape [", absl::StrJoin(torch_shape, ", "),
          "] (PyTorch order), expected [", absl::StrJoin(shape, ", "), "]"));
    const auto data = g_.TensorData(*info);
    if (data.empty() && info->nbytes > 0)
      return absl::DataLossError(absl::StrCat(g_.path(), ": tensor '", name, "' lies outside the file"));
    RawTensor t;
    t.type = info->type;
    t.data = data.data();
    t.bytes = data.size();
    t.interleaved_qk = role == "q" || role == "k";
    return t;
  }
  std::vector<std::shared_ptr<const void>> Mappings() override { return {file_}; }

 private:
  std::shared_ptr<const GgufFile> file_;
  const GgufFile& g_;
  const ModelConfig& c_;
};

StatusOr<ModelConfig> ConfigFromGguf(const GgufFile& g) {
  const std::string src = g.path();
  ModelConfig c;
  POLYKV_ASSIGN_OR_RETURN(c.architecture, g.GetString("general.architecture"));
  if (c.architecture != "llama")
    return absl::UnimplementedError(absl::StrCat(src, ": unsupported general.architecture '",
                                                 c.architecture, "' (supported: llama)"));
  const auto need_int = [&](const char* key) -> StatusOr<int32_t> {
    auto v = g.GetInt(key);
    if (!v.ok())
      return absl::InvalidArgumentError(absl::StrCat(src, ": metadata '", key, "': ", v.status().message()));
    if (*v < INT32_MIN || *v > INT32_MAX)
      return absl::InvalidArgumentError(absl::StrCat(src, ": metadata '", key, "' out of range"));
    return static_cast<int32_t>(*v);
  };
  const auto opt_int = [&](const char* key, int32_t def) -> StatusOr<int32_t> {
    if (!g.Has(key)) return def;
    return need_int(key);
  };
  const auto opt_float = [&](const char* key, double def) -> StatusOr<double> {
    if (!g.Has(key)) return def;
    auto v = g.GetFloat(key);
    if (!v.ok())
      return absl::InvalidArgumentError(absl::StrCat(src, ": metadata '", key, "': ", v.status().message()));
    return *v;
  };
  for (const char* key : {"llama.attention.sliding_window"})
    if (g.Has(key))
      return absl::UnimplementedError(absl::StrCat(src, ": unsupported metadata '", key,
                                                   "': sliding-window attention"));
  if (g.Has("llama.expert_count")) {
    POLYKV_ASSIGN_OR_RETURN(int32_t experts, need_int("llama.expert_count"));
    if (experts > 0)
      return absl::UnimplementedError(absl::StrCat(src, ": unsupported metadata 'llama.expert_count' = ",
                                                   experts, " (mixture of experts)"));
  }
  if (g.Has("llama.rope.scaling.type")) {
    POLYKV_ASSIGN_OR_RETURN(std::string type, g.GetString("llama.rope.scaling.type"));
    if (type == "linear") {
      POLYKV_ASSIGN_OR_RETURN(double f, opt_float("llama.rope.scaling.factor", 1.0));
      c.rope_linear_scale = static_cast<float>(f);
    } else if (type != "none") {
      return absl::UnimplementedError(absl::StrCat(src, ": unsupported llama.rope.scaling.type '",
                                                   type, "' (supported: none, linear)"));
    }
  }
  POLYKV_ASSIGN_OR_RETURN(c.layers, need_int("llama.block_count"));
  POLYKV_ASSIGN_OR_RETURN(c.hidden, need_int("llama.embedding_length"));
  POLYKV_ASSIGN_OR_RETURN(c.heads, need_int("llama.attention.head_count"));
  POLYKV_ASSIGN_OR_RETURN(c.kv_heads, opt_int("llama.attention.head_count_kv", c.heads));
  POLYKV_ASSIGN_OR_RETURN(c.ffn, need_int("llama.feed_forward_length"));
  POLYKV_ASSIGN_OR_RETURN(c.max_positions, opt_int("llama.context_length", 2048));
  POLYKV_ASSIGN_OR_RETURN(double theta, opt_float("llama.rope.freq_base", 10000.0));
  c.rope_theta = static_cast<float>(theta);
  {
    auto eps = g.GetFloat("llama.attention.layer_norm_rms_epsilon");
    if (!eps.ok())
      return absl::InvalidArgumentError(absl::StrCat(
          src, ": metadata 'llama.attention.layer_norm_rms_epsilon': ", eps.status().message()));
    c.rms_eps = static_cast<float>(*eps);
  }
  if (c.heads <= 0 || c.hidden % c.heads != 0)
    return absl::InvalidArgumentError(absl::StrCat(src, ": llama.embedding_length ", c.hidden,
                                                   " is not a multiple of llama.attention.head_count ",
                                                   c.heads));
  c.head_dim = c.hidden / c.heads;
  if (g.Has("llama.rope.dimension_count")) {
    POLYKV_ASSIGN_OR_RETURN(int32_t rd, need_int("llama.rope.dimension_count"));
    if (rd != c.head_dim)
      return absl::UnimplementedError(absl::StrCat(src, ": llama.rope.dimension_count ", rd,
                                                   " != head_dim ", c.head_dim, " (partial RoPE)"));
  }
  const GgufTensorInfo* embd = g.FindTensor("token_embd.weight");
  if (embd == nullptr || embd->dims.size() != 2)
    return absl::InvalidArgumentError(absl::StrCat(src, ": missing 2-D tensor 'token_embd.weight'"));
  c.vocab = static_cast<int32_t>(embd->dims[1]);
  if (g.Has("llama.vocab_size")) {
    POLYKV_ASSIGN_OR_RETURN(int32_t v, need_int("llama.vocab_size"));
    if (v != c.vocab)
      return absl::InvalidArgumentError(absl::StrCat(src, ": llama.vocab_size ", v,
                                                     " != token_embd.weight rows ", c.vocab));
  }
  c.tied_embeddings = g.FindTensor("output.weight") == nullptr;
  POLYKV_ASSIGN_OR_RETURN(c.bos_id, opt_int("tokenizer.ggml.bos_token_id", -1));
  POLYKV_ASSIGN_OR_RETURN(c.eos_id, opt_int("tokenizer.ggml.eos_token_id", -1));
  POLYKV_RETURN_IF_ERROR(ValidateConfig(c, src));
  return c;
}

}  // namespace

StatusOr<LoadedModel> LoadGgufModel(const std::string& path, const LoadOptions& options) {
  LoadedModel m;
  {
    POLYKV_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> opened, GgufFile::Open(path));
    std::shared_ptr<const GgufFile> g(std::move(opened));
    POLYKV_ASSIGN_OR_RETURN(m.config, ConfigFromGguf(*g));
    GgufReader reader(g, m.config);
    if (options.weights == WeightStorage::kMapped) {
      m.mapped = std::make_unique<MappedWeights>();
      POLYKV_RETURN_IF_ERROR(BuildMappedWeights(m.config, reader, m.mapped.get()));
    } else {
      POLYKV_RETURN_IF_ERROR(BuildWeights(m.config, reader, options, &m.weights));
    }
    if (g->Has("tokenizer.ggml.model")) {
      auto tok = TokenizerFromGguf(*g);
      if (!tok.ok())
        return Status(tok.status().code(),
                      absl::StrCat(path, ": tokenizer: ", tok.status().message()));
      m.tokenizer = std::move(tok).value();
    }
  }  // the copy runtime unmaps the file here; the mapped one keeps it
  POLYKV_ASSIGN_OR_RETURN(m.fingerprint, Sha256OfFiles("gguf\n", {path}));
  return m;
}

}  // namespace polykv::model::internal
