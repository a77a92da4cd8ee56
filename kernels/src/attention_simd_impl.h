// AVX2 (+FMA, F16C) body of one attention chunk, in an anonymous namespace: included by
// attention_avx2.cc and attention_avx512.cc, each compiled with its ISA flags. Same math as
// attention_scalar.cc; exp is a polynomial (Cephes expf coefficients, |rel err| < 2e-7).
//
// Per chunk: keys of the chunk converted once to f32 (int8 codes, f16, bf16; f32 used in
// place), values decoded once (packed codes -> norm * level through vpermps on the 8 (or
// 16) Lloyd-Max levels), then register tiles shared by several queries (the GQA group and
// the prompt rows): scores for QB queries x KB keys (one FMA chain per lane, a fixed
// transpose-add reduction), max, exp, sum, and the weighted value sum for VQB queries x
// SW vectors per token. Tiles are 8 lanes (AVX2) or 16 (the AVX-512 build, head_dim % 16
// == 0); a score or output never depends on which tile computed it.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "attention_internal.h"
#include "avx2_math.h"
#ifdef __AVX512F__
#include "avx512_math.h"
#endif

namespace polykv::kernels::attn {
namespace {

using simd::Exp1;
using simd::Exp8;
using simd::Hmax8;
using simd::Hsum8;
#ifdef __AVX512F__
using simd::Transpose16;
#endif

// 8 dot-product accumulators -> one vector of their 8 sums.
inline __m256 Reduce8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6,
                      __m256 a7) {
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

inline __m256 LoadKey8(int kind, const void* base, int64_t idx) {
  switch (kind) {
    case kKeyF16:
      return _mm256_cvtph_ps(_mm_loadu_si128(
          reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + idx)));
    case kKeyBf16: {
      const __m128i h = _mm_loadu_si128(
          reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + idx));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    case kKeyI8: {
      const __m128i b =
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(base) + idx));
      return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    }
    default:
      return _mm256_loadu_ps(static_cast<const float*>(base) + idx);
  }
}

// The 32-bit little-endian word at b; `exact` reads only the kBits bytes of the 8 codes
// (for the last group of a buffer, where 4 - kBits more bytes may not exist).
template <int kBits>
inline uint32_t CodeWord(const uint8_t* b, bool exact) {
  uint32_t w = 0;
  if (exact) {
    for (int k = 0; k < kBits; ++k) w |= static_cast<uint32_t>(b[k]) << (8 * k);
  } else {
    std::memcpy(&w, b, 4);
  }
  return w;
}

// Decodes packed value codes of token vector `p` to norm * levels[code] (hd values), 8 codes
// per kBits bytes (lane i of a group takes bits [kBits i, kBits i + kBits)). `last`: the
// vector may end its buffer, so its last group is read byte by byte.
template <int kBits>
inline void DecodePacked(const uint8_t* p, float norm, int hd, const float* levels, float* out,
                         bool last) {
  const __m256i shifts =
      _mm256_setr_epi32(0, kBits, 2 * kBits, 3 * kBits, 4 * kBits, 5 * kBits, 6 * kBits, 7 * kBits);
  const __m256i mask = _mm256_set1_epi32((1 << kBits) - 1);
  const int groups = hd / 8;
#ifdef __AVX512F__
  // 16 codes per step: two words in the two 256-bit halves, one vpermps over the levels.
  if (kBits <= 3 && groups % 2 == 0) {
    const __m512 lv = _mm512_castps256_ps512(
        kBits == 2 ? _mm256_setr_ps(levels[0], levels[1], levels[2], levels[3], 0, 0, 0, 0)
                   : _mm256_loadu_ps(levels));
    const __m512i sh = _mm512_inserti64x4(_mm512_castsi256_si512(shifts), shifts, 1);
    const __m512i mk = _mm512_set1_epi32((1 << kBits) - 1);
    const __m512 nv = _mm512_set1_ps(norm);
    for (int g = 0; g < groups; g += 2) {
      const uint8_t* b = p + g * kBits;
      const uint32_t w0 = CodeWord<kBits>(b, false);
      const uint32_t w1 = CodeWord<kBits>(b + kBits, last && g + 2 == groups);
      const __m512i wv =
          _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(static_cast<int>(w0))),
                             _mm256_set1_epi32(static_cast<int>(w1)), 1);
      const __m512i idx = _mm512_and_si512(_mm512_srlv_epi32(wv, sh), mk);
      _mm512_storeu_ps(out + 8 * g, _mm512_mul_ps(_mm512_permutexvar_ps(idx, lv), nv));
    }
    return;
  }
#endif
  __m256 lv0, lv1 = _mm256_setzero_ps();
  if constexpr (kBits == 2) {
    lv0 = _mm256_setr_ps(levels[0], levels[1], levels[2], levels[3], 0, 0, 0, 0);
  } else {
    lv0 = _mm256_loadu_ps(levels);
    if constexpr (kBits == 4) lv1 = _mm256_loadu_ps(levels + 8);
  }
  const __m256 nv = _mm256_set1_ps(norm);
  for (int g = 0; g < groups; ++g) {
    const uint32_t w = CodeWord<kBits>(p + g * kBits, last && g + 1 == groups);
    const __m256i idx =
        _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)), shifts), mask);
    __m256 v = _mm256_permutevar8x32_ps(lv0, idx);
    if constexpr (kBits == 4) {
      const __m256 hi = _mm256_permutevar8x32_ps(lv1, idx);
      const __m256 sel = _mm256_castsi256_ps(_mm256_cmpgt_epi32(idx, _mm256_set1_epi32(7)));
      v = _mm256_blendv_ps(v, hi, sel);
    }
    _mm256_storeu_ps(out + 8 * g, _mm256_mul_ps(v, nv));
  }
}

// Vector traits: the same tile code runs on 8 lanes (AVX2) and, in the AVX-512 source,
// on 16 lanes. QB x KB is the score tile (queries x keys), VQB x SW the value tile
// (queries x vectors of head_dim), sized to the register file (16 or 32 registers).
struct Vec8 {
  using T = __m256;
  static constexpr int W = 8, QB = 2, KB = 4, VQB = 2, SW = 4;
  static T Load(const float* p) { return _mm256_loadu_ps(p); }
  static T Set1(float x) { return _mm256_set1_ps(x); }
  static T Zero() { return _mm256_setzero_ps(); }
  static T Fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T Mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static void Store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static __m256 Fold8(T v) { return v; }
};
#ifdef __AVX512F__
struct Vec16 {
  using T = __m512;
  static constexpr int W = 16, QB = 3, KB = 8, VQB = 6, SW = 4;
  static T Load(const float* p) { return _mm512_loadu_ps(p); }
  static T Set1(float x) { return _mm512_set1_ps(x); }
  static T Zero() { return _mm512_setzero_ps(); }
  static T Fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T Mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static void Store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static __m256 Fold8(T v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  }
};

// From kTransposedQueries query rows (attention_internal.h) the AVX-512 build computes a
// chunk's scores on transposed keys: keys in lanes, one FMA chain per score over head_dim in
// order and no horizontal reductions; the keys' transposition is shared by the queries.
// Below it (decode: one row x the group) the key-row tiles above stay cheaper.

// kt[i * tp + t] = k[t * hd + i] for t < tk (zero for tk <= t < tp, tp = tk rounded up to 16).
inline void TransposeKeys(const float* k, int hd, int64_t tk, float* kt, int64_t tp) {
  for (int64_t t = 0; t < tp; t += 16) {
    const int rows = static_cast<int>(tk - t < 16 ? tk - t : 16);
    for (int i = 0; i < hd; i += 16) {
      __m512 r[16];
      for (int u = 0; u < 16; ++u)
        r[u] = u < rows ? _mm512_loadu_ps(k + (t + u) * hd + i) : _mm512_setzero_ps();
      Transpose16(r);
      for (int c = 0; c < 16; ++c) _mm512_storeu_ps(kt + (i + c) * tp + t, r[c]);
    }
  }
}

// Scores of QB queries (rows of q, stride hd) against KV vectors of 16 keys at kt + t
// (transposed, row stride tp): s[j * ss + t + 16 v + lane] for lanes below `valid` keys.
// Each score is one FMA chain over head_dim in order, whatever the tile.
template <int QB, int KV>
inline void ScoreTileT(const float* q, int hd, const float* kt, int64_t tp, int64_t t,
                       int64_t valid, float* s, int64_t ss) {
  __m512 acc[QB][KV];
  for (int j = 0; j < QB; ++j)
    for (int v = 0; v < KV; ++v) acc[j][v] = _mm512_setzero_ps();
  for (int i = 0; i < hd; ++i) {
    __m512 kv[KV];
    for (int v = 0; v < KV; ++v) kv[v] = _mm512_loadu_ps(kt + i * tp + t + 16 * v);
    for (int j = 0; j < QB; ++j) {
      const __m512 qb = _mm512_set1_ps(q[j * hd + i]);
      for (int v = 0; v < KV; ++v) acc[j][v] = _mm512_fmadd_ps(qb, kv[v], acc[j][v]);
    }
  }
  for (int v = 0; v < KV; ++v) {
    const int64_t left = valid - 16 * v;
    const __mmask16 m = static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1);
    for (int j = 0; j < QB; ++j) _mm512_mask_storeu_ps(s + j * ss + t + 16 * v, m, acc[j][v]);
  }
}
#endif

#ifdef __AVX512F__
// One query's softmax pieces on 16 lanes: m = max s[t < end], s[t] = exp(s[t] - m) (the same
// value per element as Exp8), l = sum of them (16 lane sums, then a fixed reduction).
inline void SoftmaxRow16(float* s, int64_t end, float* m_out, float* l_out) {
  const __mmask16 tail = static_cast<__mmask16>((1u << (end % 16)) - 1);
  const int64_t whole = end / 16 * 16;
  const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
  __m512 mv = _mm512_mask_loadu_ps(ninf, tail, s + whole);
  for (int64_t t = 0; t < whole; t += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(s + t));
  const float m = _mm512_reduce_max_ps(mv);
  const __m512 mb = _mm512_set1_ps(m);
  __m512 lv = _mm512_setzero_ps();
  for (int64_t t = 0; t < whole; t += 16) {
    const __m512 p = simd::Exp16(_mm512_sub_ps(_mm512_loadu_ps(s + t), mb));
    _mm512_storeu_ps(s + t, p);
    lv = _mm512_add_ps(lv, p);
  }
  if (tail != 0) {
    const __m512 p = simd::Exp16(_mm512_sub_ps(_mm512_mask_loadu_ps(mb, tail, s + whole), mb));
    _mm512_mask_storeu_ps(s + whole, tail, p);
    lv = _mm512_mask_add_ps(lv, tail, lv, p);
  }
  *m_out = m;
  *l_out = _mm512_reduce_add_ps(lv);
}
#endif

// Four dot-product accumulators -> their four sums.
inline __m128 Reduce4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

// Scores of QB queries (rows of q, stride hd) against KB consecutive keys (rows of k),
// written to s[j * ss + u]. Each score is one chain per lane over head_dim, then a fixed
// reduction tree: the value of a score does not depend on the tile it was computed in.
template <class V, int QB, int KB>
inline void ScoreTile(const float* q, const float* k, int hd, float* s, int64_t ss) {
  static_assert(KB == 4 || KB == 8, "key tile of 4 or 8");
  typename V::T acc[QB][KB];
  for (int j = 0; j < QB; ++j)
    for (int u = 0; u < KB; ++u) acc[j][u] = V::Zero();
  for (int i = 0; i < hd; i += V::W) {
    typename V::T qv[QB];
    for (int j = 0; j < QB; ++j) qv[j] = V::Load(q + j * hd + i);
    for (int u = 0; u < KB; ++u) {
      const typename V::T kv = V::Load(k + u * hd + i);
      for (int j = 0; j < QB; ++j) acc[j][u] = V::Fma(qv[j], kv, acc[j][u]);
    }
  }
  for (int j = 0; j < QB; ++j) {
    if constexpr (KB == 8) {
      _mm256_storeu_ps(s + j * ss,
                       Reduce8(V::Fold8(acc[j][0]), V::Fold8(acc[j][1]), V::Fold8(acc[j][2]),
                               V::Fold8(acc[j][3]), V::Fold8(acc[j][4]), V::Fold8(acc[j][5]),
                               V::Fold8(acc[j][6]), V::Fold8(acc[j][7])));
    } else {
      _mm_storeu_ps(s + j * ss, Reduce4(V::Fold8(acc[j][0]), V::Fold8(acc[j][1]),
                                        V::Fold8(acc[j][2]), V::Fold8(acc[j][3])));
    }
  }
}

// One score (the tail of a chunk), with the reduction of a 4-key tile's first lane group.
template <class V>
inline float ScoreOne(const float* q, const float* k, int hd) {
  typename V::T acc = V::Zero();
  for (int i = 0; i < hd; i += V::W) acc = V::Fma(V::Load(q + i), V::Load(k + i), acc);
  const __m256 z = _mm256_setzero_ps();
  return _mm_cvtss_f32(Reduce4(V::Fold8(acc), z, z, z));
}

// o[j * hd + base + ...] = inv[j] * sum_{t < T} p[j * ps + t] v[t * hd + base + ...] for VQB
// queries and SW vectors of V::W values; one FMA chain per output value, in token order.
template <class V, int QB, int SW>
inline void ValueTile(const float* p, int64_t ps, const float* v, int hd, int base, int64_t T,
                      const float* inv, float* o) {
  typename V::T acc[QB][SW];
  for (int j = 0; j < QB; ++j)
    for (int w = 0; w < SW; ++w) acc[j][w] = V::Zero();
  for (int64_t t = 0; t < T; ++t) {
    typename V::T vv[SW];
    for (int w = 0; w < SW; ++w) vv[w] = V::Load(v + t * hd + base + w * V::W);
    for (int j = 0; j < QB; ++j) {
      const typename V::T pj = V::Set1(p[j * ps + t]);
      for (int w = 0; w < SW; ++w) acc[j][w] = V::Fma(pj, vv[w], acc[j][w]);
    }
  }
  for (int j = 0; j < QB; ++j) {
    const typename V::T s = V::Set1(inv[j]);
    for (int w = 0; w < SW; ++w) V::Store(o + j * hd + base + w * V::W, V::Mul(acc[j][w], s));
  }
}

// Runs Tile<n> for a compile-time n in [1, N] equal to the run-time `n` (tails of tiles).
template <int N, typename F>
inline void WithCount(int n, F&& f) {
  if constexpr (N >= 1) {
    if (n == N) {
      f(std::integral_constant<int, N>{});
      return;
    }
    WithCount<N - 1>(n, f);
  }
}

// The chunk on vectors of V::W lanes (hd % V::W == 0), keys and values already f32; kf null:
// integer scores of the int8 keys (ChunkArgs::q_codes) on AMX tiles.
template <class V>
void ChunkTiles(const ChunkArgs& a, const float* kf, const float* vf, float* sbuf) {
  const int hd = a.hd;
  const int64_t T = a.t1 - a.t0;
  // Per-query token counts; tokens a query may not see get p = 0 (exact: adds +0).
  int64_t tmax = 0;
  int64_t ends_stack[64];
  std::vector<int64_t> ends_heap;
  int64_t* ends = ends_stack;
  if (a.nq > 64) {
    ends_heap.resize(static_cast<size_t>(a.nq));
    ends = ends_heap.data();
  }
  for (int j = 0; j < a.nq; ++j) {
    int64_t e = (a.limit[j] < a.t1 ? a.limit[j] : a.t1) - a.t0;
    e = e < 0 ? 0 : e;
    ends[j] = e;
    tmax = e > tmax ? e : tmax;
  }
  // Scores s[j][t] for t < tmax: integer tiles (AMX), or queries [0, tq) on transposed keys
  // (AVX-512) and the others on key-row tiles.
  int j0 = 0;
#if defined(__AVX512F__) && defined(POLYKV_HAVE_AMX_KERNELS)
  if (kf == nullptr) {
    const int64_t stride = a.key_bits == 8 ? hd : a.k_bytes;
    ScoresAmxI8(a.q_codes, a.q_code_scale, a.nq, static_cast<const uint8_t*>(a.k) + a.t0 * stride,
                a.key_bits, stride, tmax, hd, sbuf, T,
                sbuf + static_cast<int64_t>(a.nq) * T + T * hd + 16 * hd);
    j0 = a.nq;
  }
#endif
#ifdef __AVX512F__
  if constexpr (V::W == 16) {
    const int tq = a.transposed < 0 ? (a.nq >= kTransposedQueries ? a.nq : 0)
                                    : (a.transposed < a.nq ? a.transposed : a.nq);
    if (tq > 0 && j0 == 0) {
      float* kt = sbuf + static_cast<int64_t>(a.nq) * T;  // scratch after the scores
      const int64_t tp = (tmax + 15) / 16 * 16;
      TransposeKeys(kf, hd, tmax, kt, tp);
      auto row = [&](int jb, auto qb) {
        constexpr int kQ = decltype(qb)::value;
        int64_t t = 0;
        for (; t + 64 <= tp; t += 64)
          ScoreTileT<kQ, 4>(a.q + jb * hd, hd, kt, tp, t, tmax - t, sbuf + jb * T, T);
        if (t < tp) {
          WithCount<3>(static_cast<int>((tp - t) / 16), [&](auto kvn) {
            ScoreTileT<kQ, decltype(kvn)::value>(a.q + jb * hd, hd, kt, tp, t, tmax - t,
                                                 sbuf + jb * T, T);
          });
        }
      };
      for (; j0 + 4 <= tq; j0 += 4) row(j0, std::integral_constant<int, 4>{});
      if (j0 < tq) WithCount<3>(tq - j0, [&](auto n) { row(j0, n); });
      j0 = tq;
    }
  }
#endif
  const int jk = j0;  // first query on key-row tiles
  const int64_t tk = tmax / V::KB * V::KB;
  for (; j0 + V::QB <= a.nq; j0 += V::QB)
    for (int64_t t = 0; t < tk; t += V::KB)
      ScoreTile<V, V::QB, V::KB>(a.q + j0 * hd, kf + t * hd, hd, sbuf + j0 * T + t, T);
  if (j0 < a.nq) {
    WithCount<V::QB - 1>(a.nq - j0, [&](auto n) {
      for (int64_t t = 0; t < tk; t += V::KB)
        ScoreTile<V, decltype(n)::value, V::KB>(a.q + j0 * hd, kf + t * hd, hd, sbuf + j0 * T + t,
                                                T);
    });
  }
  for (int j = jk; j < a.nq; ++j)
    for (int64_t t = tk; t < tmax; ++t)
      sbuf[j * T + t] = ScoreOne<V>(a.q + j * hd, kf + t * hd, hd);

  // Softmax pieces per query: m, p = exp(s - m) (0 past the query's end), l = sum p.
  float inv_stack[64];
  std::vector<float> inv_heap;
  float* inv = inv_stack;
  if (a.nq > 64) {
    inv_heap.resize(static_cast<size_t>(a.nq));
    inv = inv_heap.data();
  }
  for (int j = 0; j < a.nq; ++j) {
    float* s = sbuf + j * T;
    const int64_t end = ends[j];
    if (end == 0) {
      a.m[j] = -__builtin_inff();
      a.l[j] = 0.0f;
      for (int64_t t = 0; t < tmax; ++t) s[t] = 0.0f;
      inv[j] = 0.0f;
      continue;
    }
    float m, l;
#ifdef __AVX512F__
    if constexpr (V::W == 16) {
      SoftmaxRow16(s, end, &m, &l);
    } else
#endif
    {
      int64_t t = 0;
      __m256 mv = _mm256_set1_ps(-__builtin_inff());
      for (; t + 8 <= end; t += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + t));
      m = Hmax8(mv);
      for (; t < end; ++t) m = s[t] > m ? s[t] : m;
      const __m256 mb = _mm256_set1_ps(m);
      __m256 lv = _mm256_setzero_ps();
      t = 0;
      for (; t + 8 <= end; t += 8) {
        const __m256 p = Exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), mb));
        _mm256_storeu_ps(s + t, p);
        lv = _mm256_add_ps(lv, p);
      }
      l = Hsum8(lv);
      for (; t < end; ++t) {
        s[t] = Exp1(s[t] - m);
        l += s[t];
      }
    }
    for (int64_t t = end; t < tmax; ++t) s[t] = 0.0f;
    a.m[j] = m;
    a.l[j] = l;
    inv[j] = 1.0f / l;
  }

  // o = sum_t p_t v_t / l.
  const int slice = V::SW * V::W;
  auto values = [&](int jb, auto qb) {
    constexpr int kQ = decltype(qb)::value;
    int base = 0;
    for (; base + slice <= hd; base += slice)
      ValueTile<V, kQ, V::SW>(sbuf + jb * T, T, vf, hd, base, tmax, inv + jb, a.o + jb * hd);
    if (base < hd) {
      WithCount<V::SW - 1>((hd - base) / V::W, [&](auto sw) {
        ValueTile<V, kQ, decltype(sw)::value>(sbuf + jb * T, T, vf, hd, base, tmax, inv + jb,
                                              a.o + jb * hd);
      });
    }
  };
  j0 = 0;
  for (; j0 + V::VQB <= a.nq; j0 += V::VQB) values(j0, std::integral_constant<int, V::VQB>{});
  if (j0 < a.nq) WithCount<V::VQB - 1>(a.nq - j0, [&](auto n) { values(j0, n); });
  // Queries that see no token: o = 0 (inv = 0 gave 0 * sum = 0 unless values overflowed).
  for (int j = 0; j < a.nq; ++j)
    if (ends[j] == 0)
      for (int i = 0; i < hd; ++i) a.o[j * hd + i] = 0.0f;
}

// Keys of kind `Kind` -> f32 rows [T][hd].
template <int Kind>
inline void ConvertKeys(const void* base, int64_t t0, int64_t T, int hd, float* out) {
  for (int64_t t = 0; t < T; ++t)
    for (int i = 0; i < hd; i += 8)
      _mm256_storeu_ps(out + t * hd + i, LoadKey8(Kind, base, (t0 + t) * hd + i));
}

void ChunkSimd(const ChunkArgs& a) {
  const int hd = a.hd;
  if (hd % 8 != 0 ||
      (a.value_kind == kValPacked && (a.bits < kSimdValueBitsMin || a.bits > kSimdValueBitsMax))) {
    ChunkScalar(a);
    return;
  }
  const int64_t T = a.t1 - a.t0;
  float* kbuf = a.scratch;
  float* vbuf = a.scratch + T * hd;
  float* sbuf = a.scratch + 2 * T * hd;

  // Keys of the chunk as f32 [T][hd] (none for integer scores on AMX tiles).
  const float* kf = nullptr;
#if defined(__AVX512F__) && defined(POLYKV_HAVE_AMX_KERNELS)
  const bool int_scores = a.q_codes != nullptr && a.key_kind == kKeyI8;
#else
  const bool int_scores = false;
#endif
  if (a.key_kind == kKeyF32) {
    kf = static_cast<const float*>(a.k) + a.t0 * hd;
  } else if (a.key_kind == kKeyF16) {
    ConvertKeys<kKeyF16>(a.k, a.t0, T, hd, kbuf);
    kf = kbuf;
  } else if (a.key_kind == kKeyBf16) {
    ConvertKeys<kKeyBf16>(a.k, a.t0, T, hd, kbuf);
    kf = kbuf;
  } else if (!int_scores) {
    ConvertKeys<kKeyI8>(a.k, a.t0, T, hd, kbuf);
    kf = kbuf;
  }
  // Values of the chunk as f32 [T][hd].
  const float* vf;
  if (a.value_kind == kValF32) {
    vf = static_cast<const float*>(a.v) + a.t0 * hd;
  } else if (a.value_kind == kValPacked) {
    const uint8_t* base = static_cast<const uint8_t*>(a.v);
    for (int64_t t = 0; t < T; ++t) {
      const uint8_t* p = base + (a.t0 + t) * a.v_bytes;
      const float nrm = a.v_norms[a.t0 + t];
      if (a.bits == 3) {
        DecodePacked<3>(p, nrm, hd, a.levels, vbuf + t * hd, t + 1 == T);
      } else if (a.bits == 4) {
        DecodePacked<4>(p, nrm, hd, a.levels, vbuf + t * hd, t + 1 == T);
      } else {
        DecodePacked<2>(p, nrm, hd, a.levels, vbuf + t * hd, t + 1 == T);
      }
    }
    vf = vbuf;
  } else if (a.value_kind == kValF16) {
    ConvertKeys<kKeyF16>(a.v, a.t0, T, hd, vbuf);
    vf = vbuf;
  } else {
    ConvertKeys<kKeyBf16>(a.v, a.t0, T, hd, vbuf);
    vf = vbuf;
  }
#ifdef __AVX512F__
  if (hd % 16 == 0) {
    ChunkTiles<Vec16>(a, kf, vf, sbuf);
    return;
  }
#endif
  ChunkTiles<Vec8>(a, kf, vf, sbuf);
}

}  // namespace
}  // namespace polykv::kernels::attn
