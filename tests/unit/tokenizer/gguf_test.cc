// GGUF reader tests: valid files, crafted/truncated files, and DequantizeToF32 on hand-built
// blocks with known values.
#include "polykv/model/gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>

#include "gguf_writer.h"

namespace polykv::model {
namespace {

using testing::GgufWriter;
using testing::WriteTempFile;

std::string F32Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

void PutU16(std::string* s, size_t at, uint16_t v) { std::memcpy(&(*s)[at], &v, 2); }
void PutU32(std::string* s, size_t at, uint32_t v) { std::memcpy(&(*s)[at], &v, 4); }
void PutU64(std::string* s, size_t at, uint64_t v) { std::memcpy(&(*s)[at], &v, 8); }

// Q8_0 block: d = 0.5 (fp16 0x3800), qs[j] = j - 16.
std::string Q8Block() {
  std::string b(34, '\0');
  PutU16(&b, 0, 0x3800);
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<char>(j - 16);
  return b;
}

// A valid file: metadata of several types, an F32 [4,2] and a Q8_0 [32,2] tensor.
GgufWriter ValidWriter() {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddU32("llama.block_count", 2);
  w.AddI32("test.negative", -7);
  w.AddF32("test.eps", 0.25f);
  w.AddBool("test.flag", true);
  w.AddStringArray("tokenizer.ggml.tokens", {"a", "bc", ""});
  w.AddF32Array("tokenizer.ggml.scores", {0.5f, -1.0f, 2.0f});
  w.AddI32Array("tokenizer.ggml.token_type", {1, 3, 6});
  // Nested array: array of 2 arrays of i32.
  std::string nested = GgufWriter::U32(9) + GgufWriter::U64(2);
  for (int k = 0; k < 2; ++k) {
    nested += GgufWriter::U32(5) + GgufWriter::U64(1);
    int32_t v = 10 + k;
    nested.append(reinterpret_cast<char*>(&v), 4);
  }
  w.AddRaw("test.nested", 9, nested);
  w.AddTensor("a.weight", {4, 2}, 0, F32Bytes({1, 2, 3, 4, 5, 6, 7, 8}));
  w.AddTensor("b.weight", {32, 2}, 8, Q8Block() + Q8Block());
  return w;
}

TEST(GgufFileTest, OpensValidFileAndReadsEverything) {
  GgufWriter w = ValidWriter();
  std::string path = WriteTempFile("valid.gguf", w.Build());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.Keys().size(), 9u);
  EXPECT_EQ(g.Keys()[0], "general.architecture");
  EXPECT_EQ(*g.GetString("general.architecture"), "llama");
  EXPECT_EQ(*g.GetInt("llama.block_count"), 2);
  EXPECT_EQ(*g.GetInt("test.negative"), -7);
  EXPECT_EQ(*g.GetFloat("test.eps"), 0.25);
  EXPECT_EQ(*g.GetFloat("llama.block_count"), 2.0);
  EXPECT_TRUE(*g.GetBool("test.flag"));
  EXPECT_EQ(*g.GetStringArray("tokenizer.ggml.tokens"), (std::vector<std::string>{"a", "bc", ""}));
  EXPECT_EQ(*g.GetFloatArray("tokenizer.ggml.scores"), (std::vector<float>{0.5f, -1.0f, 2.0f}));
  EXPECT_EQ(*g.GetIntArray("tokenizer.ggml.token_type"), (std::vector<int32_t>{1, 3, 6}));
  EXPECT_TRUE(g.Has("test.nested"));
  EXPECT_EQ(g.GetIntArray("test.nested").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetString("missing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(g.GetString("llama.block_count").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetInt("general.architecture").status().code(), absl::StatusCode::kInvalidArgument);

  ASSERT_EQ(g.tensors().size(), 2u);
  const GgufTensorInfo* a = g.FindTensor("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dims, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(a->elements(), 8);
  EXPECT_EQ(a->nbytes, 32u);
  EXPECT_EQ(a->offset, w.data_start);
  EXPECT_EQ(a->offset % 32, 0u);
  auto data = g.TensorData(*a);
  std::vector<float> out(8);
  ASSERT_TRUE(DequantizeToF32(a->type, data.data(), data.size(), 8, out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));

  const GgufTensorInfo* b = g.FindTensor("b.weight");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->type, 8u);
  EXPECT_EQ(b->nbytes, 68u);
  EXPECT_EQ(b->offset, w.data_start + 32);  // a has 32 bytes, already aligned
  std::vector<float> q(64);
  auto bd = g.TensorData(*b);
  ASSERT_TRUE(DequantizeToF32(b->type, bd.data(), bd.size(), 64, q.data()).ok());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(q[i], 0.5f * static_cast<float>(i % 32 - 16)) << i;
  EXPECT_EQ(g.FindTensor("c.weight"), nullptr);
}

TEST(GgufFileTest, MissingFileIsNotFound) {
  auto f = GgufFile::Open("/nonexistent/polykv/none.gguf");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
}

// Every strict prefix of a valid file is rejected cleanly (header, metadata, tensor table,
// padding, data), with kDataLoss or kInvalidArgument.
TEST(GgufFileTest, TruncatedAtEveryOffsetIsCleanError) {
  GgufWriter w = ValidWriter();
  std::string bytes = w.Build();
  ASSERT_GT(bytes.size(), w.data_start);
  std::string path = WriteTempFile("trunc.gguf", "");
  for (size_t n = 0; n < bytes.size(); ++n) {
    WriteTempFile("trunc.gguf", bytes.substr(0, n));
    auto f = GgufFile::Open(path);
    ASSERT_FALSE(f.ok()) << "prefix of " << n << " bytes was accepted";
    auto code = f.status().code();
    EXPECT_TRUE(code == absl::StatusCode::kDataLoss || code == absl::StatusCode::kInvalidArgument)
        << n << ": " << f.status();
    if (n >= 24 && n < w.kv_offsets[1]) {
      EXPECT_NE(f.status().message().find("metadata"), std::string::npos) << f.status();
    }
    if (n > w.tensor_info_offsets[0] && n < w.tensor_table_end) {
      EXPECT_NE(f.status().message().find("tensor"), std::string::npos) << f.status();
    }
  }
  // The whole file opens.
  WriteTempFile("trunc.gguf", bytes);
  EXPECT_TRUE(GgufFile::Open(path).ok());
}

struct Corruption {
  const char* name;
  absl::StatusCode code;
  const char* message_part;
};

StatusOr<std::unique_ptr<GgufFile>> OpenBytes(const std::string& bytes) {
  return GgufFile::Open(WriteTempFile("crafted.gguf", bytes));
}

void ExpectError(const StatusOr<std::unique_ptr<GgufFile>>& f, absl::StatusCode code,
                 const std::string& part) {
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), code) << f.status();
  EXPECT_NE(f.status().message().find(part), std::string::npos)
      << "'" << part << "' not in: " << f.status();
}

// ValidWriter() after Build(): the offsets of its file's fields.
const GgufWriter& Built() {
  static const GgufWriter* w = [] {
    auto* v = new GgufWriter(ValidWriter());
    v->Build();
    return v;
  }();
  return *w;
}

// A field of ValidWriter()'s file to overwrite: its offset, width (4 or 8 bytes) and value.
struct Patch {
  size_t at;
  int bytes;
  uint64_t value;
};
Patch U32At(size_t at, uint32_t value) { return {at, 4, value}; }
Patch U64At(size_t at, uint64_t value) { return {at, 8, value}; }

// ValidWriter()'s file with `patches` applied fails to open with `code` and a message holding
// `part` (ExpectError).
void ExpectPatchedError(std::initializer_list<Patch> patches, absl::StatusCode code,
                        const std::string& part) {
  std::string b = ValidWriter().Build();
  for (const Patch& p : patches) {
    if (p.bytes == 4) {
      PutU32(&b, p.at, static_cast<uint32_t>(p.value));
    } else {
      PutU64(&b, p.at, p.value);
    }
  }
  ExpectError(OpenBytes(b), code, part);
}

TEST(GgufFileTest, BadMagic) {
  std::string b = ValidWriter().Build();
  b[0] = 'X';
  ExpectError(OpenBytes(b), absl::StatusCode::kInvalidArgument, "magic");
}

TEST(GgufFileTest, UnsupportedVersion) {
  for (uint32_t v : {1u, 4u, 0x03000000u}) {
    ExpectPatchedError({U32At(4, v)}, absl::StatusCode::kInvalidArgument, "version");
  }
  GgufWriter w = ValidWriter();
  EXPECT_TRUE(OpenBytes(w.Build(2)).ok());
}

TEST(GgufFileTest, HugeCounts) {
  ExpectPatchedError({U64At(16, ~0ull)}, absl::StatusCode::kDataLoss, "metadata_kv_count");
  ExpectPatchedError({U64At(8, 1ull << 60)}, absl::StatusCode::kDataLoss, "tensor_count");
}

TEST(GgufFileTest, HugeStringLength) {
  const GgufWriter& w = Built();
  // Key length of the first kv.
  ExpectPatchedError({U64At(w.kv_offsets[0], ~0ull - 3)}, absl::StatusCode::kDataLoss,
                     "metadata key #0");
  // The string value of general.architecture: after key (8+20 bytes) and type (4).
  ExpectPatchedError({U64At(w.kv_offsets[0] + 8 + 20 + 4, 1ull << 62)}, absl::StatusCode::kDataLoss,
                     "general.architecture");
}

TEST(GgufFileTest, HugeArrayCount) {
  const GgufWriter& w = Built();
  // tokenizer.ggml.tokens is kv #5: key(8+21) type(4) elem type(4) count(8).
  size_t count_at = w.kv_offsets[5] + 8 + 21 + 4 + 4;
  ExpectPatchedError({U64At(count_at, 1ull << 61)}, absl::StatusCode::kDataLoss,
                     "tokenizer.ggml.tokens");
  // scores (f32 array) kv #6: count * 4 overflows.
  ExpectPatchedError({U64At(w.kv_offsets[6] + 8 + 21 + 4 + 4, ~0ull / 2)},
                     absl::StatusCode::kDataLoss, "tokenizer.ggml.scores");
}

TEST(GgufFileTest, UnknownValueType) {
  // The type of llama.block_count.
  ExpectPatchedError({U32At(Built().kv_offsets[1] + 8 + 17, 77)},
                     absl::StatusCode::kInvalidArgument, "llama.block_count");
}

TEST(GgufFileTest, DeeplyNestedArrayRejected) {
  GgufWriter w;
  std::string v;
  for (int k = 0; k < 20; ++k) v += GgufWriter::U32(9) + GgufWriter::U64(1);
  v += GgufWriter::U32(4) + GgufWriter::U64(0);
  w.AddRaw("deep", 9, v);
  ExpectError(OpenBytes(w.Build()), absl::StatusCode::kInvalidArgument, "nests arrays");
}

TEST(GgufFileTest, TensorOffsetOutsideFile) {
  const size_t at = Built().tensor_offset_offsets[1];
  ExpectPatchedError({U64At(at, 1ull << 20)}, absl::StatusCode::kDataLoss, "b.weight");
  // Aligned, overflows offset+size.
  ExpectPatchedError({U64At(at, ~0ull - 31)}, absl::StatusCode::kDataLoss, "b.weight");
  ExpectPatchedError({U64At(at, 33)}, absl::StatusCode::kInvalidArgument, "alignment");
}

TEST(GgufFileTest, TooManyDims) {
  ExpectPatchedError({U32At(Built().tensor_ndims_offsets[0], 5)},
                     absl::StatusCode::kInvalidArgument, "n_dims 5");
}

TEST(GgufFileTest, DimsOverflow) {
  const size_t at = Built().tensor_ndims_offsets[0];
  ExpectPatchedError({U64At(at + 4, 1ull << 40), U64At(at + 12, 1ull << 40)},
                     absl::StatusCode::kInvalidArgument, "overflow");
  // Negative as int64.
  ExpectPatchedError({U64At(at + 4, ~0ull)}, absl::StatusCode::kInvalidArgument, "a.weight");
  // Large but non-overflowing dims: the data would lie outside the file.
  ExpectPatchedError({U64At(at + 4, 1ull << 30)}, absl::StatusCode::kDataLoss, "a.weight");
}

TEST(GgufFileTest, UnknownAndUnsupportedGgmlType) {
  const GgufWriter& w = Built();
  ExpectPatchedError({U32At(w.tensor_type_offsets[0], 200)}, absl::StatusCode::kInvalidArgument,
                     "unknown ggml type 200");
  ExpectPatchedError({U32At(w.tensor_type_offsets[1], 16)}, absl::StatusCode::kUnimplemented,
                     "tensor b.weight has ggml type IQ2_XXS (16), which PolyKV does not support");
  // Row length not a multiple of the block size: a.weight as Q8_0 (row of 4).
  ExpectPatchedError({U32At(w.tensor_type_offsets[0], 8)}, absl::StatusCode::kInvalidArgument,
                     "block size");
}

TEST(GgufFileTest, BadAlignment) {
  GgufWriter w = ValidWriter();
  w.AddU32("general.alignment", 3);
  ExpectError(OpenBytes(w.Build(3, 32)), absl::StatusCode::kInvalidArgument, "power of two");
  GgufWriter ok = ValidWriter();
  ok.AddU32("general.alignment", 64);
  auto f = OpenBytes(ok.Build(3, 64));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->FindTensor("b.weight")->offset % 64, 0u);
}

TEST(GgufFileTest, DuplicateKeyAndTensor) {
  GgufWriter w = ValidWriter();
  w.AddU32("llama.block_count", 3);
  ExpectError(OpenBytes(w.Build()), absl::StatusCode::kInvalidArgument, "duplicate");
  GgufWriter t = ValidWriter();
  t.AddTensor("a.weight", {1}, 0, F32Bytes({1}));
  ExpectError(OpenBytes(t.Build()), absl::StatusCode::kInvalidArgument, "duplicate tensor");
}

// Deterministic random corruption (1-4 bytes overwritten per file): Open either fails with a
// clean status or yields tensors whose data lies inside the file and dequantizes.
TEST(GgufFileTest, RandomCorruptionIsCleanOrConsistent) {
  const std::string valid = ValidWriter().Build();
  std::string path = WriteTempFile("fuzz.gguf", valid);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  int opened = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string b = valid;
    const int flips = 1 + static_cast<int>(next() % 4);
    for (int k = 0; k < flips; ++k) {
      b[next() % b.size()] = static_cast<char>(next() & 0xff);
    }
    WriteTempFile("fuzz.gguf", b);
    auto f = GgufFile::Open(path);
    if (!f.ok()) {
      ++rejected;
      auto code = f.status().code();
      ASSERT_TRUE(code == absl::StatusCode::kDataLoss ||
                  code == absl::StatusCode::kInvalidArgument ||
                  code == absl::StatusCode::kUnimplemented)
          << f.status();
      continue;
    }
    ++opened;
    for (const GgufTensorInfo& t : (*f)->tensors()) {
      auto d = (*f)->TensorData(t);
      ASSERT_EQ(d.size(), t.nbytes) << t.name;
      ASSERT_LE(t.offset + t.nbytes, b.size()) << t.name;
      if (t.elements() <= (1 << 16) && (t.type == 0 || t.type == 8)) {
        std::vector<float> out(static_cast<size_t>(t.elements()));
        EXPECT_TRUE(DequantizeToF32(t.type, d.data(), d.size(), t.elements(), out.data()).ok());
      }
    }
  }
  EXPECT_GT(opened, 0);  // flips inside tensor data leave the file valid
  EXPECT_GT(rejected, 0);
}

// ---------------------------------------------------------------------------------------
// DequantizeToF32 on hand-built blocks.

TEST(GgufDequantizeTest, GgmlTypeBytesAndNames) {
  EXPECT_EQ(*GgmlTypeBytes(0, 10), 40u);
  EXPECT_EQ(*GgmlTypeBytes(1, 10), 20u);
  EXPECT_EQ(*GgmlTypeBytes(2, 64), 36u);
  EXPECT_EQ(*GgmlTypeBytes(3, 64), 40u);
  EXPECT_EQ(*GgmlTypeBytes(6, 32), 22u);
  EXPECT_EQ(*GgmlTypeBytes(7, 32), 24u);
  EXPECT_EQ(*GgmlTypeBytes(8, 96), 102u);
  EXPECT_EQ(*GgmlTypeBytes(12, 512), 288u);
  EXPECT_EQ(*GgmlTypeBytes(13, 256), 176u);
  EXPECT_EQ(*GgmlTypeBytes(14, 256), 210u);
  EXPECT_EQ(*GgmlTypeBytes(30, 3), 6u);
  EXPECT_EQ(GgmlTypeBytes(8, 33).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GgmlTypeBytes(16, 256).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(GgmlTypeName(3), "Q4_1");
  EXPECT_EQ(GgmlTypeName(16), "IQ2_XXS");
  EXPECT_EQ(GgmlTypeName(250), "type 250");
}

TEST(GgufDequantizeTest, F16AndBF16) {
  const uint16_t h[] = {0x3C00, 0xC000, 0x0001, 0x7C00, 0x3555, 0x0000, 0x8000, 0x03FF};
  float out[8];
  ASSERT_TRUE(DequantizeToF32(1, reinterpret_cast<const uint8_t*>(h), 16, 8, out).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(out[3], std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[4], 0.333251953125f);
  EXPECT_EQ(out[5], 0.0f);
  EXPECT_TRUE(std::signbit(out[6]));
  EXPECT_EQ(out[7], 1023.0f * std::ldexp(1.0f, -24));
  const uint16_t bf[] = {0x3F80, 0xC040, 0x4049};
  ASSERT_TRUE(DequantizeToF32(30, reinterpret_cast<const uint8_t*>(bf), 6, 3, out).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -3.0f);
  EXPECT_EQ(out[2], 3.140625f);
}

TEST(GgufDequantizeTest, Q4_0) {
  std::string b(18, '\0');
  PutU16(&b, 0, 0x3800);  // d = 0.5
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<char>(j | ((15 - j) << 4));
  float y[32];
  ASSERT_TRUE(DequantizeToF32(2, reinterpret_cast<const uint8_t*>(b.data()), 18, 32, y).ok());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * (j - 8)) << j;
    EXPECT_EQ(y[j + 16], 0.5f * (7 - j)) << j;
  }
}

TEST(GgufDequantizeTest, Q4_1) {
  std::string b(20, '\0');
  PutU16(&b, 0, 0x3400);  // d = 0.25
  PutU16(&b, 2, 0xBC00);  // m = -1
  for (int j = 0; j < 16; ++j) b[4 + j] = static_cast<char>(j | ((15 - j) << 4));
  float y[32];
  ASSERT_TRUE(DequantizeToF32(3, reinterpret_cast<const uint8_t*>(b.data()), 20, 32, y).ok());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.25f * j - 1.0f) << j;
    EXPECT_EQ(y[j + 16], 0.25f * (15 - j) - 1.0f) << j;
  }
  // Known literal values.
  EXPECT_EQ(y[0], -1.0f);
  EXPECT_EQ(y[15], 2.75f);
  EXPECT_EQ(y[16], 2.75f);
}

TEST(GgufDequantizeTest, Q5_0AndQ5_1) {
  // qh bit i is the 5th bit of value i (values 0..15 from low nibbles, 16..31 from high).
  const uint32_t qh = 0xF0F0A5A5u;
  std::string b0(22, '\0');
  PutU16(&b0, 0, 0x3C00);  // d = 1
  PutU32(&b0, 2, qh);
  for (int j = 0; j < 16; ++j) b0[6 + j] = static_cast<char>(j | ((15 - j) << 4));
  float y[32];
  ASSERT_TRUE(DequantizeToF32(6, reinterpret_cast<const uint8_t*>(b0.data()), 22, 32, y).ok());
  for (int i = 0; i < 32; ++i) {
    int nib = i < 16 ? i : 15 - (i - 16);
    int q = nib + (((qh >> i) & 1) ? 16 : 0);
    EXPECT_EQ(y[i], static_cast<float>(q - 16)) << i;
  }
  EXPECT_EQ(y[0], 0.0f);    // nibble 0, bit 0 set -> 16 - 16
  EXPECT_EQ(y[1], -15.0f);  // nibble 1, bit 1 clear
  std::string b1(24, '\0');
  PutU16(&b1, 0, 0x4000);  // d = 2
  PutU16(&b1, 2, 0x3800);  // m = 0.5
  PutU32(&b1, 4, qh);
  for (int j = 0; j < 16; ++j) b1[8 + j] = static_cast<char>(j | ((15 - j) << 4));
  ASSERT_TRUE(DequantizeToF32(7, reinterpret_cast<const uint8_t*>(b1.data()), 24, 32, y).ok());
  for (int i = 0; i < 32; ++i) {
    int nib = i < 16 ? i : 15 - (i - 16);
    int q = nib + (((qh >> i) & 1) ? 16 : 0);
    EXPECT_EQ(y[i], 2.0f * q + 0.5f) << i;
  }
  EXPECT_EQ(y[31], 2.0f * (0 + 16) + 0.5f);  // bit 31 set, nibble 0
}

TEST(GgufDequantizeTest, Q8_0) {
  std::string b = Q8Block();
  PutU16(&b, 0, 0x4000);  // d = 2
  float y[32];
  ASSERT_TRUE(DequantizeToF32(8, reinterpret_cast<const uint8_t*>(b.data()), 34, 32, y).ok());
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 2.0f * (j - 16)) << j;
}

// K-quant 6-bit scales/mins: sub-blocks 0..3 in the low 6 bits of bytes 0..3 / 4..7;
// 4..7 in the nibbles of bytes 8..11 plus the top 2 bits of bytes 0..3 / 4..7.
void KScales(uint8_t* s, const int sc[8], const int mn[8]) {
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
}

// A Q4_K / Q5_K super-block of `bytes` zero bytes with its header set: f16 `d` and `dmin`,
// then the 6-bit scales `sc` and mins `mn` (KScales).
std::string KBlock(size_t bytes, uint16_t d, uint16_t dmin, const int sc[8], const int mn[8]) {
  std::string b(bytes, '\0');
  PutU16(&b, 0, d);
  PutU16(&b, 2, dmin);
  KScales(reinterpret_cast<uint8_t*>(&b[4]), sc, mn);
  return b;
}

// Dequantizes the K-quant super-block `b` (ggml type `type`, 256 values) and expects value i
// to be d * sc[s] * q - dmin * mn[s], s = i / 32 its sub-block and q its 4-bit quant from the
// 128 bytes at `qs` (sub-blocks 2k and 2k + 1 share 32 bytes: low, then high nibbles), plus
// 16 times bit s of byte i % 32 at `qh` when `qh` >= 0 (Q5_K's fifth bit).
void ExpectKQuant(uint32_t type, const std::string& b, float d, float dmin, const int sc[8],
                  const int mn[8], int qs, int qh) {
  float y[256];
  ASSERT_TRUE(
      DequantizeToF32(type, reinterpret_cast<const uint8_t*>(b.data()), b.size(), 256, y).ok());
  for (int i = 0; i < 256; ++i) {
    int s = i / 32, l = i % 32;
    uint8_t byte = static_cast<uint8_t>(b[qs + (s / 2) * 32 + l]);
    int q = (s % 2 == 0) ? (byte & 15) : (byte >> 4);
    if (qh >= 0) q += ((static_cast<uint8_t>(b[qh + l]) >> s) & 1) * 16;
    EXPECT_EQ(y[i], d * sc[s] * q - dmin * mn[s]) << i;
  }
}

TEST(GgufDequantizeTest, Q4_K) {
  const int sc[8] = {1, 2, 63, 4, 17, 33, 6, 50};
  const int mn[8] = {5, 0, 7, 8, 40, 1, 63, 2};
  std::string b = KBlock(144, 0x3C00, 0x3800, sc, mn);  // d = 1, dmin = 0.5
  for (int i = 0; i < 128; ++i) b[16 + i] = static_cast<char>((i * 7) & 0xff);
  ExpectKQuant(12, b, 1.0f, 0.5f, sc, mn, /*qs=*/16, /*qh=*/-1);
}

TEST(GgufDequantizeTest, Q5_K) {
  const int sc[8] = {3, 9, 27, 60, 16, 32, 48, 1};
  const int mn[8] = {0, 1, 2, 3, 20, 40, 60, 17};
  std::string b = KBlock(176, 0x3800, 0x3400, sc, mn);  // d = 0.5, dmin = 0.25
  for (int l = 0; l < 32; ++l) b[16 + l] = static_cast<char>((l * 37 + 11) & 0xff);  // qh
  for (int i = 0; i < 128; ++i) b[48 + i] = static_cast<char>((i * 13 + 5) & 0xff);  // qs
  ExpectKQuant(13, b, 0.5f, 0.25f, sc, mn, /*qs=*/48, /*qh=*/16);
}

TEST(GgufDequantizeTest, Q6_K) {
  std::string b(210, '\0');
  for (int i = 0; i < 128; ++i) b[i] = static_cast<char>((i * 29 + 3) & 0xff);       // ql
  for (int i = 0; i < 64; ++i) b[128 + i] = static_cast<char>((i * 53 + 7) & 0xff);  // qh
  const int8_t scales[16] = {1, -2, 3, -4, 5, -6, 7, -8, 127, -128, 10, 20, -30, 40, 50, 60};
  std::memcpy(&b[192], scales, 16);
  PutU16(&b, 208, 0x3400);  // d = 0.25
  float y[256];
  ASSERT_TRUE(DequantizeToF32(14, reinterpret_cast<const uint8_t*>(b.data()), 210, 256, y).ok());
  for (int i = 0; i < 256; ++i) {
    int half = i / 128, r = i % 128, g = r / 32, l = r % 32;
    uint8_t lo_byte = static_cast<uint8_t>(b[half * 64 + l + (g & 1) * 32]);
    int lo = g < 2 ? (lo_byte & 15) : (lo_byte >> 4);
    int hi = (static_cast<uint8_t>(b[128 + half * 32 + l]) >> (2 * g)) & 3;
    int q = (lo | (hi << 4)) - 32;
    int s = scales[half * 8 + l / 16 + 2 * g];
    EXPECT_EQ(y[i], 0.25f * static_cast<float>(s * q)) << i;
  }
}

TEST(GgufDequantizeTest, Errors) {
  std::string b(64, '\0');
  float y[256];
  auto p = reinterpret_cast<const uint8_t*>(b.data());
  Status s = DequantizeToF32(10, p, 64, 256, y);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("Q2_K"), std::string::npos) << s;
  EXPECT_EQ(DequantizeToF32(8, p, 33, 32, y).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeToF32(8, p, 64, 31, y).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeToF32(0, p, 15, 4, y).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeToF32(99, p, 64, 4, y).code(), absl::StatusCode::kUnimplemented);
}

// The real SmolLM2 file: its types are exactly F32, Q4_1, Q8_0 and every tensor dequantizes
// to finite values; RMSNorm weights are plain F32 and must round-trip byte-exactly.
TEST(GgufSmolLm2Test, AllTensorsDequantize) {
  const char* path = std::getenv("POLYKV_SMOLLM2_GGUF");
  if (path == nullptr || *path == '\0') GTEST_SKIP() << "POLYKV_SMOLLM2_GGUF is not set";
  auto f = GgufFile::Open(path);
  if (f.status().code() == absl::StatusCode::kNotFound) GTEST_SKIP() << f.status();
  ASSERT_TRUE(f.ok()) << f.status();
  std::set<uint32_t> types;
  int64_t total = 0;
  for (const GgufTensorInfo& t : (*f)->tensors()) {
    types.insert(t.type);
    std::vector<float> out(static_cast<size_t>(t.elements()));
    auto d = (*f)->TensorData(t);
    ASSERT_TRUE(DequantizeToF32(t.type, d.data(), d.size(), t.elements(), out.data()).ok())
        << t.name;
    for (float v : out) ASSERT_TRUE(std::isfinite(v)) << t.name;
    total += t.elements();
  }
  EXPECT_EQ(types, (std::set<uint32_t>{0, 3, 8}));
  EXPECT_EQ((*f)->tensors().size(), 272u);
  EXPECT_EQ(total, 134515008);  // SmolLM2-135M parameter count (tied embeddings)
  const GgufTensorInfo* emb = (*f)->FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dims, (std::vector<int64_t>{576, 49152}));
}

}  // namespace
}  // namespace polykv::model
