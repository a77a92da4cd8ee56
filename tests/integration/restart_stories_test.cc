// polykvd restarts with --state-dir (stories260K, multi-process): after SIGTERM and after
// SIGKILL, the restored pool is byte-identical to the one the first daemon built (its sealed
// memfd as agents map it, and the pool file's region), and agent processes give identical
// answers, token for token, before and after, with the pool restored lazily or by --preload.
// Restored pools are sealed memfds like freshly built ones: no POSIX shm object appears.
#include <gtest/gtest.h>
#include <signal.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness.h"

namespace polykv::testing {
namespace {

using nlohmann::json;

std::vector<int32_t> Document() {
  std::vector<int32_t> ids = {1};
  for (int i = 1; i < 120; ++i) ids.push_back((i * 53 + 7) % 500 + 3);
  return ids;
}

std::vector<int32_t> Answer(const Daemon& d, const std::string& pool,
                            const std::vector<int32_t>& prompt) {
  ProcessResult r =
      RunProcess({CliPath(), "agent", "--pool", pool, "--model", StoriesPath(), "--endpoint",
                  d.endpoint(), "--prompt-ids", JoinIds(prompt), "--max-new-tokens", "32",
                  "--ignore-eos", "--json", "--threads", "1"},
                 d.dir(), 120000);
  return AgentAnswerIds(r);
}

// Checksum64 of the region inside a pool file (the bytes after the 4096-aligned prelude).
uint64_t FileRegionDigest(const std::string& path, uint64_t region_bytes) {
  std::string bytes = ReadFile(path);
  if (bytes.size() < region_bytes) return 0;
  return ipc::Checksum64(bytes.data() + bytes.size() - region_bytes, region_bytes);
}

TEST(RestartStories, PoolBytesAndAnswersSurviveRestarts) {
  if (!fs::exists(DaemonPath()) || !fs::exists(CliPath())) GTEST_SKIP() << "not built";
  TempDir state;
  const std::vector<std::string> flags = {"--state-dir", state.path()};
  const std::vector<std::vector<int32_t>> prompts = {{1, 45, 99, 210}, {1, 7, 300, 12, 8}};
  std::string none_pool, k8_pool;
  uint64_t none_digest = 0, k8_digest = 0, k8_bytes = 0;
  std::vector<std::vector<int32_t>> answers;
  {
    Daemon d(30, flags);
    ASSERT_TRUE(d.ready()) << d.log();
    std::string err;
    none_pool = d.CreatePool(StoriesPath(), Document(), "none", &err);
    ASSERT_FALSE(none_pool.empty()) << err;
    k8_pool = d.CreatePool(StoriesPath(), Document(), "k8v3", &err);
    ASSERT_FALSE(k8_pool.empty()) << err;
    none_digest = PoolDigest(d.endpoint(), none_pool);
    k8_digest = PoolDigest(d.endpoint(), k8_pool);
    k8_bytes = d.Info(k8_pool).total_bytes;
    ASSERT_NE(none_digest, 0u);
    for (const auto& pool : {none_pool, k8_pool}) {
      for (const auto& p : prompts) {
        answers.push_back(Answer(d, pool, p));
        ASSERT_EQ(answers.back().size(), 32u);
      }
    }
    EXPECT_EQ(d.Stop(), 0) << d.log();
  }
  const std::string k8_file = state.path() + "/pools/" + k8_pool + ".pkv";
  EXPECT_EQ(FileRegionDigest(k8_file, k8_bytes), k8_digest);

  // Restart after SIGTERM: lazy restore on the agents' attach.
  {
    Daemon d(30, flags);
    ASSERT_TRUE(d.ready()) << d.log();
    EXPECT_EQ(d.Info(k8_pool).id[0], '\0') << "lazy: not published before use";
    size_t i = 0;
    for (const auto& pool : {none_pool, k8_pool}) {
      for (const auto& p : prompts) EXPECT_EQ(Answer(d, pool, p), answers[i++]) << pool;
    }
    EXPECT_EQ(PoolDigest(d.endpoint(), none_pool), none_digest);
    EXPECT_EQ(PoolDigest(d.endpoint(), k8_pool), k8_digest);
    EXPECT_FALSE(fs::exists(ShmPath(k8_pool))) << "restored as a sealed memfd, not shm";
    EXPECT_FALSE(fs::exists(ShmPath(none_pool))) << "restored as a sealed memfd, not shm";
    // A crash: SIGKILL leaves the state folder as it was.
    d.process().Kill(SIGKILL);
    d.process().Wait(10000);
  }
  // Restart after SIGKILL with --preload: published before any request.
  {
    std::vector<std::string> preload = flags;
    preload.push_back("--preload");
    Daemon d(30, preload);
    ASSERT_TRUE(d.ready()) << d.log();
    EXPECT_STREQ(d.Info(k8_pool).id, k8_pool.c_str()) << "published before any attach";
    EXPECT_STREQ(d.Info(none_pool).id, none_pool.c_str()) << "published before any attach";
    EXPECT_EQ(PoolDigest(d.endpoint(), none_pool), none_digest);
    EXPECT_EQ(PoolDigest(d.endpoint(), k8_pool), k8_digest);
    size_t i = 0;
    for (const auto& pool : {none_pool, k8_pool}) {
      for (const auto& p : prompts) EXPECT_EQ(Answer(d, pool, p), answers[i++]) << pool;
    }
    // Evicting removes the file: the next daemon does not bring it back.
    EXPECT_EQ(d.Evict(k8_pool, false), POLYKV_OK);
    EXPECT_FALSE(fs::exists(k8_file));
    EXPECT_EQ(d.Stop(), 0) << d.log();
  }
}

}  // namespace
}  // namespace polykv::testing
