// Chaos: seeded cycles of SIGKILL at a random point of a create, of attaches, of an agent's
// decode or of an agent's generation, the victim being the daemon or the agent; each kill is
// followed by a restart (of the daemon) or a check that the daemon carried on. After every
// cycle: no segment under /dev/shm, a restarted daemon binds over the stale socket, every
// client process ended (none stuck past its timeout), and every pool is either fully
// visible (attaches and verifies) or absent. $POLYKV_CHAOS_CYCLES (default 50) and
// $POLYKV_CHAOS_SEED (default 16) reproduce a run.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>

#include "fault_util.h"
#include "polykv/ipc/pool_layout.h"

namespace polykv::fault {
namespace {

using Clock = std::chrono::steady_clock;

std::string CliBinary() { return daemon::testing::CliBinary(); }
std::string Stories() { return daemon::testing::Stories260K(); }

std::string Ids(std::mt19937_64& rng, int n) {
  std::string s = "1";
  for (int i = 1; i < n; ++i) s += "," + std::to_string(3 + rng() % 500);
  return s;
}

// Every listed pool attaches and verifies (fully visible); returns how many there are.
int CheckPoolsWhole(const std::string& endpoint) {
  RawClient c(endpoint);
  auto l = c.List();
  EXPECT_TRUE(l.ok() && l->ok);
  if (!l.ok() || !l->ok) return -1;
  for (const auto& p : l->pools) {
    auto a = c.Attach(p.id);
    EXPECT_TRUE(a.ok() && a->ok) << p.id;
    if (!a.ok() || !a->ok) continue;
    auto region = daemon::testing::MapPool(a->memory->fd_socket, a->lease_id);
    EXPECT_TRUE(region.ok()) << region.status();
    if (region.ok()) {
      auto reader = ipc::PoolReader::Open(region->data(), region->size(), true);
      EXPECT_TRUE(reader.ok()) << p.id << ": " << reader.status();
    }
    (void)c.Detach(a->lease_id);
  }
  return static_cast<int>(l->pools.size());
}

TEST(Chaos, SeededSigkillCyclesLeaveNothingBehind) {
  const int cycles = EnvInt("POLYKV_CHAOS_CYCLES", 50);
  const uint64_t seed = static_cast<uint64_t>(EnvInt("POLYKV_CHAOS_SEED", 16));
  std::printf("chaos: %d cycles, seed %llu\n", cycles, static_cast<unsigned long long>(seed));
  TempDir dir;
  DaemonProc d(dir, {"--lease-seconds", "2", "--create-workers", "2"});
  ASSERT_TRUE(d.Start()) << ReadFile(d.log());
  const char* kPhases[] = {"create", "attach", "decode", "generate"};
  std::map<std::string, int> tally;
  double worst_exit_ms = 0;
  for (int cycle = 0; cycle < cycles; ++cycle) {
    std::mt19937_64 rng(seed * 1000003 + cycle);
    const std::string phase = kPhases[rng() % 4];
    const bool kill_daemon = phase == "create" || phase == "attach" || rng() % 2 == 0;
    // Somewhere inside the workload: an agent process takes ~1 s to load its model and
    // generate, the others a few hundred ms.
    const int delay_ms = static_cast<int>(rng() % (phase == "generate" ? 1500 : 400));
    if (d.pid() <= 0) {
      ASSERT_TRUE(d.Start()) << "cycle " << cycle << ": restart\n" << ReadFile(d.log());
    }
    // A pool to work on (created fresh after a restart).
    std::string pool;
    if (phase != "create") {
      RawClient c(dir.endpoint());
      auto r = c.Call(daemon::testing::CreateRequest("k8v3", cycle % 3), 60000);
      ASSERT_TRUE(r.ok() && r->ok) << "cycle " << cycle;
      pool = r->pool->id;
    }
    // The workload.
    std::vector<pid_t> work;
    const std::string out = dir.path() + "/c" + std::to_string(cycle);
    if (phase == "create") {
      work.push_back(Spawn({CliBinary(), "pools", "create", "--endpoint", dir.endpoint(), "--model",
                            Stories(), "--token-ids", Ids(rng, 64)},
                           out + ".err", out + ".out"));
    } else if (phase == "attach" || phase == "decode") {
      const int n = phase == "attach" ? 4 : 1;
      for (int i = 0; i < n; ++i) {
        work.push_back(
            Spawn({FaultClient(), dir.endpoint(), pool, "--loops", "0", "--timeout-ms", "1000"},
                  out + "-" + std::to_string(i) + ".err", out + "-" + std::to_string(i) + ".out"));
      }
    } else {
      work.push_back(
          Spawn({CliBinary(), "agent", "--pool", pool, "--model", Stories(), "--endpoint",
                 dir.endpoint(), "--prompt-ids", Ids(rng, 8), "--max-new-tokens", "48",
                 "--ignore-eos", "--threads", "1", "--timeout-ms", "1000"},
                out + ".err", out + ".out"));
    }
    for (pid_t p : work) ASSERT_GT(p, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    const auto killed_at = Clock::now();
    std::string what;
    if (kill_daemon) {
      ASSERT_EQ(d.Kill(SIGKILL), 128 + SIGKILL);
      what = "daemon";
    } else {
      kill(work[0], SIGKILL);
      what = "agent";
    }
    // No client stuck: each ends on its own (the killed one at once); bounded wait, the
    // longest path being a lease that runs out locally (2 s) plus a failing detach.
    std::string codes;
    for (pid_t p : work) {
      const int rc = WaitExit(p, 30000);
      EXPECT_NE(rc, -1) << "cycle " << cycle << " (" << phase << ", " << what
                        << " killed): a client was still running 30 s later";
      codes += (codes.empty() ? "" : ",") + std::to_string(rc);
    }
    const double exit_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - killed_at).count();
    worst_exit_ms = std::max(worst_exit_ms, exit_ms);
    // After the kill: with the daemon and every client gone, no process holds or maps a pool.
    if (kill_daemon) {
      EXPECT_EQ(daemon::testing::PoolMemoryLeft(d.prefix()), "none") << "cycle " << cycle;
      ASSERT_TRUE(d.Start()) << "cycle " << cycle << ": restart over the stale socket\n"
                             << ReadFile(d.log());
      EXPECT_EQ(CheckPoolsWhole(dir.endpoint()), 0) << "a restarted daemon has no pools";
    } else {
      EXPECT_GE(CheckPoolsWhole(dir.endpoint()), 1) << "cycle " << cycle;
      // The dead agent's lease runs out and is swept.
      RawClient c(dir.endpoint());
      const bool freed = WaitFor(
          [&] {
            ipc::Request stats;
            stats.type = ipc::MessageType::kStats;
            stats.pool_id = pool;
            auto s = c.Call(stats, 2000);
            return s.ok() && s->ok && s->pool && s->pool->leases == 0;
          },
          15000);
      EXPECT_TRUE(freed) << "cycle " << cycle << ": the killed agent's lease was not released";
    }
    ++tally[phase + " / " + what + " killed"];
    std::printf(
        "cycle %2d: %-8s kill %-6s after %3d ms; client exits %s; all ended %.0f ms after "
        "the kill\n",
        cycle, phase.c_str(), what.c_str(), delay_ms, codes.c_str(), exit_ms);
    std::fflush(stdout);
    if (HasFatalFailure()) return;
  }
  std::printf("\nchaos summary (seed %llu):\n", static_cast<unsigned long long>(seed));
  for (const auto& [k, v] : tally) std::printf("  %2d x %s\n", v, k.c_str());
  std::printf("  longest time from a kill until every client had ended: %.0f ms\n", worst_exit_ms);
  EXPECT_EQ(d.Kill(SIGTERM), 0);
  EXPECT_EQ(daemon::testing::PoolMemoryLeft(d.prefix()), "none");
  EXPECT_FALSE(Exists(dir.socket()));
  EXPECT_FALSE(Exists(dir.socket() + ".fds"));
}

}  // namespace
}  // namespace polykv::fault
