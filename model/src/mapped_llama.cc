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
// the rest dequantize row tiles of W into a scratch buffer and call CBLAS sgemm (OpenBLAS).
// Attention without a prefix and n > kMappedGemmRows (a long prefill) runs as sgemm per KV
// head and block of query rows; every other case on kernels::AttentionForward.
//
// Threads of the sgemm paths: the tiles (and the attention's KV head x row blocks) are
// independent tasks on the kernels' thread pool (kernels::ParallelTasks), each with its
// own scratch and its own single-threaded sgemm. OpenBLAS's threads stay off
// (UseOneBlasThread): an OpenMP OpenBLAS spinning at its barrier while our pool works, and
// the reverse, took ~60% of a 2-core prefill.
#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "llama_base.h"
#include "llama_internal.h"
#include "polykv/kernels/attention.h"
#include "polykv/kernels/cpu.h"
#include "polykv/kernels/matmul.h"
#include "polykv/kernels/ops.h"
#include "polykv/model/prefill.h"

namespace polykv::model::internal {
namespace {

// Rows of W dequantized per GEMM tile: tiles of about 1 MiB of f32 or less, of equal size (a
// multiple of 16 rows), at least two when W has 256 rows or more, so that two threads share
// each matrix (several matrices of the same activations form one job: LinearGemmMany).
// Independent of the thread count: a product's result never depends on the threads that
// computed it (each tile is one single-threaded sgemm).
int64_t TileRows(int64_t rows, int64_t cols) {
  const int64_t by_size = std::max<int64_t>(16, (int64_t{1} << 18) / cols);
  int64_t count = (rows + by_size - 1) / by_size;
  if (rows >= 256) count = std::max<int64_t>(count, 2);
  const int64_t per_tile = (rows + count - 1) / count;
  return std::min(rows, (per_tile + 15) / 16 * 16);
}

// Query rows per attention task of BlasAttention (with its KV head): a [G*rows][keys] score
// block of a few MiB, and several tasks per thread.
constexpr int64_t kAttentionRowBlock = 128;

// Makes the calling thread's CBLAS calls single-threaded; cheap after its first call on a
// thread. Our sgemms run one per task on the kernels' pool, so OpenBLAS's own threads would
// only compete with it. openblas_set_num_threads(1) sets OpenBLAS's count once for the
// process, but its OpenMP build (Debian's libopenblas0-openmp 0.3.21, measured) resets that
// count to the calling thread's omp_get_max_threads() at each call from a thread whose OpenMP
// default differs, so every thread that calls sgemm also sets its own OpenMP default team
// size to 1 (nothing of ours uses OpenMP; libtorch, in tests, sets its own). Both functions
// are found with dlsym: another CBLAS (or a pthreads OpenBLAS, without the second) links and
// runs unchanged. The OPENBLAS_NUM_THREADS / OMP_NUM_THREADS variables would not do: libgomp
// and OpenBLAS read them in their constructors, before main(), and a user's setting of them
// is overridden here for these products only in effect (single-threaded either way).
void UseOneBlasThread() {
  thread_local bool done = false;
  if (done) return;
  done = true;
  using SetFn = void (*)(int);
  static const SetFn openblas_set =
      reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  static const SetFn omp_set = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  static std::once_flag once;
  std::call_once(once, [] {
    if (openblas_set != nullptr) openblas_set(1);
  });
  if (omp_set != nullptr) omp_set(1);
}

// Scratch buffers of the tasks of one ParallelTasks job: at most ComputeThreads() tasks run
// at once, and each leases one buffer (f32) for its duration. Kept between jobs; Clear()
// frees them.
class ScratchPool {
 public:
  // A buffer of at least `floats` floats, leased until the Lease is destroyed. Errors:
  // kResourceExhausted when it cannot be allocated.
  class Lease {
   public:
    Lease(ScratchPool& pool, int64_t floats) : pool_(pool) {
      {
        std::lock_guard<std::mutex> l(pool_.mu_);
        for (slot_ = 0; slot_ < pool_.bufs_.size() && pool_.busy_[slot_]; ++slot_) {
        }
        if (slot_ == pool_.bufs_.size()) {
          pool_.bufs_.push_back(std::make_unique<std::vector<float>>());
          pool_.busy_.push_back(false);
        }
        pool_.busy_[slot_] = true;
        buf_ = pool_.bufs_[slot_].get();
      }
      try {
        if (static_cast<int64_t>(buf_->size()) < floats) buf_->resize(static_cast<size_t>(floats));
      } catch (const std::exception& e) {
        status_ = StatusFromException(e, "scratch");
      }
    }
    ~Lease() {
      std::lock_guard<std::mutex> l(pool_.mu_);
      pool_.busy_[slot_] = false;
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

    const Status& status() const { return status_; }
    float* data() { return buf_->data(); }

   private:
    ScratchPool& pool_;
    size_t slot_ = 0;
    std::vector<float>* buf_ = nullptr;
    Status status_;
  };

  // Frees every buffer; none may be leased.
  void Clear() {
    std::lock_guard<std::mutex> l(mu_);
    bufs_.clear();
    busy_.clear();
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<std::vector<float>>> bufs_;
  std::vector<bool> busy_;
};

// The first error of a job's tasks (one slot per task), or OK.
Status FirstError(const std::vector<Status>& errors) {
  for (const Status& s : errors) POLYKV_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

class MappedLlama final : public LlamaBase {
 public:
  MappedLlama(LoadedModel m, const LoadOptions& options)
      : LlamaBase(m.config, std::move(m.tokenizer), std::move(m.fingerprint)),
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
  std::string weights_layout() const override { return w_.layout; }

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
    const int64_t cap = cache.capacity, len = cache.length, hd = config_.head_dim;
    std::vector<std::vector<float>> k, v;
    try {
      for (int l = 0; l < config_.layers; ++l) {
        // [kv_heads][length][head_dim], contiguous: the raw pool layout.
        for (auto [from, to] : {std::pair{&cache.k[l], &k}, std::pair{&cache.v[l], &v}}) {
          if (cap == len) {
            to->push_back(std::move(*from));
          } else {
            std::vector<float> packed(static_cast<size_t>(config_.kv_heads * len * hd));
            for (int64_t h = 0; h < config_.kv_heads; ++h)
              std::copy_n(from->begin() + h * cap * hd, len * hd, packed.begin() + h * len * hd);
            to->push_back(std::move(packed));
          }
        }
      }
    } catch (const std::exception& e) {
      return StatusFromException(e, "FreezeAsPrefix");
    }
    POLYKV_ASSIGN_OR_RETURN(std::shared_ptr<KvPrefix> prefix,
                            MakeRawPrefix(config_, len, std::move(k), std::move(v)));
    std::vector<int32_t> tokens = std::move(cache.tokens);
    cache = KvCache();
    return NewCacheWithPrefix(std::move(prefix), std::move(tokens), capacity);
  }

 private:
  // One product of LinearGemmMany: y (row stride y_stride) = x m^T.
  struct GemmOutput {
    const MappedMatrix* m = nullptr;
    float* y = nullptr;
    int64_t y_stride = 0;
  };

  // y[n][rows] (row stride y_stride) = x[n][cols] W^T.
  // `before` (null: none): a row-wise step the product's input needs first (a row's RMSNorm
  // or SiLU gate), run for every row r < n inside the kernels' row quantization tasks where
  // the product runs on the kernels (no parallel region of its own), else before the GEMM.
  using RowPrologue = std::function<void(int64_t)>;
  Status Linear(const MappedMatrix& m, const float* x, int64_t n, float* y, int64_t y_stride,
                const RowPrologue* before = nullptr) {
    if (OnKernels(m, n)) {
      kernels::MatMulOptions o;
      o.row_prologue = before;
      return kernels::MatMul(m.w, x, n, m.w.cols, y, y_stride, o);
    }
    if (before != nullptr) ForEachRow(n, *before);
    return LinearGemm(m, x, n, y, y_stride);
  }

  // fn(r) for rows r in [0, n): on the kernels' threads from 4 rows on, else in turn.
  static void ForEachRow(int64_t n, const RowPrologue& fn) {
    if (n < 4) {
      for (int64_t r = 0; r < n; ++r) fn(r);
      return;
    }
    kernels::ParallelTasks(n, fn);
  }

  // Quantized kernels for up to quantized_rows_ rows, and for any number of rows where the
  // AMX-INT8 tiles take the weight's type (faster than dequantized tiles + GEMM at every
  // size); quantized_rows_ == 0 keeps every product in f32.
  bool OnKernels(const MappedMatrix& m, int64_t n) const {
    return quantized_rows_ > 0 && (n <= quantized_rows_ || kernels::MatMulUsesTiles(m.w.type, n));
  }

  // Dequantized row tiles of W times x with CBLAS sgemm: y[:, r0:r0+tr] = x W_tile^T.
  Status LinearGemm(const MappedMatrix& m, const float* x, int64_t n, float* y, int64_t y_stride) {
    const GemmOutput o{&m, y, y_stride};
    return LinearGemmMany(absl::MakeConstSpan(&o, 1), x, n);
  }

  // LinearGemm of several matrices over the same x [n][cols] in one job: every row tile of
  // every matrix is a task on the kernels' pool, which dequantizes the tile into its own
  // scratch and runs its own single-threaded sgemm (tiles write disjoint columns of y).
  Status LinearGemmMany(absl::Span<const GemmOutput> outs, const float* x, int64_t n) {
    struct Tile {
      const GemmOutput* out;
      int64_t r0, tr;
    };
    std::vector<Tile> tiles;
    for (const GemmOutput& o : outs) {
      const int64_t rows = o.m->w.rows, tile = TileRows(rows, o.m->w.cols);
      for (int64_t r0 = 0; r0 < rows; r0 += tile)
        tiles.push_back(Tile{&o, r0, std::min(tile, rows - r0)});
    }
    std::vector<Status> errors(tiles.size());
    kernels::ParallelTasks(static_cast<int64_t>(tiles.size()), [&](int64_t t) {
      const Tile& tl = tiles[static_cast<size_t>(t)];
      const auto& w = tl.out->m->w;
      const int64_t cols = w.cols;
      ScratchPool::Lease s(scratch_, tl.tr * cols);
      Status& err = errors[static_cast<size_t>(t)];
      if (err = s.status(); !err.ok()) return;
      if (err = kernels::DequantizeRows(w, tl.r0, tl.r0 + tl.tr, s.data()); !err.ok()) return;
      UseOneBlasThread();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n),
                  static_cast<int>(tl.tr), static_cast<int>(cols), 1.f, x, static_cast<int>(cols),
                  s.data(), static_cast<int>(cols), 0.f, tl.out->y + tl.r0,
                  static_cast<int>(tl.out->y_stride));
    });
    return FirstError(errors);
  }

  // Several products of the same activations (q/k/v, gate/up).
  Status LinearShared(std::initializer_list<std::pair<const MappedMatrix*, float*>> outs,
                      const float* x, int64_t n, int64_t cols,
                      const RowPrologue* before = nullptr) {
    bool all_kernels = true;
    for (const auto& [m, y] : outs) all_kernels = all_kernels && OnKernels(*m, n);
    if (!all_kernels) {
      if (before != nullptr) ForEachRow(n, *before);
      GemmOutput g[4];
      size_t k = 0;
      bool all_gemm = true;
      for (const auto& [m, y] : outs) {
        all_gemm = all_gemm && !OnKernels(*m, n) && m->w.cols == cols;
        g[k++] = GemmOutput{m, y, m->w.rows};
      }
      // One job over every tile of every matrix (q/k/v, gate/up).
      if (all_gemm) return LinearGemmMany(absl::MakeConstSpan(g, k), x, n);
      for (const auto& [m, y] : outs) POLYKV_RETURN_IF_ERROR(Linear(*m, x, n, y, m->w.rows));
      return absl::OkStatus();
    }
    kernels::MatMulOutput o[4];
    size_t k = 0;
    for (const auto& [m, y] : outs) o[k++] = kernels::MatMulOutput{&m->w, y, m->w.rows};
    kernels::MatMulOptions opt;
    opt.row_prologue = before;
    return kernels::MatMulShared(absl::MakeConstSpan(o, k), x, n, cols, cols, opt);
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

  // Long prefill without a prefix: softmax(Q K^T / sqrt(d) + causal mask) V with CBLAS
  // sgemm (GQA). One task per KV head and block of up to kAttentionRowBlock query rows
  // [i0, i1), on the kernels' pool, with its own scratch: Qg [G*b][hd] gathered from
  // q [n][H][hd] (b = i1 - i0 rows of each of the head's G query heads), scores
  // [G*b][keys] (f32; keys = s0 + i1, the positions any of these rows sees; masked where
  // key position > query position), a row softmax, then [G*b][hd] = P V scattered back into
  // out [n][H][hd]. Tasks write disjoint parts of out.
  Status BlasAttention(const KvCache& cache, int l, int64_t s0, int64_t n, const float* q,
                       float* out) {
    const int64_t H = config_.heads, KV = config_.kv_heads, G = H / KV, hd = config_.head_dim;
    const int64_t cap = cache.capacity;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
    const int64_t blocks = (n + kAttentionRowBlock - 1) / kAttentionRowBlock;
    std::vector<Status> errors(static_cast<size_t>(blocks * KV));
    // Task t: the last row blocks (the most keys) first.
    kernels::ParallelTasks(blocks * KV, [&](int64_t t) {
      const int64_t kvh = t % KV, blk = blocks - 1 - t / KV;
      const int64_t i0 = blk * kAttentionRowBlock, i1 = std::min(n, i0 + kAttentionRowBlock);
      const int64_t b = i1 - i0, keys = s0 + i1;
      ScratchPool::Lease s(scratch_, G * b * (2 * hd + keys));
      if (!s.status().ok()) {
        errors[static_cast<size_t>(t)] = s.status();
        return;
      }
      float* qg = s.data();
      float* og = qg + G * b * hd;
      float* sc = og + G * b * hd;
      for (int64_t g = 0; g < G; ++g)
        for (int64_t i = 0; i < b; ++i)
          std::memcpy(qg + (g * b + i) * hd, q + ((i0 + i) * H + kvh * G + g) * hd,
                      sizeof(float) * hd);
      const float* K = cache.k[static_cast<size_t>(l)].data() + kvh * cap * hd;
      const float* V = cache.v[static_cast<size_t>(l)].data() + kvh * cap * hd;
      UseOneBlasThread();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(G * b),
                  static_cast<int>(keys), static_cast<int>(hd), scale, qg, static_cast<int>(hd), K,
                  static_cast<int>(hd), 0.f, sc, static_cast<int>(keys));
      for (int64_t r = 0; r < G * b; ++r) {
        float* row = sc + r * keys;
        const int64_t visible = s0 + i0 + (r % b) + 1;  // keys 0 .. s0 + i
        float mx = row[0];
        for (int64_t j = 1; j < visible; ++j) mx = std::max(mx, row[j]);
        float sum = 0;
        for (int64_t j = 0; j < visible; ++j) {
          row[j] = std::exp(row[j] - mx);
          sum += row[j];
        }
        const float inv = 1.f / sum;
        for (int64_t j = 0; j < visible; ++j) row[j] *= inv;
        std::fill(row + visible, row + keys, 0.f);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(G * b),
                  static_cast<int>(hd), static_cast<int>(keys), 1.f, sc, static_cast<int>(keys), V,
                  static_cast<int>(hd), 0.f, og, static_cast<int>(hd));
      for (int64_t g = 0; g < G; ++g)
        for (int64_t i = 0; i < b; ++i)
          std::memcpy(out + ((i0 + i) * H + kvh * G + g) * hd, og + (g * b + i) * hd,
                      sizeof(float) * hd);
    });
    return FirstError(errors);
  }

  // h = RMSNorm(x); q, k, v = h W^T (+ biases), GGUF Q/K rows de-interleaved: n rows.
  Status ProjectQkv(const MappedLayer& lw, const float* x, int64_t n, float* h, float* q, float* k,
                    float* v) {
    const int64_t H = config_.heads, KV = config_.kv_heads, hd = config_.head_dim,
                  D = config_.hidden;
    const RowPrologue norm = [&](int64_t r) {
      kernels::RmsNormRows(x + r * D, lw.attn_norm, 1, D, config_.rms_eps, h + r * D);
    };
    POLYKV_RETURN_IF_ERROR(LinearShared({{&lw.q, q}, {&lw.k, k}, {&lw.v, v}}, h, n, D, &norm));
    AddBias(q, n, H * hd, lw.bq);  // in the rows' own (possibly interleaved) order
    AddBias(k, n, KV * hd, lw.bk);
    AddBias(v, n, KV * hd, lw.bv);
    if (lw.q.interleaved_heads > 0) Deinterleave(q, n, static_cast<int32_t>(H));
    if (lw.k.interleaved_heads > 0) Deinterleave(k, n, static_cast<int32_t>(KV));
    return absl::OkStatus();
  }

  // After attention: x += att Wo^T (+ bias); x += (silu(h Wg^T) * h Wu^T) Wd^T with
  // h = RMSNorm(x): n rows; t, g, u are scratch.
  Status FinishLayer(const MappedLayer& lw, const float* att, int64_t n, float* x, float* h,
                     float* t, float* g, float* u) {
    const int64_t D = config_.hidden, F = config_.ffn;
    POLYKV_RETURN_IF_ERROR(Linear(lw.o, att, n, t, D));
    // Row r before the gate/up product: x += t (+ bias), h = RMSNorm(x); before the down
    // product: g = silu(g) * u.
    const RowPrologue residual_norm = [&](int64_t r) {
      float* xr = x + r * D;
      float* tr = t + r * D;
      AddBias(tr, 1, D, lw.bo);
      for (int64_t i = 0; i < D; ++i) xr[i] += tr[i];
      kernels::RmsNormRows(xr, lw.ffn_norm, 1, D, config_.rms_eps, h + r * D);
    };
    POLYKV_RETURN_IF_ERROR(LinearShared({{&lw.gate, g}, {&lw.up, u}}, h, n, D, &residual_norm));
    const RowPrologue gate = [&](int64_t r) {
      kernels::SiluMul(g + r * F, u + r * F, F, g + r * F);
    };
    POLYKV_RETURN_IF_ERROR(Linear(lw.down, g, n, t, D, &gate));
    for (int64_t i = 0; i < n * D; ++i) x[i] += t[i];
    return absl::OkStatus();
  }

  // RoPE on row i's q and k (cos/sin of its position), then k, v stored at suffix slot `slot`
  // of `cache`'s layer l.
  void RopeAndStore(KvCache& cache, int l, int64_t slot, float* q_row, float* k_row,
                    const float* v_row, const float* cos_row, const float* sin_row) {
    const int64_t H = config_.heads, KV = config_.kv_heads, hd = config_.head_dim;
    const int64_t cap = cache.capacity;
    kernels::RopeHeads(q_row, static_cast<int32_t>(H), static_cast<int32_t>(hd), cos_row, sin_row);
    kernels::RopeHeads(k_row, static_cast<int32_t>(KV), static_cast<int32_t>(hd), cos_row, sin_row);
    float* ck = cache.k[static_cast<size_t>(l)].data();
    float* cv = cache.v[static_cast<size_t>(l)].data();
    for (int64_t kvh = 0; kvh < KV; ++kvh) {
      std::memcpy(ck + (kvh * cap + slot) * hd, k_row + kvh * hd, sizeof(float) * hd);
      std::memcpy(cv + (kvh * cap + slot) * hd, v_row + kvh * hd, sizeof(float) * hd);
    }
  }

  // The per-row buffers of a forward over `rows` rows (grown, never shrunk): [rows][D] x, h,
  // t; [rows][H*hd] q, att; [rows][KV*hd] k, v; [rows][F] g, u; [rows][hd] RoPE cos, sin.
  struct Workspace {
    float *x, *h, *t, *q, *att, *k, *v, *g, *u, *cosb, *sinb;
  };
  StatusOr<Workspace> GrowWorkspace(int64_t rows, const char* context) {
    const int64_t H = config_.heads, KV = config_.kv_heads, hd = config_.head_dim,
                  D = config_.hidden, F = config_.ffn;
    auto grow = [rows](std::vector<float>& b, int64_t per_row) {
      if (static_cast<int64_t>(b.size()) < rows * per_row)
        b.resize(static_cast<size_t>(rows * per_row));
      return b.data();
    };
    try {
      return Workspace{grow(x_, D),        grow(h_, D),       grow(t_, D),       grow(q_, H * hd),
                       grow(att_, H * hd), grow(k_, KV * hd), grow(v_, KV * hd), grow(g_, F),
                       grow(u_, F),        grow(cos_, hd),    grow(sin_, hd)};
    } catch (const std::exception& e) {
      return StatusFromException(e, absl::StrCat(context, " (workspace)"));
    }
  }

  // Layer l's attention of every session's rows (kernels::AttentionForwardBatch): one pass
  // over the shared prefix (null: none) for all of them, each merged with its own tail.
  Status AttendBatch(const KvPrefix* prefix, int l,
                     absl::Span<const kernels::AttentionSession> sessions) const {
    kernels::BatchAttentionArgs ba;
    ba.prefix = prefix ? &prefix->view : nullptr;
    if (prefix) ba.prefix_tail = prefix->tail;
    ba.layer = l;
    ba.heads = static_cast<int32_t>(config_.heads);
    ba.kv_heads = static_cast<int32_t>(config_.kv_heads);
    ba.head_dim = static_cast<int32_t>(config_.head_dim);
    ba.sessions = sessions;
    return kernels::AttentionForwardBatch(ba);
  }

  // Session i's cache checked against the model, with room for `more` positions; errors
  // name the session.
  Status CheckSessionCache(KvCache& c, int64_t i, int64_t more) const {
    Status st = CheckCache(c);
    if (st.ok()) st = EnsureCapacity(c, c.suffix_length() + more);
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat("session ", i, ": ", st.message()));
    return absl::OkStatus();
  }

  // Batched decode (LlamaModel::ForwardBatch): S sessions, one token each, one shared
  // prefix. Row i of every workspace is session i.
  StatusOr<Logits> ForwardBatchImpl(absl::Span<KvCache* const> caches,
                                    absl::Span<const int32_t> tokens) override {
    const int64_t S = static_cast<int64_t>(caches.size());
    POLYKV_RETURN_IF_ERROR(CheckTokens(tokens));
    for (int64_t i = 0; i < S; ++i) POLYKV_RETURN_IF_ERROR(CheckSessionCache(*caches[i], i, 1));
    const int64_t H = config_.heads, KV = config_.kv_heads, hd = config_.head_dim,
                  D = config_.hidden;
    POLYKV_ASSIGN_OR_RETURN(const Workspace ws, GrowWorkspace(S, "ForwardBatch"));
    const auto [x, h, t, q, att, k, v, g, u, cosb, sinb] = ws;
    for (int64_t i = 0; i < S; ++i) {
      POLYKV_RETURN_IF_ERROR(
          kernels::DequantizeRows(w_.embed.w, tokens[i], tokens[i] + 1, x + i * D));
      RopeTables(caches[i]->length, 1, cosb + i * hd, sinb + i * hd);
    }
    const std::shared_ptr<const KvPrefix>& prefix = caches[0]->prefix;
    std::vector<kernels::AttentionSession> sessions(static_cast<size_t>(S));
    for (int l = 0; l < config_.layers; ++l) {
      const MappedLayer& lw = w_.layers[static_cast<size_t>(l)];
      POLYKV_RETURN_IF_ERROR(ProjectQkv(lw, x, S, h, q, k, v));
      // Session i's RoPE and K/V store (its own cache: the sessions run on the threads).
      const RowPrologue store = [&](int64_t i) {
        KvCache& c = *caches[i];
        const int64_t slot = c.suffix_length();
        RopeAndStore(c, l, slot, q + i * H * hd, k + i * KV * hd, v + i * KV * hd, cosb + i * hd,
                     sinb + i * hd);
        kernels::AttentionSession& a = sessions[static_cast<size_t>(i)];
        a.k_suffix = c.k[static_cast<size_t>(l)].data();
        a.v_suffix = c.v[static_cast<size_t>(l)].data();
        a.suffix_capacity = c.capacity;
        a.suffix_length = slot + 1;
        a.n = 1;
        a.q = q + i * H * hd;
        a.out = att + i * H * hd;
      };
      ForEachRow(S, store);
      POLYKV_RETURN_IF_ERROR(AttendBatch(prefix.get(), l, sessions));
      POLYKV_RETURN_IF_ERROR(FinishLayer(lw, att, S, x, h, t, g, u));
    }
    // The step read the shared prefix: its results count only while the prefix is valid.
    if (prefix && prefix->check) POLYKV_RETURN_IF_ERROR(prefix->check());
    POLYKV_ASSIGN_OR_RETURN(Logits logits, NewLogits(S, config_.vocab, "ForwardBatch (logits)"));
    kernels::RmsNormRows(x, w_.norm, S, D, config_.rms_eps, h);
    POLYKV_RETURN_IF_ERROR(Linear(w_.lm_head, h, S, logits.values.data(), config_.vocab));
    for (int64_t i = 0; i < S; ++i) {  // commit: every session holds its new token
      caches[i]->length += 1;
      caches[i]->tokens.push_back(tokens[i]);
    }
    return logits;
  }

  // Batched prompts (LlamaModel::ForwardPrompts): S sessions' prompts, one shared prefix,
  // as one forward over their rows concatenated: session i's rows are [off[i], off[i+1]) of
  // every workspace. Attention per session as ForwardImpl would run it for that prompt: on
  // BlasAttention without a prefix past kMappedGemmRows rows, else in the one
  // AttentionForwardBatch pass.
  StatusOr<Logits> ForwardPromptsImpl(
      absl::Span<KvCache* const> caches,
      absl::Span<const absl::Span<const int32_t>> prompts) override {
    const int64_t S = static_cast<int64_t>(caches.size());
    std::vector<int64_t> off(static_cast<size_t>(S) + 1, 0);
    for (int64_t i = 0; i < S; ++i) {
      POLYKV_RETURN_IF_ERROR(CheckTokens(prompts[i]));
      const int64_t n = static_cast<int64_t>(prompts[i].size());
      POLYKV_RETURN_IF_ERROR(CheckSessionCache(*caches[i], i, n));
      off[i + 1] = off[i] + n;
    }
    const int64_t R = off[S];
    const int64_t H = config_.heads, KV = config_.kv_heads, hd = config_.head_dim,
                  D = config_.hidden;
    POLYKV_ASSIGN_OR_RETURN(const Workspace ws, GrowWorkspace(R, "ForwardPrompts"));
    const auto [x, h, t, q, att, k, v, g, u, cosb, sinb] = ws;
    for (int64_t i = 0; i < S; ++i) {
      for (int64_t r = off[i]; r < off[i + 1]; ++r) {
        const int32_t id = prompts[i][static_cast<size_t>(r - off[i])];
        POLYKV_RETURN_IF_ERROR(kernels::DequantizeRows(w_.embed.w, id, id + 1, x + r * D));
      }
      RopeTables(caches[i]->length, off[i + 1] - off[i], cosb + off[i] * hd, sinb + off[i] * hd);
    }
    const std::shared_ptr<const KvPrefix>& prefix = caches[0]->prefix;
    std::vector<kernels::AttentionSession> sessions(static_cast<size_t>(S));
    for (int l = 0; l < config_.layers; ++l) {
      const MappedLayer& lw = w_.layers[static_cast<size_t>(l)];
      POLYKV_RETURN_IF_ERROR(ProjectQkv(lw, x, R, h, q, k, v));
      for (int64_t i = 0; i < S; ++i) {
        KvCache& c = *caches[i];
        const int64_t s0 = c.suffix_length(), n = off[i + 1] - off[i];
        for (int64_t r = off[i]; r < off[i + 1]; ++r)
          RopeAndStore(c, l, s0 + (r - off[i]), q + r * H * hd, k + r * KV * hd, v + r * KV * hd,
                       cosb + r * hd, sinb + r * hd);
        kernels::AttentionSession& a = sessions[static_cast<size_t>(i)];
        a = kernels::AttentionSession();
        if (!prefix && n > kMappedGemmRows) {  // as ForwardImpl: sits out of the batched pass
          POLYKV_RETURN_IF_ERROR(
              BlasAttention(c, l, s0, n, q + off[i] * H * hd, att + off[i] * H * hd));
          continue;
        }
        a.k_suffix = c.k[static_cast<size_t>(l)].data();
        a.v_suffix = c.v[static_cast<size_t>(l)].data();
        a.suffix_capacity = c.capacity;
        a.suffix_length = s0 + n;
        a.n = n;
        a.q = q + off[i] * H * hd;
        a.out = att + off[i] * H * hd;
      }
      POLYKV_RETURN_IF_ERROR(AttendBatch(prefix.get(), l, sessions));
      POLYKV_RETURN_IF_ERROR(FinishLayer(lw, att, R, x, h, t, g, u));
    }
    // The forward read the shared prefix: its results count only while the prefix is valid.
    if (prefix && prefix->check) POLYKV_RETURN_IF_ERROR(prefix->check());
    POLYKV_ASSIGN_OR_RETURN(Logits logits, NewLogits(S, config_.vocab, "ForwardPrompts (logits)"));
    for (int64_t i = 0; i < S; ++i)  // each session's last row, packed into t
      std::memcpy(t + i * D, x + (off[i + 1] - 1) * D, sizeof(float) * D);
    kernels::RmsNormRows(t, w_.norm, S, D, config_.rms_eps, h);
    POLYKV_RETURN_IF_ERROR(Linear(w_.lm_head, h, S, logits.values.data(), config_.vocab));
    for (int64_t i = 0; i < S; ++i) {  // commit: every session holds its prompt
      caches[i]->length += off[i + 1] - off[i];
      caches[i]->tokens.insert(caches[i]->tokens.end(), prompts[i].begin(), prompts[i].end());
    }
    if (R > kMappedGemmRows) ReleaseWorkspace();  // a long forward's buffers are not kept
    return logits;
  }

  StatusOr<Logits> ForwardImpl(absl::Span<const int32_t> tokens, KvCache& cache,
                               int64_t logits_from) override {
    const int64_t n = static_cast<int64_t>(tokens.size());
    if (n == 0) return absl::InvalidArgumentError("Forward: empty token list");
    POLYKV_RETURN_IF_ERROR(CheckTokens(tokens));
    POLYKV_RETURN_IF_ERROR(CheckCache(cache));
    const int64_t P = cache.prefix_length(), past = cache.length, s0 = past - P;
    const int64_t H = config_.heads, KV = config_.kv_heads, hd = config_.head_dim,
                  D = config_.hidden, F = config_.ffn;
    POLYKV_RETURN_IF_ERROR(EnsureCapacity(cache, s0 + n));
    const int64_t cap = cache.capacity;
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
      POLYKV_RETURN_IF_ERROR(ProjectQkv(lw, x, n, h, q, k, v));
      for (int64_t i = 0; i < n; ++i)
        RopeAndStore(cache, l, s0 + i, q + i * H * hd, k + i * KV * hd, v + i * KV * hd,
                     cosb + i * hd, sinb + i * hd);
      float* ck = cache.k[static_cast<size_t>(l)].data();
      float* cv = cache.v[static_cast<size_t>(l)].data();
      if (!cache.prefix && n > kMappedGemmRows) {
        POLYKV_RETURN_IF_ERROR(BlasAttention(cache, l, s0, n, q, att));
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
      POLYKV_RETURN_IF_ERROR(FinishLayer(lw, att, n, x, h, t, g, u));
    }
    // The step read the shared prefix: its results count only while the prefix is valid.
    if (cache.prefix && cache.prefix->check) POLYKV_RETURN_IF_ERROR(cache.prefix->check());
    cache.length = past + n;
    cache.tokens.insert(cache.tokens.end(), tokens.begin(), tokens.end());

    const int64_t m = n - logits_from;
    POLYKV_ASSIGN_OR_RETURN(Logits logits, NewLogits(m, config_.vocab, "Forward (logits)"));
    if (m > 0) {
      kernels::RmsNormRows(x + logits_from * D, w_.norm, m, D, config_.rms_eps, h);
      POLYKV_RETURN_IF_ERROR(Linear(w_.lm_head, h, m, logits.values.data(), config_.vocab));
    }
    if (n > kMappedGemmRows) ReleaseWorkspace();  // a long prefill's buffers are not kept
    return logits;
  }

  void ReleaseWorkspace() {
    for (std::vector<float>* b : {&x_, &h_, &t_, &q_, &att_, &k_, &v_, &g_, &u_, &cos_, &sin_})
      std::vector<float>().swap(*b);
    scratch_.Clear();
  }

  MappedWeights w_;
  int64_t quantized_rows_;
  int64_t bytes_per_token_ = 0;
  std::vector<float> x_, h_, t_, q_, att_, k_, v_, g_, u_, cos_, sin_;
  ScratchPool scratch_;  // the sgemm paths' per-task buffers
};

}  // namespace

std::unique_ptr<LlamaModel> MakeMappedLlama(LoadedModel m, const LoadOptions& options) {
  return std::unique_ptr<LlamaModel>(new MappedLlama(std::move(m), options));
}

}  // namespace polykv::model::internal
