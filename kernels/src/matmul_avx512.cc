// The AVX-512 table of the matrix kernels (compiled with -mavx512f -mavx512bw -mavx512dq
// -mavx512vl -mavx512vnni -mfma -mf16c; the dispatcher calls it only on CPUs with all of
// them). Q4_0/Q4_1/Q8_0 use vpdpbusd (u8 x s8 -> i32 without the i16 saturation step) on
// four (Q4) or two (Q8_0) blocks per 512-bit register, with the per-block scales gathered
// 16 blocks at a time; Q8_0 weights are biased to unsigned (q + 128, corrected by 128 *
// sum(x)). f32/f16/bf16 weights use 16-wide FMA. Q5 and K-quants use the AVX2 kernels
// (compiled here with EVEX encodings).
#include "matmul_avx2_impl.h"

namespace polykv::kernels::mm {
namespace {

inline float Hsum16(__m512 v) { return _mm512_reduce_add_ps(v); }

// 256 dot(q, q1) + dot(q, q2) for one 32-value block (u8 codes x codes and residual codes).
inline __m256i Dot16Vnni(__m256i q, const uint8_t* c1, const uint8_t* c2) {
  const __m256i a = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q,
                                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c1)));
  const __m256i b = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q,
                                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c2)));
  return _mm256_add_epi32(_mm256_slli_epi32(a, 8), b);
}

// Blocks per segment of a row whose scales are precomputed at once (stack buffers).
constexpr int64_t kSeg = 256;

// Word-picking tables for 16 blocks of kB bytes: lane 2b + t (t = 0: d at +0, t = 1: m at
// +2) of the result takes the 16-bit word kB / 2 * b + t of the blocks' bytes. The bytes are
// read as 64-byte registers; pair p of registers serves the lanes whose word lies in
// [64 p, 64 p + 64) through one vpermt2w.
template <int kB>
struct WordPick {
  static constexpr int kLastWord = kB / 2 * 15 + 1;
  static constexpr int kRegs = kLastWord / 32 + 1;
  static constexpr int kPairs = (kRegs + 1) / 2;
  alignas(64) int16_t idx[kPairs][32];
  uint32_t lanes[kPairs];
  WordPick() {
    for (int p = 0; p < kPairs; ++p) {
      lanes[p] = 0;
      for (int l = 0; l < 32; ++l) {
        const int word = kB / 2 * (l / 2) + l % 2;
        idx[p][l] = static_cast<int16_t>((word - 64 * p) & 63);
        if (word >= 64 * p && word < 64 * p + 64) lanes[p] |= 1u << l;
      }
    }
  }
};

// f16 d (and m at +2) of blocks [b, b + cnt) (cnt <= 16) as 16 f32 lanes each; lanes of
// blocks >= cnt are 0. The 16 blocks' bytes are loaded whole (masked to the blocks that
// exist: nothing past block b + cnt - 1 is read) and the words picked with vpermt2w: no
// vpgatherdd, which is slow on CPUs with the Gather Data Sampling mitigation.
template <int kB>
inline void Halves16(const uint8_t* w, int64_t b, int cnt, __m512* d, __m512* m) {
  static const WordPick<kB> pick;
  const uint8_t* p = w + b * kB;
  const int64_t bytes = static_cast<int64_t>(cnt) * kB;
  __m512i reg[WordPick<kB>::kPairs * 2];
  for (int r = 0; r < WordPick<kB>::kPairs * 2; ++r) {
    const int64_t left = bytes - 64 * r;
    if (left >= 64) {
      reg[r] = _mm512_loadu_si512(p + 64 * r);
    } else if (left > 0) {
      reg[r] =
          _mm512_maskz_loadu_epi8(static_cast<__mmask64>((uint64_t{1} << left) - 1), p + 64 * r);
    } else {
      reg[r] = _mm512_setzero_si512();
    }
  }
  __m512i words = _mm512_setzero_si512();
  for (int q = 0; q < WordPick<kB>::kPairs; ++q) {
    const __m512i t =
        _mm512_permutex2var_epi16(reg[2 * q], _mm512_load_si512(pick.idx[q]), reg[2 * q + 1]);
    words = _mm512_mask_mov_epi16(words, pick.lanes[q], t);
  }
  const __mmask16 live = static_cast<__mmask16>(cnt >= 16 ? 0xFFFF : (1u << cnt) - 1);
  *d = _mm512_maskz_mov_ps(live, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words)));
  *m = _mm512_maskz_mov_ps(live,
                           _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(words, 16))));
}

// For blocks [b, b + cnt) of kB bytes each (f16 d at +0, f16 m at +2 for kMin): writes
// s[j][k] = d_k dx_j[b + k] for every activation row j, and adds sum_k f_k ds_j[b + k] to
// corr[j] (f = m with kMin, else d). s is written with full-width stores (buffers padded to
// whole vectors) so that the main loop's loads forward from them.
template <int kB, bool kMin, int kNx>
inline void Scales(const uint8_t* w, int64_t b, int64_t cnt, const uint8_t* x, int64_t xrb,
                   int64_t nb, float (*s)[kSeg + 16], __m512* corr) {
  for (int64_t k = 0; k < cnt; k += 16) {
    const int c = static_cast<int>(cnt - k < 16 ? cnt - k : 16);
    const __mmask16 mask = static_cast<__mmask16>(c == 16 ? 0xFFFF : (1u << c) - 1);
    __m512 dv, mv;
    Halves16<kB>(w, b + k, c, &dv, &mv);
    const __m512 fv = kMin ? mv : dv;
#pragma GCC unroll 8
    for (int j = 0; j < kNx; ++j) {
      const uint8_t* xr = x + j * xrb;
      const __m512 dx = _mm512_maskz_loadu_ps(mask, ActQ8Dx(xr, nb) + b + k);
      _mm512_storeu_ps(s[j] + k, _mm512_mul_ps(dv, dx));
      corr[j] = _mm512_fmadd_ps(fv, _mm512_maskz_loadu_ps(mask, ActQ8Ds(xr, nb) + b + k), corr[j]);
    }
  }
}

// Q4_0 / Q4_1 against kQ8P rows: one 4-block group per 512-bit register, low nibbles and
// high nibbles each meeting their 64 activation codes in one vpdpbusd. The weight row's
// scales are gathered once per segment and shared by the kNx activation rows.
template <bool kMin, int kNx>
void DotQ4Vnni(const uint8_t* w, int64_t nb, const uint8_t* x, int64_t xrb, float* out) {
  constexpr int kB = kMin ? 20 : 18, kQs = kMin ? 4 : 2;
  const int64_t full = nb / 4 * 4;
  __m512 acc[kNx], corr[kNx];
  __m256 acc1[kNx];
  ZeroAccumulators(acc, corr, acc1);
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  alignas(64) float s[kNx][kSeg + 16];
  for (int64_t b0 = 0; b0 < nb; b0 += kSeg) {
    const int64_t cnt = nb - b0 < kSeg ? nb - b0 : kSeg;
    Scales<kB, kMin, kNx>(w, b0, cnt, x, xrb, nb, s, corr);
    int64_t k = 0;
    for (; k + 4 <= cnt && b0 + k + 4 <= full; k += 4) {
      const uint8_t* wb = w + (b0 + k) * kB + kQs;
      __m512i r = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb)));
      r = _mm512_inserti32x4(r, _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + kB)), 1);
      r = _mm512_inserti32x4(r, _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 2 * kB)), 2);
      r = _mm512_inserti32x4(r, _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 3 * kB)), 3);
      const __m512i lo = _mm512_and_si512(r, m4),
                    hi = _mm512_and_si512(_mm512_srli_epi16(r, 4), m4);
      const int64_t g = (b0 + k) / 4;
#pragma GCC unroll 8
      for (int j = 0; j < kNx; ++j) {
        const uint8_t* xg = x + j * xrb + 128 * g;
        const uint8_t* xr = xg + 32 * nb;  // residual codes
        __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xg));
        p = _mm512_dpbusd_epi32(p, hi, _mm512_loadu_si512(xg + 64));
        __m512i p2 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xr));
        p2 = _mm512_dpbusd_epi32(p2, hi, _mm512_loadu_si512(xr + 64));
        p = _mm512_add_epi32(_mm512_slli_epi32(p, 8), p2);
        const __m512 sv =
            _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_loadu_ps(s[j] + k)));
        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sv, acc[j]);
      }
    }
    for (; k < cnt; ++k) {  // blocks after the last full group: natural code order
      const int64_t b = b0 + k;
      const __m256i q = Nibbles32(w + b * kB + kQs);
#pragma GCC unroll 8
      for (int j = 0; j < kNx; ++j) {
        const __m256i p = Dot16Vnni(q, x + j * xrb + 32 * b, x + j * xrb + 32 * nb + 32 * b);
        acc1[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(s[j][k]), acc1[j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < kNx; ++j) {
    const float main = Hsum16(acc[j]) + Hsum8(acc1[j]);
    out[j] = kMin ? main + Hsum16(corr[j]) : main - 8.0f * Hsum16(corr[j]);
  }
}

// Q4_0 / Q4_1 against n kQ8T rows (RowsFn), for a panel of up to 16 weight rows.
// Unpacked once per panel into `scratch`: per weight row, each full group of 16 blocks as a
// PanelGroup (4 dword-interleaved nibble registers, dword i = 4 code bytes of block i, whose
// low nibbles pair with activation register t and high nibbles with register 4 + t; the 16
// blocks' scales), and the blocks after the last full group in pairs as PanelPairs (two
// blocks' 32 nibbles each in natural order, their scales spread over 8 lanes each).
// Activation rows are then taken kJ at a time (their codes stay in L1) against every weight
// row: per activation row and group, 16 vpdpbusd (codes and residual codes) and one f32
// epilogue for all 16 blocks (each int32 lane holds one block's exact sum); per pair, 2
// vpdpbusd and one epilogue. The 16 rows' accumulators are reduced together
// (ReduceRows16) into one vector of outputs.
struct alignas(64) PanelGroup {
  __m512i lo[4], hi[4];
  __m512 d, f;  // d_b, and m_b (Q4_1) or -8 d_b (Q4_0)
};
struct alignas(64) PanelPair {
  __m512i q;    // bytes 0..31: block b's values 0..31, 32..63: block b + 1's (0 if none)
  __m512 d, f;  // lanes 0..7: block b's d (f at lane 0 only), lanes 8..15: block b + 1's
};

// Lane r of the result = the sum of the 16 lanes of v[r] (r < 16).
inline __m512 ReduceRows16(const __m512* v) {
  __m512 u[8], w[4], x[2];
  for (int k = 0; k < 8; ++k)  // lanes 0..7: row 2k (8 partial sums), 8..15: row 2k + 1
    u[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xEE));
  for (int k = 0; k < 4; ++k)  // 128-bit lane q: row 4k + q (4 partial sums)
    w[k] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * k], u[2 * k + 1], 0x88),
                         _mm512_shuffle_f32x4(u[2 * k], u[2 * k + 1], 0xDD));
  for (int k = 0; k < 2; ++k)  // lane q: rows 4 (2k) + q, 4 (2k + 1) + q (2 partials each)
    x[k] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * k], w[2 * k + 1], 0x44),
                         _mm512_shuffle_ps(w[2 * k], w[2 * k + 1], 0xEE));
  // Lane 4 q + m: row q + 4 m.
  const __m512 y =
      _mm512_add_ps(_mm512_shuffle_ps(x[0], x[1], 0x88), _mm512_shuffle_ps(x[0], x[1], 0xDD));
  return _mm512_permutexvar_ps(
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), y);
}

template <bool kMin>
void Q4RowsT(const uint8_t* w, int64_t row_bytes, int rows, int64_t nb, const uint8_t* x,
             int64_t xrb, int64_t n, float* y, int64_t ys, uint8_t* scratch) {
  constexpr int kB = kMin ? 20 : 18, kQs = kMin ? 4 : 2;
  constexpr int64_t kJ = 8;
  const int64_t groups = nb / 16, pairs = (nb % 16 + 1) / 2;
  PanelGroup* panel = reinterpret_cast<PanelGroup*>(scratch);
  PanelPair* tail = reinterpret_cast<PanelPair*>(panel + 16 * groups);
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i offs =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(kB));
  for (int r = 0; r < rows; ++r) {
    const uint8_t* wr = w + r * row_bytes;
    for (int64_t g = 0; g < groups; ++g) {
      PanelGroup& pg = panel[r * groups + g];
      const uint8_t* wg = wr + 16 * g * kB + kQs;
      for (int t = 0; t < 4; ++t) {
        const __m512i v = _mm512_i32gather_epi32(offs, wg + 4 * t, 1);
        pg.lo[t] = _mm512_and_si512(v, m4);
        pg.hi[t] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
      }
      __m512 dv, mv;
      Halves16<kB>(wr, 16 * g, 16, &dv, &mv);
      pg.d = dv;
      pg.f = kMin ? mv : _mm512_mul_ps(dv, _mm512_set1_ps(-8.0f));
    }
    for (int64_t p = 0; p < pairs; ++p) {
      PanelPair& pp = tail[r * pairs + p];
      const int64_t b = 16 * groups + 2 * p;
      const bool two = b + 1 < nb;
      const __m256i q0 = Nibbles32(wr + b * kB + kQs);
      const __m256i q1 = two ? Nibbles32(wr + (b + 1) * kB + kQs) : _mm256_setzero_si256();
      pp.q = _mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1);
      const float d0 = H16(wr + b * kB), d1 = two ? H16(wr + (b + 1) * kB) : 0.0f;
      const float f0 = kMin ? H16(wr + b * kB + 2) : -8.0f * d0;
      const float f1 = !two ? 0.0f : kMin ? H16(wr + (b + 1) * kB + 2) : -8.0f * d1;
      pp.d = _mm512_insertf32x8(_mm512_set1_ps(d0), _mm256_set1_ps(d1), 1);
      pp.f = _mm512_setr_ps(f0, 0, 0, 0, 0, 0, 0, 0, f1, 0, 0, 0, 0, 0, 0, 0);
    }
  }
  const __m512i spread2 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  alignas(64) __m512 acc[16][kJ];
  for (int64_t j0 = 0; j0 < n; j0 += kJ) {
    const int64_t nj = n - j0 < kJ ? n - j0 : kJ;
    const uint8_t* xs = x + j0 * xrb;
    for (int r = 0; r < rows; ++r) {
      __m512* a = acc[r];
      for (int64_t j = 0; j < nj; ++j) a[j] = _mm512_setzero_ps();
      for (int64_t g = 0; g < groups; ++g) {
        const PanelGroup& pg = panel[r * groups + g];
        for (int64_t j = 0; j < nj; ++j) {
          const uint8_t* xj = xs + j * xrb;
          const uint8_t* q1 = xj + 512 * g;
          const uint8_t* q2 = q1 + 32 * nb;
          __m512i p = _mm512_setzero_si512(), p2 = _mm512_setzero_si512();
          __m512i e = _mm512_setzero_si512(), e2 = _mm512_setzero_si512();
          for (int t = 0; t < 4; ++t) {
            p = _mm512_dpbusd_epi32(p, pg.lo[t], _mm512_loadu_si512(q1 + 64 * t));
            p2 = _mm512_dpbusd_epi32(p2, pg.lo[t], _mm512_loadu_si512(q2 + 64 * t));
            e = _mm512_dpbusd_epi32(e, pg.hi[t], _mm512_loadu_si512(q1 + 256 + 64 * t));
            e2 = _mm512_dpbusd_epi32(e2, pg.hi[t], _mm512_loadu_si512(q2 + 256 + 64 * t));
          }
          p = _mm512_add_epi32(p, e);
          p2 = _mm512_add_epi32(p2, e2);
          const __m512 v = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(p, 8), p2));
          const __m512 sc = _mm512_mul_ps(pg.d, _mm512_loadu_ps(ActQ8Dx(xj, nb) + 16 * g));
          a[j] = _mm512_fmadd_ps(v, sc, a[j]);
          a[j] = _mm512_fmadd_ps(pg.f, _mm512_loadu_ps(ActQ8Ds(xj, nb) + 16 * g), a[j]);
        }
      }
      for (int64_t pi = 0; pi < pairs; ++pi) {
        const PanelPair& pp = tail[r * pairs + pi];
        const int64_t b = 16 * groups + 2 * pi;
        const bool two = b + 1 < nb;
        const __mmask16 live = two ? 0xFFFF : 0x00FF;
        for (int64_t j = 0; j < nj; ++j) {
          const uint8_t* xj = xs + j * xrb;
          // Bytes past the last block (b + 1 == nb) meet zero weights; they lie inside the
          // row (the residual codes or the scales follow the codes).
          const __m512i c1 = _mm512_loadu_si512(xj + 32 * b);
          const __m512i c2 = _mm512_loadu_si512(xj + 32 * nb + 32 * b);
          const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), pp.q, c1);
          const __m512i p2 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), pp.q, c2);
          const __m512 v = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(p, 8), p2));
          const __m512 dx = _mm512_permutexvar_ps(
              spread2,
              _mm512_castps256_ps512(_mm256_maskz_loadu_ps(two ? 3 : 1, ActQ8Dx(xj, nb) + b)));
          const __m512 ds = _mm512_permutexvar_ps(
              spread2,
              _mm512_castps256_ps512(_mm256_maskz_loadu_ps(two ? 3 : 1, ActQ8Ds(xj, nb) + b)));
          a[j] = _mm512_mask3_fmadd_ps(v, _mm512_mul_ps(pp.d, dx), a[j], live);
          a[j] = _mm512_fmadd_ps(pp.f, ds, a[j]);
        }
      }
    }
    for (int r = rows; r < 16; ++r)
      for (int64_t j = 0; j < nj; ++j) acc[r][j] = _mm512_setzero_ps();
    const __mmask16 out_mask = static_cast<__mmask16>(rows >= 16 ? 0xFFFF : (1u << rows) - 1);
    for (int64_t j = 0; j < nj; ++j) {
      __m512 v[16];
      for (int r = 0; r < 16; ++r) v[r] = acc[r][j];
      _mm512_mask_storeu_ps(y + (j0 + j) * ys, out_mask, ReduceRows16(v));
    }
  }
}

// Q8_0 against kQ8 rows: two blocks per register, weights biased to unsigned (q + 128,
// corrected by 128 sum_b d_b ds_b).
template <int kNx>
void DotQ8_0Vnni(const uint8_t* w, int64_t nb, const uint8_t* x, int64_t xrb, float* out) {
  __m512 acc[kNx], corr[kNx];
  __m256 acc1[kNx];
  ZeroAccumulators(acc, corr, acc1);
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  alignas(64) float s[kNx][kSeg + 16];
  for (int64_t b0 = 0; b0 < nb; b0 += kSeg) {
    const int64_t cnt = nb - b0 < kSeg ? nb - b0 : kSeg;
    Scales<34, false, kNx>(w, b0, cnt, x, xrb, nb, s, corr);
    int64_t k = 0;
    for (; k + 2 <= cnt; k += 2) {
      const uint8_t* wb = w + (b0 + k) * 34 + 2;
      __m512i q = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb)));
      q = _mm512_inserti64x4(q, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 34)), 1);
      q = _mm512_xor_si512(q, bias);
#pragma GCC unroll 8
      for (int j = 0; j < kNx; ++j) {
        const uint8_t* xb = x + j * xrb + 32 * (b0 + k);
        const __m512i p1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, _mm512_loadu_si512(xb));
        const __m512i p2 =
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, _mm512_loadu_si512(xb + 32 * nb));
        const __m512i p = _mm512_add_epi32(_mm512_slli_epi32(p1, 8), p2);
        const __m512 sv = _mm512_permutexvar_ps(
            spread, _mm512_castps128_ps512(_mm_castsi128_ps(
                        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s[j] + k)))));
        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sv, acc[j]);
      }
    }
    for (; k < cnt; ++k) {
      const uint8_t* wb = w + (b0 + k) * 34 + 2;
      const __m256i q = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb)),
                                         _mm256_set1_epi8(static_cast<char>(0x80)));
#pragma GCC unroll 8
      for (int j = 0; j < kNx; ++j) {
        const uint8_t* xb = x + j * xrb + 32 * (b0 + k);
        const __m256i p = Dot16Vnni(q, xb, xb + 32 * nb);
        acc1[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(s[j][k]), acc1[j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < kNx; ++j) out[j] = Hsum16(acc[j]) + Hsum8(acc1[j]) - 128.0f * Hsum16(corr[j]);
}

// y[r] (r < rows) of one packed panel (PackWeights) times one kQ8 row: per block, the 16
// rows' exact int32 sums I = 256 dot(w, q1) + dot(w, q2) in the 16 lanes (vpdpbusd of each
// code register with a broadcast of 4 activation codes), then acc += I d dxs and corr +=
// f ds with the rows' f16 d and f (m for Q4_1, d otherwise) widened 16 at a time.
// Q4: register t's low nibbles are values 4t..4t+3 of each row's block, its high nibbles
// values 16 + 4t..; Q8_0: register t holds values 4t..4t+3, biased to unsigned (+128,
// corrected by -128 d ds).
template <int kRegs, bool kNibbles, int kScales>
void PackedVnni(const uint8_t* panel, int64_t nb, const uint8_t* x, int rows, float* y) {
  constexpr int64_t kBlock = 64 * kRegs + 32 * kScales;
  const int32_t* codes = reinterpret_cast<const int32_t*>(x);
  const int32_t* residual = reinterpret_cast<const int32_t*>(ActQ8Residual(x, nb));
  const float* dxs = ActQ8Dx(x, nb);
  const float* ds = ActQ8Ds(x, nb);
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc = _mm512_setzero_ps(), corr = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* pb = panel + b * kBlock;
    // The panels lie one after another: request the bytes 2 KiB on, a block's worth per
    // block (spread out, not in bursts; never faults past the matrix). Measured on SmolLM2
    // decode against a burst per panel: 1 thread 92-97 -> 99 tok/s, 2 threads 181-196 ->
    // 188-197.
    for (int64_t l = 0; l < kBlock; l += 64)
      _mm_prefetch(reinterpret_cast<const char*>(pb) + 2048 + l, _MM_HINT_T0);
    const int32_t* c1 = codes + 8 * b;
    const int32_t* c2 = residual + 8 * b;
    __m512i i1 = _mm512_setzero_si512(), i2 = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int t = 0; t < kRegs; ++t) {
      const __m512i w = _mm512_loadu_si512(pb + 64 * t);
      if constexpr (kNibbles) {
        const __m512i lo = _mm512_and_si512(w, m4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
        i1 = _mm512_dpbusd_epi32(i1, lo, _mm512_set1_epi32(c1[t]));
        i1 = _mm512_dpbusd_epi32(i1, hi, _mm512_set1_epi32(c1[4 + t]));
        i2 = _mm512_dpbusd_epi32(i2, lo, _mm512_set1_epi32(c2[t]));
        i2 = _mm512_dpbusd_epi32(i2, hi, _mm512_set1_epi32(c2[4 + t]));
      } else {
        const __m512i u = _mm512_xor_si512(w, bias);
        i1 = _mm512_dpbusd_epi32(i1, u, _mm512_set1_epi32(c1[t]));
        i2 = _mm512_dpbusd_epi32(i2, u, _mm512_set1_epi32(c2[t]));
      }
    }
    const __m512i sum = _mm512_add_epi32(_mm512_slli_epi32(i1, 8), i2);
    const __m512 d =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 64 * kRegs)));
    acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), d), _mm512_set1_ps(dxs[b]), acc);
    const __m512 f = kScales == 2 ? _mm512_cvtph_ps(_mm256_loadu_si256(
                                        reinterpret_cast<const __m256i*>(pb + 64 * kRegs + 32)))
                                  : d;
    corr = _mm512_fmadd_ps(f, _mm512_set1_ps(ds[b]), corr);
  }
  // Q4_1: + m ds; Q4_0: the -8 offset, - 8 d ds; Q8_0: the +128 bias, - 128 d ds.
  const float k = kScales == 2 ? 1.0f : (kNibbles ? -8.0f : -128.0f);
  const __mmask16 live = static_cast<__mmask16>(rows >= 16 ? 0xFFFF : (1u << rows) - 1);
  _mm512_mask_storeu_ps(y, live, _mm512_fmadd_ps(corr, _mm512_set1_ps(k), acc));
}

template <int kKind>
inline __m512 Load16(const uint8_t* w, int64_t i) {
  if constexpr (kKind == 0) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(w) + i);
  } else if constexpr (kKind == 1) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2 * i)));
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2 * i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// 16 f32 lanes for DotFloatRows (matmul_avx2_impl.h).
struct F32x16 {
  using T = __m512;
  static constexpr int W = 16;
  static T Zero() { return _mm512_setzero_ps(); }
  static T Load(const float* p) { return _mm512_loadu_ps(p); }
  template <int kKind>
  static T LoadW(const uint8_t* w, int64_t i) {
    return Load16<kKind>(w, i);
  }
  static T Fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static float Sum(T a, T b) { return Hsum16(_mm512_add_ps(a, b)); }
};

}  // namespace

const DotTable& Avx512Table() {
  static const DotTable t = [] {
    DotTable d;
    d.isa = "avx512";
    FillAvx2(&d);
    d.dot[kTF32] = POLYKV_MM_ROWS(DotFloatRows, F32x16, 0);
    d.dot[kTF16] = POLYKV_MM_ROWS(DotFloatRows, F32x16, 1);
    d.dot[kTBF16] = POLYKV_MM_ROWS(DotFloatRows, F32x16, 2);
    d.dot[kTQ4_0] = POLYKV_MM_ROWS8(DotQ4Vnni, false);
    d.dot[kTQ4_1] = POLYKV_MM_ROWS8(DotQ4Vnni, true);
    d.dot[kTQ8_0] = POLYKV_MM_ROWS8_0(DotQ8_0Vnni);
    d.rows[kTQ4_0] = &Q4RowsT<false>;
    d.rows[kTQ4_1] = &Q4RowsT<true>;
    d.packed[kTQ4_0] = &PackedVnni<4, true, 1>;
    d.packed[kTQ4_1] = &PackedVnni<4, true, 2>;
    d.packed[kTQ8_0] = &PackedVnni<8, false, 1>;
    return d;
  }();
  return t;
}

}  // namespace polykv::kernels::mm
