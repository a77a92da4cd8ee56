// The libtorch f32 reference runtime (polykv/model/torch_reference.h): private dequantized
// weight tensors and libtorch ops, over the torch-free KvCache (its f32 buffers wrapped
// without copies).
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "llama_base.h"
#include "llama_internal.h"
#include "polykv/kernels/matmul.h"
#include "polykv/model/torch_reference.h"

namespace polykv::model {
namespace internal {
namespace {

/// One decoder layer, weights in HF [out][in] layout, f32.
struct LayerWeights {
  torch::Tensor attn_norm;  ///< [hidden]
  torch::Tensor wqkv;       ///< [(heads + 2*kv_heads)*head_dim][hidden]: q, k, v rows
  torch::Tensor bqkv;       ///< [(heads + 2*kv_heads)*head_dim] or undefined
  torch::Tensor wo;         ///< [hidden][heads*head_dim]
  torch::Tensor bo;         ///< [hidden] or undefined
  torch::Tensor ffn_norm;   ///< [hidden]
  torch::Tensor wgate_up;   ///< [2*ffn][hidden]: gate rows then up rows
  torch::Tensor wdown;      ///< [hidden][ffn]
};

/// GGUF Llama Q/K rows (and biases) are in llama.cpp's interleaved-pair order: row 2j + s of
/// a head holds HF row s * head_dim / 2 + j. Puts `x` ([heads*head_dim][cols]) back in HF
/// order.
torch::Tensor Deinterleave(const torch::Tensor& x, int64_t heads) {
  const int64_t rows = x.size(0), cols = x.dim() == 2 ? x.size(1) : 1, hd = rows / heads;
  return x.reshape({heads, hd / 2, 2, cols}).transpose(1, 2).reshape(x.sizes()).contiguous();
}

StatusOr<torch::Tensor> Dequantized(const MappedMatrix& m) {
  torch::Tensor t = torch::empty({m.w.rows, m.w.cols}, torch::kFloat32);
  POLYKV_RETURN_IF_ERROR(kernels::DequantizeRows(m.w, 0, m.w.rows, t.data_ptr<float>()));
  return m.interleaved_heads > 0 ? Deinterleave(t, m.interleaved_heads) : t;
}

torch::Tensor Vector(const float* p, int64_t n, int32_t interleaved_heads = 0) {
  torch::Tensor t = torch::from_blob(const_cast<float*>(p), {n}, torch::kFloat32).clone();
  return interleaved_heads > 0 ? Deinterleave(t, interleaved_heads) : t;
}

class TorchLlama final : public LlamaBase {
 public:
  TorchLlama(LoadedModel m)
      : LlamaBase(m.config, std::move(m.tokenizer), std::move(m.fingerprint)) {}

  Status Build(const MappedWeights& mw) {
    const ModelConfig& c = config_;
    try {
      torch::NoGradGuard no_grad;
      POLYKV_ASSIGN_OR_RETURN(embed_, Dequantized(mw.embed));
      layers_.resize(static_cast<size_t>(c.layers));
      for (int l = 0; l < c.layers; ++l) {
        const MappedLayer& ml = mw.layers[static_cast<size_t>(l)];
        LayerWeights& lw = layers_[static_cast<size_t>(l)];
        lw.attn_norm = Vector(ml.attn_norm, c.hidden);
        POLYKV_ASSIGN_OR_RETURN(torch::Tensor q, Dequantized(ml.q));
        POLYKV_ASSIGN_OR_RETURN(torch::Tensor k, Dequantized(ml.k));
        POLYKV_ASSIGN_OR_RETURN(torch::Tensor v, Dequantized(ml.v));
        lw.wqkv = torch::cat({q, k, v}, 0).contiguous();
        if (c.qkv_bias) {
          const int64_t qr = int64_t{c.heads} * c.head_dim, kr = int64_t{c.kv_heads} * c.head_dim;
          lw.bqkv = torch::cat({Vector(ml.bq, qr, ml.q.interleaved_heads),
                                Vector(ml.bk, kr, ml.k.interleaved_heads), Vector(ml.bv, kr)},
                               0);
        }
        POLYKV_ASSIGN_OR_RETURN(lw.wo, Dequantized(ml.o));
        if (c.o_bias) lw.bo = Vector(ml.bo, c.hidden);
        lw.ffn_norm = Vector(ml.ffn_norm, c.hidden);
        POLYKV_ASSIGN_OR_RETURN(torch::Tensor g, Dequantized(ml.gate));
        POLYKV_ASSIGN_OR_RETURN(torch::Tensor u, Dequantized(ml.up));
        lw.wgate_up = torch::cat({g, u}, 0).contiguous();
        POLYKV_ASSIGN_OR_RETURN(lw.wdown, Dequantized(ml.down));
      }
      norm_ = Vector(mw.norm, c.hidden);
      if (c.tied_embeddings) {
        lm_head_ = embed_;
      } else {
        POLYKV_ASSIGN_OR_RETURN(lm_head_, Dequantized(mw.lm_head));
      }
    } catch (const std::exception& e) {
      return StatusFromException(e, "loading the reference weights");
    }
    return absl::OkStatus();
  }

  StatusOr<KvCache> NewCacheWithPrefix(std::shared_ptr<const KvPrefix>, std::vector<int32_t>,
                                       int64_t) const override {
    return NoPrefix();
  }
  StatusOr<KvCache> FreezeAsPrefix(KvCache&&, int64_t) const override { return NoPrefix(); }
  WeightStorage weight_storage() const override { return WeightStorage::kCopy; }
  int64_t WeightBytesPerToken() const override {
    int64_t b = 0;
    auto add = [&](const torch::Tensor& t) { b += t.defined() ? t.numel() * t.element_size() : 0; };
    for (const auto& l : layers_) {
      for (const torch::Tensor* t :
           {&l.attn_norm, &l.wqkv, &l.bqkv, &l.wo, &l.bo, &l.ffn_norm, &l.wgate_up, &l.wdown})
        add(*t);
    }
    add(norm_);
    add(lm_head_);
    return b;
  }

 private:
  static Status NoPrefix() {
    return absl::FailedPreconditionError(
        "the libtorch reference runtime holds a private copy of its weights and cannot attend "
        "to a shared prefix in place: load the model with LlamaModel::Load (mapped)");
  }

  torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& w) const {
    torch::Tensor r = torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + config_.rms_eps);
    return x * r * w;
  }

  // x: [heads][n][head_dim]; cos/sin: [n][head_dim]. HF apply_rotary_pos_emb.
  static torch::Tensor Rope(const torch::Tensor& x, const torch::Tensor& cos,
                            const torch::Tensor& sin) {
    const int64_t half = x.size(-1) / 2;
    torch::Tensor rot = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
    return x * cos + rot * sin;
  }

  // The cache's layer-l buffer as a [kv_heads][capacity][head_dim] tensor (no copy).
  torch::Tensor Wrap(std::vector<float>& b, int64_t cap) const {
    return torch::from_blob(b.data(), {config_.kv_heads, cap, config_.head_dim}, torch::kFloat32);
  }

  StatusOr<Logits> ForwardImpl(absl::Span<const int32_t> tokens, KvCache& cache,
                               int64_t logits_from) override {
    const int64_t n = static_cast<int64_t>(tokens.size());
    if (n == 0) return absl::InvalidArgumentError("Forward: empty token list");
    POLYKV_RETURN_IF_ERROR(CheckTokens(tokens));
    if (cache.prefix) return NoPrefix();
    POLYKV_RETURN_IF_ERROR(CheckCache(cache));
    const int64_t past = cache.length, total = past + n;
    const int64_t H = config_.heads, KV = config_.kv_heads, hd = config_.head_dim, F = config_.ffn;
    POLYKV_RETURN_IF_ERROR(EnsureCapacity(cache, total));
    const int64_t cap = cache.capacity;
    try {
      torch::NoGradGuard no_grad;
      torch::Tensor ids = torch::from_blob(const_cast<int32_t*>(tokens.data()), {n}, torch::kInt32)
                              .to(torch::kLong);
      torch::Tensor x = embed_.index_select(0, ids);  // [n][hidden]
      std::vector<float> cosv(static_cast<size_t>(n * hd)), sinv(static_cast<size_t>(n * hd));
      RopeTables(past, n, cosv.data(), sinv.data());
      torch::Tensor cos = torch::from_blob(cosv.data(), {n, hd}, torch::kFloat32);
      torch::Tensor sin = torch::from_blob(sinv.data(), {n, hd}, torch::kFloat32);
      torch::Tensor mask;  // [n][total], true where key position > query position
      if (n > 1) mask = torch::ones({n, total}, torch::kBool).triu(past + 1);
      const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
      const int64_t G = H / KV;
      for (int l = 0; l < config_.layers; ++l) {
        const LayerWeights& lw = layers_[static_cast<size_t>(l)];
        torch::Tensor h = RmsNorm(x, lw.attn_norm);
        torch::Tensor qkv = lw.bqkv.defined() ? torch::linear(h, lw.wqkv, lw.bqkv)
                                              : torch::linear(h, lw.wqkv);  // [n][(H+2KV)*hd]
        torch::Tensor q = qkv.narrow(1, 0, H * hd).view({n, H, hd}).transpose(0, 1);
        torch::Tensor k = qkv.narrow(1, H * hd, KV * hd).view({n, KV, hd}).transpose(0, 1);
        torch::Tensor v = qkv.narrow(1, (H + KV) * hd, KV * hd).view({n, KV, hd}).transpose(0, 1);
        q = Rope(q, cos, sin);
        k = Rope(k, cos, sin);
        torch::Tensor ck = Wrap(cache.k[static_cast<size_t>(l)], cap);
        torch::Tensor cv = Wrap(cache.v[static_cast<size_t>(l)], cap);
        ck.narrow(1, past, n).copy_(k);
        cv.narrow(1, past, n).copy_(v);
        torch::Tensor K = ck.narrow(1, 0, total), V = cv.narrow(1, 0, total);
        // Query head h uses KV head h / G (HF repeat_kv): group queries per KV head.
        torch::Tensor qg = q.reshape({KV, G * n, hd});
        torch::Tensor scores = torch::bmm(qg, K.transpose(1, 2)).mul_(scale);
        if (mask.defined())
          scores.view({KV, G, n, total})
              .masked_fill_(mask, -std::numeric_limits<float>::infinity());
        torch::Tensor p = torch::softmax(scores, -1);
        torch::Tensor o = torch::bmm(p, V).view({H, n, hd}).transpose(0, 1).reshape({n, H * hd});
        x = x + (lw.bo.defined() ? torch::linear(o, lw.wo, lw.bo) : torch::linear(o, lw.wo));
        h = RmsNorm(x, lw.ffn_norm);
        torch::Tensor gu = torch::linear(h, lw.wgate_up);  // [n][2F]
        x = x + torch::linear(torch::silu(gu.narrow(1, 0, F)) * gu.narrow(1, F, F), lw.wdown);
      }
      cache.length = total;
      cache.tokens.insert(cache.tokens.end(), tokens.begin(), tokens.end());
      Logits out;
      out.rows = n - logits_from;
      out.vocab = config_.vocab;
      torch::Tensor lg =
          torch::linear(RmsNorm(x.narrow(0, logits_from, n - logits_from), norm_), lm_head_)
              .contiguous();
      out.values.assign(lg.data_ptr<float>(), lg.data_ptr<float>() + lg.numel());
      return out;
    } catch (const std::exception& e) {
      return StatusFromException(e, "Forward");
    }
  }

  torch::Tensor embed_, norm_, lm_head_;
  std::vector<LayerWeights> layers_;
};

}  // namespace
}  // namespace internal

StatusOr<std::unique_ptr<LlamaModel>> LoadTorchReference(const std::string& path,
                                                         const LoadOptions& options_in) {
  LoadOptions options = options_in;
  options.weights = WeightStorage::kMapped;  // the files are mapped, then copied
  const int threads = SetComputeThreads(options.threads);
  torch::set_num_threads(threads);
  POLYKV_ASSIGN_OR_RETURN(internal::LoadedModel loaded, internal::LoadModelFiles(path, options));
  std::unique_ptr<internal::MappedWeights> mapped = std::move(loaded.mapped);
  auto model = std::make_unique<internal::TorchLlama>(std::move(loaded));
  POLYKV_RETURN_IF_ERROR(model->Build(*mapped));
  return std::unique_ptr<LlamaModel>(std::move(model));
}

}  // namespace polykv::model
