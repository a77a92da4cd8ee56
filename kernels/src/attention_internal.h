// Internal interface of the attention kernels: one chunk of tokens of one KV head against a
// group of queries, per ISA. Included by the SIMD sources (compiled with their ISA flags):
// only declarations and plain data here, no inline functions with external linkage.
#pragma once

#include <cstdint>

namespace polykv::kernels::attn {

/// Element type of the keys a chunk reads.
enum KeyKind : int { kKeyF32 = 0, kKeyF16 = 1, kKeyBf16 = 2, kKeyI8 = 3 };
/// Element type of the values a chunk reads.
enum ValueKind : int { kValF32 = 0, kValF16 = 1, kValBf16 = 2, kValPacked = 3 };

/// One chunk: tokens [t0, t1) of one KV head against nq queries.
struct ChunkArgs {
  int32_t hd = 0;
  int32_t nq = 0;
  const float* q = nullptr;        ///< [nq][hd], already multiplied by 1/sqrt(hd) and key scales
  const int64_t* limit = nullptr;  ///< [nq]: query j attends to tokens t < limit[j] only
  int key_kind = kKeyF32;
  const void* k = nullptr;  ///< token 0 of this head; token t at k + t * hd elements
  int value_kind = kValF32;
  const void* v = nullptr;         ///< raw: token t at v + t * hd elements; packed: + t * v_bytes
  int64_t v_bytes = 0;             ///< packed bytes per vector
  const float* v_norms = nullptr;  ///< packed: norms of this head's tokens (index t)
  int32_t bits = 3;                ///< packed: value bits (2, 3 or 4)
  const float* levels = nullptr;   ///< packed: 2^bits Lloyd-Max levels
  int64_t t0 = 0, t1 = 0;
  /// AVX-512: queries [0, transposed) score on transposed keys, the others on key-row
  /// tiles (the two paths sum in different orders); -1 = all of them iff
  /// nq >= kTransposedQueries (one call's choice). Other ISAs ignore it.
  int32_t transposed = -1;
  /// Integer prefix scores (int8 keys, the AVX-512 build on AMX-INT8 tiles; null: f32
  /// scores): query j as kQueryCodeLevels rows of int8 codes at q_codes + j * kQueryCodeLevels
  /// * QueryCodeRowBytes(hd) (QuantizeQueryCodes) and its scale q_code_scale[j]; `q` is then
  /// not read for the scores.
  const int8_t* q_codes = nullptr;
  const float* q_code_scale = nullptr;
  /// With q_codes, kKeyI8 keys may also be the pool's packed codes: key_bits 4..7 and
  /// k_bytes per vector (8: int8 codes, hd per vector).
  int32_t key_bits = 8;
  int64_t k_bytes = 0;
  /// >= (t1 - t0) * (3 * hd + nq) + 16 * hd floats: keys, values and scores of the chunk,
  /// and the keys transposed (AVX-512, many queries); with q_codes, AmxKeyTileFloats(t1 -
  /// t0, hd) more (the keys in the tiles' layout).
  float* scratch = nullptr;
  // Outputs per query j: max score m[j], sum l[j], o[j * hd] = normalized output
  // (packed values: in the rotated code domain, sum p_t norm_t levels[code_t] / l).
  float* m = nullptr;
  float* l = nullptr;
  float* o = nullptr;
};

/// Packed value widths the SIMD chunks decode (others run the scalar chunk, which reads only
/// unpacked int8 keys).
inline constexpr int kSimdValueBitsMin = 2, kSimdValueBitsMax = 4;

/// Query rows per chunk from which the AVX-512 build scores on transposed keys (an agent's
/// prompt: its rows x the GQA group); below it (decode: one row x the group) key-row tiles.
inline constexpr int kTransposedQueries = 12;

/// Integer scores (ChunkArgs::q_codes): a query q (already scaled) is held as three int8 code
/// rows, q ~= scale (254^2 q1 + 254 q2 + q3) with scale = max|q| / 127 / 254^2 and every code
/// in [-127, 127] (|error| <= 3e-7 max|q| per element, about f32's precision); a score
/// against int8 key codes k is fma(fma(C1, 254, C2), 254, C3) scale in f32 (fused), from
/// the exact integer dot products C_i = q_i . k (AMX-INT8 tdpbssd; |C_i| <= 127 * 127 *
/// head_dim fits int32 and converts to f32 exactly).
inline constexpr int kQueryCodeBase = 254;
inline constexpr int kQueryCodeLevels = 3;
/// Largest head_dim of integer scores (and a multiple of 8 is required).
inline constexpr int kIntScoreMaxHeadDim = 256;
/// Bytes of one query code row: head_dim rounded up to a tile row (64 bytes), zero padded.
int QueryCodeRowBytes(int hd);
/// codes [kQueryCodeLevels][QueryCodeRowBytes(hd)] and *scale of query q[hd] (see above;
/// all-zero q: zero codes and scale; a non-finite element: zero codes, scale NaN, so its
/// scores are NaN as f32 scores would be).
void QuantizeQueryCodes(const float* q, int hd, int8_t* codes, float* scale);
/// The same codes and scale on AVX-512 (attention_amx.cc; call only where AmxInt8Supported()).
void QuantizeQueryCodesAvx512(const float* q, int hd, int8_t* codes, float* scale);
/// One integer score (the reference of ScoresAmxI8, bit for bit): query codes as above
/// against one key's int8 codes.
float ScoreI8(const int8_t* codes, float scale, const int8_t* key, int hd);
/// Floats of scratch the integer scores of `tokens` keys use (their tile layout).
int64_t AmxKeyTileFloats(int64_t tokens, int hd);
/// AMX-INT8 integer scores (attention_amx.cc; call only where AmxInt8Supported()):
/// s[j * ss + t] for queries j < nq (codes and scales as ChunkArgs::q_codes) and keys t < tk
/// at keys + t * key_stride bytes: int8 codes (key_bits 8) or the pool's packed codes of
/// key_bits 4..7 (read as they lie); key_tiles: AmxKeyTileFloats(tk, hd) floats of scratch.
void ScoresAmxI8(const int8_t* q_codes, const float* q_code_scale, int nq, const void* keys,
                 int key_bits, int64_t key_stride, int64_t tk, int hd, float* s, int64_t ss,
                 void* key_tiles);

using ChunkFn = void (*)(const ChunkArgs&);

void ChunkScalar(const ChunkArgs& a);
/// Only in builds with the ISA compiled in (POLYKV_HAVE_AVX2_KERNELS / _AVX512_).
void ChunkAvx2(const ChunkArgs& a);
void ChunkAvx512(const ChunkArgs& a);

}  // namespace polykv::kernels::attn
