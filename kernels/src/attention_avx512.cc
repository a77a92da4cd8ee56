// The AVX-512 build of the attention chunk: the same body as the AVX2 variant compiled with
// AVX-512 flags (EVEX encodings, 32 vector registers); called only on CPUs with AVX-512.
#include "attention_simd_impl.h"

namespace polykv::kernels::attn {

void ChunkAvx512(const ChunkArgs& a) { ChunkSimd(a); }

}  // namespace polykv::kernels::attn
