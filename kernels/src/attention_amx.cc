// AMX-INT8 tiles for the attention scores of a pool's int8 key codes (attention_internal.h,
// "Integer scores"). Compiled with -mamx-tile -mamx-int8 and the AVX-512 flags; called only
// where AmxInt8Supported().
//
// Per group of up to 16 queries j and 16 keys t, per piece p of 64 head_dim elements:
//   A_l = the queries' code rows q_l, bytes [64 p, 64 p + 64)                   [j][64]
//   B   = the keys' codes in the tiles' VNNI layout: B[r][4 u + b] = code 64 p + 4 r + b
//         of key u (zero past head_dim and past the last key)                   [16][64]
//   C_l += A_l B (tdpbssd: s8 x s8 -> s32), exact,
// then score = fma(fma(C1, 254, C2), 254, C3) scale_j in f32 (explicit FMAs; the file is
// compiled without FMA contraction otherwise), so a score depends only on its query and key, never
// on the tile or the other queries of the call.
#include <immintrin.h>

#include <cstdint>

#include "amx_tiles.h"
#include "attention_internal.h"
#include "avx512_math.h"

namespace polykv::kernels::attn {
namespace {

using simd::Transpose16;

// The tile configuration for query groups of m rows: tiles 0..2 = A1..A3 [m][64], 3 and 7 =
// B [16][64] (alternating key groups), 4..6 = C1..C3 [m][16 x s32].
using amx::TileConfig;

void LoadConfig(int m) {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = static_cast<uint8_t>(t == 3 || t == 7 ? 16 : m);
    c.colsb[t] = 64;
  }
  _tile_loadconfig(&c);
}

// Codes [64 p, 64 p + 64) of one key vector at v (zero past head_dim): int8 codes
// (key_bits 8), or key_bits-bit codes packed LSB first (code c at bits [c kb, c kb + kb),
// value = code - 2^(kb - 1)) unpacked with VBMI: byte i of qword lane L takes the 8 source
// bytes from L kb on (vpermb), then bits [i kb, i kb + kb) of them (vpmultishiftqb).
struct KeyUnpack {
  __m512i idx, ctl, mask, bias;  // vpermb indices, shift counts, code mask, 2^(kb - 1)
  explicit KeyUnpack(int key_bits) {
    alignas(64) uint8_t i8[64], c8[64];
    for (int i = 0; i < 64; ++i) {
      i8[i] = static_cast<uint8_t>((i / 8) * key_bits + i % 8);
      c8[i] = static_cast<uint8_t>((i % 8) * key_bits);
    }
    idx = _mm512_load_si512(i8);
    ctl = _mm512_load_si512(c8);
    mask = _mm512_set1_epi8(static_cast<char>((1 << key_bits) - 1));
    bias = _mm512_set1_epi8(static_cast<char>(1 << (key_bits - 1)));
  }
};

inline __m512i KeyCodes(const uint8_t* v, int hd, int key_bits, const KeyUnpack& ku, int p) {
  const int cnt = hd - 64 * p < 64 ? hd - 64 * p : 64;
  const __mmask64 km = cnt >= 64 ? ~__mmask64{0} : (__mmask64{1} << cnt) - 1;
  if (key_bits == 8) return _mm512_maskz_loadu_epi8(km, v + 64 * p);
  const int nbytes = (cnt * key_bits + 7) / 8;
  const __mmask64 bm = nbytes >= 64 ? ~__mmask64{0} : (__mmask64{1} << nbytes) - 1;
  const __m512i raw = _mm512_maskz_loadu_epi8(bm, v + 8 * key_bits * p);
  const __m512i c = _mm512_and_si512(
      _mm512_multishift_epi64_epi8(ku.ctl, _mm512_permutexvar_epi8(ku.idx, raw)), ku.mask);
  return _mm512_maskz_sub_epi8(km, c, ku.bias);
}

// Key group g's B tiles (one per piece of 64 codes) at tiles + (g * pieces + p) * 1024; key t
// at keys + t * stride.
void KeyTiles(const uint8_t* keys, int64_t stride, int key_bits, const KeyUnpack& ku, int64_t tk,
              int hd, int64_t g, int pieces, uint8_t* tiles) {
  const int64_t valid = tk - 16 * g < 16 ? tk - 16 * g : 16;
  for (int p = 0; p < pieces; ++p) {
    __m512 r[16];
    for (int u = 0; u < 16; ++u)
      r[u] = u < valid
                 ? _mm512_castsi512_ps(KeyCodes(keys + (16 * g + u) * stride, hd, key_bits, ku, p))
                 : _mm512_setzero_ps();
    Transpose16(r);  // dword r of every key -> row r
    uint8_t* b = tiles + (g * pieces + p) * 1024;
    for (int c = 0; c < 16; ++c) _mm512_storeu_ps(reinterpret_cast<float*>(b + 64 * c), r[c]);
  }
}

// The products of one query group with key group g into C1..C3 (tiles 4..6), B in tile
// `bt` (3 or 7: the next group loads the other while this one multiplies). With one piece
// the A tiles are already loaded.
#define POLYKV_AMX_SCORE_GROUP(bt)                          \
  do {                                                      \
    _tile_zero(4);                                          \
    _tile_zero(5);                                          \
    _tile_zero(6);                                          \
    for (int p = 0; p < pieces; ++p) {                      \
      if (pieces > 1) {                                     \
        _tile_loadd(0, a + 64 * p, astride);                \
        _tile_loadd(1, a + rb + 64 * p, astride);           \
        _tile_loadd(2, a + 2 * rb + 64 * p, astride);       \
      }                                                     \
      _tile_loadd(bt, tiles + (g * pieces + p) * 1024, 64); \
      _tile_dpbssd(4, 0, bt);                               \
      _tile_dpbssd(5, 1, bt);                               \
      _tile_dpbssd(6, 2, bt);                               \
    }                                                       \
  } while (0)

}  // namespace

void ScoresAmxI8(const int8_t* q_codes, const float* q_code_scale, int nq, const void* keys,
                 int key_bits, int64_t key_stride, int64_t tk, int hd, float* s, int64_t ss,
                 void* key_tiles) {
  if (nq <= 0 || tk <= 0) return;
  const int rb = QueryCodeRowBytes(hd);
  const int pieces = rb / 64;
  const int64_t astride = static_cast<int64_t>(kQueryCodeLevels) * rb;
  const int64_t groups = (tk + 15) / 16;
  uint8_t* const tiles = static_cast<uint8_t*>(key_tiles);
  const KeyUnpack ku(key_bits);
  for (int64_t g = 0; g < groups; ++g)
    KeyTiles(static_cast<const uint8_t*>(keys), key_stride, key_bits, ku, tk, hd, g, pieces, tiles);
  alignas(64) int32_t cb[3][256];
  int config = -1;
  for (int j0 = 0; j0 < nq; j0 += 16) {
    const int m = nq - j0 < 16 ? nq - j0 : 16;
    if (m != config) {
      LoadConfig(m);
      config = m;
    }
    const int8_t* a = q_codes + j0 * astride;
    if (pieces == 1) {
      _tile_loadd(0, a, astride);
      _tile_loadd(1, a + rb, astride);
      _tile_loadd(2, a + 2 * rb, astride);
    }
    for (int64_t g = 0; g < groups; ++g) {
      if (g & 1)
        POLYKV_AMX_SCORE_GROUP(7);
      else
        POLYKV_AMX_SCORE_GROUP(3);
      _tile_stored(4, cb[0], 64);
      _tile_stored(5, cb[1], 64);
      _tile_stored(6, cb[2], 64);
      const int64_t left = tk - 16 * g;
      const __mmask16 km = static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1);
      const __m512 kb = _mm512_set1_ps(static_cast<float>(kQueryCodeBase));
      for (int j = 0; j < m; ++j) {
        __m512 f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cb[0] + 16 * j)), kb,
                                   _mm512_cvtepi32_ps(_mm512_load_si512(cb[1] + 16 * j)));
        f = _mm512_fmadd_ps(f, kb, _mm512_cvtepi32_ps(_mm512_load_si512(cb[2] + 16 * j)));
        f = _mm512_mul_ps(f, _mm512_set1_ps(q_code_scale[j0 + j]));
        _mm512_mask_storeu_ps(s + (j0 + j) * ss + 16 * g, km, f);
      }
    }
  }
  _tile_release();
}

#undef POLYKV_AMX_SCORE_GROUP

void QuantizeQueryCodesAvx512(const float* q, int hd, int8_t* codes, float* scale) {
  // QuantizeQueryCodes (attention_scalar.cc) on 16 lanes: the same f32 operations per element
  // (round to nearest even by the same magic constant), so the same codes and scale.
  const int rb = QueryCodeRowBytes(hd);
  __m512 am = _mm512_setzero_ps();
  __mmask16 bad = 0;
  const __m512 fmax = _mm512_set1_ps(3.40282347e38f);
  for (int i = 0; i < hd; i += 16) {
    const __mmask16 m = hd - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (hd - i)) - 1);
    const __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(m, q + i));
    am = _mm512_max_ps(am, a);
    bad |= _mm512_mask_cmp_ps_mask(m, a, fmax, _CMP_NLE_UQ);  // inf or NaN
  }
  const float amax = _mm512_reduce_max_ps(am);
  for (int l = 0; l < kQueryCodeLevels * rb; l += 64)
    _mm512_storeu_si512(codes + l, _mm512_setzero_si512());
  if (bad != 0 || amax == 0.0f) {
    *scale = bad != 0 ? __builtin_nanf("") : 0.0f;
    return;
  }
  const __m512 inv = _mm512_set1_ps(127.0f / amax);
  const __m512 hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  const __m512 kb = _mm512_set1_ps(static_cast<float>(kQueryCodeBase));
  auto round = [&](__m512 v) { return _mm512_sub_ps(_mm512_add_ps(v, magic), magic); };
  for (int i = 0; i < hd; i += 16) {
    const __mmask16 m = hd - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (hd - i)) - 1);
    __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, q + i), inv);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    const __m512 c1 = round(x);
    const __m512 r1 = _mm512_mul_ps(_mm512_sub_ps(x, c1), kb);
    const __m512 c2 = round(r1);
    const __m512 c3 = round(_mm512_mul_ps(_mm512_sub_ps(r1, c2), kb));
    _mm512_mask_cvtsepi32_storeu_epi8(codes + i, m, _mm512_cvtps_epi32(c1));
    _mm512_mask_cvtsepi32_storeu_epi8(codes + rb + i, m, _mm512_cvtps_epi32(c2));
    _mm512_mask_cvtsepi32_storeu_epi8(codes + 2 * rb + i, m, _mm512_cvtps_epi32(c3));
  }
  *scale = amax / 127.0f / static_cast<float>(kQueryCodeBase * kQueryCodeBase);
}

}  // namespace polykv::kernels::attn
