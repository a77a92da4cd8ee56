// The AVX2 variant of the attention chunk (compiled with -mavx2 -mfma -mf16c; called only
// on CPUs with those features).
#include "attention_simd_impl.h"

namespace polykv::kernels::attn {

void ChunkAvx2(const ChunkArgs& a) { ChunkSimd(a); }

}  // namespace polykv::kernels::attn
