// The shared part of both runtimes (LlamaBase: cache checks, Prefill, Generate, Perplexity,
// sampling) and the libtorch copy runtime: RMSNorm, RoPE (HF rotate_half), grouped-query
// attention over a caller-owned KV cache, SwiGLU MLP, all as libtorch ops on private
// tensors of the compute dtype (the reference path, and the CUDA path).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "llama_base.h"
#include "llama_internal.h"

namespace polykv::model {
namespace internal {
namespace {

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// A uniform double in [0, 1) from the top 53 bits: the same on every platform (unlike
// std::uniform_real_distribution, whose algorithm is implementation-defined).
double Uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

}  // namespace

LlamaBase::LlamaBase(ModelConfig config, std::unique_ptr<Tokenizer> tokenizer,
                     std::string fingerprint, torch::Device device, torch::ScalarType dtype)
    : config_(std::move(config)),
      tokenizer_(std::move(tokenizer)),
      fingerprint_(std::move(fingerprint)),
      device_(device),
      dtype_(dtype) {
  const int64_t half = config_.head_dim / 2;
  inv_freq_ = torch::empty({half}, torch::kFloat64);
  auto* f = inv_freq_.data_ptr<double>();
  for (int64_t i = 0; i < half; ++i)
    f[i] = 1.0 / std::pow(static_cast<double>(config_.rope_theta),
                          static_cast<double>(2 * i) / config_.head_dim);
  ScaleRopeFrequencies(config_, f);
  if (config_.rope_scaling.type == RopeScalingType::kYarn)
    rope_attention_factor_ = config_.rope_scaling.attention_factor;
}

void ScaleRopeFrequencies(const ModelConfig& c, double* f) {
  const RopeScaling& rs = c.rope_scaling;
  const int64_t half = c.head_dim / 2;
  const double kPi = 3.14159265358979323846;
  switch (rs.type) {
    case RopeScalingType::kNone:
    case RopeScalingType::kLinear:  // applied to the positions (RopeTables)
      return;
    case RopeScalingType::kLlama3: {
      // HF _compute_llama3_parameters.
      const double orig = rs.original_max_positions;
      const double low_wavelen = orig / rs.low_freq_factor,
                   high_wavelen = orig / rs.high_freq_factor;
      for (int64_t j = 0; j < half; ++j) {
        const double wavelen = 2 * kPi / f[j];
        if (wavelen < high_wavelen) continue;
        if (wavelen > low_wavelen) {
          f[j] /= rs.factor;
        } else {
          const double smooth =
              (orig / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
          f[j] = (1 - smooth) * f[j] / rs.factor + smooth * f[j];
        }
      }
      return;
    }
    case RopeScalingType::kYarn: {
      // HF _compute_yarn_parameters (= llama.cpp's ggml_rope_yarn_corr_dims, ext_factor 1).
      const double d = c.head_dim, base = c.rope_theta, orig = rs.original_max_positions;
      const auto corr_dim = [&](double rotations) {
        return d * std::log(orig / (rotations * 2 * kPi)) / (2 * std::log(base));
      };
      double lo = corr_dim(rs.beta_fast), hi = corr_dim(rs.beta_slow);
      if (rs.truncate) {
        lo = std::floor(lo);
        hi = std::ceil(hi);
      }
      lo = std::max(lo, 0.0);
      hi = std::min(hi, d - 1);
      if (lo == hi) hi += 0.001;
      for (int64_t j = 0; j < half; ++j) {
        const double ramp = std::clamp((static_cast<double>(j) - lo) / (hi - lo), 0.0, 1.0);
        f[j] = f[j] / rs.factor * ramp + f[j] * (1 - ramp);
      }
      return;
    }
    case RopeScalingType::kFreqFactors:
      for (int64_t j = 0; j < half; ++j) f[j] /= rs.freq_factors[static_cast<size_t>(j)];
      return;
  }
}

KvCache LlamaBase::NewCache(int64_t capacity) const {
  KvCache c;
  capacity = std::max<int64_t>(capacity, 0);
  const auto opts = torch::TensorOptions().dtype(dtype_).device(device_);
  for (int l = 0; l < config_.layers; ++l) {
    c.k.push_back(torch::zeros({config_.kv_heads, capacity, config_.head_dim}, opts));
    c.v.push_back(torch::zeros({config_.kv_heads, capacity, config_.head_dim}, opts));
  }
  return c;
}

Status LlamaBase::CheckWindow(int64_t past, int64_t n) const {
  const int64_t w = config_.sliding_window;
  if (w <= 0 || past + n <= w) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat(
      "this ", config_.architecture, " model uses sliding-window attention over ", w,
      " positions, which PolyKV does not implement: it computes full attention, the same "
      "only while a sequence holds at most ",
      w, " positions, and this step would reach ", past + n, " (", past, " cached + ", n,
      " new); keep document and prompt within ", w, " tokens"));
}

StatusOr<torch::Tensor> LlamaBase::Step(absl::Span<const int32_t> tokens, KvCache& cache,
                                        int64_t logits_from) {
  POLYKV_RETURN_IF_ERROR(CheckWindow(cache.length, static_cast<int64_t>(tokens.size())));
  return ForwardImpl(tokens, cache, logits_from);
}

StatusOr<torch::Tensor> LlamaBase::Forward(absl::Span<const int32_t> tokens, KvCache& cache,
                                           bool all_logits) {
  if (tokens.empty()) return absl::InvalidArgumentError("Forward: empty token list");
  return Step(tokens, cache, all_logits ? 0 : static_cast<int64_t>(tokens.size()) - 1);
}

StatusOr<PrefillResult> LlamaBase::Prefill(absl::Span<const int32_t> tokens, int64_t chunk,
                                           const std::function<void(int64_t, int64_t)>& progress) {
  if (tokens.empty()) return absl::InvalidArgumentError("Prefill: empty token list");
  if (chunk <= 0)
    return absl::InvalidArgumentError(absl::StrCat("Prefill: chunk must be > 0, got ", chunk));
  const int64_t n = static_cast<int64_t>(tokens.size());
  POLYKV_RETURN_IF_ERROR(CheckWindow(0, n));  // before any work
  KvCache cache = NewCache(n);
  torch::Tensor logits;
  for (int64_t done = 0; done < n;) {
    const int64_t m = std::min(chunk, n - done);
    POLYKV_ASSIGN_OR_RETURN(logits, Step(tokens.subspan(done, m), cache, m - 1));
    done += m;
    if (progress) progress(done, n);
  }
  PrefillResult r;
  r.k = std::move(cache.k);
  r.v = std::move(cache.v);
  r.last_logits = logits[0];
  return r;
}

StatusOr<GenerateResult> LlamaBase::Generate(KvCache& cache, absl::Span<const int32_t> prompt,
                                             const SamplingOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  if (options.max_new_tokens < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("Generate: max_new_tokens must be >= 0, got ", options.max_new_tokens));
  if (!options.greedy) {
    if (!(options.temperature > 0) || !std::isfinite(options.temperature))
      return absl::InvalidArgumentError(
          absl::StrCat("Generate: temperature must be > 0, got ", options.temperature));
    if (!(options.top_p > 0 && options.top_p <= 1))
      return absl::InvalidArgumentError(
          absl::StrCat("Generate: top_p must be in (0, 1], got ", options.top_p));
  }
  std::vector<int32_t> feed(prompt.begin(), prompt.end());
  const bool recompute = feed.empty();
  if (recompute) {
    if (cache.length == 0 || cache.tokens.empty())
      return absl::InvalidArgumentError(
          "Generate: empty prompt and an empty cache (nothing to continue)");
    POLYKV_RETURN_IF_ERROR(CheckCache(cache));
    if (cache.suffix_length() == 0)
      return absl::InvalidArgumentError(
          "Generate: empty prompt on a cache that holds only its shared prefix (the last "
          "prefix position cannot be recomputed privately): give a prompt");
    feed.push_back(cache.tokens.back());
    cache.tokens.pop_back();
    cache.length -= 1;
  }
  GenerateResult r;
  std::mt19937_64 rng(options.seed);
  StatusOr<torch::Tensor> first = Step(feed, cache, static_cast<int64_t>(feed.size()) - 1);
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
    POLYKV_ASSIGN_OR_RETURN(logits, Step(absl::MakeConstSpan(one, 1), cache, last ? 1 : 0));
  }
  r.total_ms = MsSince(t0);
  return r;
}

StatusOr<PerplexityResult> LlamaBase::Perplexity(absl::Span<const int32_t> tokens, int64_t context,
                                                 int64_t stride) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < 2)
    return absl::InvalidArgumentError(absl::StrCat("Perplexity: need >= 2 tokens, got ", n));
  if (context < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("Perplexity: context must be >= 1, got ", context));
  if (stride < 1 || stride > context)
    return absl::InvalidArgumentError(
        absl::StrCat("Perplexity: stride must be in [1, context=", context, "], got ", stride));
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
                              Step(tokens.subspan(b, e - b), cache, s - b));  // [e-s][vocab]
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

bool LlamaBase::IsEos(int32_t id) const {
  if (tokenizer_ != nullptr) return tokenizer_->IsEndOfGeneration(id);
  return id == config_.eos_id;
}

StatusOr<int32_t> LlamaBase::Sample(const torch::Tensor& logits, const SamplingOptions& o,
                                    std::mt19937_64& rng) const {
  try {
    if (o.greedy) return static_cast<int32_t>(logits.argmax().item<int64_t>());
    torch::Tensor p =
        torch::softmax(logits.to(torch::kCPU).to(torch::kFloat64) / o.temperature, -1).contiguous();
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

Status LlamaBase::CheckTokens(absl::Span<const int32_t> tokens) const {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= config_.vocab)
      return absl::InvalidArgumentError(absl::StrCat("Forward: token id ", tokens[i], " at index ",
                                                     i, " is outside the vocabulary [0, ",
                                                     config_.vocab, ")"));
  return absl::OkStatus();
}

Status LlamaBase::CheckCache(const KvCache& c) const {
  const int64_t p = c.prefix_length();
  if (c.prefix) {
    for (size_t s = 0; s <= c.prefix->tail.size(); ++s) {
      const kernels::PrefixView& v = s == 0 ? c.prefix->view : c.prefix->tail[s - 1];
      if (static_cast<int>(v.layers.size()) != config_.layers || v.kv_heads != config_.kv_heads ||
          v.head_dim != config_.head_dim)
        return absl::InvalidArgumentError(
            absl::StrCat("KvCache: prefix segment ", s, " of ", v.layers.size(), " layers, ",
                         v.kv_heads, " KV heads, head_dim ", v.head_dim, " for a model of ",
                         config_.layers, ", ", config_.kv_heads, ", ", config_.head_dim));
    }
  }
  if (c.k.empty() && c.v.empty()) {
    if (c.length != p)
      return absl::InvalidArgumentError("KvCache: no tensors but length != prefix length");
    if (static_cast<int64_t>(c.tokens.size()) != c.length)
      return absl::InvalidArgumentError(
          absl::StrCat("KvCache: tokens.size() ", c.tokens.size(), " != length ", c.length));
    return absl::OkStatus();
  }
  if (static_cast<int>(c.k.size()) != config_.layers ||
      static_cast<int>(c.v.size()) != config_.layers)
    return absl::InvalidArgumentError(absl::StrCat("KvCache: ", c.k.size(), " K and ", c.v.size(),
                                                   " V tensors for a model of ", config_.layers,
                                                   " layers"));
  const int64_t cap = c.k[0].defined() ? c.k[0].size(1) : -1;
  for (int l = 0; l < config_.layers; ++l) {
    for (const torch::Tensor* t : {&c.k[l], &c.v[l]}) {
      if (!t->defined() || t->dim() != 3 || t->size(0) != config_.kv_heads || t->size(1) != cap ||
          t->size(2) != config_.head_dim)
        return absl::InvalidArgumentError(
            absl::StrCat("KvCache: layer ", l, " tensor must be [kv_heads=", config_.kv_heads,
                         "][capacity=", cap, "][head_dim=", config_.head_dim, "]"));
      if (t->scalar_type() != dtype_ || t->device() != device_)
        return absl::InvalidArgumentError(
            absl::StrCat("KvCache: layer ", l, " tensor is ", t->toString(), ", model uses ",
                         c10::toString(dtype_), " on ", device_.str()));
      if (!t->is_contiguous())
        return absl::InvalidArgumentError(
            absl::StrCat("KvCache: layer ", l, " tensor is not contiguous"));
    }
  }
  if (c.length - p < 0 || c.length - p > cap)
    return absl::InvalidArgumentError(absl::StrCat("KvCache: length ", c.length, " outside [", p,
                                                   ", prefix + capacity=", p + cap, "]"));
  if (static_cast<int64_t>(c.tokens.size()) != c.length)
    return absl::InvalidArgumentError(
        absl::StrCat("KvCache: tokens.size() ", c.tokens.size(), " != length ", c.length));
  return absl::OkStatus();
}

void LlamaBase::EnsureCapacity(KvCache& c, int64_t needed) const {
  if (c.k.empty()) {
    KvCache fresh = NewCache(needed);
    c.k = std::move(fresh.k);
    c.v = std::move(fresh.v);
    return;
  }
  const int64_t cap = c.capacity();
  if (cap >= needed) return;
  const int64_t new_cap = std::max(needed, 2 * cap);
  KvCache bigger = NewCache(new_cap);
  const int64_t held = c.suffix_length();
  for (int l = 0; l < config_.layers; ++l) {
    bigger.k[l].narrow(1, 0, held).copy_(c.k[l].narrow(1, 0, held));
    bigger.v[l].narrow(1, 0, held).copy_(c.v[l].narrow(1, 0, held));
  }
  c.k = std::move(bigger.k);
  c.v = std::move(bigger.v);
}

void LlamaBase::RopeTables(int64_t past, int64_t n, float* cos, float* sin) const {
  const int64_t half = config_.head_dim / 2;
  const double* f = inv_freq_.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) {
    const double pos = static_cast<double>(past + i) / config_.rope_linear_scale;
    for (int64_t j = 0; j < half; ++j) {
      const double a = pos * f[j];
      // YaRN scales cos and sin (x 1.0 elsewhere: exact).
      const float c = static_cast<float>(std::cos(a) * rope_attention_factor_),
                  s = static_cast<float>(std::sin(a) * rope_attention_factor_);
      cos[i * 2 * half + j] = cos[i * 2 * half + j + half] = c;
      sin[i * 2 * half + j] = sin[i * 2 * half + j + half] = s;
    }
  }
}

namespace {

// The libtorch copy runtime.
class TorchLlama final : public LlamaBase {
 public:
  TorchLlama(LoadedModel m, const LoadOptions& options)
      : LlamaBase(m.config, std::move(m.tokenizer), std::move(m.fingerprint), options.device,
                  options.dtype),
        w_(std::move(m.weights)) {}

  StatusOr<KvCache> NewCacheWithPrefix(std::shared_ptr<const KvPrefix>, std::vector<int32_t>,
                                       int64_t) const override {
    return NoPrefix();
  }
  StatusOr<KvCache> FreezeAsPrefix(KvCache&&, int64_t) const override { return NoPrefix(); }
  WeightStorage weight_storage() const override { return WeightStorage::kCopy; }
  int64_t WeightBytesPerToken() const override {
    int64_t b = 0;
    auto add = [&](const torch::Tensor& t) { b += t.defined() ? t.numel() * t.element_size() : 0; };
    for (const auto& l : w_.layers) {
      for (const torch::Tensor* t :
           {&l.attn_norm, &l.wqkv, &l.bqkv, &l.wo, &l.bo, &l.ffn_norm, &l.wgate_up, &l.wdown})
        add(*t);
    }
    add(w_.norm);
    add(w_.lm_head);
    return b;
  }

 private:
  static Status NoPrefix() {
    return absl::FailedPreconditionError(
        "this model was loaded with a private copy of its weights (libtorch runtime), which "
        "cannot attend to a shared prefix in place: load it mapped (CPU) or decompress the pool");
  }

  torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& w) const {
    torch::Tensor xf = x.to(torch::kFloat32);
    torch::Tensor r = torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + config_.rms_eps);
    return (xf * r).to(dtype_) * w;
  }

  // x: [heads][n][head_dim]; cos/sin: [n][head_dim]. HF apply_rotary_pos_emb.
  static torch::Tensor Rope(const torch::Tensor& x, const torch::Tensor& cos,
                            const torch::Tensor& sin) {
    const int64_t half = x.size(-1) / 2;
    torch::Tensor rot = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
    return x * cos + rot * sin;
  }

  StatusOr<torch::Tensor> ForwardImpl(absl::Span<const int32_t> tokens, KvCache& cache,
                                      int64_t logits_from) override {
    const int64_t n = static_cast<int64_t>(tokens.size());
    if (n == 0) return absl::InvalidArgumentError("Forward: empty token list");
    POLYKV_RETURN_IF_ERROR(CheckTokens(tokens));
    if (cache.prefix) return NoPrefix();
    POLYKV_RETURN_IF_ERROR(CheckCache(cache));
    const int64_t past = cache.length, total = past + n;
    const int64_t H = config_.heads, KV = config_.kv_heads, hd = config_.head_dim, F = config_.ffn;
    try {
      torch::NoGradGuard no_grad;
      EnsureCapacity(cache, total);
      const auto dev = torch::TensorOptions().device(device_);
      torch::Tensor ids = torch::from_blob(const_cast<int32_t*>(tokens.data()), {n}, torch::kInt32)
                              .to(torch::kLong)
                              .to(device_);
      torch::Tensor x = w_.embed.index_select(0, ids);  // [n][hidden]

      torch::Tensor pos = torch::arange(past, total, torch::kFloat64) / config_.rope_linear_scale;
      torch::Tensor freqs = torch::outer(pos, inv_freq_);  // [n][hd/2]
      torch::Tensor emb = torch::cat({freqs, freqs}, -1);
      torch::Tensor cos = emb.cos(), sin = emb.sin();
      if (rope_attention_factor_ != 1) {  // YaRN: cos and sin scaled (HF attention_scaling)
        cos.mul_(rope_attention_factor_);
        sin.mul_(rope_attention_factor_);
      }
      cos = cos.to(dtype_).to(device_);
      sin = sin.to(dtype_).to(device_);
      torch::Tensor mask;  // [n][total], true where key position > query position
      if (n > 1) mask = torch::ones({n, total}, dev.dtype(torch::kBool)).triu(past + 1);
      const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
      const int64_t G = H / KV;

      for (int l = 0; l < config_.layers; ++l) {
        const LayerWeights& lw = w_.layers[l];
        torch::Tensor h = RmsNorm(x, lw.attn_norm);
        torch::Tensor qkv = lw.bqkv.defined() ? torch::linear(h, lw.wqkv, lw.bqkv)
                                              : torch::linear(h, lw.wqkv);  // [n][(H+2KV)*hd]
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
          scores.view({KV, G, n, total})
              .masked_fill_(mask, -std::numeric_limits<float>::infinity());
        torch::Tensor p = torch::softmax(scores, -1).to(dtype_);
        torch::Tensor o = torch::bmm(p, V).view({H, n, hd}).transpose(0, 1).reshape({n, H * hd});
        x = x + (lw.bo.defined() ? torch::linear(o, lw.wo, lw.bo) : torch::linear(o, lw.wo));
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

  LlamaWeights w_;
};

bool LooksLikeGguf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string(magic, 4) == "GGUF";
}

}  // namespace
}  // namespace internal

const char* WeightStorageName(WeightStorage w) {
  switch (w) {
    case WeightStorage::kAuto:
      return "auto";
    case WeightStorage::kMapped:
      return "mapped";
    case WeightStorage::kCopy:
      return "copy";
  }
  return "unknown";
}

const char* RopeScalingName(RopeScalingType t) {
  switch (t) {
    case RopeScalingType::kNone:
      return "none";
    case RopeScalingType::kLinear:
      return "linear";
    case RopeScalingType::kLlama3:
      return "llama3";
    case RopeScalingType::kYarn:
      return "yarn";
    case RopeScalingType::kFreqFactors:
      return "freq_factors";
  }
  return "unknown";
}

StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& path,
                                                       const LoadOptions& options_in) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec))
    return absl::NotFoundError(absl::StrCat(path, ": no such file or folder"));
  LoadOptions options = options_in;
  if (options.dtype != torch::kFloat32 && options.dtype != torch::kBFloat16 &&
      options.dtype != torch::kFloat16)
    return absl::InvalidArgumentError(
        absl::StrCat("LoadOptions.dtype ", c10::toString(options.dtype),
                     " is not a floating compute type (f32, bf16, f16)"));
  if (options.device.is_cuda() && !torch::cuda::is_available())
    return absl::InvalidArgumentError(
        "LoadOptions.device is CUDA but libtorch sees no CUDA device");
  if (!options.device.is_cpu() && !options.device.is_cuda())
    return absl::InvalidArgumentError(absl::StrCat("LoadOptions.device ", options.device.str(),
                                                   " is not supported (cpu or cuda)"));
  if (options.weights == WeightStorage::kAuto)
    options.weights = options.device.is_cpu() && options.dtype == torch::kFloat32
                          ? WeightStorage::kMapped
                          : WeightStorage::kCopy;
  if (options.weights == WeightStorage::kMapped &&
      (!options.device.is_cpu() || options.dtype != torch::kFloat32))
    return absl::InvalidArgumentError(
        "LoadOptions.weights = mapped needs the CPU device and the f32 compute dtype");
  SetComputeThreads(options.threads);
  StatusOr<internal::LoadedModel> loaded;
  if (fs::is_directory(path, ec)) {
    loaded = internal::LoadHfFolder(path, options);
  } else {
    const fs::path p(path);
    if (internal::LooksLikeGguf(path)) {
      loaded = internal::LoadGgufModel(path, options);
    } else if (p.filename() == "config.json" || p.extension() == ".safetensors") {
      loaded = internal::LoadHfFolder(p.parent_path().string(), options);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          path,
          ": not a model (expected a .gguf file or a folder with config.json + safetensors)"));
    }
  }
  if (!loaded.ok()) return loaded.status();
  if (options.weights == WeightStorage::kMapped)
    return internal::MakeMappedLlama(std::move(loaded).value(), options);
  return std::unique_ptr<LlamaModel>(new internal::TorchLlama(std::move(loaded).value(), options));
}

}  // namespace polykv::model
