// Test helper: in-memory GGUF v3 builder (see gguf_writer.h).
#include "gguf_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

namespace polykv::model::testing {

std::string GgufWriter::U32(uint32_t v) { return std::string(reinterpret_cast<char*>(&v), 4); }
std::string GgufWriter::U64(uint64_t v) { return std::string(reinterpret_cast<char*>(&v), 8); }
std::string GgufWriter::Str(const std::string& s) { return U64(s.size()) + s; }

void GgufWriter::AddU32(const std::string& key, uint32_t v) { kvs_.push_back({key, 4, U32(v)}); }
void GgufWriter::AddI32(const std::string& key, int32_t v) {
  kvs_.push_back({key, 5, std::string(reinterpret_cast<char*>(&v), 4)});
}
void GgufWriter::AddF32(const std::string& key, float v) {
  kvs_.push_back({key, 6, std::string(reinterpret_cast<char*>(&v), 4)});
}
void GgufWriter::AddBool(const std::string& key, bool v) {
  kvs_.push_back({key, 7, std::string(1, v ? '\1' : '\0')});
}
void GgufWriter::AddString(const std::string& key, const std::string& v) {
  kvs_.push_back({key, 8, Str(v)});
}
void GgufWriter::AddStringArray(const std::string& key, const std::vector<std::string>& v) {
  std::string b = U32(8) + U64(v.size());
  for (const auto& s : v) b += Str(s);
  kvs_.push_back({key, 9, b});
}
void GgufWriter::AddF32Array(const std::string& key, const std::vector<float>& v) {
  std::string b = U32(6) + U64(v.size());
  b.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  kvs_.push_back({key, 9, b});
}
void GgufWriter::AddI32Array(const std::string& key, const std::vector<int32_t>& v) {
  std::string b = U32(5) + U64(v.size());
  b.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  kvs_.push_back({key, 9, b});
}
void GgufWriter::AddRaw(const std::string& key, uint32_t type, const std::string& value_bytes) {
  kvs_.push_back({key, type, value_bytes});
}
void GgufWriter::AddTensor(const std::string& name, const std::vector<uint64_t>& dims,
                           uint32_t type, const std::string& data) {
  tensors_.push_back({name, dims, type, data});
}

std::string GgufWriter::Build(uint32_t version, uint32_t alignment) {
  kv_offsets.clear();
  tensor_info_offsets.clear();
  tensor_ndims_offsets.clear();
  tensor_type_offsets.clear();
  tensor_offset_offsets.clear();
  std::string out = "GGUF" + U32(version) + U64(tensors_.size()) + U64(kvs_.size());
  for (const Kv& kv : kvs_) {
    kv_offsets.push_back(out.size());
    out += Str(kv.key) + U32(kv.type) + kv.bytes;
  }
  uint64_t rel = 0;
  std::vector<uint64_t> rels;
  for (const Tensor& t : tensors_) {
    tensor_info_offsets.push_back(out.size());
    out += Str(t.name);
    tensor_ndims_offsets.push_back(out.size());
    out += U32(static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) out += U64(d);
    tensor_type_offsets.push_back(out.size());
    out += U32(t.type);
    tensor_offset_offsets.push_back(out.size());
    out += U64(rel);
    rels.push_back(rel);
    rel += t.data.size();
    rel = (rel + alignment - 1) / alignment * alignment;
  }
  tensor_table_end = out.size();
  if (!tensors_.empty()) {
    while (out.size() % alignment) out += '\0';
  }
  data_start = out.size();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    out.resize(data_start + rels[i], '\0');
    out += tensors_[i].data;
  }
  return out;
}

std::string WriteTempFile(const std::string& name, const std::string& bytes) {
  std::string dir = ::testing::TempDir();
  if (!dir.empty() && dir.back() != '/') dir += '/';
  std::string path = dir + "polykv_" + std::to_string(::getpid()) + "_" + name;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

}  // namespace polykv::model::testing
