// Matrix products directly over weight blocks as they lie in a model file (GGUF block
// types, safetensors F32/F16/BF16), for decode (1 activation row) and small batches (an
// agent's prompt, up to a few dozen rows). No weights are converted or copied: a
// WeightView points into a read-only mapping shared by every process on the host.
//
// Math: y[r][o] = sum_i x[r][i] * W[o][i] for r < n (activation rows), o < rows (outputs).
// W is row-major [rows][cols]: each row is cols / BlockValues(type) consecutive blocks.
//
// Activation precision (how each weight family multiplies, fastest on integer SIMD):
//  - F32, F16, BF16 weights: f32 activations, f32 products and accumulation (FMA).
//  - Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 weights (blocks of 32): activations are quantized on the
//    fly per block of 32 to 8-bit codes plus 8-bit residual codes: d = absmax / 127,
//    f = x / d, q1 = rint(f), q2 = rint(256 (f - q1)) in [-127, 127], so x ~= d (q1 + q2 / 256)
//    to 1/512 of d. Both codes multiply the u8 weight codes with the same integer
//    instructions (vpdpbusd / vpmaddubsw): the block dot product 256 dot(w, q1) + dot(w, q2)
//    is exact in int32, then scaled by d_w * d / 256 (+ the weight's min/offset term times the
//    activation's block sum). Measured on SmolLM2-135M Q4_1: max |dlogit| vs the f32 path
//    0.006 (8-bit codes alone: 0.48-1.17).
//  - Q4_K, Q5_K, Q6_K weights (super-blocks of 256): the same 8-bit codes + 8-bit residual
//    codes per block of 256, with one f32 scale and 16 exact partial sums of 16 values each
//    (for the weights' min and offset terms).
//  The scalar reference uses the same activation bytes, so every ISA variant agrees with it
//  to float reassociation (~1e-6 relative).
//
// Block layouts (little-endian; "f16" = IEEE binary16; as ggml's block_* structs):
//   Q4_0 (32 values, 18 B):  f16 d | u8 qs[16]             w[j] = (lo(qs[j]) - 8) d,
//                                                           w[j+16] = (hi(qs[j]) - 8) d
//   Q4_1 (32 values, 20 B):  f16 d | f16 m | u8 qs[16]     w[j] = lo d + m, w[j+16] = hi d + m
//   Q5_0 (32 values, 22 B):  f16 d | u32 qh | u8 qs[16]    5th bit of w[j] is qh bit j, of
//                                                           w[j+16] bit j+16; w = (q5 - 16) d
//   Q5_1 (32 values, 24 B):  f16 d | f16 m | u32 qh | u8 qs[16]   w = q5 d + m
//   Q8_0 (32 values, 34 B):  f16 d | i8 qs[32]             w[j] = qs[j] d
//   Q4_K (256 values, 144 B): f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
//        8 sub-blocks of 32 with 6-bit scale sc and min mn: w = d sc q - dmin mn; the 32
//        bytes qs[32i..32i+31] hold sub-block 2i in their low and 2i+1 in their high nibbles.
//   Q5_K (256 values, 176 B): f16 d | f16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128]
//        as Q4_K plus a 5th bit: sub-block 2i value l has bit 2i of qh[l], 2i+1 bit 2i+1.
//   Q6_K (256 values, 210 B): u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d
//        16 sub-blocks of 16: w = d sc (q6 - 32); for each half h (128 values), l < 32:
//        q6[l] = lo(ql[l]) | bits 0-1 of qh[l], q6[l+32] = lo(ql[l+32]) | bits 2-3,
//        q6[l+64] = hi(ql[l]) | bits 4-5, q6[l+96] = hi(ql[l+32]) | bits 6-7 (ql += 64,
//        qh += 32, scales += 8 per half).
//
// Batches of rows (n >= kAmxMinRows) on CPUs with AMX-INT8 use tile kernels for the 32-value
// block types: panels of 16 weight rows x 16 activation rows, the weights' codes unpacked
// to bytes and multiplied with the same 8-bit codes + residual codes (tdpbusd / tdpbssd),
// then the scalar reference's f32 epilogue per block: bit-identical to the scalar reference.
//
// Threads: outputs are split over ComputeThreads() threads in contiguous row ranges (a
// fixed partition of the rows: results do not depend on the thread count).
#pragma once

#include <cstdint>
#include <functional>

#include "absl/types/span.h"
#include "polykv/kernels/cpu.h"
#include "polykv/status.h"

namespace polykv::kernels {

/// Storage type of a weight matrix: the ggml types with matrix kernels, valued by their ggml
/// type numbers (names and block sizes: kGgmlTypes in ggml_types.h).
enum class WeightType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

/// "F32", "Q4_1", ...; "type N" for a number that is not a WeightType.
const char* WeightTypeName(WeightType type);

/// Whether `type` (a raw ggml number) is a WeightType with matrix kernels.
bool IsSupportedWeightType(uint32_t type);

/// Values per block (1 for F32/F16/BF16, 32 or 256) and bytes per block.
struct BlockFormat {
  int32_t values = 0;
  int32_t bytes = 0;
};

/// Block format of `type`. Errors: kUnimplemented naming the type.
[[nodiscard]] StatusOr<BlockFormat> WeightBlockFormat(WeightType type);

/// A read-only weight matrix [rows][cols] in its storage format. Not owning.
struct WeightView {
  WeightType type = WeightType::kF32;
  const void* data = nullptr;  ///< rows * row_bytes bytes (any alignment)
  int64_t rows = 0;            ///< output features
  int64_t cols = 0;            ///< input features (a multiple of the block's values)
  int64_t row_bytes = 0;       ///< cols / values * bytes
  /// Optional: the same matrix in the decode panel layout (PackWeights, PackedWeightBytes
  /// bytes, 64-byte aligned), read instead of `data` by 1-row products on the avx512
  /// variant and by the AMX tiles (panels that start on a multiple of 16 rows: no per-block
  /// gathers, the same bits); nullptr = none.
  const void* packed = nullptr;
  int64_t bytes() const { return rows * row_bytes; }
};

/// Builds a view after checking that cols is a whole number of blocks and that
/// rows * row_bytes <= `available` bytes at `data`. Errors: kInvalidArgument naming the
/// shape (e.g. "Q4_K needs cols to be a multiple of 256, got 576"), kDataLoss when the data
/// would run past `available`, kUnimplemented for an unknown type.
[[nodiscard]] StatusOr<WeightView> MakeWeightView(WeightType type, const void* data,
                                                  uint64_t available, int64_t rows, int64_t cols);

/// Activation rows from which MatMul uses the AMX-INT8 tile kernels by default (where the
/// CPU has them): measured with bench_matmul / bench_model --crossover (README).
inline constexpr int64_t kAmxMinRows = 4;

/// Options of the matrix kernels.
struct MatMulOptions {
  /// kScalar/kAvx2/kAvx512 to force a variant (kFailedPrecondition when the CPU lacks
  /// it); unset (-1) = BestIsa().
  int isa = -1;
  /// Threads; 0 = ComputeThreads().
  int threads = 0;
  /// AMX-INT8 tiles for the 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; other types
  /// keep the vector kernels): -1 (auto) uses them for n >= kAmxMinRows when the ISA is
  /// avx512 and AmxInt8Supported(); 0 never; 1 for every n (kFailedPrecondition where
  /// AmxInt8Supported() is false). Tile results equal the scalar reference bit for bit (the
  /// same integer block sums, the same f32 operations in the same order); the vector kernels
  /// differ from it by float reassociation (~1e-6 relative).
  int amx = -1;
  /// Many-row kernels of the avx512 variant for Q4_0/Q4_1 (16 blocks per register, the
  /// weight row unpacked once for all n rows): -1 (auto) / 1 use them for n >= 4 rows where
  /// AMX tiles do not run, 0 keeps the per-row kernels (for comparison in benchmarks and
  /// tests; $POLYKV_ROWS_KERNELS=0 does the same for -1). Their results differ from the
  /// scalar reference by float reassociation only.
  int rows_kernels = -1;
  /// Products over WeightView::packed where set (1 row on the avx512 variant; AMX tiles):
  /// -1 (auto) / 1 use it, 0 reads `data` (for comparisons). 1-row results differ from the
  /// scalar reference by float reassociation only; the tiles' are bit-identical either way.
  int packed = -1;
  /// Called once per activation row r < n before any product reads it, from the same
  /// parallel tasks that quantize the rows (so an element-wise step before the product, e.g.
  /// the row's RMSNorm or SiLU gate, costs no parallel region of its own); it may write x's
  /// row r and nothing another row's call reads. Null: none.
  const std::function<void(int64_t)>* row_prologue = nullptr;
};

/// y[r * y_stride + o] = sum_i x[r * x_stride + i] * W[o][i] for r < n, o < W.rows.
/// x: f32 [n][>= cols] (x_stride >= cols), y: f32 [n][>= rows] (y_stride >= rows).
/// Errors: kInvalidArgument for n < 0, bad strides or null pointers; kUnimplemented for a
/// weight type without kernels; kFailedPrecondition for a forced ISA the CPU lacks.
[[nodiscard]] Status MatMul(const WeightView& w, const float* x, int64_t n, int64_t x_stride,
                            float* y, int64_t y_stride, const MatMulOptions& options = {});

/// Whether MatMul of `n` rows over a `type` weight with `options` runs on the AMX-INT8 tiles
/// (which stay faster than dequantized tiles + f32 GEMM at every batch size: the runtime
/// uses them for a long prefill too; bench_model --crossover).
bool MatMulUsesTiles(WeightType type, int64_t n, const MatMulOptions& options = {});

/// One output of MatMulShared: a weight matrix and where its product goes.
struct MatMulOutput {
  const WeightView* w = nullptr;
  float* y = nullptr;    ///< [n][>= w->rows]
  int64_t y_stride = 0;  ///< >= w->rows
};

/// Several products of the same activations x (e.g. the Q, K and V projections, or the
/// gate and up projections): the activations are quantized once per block family and the
/// rows of all outputs are split over the threads together (one parallel region).
/// Every output's cols must equal `cols`. Errors as MatMul.
[[nodiscard]] Status MatMulShared(absl::Span<const MatMulOutput> outputs, const float* x, int64_t n,
                                  int64_t cols, int64_t x_stride,
                                  const MatMulOptions& options = {});

/// The decode panel layout of Q4_0, Q4_1 and Q8_0 matrices ("packed" weights, after the
/// repacked layouts of llama.cpp's AMX and ARM back-ends): rows in panels of 16 (the last
/// padded with zero rows), a panel's 32-value blocks in order, and per panel and block the
/// 16 rows' code bytes dword-interleaved (64-byte register t holds, in dword r, row r's
/// code bytes 4t..4t+3: 4 registers for Q4, 8 for Q8_0), then the 16 rows' f16 d, then
/// (Q4_1) their f16 m. One vpdpbusd then multiplies 4 values of 16 rows by one broadcast of
/// 4 activation codes, and a 1-row product needs no horizontal sums and no per-row scale
/// gathers. The same bytes as the blocks, reordered: 16 * row_bytes per panel.
bool PackedLayoutSupported(WeightType type);

/// Bytes of the packed layout of `w`: ceil(rows / 16) * 16 * row_bytes (0 for a type
/// without one).
int64_t PackedWeightBytes(const WeightView& w);

/// Writes the packed layout of `w` (PackedWeightBytes bytes) to `out`. Errors:
/// kUnimplemented for a type without a packed layout (PackedLayoutSupported),
/// kInvalidArgument when `out` is too small.
[[nodiscard]] Status PackWeights(const WeightView& w, absl::Span<uint8_t> out);

/// Dequantizes rows [begin, end) of `w` to f32 out[(r - begin) * cols + i]. Exact (the
/// format's own arithmetic, in f32). Errors: kInvalidArgument for a bad range.
[[nodiscard]] Status DequantizeRows(const WeightView& w, int64_t begin, int64_t end, float* out);

/// DequantizeRows split over the kernels' compute threads (ComputeThreads(), the calling
/// thread included) in tasks of 16 rows: the same values. Errors as DequantizeRows.
[[nodiscard]] Status DequantizeRowsParallel(const WeightView& w, int64_t begin, int64_t end,
                                            float* out);

/// Dequantizes `count` values of `type` from `data` (`bytes` long) to f32 `out`: the
/// layout-agnostic form of DequantizeRows used by loaders. Errors: kUnimplemented for an
/// unknown type; kInvalidArgument when count is not a whole number of blocks or `bytes` is
/// too small.
[[nodiscard]] Status DequantizeValues(WeightType type, const void* data, uint64_t bytes,
                                      int64_t count, float* out);

}  // namespace polykv::kernels
