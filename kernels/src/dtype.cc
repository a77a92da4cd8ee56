// Element sizes of the codec's dtypes.
#include "polykv/kernels/codec.h"

namespace polykv::kernels {

size_t DTypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

}  // namespace polykv::kernels
