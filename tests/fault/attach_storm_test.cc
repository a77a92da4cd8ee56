// Attach storm: 256 agent processes (no model: polykv_fault_client) attach one pool at the
// same moment, verify it, decode every layer and detach. Prints the success count and the
// attach latency p50/p99/max; asserts that every process succeeded and no lease is left.
// $POLYKV_STORM_PROCESSES changes the count.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "fault_util.h"

namespace polykv::fault {
namespace {

TEST(AttachStorm, ManyProcessesAttachOnePoolAtOnce) {
  const int n = EnvInt("POLYKV_STORM_PROCESSES", 256);
  TempDir dir;
  DaemonProc d(dir, {"--lease-seconds", "30"});
  ASSERT_TRUE(d.Start()) << ReadFile(d.log());
  RawClient c(dir.endpoint());
  auto created = c.Call(daemon::testing::CreateRequest("k8v3"), 60000);
  ASSERT_TRUE(created.ok() && created->ok);
  const std::string pool = created->pool->id;

  const std::string go = dir.path() + "/go";
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    const std::string out = dir.path() + "/client-" + std::to_string(i) + ".out";
    pid_t pid =
        Spawn({FaultClient(), dir.endpoint(), pool, "--go-file", go, "--timeout-ms", "30000"},
              out + ".err", out);
    ASSERT_GT(pid, 0);
    pids.push_back(pid);
  }
  std::ofstream(go) << "go\n";  // all of them at once
  int exited = 0, ok = 0;
  std::vector<double> attach_ms, connect_ms;
  std::map<std::string, int> errors;
  for (int i = 0; i < n; ++i) {
    const int rc = WaitExit(pids[i], 300000);
    exited += rc != -1;
    const std::string out = dir.path() + "/client-" + std::to_string(i) + ".out";
    std::string line = ReadFile(out);
    try {
      auto j = nlohmann::json::parse(line);
      if (j.value("ok", false) && rc == 0) {
        ++ok;
        attach_ms.push_back(j.value("attach_ms", 0.0));
        connect_ms.push_back(j.value("connect_ms", 0.0));
      } else {
        ++errors[j.value("code", std::string("?")) + ": " + j.value("error", std::string())];
      }
    } catch (const std::exception&) {
      ++errors["no output (rc " + std::to_string(rc) + "): " + ReadFile(out + ".err")];
    }
  }
  std::printf("\nattach storm: %d processes, %d succeeded\n", n, ok);
  std::printf("| figure | p50 | p99 | max | unit |\n|---|---|---|---|---|\n");
  std::printf("| connect (PING) | %.2f | %.2f | %.2f | ms |\n", Percentile(connect_ms, 50),
              Percentile(connect_ms, 99), Percentile(connect_ms, 100));
  std::printf("| attach (lease + descriptor + map + header) | %.2f | %.2f | %.2f | ms |\n",
              Percentile(attach_ms, 50), Percentile(attach_ms, 99), Percentile(attach_ms, 100));
  for (const auto& [e, count] : errors) std::printf("  %d x %s\n", count, e.c_str());
  std::fflush(stdout);
  EXPECT_EQ(exited, n);
  EXPECT_EQ(ok, n);
  // Everything was given back, and the daemon still serves.
  auto l = c.List();
  ASSERT_TRUE(l.ok() && l->ok);
  ASSERT_EQ(l->pools.size(), 1u);
  EXPECT_EQ(l->pools[0].leases, 0u);
  EXPECT_EQ(d.Kill(SIGTERM), 0);
  EXPECT_EQ(daemon::testing::PoolMemoryLeft(d.prefix()), "none")
      << "a pool still held or mapped after the daemon and all agents ended";
}

}  // namespace
}  // namespace polykv::fault
