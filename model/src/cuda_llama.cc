// The CUDA model runtime (polykv/model/cuda_llama.h): weights uploaded once, every op of a
// forward step on device_ops.h kernels, attention in place on a device prefix.
#include "polykv/model/cuda_llama.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "llama_base.h"
#include "llama_internal.h"
#include "polykv/kernels/attention.h"
#include "polykv/kernels/device_ops.h"
#include "polykv/kernels/dtype_convert.h"

#if defined(POLYKV_HAVE_CUDA)
#include "polykv/cuda_status.h"
#endif

namespace polykv::model {

int64_t GgufInterleavedSourceRow(int64_t r, int32_t head_dim) {
  const int64_t head = r / head_dim, i = r % head_dim, half = head_dim / 2;
  const int64_t s = i / half, j = i % half;
  return head * head_dim + 2 * j + s;
}

#if !defined(POLYKV_HAVE_CUDA)

struct CudaLlama::Impl {};
CudaLlama::CudaLlama(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaLlama::~CudaLlama() = default;
bool CudaRuntimeBuilt() { return false; }
StatusOr<std::unique_ptr<CudaLlama>> CudaLlama::Load(const std::string&, int, const LoadOptions&) {
  return absl::UnimplementedError(
      "the CUDA model runtime is not in this build (configure with POLYKV_ENABLE_CUDA=ON and "
      "nvcc)");
}
const ModelConfig& CudaLlama::config() const {
  static const ModelConfig kNone;
  return kNone;
}
const std::string& CudaLlama::fingerprint() const {
  static const std::string kNone;
  return kNone;
}
const Tokenizer* CudaLlama::tokenizer() const { return nullptr; }
uint64_t CudaLlama::weight_bytes() const { return 0; }
int CudaLlama::device() const { return -1; }
uint64_t CudaLlama::device_bytes() const { return 0; }
void CudaLlama::set_cuda_graphs(bool) {}
StatusOr<GenerateResult> CudaLlama::Generate(const KvPrefix*, absl::Span<const int32_t>,
                                             const SamplingOptions&) {
  return absl::UnimplementedError("the CUDA model runtime is not in this build");
}
StatusOr<std::vector<float>> CudaLlama::LastLogits(absl::Span<const int32_t>) {
  return absl::UnimplementedError("the CUDA model runtime is not in this build");
}
StatusOr<PrefillResult> CudaLlama::Prefill(const KvPrefix*, absl::Span<const int32_t>, int64_t,
                                           const std::function<void(int64_t, int64_t)>&, bool) {
  return absl::UnimplementedError("the CUDA model runtime is not in this build");
}
StatusOr<std::unique_ptr<CudaBatch>> CudaLlama::NewBatch(const KvPrefix*, int32_t, int64_t) {
  return absl::UnimplementedError("the CUDA model runtime is not in this build");
}
StatusOr<std::vector<double>> CudaLlama::Score(const KvPrefix*, absl::Span<const int32_t>,
                                               absl::Span<const int32_t>, int64_t) {
  return absl::UnimplementedError("the CUDA model runtime is not in this build");
}
struct CudaBatch::State {};
CudaBatch::CudaBatch(std::unique_ptr<State> state) : state_(std::move(state)) {}
CudaBatch::~CudaBatch() = default;
StatusOr<int32_t> CudaBatch::Open() {
  return absl::UnimplementedError("the CUDA model runtime is not in this build");
}
void CudaBatch::Close(int32_t) {}
int64_t CudaBatch::length(int32_t) const { return 0; }
int32_t CudaBatch::slots() const { return 0; }
int64_t CudaBatch::capacity() const { return 0; }
uint64_t CudaBatch::device_bytes() const { return 0; }
Status CudaBatch::Prompt(int32_t, absl::Span<const int32_t>, std::vector<float>*, int32_t*) {
  return absl::UnimplementedError("the CUDA model runtime is not in this build");
}
Status CudaBatch::Decode(absl::Span<const int32_t>, absl::Span<const int32_t>,
                         absl::Span<const uint8_t>, std::vector<int32_t>*, std::vector<float>*) {
  return absl::UnimplementedError("the CUDA model runtime is not in this build");
}

#else  // POLYKV_HAVE_CUDA

namespace {

using kernels::Device;
constexpr Device kDev = Device::kCuda;
/// Device memory the f32 matrix copies must leave free besides themselves (at least; a tenth
/// of the device when that is more): the attention's partial states (up to 512 MiB per
/// launch group), cuBLAS's workspace, the sessions' growing scratch.
constexpr uint64_t kF32CopyHeadroom = uint64_t{512} << 20;

/// The CPU runtime's shared pieces (RoPE tables with every scaling, EOS ids, id checks),
/// reused as they are: the device runtime computes with the very same host tables.
class HostSide final : public internal::LlamaBase {
 public:
  using LlamaBase::CheckTokens;
  using LlamaBase::IsEos;
  using LlamaBase::LlamaBase;
  using LlamaBase::RopeTables;
  StatusOr<KvCache> NewCacheWithPrefix(std::shared_ptr<const KvPrefix>, std::vector<int32_t>,
                                       int64_t) const override {
    return absl::UnimplementedError("HostSide");
  }
  StatusOr<KvCache> FreezeAsPrefix(KvCache&&, int64_t) const override {
    return absl::UnimplementedError("HostSide");
  }
  WeightStorage weight_storage() const override { return WeightStorage::kMapped; }
  int64_t WeightBytesPerToken() const override { return 0; }

 private:
  StatusOr<Logits> ForwardImpl(absl::Span<const int32_t>, KvCache&, int64_t) override {
    return absl::UnimplementedError("HostSide");
  }
};

/// One cudaMalloc'ed block, freed on destruction.
class DeviceBlock {
 public:
  DeviceBlock() = default;
  DeviceBlock(DeviceBlock&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; }
  DeviceBlock& operator=(DeviceBlock&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBlock() {
    if (p_ != nullptr) cudaFree(p_);
  }
  Status Allocate(uint64_t bytes, const char* what) {
    if (p_ != nullptr) cudaFree(p_);
    p_ = nullptr;
    bytes_ = 0;
    const cudaError_t e = cudaMalloc(&p_, bytes == 0 ? 1 : bytes);
    if (e != cudaSuccess) {
      p_ = nullptr;
      cudaGetLastError();  // not sticky: the next launch's check must not report it again
      return CudaStatus(e, absl::StrCat("cudaMalloc ", what));
    }
    bytes_ = bytes;
    return absl::OkStatus();
  }
  Status Upload(const void* host, uint64_t bytes, const char* what) {
    POLYKV_RETURN_IF_ERROR(Allocate(bytes, what));
    return CudaStatus(cudaMemcpy(p_, host, bytes, cudaMemcpyHostToDevice),
                      absl::StrCat("cudaMemcpy ", what));
  }
  float* f() const { return static_cast<float*>(p_); }
  void* get() const { return p_; }
  uint64_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  uint64_t bytes_ = 0;
};

struct DeviceMatrix {
  kernels::WeightView w;  ///< data: device memory
  DeviceBlock block;
  /// The same matrix dequantized to f32 (batched steps of more than 16 rows: cuBLAS), made
  /// on first use; empty for F32 weights (w serves) and until then.
  mutable kernels::WeightView f32;
  mutable DeviceBlock f32_block;
};

/// The sessions of a batched decode step (CudaBatch): row r's K/V go to slot row_slot[r] of
/// each layer's slab at suffix index row_length[r] - 1 (device arrays).
struct SlotRows {
  int64_t slots = 0, capacity = 0, max_length = 0;
  const int32_t* row_slot = nullptr;
  const int64_t* row_length = nullptr;
};

struct DeviceLayer {
  DeviceMatrix q, k, v, o, gate, up, down;
  /// q|k|v and gate|up rows in one block each when their types and widths agree (one
  /// product per decode step instead of three and two); q, k, v, gate, up then view into it.
  DeviceMatrix qkv, gate_up;
  DeviceBlock attn_norm, ffn_norm, bq, bk, bv, bo;  ///< f32; biases empty when absent
};

/// A matrix ready for upload: its view (K-quants converted to F16, GGUF Q/K rows in HF
/// order) over `own` or over the file mapping.
struct HostMatrix {
  kernels::WeightView w;
  std::vector<uint8_t> own;
};

/// A captured decode step (one Generate's: its suffix and capacity are baked in).
struct DecodeGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  DecodeGraph() = default;
  DecodeGraph(const DecodeGraph&) = delete;
  DecodeGraph& operator=(const DecodeGraph&) = delete;
  ~DecodeGraph() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
};

}  // namespace

struct CudaLlama::Impl {
  std::unique_ptr<HostSide> host;
  internal::MappedWeights mapped;  // the file mappings (kept for the lifetime; read once)
  int device = 0;
  DeviceMatrix embed, lm_head;
  bool tied = false;
  std::vector<DeviceLayer> layers;
  DeviceBlock norm;
  uint64_t weight_bytes = 0;
  // Workspace, sized for `rows` rows.
  int64_t rows = 0;
  DeviceBlock x, h, t, q, att, k, v, g, u, cos, sin, logits, ids, out_id;
  DeviceBlock qkv, gu;  ///< one row of q|k|v and of gate|up (fused decode products)
  DeviceBlock pos;      ///< int64 [2] (graph decode): the step's suffix index, live suffix length
  uint64_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;  ///< every kernel and copy of this model
  bool graphs = true;
  /// Products of more than kDeviceMatVecMaxRows rows on f32 copies of the matrices (set by
  /// a CudaBatch; single agents keep the block kernels and their memory).
  bool f32_products = false;
  bool f32_refused = false;  ///< a copy did not fit: products on the blocks from then on
  uint64_t f32_bytes = 0;    ///< device bytes of those copies

  ~Impl() {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  const ModelConfig& cfg() const { return host->config(); }

  // A type without CUDA kernels (the K-quants; llama.cpp stores a tied embedding of a Q4_1
  // file as Q6_K) becomes F16 at upload, said in one line: values within f16 rounding of
  // the CPU's dequantized ones, 2 bytes per weight on the device.
  Status ToF16(const kernels::WeightView& w, const char* what, std::vector<uint8_t>* out,
               kernels::WeightView* view) {
    std::vector<float> row(static_cast<size_t>(w.cols));
    out->resize(static_cast<size_t>(w.rows * w.cols * 2));
    uint16_t* dst = reinterpret_cast<uint16_t*>(out->data());
    for (int64_t r = 0; r < w.rows; ++r) {
      POLYKV_RETURN_IF_ERROR(kernels::DequantizeRows(w, r, r + 1, row.data()));
      for (int64_t i = 0; i < w.cols; ++i) dst[r * w.cols + i] = kernels::dtype::FloatToF16(row[i]);
    }
    *view = w;
    view->type = kernels::WeightType::kF16;
    view->row_bytes = w.cols * 2;
    view->data = out->data();
    std::fprintf(stderr,
                 "CUDA runtime: %s weights of type %d have no CUDA kernels: converted to F16 at "
                 "upload (%.1f MiB on the device)\n",
                 what, static_cast<int>(w.type), out->size() / 1048576.0);
    return absl::OkStatus();
  }

  Status Prepare(const internal::MappedMatrix& mm, const char* what, HostMatrix* out) {
    out->w = mm.w;
    if (!kernels::DeviceWeightTypeSupported(mm.w.type))
      POLYKV_RETURN_IF_ERROR(ToF16(mm.w, what, &out->own, &out->w));
    if (mm.interleaved_heads > 0) {  // HF row order, once, instead of per output
      const int64_t hd = cfg().head_dim;
      const uint8_t* src = static_cast<const uint8_t*>(out->w.data);
      std::vector<uint8_t> permuted(static_cast<size_t>(out->w.bytes()));
      for (int64_t r = 0; r < out->w.rows; ++r)
        std::copy_n(src + GgufInterleavedSourceRow(r, static_cast<int32_t>(hd)) * out->w.row_bytes,
                    out->w.row_bytes, permuted.data() + r * out->w.row_bytes);
      out->own = std::move(permuted);
      out->w.data = out->own.data();
    }
    return absl::OkStatus();
  }

  Status UploadMatrix(const internal::MappedMatrix& mm, DeviceMatrix* out, const char* what) {
    HostMatrix h;
    POLYKV_RETURN_IF_ERROR(Prepare(mm, what, &h));
    out->w = h.w;
    POLYKV_RETURN_IF_ERROR(out->block.Upload(h.w.data, static_cast<uint64_t>(h.w.bytes()), what));
    out->w.data = out->block.get();
    weight_bytes += static_cast<uint64_t>(h.w.bytes());
    return absl::OkStatus();
  }

  // Uploads `parts` as one matrix (rows concatenated) into `fused` with each part's view
  // into it, when every part has the same type and width; else each on its own.
  Status UploadFused(
      std::initializer_list<std::pair<const internal::MappedMatrix*, DeviceMatrix*>> parts,
      DeviceMatrix* fused, const char* what) {
    std::vector<HostMatrix> h(parts.size());
    size_t i = 0;
    bool same = true;
    for (const auto& [mm, dm] : parts) {
      POLYKV_RETURN_IF_ERROR(Prepare(*mm, what, &h[i]));
      same = same && h[i].w.type == h[0].w.type && h[i].w.cols == h[0].w.cols &&
             h[i].w.row_bytes == h[0].w.row_bytes;
      ++i;
    }
    if (!same) {
      for (const auto& [mm, dm] : parts) POLYKV_RETURN_IF_ERROR(UploadMatrix(*mm, dm, what));
      return absl::OkStatus();
    }
    std::vector<uint8_t> all;
    int64_t rows = 0;
    for (const HostMatrix& m : h) {
      const uint8_t* b = static_cast<const uint8_t*>(m.w.data);
      all.insert(all.end(), b, b + m.w.bytes());
      rows += m.w.rows;
    }
    POLYKV_RETURN_IF_ERROR(fused->block.Upload(all.data(), all.size(), what));
    fused->w = h[0].w;
    fused->w.rows = rows;
    fused->w.data = fused->block.get();
    i = 0;
    int64_t off = 0;
    for (const auto& [mm, dm] : parts) {
      dm->w = h[i].w;
      dm->w.data = static_cast<uint8_t*>(fused->block.get()) + off;
      off += h[i].w.bytes();
      ++i;
    }
    weight_bytes += all.size();
    return absl::OkStatus();
  }

  Status UploadVector(const float* v, int64_t n, bool interleaved, DeviceBlock* out,
                      const char* what) {
    if (v == nullptr) return absl::OkStatus();
    std::vector<float> tmp;
    if (interleaved) {
      tmp.resize(static_cast<size_t>(n));
      for (int64_t r = 0; r < n; ++r) tmp[r] = v[GgufInterleavedSourceRow(r, cfg().head_dim)];
      v = tmp.data();
    }
    weight_bytes += static_cast<uint64_t>(n) * 4;
    return out->Upload(v, static_cast<uint64_t>(n) * 4, what);
  }

  Status UploadAll() {
    const ModelConfig& c = cfg();
    POLYKV_RETURN_IF_ERROR(UploadMatrix(mapped.embed, &embed, "embedding"));
    tied = mapped.lm_head.w.data == mapped.embed.w.data;
    if (!tied) POLYKV_RETURN_IF_ERROR(UploadMatrix(mapped.lm_head, &lm_head, "lm_head"));
    POLYKV_RETURN_IF_ERROR(UploadVector(mapped.norm, c.hidden, false, &norm, "norm"));
    layers.resize(mapped.layers.size());
    for (size_t l = 0; l < layers.size(); ++l) {
      const internal::MappedLayer& m = mapped.layers[l];
      DeviceLayer& d = layers[l];
      POLYKV_RETURN_IF_ERROR(
          UploadFused({{&m.q, &d.q}, {&m.k, &d.k}, {&m.v, &d.v}}, &d.qkv, "q|k|v"));
      POLYKV_RETURN_IF_ERROR(UploadMatrix(m.o, &d.o, "o"));
      POLYKV_RETURN_IF_ERROR(
          UploadFused({{&m.gate, &d.gate}, {&m.up, &d.up}}, &d.gate_up, "gate|up"));
      POLYKV_RETURN_IF_ERROR(UploadMatrix(m.down, &d.down, "down"));
      const int64_t qd = int64_t{c.heads} * c.head_dim, kd = int64_t{c.kv_heads} * c.head_dim;
      POLYKV_RETURN_IF_ERROR(UploadVector(m.attn_norm, c.hidden, false, &d.attn_norm, "norm"));
      POLYKV_RETURN_IF_ERROR(UploadVector(m.ffn_norm, c.hidden, false, &d.ffn_norm, "norm"));
      POLYKV_RETURN_IF_ERROR(UploadVector(m.bq, qd, m.q.interleaved_heads > 0, &d.bq, "bias"));
      POLYKV_RETURN_IF_ERROR(UploadVector(m.bk, kd, m.k.interleaved_heads > 0, &d.bk, "bias"));
      POLYKV_RETURN_IF_ERROR(UploadVector(m.bv, kd, false, &d.bv, "bias"));
      POLYKV_RETURN_IF_ERROR(UploadVector(m.bo, c.hidden, false, &d.bo, "bias"));
    }
    return absl::OkStatus();
  }

  Status EnsureWorkspace(int64_t n) {
    if (n <= rows) return absl::OkStatus();
    const ModelConfig& c = cfg();
    const uint64_t D = c.hidden, Q = uint64_t(c.heads) * c.head_dim,
                   K = uint64_t(c.kv_heads) * c.head_dim, F = c.ffn, hd = c.head_dim;
    const uint64_t un = static_cast<uint64_t>(n);
    rows = 0;  // until every block below is allocated (a failure leaves none usable)
    workspace_bytes = 0;
    for (auto [b, floats] : {std::pair{&x, D},
                             {&h, D},
                             {&t, D},
                             {&q, Q},
                             {&att, Q},
                             {&k, K},
                             {&v, K},
                             {&g, F},
                             {&u, F},
                             {&cos, hd},
                             {&sin, hd}}) {
      POLYKV_RETURN_IF_ERROR(b->Allocate(un * floats * 4, "workspace"));
      workspace_bytes += un * floats * 4;
    }
    POLYKV_RETURN_IF_ERROR(logits.Allocate(uint64_t(c.vocab) * 4, "logits"));
    POLYKV_RETURN_IF_ERROR(ids.Allocate(un * 4, "ids"));
    POLYKV_RETURN_IF_ERROR(out_id.Allocate(4, "sampled id"));
    POLYKV_RETURN_IF_ERROR(qkv.Allocate((Q + 2 * K) * 4, "q|k|v row"));
    POLYKV_RETURN_IF_ERROR(gu.Allocate(2 * F * 4, "gate|up row"));
    workspace_bytes += (Q + 2 * K + 2 * F) * 4;
    if (pos.get() == nullptr) POLYKV_RETURN_IF_ERROR(pos.Allocate(16, "step position"));
    workspace_bytes += uint64_t(c.vocab) * 4 + un * 4 + 4 + 16;
    rows = n;
    return absl::OkStatus();
  }

  Status Bias(float* y, const DeviceBlock& b, int64_t n, int64_t width) {
    if (b.get() == nullptr) return absl::OkStatus();
    for (int64_t i = 0; i < n; ++i)
      POLYKV_RETURN_IF_ERROR(
          kernels::DeviceAdd(y + i * width, b.f(), width, y + i * width, kDev, stream));
    return absl::OkStatus();
  }

  // y = x W^T for n rows: with f32_products and n > kDeviceMatVecMaxRows on the matrix's
  // f32 copy (dequantized on first use, bit-exact with the block kernels' values; the first
  // one logs what all of them will take). The copies are all or nothing: the first checks
  // that all of them fit in free device memory with room to spare (kF32CopyHeadroom), and a
  // copy that still fails frees those made. Without them the products run on the stored
  // blocks in launches of 16 rows (no dequantized scratch of a matrix's f32 size, which
  // would not fit either), and no copy is tried again.
  Status Mm(const DeviceMatrix& m, const float* xp, int64_t n, int64_t xs, float* y, int64_t ys) {
    if (!f32_products || n <= kernels::kDeviceMatVecMaxRows ||
        m.w.type == kernels::WeightType::kF32)
      return kernels::DeviceMatMul(m.w, xp, n, xs, y, ys, kDev, stream);
    if (f32_refused) return BlockProduct(m, xp, n, xs, y, ys);
    if (m.f32.data == nullptr) {
      const uint64_t bytes = static_cast<uint64_t>(m.w.rows * m.w.cols) * 4;
      if (f32_bytes == 0) {
        size_t free_bytes = 0, total_bytes = 0;
        const uint64_t all = F32CopyBytes();
        if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
          cudaGetLastError();
          free_bytes = 0;
        }
        const uint64_t room = std::max<uint64_t>(kF32CopyHeadroom, total_bytes / 10);
        if (all + room > free_bytes) {
          RefuseF32Copies(absl::StrCat(all / 1048576, " MiB of copies + ", room / 1048576,
                                       " MiB to spare > ", free_bytes / 1048576, " MiB free"));
          return BlockProduct(m, xp, n, xs, y, ys);
        }
        std::fprintf(stderr,
                     "CUDA runtime: products of more than %lld rows use f32 copies of the "
                     "matrices (%.1f MiB of device memory once all are made)\n",
                     static_cast<long long>(kernels::kDeviceMatVecMaxRows), all / 1048576.0);
      }
      if (Status a = m.f32_block.Allocate(bytes, "f32 matrix (batched products)"); !a.ok()) {
        RefuseF32Copies(a.ToString());
        return BlockProduct(m, xp, n, xs, y, ys);
      }
      POLYKV_RETURN_IF_ERROR(
          kernels::DeviceDequantizeRows(m.w, 0, m.w.rows, m.f32_block.f(), kDev, stream));
      m.f32 = m.w;
      m.f32.type = kernels::WeightType::kF32;
      m.f32.row_bytes = m.w.cols * 4;
      m.f32.data = m.f32_block.get();
      f32_bytes += bytes;
    }
    return kernels::DeviceMatMul(m.f32, xp, n, xs, y, ys, kDev, stream);
  }

  // A product on the stored blocks without a dequantized f32 scratch (block-quantized types:
  // the warp kernels, 16 rows per launch; F16/BF16: cuBLAS as without f32 copies).
  Status BlockProduct(const DeviceMatrix& m, const float* xp, int64_t n, int64_t xs, float* y,
                      int64_t ys) {
    kernels::DeviceMatMulOptions o;
    if (m.w.type != kernels::WeightType::kF16 && m.w.type != kernels::WeightType::kBF16) o.blas = 0;
    return kernels::DeviceMatMul(m.w, xp, n, xs, y, ys, kDev, stream, o);
  }

  // Gives the f32 copies up for good: frees those made (after the queued work that reads
  // them) and says why on stderr.
  void RefuseF32Copies(const std::string& why) {
    if (f32_bytes > 0 && cudaStreamSynchronize(stream) != cudaSuccess) cudaGetLastError();
    ForEachCopyable([](const DeviceMatrix& m) {
      m.f32_block = DeviceBlock();
      m.f32 = kernels::WeightView();
    });
    f32_bytes = 0;
    f32_refused = true;
    std::fprintf(stderr, "CUDA runtime: no f32 matrix copies (%s): products on the blocks\n",
                 why.c_str());
  }

  // Calls fn on every matrix Mm may make an f32 copy of (the ones not stored as f32).
  template <class Fn>
  void ForEachCopyable(Fn&& fn) const {
    auto visit = [&](const DeviceMatrix& m) {
      if (m.w.data != nullptr && m.w.type != kernels::WeightType::kF32) fn(m);
    };
    visit(tied ? embed : lm_head);
    for (const DeviceLayer& l : layers)
      for (const DeviceMatrix* m : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) visit(*m);
  }

  // Bytes of f32 copies of every matrix Mm may copy.
  uint64_t F32CopyBytes() const {
    uint64_t total = 0;
    ForEachCopyable(
        [&](const DeviceMatrix& m) { total += static_cast<uint64_t>(m.w.rows * m.w.cols) * 4; });
    return total;
  }

  Status Layer(int l, int64_t n, const KvPrefix* prefix, float* ck, float* cv, int64_t cap,
               int64_t s0, bool device_pos, const SlotRows* slots);
  Status Layers(int64_t n, const KvPrefix* prefix, absl::Span<float* const> kv, int64_t cap,
                int64_t s0, bool device_pos, const SlotRows* slots = nullptr);
  // The final RMSNorm and output product of n rows of the residual stream from `rows`
  // (x or its last row): logits f32 [n][vocab] into `out`.
  Status OutputLogits(const float* rows, int64_t n, float* out) {
    const ModelConfig& c = cfg();
    POLYKV_RETURN_IF_ERROR(
        kernels::DeviceRmsNormRows(rows, norm.f(), n, c.hidden, c.rms_eps, h.f(), kDev, stream));
    return Mm(tied ? embed : lm_head, h.f(), n, c.hidden, out, c.vocab);
  }
  // Every row's logits (a batched step, a scored chunk).
  Status AllLogits(int64_t n, float* out) { return OutputLogits(x.f(), n, out); }
  // A private K/V suffix of `cap` positions per layer (f32 [kv_heads][cap][head_dim] each,
  // K and V alternating in *blocks); returns the blocks' pointers (what Step takes).
  StatusOr<std::vector<float*>> SuffixBlocks(int64_t cap, const char* what,
                                             std::vector<DeviceBlock>* blocks) {
    const ModelConfig& c = cfg();
    blocks->resize(2 * static_cast<size_t>(c.layers));
    std::vector<float*> kv;
    for (DeviceBlock& b : *blocks) {
      POLYKV_RETURN_IF_ERROR(
          b.Allocate(static_cast<uint64_t>(c.kv_heads) * cap * c.head_dim * 4, what));
      kv.push_back(b.f());
    }
    return kv;
  }
  // Uploads RoPE tables f32 [rows][head_dim] (cos, sin) for the next step.
  Status UploadRopeTables(const std::vector<float>& cs, const std::vector<float>& sn) {
    POLYKV_RETURN_IF_ERROR(Upload(cos.get(), cs.data(), cs.size() * 4, "cos"));
    return Upload(sin.get(), sn.data(), sn.size() * 4, "sin");
  }
  Status Upload(void* dst, const void* src, size_t bytes, const char* what) {
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream),
                      absl::StrCat("cudaMemcpyAsync ", what));
  }
  Status UploadRope(int64_t past, int64_t n);
  Status Finish(const KvPrefix* prefix);
  Status Step(absl::Span<const int32_t> tokens, const KvPrefix* prefix, int64_t past,
              absl::Span<float* const> kv, int64_t cap);
  Status CaptureDecode(const KvPrefix* prefix, absl::Span<float* const> kv, int64_t cap,
                       DecodeGraph* g);
  Status ReplayDecode(const KvPrefix* prefix, int64_t past, DecodeGraph& g);
};

// One decoder layer for n rows (the workspace holds x; the suffix gets rows s0 .. s0 + n, or
// with device_pos the rows at pos[0] and a live length pos[1] read on the device).
// With `slots` (a CudaBatch decode step): ck / cv are the layer's slabs, row r goes to its
// session's slot and attends to it (one launch for all rows).
Status CudaLlama::Impl::Layer(int l, int64_t n, const KvPrefix* prefix, float* ck, float* cv,
                              int64_t cap, int64_t s0, bool device_pos, const SlotRows* slots) {
  const ModelConfig& c = cfg();
  const int64_t H = c.heads, KV = c.kv_heads, hd = c.head_dim, D = c.hidden, F = c.ffn;
  const DeviceLayer& w = layers[static_cast<size_t>(l)];
  cudaStream_t s = stream;
  POLYKV_RETURN_IF_ERROR(
      kernels::DeviceRmsNormRows(x.f(), w.attn_norm.f(), n, D, c.rms_eps, h.f(), kDev, s));
  // One decode row with fused matrices: q|k|v in one product into one row (q at 0, k at Q,
  // v at Q + K), RoPE over its H + KV heads at once. The same per-element math as below.
  const bool one_qkv = n == 1 && w.qkv.block.get() != nullptr;
  const int64_t QKV = H * hd + 2 * KV * hd;
  float* qp = one_qkv ? qkv.f() : q.f();
  float* kp = one_qkv ? qkv.f() + H * hd : k.f();
  float* vp = one_qkv ? qkv.f() + H * hd + KV * hd : v.f();
  const int64_t kv_stride = one_qkv ? QKV : KV * hd;
  if (one_qkv) {
    POLYKV_RETURN_IF_ERROR(kernels::DeviceMatMul(w.qkv.w, h.f(), 1, D, qkv.f(), QKV, kDev, s));
  } else {
    POLYKV_RETURN_IF_ERROR(Mm(w.q, h.f(), n, D, q.f(), H * hd));
    POLYKV_RETURN_IF_ERROR(Mm(w.k, h.f(), n, D, k.f(), KV * hd));
    POLYKV_RETURN_IF_ERROR(Mm(w.v, h.f(), n, D, v.f(), KV * hd));
  }
  POLYKV_RETURN_IF_ERROR(Bias(qp, w.bq, n, H * hd));
  POLYKV_RETURN_IF_ERROR(Bias(kp, w.bk, n, KV * hd));
  POLYKV_RETURN_IF_ERROR(Bias(vp, w.bv, n, KV * hd));
  if (one_qkv) {
    POLYKV_RETURN_IF_ERROR(kernels::DeviceRopeRows(qp, 1, QKV, static_cast<int32_t>(H + KV),
                                                   static_cast<int32_t>(hd), cos.f(), sin.f(), kDev,
                                                   s));
  } else {
    POLYKV_RETURN_IF_ERROR(kernels::DeviceRopeRows(q.f(), n, H * hd, static_cast<int32_t>(H),
                                                   static_cast<int32_t>(hd), cos.f(), sin.f(), kDev,
                                                   s));
    POLYKV_RETURN_IF_ERROR(kernels::DeviceRopeRows(k.f(), n, KV * hd, static_cast<int32_t>(KV),
                                                   static_cast<int32_t>(hd), cos.f(), sin.f(), kDev,
                                                   s));
  }
  kernels::AttentionOptions opt;
  opt.device = kDev;
  opt.stream = s;
  if (slots != nullptr) {
    for (auto [dst, src] : {std::pair{ck, kp}, std::pair{cv, vp}}) {
      POLYKV_RETURN_IF_ERROR(kernels::DeviceAppendKvSlots(
          src, n, kv_stride, static_cast<int32_t>(KV), static_cast<int32_t>(hd), dst, slots->slots,
          slots->capacity, slots->row_slot, slots->row_length, kDev, s));
    }
    kernels::SlotAttentionArgs a;
    a.prefix = prefix != nullptr ? &prefix->view : nullptr;
    if (prefix != nullptr) a.prefix_tail = prefix->tail;
    a.layer = l;
    a.k_slab = ck;
    a.v_slab = cv;
    a.slots = slots->slots;
    a.capacity = slots->capacity;
    a.rows = n;
    a.row_slot = slots->row_slot;
    a.row_length = slots->row_length;
    a.max_length = slots->max_length;
    a.heads = static_cast<int32_t>(H);
    a.kv_heads = static_cast<int32_t>(KV);
    a.head_dim = static_cast<int32_t>(hd);
    a.q = qp;
    a.out = att.f();
    POLYKV_RETURN_IF_ERROR(kernels::AttentionForwardSlots(a, opt));
  } else {
    // [n][KV][hd] rows into the suffix [KV][cap][hd] at s0 (or at pos[0]).
    const int64_t* dpos = device_pos ? static_cast<const int64_t*>(pos.get()) : nullptr;
    for (auto [dst, src] : {std::pair{ck, kp}, std::pair{cv, vp}}) {
      POLYKV_RETURN_IF_ERROR(
          kernels::DeviceAppendKvRows(src, n, kv_stride, static_cast<int32_t>(KV),
                                      static_cast<int32_t>(hd), dst, cap, s0, dpos, kDev, s));
    }
    kernels::AttentionArgs a;
    a.prefix = prefix != nullptr ? &prefix->view : nullptr;
    if (prefix != nullptr) a.prefix_tail = prefix->tail;
    a.layer = l;
    a.k_suffix = ck;
    a.v_suffix = cv;
    a.suffix_capacity = cap;
    a.suffix_length = device_pos ? cap : s0 + n;  // device_pos: the bound; pos[1] is live
    a.suffix_length_device = device_pos ? dpos + 1 : nullptr;
    a.n = n;
    a.heads = static_cast<int32_t>(H);
    a.kv_heads = static_cast<int32_t>(KV);
    a.head_dim = static_cast<int32_t>(hd);
    a.q = qp;  // one row: q|k|v's first H * hd values; else [n][H * hd]
    a.out = att.f();
    POLYKV_RETURN_IF_ERROR(kernels::AttentionForward(a, opt));
  }
  // The residual adds fused into the o and down products (x += product: the same one f32
  // add as DeviceAdd) where the warp kernels serve them.
  kernels::DeviceMatMulOptions acc;
  acc.accumulate = true;
  if (w.bo.get() == nullptr && n <= kernels::kDeviceMatVecMaxRows) {
    POLYKV_RETURN_IF_ERROR(
        kernels::DeviceMatMul(w.o.w, att.f(), n, H * hd, x.f(), D, kDev, s, acc));
  } else {
    POLYKV_RETURN_IF_ERROR(Mm(w.o, att.f(), n, H * hd, t.f(), D));
    POLYKV_RETURN_IF_ERROR(Bias(t.f(), w.bo, n, D));
    POLYKV_RETURN_IF_ERROR(kernels::DeviceAdd(x.f(), t.f(), n * D, x.f(), kDev, s));
  }
  POLYKV_RETURN_IF_ERROR(
      kernels::DeviceRmsNormRows(x.f(), w.ffn_norm.f(), n, D, c.rms_eps, h.f(), kDev, s));
  float* act = g.f();
  if (n == 1 && w.gate_up.block.get() != nullptr) {
    POLYKV_RETURN_IF_ERROR(kernels::DeviceMatMul(w.gate_up.w, h.f(), 1, D, gu.f(), 2 * F, kDev, s));
    POLYKV_RETURN_IF_ERROR(kernels::DeviceSiluMul(gu.f(), gu.f() + F, F, gu.f(), kDev, s));
    act = gu.f();
  } else {
    POLYKV_RETURN_IF_ERROR(Mm(w.gate, h.f(), n, D, g.f(), F));
    POLYKV_RETURN_IF_ERROR(Mm(w.up, h.f(), n, D, u.f(), F));
    POLYKV_RETURN_IF_ERROR(kernels::DeviceSiluMul(g.f(), u.f(), n * F, g.f(), kDev, s));
  }
  if (n <= kernels::kDeviceMatVecMaxRows)
    return kernels::DeviceMatMul(w.down.w, act, n, F, x.f(), D, kDev, s, acc);
  POLYKV_RETURN_IF_ERROR(Mm(w.down, act, n, F, t.f(), D));
  return kernels::DeviceAdd(x.f(), t.f(), n * D, x.f(), kDev, s);
}

// Every layer, then the last row's final norm and the output product into `logits`.
// (kv: each layer's K and V suffix, or with `slots` its slabs.)
Status CudaLlama::Impl::Layers(int64_t n, const KvPrefix* prefix, absl::Span<float* const> kv,
                               int64_t cap, int64_t s0, bool device_pos, const SlotRows* slots) {
  const ModelConfig& c = cfg();
  for (int l = 0; l < c.layers; ++l)
    POLYKV_RETURN_IF_ERROR(
        Layer(l, n, prefix, kv[2 * l], kv[2 * l + 1], cap, s0, device_pos, slots));
  if (slots != nullptr) return absl::OkStatus();  // the caller takes every row's logits
  return OutputLogits(x.f() + (n - 1) * c.hidden, 1, logits.f());  // the last row's
}

// The RoPE rows of positions past .. past + n - 1 (the CPU runtime's own tables).
Status CudaLlama::Impl::UploadRope(int64_t past, int64_t n) {
  const int64_t hd = cfg().head_dim;
  std::vector<float> cs(static_cast<size_t>(n * hd)), sn(cs.size());
  host->RopeTables(past, n, cs.data(), sn.data());
  return UploadRopeTables(cs, sn);
}

// Waits for the step and re-checks the prefix's leases (its bytes were read by the step).
Status CudaLlama::Impl::Finish(const KvPrefix* prefix) {
  POLYKV_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "CUDA forward step"));
  if (prefix != nullptr && prefix->check) POLYKV_RETURN_IF_ERROR(prefix->check());
  return absl::OkStatus();
}

// Runs `tokens` at positions past.. (suffix index past - P ..) with launches from the host;
// leaves the last row's logits in `logits`.
Status CudaLlama::Impl::Step(absl::Span<const int32_t> tokens, const KvPrefix* prefix, int64_t past,
                             absl::Span<float* const> kv, int64_t cap) {
  const ModelConfig& c = cfg();
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t P = prefix != nullptr ? prefix->tokens() : 0, s0 = past - P;
  if (s0 < 0 || s0 + n > cap)
    return absl::InternalError(absl::StrCat("CUDA step: suffix ", s0, " + ", n, " > ", cap));
  POLYKV_RETURN_IF_ERROR(host->CheckTokens(tokens));
  POLYKV_RETURN_IF_ERROR(EnsureWorkspace(n));
  POLYKV_RETURN_IF_ERROR(UploadRope(past, n));
  POLYKV_RETURN_IF_ERROR(Upload(ids.get(), tokens.data(), static_cast<size_t>(n) * 4, "ids"));
  POLYKV_RETURN_IF_ERROR(kernels::DeviceEmbedRows(embed.w, static_cast<const int32_t*>(ids.get()),
                                                  n, x.f(), c.hidden, kDev, stream));
  POLYKV_RETURN_IF_ERROR(Layers(n, prefix, kv, cap, s0, false));
  return Finish(prefix);
}

// Captures the decode step (embedding of the id in out_id, every layer with the device
// position, the output product) on `stream` into `g`.
Status CudaLlama::Impl::CaptureDecode(const KvPrefix* prefix, absl::Span<float* const> kv,
                                      int64_t cap, DecodeGraph* g) {
  POLYKV_RETURN_IF_ERROR(CudaStatus(
      cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture"));
  Status st = kernels::DeviceEmbedRows(embed.w, static_cast<const int32_t*>(out_id.get()), 1, x.f(),
                                       cfg().hidden, kDev, stream);
  if (st.ok()) st = Layers(1, prefix, kv, cap, 0, true);
  const cudaError_t end = cudaStreamEndCapture(stream, &g->graph);
  POLYKV_RETURN_IF_ERROR(st);
  POLYKV_RETURN_IF_ERROR(CudaStatus(end, "cudaStreamEndCapture"));
  return CudaStatus(cudaGraphInstantiate(&g->exec, g->graph, 0), "cudaGraphInstantiate");
}

// One decode step by graph replay: the step's position (suffix index s0, live length
// s0 + 1) and RoPE row first, then the graph; logits in `logits` when it returns.
Status CudaLlama::Impl::ReplayDecode(const KvPrefix* prefix, int64_t past, DecodeGraph& g) {
  const int64_t P = prefix != nullptr ? prefix->tokens() : 0;
  const int64_t p[2] = {past - P, past - P + 1};
  POLYKV_RETURN_IF_ERROR(UploadRope(past, 1));
  POLYKV_RETURN_IF_ERROR(Upload(pos.get(), p, sizeof(p), "step position"));
  POLYKV_RETURN_IF_ERROR(CudaStatus(cudaGraphLaunch(g.exec, stream), "cudaGraphLaunch"));
  return Finish(prefix);
}

CudaLlama::CudaLlama(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaLlama::~CudaLlama() {
  if (impl_) cudaSetDevice(impl_->device);  // free on the device the blocks live on
}
bool CudaRuntimeBuilt() { return true; }

StatusOr<std::unique_ptr<CudaLlama>> CudaLlama::Load(const std::string& path, int device,
                                                     const LoadOptions& options) {
  POLYKV_RETURN_IF_ERROR(kernels::CheckDeviceAvailable(kDev));
  if (device < 0 || device >= kernels::CudaDeviceCount())
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA device ", device, " requested; this host has ", kernels::CudaDeviceCount()));
  POLYKV_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  LoadOptions o = options;
  o.weights = WeightStorage::kMapped;
  POLYKV_ASSIGN_OR_RETURN(internal::LoadedModel m, internal::LoadModelFiles(path, o));
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  POLYKV_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking),
                                    "cudaStreamCreate"));
  const char* graphs = std::getenv("POLYKV_CUDA_GRAPHS");
  impl->graphs = graphs == nullptr || std::string(graphs) != "0";
  impl->mapped = std::move(*m.mapped);
  impl->host = std::make_unique<HostSide>(std::move(m.config), std::move(m.tokenizer),
                                          std::move(m.fingerprint));
  POLYKV_RETURN_IF_ERROR(impl->UploadAll());
  return std::unique_ptr<CudaLlama>(new CudaLlama(std::move(impl)));
}

const ModelConfig& CudaLlama::config() const { return impl_->cfg(); }
const std::string& CudaLlama::fingerprint() const { return impl_->host->fingerprint(); }
const Tokenizer* CudaLlama::tokenizer() const { return impl_->host->tokenizer(); }
uint64_t CudaLlama::weight_bytes() const { return impl_->weight_bytes; }
int CudaLlama::device() const { return impl_->device; }
uint64_t CudaLlama::device_bytes() const {
  return impl_->weight_bytes + impl_->workspace_bytes + impl_->f32_bytes;
}
void CudaLlama::set_cuda_graphs(bool on) { impl_->graphs = on; }

namespace {

// As the CPU runtime draws u (llama.cc): the top 53 bits of one mt19937_64 output.
double Uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// Every segment of `prefix` (null: none) has the model's layers, KV heads and head_dim
// (a pool tree's segments follow one another in position order).
Status CheckPrefixShape(const KvPrefix* prefix, const ModelConfig& c, const char* who) {
  if (prefix == nullptr) return absl::OkStatus();
  auto check = [&](const kernels::PrefixView& v, size_t segment) -> Status {
    if (static_cast<int32_t>(v.layers.size()) != c.layers || v.kv_heads != c.kv_heads ||
        v.head_dim != c.head_dim)
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": prefix segment ", segment, " has ", v.layers.size(), " layers, ",
                       v.kv_heads, " KV heads, head_dim ", v.head_dim, "; the model ", c.layers,
                       ", ", c.kv_heads, ", ", c.head_dim));
    return absl::OkStatus();
  };
  POLYKV_RETURN_IF_ERROR(check(prefix->view, 0));
  for (size_t i = 0; i < prefix->tail.size(); ++i)
    POLYKV_RETURN_IF_ERROR(check(prefix->tail[i], i + 1));
  return absl::OkStatus();
}

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

StatusOr<GenerateResult> CudaLlama::Generate(const KvPrefix* prefix,
                                             absl::Span<const int32_t> prompt,
                                             const SamplingOptions& s) {
  const auto t0 = std::chrono::steady_clock::now();
  Impl& m = *impl_;
  const ModelConfig& c = m.cfg();
  if (prompt.empty()) return absl::InvalidArgumentError("CUDA Generate: empty prompt");
  if (s.max_new_tokens < 0) return absl::InvalidArgumentError("max_new_tokens < 0");
  if (!s.greedy && (!(s.temperature > 0) || !(s.top_p > 0 && s.top_p <= 1)))
    return absl::InvalidArgumentError("CUDA Generate: temperature must be > 0, top_p in (0, 1]");
  POLYKV_RETURN_IF_ERROR(CheckPrefixShape(prefix, c, "CUDA Generate"));
  POLYKV_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(m.device), "cudaSetDevice"));
  const int64_t cap = static_cast<int64_t>(prompt.size()) + s.max_new_tokens + 1;
  std::vector<DeviceBlock> suffix;
  POLYKV_ASSIGN_OR_RETURN(const std::vector<float*> kv, m.SuffixBlocks(cap, "KV suffix", &suffix));
  int64_t past = prefix != nullptr ? prefix->tokens() : 0;
  GenerateResult r;
  std::mt19937_64 rng(s.seed);
  // The prompt in steps of at most kFeedRows rows (grid sizes, workspace); logits of the last.
  constexpr size_t kFeedRows = 256;
  for (size_t off = 0; off < prompt.size(); off += kFeedRows) {
    const absl::Span<const int32_t> part = prompt.subspan(off, kFeedRows);
    POLYKV_RETURN_IF_ERROR(m.Step(part, prefix, past, kv, cap));
    past += static_cast<int64_t>(part.size());
  }
  int32_t* dev_id = static_cast<int32_t*>(m.out_id.get());
  // Decode steps: one captured graph (its embedding reads dev_id) unless graphs are off or
  // the answer is too short to pay for the capture.
  DecodeGraph graph;
  const bool use_graph = m.graphs && s.max_new_tokens >= 4;
  for (int32_t i = 0; i < s.max_new_tokens; ++i) {
    if (s.greedy) {
      POLYKV_RETURN_IF_ERROR(
          kernels::DeviceArgmaxRows(m.logits.f(), 1, c.vocab, c.vocab, dev_id, kDev, m.stream));
    } else {
      POLYKV_RETURN_IF_ERROR(kernels::DeviceSampleTopP(
          m.logits.f(), c.vocab, s.temperature, s.top_p, Uniform01(rng), dev_id, kDev, m.stream));
    }
    int32_t tok = 0;
    POLYKV_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(&tok, dev_id, 4, cudaMemcpyDeviceToHost, m.stream), "copy sampled id"));
    POLYKV_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(m.stream), "sampling"));
    if (i == 0) r.first_token_ms = MsSince(t0);
    if (s.stop_at_eos && m.host->IsEos(tok)) break;
    r.tokens.push_back(tok);
    if (i + 1 == s.max_new_tokens) break;
    if (use_graph) {
      POLYKV_RETURN_IF_ERROR(m.host->CheckTokens(absl::MakeConstSpan(&tok, 1)));
      if (past - (prefix != nullptr ? prefix->tokens() : 0) + 1 > cap)
        return absl::InternalError("CUDA decode: the suffix is full");
      if (graph.exec == nullptr) POLYKV_RETURN_IF_ERROR(m.CaptureDecode(prefix, kv, cap, &graph));
      POLYKV_RETURN_IF_ERROR(m.ReplayDecode(prefix, past, graph));
    } else {
      const int32_t one[1] = {tok};
      POLYKV_RETURN_IF_ERROR(m.Step(absl::MakeConstSpan(one, 1), prefix, past, kv, cap));
    }
    ++past;
  }
  r.total_ms = MsSince(t0);
  return r;
}

StatusOr<PrefillResult> CudaLlama::Prefill(const KvPrefix* prefix, absl::Span<const int32_t> tokens,
                                           int64_t chunk,
                                           const std::function<void(int64_t, int64_t)>& progress,
                                           bool keep_on_device) {
  Impl& m = *impl_;
  const ModelConfig& c = m.cfg();
  if (tokens.empty()) return absl::InvalidArgumentError("CUDA Prefill: empty document");
  if (chunk < 1) return absl::InvalidArgumentError("CUDA Prefill: chunk < 1");
  POLYKV_RETURN_IF_ERROR(CheckPrefixShape(prefix, c, "CUDA Prefill"));
  POLYKV_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(m.device), "cudaSetDevice"));
  const int64_t P = prefix != nullptr ? prefix->tokens() : 0;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const size_t step = static_cast<size_t>(std::min<int64_t>(chunk, 256));
  // The suffix of capacity n is laid out [kv_heads][n][head_dim]: the result's layout.
  std::vector<DeviceBlock> suffix;
  POLYKV_ASSIGN_OR_RETURN(const std::vector<float*> kv, m.SuffixBlocks(n, "prefill K/V", &suffix));
  const uint64_t bytes = static_cast<uint64_t>(c.kv_heads) * n * c.head_dim * 4;
  for (size_t off = 0; off < tokens.size(); off += step) {
    const absl::Span<const int32_t> part = tokens.subspan(off, step);
    POLYKV_RETURN_IF_ERROR(m.Step(part, prefix, P + static_cast<int64_t>(off), kv, n));
    if (progress) progress(static_cast<int64_t>(off + part.size()), n);
  }
  PrefillResult r;
  r.tokens = n;
  r.last_logits.resize(static_cast<size_t>(c.vocab));
  if (keep_on_device) {  // the blocks move into the result's owner, freed with its last holder
    for (int l = 0; l < c.layers; ++l) {
      r.device_k.push_back(suffix[2 * l].f());
      r.device_v.push_back(suffix[2 * l + 1].f());
    }
    r.device_layer_elements = static_cast<int64_t>(bytes / 4);
    r.device_kv = std::make_shared<std::vector<DeviceBlock>>(std::move(suffix));
  } else {
    r.k.resize(static_cast<size_t>(c.layers));
    r.v.resize(static_cast<size_t>(c.layers));
    for (int l = 0; l < c.layers; ++l) {
      for (auto [dst, blk] :
           {std::pair{&r.k[l], &suffix[2 * l]}, std::pair{&r.v[l], &suffix[2 * l + 1]}}) {
        dst->resize(bytes / 4);
        POLYKV_RETURN_IF_ERROR(CudaStatus(
            cudaMemcpyAsync(dst->data(), blk->get(), bytes, cudaMemcpyDeviceToHost, m.stream),
            "copy prefill K/V"));
      }
    }
  }
  POLYKV_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(r.last_logits.data(), m.logits.get(), r.last_logits.size() * 4,
                                 cudaMemcpyDeviceToHost, m.stream),
                 "copy logits"));
  POLYKV_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(m.stream), "CUDA prefill"));
  return r;
}

StatusOr<std::vector<double>> CudaLlama::Score(const KvPrefix* prefix,
                                               absl::Span<const int32_t> input,
                                               absl::Span<const int32_t> targets, int64_t rows) {
  Impl& m = *impl_;
  const ModelConfig& c = m.cfg();
  if (input.empty() || input.size() != targets.size())
    return absl::InvalidArgumentError(absl::StrCat("CUDA Score: ", input.size(), " inputs, ",
                                                   targets.size(), " targets (need equal, > 0)"));
  if (rows < 1 || rows > 256)
    return absl::InvalidArgumentError(absl::StrCat("CUDA Score: rows ", rows, " outside 1..256"));
  POLYKV_RETURN_IF_ERROR(m.host->CheckTokens(targets));
  POLYKV_RETURN_IF_ERROR(CheckPrefixShape(prefix, c, "CUDA Score"));
  POLYKV_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(m.device), "cudaSetDevice"));
  const int64_t n = static_cast<int64_t>(input.size());
  std::vector<DeviceBlock> suffix;
  POLYKV_ASSIGN_OR_RETURN(const std::vector<float*> kv, m.SuffixBlocks(n, "KV suffix", &suffix));
  DeviceBlock logits;
  POLYKV_RETURN_IF_ERROR(logits.Allocate(uint64_t(rows) * c.vocab * 4, "score logits"));
  std::vector<float> host(static_cast<size_t>(rows * c.vocab));
  std::vector<double> nll;
  const int64_t P = prefix != nullptr ? prefix->tokens() : 0;
  for (int64_t off = 0; off < n; off += rows) {
    const absl::Span<const int32_t> part = input.subspan(off, rows);
    const int64_t k = static_cast<int64_t>(part.size());
    POLYKV_RETURN_IF_ERROR(m.Step(part, prefix, P + off, kv, n));
    POLYKV_RETURN_IF_ERROR(m.AllLogits(k, logits.f()));
    POLYKV_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(host.data(), logits.get(), size_t(k) * c.vocab * 4,
                                   cudaMemcpyDeviceToHost, m.stream),
                   "copy score logits"));
    POLYKV_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(m.stream), "CUDA score"));
    for (int64_t r = 0; r < k; ++r)
      nll.push_back(
          -LogProb(absl::MakeConstSpan(host.data() + r * c.vocab, c.vocab), targets[off + r]));
  }
  return nll;
}

StatusOr<std::vector<float>> CudaLlama::LastLogits(absl::Span<const int32_t> tokens) {
  Impl& m = *impl_;
  if (tokens.empty()) return absl::InvalidArgumentError("LastLogits: empty tokens");
  POLYKV_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(m.device), "cudaSetDevice"));
  const int64_t cap = static_cast<int64_t>(tokens.size());
  std::vector<DeviceBlock> suffix;
  POLYKV_ASSIGN_OR_RETURN(const std::vector<float*> kv, m.SuffixBlocks(cap, "KV suffix", &suffix));
  POLYKV_RETURN_IF_ERROR(m.Step(tokens, nullptr, 0, kv, cap));
  std::vector<float> out(static_cast<size_t>(m.cfg().vocab));
  POLYKV_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(out.data(), m.logits.get(), out.size() * 4, cudaMemcpyDeviceToHost, m.stream),
      "copy logits"));
  POLYKV_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(m.stream), "copy logits"));
  return out;
}

// ---- CudaBatch ----

struct CudaBatch::State {
  CudaLlama::Impl* m = nullptr;
  const KvPrefix* prefix = nullptr;
  int32_t slots = 0;
  int64_t cap = 0;
  int64_t slot_floats = 0;                ///< kv_heads * cap * head_dim
  std::vector<DeviceBlock> slab;          ///< [2 * layers]: f32 [slots][kv_heads][cap][head_dim]
  std::vector<float*> bases;              ///< the slabs' pointers (Layers' kv)
  std::vector<int64_t> lengths;           ///< own positions per slot
  std::vector<uint8_t> open;              ///< per slot
  DeviceBlock row_slot, row_length, ids;  ///< [slots] int32 / int64 / int32
  DeviceBlock logits;                     ///< f32 [logits_rows][vocab]
  int64_t logits_rows = 0;
  uint64_t bytes = 0;

  // Products on f32 copies while a batch call runs (restored after: a single agent's
  // Generate on the same model keeps the block kernels).
  struct F32Products {
    CudaLlama::Impl* m;
    bool was;
    explicit F32Products(CudaLlama::Impl* mm) : m(mm), was(mm->f32_products) {
      m->f32_products = true;
    }
    ~F32Products() { m->f32_products = was; }
  };

  Status CheckOpen(int32_t slot) const {
    if (slot < 0 || slot >= slots || !open[static_cast<size_t>(slot)])
      return absl::InvalidArgumentError(absl::StrCat("CUDA batch: slot ", slot, " is not open"));
    return absl::OkStatus();
  }
  int64_t prefix_tokens() const { return prefix != nullptr ? prefix->tokens() : 0; }
};

CudaBatch::CudaBatch(std::unique_ptr<State> state) : state_(std::move(state)) {}
CudaBatch::~CudaBatch() {
  if (state_) cudaSetDevice(state_->m->device);
}

StatusOr<std::unique_ptr<CudaBatch>> CudaLlama::NewBatch(const KvPrefix* prefix, int32_t slots,
                                                         int64_t capacity) {
  Impl& m = *impl_;
  const ModelConfig& c = m.cfg();
  if (slots < 1 || capacity < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA batch: slots ", slots, " and capacity ", capacity, " must be >= 1"));
  if (slots > 65535)
    return absl::InvalidArgumentError(absl::StrCat("CUDA batch: slots ", slots, " > 65535"));
  POLYKV_RETURN_IF_ERROR(CheckPrefixShape(prefix, c, "CUDA batch"));
  POLYKV_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(m.device), "cudaSetDevice"));
  auto st = std::make_unique<CudaBatch::State>();
  st->m = &m;
  st->prefix = prefix;
  st->slots = slots;
  st->cap = capacity;
  st->slot_floats = int64_t{c.kv_heads} * capacity * c.head_dim;
  const uint64_t slab_bytes = static_cast<uint64_t>(st->slot_floats) * slots * 4;
  st->slab.resize(2 * static_cast<size_t>(c.layers));
  for (DeviceBlock& b : st->slab) {
    POLYKV_RETURN_IF_ERROR(b.Allocate(slab_bytes, "KV slab (batched sessions)"));
    st->bases.push_back(b.f());
  }
  st->lengths.assign(static_cast<size_t>(slots), 0);
  st->open.assign(static_cast<size_t>(slots), 0);
  POLYKV_RETURN_IF_ERROR(st->row_slot.Allocate(uint64_t(slots) * 4, "batch slots"));
  POLYKV_RETURN_IF_ERROR(st->row_length.Allocate(uint64_t(slots) * 8, "batch lengths"));
  POLYKV_RETURN_IF_ERROR(st->ids.Allocate(uint64_t(slots) * 4, "batch ids"));
  st->bytes = slab_bytes * st->slab.size() + uint64_t(slots) * 16;
  return std::unique_ptr<CudaBatch>(new CudaBatch(std::move(st)));
}

StatusOr<int32_t> CudaBatch::Open() {
  State& b = *state_;
  for (int32_t i = 0; i < b.slots; ++i) {
    if (!b.open[static_cast<size_t>(i)]) {
      b.open[static_cast<size_t>(i)] = 1;
      b.lengths[static_cast<size_t>(i)] = 0;
      return i;
    }
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("CUDA batch: all ", b.slots, " session slots are taken"));
}

void CudaBatch::Close(int32_t slot) {
  if (slot >= 0 && slot < state_->slots) state_->open[static_cast<size_t>(slot)] = 0;
}
int64_t CudaBatch::length(int32_t slot) const {
  return slot >= 0 && slot < state_->slots ? state_->lengths[static_cast<size_t>(slot)] : 0;
}
int32_t CudaBatch::slots() const { return state_->slots; }
int64_t CudaBatch::capacity() const { return state_->cap; }
uint64_t CudaBatch::device_bytes() const {
  return state_->bytes + uint64_t(state_->logits_rows) * state_->m->cfg().vocab * 4 +
         state_->m->f32_bytes;
}

Status CudaBatch::Prompt(int32_t slot, absl::Span<const int32_t> prompt, std::vector<float>* logits,
                         int32_t* argmax) {
  State& b = *state_;
  CudaLlama::Impl& m = *b.m;
  const ModelConfig& c = m.cfg();
  POLYKV_RETURN_IF_ERROR(b.CheckOpen(slot));
  if (prompt.empty()) return absl::InvalidArgumentError("CUDA batch: empty prompt");
  int64_t& len = b.lengths[static_cast<size_t>(slot)];
  if (len + static_cast<int64_t>(prompt.size()) > b.cap)
    return absl::OutOfRangeError(absl::StrCat("CUDA batch: slot ", slot, " holds ", len,
                                              " positions; ", prompt.size(), " more exceed its ",
                                              b.cap));
  POLYKV_RETURN_IF_ERROR(m.host->CheckTokens(prompt));
  POLYKV_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(m.device), "cudaSetDevice"));
  State::F32Products f32(&m);
  std::vector<float*> kv(b.bases.size());
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = b.bases[i] + slot * b.slot_floats;
  constexpr size_t kFeedRows = 256;
  // The slot's length moves only when the whole call succeeded (else it holds what it held).
  int64_t fed = len;
  for (size_t off = 0; off < prompt.size(); off += kFeedRows) {
    const absl::Span<const int32_t> part = prompt.subspan(off, kFeedRows);
    POLYKV_RETURN_IF_ERROR(m.Step(part, b.prefix, b.prefix_tokens() + fed, kv, b.cap));
    fed += static_cast<int64_t>(part.size());
  }
  int32_t* dev_id = static_cast<int32_t*>(b.ids.get());
  POLYKV_RETURN_IF_ERROR(
      kernels::DeviceArgmaxRows(m.logits.f(), 1, c.vocab, c.vocab, dev_id, kDev, m.stream));
  int32_t id = 0;
  POLYKV_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(&id, dev_id, 4, cudaMemcpyDeviceToHost, m.stream), "copy greedy id"));
  if (logits != nullptr) {
    logits->resize(static_cast<size_t>(c.vocab));
    POLYKV_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(logits->data(), m.logits.get(), logits->size() * 4,
                                   cudaMemcpyDeviceToHost, m.stream),
                   "copy logits"));
  }
  POLYKV_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(m.stream), "CUDA batch prompt"));
  len = fed;
  if (argmax != nullptr) *argmax = id;
  return absl::OkStatus();
}

Status CudaBatch::Decode(absl::Span<const int32_t> slots, absl::Span<const int32_t> tokens,
                         absl::Span<const uint8_t> need_logits, std::vector<int32_t>* argmax,
                         std::vector<float>* logits) {
  State& b = *state_;
  CudaLlama::Impl& m = *b.m;
  const ModelConfig& c = m.cfg();
  const int64_t n = static_cast<int64_t>(slots.size());
  if (tokens.size() != slots.size() || need_logits.size() != slots.size())
    return absl::InvalidArgumentError(absl::StrCat("CUDA batch: ", slots.size(), " slots, ",
                                                   tokens.size(), " tokens, ", need_logits.size(),
                                                   " need_logits entries"));
  if (argmax == nullptr || logits == nullptr)
    return absl::InvalidArgumentError("CUDA batch: null argmax or logits output");
  if (n == 0) return absl::OkStatus();
  std::vector<uint8_t> seen(static_cast<size_t>(b.slots), 0);
  std::vector<int64_t> row_length(static_cast<size_t>(n));
  int64_t max_length = 0;
  for (int64_t r = 0; r < n; ++r) {
    const int32_t slot = slots[r];
    POLYKV_RETURN_IF_ERROR(b.CheckOpen(slot));
    if (seen[static_cast<size_t>(slot)]++)
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA batch: slot ", slot, " twice in a step"));
    row_length[r] = b.lengths[static_cast<size_t>(slot)] + 1;
    if (row_length[r] > b.cap)
      return absl::OutOfRangeError(
          absl::StrCat("CUDA batch: slot ", slot, " is full (", b.cap, " positions)"));
    max_length = std::max(max_length, row_length[r]);
  }
  POLYKV_RETURN_IF_ERROR(m.host->CheckTokens(tokens));
  POLYKV_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(m.device), "cudaSetDevice"));
  State::F32Products f32(&m);
  POLYKV_RETURN_IF_ERROR(m.EnsureWorkspace(n));
  if (n > b.logits_rows) {
    b.logits_rows = 0;  // until the larger block is allocated
    POLYKV_RETURN_IF_ERROR(b.logits.Allocate(uint64_t(n) * c.vocab * 4, "batch logits"));
    b.logits_rows = n;
  }
  // Each row's RoPE tables at its own position (the CPU runtime's tables).
  const int64_t hd = c.head_dim;
  std::vector<float> cs(static_cast<size_t>(n * hd)), sn(cs.size());
  for (int64_t r = 0; r < n; ++r)
    m.host->RopeTables(b.prefix_tokens() + row_length[r] - 1, 1, cs.data() + r * hd,
                       sn.data() + r * hd);
  POLYKV_RETURN_IF_ERROR(m.UploadRopeTables(cs, sn));
  POLYKV_RETURN_IF_ERROR(m.Upload(b.row_slot.get(), slots.data(), size_t(n) * 4, "batch slots"));
  POLYKV_RETURN_IF_ERROR(
      m.Upload(b.row_length.get(), row_length.data(), size_t(n) * 8, "batch lengths"));
  POLYKV_RETURN_IF_ERROR(m.Upload(m.ids.get(), tokens.data(), size_t(n) * 4, "ids"));
  POLYKV_RETURN_IF_ERROR(kernels::DeviceEmbedRows(
      m.embed.w, static_cast<const int32_t*>(m.ids.get()), n, m.x.f(), c.hidden, kDev, m.stream));
  SlotRows rows;
  rows.slots = b.slots;
  rows.capacity = b.cap;
  rows.max_length = max_length;
  rows.row_slot = static_cast<const int32_t*>(b.row_slot.get());
  rows.row_length = static_cast<const int64_t*>(b.row_length.get());
  POLYKV_RETURN_IF_ERROR(m.Layers(n, b.prefix, b.bases, b.cap, 0, false, &rows));
  // Every row's final norm, output product and greedy id.
  POLYKV_RETURN_IF_ERROR(m.AllLogits(n, b.logits.f()));
  int32_t* dev_ids = static_cast<int32_t*>(b.ids.get());
  POLYKV_RETURN_IF_ERROR(
      kernels::DeviceArgmaxRows(b.logits.f(), n, c.vocab, c.vocab, dev_ids, kDev, m.stream));
  argmax->resize(static_cast<size_t>(n));
  POLYKV_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(argmax->data(), dev_ids, size_t(n) * 4, cudaMemcpyDeviceToHost, m.stream),
      "copy greedy ids"));
  const size_t row_bytes = static_cast<size_t>(c.vocab) * 4;
  const bool any =
      std::any_of(need_logits.begin(), need_logits.end(), [](uint8_t need) { return need != 0; });
  if (any && logits->size() < static_cast<size_t>(n * c.vocab))
    logits->resize(static_cast<size_t>(n * c.vocab));
  for (int64_t r = 0; r < n; ++r) {
    if (!need_logits[r]) continue;
    POLYKV_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(logits->data() + r * c.vocab, b.logits.f() + r * c.vocab,
                                   row_bytes, cudaMemcpyDeviceToHost, m.stream),
                   "copy logits"));
  }
  POLYKV_RETURN_IF_ERROR(m.Finish(b.prefix));
  for (int64_t r = 0; r < n; ++r) ++b.lengths[static_cast<size_t>(slots[r])];
  return absl::OkStatus();
}

#endif  // POLYKV_HAVE_CUDA

}  // namespace polykv::model
