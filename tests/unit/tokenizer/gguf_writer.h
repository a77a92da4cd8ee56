// Test helper: builds small valid GGUF v3 files in memory (metadata + tensors) and records
// the byte offsets of their fields so tests can corrupt them precisely.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace polykv::model::testing {

/// Builds a GGUF file. Value type numbers follow gguf.md (u8=0 ... f64=12).
class GgufWriter {
 public:
  void AddU32(const std::string& key, uint32_t v);
  void AddI32(const std::string& key, int32_t v);
  void AddF32(const std::string& key, float v);
  void AddBool(const std::string& key, bool v);
  void AddString(const std::string& key, const std::string& v);
  void AddStringArray(const std::string& key, const std::vector<std::string>& v);
  void AddF32Array(const std::string& key, const std::vector<float>& v);
  void AddI32Array(const std::string& key, const std::vector<int32_t>& v);
  /// A value whose bytes (after the type field) are given verbatim.
  void AddRaw(const std::string& key, uint32_t type, const std::string& value_bytes);
  /// A tensor with ggml `type`, dims in ggml order and its raw data.
  void AddTensor(const std::string& name, const std::vector<uint64_t>& dims, uint32_t type,
                 const std::string& data);

  /// Serializes the file. Fills the offset fields below.
  std::string Build(uint32_t version = 3, uint32_t alignment = 32);

  /// Offsets (filled by Build): start of each metadata kv (its key length field), each
  /// tensor-info entry (its name length field), the data section and each tensor's data.
  std::vector<uint64_t> kv_offsets;
  std::vector<uint64_t> tensor_info_offsets;
  std::vector<uint64_t> tensor_ndims_offsets;
  std::vector<uint64_t> tensor_type_offsets;
  std::vector<uint64_t> tensor_offset_offsets;
  uint64_t tensor_table_end = 0;
  uint64_t data_start = 0;

  // Little-endian encoders, public for building raw values.
  static std::string U32(uint32_t v);
  static std::string U64(uint64_t v);
  static std::string Str(const std::string& s);

 private:
  struct Kv {
    std::string key;
    uint32_t type;
    std::string bytes;
  };
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    std::string data;
  };
  std::vector<Kv> kvs_;
  std::vector<Tensor> tensors_;
};

/// Writes `bytes` to a fresh file under the test temp dir and returns its path.
std::string WriteTempFile(const std::string& name, const std::string& bytes);

}  // namespace polykv::model::testing
