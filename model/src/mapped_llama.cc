// The mapped runtime: a Llama forward pass in plain C++ over the model file's own tensor
// blocks (kernels/matmul.h) and split attention over [shared prefix | private suffix]
// (kernels/attention.h). No weight is copied: the file stays mapped read-only, shared by
// every process on the host through the page cache.
//
// Per forward of n rows:
//   x = embedding rows (dequantized one row each)
//   per layer: h = RMSNorm(x); q, k, v = h W^T (+ biases; one shared pass over the
//     activations); GGUF Llama Q/K outputs de-interleaved per head (llama.cpp stores those
//     rows, and their biases, for interleaved RoPE); RoPE (HF rotate_half); k, v appended to
//     the private suffix; attention; x += o Wo^T (+ bias); h = RMSNorm(x);
//     x += (silu(h Wg^T) * h Wu^T) Wd^T
//   logits = RMSNorm(x) Wout^T for the requested rows.
// Matrix products of n <= LoadOptions::quantized_rows rows run on the quantized kernels, and
// so do longer ones over weight types the AMX-INT8 tiles take (on CPUs that have them);
// the rest dequantize row tiles of W into a scratch buffer and call libtorch's GEMM.
// Attention without a prefix and n > kMappedGemmRows (a long prefill) runs as libtorch
// batched GEMMs; every other case on kernels::AttentionForward.
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "llama_base.h"
#include "llama_internal.h"
#include "polykv/kernels/attention.h"
#include "polykv/kernels/matmul.h"
#include "polykv/kernels/ops.h"

namespace polykv::model::internal {
namespace {

// Rows of W dequantized per GEMM tile: about 1 MiB of f32.
int64_t TileRows(int64_t cols) { return std::max<int64_t>(16, (int64_t{1} << 18) / cols); }

class MappedLlama final : public LlamaBase {
 public:
  MappedLlama(LoadedModel m, const LoadOptions& options)
      : LlamaBase(m.config, std::move(m.tokenizer), std::move(m.fingerprint), torch::kCPU,
                  torch::kFloat32),
        w_(std::move(*m.mapped)),
        quantized_rows_(std::max<int64_t>(0, options.quantized_rows)) {
    auto add = [&](const MappedMatrix& mm) { bytes_per_token_ += mm.w.bytes(); };
    for (const MappedLayer& l : w_.layers)
      for (const MappedMatrix* mm : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) add(*mm);
    add(w_.lm_head);
    bytes_per_token_ += static_cast<int64_t>(config_.hidden) * 4 * (2 * config_.layers + 1);
    const int64_t bias_floats =
        (config_.qkv_bias ? int64_t{config_.heads + 2 * config_.kv_heads} * config_.head_dim : 0) +
        (config_.o_bias ? config_.hidden : 0);
    bytes_per_token_ += bias_floats * 4 * config_.layers;
  }

  WeightStorage weight_storage() const override { return WeightStorage::kMapped; }
  int64_t WeightBytesPerToken() const override { return bytes_per_token_; }

  StatusOr<KvCache> NewCacheWithPrefix(std::shared_ptr<const KvPrefix> prefix,
                                       std::vector<int32_t> tokens,
                                       int64_t capacity) const override {
    if (!prefix) return absl::InvalidArgumentError("NewCacheWithPrefix: null prefix");
    for (size_t s = 0; s <= prefix->tail.size(); ++s) {
      const kernels::PrefixView& v = s == 0 ? prefix->view : prefix->tail[s - 1];
      if (static_cast<int>(v.layers.size()) != config_.layers || v.kv_heads != config_.kv_heads ||
          v.head_dim != config_.head_dim)
        return absl::InvalidArgumentError(absl::StrCat(
            "prefix", s == 0 ? std::string() : absl::StrCat(" segment ", s), " shape: ",
            v.layers.size(), " layers, ", v.kv_heads, " KV heads, head_dim ", v.head_dim,
            "; the model has ", config_.layers, ", ", config_.kv_heads, ", ", config_.head_dim));
      POLYKV_RETURN_IF_ERROR(kernels::ValidatePrefixView(v));
    }
    const int64_t prefix_tokens = prefix->tokens();
    if (static_cast<int64_t>(tokens.size()) != prefix_tokens)
      return absl::InvalidArgumentError(absl::StrCat("prefix holds ", prefix_tokens,
                                                     " positions but ", tokens.size(),
                                                     " token ids were given"));
    POLYKV_RETURN_IF_ERROR(CheckTokens(tokens));
    POLYKV_RETURN_IF_ERROR(CheckWindow(0, prefix_tokens));
    KvCache c;
    try {
      c = NewCache(capacity);
    } catch (const std::exception& e) {
      return StatusFromException(e, "NewCacheWithPrefix");
    }
    c.prefix = std::move(prefix);
    c.length = static_cast<int64_t>(tokens.size());
    c.tokens = std::move(tokens);
    return c;
  }

  StatusOr<KvCache> FreezeAsPrefix(KvCache&& cache, int64_t capacity) const override {
    if (cache.prefix)
      return absl::InvalidArgumentError("FreezeAsPrefix: the cache already has a prefix");
    POLYKV_RETURN_IF_ERROR(CheckCache(cache));
    if (cache.length == 0) return absl::InvalidArgumentError("FreezeAsPrefix: empty cache");
    struct Owner {
      std::vector<torch::Tensor> k, v;
    };
    auto owner = std::make_shared<Owner>();
    auto prefix = std::make_shared<KvPrefix>();
    prefix->view.kv_heads = config_.kv_heads;
    prefix->view.head_dim = config_.head_dim;
    prefix->view.tokens = cache.length;
    prefix->view.codec = kernels::PrefixCodec::kRaw;
    prefix->view.raw_dtype = kernels::DType::kF32;
    try {
      for (int l = 0; l < config_.layers; ++l) {
        // [kv_heads][length][head_dim], contiguous: the raw pool layout.
        torch::Tensor k = cache.k[l].narrow(1, 0, cache.length);
        torch::Tensor v = cache.v[l].narrow(1, 0, cache.length);
        owner->k.push_back(cache.capacity() == cache.length ? cache.k[l] : k.contiguous());
        owner->v.push_back(cache.capacity() == cache.length ? cache.v[l] : v.contiguous());
        prefix->view.layers.push_back(
            kernels::PrefixLayer{owner->k.back().data_ptr<float>(), nullptr,
                                 owner->v.back().data_ptr<float>(), nullptr});
      }
    } catch (const std::exception& e) {
      return StatusFromException(e, "FreezeAsPrefix");
    }
    prefix->owner = owner;
    std::vector<int32_t> tokens = std::move(cache.tokens);
    cache = KvCache();
    return NewCacheWithPrefix(std::move(prefix), std::move(tokens), capacity);
  }

 private:
  // y[n][rows] (row stride y_stride) = x[n][cols] W^T.
  Status Linear(const MappedMatrix& m, const float* x, int64_t n, float* y, int64_t y_stride) {
    if (OnKernels(m, n)) return kernels::MatMul(m.w, x, n, m.w.cols, y, y_stride);
    return LinearGemm(m, x, n, y, y_stride);
  }

  // Quantized kernels for up to quantized_rows_ rows, and for any number of rows where the
  // AMX-INT8 tiles take the weight's type (faster than dequantized tiles + GEMM at every
  // size); quantized_rows_ == 0 keeps every product in f32.
  bool OnKernels(const MappedMatrix& m, int64_t n) const {
    return quantized_rows_ > 0 && (n <= quantized_rows_ || kernels::MatMulUsesTiles(m.w.type, n));
  }

  // Dequantized row tiles of W times x with libtorch's GEMM.
  Status LinearGemm(const MappedMatrix& m, const float* x, int64_t n, float* y, int64_t y_stride) {
    const int64_t rows = m.w.rows, cols = m.w.cols;
    const int64_t tile = std::min(rows, TileRows(cols));
    if (static_cast<int64_t>(tile_.size()) < tile * cols)
      tile_.resize(static_cast<size_t>(tile * cols));
    torch::Tensor xt = torch::from_blob(const_cast<float*>(x), {n, cols}, torch::kFloat32);
    for (int64_t r0 = 0; r0 < rows; r0 += tile) {
      const int64_t tr = std::min(tile, rows - r0);
      std::atomic<bool> failed{false};
      at::parallel_for(0, tr, 16, [&](int64_t b, int64_t e) {
        if (!kernels::DequantizeRows(m.w, r0 + b, r0 + e, tile_.data() + b * cols).ok())
          failed.store(true);
      });
      if (failed.load())
        return absl::InternalError("LinearGemm: dequantizing a weight tile failed");
      torch::Tensor wt = torch::from_blob(tile_.data(), {tr, cols}, torch::kFloat32);
      torch::Tensor out = torch::from_blob(y + r0, {n, tr}, {y_stride, 1}, torch::kFloat32);
      torch::mm_out(out, xt, wt.t());
    }
    return absl::OkStatus();
  }

  // Several products of the same activations (q/k/v, gate/up).
  Status LinearShared(std::initializer_list<std::pair<const MappedMatrix*, float*>> outs,
                      const float* x, int64_t n, int64_t cols) {
    bool all_kernels = true;
    for (const auto& [m, y] : outs) all_kernels = all_kernels && OnKernels(*m, n);
    if (!all_kernels) {
      for (const auto& [m, y] : outs) POLYKV_RETURN_IF_ERROR(Linear(*m, x, n, y, m->w.rows));
      return absl::OkStatus();
    }
    kernels::MatMulOutput o[4];
    size_t k = 0;
    for (const auto& [m, y] : outs) o[k++] = kernels::MatMulOutput{&m->w, y, m->w.rows};
    return kernels::MatMulShared(absl::MakeConstSpan(o, k), x, n, cols, cols);
  }

  // y[i][j] += b[j] for i < n, j < width (a projection's bias, f32).
  static void AddBias(float* y, int64_t n, int64_t width, const float* b) {
    if (b == nullptr) return;
    for (int64_t i = 0; i < n; ++i) {
      float* row = y + i * width;
      for (int64_t j = 0; j < width; ++j) row[j] += b[j];
    }
  }

  // GGUF Q/K rows: row 2j + s of a head holds HF row s * hd/2 + j.
  void Deinterleave(float* y, int64_t n, int32_t heads) {
    const int hd = config_.head_dim, half = hd / 2;
    float tmp[1024];
    for (int64_t i = 0; i < n * heads; ++i) {
      float* v = y + i * hd;
      for (int j = 0; j < half; ++j) {
        tmp[j] = v[2 * j];
        tmp[j + half] = v[2 * j + 1];
      }
      std::memcpy(v, tmp, sizeof(float) * hd);
    }
  }

  // Long prefill without a prefix: softmax(Q K^T / sqrt(d) + causal mask) V as libtorch
  // batched GEMMs over the suffix (the copy runtime's formulation).
  Status TorchAttention(const KvCache& cache, int l, int64_t s0, int64_t n, const float* q,
                        float* out) {
    try {
      const int64_t H = config_.heads, KV = config_.kv_heads, G = H / KV, hd = config_.head_dim;
      const int64_t total = s0 + n;
      torch::Tensor qt = torch::from_blob(const_cast<float*>(q), {n, H, hd}, torch::kFloat32)
                             .transpose(0, 1)
                             .reshape({KV, G * n, hd});
      torch::Tensor K = cache.k[l].narrow(1, 0, total), V = cache.v[l].narrow(1, 0, total);
      torch::Tensor scores =
          torch::bmm(qt, K.transpose(1, 2)).mul_(1.0 / std::sqrt(static_cast<double>(hd)));
      if (n > 1) {
        torch::Tensor mask = torch::ones({n, total}, torch::kBool).triu(s0 + 1);
        scores.view({KV, G, n, total}).masked_fill_(mask, -std::numeric_limits<float>::infinity());
      }
      torch::Tensor p = torch::softmax(scores, -1);
      torch::Tensor o = torch::bmm(p, V).view({H, n, hd}).transpose(0, 1).reshape({n, H * hd});
      std::memcpy(out, o.contiguous().data_ptr<float>(), sizeof(float) * n * H * hd);
    } catch (const std::exception& e) {
      return StatusFromException(e, "attention");
    }
    return absl::OkStatus();
  }

  StatusOr<torch::Tensor> ForwardImpl(absl::Span<const int32_t> tokens, KvCache& cache,
                                      int64_t logits_from) override {
    const int64_t n = static_cast<int64_t>(tokens.size());
    if (n == 0) return absl::InvalidArgumentError("Forward: empty token list");
    POLYKV_RETURN_IF_ERROR(CheckTokens(tokens));
    POLYKV_RETURN_IF_ERROR(CheckCache(cache));
    const int64_t P = cache.prefix_length(), past = cache.length, s0 = past - P;
    const int64_t H = config_.heads, KV = config_.kv_heads, hd = config_.head_dim,
                  D = config_.hidden, F = config_.ffn;
    try {
      EnsureCapacity(cache, s0 + n);
    } catch (const std::exception& e) {
      return StatusFromException(e, "Forward (KV cache)");
    }
    const int64_t cap = cache.capacity();
    // Workspace: [n][D] x, h, t; [n][H*hd] q, att; [n][KV*hd] k, v; [n][F] g, u; rope.
    auto grow = [n](std::vector<float>& b, int64_t per_row) {
      if (static_cast<int64_t>(b.size()) < n * per_row) b.resize(static_cast<size_t>(n * per_row));
      return b.data();
    };
    float* x = grow(x_, D);
    float* h = grow(h_, D);
    float* t = grow(t_, D);
    float* q = grow(q_, H * hd);
    float* att = grow(att_, H * hd);
    float* k = grow(k_, KV * hd);
    float* v = grow(v_, KV * hd);
    float* g = grow(g_, F);
    float* u = grow(u_, F);
    float* cosb = grow(cos_, hd);
    float* sinb = grow(sin_, hd);

    for (int64_t i = 0; i < n; ++i)
      POLYKV_RETURN_IF_ERROR(
          kernels::DequantizeRows(w_.embed.w, tokens[i], tokens[i] + 1, x + i * D));
    RopeTables(past, n, cosb, sinb);

    for (int l = 0; l < config_.layers; ++l) {
      const MappedLayer& lw = w_.layers[static_cast<size_t>(l)];
      kernels::RmsNormRows(x, lw.attn_norm, n, D, config_.rms_eps, h);
      POLYKV_RETURN_IF_ERROR(LinearShared({{&lw.q, q}, {&lw.k, k}, {&lw.v, v}}, h, n, D));
      AddBias(q, n, H * hd, lw.bq);  // in the rows' own (possibly interleaved) order
      AddBias(k, n, KV * hd, lw.bk);
      AddBias(v, n, KV * hd, lw.bv);
      if (lw.q.interleaved_heads > 0) Deinterleave(q, n, static_cast<int32_t>(H));
      if (lw.k.interleaved_heads > 0) Deinterleave(k, n, static_cast<int32_t>(KV));
      float* ck = cache.k[l].data_ptr<float>();
      float* cv = cache.v[l].data_ptr<float>();
      for (int64_t i = 0; i < n; ++i) {
        kernels::RopeHeads(q + i * H * hd, static_cast<int32_t>(H), static_cast<int32_t>(hd),
                           cosb + i * hd, sinb + i * hd);
        kernels::RopeHeads(k + i * KV * hd, static_cast<int32_t>(KV), static_cast<int32_t>(hd),
                           cosb + i * hd, sinb + i * hd);
        for (int64_t kvh = 0; kvh < KV; ++kvh) {
          std::memcpy(ck + (kvh * cap + s0 + i) * hd, k + (i * KV + kvh) * hd, sizeof(float) * hd);
          std::memcpy(cv + (kvh * cap + s0 + i) * hd, v + (i * KV + kvh) * hd, sizeof(float) * hd);
        }
      }
      if (!cache.prefix && n > kMappedGemmRows) {
        POLYKV_RETURN_IF_ERROR(TorchAttention(cache, l, s0, n, q, att));
      } else {
        kernels::AttentionArgs a;
        a.prefix = cache.prefix ? &cache.prefix->view : nullptr;
        if (cache.prefix) a.prefix_tail = cache.prefix->tail;
        a.layer = l;
        a.k_suffix = ck;
        a.v_suffix = cv;
        a.suffix_capacity = cap;
        a.suffix_length = s0 + n;
        a.n = n;
        a.heads = static_cast<int32_t>(H);
        a.kv_heads = static_cast<int32_t>(KV);
        a.head_dim = static_cast<int32_t>(hd);
        a.q = q;
        a.out = att;
        POLYKV_RETURN_IF_ERROR(kernels::AttentionForward(a));
      }
      POLYKV_RETURN_IF_ERROR(Linear(lw.o, att, n, t, D));
      AddBias(t, n, D, lw.bo);
      for (int64_t i = 0; i < n * D; ++i) x[i] += t[i];
      kernels::RmsNormRows(x, lw.ffn_norm, n, D, config_.rms_eps, h);
      POLYKV_RETURN_IF_ERROR(LinearShared({{&lw.gate, g}, {&lw.up, u}}, h, n, D));
      kernels::SiluMul(g, u, n * F, g);
      POLYKV_RETURN_IF_ERROR(Linear(lw.down, g, n, t, D));
      for (int64_t i = 0; i < n * D; ++i) x[i] += t[i];
    }
    // The step read the shared prefix: its results count only while the prefix is valid.
    if (cache.prefix && cache.prefix->check) POLYKV_RETURN_IF_ERROR(cache.prefix->check());
    cache.length = past + n;
    cache.tokens.insert(cache.tokens.end(), tokens.begin(), tokens.end());

    const int64_t m = n - logits_from;
    torch::Tensor logits;
    try {
      logits = torch::empty({m, config_.vocab}, torch::kFloat32);
    } catch (const std::exception& e) {
      return StatusFromException(e, "Forward (logits)");
    }
    if (m > 0) {
      kernels::RmsNormRows(x + logits_from * D, w_.norm, m, D, config_.rms_eps, h);
      POLYKV_RETURN_IF_ERROR(Linear(w_.lm_head, h, m, logits.data_ptr<float>(), config_.vocab));
    }
    if (n > kMappedGemmRows) ReleaseWorkspace();  // a long prefill's buffers are not kept
    return logits;
  }

  void ReleaseWorkspace() {
    for (std::vector<float>* b :
         {&x_, &h_, &t_, &q_, &att_, &k_, &v_, &g_, &u_, &cos_, &sin_, &tile_})
      std::vector<float>().swap(*b);
  }

  MappedWeights w_;
  int64_t quantized_rows_;
  int64_t bytes_per_token_ = 0;
  std::vector<float> x_, h_, t_, q_, att_, k_, v_, g_, u_, cos_, sin_, tile_;
};

}  // namespace

std::unique_ptr<LlamaModel> MakeMappedLlama(LoadedModel m, const LoadOptions& options) {
  return std::unique_ptr<LlamaModel>(new MappedLlama(std::move(m), options));
}

}  // namespace polykv::model::internal
