// Dequantization of ggml tensor blocks to f32: the type and size checks of the GGUF reader,
// then the block decoders of the matrix kernels (kernels::DequantizeValues: ggml's
// dequantize_row_* layouts, one implementation for the loader and the kernels). The ggml
// type numbers are kernels::WeightType's.
#include "absl/strings/str_cat.h"
#include "polykv/kernels/matmul.h"
#include "polykv/model/gguf.h"

namespace polykv::model {

Status DequantizeToF32(uint32_t type, const uint8_t* data, uint64_t data_bytes, int64_t elements,
                       float* out) {
  if (!kernels::IsSupportedWeightType(type)) {
    return absl::UnimplementedError(absl::StrCat("DequantizeToF32: ggml type ", GgmlTypeName(type),
                                                 " (", type, ") is not supported by PolyKV"));
  }
  POLYKV_ASSIGN_OR_RETURN(uint64_t need, GgmlTypeBytes(type, elements));
  if (data_bytes < need) {
    return absl::InvalidArgumentError(absl::StrCat("DequantizeToF32: ", elements, " values of ",
                                                   GgmlTypeName(type), " need ", need,
                                                   " bytes, got ", data_bytes));
  }
  if (elements == 0) return absl::OkStatus();
  if (data == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("DequantizeToF32: null data or output pointer");
  }
  return kernels::DequantizeValues(static_cast<kernels::WeightType>(type), data, data_bytes,
                                   elements, out);
}

}  // namespace polykv::model
