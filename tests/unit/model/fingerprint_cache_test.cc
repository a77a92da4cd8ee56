// The model fingerprint cache (llama_internal.h Sha256OfFiles): a hit returns the digest of the
// files as they are; a file changed in place (ctime) or replaced (inode) is hashed again; "0"
// turns the cache off. On a copy of stories260K in a temporary folder.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model_test_util.h"
#include "polykv/model/llama.h"
#include "support/files.h"

namespace polykv::model {
namespace {

namespace fs = std::filesystem;
using testing::LoadModel;

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path().string());
  return out;
}

std::string FingerprintOf(const std::string& path) {
  auto m = LoadModel(path, 1);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? (*m)->fingerprint() : std::string();
}

class FingerprintCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    model_ = dir_.path() + "/stories260K";
    fs::copy(POLYKV_TEST_DATA_DIR "/models/stories260K", model_);
    cache_ = dir_.path() + "/cache";
    ASSERT_EQ(setenv("POLYKV_FINGERPRINT_CACHE", "0", 1), 0);
    uncached_ = FingerprintOf(model_);  // hashed, nothing written
    ASSERT_EQ(uncached_.size(), 64u);
    ASSERT_EQ(setenv("POLYKV_FINGERPRINT_CACHE", cache_.c_str(), 1), 0);
  }
  void TearDown() override { unsetenv("POLYKV_FINGERPRINT_CACHE"); }

  // Rewrites byte `offset` from the end of the weights file in place (same size and inode).
  void FlipByteInPlace(std::streamoff offset) {
    std::fstream f(model_ + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f);
    f.seekg(-offset, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    f.seekp(-offset, std::ios::end);
    c = static_cast<char>(c ^ 0x01);
    f.write(&c, 1);
  }

  support::TempDir dir_;
  std::string model_, cache_, uncached_;
};

TEST_F(FingerprintCacheTest, OffWritesNothingAndAHitEqualsTheHash) {
  EXPECT_FALSE(fs::exists(cache_)) << "POLYKV_FINGERPRINT_CACHE=0 writes no cache";
  EXPECT_EQ(FingerprintOf(model_), uncached_);  // miss: hashed and remembered
  const std::vector<std::string> entries = Entries(cache_);
  ASSERT_EQ(entries.size(), 1u);
  std::ifstream in(entries[0]);
  std::string stored;
  in >> stored;
  EXPECT_EQ(stored, uncached_);
  EXPECT_EQ(FingerprintOf(model_), uncached_);  // hit
  EXPECT_EQ(Entries(cache_).size(), 1u);
}

TEST_F(FingerprintCacheTest, AFileChangedInPlaceIsHashedAgain) {
  ASSERT_EQ(FingerprintOf(model_), uncached_);
  FlipByteInPlace(1);
  const std::string changed = FingerprintOf(model_);
  EXPECT_NE(changed, uncached_) << "a stale digest was returned for changed weights";
  ASSERT_EQ(setenv("POLYKV_FINGERPRINT_CACHE", "0", 1), 0);
  EXPECT_EQ(FingerprintOf(model_), changed) << "the recomputed digest is the file's";
  EXPECT_EQ(Entries(cache_).size(), 2u) << "one entry per state of the files";
}

TEST_F(FingerprintCacheTest, AReplacedFileIsHashedAgain) {
  ASSERT_EQ(FingerprintOf(model_), uncached_);
  // Replace the weights atomically with a changed copy (new inode), as the README advises.
  const std::string w = model_ + "/model.safetensors";
  fs::copy_file(w, w + ".new");
  {
    std::fstream f(w + ".new", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-2, std::ios::end);
    f.put('\x7f');
  }
  fs::rename(w + ".new", w);
  const std::string replaced = FingerprintOf(model_);
  EXPECT_NE(replaced, uncached_);
  ASSERT_EQ(setenv("POLYKV_FINGERPRINT_CACHE", "0", 1), 0);
  EXPECT_EQ(FingerprintOf(model_), replaced);
}

TEST_F(FingerprintCacheTest, AnUnreadableOrCorruptEntryIsIgnored) {
  ASSERT_EQ(FingerprintOf(model_), uncached_);
  const std::vector<std::string> entries = Entries(cache_);
  ASSERT_EQ(entries.size(), 1u);
  std::ofstream(entries[0], std::ios::trunc) << "not a digest\n";
  EXPECT_EQ(FingerprintOf(model_), uncached_) << "a corrupt entry is recomputed";
  // A cache folder that cannot be made (a file in its way) is skipped, not an error.
  const std::string blocked = dir_.path() + "/blocked";
  std::ofstream(blocked) << "x";
  ASSERT_EQ(setenv("POLYKV_FINGERPRINT_CACHE", (blocked + "/sub").c_str(), 1), 0);
  EXPECT_EQ(FingerprintOf(model_), uncached_);
}

}  // namespace
}  // namespace polykv::model
