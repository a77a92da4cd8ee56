// AMX-INT8 tiles for the attention scores of a pool's int8 key codes (attention_internal.h,
// "Integer scores"). Compiled with -mamx-tile -mamx-int8 and the AVX-512 flags; called only
// where AmxInt8Supported().
//
// Per group of up to 16 queries j and 16 keys t, per piece p of 64 head_dim elements:
//   A_l = the queries' code rows q_l, bytes [64 p, 64 p + 64)                   [j][64]
//   B   = the keys' codes in the tiles' VNNI layout: B[r][4 u + b] = code 64 p + 4 r + b
//         of key u (zero past head_dim and past the last key)                   [16][64]
//   C_l += A_l B (tdpbssd: s8 x s8 -> s32), exact,
// then score = ((128 C1 + C2) 128 + C3) scale_j in f32, in that order (the file is compiled
// without FMA contraction), so a score depends only on its query and key, never on the tile
// or the other queries of the call.
#include <immintrin.h>

#include <cstdint>

#include "attention_internal.h"
#include "avx512_math.h"

namespace polykv::kernels::attn {
namespace {

using simd::Transpose16;

// Tile configuration (Intel SDM, LDTILECFG), palette 1, for query groups of m rows: tiles
// 0..2 = A1..A3 [m][64], 3 and 7 = B [16][64] (alternating key groups), 4..6 = C1..C3
// [m][16 x s32].
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void LoadConfig(int m) {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = static_cast<uint8_t>(t == 3 || t == 7 ? 16 : m);
    c.colsb[t] = 64;
  }
  _tile_loadconfig(&c);
}

// Key group g's B tiles (one per piece of 64 codes) at tiles + (g * pieces + p) * 1024.
void KeyTiles(const int8_t* keys, int64_t tk, int hd, int64_t g, int pieces, uint8_t* tiles) {
  const int64_t valid = tk - 16 * g < 16 ? tk - 16 * g : 16;
  for (int p = 0; p < pieces; ++p) {
    const int left = hd - 64 * p;
    const __mmask64 km = left >= 64 ? ~__mmask64{0} : (__mmask64{1} << left) - 1;
    __m512 r[16];
    for (int u = 0; u < 16; ++u)
      r[u] = u < valid ? _mm512_castsi512_ps(
                             _mm512_maskz_loadu_epi8(km, keys + (16 * g + u) * hd + 64 * p))
                       : _mm512_setzero_ps();
    Transpose16(r);  // dword r of every key -> row r
    uint8_t* b = tiles + (g * pieces + p) * 1024;
    for (int c = 0; c < 16; ++c) _mm512_storeu_ps(reinterpret_cast<float*>(b + 64 * c), r[c]);
  }
}

// The products of one query group with key group g into C1..C3 (tiles 4..6), B in tile
// `bt` (3 or 7: the next group loads the other while this one multiplies). With one piece
// the A tiles are already loaded.
#define POLYKV_AMX_SCORE_GROUP(bt)                                                         \
  do {                                                                                     \
    _tile_zero(4);                                                                         \
    _tile_zero(5);                                                                         \
    _tile_zero(6);                                                                         \
    for (int p = 0; p < pieces; ++p) {                                                     \
      if (pieces > 1) {                                                                    \
        _tile_loadd(0, a + 64 * p, astride);                                               \
        _tile_loadd(1, a + rb + 64 * p, astride);                                          \
        _tile_loadd(2, a + 2 * rb + 64 * p, astride);                                      \
      }                                                                                    \
      _tile_loadd(bt, tiles + (g * pieces + p) * 1024, 64);                                \
      _tile_dpbssd(4, 0, bt);                                                              \
      _tile_dpbssd(5, 1, bt);                                                              \
      _tile_dpbssd(6, 2, bt);                                                              \
    }                                                                                      \
  } while (0)

}  // namespace

void ScoresAmxI8(const int8_t* q_codes, const float* q_code_scale, int nq, const int8_t* keys,
                 int64_t tk, int hd, float* s, int64_t ss, void* key_tiles) {
  if (nq <= 0 || tk <= 0) return;
  const int rb = QueryCodeRowBytes(hd);
  const int pieces = rb / 64;
  const int64_t astride = static_cast<int64_t>(kQueryCodeLevels) * rb;
  const int64_t groups = (tk + 15) / 16;
  uint8_t* const tiles = static_cast<uint8_t*>(key_tiles);
  for (int64_t g = 0; g < groups; ++g) KeyTiles(keys, tk, hd, g, pieces, tiles);
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
      const __m512 k128 = _mm512_set1_ps(128.0f);
      for (int j = 0; j < m; ++j) {
        __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cb[0] + 16 * j)), k128);
        f = _mm512_add_ps(f, _mm512_cvtepi32_ps(_mm512_load_si512(cb[1] + 16 * j)));
        f = _mm512_mul_ps(f, k128);
        f = _mm512_add_ps(f, _mm512_cvtepi32_ps(_mm512_load_si512(cb[2] + 16 * j)));
        f = _mm512_mul_ps(f, _mm512_set1_ps(q_code_scale[j0 + j]));
        _mm512_mask_storeu_ps(s + (j0 + j) * ss + 16 * g, km, f);
      }
    }
  }
  _tile_release();
}

#undef POLYKV_AMX_SCORE_GROUP

}  // namespace polykv::kernels::attn
