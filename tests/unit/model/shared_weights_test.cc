// Two processes load the same GGUF with the mapped runtime and compute with it: the weight
// pages are the page cache's, mapped by both (PSS well below RSS; private memory holds no
// weights). And malformed model files (truncated, a tensor past the end) give clear errors,
// never a read past the mapping.
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "model_test_util.h"
#include "polykv/model/llama.h"

extern char** environ;

namespace polykv::model {
namespace {

using testing::SmolLM2Path;

namespace fs = std::filesystem;

struct Rollup {
  double rss = 0, pss = 0, priv = 0;  // bytes
};

Rollup ReadRollup() {
  Rollup r;
  std::ifstream in("/proc/self/smaps_rollup");
  std::string line;
  auto field = [&](const char* key, double* out) {
    const std::string k(key);
    if (line.compare(0, k.size(), k) == 0) *out += std::atof(line.c_str() + k.size()) * 1024;
  };
  while (std::getline(in, line)) {
    field("Rss:", &r.rss);
    field("Pss:", &r.pss);
    field("Private_Clean:", &r.priv);
    field("Private_Dirty:", &r.priv);
  }
  return r;
}

// The child: load mapped, touch every weight with one forward, wait for the release file
// (both processes hold their mappings), report its smaps_rollup, wait until both reported.
TEST(SharedWeights, DISABLED_Child) {
  const char* dir = std::getenv("POLYKV_SHARED_WEIGHTS_DIR");
  const char* id = std::getenv("POLYKV_SHARED_WEIGHTS_ID");
  ASSERT_TRUE(dir != nullptr && id != nullptr);
  LoadOptions o;
  o.threads = 1;
  o.weights = WeightStorage::kMapped;
  auto m = LlamaModel::Load(SmolLM2Path(), o);
  ASSERT_TRUE(m.ok()) << m.status();
  KvCache c = (*m)->NewCache(4);
  const int32_t ids[2] = {1, 2};
  ASSERT_TRUE((*m)->Forward(absl::MakeConstSpan(ids, 2), c, false).ok());
  { std::ofstream(std::string(dir) + "/ready." + id) << "1"; }
  const std::string release = std::string(dir) + "/release";
  for (int i = 0; i < 1200 && !fs::exists(release); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const Rollup r = ReadRollup();
  {
    std::ofstream out(std::string(dir) + "/report." + id + ".tmp");
    out << r.rss << " " << r.pss << " " << r.priv;
  }
  fs::rename(std::string(dir) + "/report." + id + ".tmp", std::string(dir) + "/report." + id);
  // Stay alive (mapped) until both have measured.
  const std::string done = std::string(dir) + "/done";
  for (int i = 0; i < 1200 && !fs::exists(done); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

TEST(SharedWeights, TwoProcessesShareTheWeightPages) {
  if (SmolLM2Path().empty()) GTEST_SKIP() << "POLYKV_SMOLLM2_GGUF is not set";
  const fs::path dir = fs::temp_directory_path() / ("polykv-shared-" + std::to_string(getpid()));
  fs::create_directories(dir);
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  ASSERT_GT(len, 0);
  self[len] = '\0';
  std::vector<pid_t> kids;
  for (const char* id : {"a", "b"}) {
    setenv("POLYKV_SHARED_WEIGHTS_DIR", dir.c_str(), 1);
    setenv("POLYKV_SHARED_WEIGHTS_ID", id, 1);
    std::vector<std::string> args = {self, "--gtest_filter=SharedWeights.DISABLED_Child",
                                     "--gtest_also_run_disabled_tests"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    ASSERT_EQ(posix_spawn(&pid, self, nullptr, nullptr, argv.data(), environ), 0);
    kids.push_back(pid);
  }
  for (int i = 0; i < 2400 && !(fs::exists(dir / "ready.a") && fs::exists(dir / "ready.b")); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::ofstream(dir / "release") << "1";
  for (int i = 0; i < 2400 && !(fs::exists(dir / "report.a") && fs::exists(dir / "report.b")); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::ofstream(dir / "done") << "1";
  for (pid_t p : kids) {
    int st = 0;
    waitpid(p, &st, 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  const double weights = static_cast<double>(fs::file_size(SmolLM2Path()));
  for (const char* id : {"a", "b"}) {
    std::ifstream in(dir / (std::string("report.") + id));
    Rollup r;
    ASSERT_TRUE(in >> r.rss >> r.pss >> r.priv) << "child " << id << " reported nothing";
    std::printf("child %s: RSS %.1f MiB, PSS %.1f MiB, private %.1f MiB (model file %.1f MiB)\n",
                id, r.rss / 1048576, r.pss / 1048576, r.priv / 1048576, weights / 1048576);
    // Each child touched every weight page: they are in its RSS, but shared by two
    // processes, so they count half in its PSS and nothing in its private memory.
    EXPECT_GT(r.rss - r.pss, 0.4 * weights) << "weight pages not shared";
    EXPECT_LT(r.priv, r.rss - 0.8 * weights) << "private memory holds weights";
  }
  fs::remove_all(dir);
}

std::string ReadAll(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(SharedWeights, TruncatedGgufIsAClearError) {
  if (SmolLM2Path().empty()) GTEST_SKIP() << "POLYKV_SMOLLM2_GGUF is not set";
  const std::string full = ReadAll(SmolLM2Path());
  const fs::path dir = fs::temp_directory_path() / ("polykv-trunc-" + std::to_string(getpid()));
  fs::create_directories(dir);
  // Cut inside the tensor data, inside the tensor table, and inside the header.
  for (size_t keep : {full.size() - 1, full.size() / 2, size_t{600000}, size_t{100}}) {
    const fs::path p = dir / ("cut" + std::to_string(keep) + ".gguf");
    std::ofstream(p, std::ios::binary).write(full.data(), static_cast<std::streamsize>(keep));
    for (WeightStorage w : {WeightStorage::kMapped, WeightStorage::kCopy}) {
      LoadOptions o;
      o.weights = w;
      auto m = LlamaModel::Load(p.string(), o);
      ASSERT_FALSE(m.ok()) << keep << " bytes loaded";
      EXPECT_TRUE(m.status().code() == absl::StatusCode::kDataLoss ||
                  m.status().code() == absl::StatusCode::kInvalidArgument)
          << m.status();
      std::printf("%zu of %zu bytes (%s): %s\n", keep, full.size(), WeightStorageName(w),
                  std::string(m.status().message()).c_str());
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace polykv::model
