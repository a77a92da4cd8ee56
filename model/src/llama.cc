// Llama-family forward pass on libtorch: RMSNorm, RoPE (HF rotate_half), grouped-query
// attention over a caller-owned KV cache, SwiGLU MLP; Prefill, Generate, Perplexity.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "llama_internal.h"

namespace polykv::model {
namespace {

using internal::LoadedModel;
using internal::StatusFromException;

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// A uniform double in [0, 1) from the top 53 bits: the same on every platform (unlike
// std::uniform_real_distribution, whose algorithm is implementation-defined).
double Uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

class LlamaModelImpl final : public LlamaModel {
 public:
  LlamaModelImpl(LoadedModel m, const LoadOptions& options)
      : config_(m.config),
        w_(std::move(m.weights)),
        tokenizer_(std::move(m.tokenizer)),
        fingerprint_(std::move(m.fingerprint)),
        device_(options.device),
        dtype_(options.dtype) {
    const int64_t half = config_.head_dim / 2;
    inv_freq_ = torch::empty({half}, torch::kFloat64);
    auto* f = inv_freq_.data_ptr<double>();
    for (int64_t i = 0; i < half; ++i)
      f[i] = 1.0 / std::pow(static_cast<double>(config_.rope_theta),
                            static_cast<double>(2 * i) / config_.head_dim);
  }

  const ModelConfig& config() const override { return config_; }
  const Tokenizer* tokenizer() const override { return tokenizer_.get(); }
  const std::string& fingerprint() const override { return fingerprint_; }
  torch::Device device() const override { return device_; }
  torch::ScalarType dtype() const override { return dtype_; }

  KvCache NewCache(int64_t capacity) const override {
    KvCache c;
    capacity = std::max<int64_t>(capacity, 0);
    const auto opts = torch::TensorOptions().dtype(dtype_).device(device_);
    for (int l = 0; l < config_.layers; ++l) {
      c.k.push_back(torch::zeros({config_.kv_heads, capacity, config_.head_dim}, opts));
      c.v.push_back(torch::zeros({config_.kv_heads, capacity, config_.head_dim}, opts));
    }
    return c;
  }

  StatusOr<torch::Tensor> Forward(absl::Span<const int32_t> tokens, KvCache& cache,
                                  bool all_logits) override {
    if (tokens.empty()) return absl::InvalidArgumentError("Forward: empty token list");
    return ForwardImpl(tokens, cache, all_logits ? 0 : static_cast<int64_t>(tokens.size()) - 1);
  }

  StatusOr<PrefillResult> Prefill(absl::Span<const int32_t> tokens, int64_t chunk,
                                  const std::function<void(int64_t, int64_t)>& progress) override {
    if (tokens.empty()) return absl::InvalidArgumentError("Prefill: empty token list");
    if (chunk <= 0) return absl::InvalidArgumentError(absl::StrCat("Prefill: chunk must be > 0, got ", chunk));
    const int64_t n = static_cast<int64_t>(tokens.size());
    KvCache cache = NewCache(n);
    torch::Tensor logits;
    for (int64_t done = 0; done < n;) {
      const int64_t m = std::min(chunk, n - done);
      POLYKV_ASSIGN_OR_RETURN(logits, ForwardImpl(tokens.subspan(done, m), cache, m - 1));
      done += m;
      if (progress) progress(done, n);
    }
    PrefillResult r;
    r.k = std::move(cache.k);
    r.v = std::move(cache.v);
    r.last_logits = logits[0];
    return r;
  }

  StatusOr<GenerateResult> Generate(KvCache& cache, absl::Span<const int32_t> prompt,
                                    const SamplingOptions& options) override {
    const auto t0 = std::chrono::steady_clock::now();
    if (options.max_new_tokens < 0)
      return absl::InvalidArgumentError(absl::StrCat("Generate: max_new_tokens must be >= 0, got ",
                                                     options.max_new_tokens));
    if (!options.greedy) {
      if (!(options.temperature > 0) || !std::isfinite(options.temperature))
        return absl::InvalidArgumentError(absl::StrCat("Generate: temperature must be > 0, got ",
                                                       options.temperature));
      if (!(options.top_p > 0 && options.top_p <= 1))
        return absl::InvalidArgumentError(absl::StrCat("Generate: top_p must be in (0, 1], got ",
                                                       options.top_p));
    }
    std::vector<int32_t> feed(prompt.begin(), prompt.end());
    const bool recompute = feed.empty();
    if (recompute) {
      if (cache.length == 0 || cache.tokens.empty())
        return absl::InvalidArgumentError("Generate: empty prompt and an empty cache (nothing to continue)");
      POLYKV_RETURN_IF_ERROR(CheckCache(cache));
      feed.push_back(cache.tokens.back());
      cache.tokens.pop_back();
      cache.length -= 1;
    }
    GenerateResult r;
    std::mt19937_64 rng(options.seed);
    StatusOr<torch::Tensor> first = ForwardImpl(feed, cache, static_cast<int64_t>(feed.size()) - 1);
    if (!first.ok()) {
      if (recompute) {  // leave the cache as it was
        cache.tokens.push_back(feed[0]);
        cache.length += 1;
      }
      return first.status();
    }
    torch::Tensor logits = std::move(first).value();
    for (int32_t i = 0; i < options.max_new_tokens; ++i) {
      POLYKV_ASSIGN_OR_RETURN(int32_t tok, Sample(logits[0], options, rng));
      if (i == 0) r.first_token_ms = MsSince(t0);
      if (options.stop_at_eos && IsEos(tok)) break;
      r.tokens.push_back(tok);
      // Append the token's K/V; the last one needs no logits (logits_from = 1: none).
      const bool last = i + 1 == options.max_new_tokens;
      const int32_t one[1] = {tok};
      POLYKV_ASSIGN_OR_RETURN(logits, ForwardImpl(absl::MakeConstSpan(one, 1), cache, last ? 1 : 0));
    }
    r.total_ms = MsSince(t0);
    return r;
  }

  StatusOr<PerplexityResult> Perplexity(absl::Span<const int32_t> tokens, int64_t context,
                                        int64_t stride) override {
    const int64_t n = static_cast<int64_t>(tokens.size());
    if (n < 2) return absl::InvalidArgumentError(absl::StrCat("Perplexity: need >= 2 tokens, got ", n));
    if (context < 1) return absl::InvalidArgumentError(absl::StrCat("Perplexity: context must be >= 1, got ", context));
    if (stride < 1 || stride > context)
      return absl::InvalidArgumentError(absl::StrCat("Perplexity: stride must be in [1, context=",
                                                     context, "], got ", stride));
    // Prediction positions 0..n-2 (position p predicts token p+1). Window w feeds tokens
    // [b, e) with b = w*stride, e = min(b+context, n-1), and scores positions [prev_e, e).
    double nll = 0;
    int64_t scored = 0;
    try {
      torch::NoGradGuard no_grad;
      int64_t prev_e = 0;
      for (int64_t b = 0;; b += stride) {
        const int64_t e = std::min(b + context, n - 1);
        const int64_t s = std::max(prev_e, b);
        KvCache cache = NewCache(e - b);
        POLYKV_ASSIGN_OR_RETURN(torch::Tensor logits,
                                ForwardImpl(tokens.subspan(b, e - b), cache, s - b));  // [e-s][vocab]
        std::vector<int64_t> tgt(tokens.begin() + s + 1, tokens.begin() + e + 1);
        auto target = torch::tensor(tgt, torch::kLong).to(logits.device()).unsqueeze(1);
        auto lp = torch::log_softmax(logits, -1).gather(1, target);
        nll -= lp.sum().to(torch::kFloat64).item<double>();
        scored += e - s;
        prev_e = e;
        if (e == n - 1) break;
      }
    } catch (const std::exception& ex) {
      return StatusFromException(ex, "Perplexity");
    }
    PerplexityResult r;
    r.tokens_scored = scored;
    r.mean_nll = nll / static_cast<double>(scored);
    r.perplexity = std::exp(r.mean_nll);
    return r;
  }

 private:
  bool IsEos(int32_t id) const {
    if (tokenizer_ != nullptr) return tokenizer_->IsEndOfGeneration(id);
    return id == config_.eos_id;
  }

  StatusOr<int32_t> Sample(const torch::Tensor& logits, const SamplingOptions& o,
                           std::mt19937_64& rng) const {
    try {
      if (o.greedy) return static_cast<int32_t>(logits.argmax().item<int64_t>());
      torch::Tensor p = torch::softmax(logits.to(torch::kCPU).to(torch::kFloat64) / o.temperature, -1)
                            .contiguous();
      const double* pp = p.data_ptr<double>();
      const int64_t v = p.numel();
      std::vector<int32_t> idx(v);
      std::iota(idx.begin(), idx.end(), 0);
      std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return pp[a] > pp[b]; });
      double cum = 0;
      int64_t keep = 0;
      while (keep < v) {
        cum += pp[idx[keep++]];
        if (cum >= o.top_p) break;
      }
      double u = Uniform01(rng) * cum;
      for (int64_t i = 0; i < keep; ++i) {
        u -= pp[idx[i]];
        if (u < 0) return idx[i];
      }
      return idx[keep - 1];
    } catch (const std::exception& e) {
      return StatusFromException(e, "sampling");
    }
  }

  Status CheckCache(const KvCache& c) const {
    if (c.k.empty() && c.v.empty()) {
      if (c.length != 0)
        return absl::InvalidArgumentError("KvCache: no tensors but length != 0");
      return absl::OkStatus();
    }
    if (static_cast<int>(c.k.size()) != config_.layers || static_cast<int>(c.v.size()) != config_.layers)
      return absl::InvalidArgumentError(absl::StrCat("KvCache: ", c.k.size(), " K and ", c.v.size(),
                                                     " V tensors for a model of ", config_.layers, " layers"));
    const int64_t cap = c.k[0].defined() ? c.k[0].size(1) : -1;
    for (int l = 0; l < config_.layers; ++l) {
      for (const torch::Tensor* t : {&c.k[l], &c.v[l]}) {
        if (!t->defined() || t->dim() != 3 || t->size(0) != config_.kv_heads ||
            t->size(1) != cap || t->size(2) != config_.head_dim)
          return absl::InvalidArgumentError(absl::StrCat(
              "KvCache: layer ", l, " tensor must be [kv_heads=", config_.kv_heads, "][capacity=",
              cap, "][head_dim=", config_.head_dim, "]"));
        if (t->scalar_type() != dtype_ || t->device() != device_)
          return absl::InvalidArgumentError(absl::StrCat("KvCache: layer ", l, " tensor is ",
                                                         t->toString(), ", model uses ",
                                                         c10::toString(dtype_), " on ", device_.str()));
      }
    }
    if (c.length < 0 || c.length > cap)
      return absl::InvalidArgumentError(absl::StrCat("KvCache: length ", c.length,
                                                     " outside [0, capacity=", cap, "]"));
    if (static_cast<int64_t>(c.tokens.size()) != c.length)
      return absl::InvalidArgumentError(absl::StrCat("KvCache: tokens.size() ", c.tokens.size(),
                                                     " != length ", c.length));
    return absl::OkStatus();
  }

  void EnsureCapacity(KvCache& c, int64_t needed) const {
    if (c.k.empty()) {
      c = NewCache(needed);
      return;
    }
    const int64_t cap = c.capacity();
    if (cap >= needed) return;
    const int64_t new_cap = std::max(needed, 2 * cap);
    KvCache bigger = NewCache(new_cap);
    for (int l = 0; l < config_.layers; ++l) {
      bigger.k[l].narrow(1, 0, c.length).copy_(c.k[l].narrow(1, 0, c.length));
      bigger.v[l].narrow(1, 0, c.length).copy_(c.v[l].narrow(1, 0, c.length));
    }
    c.k = std::move(bigger.k);
    c.v = std::move(bigger.v);
  }

  torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& w) const {
    torch::Tensor xf = x.to(torch::kFloat32);
    torch::Tensor r = torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + config_.rms_eps);
    return (xf * r).to(dtype_) * w;
  }

  // x: [heads][n][head_dim]; cos/sin: [n][head_dim]. HF apply_rotary_pos_emb.
  static torch::Tensor Rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
    const int64_t half = x.size(-1) / 2;
    torch::Tensor rot = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
    return x * cos + rot * sin;
  }

  // Runs `tokens` at positions cache.length.., appends K/V, returns f32 logits for
  // positions >= logits_from (relative to the first new token): [n - logits_from][vocab]
  // (logits_from == n: no logits, no lm_head work).
  StatusOr<torch::Tensor> ForwardImpl(absl::Span<const int32_t> tokens, KvCache& cache,
                                      int64_t logits_from) {
    const int64_t n = static_cast<int64_t>(tokens.size());
    if (n == 0) return absl::InvalidArgumentError("Forward: empty token list");
    for (size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] < 0 || tokens[i] >= config_.vocab)
        return absl::InvalidArgumentError(absl::StrCat("Forward: token id ", tokens[i], " at index ", i,
                                                       " is outside the vocabulary [0, ", config_.vocab, ")"));
    POLYKV_RETURN_IF_ERROR(CheckCache(cache));
    const int64_t past = cache.length, total = past + n;
    const int64_t H = config_.heads, KV = config_.kv_heads, G = H / KV, hd = config_.head_dim,
                  F = config_.ffn;
    try {
      torch::NoGradGuard no_grad;
      EnsureCapacity(cache, total);
      const auto dev = torch::TensorOptions().device(device_);
      torch::Tensor ids =
          torch::from_blob(const_cast<int32_t*>(tokens.data()), {n}, torch::kInt32).to(torch::kLong).to(device_);
      torch::Tensor x = w_.embed.index_select(0, ids);  // [n][hidden]

      torch::Tensor pos = torch::arange(past, total, torch::kFloat64) / config_.rope_linear_scale;
      torch::Tensor freqs = torch::outer(pos, inv_freq_);  // [n][hd/2]
      torch::Tensor emb = torch::cat({freqs, freqs}, -1);
      torch::Tensor cos = emb.cos().to(dtype_).to(device_), sin = emb.sin().to(dtype_).to(device_);
      torch::Tensor mask;  // [n][total], true where key position > query position
      if (n > 1) mask = torch::ones({n, total}, dev.dtype(torch::kBool)).triu(past + 1);
      const double scale = 1.0 / std::sqrt(static_cast<double>(hd));

      for (int l = 0; l < config_.layers; ++l) {
        const internal::LayerWeights& lw = w_.layers[l];
        torch::Tensor h = RmsNorm(x, lw.attn_norm);
        torch::Tensor qkv = torch::linear(h, lw.wqkv);  // [n][(H+2KV)*hd]
        torch::Tensor q = qkv.narrow(1, 0, H * hd).view({n, H, hd}).transpose(0, 1);
        torch::Tensor k = qkv.narrow(1, H * hd, KV * hd).view({n, KV, hd}).transpose(0, 1);
        torch::Tensor v = qkv.narrow(1, (H + KV) * hd, KV * hd).view({n, KV, hd}).transpose(0, 1);
        q = Rope(q, cos, sin);
        k = Rope(k, cos, sin);
        cache.k[l].narrow(1, past, n).copy_(k);
        cache.v[l].narrow(1, past, n).copy_(v);
        torch::Tensor K = cache.k[l].narrow(1, 0, total), V = cache.v[l].narrow(1, 0, total);
        // Query head h uses KV head h / G (HF repeat_kv): group queries per KV head.
        torch::Tensor qg = q.reshape({KV, G * n, hd});
        torch::Tensor scores = torch::bmm(qg, K.transpose(1, 2)).to(torch::kFloat32).mul_(scale);
        if (mask.defined())
          scores.view({KV, G, n, total}).masked_fill_(mask, -std::numeric_limits<float>::infinity());
        torch::Tensor p = torch::softmax(scores, -1).to(dtype_);
        torch::Tensor o = torch::bmm(p, V).view({H, n, hd}).transpose(0, 1).reshape({n, H * hd});
        x = x + torch::linear(o, lw.wo);
        h = RmsNorm(x, lw.ffn_norm);
        torch::Tensor gu = torch::linear(h, lw.wgate_up);  // [n][2F]
        x = x + torch::linear(torch::silu(gu.narrow(1, 0, F)) * gu.narrow(1, F, F), lw.wdown);
      }
      cache.length = total;
      cache.tokens.insert(cache.tokens.end(), tokens.begin(), tokens.end());
      x = RmsNorm(x.narrow(0, logits_from, n - logits_from), w_.norm);
      return torch::linear(x, w_.lm_head).to(torch::kFloat32);
    } catch (const std::exception& e) {
      return StatusFromException(e, "Forward");
    }
  }

  ModelConfig config_;
  internal::LlamaWeights w_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::string fingerprint_;
  torch::Device device_;
  torch::ScalarType dtype_;
  torch::Tensor inv_freq_;  // [head_dim/2] f64, CPU
};

bool LooksLikeGguf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string(magic, 4) == "GGUF";
}

}  // namespace

StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& path,
                                                       const LoadOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) return absl::NotFoundError(absl::StrCat(path, ": no such file or folder"));
  if (options.dtype != torch::kFloat32 && options.dtype != torch::kBFloat16 &&
      options.dtype != torch::kFloat16)
    return absl::InvalidArgumentError(absl::StrCat("LoadOptions.dtype ", c10::toString(options.dtype),
                                                   " is not a floating compute type (f32, bf16, f16)"));
  if (options.device.is_cuda() && !torch::cuda::is_available())
    return absl::InvalidArgumentError("LoadOptions.device is CUDA but libtorch sees no CUDA device");
  if (!options.device.is_cpu() && !options.device.is_cuda())
    return absl::InvalidArgumentError(absl::StrCat("LoadOptions.device ", options.device.str(),
                                                   " is not supported (cpu or cuda)"));
  SetComputeThreads(options.threads);
  StatusOr<LoadedModel> loaded;
  if (fs::is_directory(path, ec)) {
    loaded = internal::LoadHfFolder(path, options);
  } else {
    const fs::path p(path);
    if (LooksLikeGguf(path)) {
      loaded = internal::LoadGgufModel(path, options);
    } else if (p.filename() == "config.json" || p.extension() == ".safetensors") {
      loaded = internal::LoadHfFolder(p.parent_path().string(), options);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": not a model (expected a .gguf file or a folder with config.json + safetensors)"));
    }
  }
  if (!loaded.ok()) return loaded.status();
  return std::unique_ptr<LlamaModel>(new LlamaModelImpl(std::move(loaded).value(), options));
}

}  // namespace polykv::model
