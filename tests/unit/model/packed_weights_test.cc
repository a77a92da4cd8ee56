// The packed weights file (model/src/packed_weights.h, LoadOptions::packed_weights) on
// SmolLM2-135M Q4_1: written once into the packed-weights folder (0700 folder, 0600 file),
// mapped again (same inode) by the next load, rewritten when truncated, refused (the model
// runs from the blocks) when others could write it; decode from it gives the logits of the
// blocks within float reassociation and the same greedy tokens. On CPUs without the avx512
// kernels the model must say it reads the blocks, and why.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "model_test_util.h"
#include "polykv/kernels/cpu.h"
#include "polykv/model/llama.h"
#include "support/files.h"

namespace polykv::model {
namespace {

namespace fs = std::filesystem;
using testing::SmolLM2Path;

StatusOr<std::unique_ptr<LlamaModel>> Load(bool packed) {
  LoadOptions o;
  o.threads = 1;
  o.packed_weights = packed;
  return LlamaModel::Load(SmolLM2Path(), o);
}

// Logits of 6 decode steps (one token each, greedy) after a 4-token prompt.
std::vector<float> DecodeLogits(LlamaModel& m, std::vector<int32_t>* greedy) {
  KvCache c = m.NewCache(16);
  std::vector<int32_t> ids = {1, 504, 2343, 314};
  auto l = m.Forward(ids, c, false);
  EXPECT_TRUE(l.ok()) << l.status();
  std::vector<float> out;
  for (int step = 0; step < 6 && l.ok(); ++step) {
    const absl::Span<const float> row = l->row(0);
    const int32_t next =
        static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
    out.insert(out.end(), row.begin(), row.end());
    greedy->push_back(next);
    const int32_t one[1] = {next};
    l = m.Forward(absl::MakeConstSpan(one, 1), c, false);
    EXPECT_TRUE(l.ok()) << l.status();
  }
  return out;
}

std::vector<fs::path> Files(const std::string& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path());
  return out;
}

class PackedWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (SmolLM2Path().empty()) GTEST_SKIP() << "POLYKV_SMOLLM2_GGUF is not set";
    ASSERT_TRUE(tmp_.ok());
    dir_ = tmp_.path() + "/cache/packed";
    ASSERT_EQ(setenv("POLYKV_PACKED_CACHE", dir_.c_str(), 1), 0);
  }
  void TearDown() override { unsetenv("POLYKV_PACKED_CACHE"); }
  support::TempDir tmp_{"polykv-packed-"};
  std::string dir_;
};

TEST_F(PackedWeightsTest, WrittenOnceSharedAndEqualToTheBlocks) {
  auto blocks = Load(false);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  EXPECT_EQ((*blocks)->weights_layout(), "blocks");
  EXPECT_TRUE(Files(dir_).empty()) << "packed_weights = false wrote a file";
  auto packed = Load(true);
  ASSERT_TRUE(packed.ok()) << packed.status();
  if (kernels::BestIsa() != kernels::Isa::kAvx512) {
    EXPECT_EQ((*packed)->weights_layout(), "blocks: the packed kernels need AVX-512 VNNI");
    EXPECT_TRUE(Files(dir_).empty());
    return;
  }
  const std::string layout = (*packed)->weights_layout();
  ASSERT_EQ(layout.rfind("packed: " + dir_ + "/", 0), 0u) << layout;
  const std::vector<fs::path> files = Files(dir_);
  ASSERT_EQ(files.size(), 1u) << "a temporary file was left behind";
  struct stat fst, dst;
  ASSERT_EQ(stat(files[0].c_str(), &fst), 0);
  ASSERT_EQ(stat(dir_.c_str(), &dst), 0);
  EXPECT_EQ(fst.st_mode & 0777, 0600u);
  EXPECT_EQ(dst.st_mode & 0777, 0700u);
  // SmolLM2's Q4_1 layers and Q8_0 lm_head: as many bytes as the matrices (+ page padding).
  EXPECT_GT(fst.st_size, 90 << 20);
  EXPECT_LT(fst.st_size, 100 << 20);

  std::vector<int32_t> g_blocks, g_packed;
  const std::vector<float> a = DecodeLogits(**blocks, &g_blocks);
  const std::vector<float> b = DecodeLogits(**packed, &g_packed);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(g_blocks, g_packed);
  // The same integer block sums; only the f32 operation order differs (I d dxs instead of
  // I (d dxs), 16 rows per vector instead of one row's blocks): ~1e-6 relative per product,
  // grown through 30 layers. Stated tolerance as for the batched kernels
  // (batch_decode_test): 1e-2 absolute on logits of magnitude ~40 (measured 4.3e-3).
  double max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    max_diff = std::max(max_diff, double{std::fabs(a[i] - b[i])});
  std::printf("max |dlogit| packed vs blocks: %.3g\n", max_diff);
  EXPECT_LT(max_diff, 1e-2);

  // A second load maps the same file (not rewritten).
  auto again = Load(true);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->weights_layout(), layout);
  struct stat fst2;
  ASSERT_EQ(stat(files[0].c_str(), &fst2), 0);
  EXPECT_EQ(fst2.st_ino, fst.st_ino);
  EXPECT_EQ(fst2.st_mtim.tv_nsec, fst.st_mtim.tv_nsec);

  // Truncated (a torn copy, a full disk): replaced by a whole new file on the next load.
  ASSERT_EQ(truncate(files[0].c_str(), fst.st_size / 2), 0);
  auto fixed = Load(true);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ((*fixed)->weights_layout(), layout);
  struct stat fst3;
  ASSERT_EQ(stat(files[0].c_str(), &fst3), 0);
  EXPECT_EQ(fst3.st_size, fst.st_size);
  EXPECT_NE(fst3.st_ino, fst.st_ino);
  std::vector<int32_t> g_fixed;
  EXPECT_EQ(DecodeLogits(**fixed, &g_fixed), b);

  // Writable by the group: another user could change the weights under us. The model
  // runs from the blocks and says why.
  ASSERT_EQ(chmod(files[0].c_str(), 0660), 0);
  auto refused = Load(true);
  ASSERT_TRUE(refused.ok()) << refused.status();
  const std::string why = (*refused)->weights_layout();
  EXPECT_NE(why.find("blocks: "), std::string::npos) << why;
  EXPECT_NE(why.find("writable only by it"), std::string::npos) << why;
  std::vector<int32_t> g_refused;
  EXPECT_EQ(DecodeLogits(**refused, &g_refused), a);
}

TEST_F(PackedWeightsTest, ZeroTurnsThemOff) {
  ASSERT_EQ(setenv("POLYKV_PACKED_CACHE", "0", 1), 0);
  auto m = Load(true);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->weights_layout(), "blocks: no packed-weights folder ($POLYKV_PACKED_CACHE)");
  EXPECT_FALSE(fs::exists(dir_));
}

}  // namespace
}  // namespace polykv::model
