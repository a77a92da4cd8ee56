// GGUF (v2/v3) reader: metadata, tensor table, alignment, and dequantization of ggml
// tensor types to f32. Every read is bounds-checked against the file size.
// Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "polykv/status.h"

namespace polykv::model {

/// Name of a ggml type ("Q4_1"), or "type N" for unknown values.
std::string GgmlTypeName(uint32_t type);

/// One entry of the GGUF tensor table.
struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  ///< ggml order: dims[0] is the fastest-varying (row length)
  uint32_t type = 0;          ///< a ggml type number (kernels/ggml_types.h; may be unsupported)
  uint64_t offset = 0;        ///< absolute byte offset in the file
  uint64_t nbytes = 0;        ///< bytes of data (checked to lie inside the file)
  int64_t elements() const;
};

/// A memory-mapped, validated GGUF file. Move-only.
class GgufFile {
 public:
  /// Opens and validates `path`: magic, version (2 or 3), counts, every string/array
  /// length, tensor dims x type size and offsets against the file size, alignment.
  /// The file is mapped read-only (MAP_SHARED) for the lifetime of the object.
  /// Errors: kNotFound (no file); kDataLoss naming the field for truncated files and
  /// lengths/counts/offsets that point past the end of the file; kInvalidArgument naming the
  /// field for bad magic, unsupported version, unknown value or ggml types, n_dims > 4, dims
  /// overflowing int64, misaligned tensor offsets, duplicate keys or tensor names, arrays
  /// nested deeper than 8; kUnimplemented for a tensor of a ggml type whose size PolyKV does
  /// not know (e.g. "tensor blk.0.attn_q.weight has ggml type IQ2_XXS (16), which PolyKV does
  /// not support").
  [[nodiscard]] static StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const;
  const std::string& path() const;
  bool Has(std::string_view key) const;
  /// Typed metadata getters; kNotFound if absent, kInvalidArgument on a type mismatch
  /// (a nested array is a mismatch for every array getter), kOutOfRange when an integer
  /// does not fit the result type.
  [[nodiscard]] StatusOr<std::string> GetString(std::string_view key) const;
  [[nodiscard]] StatusOr<int64_t> GetInt(std::string_view key) const;   ///< any integer type
  [[nodiscard]] StatusOr<double> GetFloat(std::string_view key) const;  ///< f32/f64 (or integer)
  [[nodiscard]] StatusOr<bool> GetBool(std::string_view key) const;
  [[nodiscard]] StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  [[nodiscard]] StatusOr<std::vector<float>> GetFloatArray(std::string_view key) const;
  [[nodiscard]] StatusOr<std::vector<int32_t>> GetIntArray(std::string_view key) const;
  /// All metadata keys in file order.
  std::vector<std::string> Keys() const;

  const std::vector<GgufTensorInfo>& tensors() const;
  /// nullptr when no tensor has that name.
  const GgufTensorInfo* FindTensor(std::string_view name) const;
  /// The raw bytes of a tensor (inside the mapping, valid while this object lives); empty
  /// for an info that does not lie inside this file.
  absl::Span<const uint8_t> TensorData(const GgufTensorInfo& info) const;

 private:
  struct Impl;
  explicit GgufFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Bytes needed for `elements` values of `type` (block-quantized types need whole blocks).
/// Known sizes: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K..Q8_K, I8..I64, F64.
/// Errors: kUnimplemented naming the type when unsupported; kInvalidArgument when
/// `elements` is not a multiple of the block size.
[[nodiscard]] StatusOr<uint64_t> GgmlTypeBytes(uint32_t type, int64_t elements);

/// Dequantizes `elements` values of `type` from `data` (`data_bytes` long) to f32 `out`.
/// Supports F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K (at least every
/// type in SmolLM2-135M-Instruct.Q4_1.gguf). Errors: kUnimplemented naming the type;
/// kInvalidArgument when data_bytes is too small.
Status DequantizeToF32(uint32_t type, const uint8_t* data, uint64_t data_bytes, int64_t elements,
                       float* out);

}  // namespace polykv::model
