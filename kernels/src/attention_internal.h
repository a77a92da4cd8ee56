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
  /// >= (t1 - t0) * (3 * hd + nq) + 16 * hd floats: keys, values and scores of the chunk,
  /// and the keys transposed (AVX-512, many queries)
  float* scratch = nullptr;
  // Outputs per query j: max score m[j], sum l[j], o[j * hd] = normalized output
  // (packed values: in the rotated code domain, sum p_t norm_t levels[code_t] / l).
  float* m = nullptr;
  float* l = nullptr;
  float* o = nullptr;
};

/// Query rows per chunk from which the AVX-512 build scores on transposed keys (an agent's
/// prompt: its rows x the GQA group); below it (decode: one row x the group) key-row tiles.
inline constexpr int kTransposedQueries = 12;

using ChunkFn = void (*)(const ChunkArgs&);

void ChunkScalar(const ChunkArgs& a);
/// Only in builds with the ISA compiled in (POLYKV_HAVE_AVX2_KERNELS / _AVX512_).
void ChunkAvx2(const ChunkArgs& a);
void ChunkAvx512(const ChunkArgs& a);

}  // namespace polykv::kernels::attn
