// Pool files: a round trip keeps the region byte for byte; truncated, bit-flipped, renamed
// or foreign files are refused with kDataLoss; other versions with kFailedPrecondition; a
// failed write leaves nothing behind.
#include "polykv/ipc/pool_file.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "absl/strings/escaping.h"
#include "polykv/ipc/pool_layout.h"
#include "pool_test_util.h"
#include "support/files.h"

namespace polykv::ipc {
namespace {

namespace fs = std::filesystem;

using support::ReadFile;

void WriteAll(const std::string& path, const std::string& bytes) {
  ASSERT_TRUE(support::WriteFile(path, bytes).ok()) << path;
}

class PoolFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    dir_ = tmp_.path();
    PoolParams p = testing::TestPoolParams(2, 2, 8, 19);
    p.model_fingerprint = std::string(64, 'b');
    auto layout = ComputePoolLayout(p);
    ASSERT_TRUE(layout.ok());
    region_.assign(layout->total_bytes, 0);
    std::vector<uint8_t> id(32);
    for (int i = 0; i < 32; ++i) id[i] = static_cast<uint8_t>(i * 9 + 1);
    id_ = absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(id.data()), 32));
    std::vector<int32_t> ids(p.tokens);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i * 5 + 2);
    auto w = PoolWriter::Create(region_.data(), region_.size(), p, id, ids);
    ASSERT_TRUE(w.ok()) << w.status();
    std::mt19937 rng(3);
    std::normal_distribution<float> n(0.f, 1.f);
    std::vector<float> k(size_t{p.kv_heads} * p.tokens * p.head_dim), v(k.size());
    for (uint32_t l = 0; l < p.layers; ++l) {
      for (auto& x : k) x = n(rng);
      for (auto& x : v) x = n(rng);
      ASSERT_TRUE(w->WriteLayer(l, k.data(), v.data(), kernels::DType::kF32).ok());
    }
    ASSERT_TRUE(w->Finalize().ok());
    info_.id = id_;
    info_.model = "models/x.gguf";
    info_.model_fingerprint = p.model_fingerprint;
    info_.codec = "k8v3";
    info_.backend = "host";
    info_.tokens = p.tokens;
    info_.layers = p.layers;
    info_.kv_heads = p.kv_heads;
    info_.head_dim = p.head_dim;
    info_.total_bytes = region_.size();
    info_.key_codes = layout->key_codes;
    info_.overhead = layout->overhead;
    info_.effective_ratio = 1.25;
    info_.created_unix_ms = 1234567;
    info_.prefill_ms = 12.5;
    path_ = dir_ + "/" + id_ + ".pkv";
  }
  support::TempDir tmp_{"polykv-pf-"};
  std::string dir_, path_, id_;
  std::vector<uint8_t> region_;
  PoolInfo info_;
};

TEST_F(PoolFileTest, RoundTripKeepsEveryByte) {
  ASSERT_TRUE(WritePoolFile(path_, info_, region_.data(), region_.size()).ok());
  // Only the final file: the temporary one was renamed.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
  auto m = ReadPoolFileManifest(path_);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->file_version, kPoolFileVersion);
  EXPECT_EQ(m->pool_format_version, kPoolFormatVersion);
  EXPECT_EQ(m->info.id, id_);
  EXPECT_EQ(m->info.model, "models/x.gguf");
  EXPECT_EQ(m->info.model_fingerprint, std::string(64, 'b'));
  EXPECT_EQ(m->info.codec, "k8v3");
  EXPECT_EQ(m->info.tokens, 19u);
  EXPECT_EQ(m->info.key_codes, info_.key_codes);
  EXPECT_EQ(m->info.created_unix_ms, 1234567);
  EXPECT_DOUBLE_EQ(m->info.prefill_ms, 12.5);
  EXPECT_DOUBLE_EQ(m->info.effective_ratio, 1.25);
  EXPECT_EQ(m->pool_bytes, region_.size());
  EXPECT_EQ(m->pool_offset % 4096, 0u);
  EXPECT_EQ(m->pool_checksum, Checksum64(region_.data(), region_.size()));
  EXPECT_EQ(fs::file_size(path_), m->pool_offset + m->pool_bytes);
  std::vector<uint8_t> back(region_.size(), 0xCC);
  ASSERT_TRUE(ReadPoolFileInto(path_, *m, back.data(), back.size()).ok());
  EXPECT_EQ(back, region_);
  // Rewriting the same pool replaces the file atomically with the same bytes.
  const std::string first = ReadFile(path_);
  ASSERT_TRUE(WritePoolFile(path_, info_, region_.data(), region_.size()).ok());
  EXPECT_EQ(ReadFile(path_), first);
}

TEST_F(PoolFileTest, TruncatedAndCorruptFilesAreDataLoss) {
  ASSERT_TRUE(WritePoolFile(path_, info_, region_.data(), region_.size()).ok());
  const std::string good = ReadFile(path_);
  auto m = ReadPoolFileManifest(path_);
  ASSERT_TRUE(m.ok());
  std::vector<uint8_t> buf(region_.size());

  WriteAll(path_, good.substr(0, good.size() - 1));  // truncated by one byte
  auto t = ReadPoolFileManifest(path_);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(t.status().message()).find("truncated"), std::string::npos);
  EXPECT_EQ(ReadPoolFileInto(path_, *m, buf.data(), buf.size()).code(),
            absl::StatusCode::kDataLoss);
  WriteAll(path_, good.substr(0, 30));
  EXPECT_EQ(ReadPoolFileManifest(path_).status().code(), absl::StatusCode::kDataLoss);

  std::string flipped = good;
  flipped[m->pool_offset + m->pool_bytes - 3] ^= 0x10;  // a payload byte
  WriteAll(path_, flipped);
  ASSERT_TRUE(ReadPoolFileManifest(path_).ok());  // the manifest is intact
  Status s = ReadPoolFileInto(path_, *m, buf.data(), buf.size());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(s.message()).find("checksum"), std::string::npos) << s;

  std::string manifest_flip = good;
  manifest_flip[kPoolFilePrelude + 5] ^= 0x01;
  WriteAll(path_, manifest_flip);
  EXPECT_EQ(ReadPoolFileManifest(path_).status().code(), absl::StatusCode::kDataLoss);

  std::string magic = good;
  magic[0] = 'X';
  WriteAll(path_, magic);
  EXPECT_EQ(ReadPoolFileManifest(path_).status().code(), absl::StatusCode::kDataLoss);

  std::string version = good;
  version[8] = 9;  // file_version 9
  WriteAll(path_, version);
  auto v = ReadPoolFileManifest(path_);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(v.status().message()).find("version 9"), std::string::npos);

  EXPECT_EQ(ReadPoolFileManifest(dir_ + "/absent.pkv").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadPoolFileInto(path_, *m, buf.data(), buf.size() - 1).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(PoolFileTest, WriteRefusesForeignRegionsAndLeavesNothing) {
  PoolInfo other = info_;
  other.id = std::string(64, 'f');
  Status s = WritePoolFile(path_, other, region_.data(), region_.size());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> junk(8192, 7);
  EXPECT_FALSE(WritePoolFile(path_, info_, junk.data(), junk.size()).ok());
  EXPECT_FALSE(
      WritePoolFile(dir_ + "/no/such/dir/x.pkv", info_, region_.data(), region_.size()).ok());
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 0);
}

}  // namespace
}  // namespace polykv::ipc
