// Internal pieces of the matrix kernels shared by the scalar reference and the SIMD
// variants: activation block formats, the per-ISA dot-product tables; f16 / bf16 loads are
// dtype::LoadF16 / dtype::LoadBf16 (dtype_convert.h).
// The SIMD sources (matmul_avx2.cc, matmul_avx512.cc) are compiled with their ISA flags:
// they include only this header and <immintrin.h> so that no inline function compiled
// with wider instructions can be shared with (and picked by the linker for) scalar code
// (dtype_convert.h, included here, is forced inline at every call: it emits no such copy).
#pragma once

#include <cstdint>
#include <cstring>

#include "polykv/kernels/dtype_convert.h"

namespace polykv::kernels::mm {

/// Q8 activation row for 32-value weight blocks (nb = cols / 32 blocks): 8-bit codes plus
/// 8-bit residual codes, i.e. ~16-bit activations multiplied with the same u8 x s8 integer
/// instructions. One buffer of ActQ8RowBytes(nb) bytes:
///   [q1: int8 x 32 nb][q2: int8 x 32 nb][dxs: f32 x nb][ds: f32 x nb]
/// with dx_b = absmax_b / 127, f = x / dx_b, q1 = rint(f) (ties to even), q2 = rint(256 (f -
/// q1)) clamped to [-127, 127], so that x ~= dx (q1 + q2 / 256) to 1/512 of dx (8-bit codes
/// alone: 1/2 of dx). Stored dxs_b = dx_b / 256 (exact), so x ~= dxs (256 q1 + q2), and
/// ds_b = dxs_b * (256 sum q1 + sum q2) (the integer sum exact, one rounding). A weight block
/// dot product is then I = 256 dot(w, q1) + dot(w, q2) (exact int32) times d_w * dxs.
/// Code order (the same for q1 and q2):
///  - kQ8 (Q5_0, Q5_1, Q8_0 weights): natural, block b at 32 b.
///  - kQ8P (Q4_0, Q4_1 weights, whose byte j holds values j and j + 16): each full group of
///    4 blocks is stored as [b0[0:16] b1[0:16] b2[0:16] b3[0:16] b0[16:32] b1[16:32]
///    b2[16:32] b3[16:32]] (128 bytes), so that 4 blocks' low nibbles meet their 64 values
///    in one 512-bit (or two 256-bit) loads; the nb % 4 blocks after the last full group are
///    stored naturally.
///  - kQ8T (Q4_0, Q4_1 weights against many rows on AVX-512, Q4RowsT): each full group of
///    16 blocks (512 codes) is stored as 8 registers of 16 dwords, register k's dword i =
///    dword k (values 4k..4k+3) of block 16 g + i, so that one vpdpbusd multiplies 4 values
///    of 16 blocks and each int32 lane holds one block's sum; the nb % 16 blocks after the
///    last full group are stored naturally. Written as kQ8 then InterleaveActQ8T.
inline constexpr int64_t kActQ8BytesPerBlock = 72;
static inline int64_t ActQ8RowBytes(int64_t nb) { return kActQ8BytesPerBlock * nb; }
/// The residual codes q2 (same layout as the codes at the row's start).
static inline const uint8_t* ActQ8Residual(const uint8_t* row, int64_t nb) { return row + 32 * nb; }
static inline uint8_t* ActQ8Residual(uint8_t* row, int64_t nb) { return row + 32 * nb; }
/// Every quantizer's last step for block b: dxs = d / 256 (d = absmax / 127) and
/// ds = dxs * sum, sum = 256 sum q1 + sum q2.
static inline void SetActQ8Scales(uint8_t* row, int64_t nb, int64_t b, float d, int32_t sum) {
  float* dx = reinterpret_cast<float*>(row + 64 * nb);
  float* ds = reinterpret_cast<float*>(row + 68 * nb);
  dx[b] = d * (1.0f / 256.0f);
  ds[b] = dx[b] * static_cast<float>(sum);
}
/// dxs = dx / 256 per block.
static inline const float* ActQ8Dx(const uint8_t* row, int64_t nb) {
  return reinterpret_cast<const float*>(row + 64 * nb);
}
static inline const float* ActQ8Ds(const uint8_t* row, int64_t nb) {
  return reinterpret_cast<const float*>(row + 68 * nb);
}
/// Byte offset of value v (0..31) of block b in the codes of a row (order above).
static inline int64_t ActQ8CodeOffset(bool permuted, int64_t nb, int64_t b, int v) {
  if (!permuted || b >= nb / 4 * 4) return 32 * b + v;
  const int64_t g = b / 4, r = b % 4;
  return 128 * g + (v < 16 ? 16 * r + v : 64 + 16 * r + (v - 16));
}

/// Q8 activations for 256-value super-blocks, with residual codes as for 32-value blocks:
/// dx = absmax / 127, f = x / dx, q[i] = rint(f), r[i] = rint(256 (f - q[i])) in [-127, 127];
/// stored d = dx / 256 (exact), so x ~= d (256 q + r); bsums[j] = sum over values
/// 16 j .. 16 j + 15 of (256 q + r) (exact). 580 bytes.
struct ActQ8K {
  float d;
  int32_t bsums[16];
  int8_t q[256];
  int8_t r[256];
};
static_assert(sizeof(ActQ8K) == 580, "ActQ8K layout");

/// Activation family a weight type multiplies with.
enum class ActKind : int { kF32 = 0, kQ8 = 1, kQ8P = 2, kQ8K = 3, kQ8T = 4 };
inline constexpr int kActKinds = 5;

/// Byte offset of value v (0..31) of block b in the codes of a kQ8T row.
static inline int64_t ActQ8TCodeOffset(int64_t nb, int64_t b, int v) {
  if (b >= nb / 16 * 16) return 32 * b + v;
  return 512 * (b / 16) + 64 * (v / 4) + 4 * (b % 16) + v % 4;
}

/// Internal dense index of the supported weight types (tables are indexed by it).
enum TypeIndex : int {
  kTF32 = 0,
  kTF16,
  kTBF16,
  kTQ4_0,
  kTQ4_1,
  kTQ5_0,
  kTQ5_1,
  kTQ8_0,
  kTQ4_K,
  kTQ5_K,
  kTQ6_K,
  kTypeCount
};

/// Dot products of one weight row (`nb` blocks; for F32/F16/BF16 `nb` = cols values) with
/// `nx` (1..kMaxRowsPerCall) activation rows: row j starts at x + j * x_row_bytes bytes (a
/// Q8 activation row, an ActQ8K array or f32 values, by the type's ActKind).
/// out[j] = the dot product.
using DotFn = void (*)(const uint8_t* w, int64_t nb, const uint8_t* x, int64_t x_row_bytes, int nx,
                       float* out);

/// Most activation rows one DotFn call handles.
inline constexpr int kMaxRowsPerCall = 8;

/// Dot products of a panel of `rows` (1..16) weight rows (`nb` blocks each, row_bytes apart)
/// with all `n` activation rows (kQ8T rows, x_row_bytes apart): y[j * ys + r] for j < n,
/// r < rows. The panel's blocks are unpacked once into `scratch` (RowsPanelScratchBytes,
/// 64-byte aligned) and shared by every activation row.
using RowsFn = void (*)(const uint8_t* w, int64_t row_bytes, int rows, int64_t nb, const uint8_t* x,
                        int64_t x_row_bytes, int64_t n, float* y, int64_t ys, uint8_t* scratch);
/// Scratch bytes of a RowsFn panel of 16 rows of nb blocks: per row, 640 bytes per full
/// 16-block group and 192 per pair of the blocks after them.
inline int64_t RowsPanelScratchBytes(int64_t nb) {
  return 16 * (nb / 16 * 640 + (nb % 16 + 1) / 2 * 192);
}

/// One panel of a packed matrix (PackWeights: `nb` blocks of 16 rows) times one kQ8
/// activation row in natural code order: y[r] for r < rows (1..16).
using PackedFn = void (*)(const uint8_t* panel, int64_t nb, const uint8_t* x, int rows, float* y);

/// Fewest activation rows for which a RowsFn is used instead of the DotFn.
inline constexpr int64_t kRowsFnMinRows = 4;

/// One ISA's kernels; a null entry means "no kernel for this type in this ISA" (dispatch
/// reports it as an error, never falls back silently). `rows` entries are optional: types
/// with one take kQ8T activations for kRowsFnMinRows rows or more.
struct DotTable {
  const char* isa = "";
  DotFn dot[kTypeCount] = {};
  RowsFn rows[kTypeCount] = {};
  PackedFn packed[kTypeCount] = {};  ///< 1-row products over packed weights (optional)
};

const DotTable& ScalarTable();
/// Defined only in builds whose compiler can emit the ISA (POLYKV_HAVE_AVX2_KERNELS,
/// POLYKV_HAVE_AVX512_KERNELS); the dispatcher calls them only when the CPU supports it.
const DotTable& Avx2Table();
const DotTable& Avx512Table();

/// Dequantizes one block (BlockFormat values) of the type at `type_index` to f32.
// ---- AMX-INT8 tiles (matmul_amx.cc; only called when AmxInt8Supported()) ------------

/// Whether `type_index` has an AMX panel kernel (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
bool AmxTypeSupported(int type_index);
/// Scratch bytes of AmxPanel for rows of nb blocks (64-byte aligned by the caller).
inline int64_t AmxPanelScratchBytes(int64_t nb) { return nb * (512 + 2 * 64); }
/// y[r * ys + o] for o < outputs (<= 16 weight rows from w, row_bytes apart) and the n
/// activation rows at x (kQ8 rows, x_row_bytes apart): bit-identical to the scalar
/// reference's dot products.
void AmxPanel(int type_index, const uint8_t* w, int64_t row_bytes, int outputs, int64_t nb,
              const uint8_t* x, int64_t x_row_bytes, int64_t n, float* y, int64_t ys,
              uint8_t* scratch);

/// Ends this thread's use of the tiles after AmxPanel / AmxPackedPanel calls (they keep the
/// tile configuration loaded from one panel to the next): call once per run of panels.
void AmxRelease();

/// AmxPanel over one packed panel (PackWeights; Q4_0, Q4_1, Q8_0 only) of `outputs` (<= 16)
/// rows starting at a multiple of 16: the same codes and scales, so the same bits, without
/// the per-block gathers.
void AmxPackedPanel(int type_index, const uint8_t* panel, int outputs, int64_t nb, const uint8_t* x,
                    int64_t x_row_bytes, int64_t n, float* y, int64_t ys, uint8_t* scratch);

using BlockDequantFn = void (*)(const uint8_t* block, float* out);
/// nullptr for an index outside [0, kTypeCount).
BlockDequantFn BlockDequant(int type_index);

/// Quantizes cols (a multiple of 32) f32 values to one Q8 activation row (layout above;
/// `permuted` selects kQ8P order).
void QuantizeActQ8(const float* x, int64_t cols, bool permuted, uint8_t* row);
/// Rewrites the full 16-block groups of a kQ8 row's codes and residual codes (nb blocks) in
/// kQ8T order, in place.
void InterleaveActQ8T(uint8_t* row, int64_t nb);
/// Dequantizes nb blocks of the type at `type_index` with AVX2 and the scalar reference's
/// exact results; false (nothing written) for a type it has no code for. AVX2 builds only.
bool DequantizeBlocksAvx2(int type_index, const uint8_t* src, int64_t nb, float* out);
/// The same bytes with AVX2 (builds with the AVX2 kernels; call only where supported).
void QuantizeActQ8Avx2(const float* x, int64_t cols, bool permuted, uint8_t* row);
/// Quantizes cols (a multiple of 256) f32 values to cols / 256 ActQ8K blocks.
void QuantizeActQ8K(const float* x, int64_t cols, ActQ8K* out);

/// 6-bit scale and min number j (0..7) of a Q4_K / Q5_K scales[12] array.
static inline void ScaleMinK4(int j, const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
    *mn = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

}  // namespace polykv::kernels::mm
