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
    EXPECT_STREQ(d.Info(k8_pool).state, "disk") << "lazy: not published before use";
    size_t i = 0;
    for (const auto& pool : {none_pool, k8_pool}) {
      for (const auto& p : prompts) EXPECT_EQ(Answer(d, pool, p), answers[i++]) << pool;
    }
    EXPECT_EQ(PoolDigest(d.endpoint(), none_pool), none_digest);
    EXPECT_EQ(PoolDigest(d.endpoint(), k8_pool), k8_digest);
    for (const auto& pool : {k8_pool, none_pool}) {
      const auto uses = support::MemfdUses(d.shm_prefix() + pool.substr(0, 16), d.process().pid());
      const support::MemfdCounts held = support::CountMemfdUses(uses);
      EXPECT_EQ(held.memfds, 1) << "restored as a sealed memfd of polykvd: "
                                << support::DescribeMemfdUses(uses);
      EXPECT_EQ(held.descriptors, 1) << support::DescribeMemfdUses(uses);
    }
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
    EXPECT_STREQ(d.Info(k8_pool).state, "memory") << "published before any attach";
    EXPECT_STREQ(d.Info(none_pool).state, "memory") << "published before any attach";
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

json CliJson(const Daemon& d, std::vector<std::string> args) {
  std::vector<std::string> argv = {CliPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  for (const char* a : {"--endpoint", d.endpoint().c_str(), "--json"}) argv.push_back(a);
  ProcessResult r = RunProcess(argv, d.dir(), 60000);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (r.exit_code != 0) return json();
  return json::parse(r.out, nullptr, false);
}

const json* Row(const json& list, const std::string& id) {
  if (!list.contains("pools")) return nullptr;
  for (const json& p : list["pools"]) {
    if (p.value("id", "") == id) return &p;
  }
  return nullptr;
}

// Issue 29: right after a restart (SIGTERM or SIGKILL) `pools list` and `pools show` name
// the persisted pools, their state and parent chain, and nothing is restored by looking.
TEST(RestartStories, PoolsListShowsPersistedPoolsRightAfterARestart) {
  if (!fs::exists(DaemonPath()) || !fs::exists(CliPath())) GTEST_SKIP() << "not built";
  TempDir state;
  const std::vector<std::string> flags = {"--state-dir", state.path()};
  std::string root, child;
  {
    Daemon d(30, flags);
    ASSERT_TRUE(d.ready()) << d.log();
    std::string err;
    root = d.CreatePool(StoriesPath(), Document(), "k8v3", &err);
    ASSERT_FALSE(root.empty()) << err;
    child = d.CreatePool(StoriesPath(), {45, 99, 210, 7, 300}, "", &err, "", false, root);
    ASSERT_FALSE(child.empty()) << err;
    EXPECT_EQ(d.Stop(), 0) << d.log();
  }
  for (const bool sigkill_next : {true, false}) {
    Daemon d(30, flags);
    ASSERT_TRUE(d.ready()) << d.log();
    const json list = CliJson(d, {"pools", "list"});
    ASSERT_TRUE(list.contains("pools")) << list.dump();
    EXPECT_EQ(list["pools"].size(), 2u) << list.dump(2);
    const json* r = Row(list, root);
    const json* c = Row(list, child);
    ASSERT_TRUE(r != nullptr && c != nullptr) << list.dump(2);
    EXPECT_EQ((*r)["state"], "disk");
    EXPECT_EQ((*c)["state"], "disk");
    EXPECT_EQ((*c)["parent"], root);
    EXPECT_EQ((*r)["state_detail"], state.path() + "/pools/" + root + ".pkv");
    EXPECT_EQ(list["daemon"]["memory_used"], 0) << "listing restores nothing";
    const json shown = CliJson(d, {"pools", "show", child.substr(0, 12)});
    EXPECT_EQ(shown.value("id", ""), child);
    EXPECT_EQ(shown.value("state", ""), "disk");
    EXPECT_EQ(shown["parent_chain"], json::array({root}));
    ProcessResult human =
        RunProcess({CliPath(), "pools", "list", "--endpoint", d.endpoint()}, d.dir(), 60000);
    EXPECT_NE(human.out.find("└─ " + child), std::string::npos) << human.out;
    EXPECT_NE(human.out.find("0 in memory, 2 on disk only"), std::string::npos) << human.out;
    // Using the child restores the chain; the list then says so.
    ASSERT_EQ(Answer(d, child, {1, 45}).size(), 32u);
    const json after = CliJson(d, {"pools", "list"});
    ASSERT_TRUE(Row(after, root) != nullptr && Row(after, child) != nullptr) << after.dump();
    EXPECT_EQ((*Row(after, root))["state"], "memory");
    EXPECT_EQ((*Row(after, child))["state"], "memory");
    if (sigkill_next) {
      d.process().Kill(SIGKILL);
      d.process().Wait(10000);
    } else {
      EXPECT_EQ(d.Stop(), 0) << d.log();
    }
  }
}

}  // namespace
}  // namespace polykv::testing
