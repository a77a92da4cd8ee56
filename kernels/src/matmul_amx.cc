// AMX-INT8 tile kernels of the matrix products for batches of activation rows (an agent's
// prompt, a prefill), over the 32-value block types Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0.
// Compiled with -mamx-tile -mamx-int8 and the AVX-512 flags; the dispatcher (matmul.cc)
// calls it only when AmxInt8Supported() (CPUID + XCR0 + the kernel's permission to use the
// tile data state).
//
// Per panel of up to 16 weight rows (outputs o) and group of up to 16 activation rows j,
// per block b of 32 values:
//   A1, A2 = the activation rows' 8-bit codes q1 and residual codes q2 of block b, read
//            where the quantizer wrote them (kQ8 rows: 32 bytes per block)      [j][32]
//   B = the panel's weight codes of block b, one byte per value, in the tiles' VNNI
//       layout: B[k / 4][4 o + k % 4] = code of value k of output o          [8][64]
//   C1 = A1 B, C2 = A2 B (tdpbsud: s8 x u8; tdpbssd for Q8_0's signed codes), so
//   s = 256 C1 + C2 = sum_k (256 q1_k + q2_k) w_k exactly in int32, for j x 16 outputs.
// The f32 epilogue then does per output (j, o), in block order, exactly what the scalar
// reference (matmul_scalar.cc) does: acc += (d_w dx) s + m ds (Q4_1, Q5_1), acc += (d_w dx) s
// - (8 d_w) ds (Q4_0; 16 for Q5_0), acc += (d_w dx) s (Q8_0), with 16 outputs per vector;
// the file is compiled without FMA contraction, so every output equals the scalar
// reference bit for bit. Two pairs of accumulator tiles alternate between blocks, so that
// the epilogue of block b - 1 (vector units) runs while the tile unit multiplies block b.
// The weight codes and scales are gathered per panel (vpgatherdd: the CPUs with AMX are not
// affected by the Gather Data Sampling mitigation) and reused by every row group.
// Like the other SIMD sources, this file uses no std:: templates or other inline functions
// with external linkage (scratch comes from the caller), so nothing compiled here with AMX
// or AVX-512 instructions can be picked by the linker for code that runs on other CPUs.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "amx_tiles.h"
#include "matmul_internal.h"

namespace polykv::kernels::mm {
namespace {

// The tile configuration for row groups of `m` rows: tile 0 = A1, 1 = A2 ([m][32]), 2 = B
// ([8][64]), 3..6 = C ([m][64]: two pairs).
using amx::TileConfig;

// Row count of the configuration this thread has loaded (0: none, or released). LDTILECFG
// costs as much as a panel's unpacking, so a job's panels share one (AmxRelease ends it).
thread_local int loaded_rows = 0;

inline void LoadConfig(int m) {
  if (loaded_rows == m) return;
  loaded_rows = m;
  TileConfig c;
  for (int t = 0; t < 2; ++t) {
    c.rows[t] = static_cast<uint8_t>(m);
    c.colsb[t] = 32;
  }
  c.rows[2] = 8;
  c.colsb[2] = 64;
  for (int t = 3; t <= 6; ++t) {
    c.rows[t] = static_cast<uint8_t>(m);
    c.colsb[t] = 64;
  }
  _tile_loadconfig(&c);
}

enum class Kind { kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0 };

template <Kind K>
constexpr int64_t BlockBytes() {
  return K == Kind::kQ4_0   ? 18
         : K == Kind::kQ4_1 ? 20
         : K == Kind::kQ5_0 ? 22
         : K == Kind::kQ5_1 ? 24
                            : 34;
}

// Unpacks block b of the panel's m (<= 16) weight rows into B's VNNI layout (`codes`, 512
// bytes) and the per-output scale d and the epilogue's second factor f (m for Q4_1/Q5_1,
// 8 d / 16 d for Q4_0/Q5_0, 0 for Q8_0) as 16-lane vectors; outputs >= m are 0.
template <Kind K>
inline void UnpackBlock(const uint8_t* blk0, __m512i offs, __mmask16 live, uint8_t* codes,
                        float* dvec, float* fvec) {
  constexpr bool kMin = K == Kind::kQ4_1 || K == Kind::kQ5_1;
  constexpr bool kQ5 = K == Kind::kQ5_0 || K == Kind::kQ5_1;
  const __m512i zero = _mm512_setzero_si512();
  // dword 0 of each block: f16 d (and f16 m above it for Q4_1/Q5_1).
  const __m512i head = _mm512_mask_i32gather_epi32(zero, live, offs, blk0, 1);
  const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
  _mm512_storeu_ps(dvec, d);
  if constexpr (K == Kind::kQ8_0) {
    _mm512_storeu_ps(fvec, _mm512_setzero_ps());
    for (int kk = 0; kk < 8; ++kk)
      _mm512_storeu_si512(codes + 64 * kk,
                          _mm512_mask_i32gather_epi32(zero, live, offs, blk0 + 2 + 4 * kk, 1));
    return;
  } else {
    if constexpr (kMin) {
      _mm512_storeu_ps(fvec, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16))));
    } else {
      _mm512_storeu_ps(fvec, _mm512_mul_ps(_mm512_set1_ps(kQ5 ? 16.0f : 8.0f), d));
    }
    const uint8_t* qs = blk0 + (kMin ? 4 : 2) + (kQ5 ? 4 : 0);
    __m512i qh = zero;
    if constexpr (kQ5) qh = _mm512_mask_i32gather_epi32(zero, live, offs, blk0 + (kMin ? 4 : 2), 1);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int kk = 0; kk < 4; ++kk) {
      // Bytes 4kk..4kk+3 of qs: low nibbles = values 4kk.., high nibbles = values 16 + 4kk..
      const __m512i r = _mm512_mask_i32gather_epi32(zero, live, offs, qs + 4 * kk, 1);
      __m512i lo = _mm512_and_si512(r, m4);
      __m512i hi = _mm512_and_si512(_mm512_srli_epi32(r, 4), m4);
      if constexpr (kQ5) {
        // 5th bits of values 4kk..4kk+3 (qh bits 4kk..) and 16 + 4kk.. (qh bits 16 + 4kk..):
        // 4 bits spread to bit 4 of 4 bytes (x * 0x00204081 puts bit i at bit 8 i; the four
        // shifted copies do not overlap).
        const __m512i spread = _mm512_set1_epi32(0x00204081), ones = _mm512_set1_epi32(0x01010101);
        const __m512i blo = _mm512_and_si512(_mm512_srli_epi32(qh, 4 * kk), _mm512_set1_epi32(15));
        const __m512i bhi =
            _mm512_and_si512(_mm512_srli_epi32(qh, 16 + 4 * kk), _mm512_set1_epi32(15));
        lo = _mm512_or_si512(
            lo, _mm512_slli_epi32(_mm512_and_si512(_mm512_mullo_epi32(blo, spread), ones), 4));
        hi = _mm512_or_si512(
            hi, _mm512_slli_epi32(_mm512_and_si512(_mm512_mullo_epi32(bhi, spread), ones), 4));
      }
      _mm512_storeu_si512(codes + 64 * kk, lo);
      _mm512_storeu_si512(codes + 64 * (4 + kk), hi);
    }
  }
}

// Accumulator tiles c0, c1 = A tiles 0, 1 times B tile 2. The tile numbers are pasted into
// the instructions' text by the intrinsics, so this is a macro, not a template.
#define POLYKV_AMX_TILE_PAIR(kSigned, c0, c1) \
  do {                                        \
    _tile_zero(c0);                           \
    _tile_zero(c1);                           \
    if constexpr (kSigned) {                  \
      _tile_dpbssd(c0, 0, 2);                 \
      _tile_dpbssd(c1, 1, 2);                 \
    } else {                                  \
      _tile_dpbsud(c0, 0, 2);                 \
      _tile_dpbsud(c1, 1, 2);                 \
    }                                         \
  } while (0)

// One branch per accumulator pair: tiles 5, 6 for odd steps, 3, 4 for even ones.
template <Kind K>
inline void TileProduct(bool odd) {
  constexpr bool kSigned = K == Kind::kQ8_0;
  if (odd)
    POLYKV_AMX_TILE_PAIR(kSigned, 5, 6);
  else
    POLYKV_AMX_TILE_PAIR(kSigned, 3, 4);
}
#undef POLYKV_AMX_TILE_PAIR

// The epilogue of one block for activation rows j < m (acc[j]: 16 outputs); x rows are
// xrb bytes apart (their dx, ds at ActQ8Dx/Ds).
template <Kind K, int kRows>
inline void Epilogue(const int32_t* c1, const int32_t* c2, const float* dvec, const float* fvec,
                     const uint8_t* x, int64_t xrb, int64_t nb, int64_t b, int m, __m512* acc) {
  const __m512 d = _mm512_loadu_ps(dvec);
  const __m512 f = _mm512_loadu_ps(fvec);
#pragma GCC unroll 16
  for (int j = 0; j < kRows; ++j) {
    if (kRows != 16 && j >= m) break;
    const uint8_t* row = x + j * xrb;
    const __m512i s = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(c1 + 16 * j), 8),
                                       _mm512_load_si512(c2 + 16 * j));
    const __m512 t1 =
        _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(ActQ8Dx(row, nb)[b])), _mm512_cvtepi32_ps(s));
    if constexpr (K == Kind::kQ8_0) {
      acc[j] = _mm512_add_ps(acc[j], t1);
    } else {
      const __m512 t2 = _mm512_mul_ps(f, _mm512_set1_ps(ActQ8Ds(row, nb)[b]));
      if constexpr (K == Kind::kQ4_1 || K == Kind::kQ5_1) {
        acc[j] = _mm512_add_ps(acc[j], _mm512_add_ps(t1, t2));
      } else {
        acc[j] = _mm512_add_ps(acc[j], _mm512_sub_ps(t1, t2));
      }
    }
  }
}

// One group of m (<= 16; kRows = 16 for whole groups) activation rows at x against the
// unpacked panel: y[j * ys + o] for j < m and the panel's outputs o (lanes set in `live`).
template <Kind K, int kRows>
void Group(const uint8_t* codes, const float* dvec, const float* fvec, const uint8_t* x,
           int64_t xrb, int64_t nb, int m, __mmask16 live, float* y, int64_t ys, const char* ahead,
           int64_t ahead_per_block) {
  __m512 acc[16];
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
  alignas(64) int32_t cbuf[2][2][256];
  const uint8_t* x2 = ActQ8Residual(x, nb);
  for (int64_t b = 0; b < nb; ++b) {
    if (ahead != nullptr)
      for (int64_t at = b * ahead_per_block; at < (b + 1) * ahead_per_block; at += 64)
        _mm_prefetch(ahead + at, _MM_HINT_T1);
    _tile_loadd(0, x + 32 * b, xrb);
    _tile_loadd(1, x2 + 32 * b, xrb);
    _tile_loadd(2, codes + 512 * b, 64);
    const bool odd = b & 1;
    TileProduct<K>(odd);
    if (b > 0) {
      const int p = odd ? 0 : 1;
      Epilogue<K, kRows>(cbuf[p][0], cbuf[p][1], dvec + 16 * (b - 1), fvec + 16 * (b - 1), x, xrb,
                         nb, b - 1, m, acc);
    }
    if (odd) {
      _tile_stored(5, cbuf[1][0], 64);
      _tile_stored(6, cbuf[1][1], 64);
    } else {
      _tile_stored(3, cbuf[0][0], 64);
      _tile_stored(4, cbuf[0][1], 64);
    }
  }
  const int p = static_cast<int>((nb - 1) & 1);
  Epilogue<K, kRows>(cbuf[p][0], cbuf[p][1], dvec + 16 * (nb - 1), fvec + 16 * (nb - 1), x, xrb, nb,
                     nb - 1, m, acc);
  for (int j = 0; j < m; ++j) _mm512_mask_storeu_ps(y + j * ys, live, acc[j]);
}

// Unpacks block b of a packed panel (PackWeights: the 16 rows' code dwords already in B's
// VNNI order, then their f16 d and m) like UnpackBlock: the same bytes and scales for rows
// < 16 (lanes of rows past the matrix are zero in the file; lanes past `outputs` are computed
// and never stored).
template <Kind K>
inline void UnpackPackedBlock(const uint8_t* pb, uint8_t* codes, float* dvec, float* fvec) {
  constexpr int kRegs = K == Kind::kQ8_0 ? 8 : 4;
  const __m512 d =
      _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 64 * kRegs)));
  _mm512_storeu_ps(dvec, d);
  if constexpr (K == Kind::kQ8_0) {
    _mm512_storeu_ps(fvec, _mm512_setzero_ps());
    for (int kk = 0; kk < 8; ++kk)
      _mm512_storeu_si512(codes + 64 * kk, _mm512_loadu_si512(pb + 64 * kk));
  } else {
    if constexpr (K == Kind::kQ4_1) {
      _mm512_storeu_ps(fvec, _mm512_cvtph_ps(_mm256_loadu_si256(
                                 reinterpret_cast<const __m256i*>(pb + 64 * kRegs + 32))));
    } else {
      _mm512_storeu_ps(fvec, _mm512_mul_ps(_mm512_set1_ps(8.0f), d));
    }
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int kk = 0; kk < 4; ++kk) {
      const __m512i r = _mm512_loadu_si512(pb + 64 * kk);
      _mm512_storeu_si512(codes + 64 * kk, _mm512_and_si512(r, m4));
      _mm512_storeu_si512(codes + 64 * (4 + kk), _mm512_and_si512(_mm512_srli_epi32(r, 4), m4));
    }
  }
}

// Every group of 16 (then the rest) of the n activation rows against an unpacked panel.
// `ahead` (null: none): the next panel's bytes, prefetched a block's share at a time while
// the first group computes.
template <Kind K>
void RunGroups(const uint8_t* codes, const float* dvec, const float* fvec, const uint8_t* x,
               int64_t xrb, int64_t nb, int64_t n, __mmask16 live, float* y, int64_t ys,
               const char* ahead = nullptr, int64_t ahead_per_block = 0) {
  const int64_t whole = n / 16;
  if (whole > 0) {
    LoadConfig(16);
    for (int64_t g = 0; g < whole; ++g)
      Group<K, 16>(codes, dvec, fvec, x + 16 * g * xrb, xrb, nb, 16, live, y + 16 * g * ys, ys,
                   g == 0 ? ahead : nullptr, ahead_per_block);
  }
  if (n % 16 != 0) {
    const int m = static_cast<int>(n % 16);
    LoadConfig(m);
    Group<K, 15>(codes, dvec, fvec, x + 16 * whole * xrb, xrb, nb, m, live, y + 16 * whole * ys, ys,
                 whole == 0 ? ahead : nullptr, ahead_per_block);
  }
}

// PanelRows over a packed panel (block bytes 16 * BlockBytes).
template <Kind K>
void PackedPanelRows(const uint8_t* panel, int outputs, int64_t nb, const uint8_t* x, int64_t xrb,
                     int64_t n, float* y, int64_t ys, uint8_t* scratch) {
  uint8_t* const codes = scratch;
  float* const dvec = reinterpret_cast<float*>(scratch + nb * 512);
  float* const fvec = dvec + nb * 16;
  constexpr int64_t kPB = 16 * BlockBytes<K>();
  const __mmask16 live = static_cast<__mmask16>(outputs >= 16 ? 0xFFFF : (1u << outputs) - 1);
  for (int64_t b = 0; b < nb; ++b)
    UnpackPackedBlock<K>(panel + b * kPB, codes + 512 * b, dvec + 16 * b, fvec + 16 * b);
  // The next panel is prefetched a block's bytes per block of the first row group: a burst
  // of the whole panel's prefetches at once stalled on the fill buffers (~6% of a 16-session
  // decode step in perf), spread out it overlaps with the tiles.
  RunGroups<K>(codes, dvec, fvec, x, xrb, nb, n, live, y, ys,
               reinterpret_cast<const char*>(panel) + nb * kPB, kPB);
}

template <Kind K>
void PanelRows(const uint8_t* w, int64_t row_bytes, int outputs, int64_t nb, const uint8_t* x,
               int64_t xrb, int64_t n, float* y, int64_t ys, uint8_t* scratch) {
  // scratch: codes [nb][8][64] (64-byte aligned), then d and f [nb][16] each.
  uint8_t* const codes = scratch;
  float* const dvec = reinterpret_cast<float*>(scratch + nb * 512);
  float* const fvec = dvec + nb * 16;
  constexpr int64_t kB = BlockBytes<K>();
  const __mmask16 live = static_cast<__mmask16>(outputs >= 16 ? 0xFFFF : (1u << outputs) - 1);
  alignas(64) int32_t off[16];
  for (int o = 0; o < 16; ++o) off[o] = o < outputs ? static_cast<int32_t>(o * row_bytes) : 0;
  const __m512i offs = _mm512_load_si512(off);
  // The panel's bytes (contiguous rows) are requested at once, and the next panel's too:
  // the gathers below touch 16 rows per block, a pattern the hardware prefetchers do not
  // follow, so without this every line is a demand miss in turn.
  {
    const char* p = reinterpret_cast<const char*>(w);
    const int64_t bytes = static_cast<int64_t>(outputs) * row_bytes;
    for (int64_t at = 0; at < bytes; at += 64) _mm_prefetch(p + at, _MM_HINT_T0);
    for (int64_t at = bytes; at < 2 * bytes; at += 64) _mm_prefetch(p + at, _MM_HINT_T1);
  }
  for (int64_t b = 0; b < nb; ++b)
    UnpackBlock<K>(w + b * kB, offs, live, codes + 512 * b, dvec + 16 * b, fvec + 16 * b);
  RunGroups<K>(codes, dvec, fvec, x, xrb, nb, n, live, y, ys);
}

}  // namespace

void AmxPackedPanel(int type_index, const uint8_t* panel, int outputs, int64_t nb, const uint8_t* x,
                    int64_t x_row_bytes, int64_t n, float* y, int64_t ys, uint8_t* scratch) {
  switch (type_index) {
    case kTQ4_0:
      return PackedPanelRows<Kind::kQ4_0>(panel, outputs, nb, x, x_row_bytes, n, y, ys, scratch);
    case kTQ4_1:
      return PackedPanelRows<Kind::kQ4_1>(panel, outputs, nb, x, x_row_bytes, n, y, ys, scratch);
    case kTQ8_0:
      return PackedPanelRows<Kind::kQ8_0>(panel, outputs, nb, x, x_row_bytes, n, y, ys, scratch);
    default:
      __builtin_trap();  // a type without a packed layout (callers check)
  }
}

void AmxRelease() {
  if (loaded_rows == 0) return;
  _tile_release();
  loaded_rows = 0;
}

bool AmxTypeSupported(int type_index) {
  return type_index == kTQ4_0 || type_index == kTQ4_1 || type_index == kTQ5_0 ||
         type_index == kTQ5_1 || type_index == kTQ8_0;
}

void AmxPanel(int type_index, const uint8_t* w, int64_t row_bytes, int outputs, int64_t nb,
              const uint8_t* x, int64_t x_row_bytes, int64_t n, float* y, int64_t ys,
              uint8_t* scratch) {
  switch (type_index) {
    case kTQ4_0:
      return PanelRows<Kind::kQ4_0>(w, row_bytes, outputs, nb, x, x_row_bytes, n, y, ys, scratch);
    case kTQ4_1:
      return PanelRows<Kind::kQ4_1>(w, row_bytes, outputs, nb, x, x_row_bytes, n, y, ys, scratch);
    case kTQ5_0:
      return PanelRows<Kind::kQ5_0>(w, row_bytes, outputs, nb, x, x_row_bytes, n, y, ys, scratch);
    case kTQ5_1:
      return PanelRows<Kind::kQ5_1>(w, row_bytes, outputs, nb, x, x_row_bytes, n, y, ys, scratch);
    case kTQ8_0:
      return PanelRows<Kind::kQ8_0>(w, row_bytes, outputs, nb, x, x_row_bytes, n, y, ys, scratch);
    default:
      __builtin_trap();  // a type without an AMX kernel (callers check AmxTypeSupported)
  }
}

}  // namespace polykv::kernels::mm
