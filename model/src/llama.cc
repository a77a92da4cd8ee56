// The part every runtime shares (LlamaBase: cache checks, Prefill, Generate, Perplexity),
// sampling and scoring on plain f32 spans, and LlamaModel::Load.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "absl/strings/str_cat.h"
#include "llama_base.h"
#include "llama_internal.h"
#include "packed_weights.h"
#include "polykv/enum_names.h"
#include "polykv/kernels/sampling.h"

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

// ForwardPrompts one session at a time: row i of the result = forward_last(i), session i's
// last-row logits ([1][vocab]); on an error the sessions already run are rolled back (length
// and tokens) and the error names the session.
StatusOr<Logits> PromptsOneByOne(absl::Span<KvCache* const> caches, int32_t vocab,
                                 const std::function<StatusOr<Logits>(size_t)>& forward_last) {
  std::vector<int64_t> lengths;
  for (const KvCache* c : caches) lengths.push_back(c->length);
  POLYKV_ASSIGN_OR_RETURN(
      Logits out, NewLogits(static_cast<int64_t>(caches.size()), vocab, "ForwardPrompts (logits)"));
  for (size_t i = 0; i < caches.size(); ++i) {
    StatusOr<Logits> one = forward_last(i);
    if (one.ok() && one->values.size() != static_cast<size_t>(vocab))
      one = absl::InternalError("Forward returned logits of another shape");
    if (!one.ok()) {
      for (size_t j = 0; j < i; ++j) {  // roll back the sessions already run
        caches[j]->length = lengths[j];
        caches[j]->tokens.resize(static_cast<size_t>(lengths[j]));
      }
      return absl::Status(one.status().code(),
                          absl::StrCat("session ", i, ": ", one.status().message()));
    }
    std::copy(one->values.begin(), one->values.end(),
              out.values.begin() + static_cast<std::ptrdiff_t>(i) * vocab);
  }
  return out;
}

LlamaBase::LlamaBase(ModelConfig config, std::unique_ptr<Tokenizer> tokenizer,
                     std::string fingerprint)
    : config_(std::move(config)),
      tokenizer_(std::move(tokenizer)),
      fingerprint_(std::move(fingerprint)) {
  const int64_t half = config_.head_dim / 2;
  inv_freq_.assign(static_cast<size_t>(half), 0.0);
  double* f = inv_freq_.data();
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
  const size_t per_layer =
      static_cast<size_t>(int64_t{config_.kv_heads} * capacity * config_.head_dim);
  c.k.assign(static_cast<size_t>(config_.layers), std::vector<float>(per_layer, 0.f));
  c.v.assign(static_cast<size_t>(config_.layers), std::vector<float>(per_layer, 0.f));
  c.capacity = capacity;
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

StatusOr<Logits> LlamaBase::Step(absl::Span<const int32_t> tokens, KvCache& cache,
                                 int64_t logits_from) {
  POLYKV_RETURN_IF_ERROR(CheckWindow(cache.length, static_cast<int64_t>(tokens.size())));
  return ForwardImpl(tokens, cache, logits_from);
}

StatusOr<Logits> LlamaBase::Forward(absl::Span<const int32_t> tokens, KvCache& cache,
                                    bool all_logits) {
  if (tokens.empty()) return absl::InvalidArgumentError("Forward: empty token list");
  return Step(tokens, cache, all_logits ? 0 : static_cast<int64_t>(tokens.size()) - 1);
}

Status LlamaBase::CheckBatch(absl::Span<KvCache* const> caches, absl::Span<const int64_t> rows,
                             const char* what) const {
  if (caches.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": empty batch"));
  if (caches.size() != rows.size())
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", caches.size(), " caches but ", rows.size(), " inputs"));
  for (size_t i = 0; i < caches.size(); ++i) {
    if (caches[i] == nullptr)
      return absl::InvalidArgumentError(absl::StrCat(what, ": cache ", i, " is null"));
    if (caches[i]->prefix != caches[0]->prefix)
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": cache ", i, " has a different shared prefix than cache 0 (a batch shares one)"));
    for (size_t j = 0; j < i; ++j)
      if (caches[j] == caches[i])
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": caches ", j, " and ", i, " are the same cache"));
    if (rows[i] <= 0)
      return absl::InvalidArgumentError(absl::StrCat(what, ": input ", i, " is empty"));
    POLYKV_RETURN_IF_ERROR(CheckWindow(caches[i]->length, rows[i]));
  }
  return absl::OkStatus();
}

StatusOr<Logits> LlamaBase::ForwardBatch(absl::Span<KvCache* const> caches,
                                         absl::Span<const int32_t> tokens) {
  if (caches.size() != tokens.size())
    return absl::InvalidArgumentError(
        absl::StrCat("ForwardBatch: ", caches.size(), " caches but ", tokens.size(), " tokens"));
  POLYKV_RETURN_IF_ERROR(
      CheckBatch(caches, std::vector<int64_t>(caches.size(), 1), "ForwardBatch"));
  return ForwardBatchImpl(caches, tokens);
}

StatusOr<Logits> LlamaBase::ForwardPrompts(absl::Span<KvCache* const> caches,
                                           absl::Span<const absl::Span<const int32_t>> prompts) {
  std::vector<int64_t> rows;
  for (const absl::Span<const int32_t>& p : prompts) rows.push_back(static_cast<int64_t>(p.size()));
  POLYKV_RETURN_IF_ERROR(CheckBatch(caches, rows, "ForwardPrompts"));
  return ForwardPromptsImpl(caches, prompts);
}

StatusOr<Logits> LlamaBase::ForwardPromptsImpl(
    absl::Span<KvCache* const> caches, absl::Span<const absl::Span<const int32_t>> prompts) {
  return PromptsOneByOne(caches, config_.vocab, [&](size_t i) {
    return ForwardImpl(prompts[i], *caches[i], static_cast<int64_t>(prompts[i].size()) - 1);
  });
}

StatusOr<Logits> LlamaBase::ForwardBatchImpl(absl::Span<KvCache* const> caches,
                                             absl::Span<const int32_t> tokens) {
  const size_t s = caches.size();
  Logits out;
  out.rows = static_cast<int64_t>(s);
  out.vocab = config_.vocab;
  std::vector<int64_t> lengths(s);
  for (size_t i = 0; i < s; ++i) lengths[i] = caches[i]->length;
  const auto rollback = [&](size_t done) {
    for (size_t i = 0; i < done; ++i) {
      caches[i]->length = lengths[i];
      caches[i]->tokens.resize(static_cast<size_t>(lengths[i]));
    }
  };
  try {
    out.values.resize(s * static_cast<size_t>(config_.vocab));
  } catch (const std::exception& e) {
    return StatusFromException(e, "ForwardBatch (logits)");
  }
  for (size_t i = 0; i < s; ++i) {
    StatusOr<Logits> one = ForwardImpl(tokens.subspan(i, 1), *caches[i], 0);
    if (!one.ok()) {
      rollback(i);
      return absl::Status(one.status().code(),
                          absl::StrCat("session ", i, ": ", one.status().message()));
    }
    std::copy(one->values.begin(), one->values.end(),
              out.values.begin() + static_cast<std::ptrdiff_t>(i) * config_.vocab);
  }
  return out;
}

StatusOr<PrefillResult> LlamaBase::Prefill(absl::Span<const int32_t> tokens, int64_t chunk,
                                           const std::function<void(int64_t, int64_t)>& progress) {
  if (tokens.empty()) return absl::InvalidArgumentError("Prefill: empty token list");
  if (chunk <= 0)
    return absl::InvalidArgumentError(absl::StrCat("Prefill: chunk must be > 0, got ", chunk));
  const int64_t n = static_cast<int64_t>(tokens.size());
  POLYKV_RETURN_IF_ERROR(CheckWindow(0, n));  // before any work
  KvCache cache;
  try {
    cache = NewCache(n);
  } catch (const std::exception& e) {
    return StatusFromException(e, "Prefill (KV cache)");
  }
  Logits logits;
  for (int64_t done = 0; done < n;) {
    const int64_t m = std::min(chunk, n - done);
    POLYKV_ASSIGN_OR_RETURN(logits, Step(tokens.subspan(done, m), cache, m - 1));
    done += m;
    if (progress) progress(done, n);
  }
  PrefillResult r;
  r.tokens = n;
  r.k = std::move(cache.k);  // capacity == n: already [kv_heads][n][head_dim]
  r.v = std::move(cache.v);
  r.last_logits = std::move(logits.values);
  return r;
}

StatusOr<GenerateResult> LlamaBase::Generate(KvCache& cache, absl::Span<const int32_t> prompt,
                                             const SamplingOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  POLYKV_RETURN_IF_ERROR(CheckSamplingOptions(options, "Generate: "));
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
  StatusOr<Logits> first = Step(feed, cache, static_cast<int64_t>(feed.size()) - 1);
  if (!first.ok()) {
    if (recompute) {  // leave the cache as it was
      cache.tokens.push_back(feed[0]);
      cache.length += 1;
    }
    return first.status();
  }
  Logits logits = std::move(first).value();
  for (int32_t i = 0; i < options.max_new_tokens; ++i) {
    POLYKV_ASSIGN_OR_RETURN(int32_t tok, SampleToken(logits.row(0), options, rng));
    if (i == 0) r.first_token_ms = MsSince(t0);
    if (options.stop_at_eos && IsEos(tok)) break;
    r.tokens.push_back(tok);
    if (options.on_token && !options.on_token(tok)) break;  // stopped by the caller
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
    int64_t prev_e = 0;
    for (int64_t b = 0;; b += stride) {
      const int64_t e = std::min(b + context, n - 1);
      const int64_t s = std::max(prev_e, b);
      KvCache cache = NewCache(e - b);
      POLYKV_ASSIGN_OR_RETURN(Logits logits,
                              Step(tokens.subspan(b, e - b), cache, s - b));  // [e-s][vocab]
      for (int64_t p = s; p < e; ++p) nll -= LogProb(logits.row(p - s), tokens[p + 1]);
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
  const int64_t cap = c.capacity;
  if (cap < 0) return absl::InvalidArgumentError(absl::StrCat("KvCache: capacity ", cap, " < 0"));
  const size_t want = static_cast<size_t>(int64_t{config_.kv_heads} * cap * config_.head_dim);
  for (int l = 0; l < config_.layers; ++l) {
    for (const std::vector<float>* t : {&c.k[l], &c.v[l]}) {
      if (t->size() != want)
        return absl::InvalidArgumentError(
            absl::StrCat("KvCache: layer ", l, " buffer holds ", t->size(),
                         " floats, [kv_heads=", config_.kv_heads, "][capacity=", cap,
                         "][head_dim=", config_.head_dim, "] needs ", want));
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

Status LlamaBase::EnsureCapacity(KvCache& c, int64_t needed) const {
  try {
    if (c.k.empty()) {
      KvCache fresh = NewCache(needed);
      c.k = std::move(fresh.k);
      c.v = std::move(fresh.v);
      c.capacity = fresh.capacity;
      return absl::OkStatus();
    }
    const int64_t cap = c.capacity;
    if (cap >= needed) return absl::OkStatus();
    const int64_t new_cap = std::max(needed, 2 * cap);
    KvCache bigger = NewCache(new_cap);
    const int64_t held = c.suffix_length(), hd = config_.head_dim;
    for (int l = 0; l < config_.layers; ++l) {
      for (int64_t h = 0; h < config_.kv_heads; ++h) {
        std::copy_n(c.k[l].begin() + h * cap * hd, held * hd,
                    bigger.k[l].begin() + h * new_cap * hd);
        std::copy_n(c.v[l].begin() + h * cap * hd, held * hd,
                    bigger.v[l].begin() + h * new_cap * hd);
      }
    }
    c.k = std::move(bigger.k);
    c.v = std::move(bigger.v);
    c.capacity = new_cap;
  } catch (const std::exception& e) {
    return StatusFromException(e, "KV cache");
  }
  return absl::OkStatus();
}

void LlamaBase::RopeTables(int64_t past, int64_t n, float* cos, float* sin) const {
  const int64_t half = config_.head_dim / 2;
  const double* f = inv_freq_.data();
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

bool LooksLikeGguf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string(magic, 4) == "GGUF";
}

}  // namespace
}  // namespace internal

StatusOr<int32_t> Argmax(absl::Span<const float> logits) {
  if (logits.empty()) return absl::InvalidArgumentError("Argmax: empty logits");
  // The first index of the largest value by `>` (a NaN never wins; one at index 0 stays):
  // the largest value over 16 independent lanes (a loop the compiler vectorizes), then its
  // first index, instead of one compare-and-branch chain over the vocabulary.
  const float* x = logits.data();
  const size_t n = logits.size();
  float best = x[0];
  if (best != best) return 0;  // NaN at index 0: nothing is larger
  // 4 vectors of 4 lanes (GCC/Clang vector extensions: SSE on x86-64, NEON elsewhere).
  using V4 = float __attribute__((vector_size(16)));
  constexpr size_t kLanes = 16;
  V4 lane[4];
  for (V4& v : lane) v = V4{best, best, best, best};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t k = 0; k < 4; ++k) {
      V4 v;
      std::memcpy(&v, x + i + 4 * k, sizeof(v));
      lane[k] = v > lane[k] ? v : lane[k];
    }
  }
  for (const V4& v : lane)
    for (size_t k = 0; k < 4; ++k) best = v[k] > best ? v[k] : best;
  for (; i < n; ++i) best = x[i] > best ? x[i] : best;
  for (i = 0; i < n; ++i)
    if (x[i] == best) break;  // strict > above: the lowest index of the largest value wins
  return static_cast<int32_t>(i);
}

StatusOr<int32_t> SampleToken(absl::Span<const float> logits, const SamplingOptions& o,
                              std::mt19937_64& rng) {
  if (o.greedy) return Argmax(logits);
  if (logits.empty()) return absl::InvalidArgumentError("sampling: empty logits");
  return kernels::SampleTopPUnchecked(logits.data(), static_cast<int64_t>(logits.size()),
                                      o.temperature, o.top_p, internal::Uniform01(rng));
}

double LogProb(absl::Span<const float> row, int32_t target) {
  float mx = row[0];
  for (size_t v = 1; v < row.size(); ++v) mx = std::max(mx, row[v]);
  double sum = 0;
  for (size_t v = 0; v < row.size(); ++v) sum += std::exp(row[v] - mx);
  return static_cast<double>(row[static_cast<size_t>(target)] - mx) - std::log(sum);
}

const char* WeightStorageName(WeightStorage w) {
  static constexpr EnumName<WeightStorage> kNames[] = {
      {WeightStorage::kAuto, "auto"},
      {WeightStorage::kMapped, "mapped"},
      {WeightStorage::kCopy, "copy"},
  };
  return EnumToName(kNames, w);
}

const char* RopeScalingName(RopeScalingType t) {
  static constexpr EnumName<RopeScalingType> kNames[] = {
      {RopeScalingType::kNone, "none"},
      {RopeScalingType::kLinear, "linear"},
      {RopeScalingType::kLlama3, "llama3"},
      {RopeScalingType::kYarn, "yarn"},
      {RopeScalingType::kFreqFactors, "freq_factors"},
  };
  return EnumToName(kNames, t);
}

StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& path,
                                                       const LoadOptions& options_in) {
  LoadOptions options = options_in;
  if (options.weights == WeightStorage::kCopy)
    return absl::InvalidArgumentError(
        "LoadOptions.weights = copy is the libtorch reference runtime: load it with "
        "polykv::model::LoadTorchReference (polykv/model/torch_reference.h, target "
        "polykv_model_torch)");
  options.weights = WeightStorage::kMapped;
  SetComputeThreads(options.threads);
  POLYKV_ASSIGN_OR_RETURN(internal::LoadedModel loaded, internal::LoadModelFiles(path, options));
  if (options.packed_weights) {
    // Not fatal: without the shared file the blocks are read as they lie.
    StatusOr<std::string> layout = internal::AttachPackedWeights(*loaded.mapped, loaded.fingerprint,
                                                                 internal::PackedWeightsDir());
    loaded.mapped->layout =
        layout.ok() ? *layout : absl::StrCat("blocks: ", layout.status().message());
  }
  return internal::MakeMappedLlama(std::move(loaded), options);
}

StatusOr<Logits> LlamaModel::ForwardPrompts(absl::Span<KvCache* const> caches,
                                            absl::Span<const absl::Span<const int32_t>> prompts) {
  if (caches.empty()) return absl::InvalidArgumentError("ForwardPrompts: empty batch");
  if (caches.size() != prompts.size())
    return absl::InvalidArgumentError(absl::StrCat("ForwardPrompts: ", caches.size(),
                                                   " caches but ", prompts.size(), " prompts"));
  for (size_t i = 0; i < caches.size(); ++i) {
    if (caches[i] == nullptr)
      return absl::InvalidArgumentError(absl::StrCat("ForwardPrompts: cache ", i, " is null"));
    for (size_t j = 0; j < i; ++j)
      if (caches[j] == caches[i])
        return absl::InvalidArgumentError(
            absl::StrCat("ForwardPrompts: caches ", j, " and ", i, " are the same cache"));
  }
  return internal::PromptsOneByOne(
      caches, config().vocab, [&](size_t i) { return Forward(prompts[i], *caches[i], false); });
}

namespace internal {

StatusOr<LoadedModel> LoadModelFiles(const std::string& path, const LoadOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec))
    return absl::NotFoundError(absl::StrCat(path, ": no such file or folder"));
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
  return loaded;
}

}  // namespace internal

}  // namespace polykv::model
