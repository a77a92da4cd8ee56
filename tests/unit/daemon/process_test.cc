// polykvd as a separate process: create/list over the wire, SIGTERM (exit 0, files and
// segments gone), a second daemon refusing a live endpoint, SIGKILL + restart cleaning the
// stale socket and segments, and a client under another uid (setpriv) being refused.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "daemon_process_fixture.h"
#include "process_util.h"
#include "test_util.h"

namespace polykv::daemon {
namespace {

using testing::CreateRequest;
using testing::RawClient;
using testing::ShmObjects;
using testing::TempDir;

using testing::DaemonBinary;
using testing::Exists;
using testing::ReadFile;
using testing::Spawn;
using testing::WaitExit;

class ProcessTest : public testing::DaemonProcessFixture {
 protected:
  ProcessTest() : DaemonProcessFixture("pt") {}
  // Starts polykvd and waits until it answers PING.
  pid_t StartDaemon(std::vector<std::string> extra = {}) {
    pid_t pid = Spawn(Args(std::move(extra)), log_);
    EXPECT_GT(pid, 0);
    pids_.push_back(pid);
    for (int i = 0; i < 200 * testing::TimeoutScale(); ++i) {
      if (Exists(dir_.socket())) {
        RawClient c(dir_.endpoint());
        auto p = c.Ping(500);
        if (p.ok()) return pid;
      }
      int status;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        ADD_FAILURE() << "polykvd exited early";
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "polykvd did not answer PING";
    return pid;
  }
};

TEST_F(ProcessTest, ServesAndExitsCleanlyOnSigterm) {
  pid_t pid = StartDaemon();
  ASSERT_GT(pid, 0);
  RawClient c(dir_.endpoint());
  auto pong = c.Ping();
  ASSERT_TRUE(pong.ok() && pong->ok);
  EXPECT_EQ(pong->daemon_pid, static_cast<uint32_t>(pid));
  auto r = c.Call(CreateRequest("k8v3"), 60000);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->ok) << r->error;
  auto l = c.List();
  ASSERT_TRUE(l.ok() && l->ok);
  ASSERT_EQ(l->pools.size(), 1u);
  {
    const auto held = support::CountMemfdUses(support::MemfdUses(prefix_, pid));
    EXPECT_EQ(held.memfds, 1) << "the pool is a memfd held by polykvd: "
                              << testing::PoolMemoryLeft(prefix_, 0);
    EXPECT_EQ(held.descriptors, 1) << testing::PoolMemoryLeft(prefix_, 0);
  }
  EXPECT_TRUE(Exists(dir_.socket() + ".fds"));
  struct stat st;
  ASSERT_EQ(stat(dir_.socket().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);

  ASSERT_EQ(kill(pid, SIGTERM), 0);
  EXPECT_EQ(WaitExit(pid, 20000), 0);
  EXPECT_FALSE(Exists(dir_.socket()));
  EXPECT_FALSE(Exists(dir_.socket() + ".pid"));
  EXPECT_FALSE(Exists(dir_.socket() + ".fds"));
  EXPECT_EQ(testing::PoolMemoryLeft(prefix_), "none") << "no process holds a pool";
}

TEST_F(ProcessTest, SecondDaemonOnLiveEndpointRefuses) {
  pid_t first = StartDaemon();
  ASSERT_GT(first, 0);
  const std::string log2 = dir_.path() + "/second.log";
  pid_t second = Spawn(Args(), log2);
  ASSERT_GT(second, 0);
  EXPECT_EQ(WaitExit(second, 20000), 1);
  EXPECT_NE(ReadFile(log2).find("another polykvd"), std::string::npos) << ReadFile(log2);
  RawClient c(dir_.endpoint());
  auto pong = c.Ping();
  ASSERT_TRUE(pong.ok());
  EXPECT_EQ(pong->daemon_pid, static_cast<uint32_t>(first));
}

TEST_F(ProcessTest, RestartAfterSigkillCleansStaleSocketAndSegments) {
  pid_t pid = StartDaemon();
  ASSERT_GT(pid, 0);
  {
    RawClient c(dir_.endpoint());
    auto r = c.Call(CreateRequest("none"), 60000);
    ASSERT_TRUE(r.ok() && r->ok);
  }
  EXPECT_EQ(support::CountMemfdUses(support::MemfdUses(prefix_, pid)).memfds, 1);
  EXPECT_EQ(support::CountMemfdUses(support::MemfdUses(prefix_, pid)).descriptors, 1);
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  // Leftovers of the dead daemon: its socket files, but no pool memory (the memfds went
  // with the process).
  EXPECT_TRUE(Exists(dir_.socket()));
  EXPECT_EQ(testing::PoolMemoryLeft(prefix_), "none");
  EXPECT_TRUE(ShmObjects(prefix_).empty());

  pid_t again = StartDaemon();
  ASSERT_GT(again, 0);
  RawClient c(dir_.endpoint());
  auto l = c.List();
  ASSERT_TRUE(l.ok() && l->ok);
  EXPECT_TRUE(l->pools.empty());
  auto r = c.Call(CreateRequest("none"), 60000);
  ASSERT_TRUE(r.ok() && r->ok) << r->error;
  EXPECT_TRUE(r->created);
  kill(again, SIGTERM);
  EXPECT_EQ(WaitExit(again, 20000), 0);
  EXPECT_EQ(testing::PoolMemoryLeft(prefix_), "none");
}

TEST_F(ProcessTest, BadFlagsExitNonZero) {
  pid_t pid = Spawn(Args({"--memory-cap", "12Q"}), log_);
  ASSERT_GT(pid, 0);
  EXPECT_NE(WaitExit(pid, 10000), 0);
  EXPECT_NE(ReadFile(log_).find("memory-cap"), std::string::npos) << ReadFile(log_);
}

// Runs as the child under another uid (see OtherUidIsRefused).
TEST(UidChild, DISABLED_PingIsRefused) {
  const char* ep = std::getenv("POLYKV_TEST_CHILD_ENDPOINT");
  ASSERT_NE(ep, nullptr);
  RawClient c(ep);
  auto r = c.Ping(5000);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->ok);
  EXPECT_EQ(r->code, "PERMISSION_DENIED") << r->error;
  EXPECT_NE(r->error.find("uid " + std::to_string(getuid())), std::string::npos) << r->error;
}

TEST_F(ProcessTest, OtherUidIsRefused) {
  if (getuid() != 0) GTEST_SKIP() << "needs root to run a client as uid 65534 (setpriv)";
  if (!Exists("/usr/bin/setpriv")) GTEST_SKIP() << "setpriv not installed";
  // The client (this test binary, as nobody) must reach the socket: open dir and mode 0666.
  chmod(dir_.path().c_str(), 0777);
  pid_t pid = StartDaemon({"--socket-mode", "0666"});
  ASSERT_GT(pid, 0);
  // The binary must be reachable by uid 65534; copy it to the temp dir.
  const std::string copy = dir_.path() + "/uid_child";
  ASSERT_TRUE(support::CopyFile(support::SelfExe(), copy, 0755).ok());
  const std::string child_log = dir_.path() + "/child.log";
  pid_t child =
      Spawn({"/usr/bin/setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", copy,
             "--gtest_also_run_disabled_tests", "--gtest_filter=UidChild.DISABLED_PingIsRefused"},
            child_log, "/dev/null", {"POLYKV_TEST_CHILD_ENDPOINT=" + dir_.endpoint()});
  ASSERT_GT(child, 0);
  int rc = WaitExit(child, 30000);
  EXPECT_EQ(rc, 0) << ReadFile(child_log);
  EXPECT_NE(ReadFile(log_).find("refused request from uid 65534"), std::string::npos)
      << ReadFile(log_);
  // Root (allowed by default) is still served.
  RawClient c(dir_.endpoint());
  auto pong = c.Ping();
  ASSERT_TRUE(pong.ok());
  EXPECT_TRUE(pong->ok);
}

}  // namespace
}  // namespace polykv::daemon
