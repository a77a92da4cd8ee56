// Matrix kernels over weight blocks: validation, the one dispatch point (weight type x ISA
// -> dot-product kernel), activation quantization and the split of output rows over threads
// (tasks of 16 rows on the kernels' thread pool).
#include "polykv/kernels/matmul.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "matmul_internal.h"
#include "polykv/kernels/ggml_types.h"
#include "thread_pool.h"

namespace polykv::kernels {
namespace {

using mm::ActKind;
using mm::ActQ8K;

struct TypeInfo {
  WeightType type;
  const char* name;
  int32_t values;
  int32_t bytes;
  ActKind act;
};

// A WeightType's row: name and block size from the ggml type table, and its activation kind.
constexpr TypeInfo Info(WeightType type, ActKind act) {
  const GgmlTypeInfo* g = FindGgmlType(static_cast<uint32_t>(type));
  return {type, g->name, g->block_values, g->block_bytes, act};
}

// Indexed by mm::TypeIndex.
constexpr TypeInfo kTypes[mm::kTypeCount] = {
    Info(WeightType::kF32, ActKind::kF32),  Info(WeightType::kF16, ActKind::kF32),
    Info(WeightType::kBF16, ActKind::kF32), Info(WeightType::kQ4_0, ActKind::kQ8P),
    Info(WeightType::kQ4_1, ActKind::kQ8P), Info(WeightType::kQ5_0, ActKind::kQ8),
    Info(WeightType::kQ5_1, ActKind::kQ8),  Info(WeightType::kQ8_0, ActKind::kQ8),
    Info(WeightType::kQ4_K, ActKind::kQ8K), Info(WeightType::kQ5_K, ActKind::kQ8K),
    Info(WeightType::kQ6_K, ActKind::kQ8K),
};

int TypeIndexOf(WeightType t) {
  for (int i = 0; i < mm::kTypeCount; ++i)
    if (kTypes[i].type == t) return i;
  return -1;
}

// Bytes of one activation row of `cols` values in the format `kind`.
int64_t ActRowBytes(ActKind kind, int64_t cols) {
  switch (kind) {
    case ActKind::kF32:
      return cols * 4;
    case ActKind::kQ8:
    case ActKind::kQ8P:
    case ActKind::kQ8T:
      return mm::ActQ8RowBytes(cols / 32);
    case ActKind::kQ8K:
      return cols / 256 * static_cast<int64_t>(sizeof(ActQ8K));
  }
  return 0;
}

// The dispatch table of an ISA. Only called for supported ISAs.
const mm::DotTable& TableOf(Isa isa) {
  switch (isa) {
#ifdef POLYKV_HAVE_AVX512_KERNELS
    case Isa::kAvx512:
      return mm::Avx512Table();
#endif
#ifdef POLYKV_HAVE_AVX2_KERNELS
    case Isa::kAvx2:
      return mm::Avx2Table();
#endif
    default:
      return mm::ScalarTable();
  }
}

StatusOr<Isa> ResolveIsa(const MatMulOptions& o) {
  if (o.isa < 0) return BestIsa();
  if (o.isa > static_cast<int>(Isa::kAvx512))
    return absl::InvalidArgumentError(absl::StrCat("MatMul: unknown ISA number ", o.isa));
  const Isa isa = static_cast<Isa>(o.isa);
  if (!IsaSupported(isa))
    return absl::FailedPreconditionError(
        absl::StrCat("MatMul: ISA ", IsaName(isa), " is not supported by this CPU or build"));
  return isa;
}

// Per-thread scratch for quantized activations (grown, never shrunk).
std::vector<uint8_t>& ActScratch(int which) {
  thread_local std::vector<uint8_t> buf[mm::kActKinds];
  return buf[which];
}

// Whether products of n rows use the AMX tiles for the weight types they take: the one rule
// behind MatMulShared and MatMulUsesTiles (options.amx: -1 auto from kAmxMinRows rows on the
// avx512 variant, 0 never, 1 always; every case needs AmxInt8Supported()).
bool TilesWanted(const MatMulOptions& options, Isa isa, int64_t n) {
  if (options.amx == 0 || !AmxInt8Supported()) return false;
  return options.amx == 1 || (isa == Isa::kAvx512 && n >= kAmxMinRows);
}

// Whether the many-row kernels (DotTable::rows) may run: options.rows_kernels, where -1
// (auto) follows $POLYKV_ROWS_KERNELS (0 = off, for whole-program comparisons).
bool RowsKernelsWanted(const MatMulOptions& options, int64_t n) {
  static const bool env_off = [] {
    const char* e = std::getenv("POLYKV_ROWS_KERNELS");
    return e != nullptr && std::string_view(e) == "0";
  }();
  if (n < mm::kRowsFnMinRows || options.rows_kernels == 0) return false;
  return options.rows_kernels == 1 || !env_off;
}

// How far ahead of the row being computed the per-row kernels prefetch the weights, in
// bytes: 2 KiB (a few short rows; measured best of 0.5-8 KiB for 1-row decode on a 2-core
// Xeon VM with AVX-512, where it raised SmolLM2 Q4_1 decode by ~25%); $POLYKV_MM_PREFETCH
// overrides it (0 = off, for comparisons).
int64_t PrefetchAheadBytes() {
  static const int64_t bytes = [] {
    const char* e = std::getenv("POLYKV_MM_PREFETCH");
    return e != nullptr ? std::max<int64_t>(0, std::atoll(e)) : int64_t{2048};
  }();
  return bytes;
}

// Per-thread scratch of the AMX and RowsFn panels (unpacked weights), 64-byte aligned.
uint8_t* PanelScratch(int64_t bytes) {
  thread_local std::vector<uint8_t> buf;
  const size_t need = static_cast<size_t>(bytes) + 64;
  if (buf.size() < need) buf.resize(need);
  const uintptr_t p = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - p % 64) % 64);
}

}  // namespace

const char* WeightTypeName(WeightType type) {
  const int i = TypeIndexOf(type);
  return i < 0 ? "unsupported" : kTypes[i].name;
}

bool IsSupportedWeightType(uint32_t type) {
  return TypeIndexOf(static_cast<WeightType>(type)) >= 0;
}

StatusOr<BlockFormat> WeightBlockFormat(WeightType type) {
  const int i = TypeIndexOf(type);
  if (i < 0)
    return absl::UnimplementedError(
        absl::StrCat("weight type ", static_cast<uint32_t>(type), " has no matrix kernels"));
  return BlockFormat{kTypes[i].values, kTypes[i].bytes};
}

StatusOr<WeightView> MakeWeightView(WeightType type, const void* data, uint64_t available,
                                    int64_t rows, int64_t cols) {
  POLYKV_ASSIGN_OR_RETURN(BlockFormat f, WeightBlockFormat(type));
  if (rows < 1 || cols < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("weight matrix [", rows, "][", cols, "]: sizes must be >= 1"));
  if (cols % f.values != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        WeightTypeName(type), " needs cols to be a multiple of ", f.values, ", got ", cols));
  const int64_t row_bytes = cols / f.values * f.bytes;
  if (rows > static_cast<int64_t>(available / static_cast<uint64_t>(row_bytes)))
    return absl::DataLossError(absl::StrCat("weight matrix [", rows, "][", cols, "] ",
                                            WeightTypeName(type), " needs ", rows * row_bytes,
                                            " bytes, only ", available, " available"));
  if (data == nullptr) return absl::InvalidArgumentError("weight matrix: null data");
  WeightView v;
  v.type = type;
  v.data = data;
  v.rows = rows;
  v.cols = cols;
  v.row_bytes = row_bytes;
  return v;
}

Status MatMul(const WeightView& w, const float* x, int64_t n, int64_t x_stride, float* y,
              int64_t y_stride, const MatMulOptions& options) {
  const MatMulOutput out{&w, y, y_stride};
  return MatMulShared(absl::MakeConstSpan(&out, 1), x, n, w.cols, x_stride, options);
}

namespace {

// One output of a MatMulShared call: its kernel, activation format and first row in the
// concatenation of all outputs' rows.
struct MatMulJob {
  const MatMulOutput* out;
  mm::DotFn fn;
  mm::RowsFn rows;  // all n activation rows per weight row (kQ8T), or nullptr
  int act;
  int64_t nb;                     // blocks (or values) per row
  int64_t row_begin;              // in the concatenation of all outputs' rows
  int ti;                         // mm::TypeIndex
  bool amx;                       // AMX tile panels (activations: kQ8 rows, read as the A tiles)
  mm::PackedFn packed = nullptr;  // 1 row over WeightView::packed (kQ8 rows), or nullptr
};

// A MatMulShared call in steps: one checked job per output (AddJobs), the activations'
// buffers (PrepareActivations), quantized once per family (QuantizeRows), then the output
// rows (RunRows), each step over a range so that the threads can share it.
class MatMulRun {
 public:
  MatMulRun(const float* x, int64_t n, int64_t cols, int64_t x_stride, Isa isa,
            const MatMulOptions& options)
      : x_(x),
        n_(n),
        cols_(cols),
        x_stride_(x_stride),
        isa_(isa),
        options_(options),
        table_(TableOf(isa)) {}
  MatMulRun(const MatMulRun&) = delete;
  MatMulRun& operator=(const MatMulRun&) = delete;

  // One job per output, checked against the activations; amx_on: TilesWanted.
  Status AddJobs(absl::Span<const MatMulOutput> outputs, bool amx_on);
  // The activation formats' row buffers (f32 rows are used as they are); whether any
  // format needs quantized rows is Quantizes().
  Status PrepareActivations();
  bool Quantizes() const { return quantize_; }
  int64_t TotalRows() const { return total_rows_; }
  // Activation rows [begin, end) into every format a job reads.
  void QuantizeRows(int64_t begin, int64_t end) const;
  // Output rows [begin, end) of the concatenation of all outputs' rows.
  void RunRows(int64_t begin, int64_t end) const;

 private:
  // Rows [rb, re) of one job's output.
  void RunJobRows(const MatMulJob& job, int64_t rb, int64_t re) const;

  const float* x_;
  const int64_t n_, cols_, x_stride_;
  const Isa isa_;
  const MatMulOptions& options_;
  const mm::DotTable& table_;
  MatMulJob jobs_[8];
  std::vector<MatMulJob> more_;
  MatMulJob* job_list_ = jobs_;
  size_t njobs_ = 0;
  bool need_[mm::kActKinds] = {};
  int64_t total_rows_ = 0;
  const uint8_t* act_[mm::kActKinds] = {};
  int64_t act_stride_[mm::kActKinds] = {};
  bool quantize_ = false;
};

Status MatMulRun::AddJobs(absl::Span<const MatMulOutput> outputs, bool amx_on) {
  if (outputs.size() > 8) {
    more_.resize(outputs.size());
    job_list_ = more_.data();
  }
  const int64_t cols = cols_;
  for (const MatMulOutput& o : outputs) {
    if (o.w == nullptr || o.y == nullptr || o.w->data == nullptr)
      return absl::InvalidArgumentError("MatMul: null weight or output");
    const WeightView& w = *o.w;
    const int ti = TypeIndexOf(w.type);
    if (ti < 0)
      return absl::UnimplementedError(absl::StrCat(
          "MatMul: weight type ", static_cast<uint32_t>(w.type), " has no matrix kernels"));
    if (w.cols != cols)
      return absl::InvalidArgumentError(
          absl::StrCat("MatMul: weight has ", w.cols, " cols, activations ", cols));
    if (cols % kTypes[ti].values != 0 || w.row_bytes != cols / kTypes[ti].values * kTypes[ti].bytes)
      return absl::InvalidArgumentError(
          absl::StrCat("MatMul: ", kTypes[ti].name, " weight view with inconsistent row_bytes"));
    if (o.y_stride < w.rows)
      return absl::InvalidArgumentError(
          absl::StrCat("MatMul: y_stride ", o.y_stride, " < rows ", w.rows));
    mm::DotFn fn = table_.dot[ti];
    if (fn == nullptr)
      return absl::UnimplementedError(
          absl::StrCat("MatMul: no ", table_.isa, " kernel for ", kTypes[ti].name));
    const bool amx = amx_on && mm::AmxTypeSupported(ti);
    const mm::RowsFn rows_fn = !amx && RowsKernelsWanted(options_, n_) ? table_.rows[ti] : nullptr;
    const mm::PackedFn packed = !amx && n_ == 1 && w.packed != nullptr && options_.packed != 0
                                    ? table_.packed[ti]
                                    : nullptr;
    const int act = amx || packed ? static_cast<int>(ActKind::kQ8)
                    : rows_fn     ? static_cast<int>(ActKind::kQ8T)
                                  : static_cast<int>(kTypes[ti].act);
    job_list_[njobs_++] =
        MatMulJob{&o, fn, rows_fn, act, cols / kTypes[ti].values, total_rows_, ti, amx, packed};
    need_[act] = true;
    total_rows_ += w.rows;
  }
  return absl::OkStatus();
}

Status MatMulRun::PrepareActivations() {
  act_[0] = reinterpret_cast<const uint8_t*>(x_);
  act_stride_[0] = x_stride_ * 4;
  if ((need_[1] || need_[2] || need_[4]) && cols_ % 32 != 0)
    return absl::InvalidArgumentError("MatMul: cols % 32 != 0");
  if (need_[3] && cols_ % 256 != 0) return absl::InvalidArgumentError("MatMul: cols % 256 != 0");
  for (int k = 1; k < mm::kActKinds; ++k) {
    if (!need_[k]) continue;
    quantize_ = true;
    // Rows start on 64-byte boundaries (whole-register loads of the codes never split a
    // cache line; kQ8T rows' groups are 512 bytes, their residual codes at 32 nb).
    const int64_t rb = (ActRowBytes(static_cast<ActKind>(k), cols_) + 63) / 64 * 64;
    std::vector<uint8_t>& buf = ActScratch(k);
    if (buf.size() < static_cast<size_t>(rb * n_ + 64))
      buf.resize(static_cast<size_t>(rb * n_ + 64));
    const uintptr_t addr = reinterpret_cast<uintptr_t>(buf.data());
    act_[k] = buf.data() + (64 - addr % 64) % 64;
    act_stride_[k] = rb;
  }
  return absl::OkStatus();
}

void MatMulRun::QuantizeRows(int64_t begin, int64_t end) const {
  // The activation bytes do not depend on the ISA (the AVX2 quantizer writes the scalar
  // one's bytes), so the fastest one the CPU has is used whatever table computes.
  auto quantize_q8 = &mm::QuantizeActQ8;
#ifdef POLYKV_HAVE_AVX2_KERNELS
  if (IsaSupported(Isa::kAvx2) && isa_ != Isa::kScalar) quantize_q8 = &mm::QuantizeActQ8Avx2;
#endif
  const int64_t cols = cols_;
  for (int64_t i = begin; i < end; ++i) {
    if (options_.row_prologue != nullptr) (*options_.row_prologue)(i);
    for (int k : {1, 2, 4}) {
      if (!need_[k]) continue;
      uint8_t* row = const_cast<uint8_t*>(act_[k]) + i * act_stride_[k];
      quantize_q8(x_ + i * x_stride_, cols, k == 2, row);
      if (k == 4) mm::InterleaveActQ8T(row, cols / 32);
    }
    if (need_[3])
      mm::QuantizeActQ8K(
          x_ + i * x_stride_, cols,
          reinterpret_cast<ActQ8K*>(const_cast<uint8_t*>(act_[3]) + i * act_stride_[3]));
  }
}

void MatMulRun::RunJobRows(const MatMulJob& job, int64_t rb, int64_t re) const {
  const WeightView& w = *job.out->w;
  const int64_t n = n_;
  const uint8_t* a = act_[job.act];
  const int64_t as = act_stride_[job.act];
  float* y = job.out->y;
  const int64_t ys = job.out->y_stride;
#ifdef POLYKV_HAVE_AMX_KERNELS
  if (job.amx) {
    uint8_t* scratch = PanelScratch(mm::AmxPanelScratchBytes(job.nb));
    if (w.packed != nullptr && options_.packed != 0 && rb % 16 == 0 &&
        PackedLayoutSupported(w.type)) {  // panels as they lie in the packed layout
      for (int64_t o = rb; o < re; o += 16)
        mm::AmxPackedPanel(job.ti, static_cast<const uint8_t*>(w.packed) + o * w.row_bytes,
                           static_cast<int>(std::min<int64_t>(16, re - o)), job.nb, a, as, n, y + o,
                           ys, scratch);
      mm::AmxRelease();
      return;
    }
    for (int64_t o = rb; o < re; o += 16) {
      const int m = static_cast<int>(std::min<int64_t>(16, re - o));
      mm::AmxPanel(job.ti, static_cast<const uint8_t*>(w.data) + o * w.row_bytes, w.row_bytes, m,
                   job.nb, a, as, n, y + o, ys, scratch);
    }
    mm::AmxRelease();
    return;
  }
#endif
  if (job.packed != nullptr) {  // n == 1: panels of 16 rows, rows outside [rb, re) dropped
    const auto* panels = static_cast<const uint8_t*>(w.packed);
    const int64_t panel_bytes = 16 * w.row_bytes;
    for (int64_t o = rb; o < re;) {  // (the kernel prefetches the panels itself)
      const int64_t p0 = o / 16 * 16, end = std::min(re, p0 + 16);
      const uint8_t* panel = panels + p0 / 16 * panel_bytes;
      float tmp[16];
      job.packed(panel, job.nb, a, static_cast<int>(std::min<int64_t>(16, w.rows - p0)), tmp);
      std::copy(tmp + (o - p0), tmp + (end - p0), y + o);
      o = end;
    }
    return;
  }
  if (job.rows != nullptr) {
    uint8_t* scratch = PanelScratch(mm::RowsPanelScratchBytes(job.nb));
    for (int64_t o = rb; o < re; o += 16) {
      const int m = static_cast<int>(std::min<int64_t>(16, re - o));
      job.rows(static_cast<const uint8_t*>(w.data) + o * w.row_bytes, w.row_bytes, m, job.nb, a, as,
               n, y + o, ys, scratch);
    }
    return;
  }
  float tmp[mm::kMaxRowsPerCall];
  const int64_t ahead = PrefetchAheadBytes();
  for (int64_t o = rb; o < re; ++o) {
    const uint8_t* wrow = static_cast<const uint8_t*>(w.data) + o * w.row_bytes;
    // The weights are read once per product: start the loads of the rows `ahead` bytes on
    // while this row computes (prefetches never fault, so the matrix end needs no check).
    for (int64_t off = 0; off < w.row_bytes && ahead > 0; off += 64)
      __builtin_prefetch(wrow + ahead + off, 0, 3);
    for (int64_t i = 0; i < n; i += mm::kMaxRowsPerCall) {
      const int nx = static_cast<int>(std::min<int64_t>(mm::kMaxRowsPerCall, n - i));
      job.fn(wrow, job.nb, a + i * as, as, nx, tmp);
      for (int t = 0; t < nx; ++t) y[(i + t) * ys + o] = tmp[t];
    }
  }
}

void MatMulRun::RunRows(int64_t begin, int64_t end) const {
  for (size_t j = 0; j < njobs_; ++j) {
    const MatMulJob& job = job_list_[j];
    const int64_t rb = std::max(begin, job.row_begin) - job.row_begin;
    const int64_t re = std::min(end, job.row_begin + job.out->w->rows) - job.row_begin;
    RunJobRows(job, rb, re);
  }
}

}  // namespace

Status MatMulShared(absl::Span<const MatMulOutput> outputs, const float* x, int64_t n, int64_t cols,
                    int64_t x_stride, const MatMulOptions& options) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("MatMul: n = ", n, " < 0"));
  if (n == 0 || outputs.empty()) return absl::OkStatus();
  if (x == nullptr) return absl::InvalidArgumentError("MatMul: null activations");
  if (x_stride < cols)
    return absl::InvalidArgumentError(
        absl::StrCat("MatMul: x_stride ", x_stride, " < cols ", cols));
  POLYKV_ASSIGN_OR_RETURN(Isa isa, ResolveIsa(options));
  if (options.amx == 1 && !AmxInt8Supported())
    return absl::FailedPreconditionError(
        "MatMul: AMX-INT8 tiles were requested, but this CPU, OS or build has none");
  MatMulRun run(x, n, cols, x_stride, isa, options);
  POLYKV_RETURN_IF_ERROR(run.AddJobs(outputs, TilesWanted(options, isa, n)));
  POLYKV_RETURN_IF_ERROR(run.PrepareActivations());
  const int64_t total_rows = run.TotalRows();
  const int threads = std::max(1, options.threads > 0 ? options.threads : ComputeThreads());
  // Rows that are not quantized still get their prologue first.
  const bool prologue_only = !run.Quantizes() && options.row_prologue != nullptr;
  if (threads <= 1 || total_rows * n < 256) {
    if (run.Quantizes() || prologue_only) run.QuantizeRows(0, n);
    run.RunRows(0, total_rows);
    return absl::OkStatus();
  }
  // Output rows in chunks of kChunk (a multiple of 16, the panels' height), claimed by the
  // threads in turn. Few activation rows (decode): about 4 chunks per thread, as each chunk
  // of 16 rows is only ~1 us of work there and claiming one costs a shared cache line; up
  // to kFewRowsChunked rows (batched decode): about 2 (one claim per 16-row panel held 16
  // rows' AMX products at 123 GMAC/s on 2 threads, 8 chunks per thread 184; 2 per thread
  // leave fewer chunks starting on a panel nobody prefetched: +4% on a 16-session decode
  // step); more rows: chunks of 16. No value depends on the chunks (every output row is
  // computed whole by one thread).
  constexpr int64_t kFewRowsChunked = 64;
  const int64_t per_thread = n <= 4 ? 4 : n <= kFewRowsChunked ? 2 : 0;
  const int64_t kChunk = per_thread > 0
                             ? std::max<int64_t>(16, total_rows / (per_thread * threads) / 16 * 16)
                             : int64_t{16};
  const int64_t chunks = (total_rows + kChunk - 1) / kChunk;
  if (run.Quantizes() || prologue_only)
    internal::RunTasks(n, threads, [&run](int64_t i) { run.QuantizeRows(i, i + 1); });
  internal::RunTasks(chunks, threads, [&](int64_t c) {
    run.RunRows(c * kChunk, std::min(total_rows, (c + 1) * kChunk));
  });
  return absl::OkStatus();
}

bool MatMulUsesTiles(WeightType type, int64_t n, const MatMulOptions& options) {
  const int ti = TypeIndexOf(type);
  if (ti < 0 || !mm::AmxTypeSupported(ti)) return false;
  auto isa = ResolveIsa(options);
  return isa.ok() && TilesWanted(options, *isa, n);
}

bool PackedLayoutSupported(WeightType type) {
  return type == WeightType::kQ4_0 || type == WeightType::kQ4_1 || type == WeightType::kQ8_0;
}

int64_t PackedWeightBytes(const WeightView& w) {
  if (!PackedLayoutSupported(w.type)) return 0;
  return (w.rows + 15) / 16 * 16 * w.row_bytes;
}

Status PackWeights(const WeightView& w, absl::Span<uint8_t> out) {
  if (!PackedLayoutSupported(w.type))
    return absl::UnimplementedError(
        absl::StrCat("PackWeights: no packed layout for ", WeightTypeName(w.type)));
  const int64_t need = PackedWeightBytes(w);
  if (static_cast<int64_t>(out.size()) < need)
    return absl::InvalidArgumentError(
        absl::StrCat("PackWeights: ", out.size(), " bytes for a ", need, "-byte layout"));
  const int ti = TypeIndexOf(w.type);
  const int64_t kb = kTypes[ti].bytes, nb = w.cols / kTypes[ti].values;
  const int64_t scales = w.type == WeightType::kQ4_1 ? 2 : 1;  // f16 d (and m) first
  const int64_t code_bytes = kb - 2 * scales;
  const auto* src = static_cast<const uint8_t*>(w.data);
  std::vector<uint8_t> zero(static_cast<size_t>(kb), 0);
  for (int64_t p = 0; p < (w.rows + 15) / 16; ++p) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* dst = out.data() + (p * nb + b) * 16 * kb;
      for (int64_t r = 0; r < 16; ++r) {
        const int64_t row = 16 * p + r;
        const uint8_t* blk = row < w.rows ? src + row * w.row_bytes + b * kb : zero.data();
        for (int64_t t = 0; t < code_bytes / 4; ++t)
          std::memcpy(dst + 64 * t + 4 * r, blk + 2 * scales + 4 * t, 4);
        for (int64_t s = 0; s < scales; ++s)
          std::memcpy(dst + 16 * code_bytes + 32 * s + 2 * r, blk + 2 * s, 2);
      }
    }
  }
  return absl::OkStatus();
}

Status DequantizeRowsParallel(const WeightView& w, int64_t begin, int64_t end, float* out) {
  if (begin < 0 || end > w.rows || begin > end)
    return absl::InvalidArgumentError(absl::StrCat("DequantizeRowsParallel: rows [", begin, ", ",
                                                   end, ") outside [0, ", w.rows, ")"));
  constexpr int64_t kRowsPerTask = 16;
  const int64_t tasks = (end - begin + kRowsPerTask - 1) / kRowsPerTask;
  if (tasks <= 1) return DequantizeRows(w, begin, end, out);
  std::vector<Status> errors(static_cast<size_t>(tasks));
  internal::RunTasks(tasks, std::max(1, ComputeThreads()), [&](int64_t t) {
    const int64_t b = begin + t * kRowsPerTask, e = std::min(end, b + kRowsPerTask);
    errors[static_cast<size_t>(t)] = DequantizeRows(w, b, e, out + (b - begin) * w.cols);
  });
  for (const Status& s : errors) POLYKV_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

Status DequantizeRows(const WeightView& w, int64_t begin, int64_t end, float* out) {
  const int ti = TypeIndexOf(w.type);
  if (ti < 0)
    return absl::UnimplementedError(absl::StrCat("DequantizeRows: weight type ",
                                                 static_cast<uint32_t>(w.type), " unsupported"));
  if (begin < 0 || end > w.rows || begin > end)
    return absl::InvalidArgumentError(
        absl::StrCat("DequantizeRows: rows [", begin, ", ", end, ") outside [0, ", w.rows, ")"));
  if (end == begin) return absl::OkStatus();
  if (out == nullptr || w.data == nullptr)
    return absl::InvalidArgumentError("DequantizeRows: null pointer");
  const mm::BlockDequantFn fn = mm::BlockDequant(ti);
  const int64_t nb = w.cols / kTypes[ti].values;
#ifdef POLYKV_HAVE_AVX2_KERNELS
  if (IsaSupported(Isa::kAvx2) && BestIsa() != Isa::kScalar &&
      mm::DequantizeBlocksAvx2(ti, static_cast<const uint8_t*>(w.data) + begin * w.row_bytes,
                               (end - begin) * nb, out))
    return absl::OkStatus();  // rows are contiguous: one run of blocks
#endif
  for (int64_t r = begin; r < end; ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * w.row_bytes;
    float* o = out + (r - begin) * w.cols;
    for (int64_t b = 0; b < nb; ++b) fn(row + b * kTypes[ti].bytes, o + b * kTypes[ti].values);
  }
  return absl::OkStatus();
}

Status DequantizeValues(WeightType type, const void* data, uint64_t bytes, int64_t count,
                        float* out) {
  const int ti = TypeIndexOf(type);
  if (ti < 0)
    return absl::UnimplementedError(
        absl::StrCat("weight type ", static_cast<uint32_t>(type), " cannot be dequantized"));
  if (count < 0 || count % kTypes[ti].values != 0)
    return absl::InvalidArgumentError(absl::StrCat(count, " values of ", kTypes[ti].name,
                                                   " are not a whole number of blocks of ",
                                                   kTypes[ti].values));
  const uint64_t need = static_cast<uint64_t>(count / kTypes[ti].values) * kTypes[ti].bytes;
  if (bytes < need)
    return absl::InvalidArgumentError(
        absl::StrCat(count, " values of ", kTypes[ti].name, " need ", need, " bytes, got ", bytes));
  if (count == 0) return absl::OkStatus();
  if (data == nullptr || out == nullptr)
    return absl::InvalidArgumentError("DequantizeValues: null pointer");
  const mm::BlockDequantFn fn = mm::BlockDequant(ti);
  const int64_t nb = count / kTypes[ti].values;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  for (int64_t b = 0; b < nb; ++b) fn(p + b * kTypes[ti].bytes, out + b * kTypes[ti].values);
  return absl::OkStatus();
}

}  // namespace polykv::kernels
