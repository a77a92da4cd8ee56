// Safetensors reader (https://huggingface.co/docs/safetensors): header parsing with bounds
// checks, tensor reads converted to f32 via pread, and a read-only shared mapping of the whole
// file for the mapped runtime.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "polykv/status.h"

namespace polykv::model {

/// One tensor of a .safetensors file.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;           ///< "F32", "F16", "BF16", ... as written in the header
  std::vector<int64_t> shape;  ///< row-major (PyTorch order)
  uint64_t offset = 0;         ///< absolute byte offset in the file
  uint64_t nbytes = 0;         ///< == product(shape) * dtype size (validated)
};

/// A validated .safetensors file: layout = u64 LE header length N, N bytes of JSON
/// {name: {dtype, shape, data_offsets: [begin, end)}, "__metadata__": {...}}, then data;
/// offsets are relative to the first data byte. Open checks N against the file size,
/// every dtype, shape (non-negative, product without overflow), and that every
/// [begin, end) lies inside the data section and matches shape x dtype size.
class SafetensorsFile {
 public:
  /// Errors: kNotFound (no file); kInvalidArgument naming the file and the bad field.
  [[nodiscard]] static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  /// nullptr when absent.
  const SafetensorsEntry* Find(std::string_view name) const;

  /// Reads `entry` (F32/F16/BF16) as f32 values, row-major, product(shape) of them.
  /// Errors: kUnimplemented for other dtypes; kDataLoss on a short read.
  [[nodiscard]] StatusOr<std::vector<float>> ReadF32(const SafetensorsEntry& entry) const;

  /// The bytes of `entry` inside the read-only mapping (valid while this object lives);
  /// empty for an entry that does not lie inside this file.
  absl::Span<const uint8_t> Data(const SafetensorsEntry& entry) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  int fd_ = -1;
  uint64_t file_size_ = 0;
  const void* map_ = nullptr;  ///< PROT_READ, MAP_SHARED mapping of the whole file
  std::vector<SafetensorsEntry> entries_;
};

}  // namespace polykv::model
