// The shared test support library: files (read, write, replace, copy, TempDir removal) and
// child processes (exit codes, captured output, extra environment, timeouts, signals), and the
// memfd leak check (descriptors and mappings of any process).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "support/files.h"
#include "support/leaks.h"
#include "support/process.h"
#include "support/wait.h"

namespace polykv::support {
namespace {

const std::string kSh = "/bin/sh";

std::vector<std::string> Sh(const std::string& script) { return {kSh, "-c", script}; }

TEST(TestSupportFiles, WriteReadReplaceAndCopy) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string a = dir.File("a.bin");
  const std::string bytes("zero\0byte\n", 10);
  ASSERT_TRUE(WriteFile(a, bytes).ok());
  EXPECT_EQ(ReadFile(a), bytes);
  EXPECT_TRUE(FileContains(a, "byte"));
  EXPECT_FALSE(FileContains(a, "absent"));
  ASSERT_TRUE(WriteFile(a, "short").ok());  // truncates
  EXPECT_EQ(ReadFile(a), "short");
  ASSERT_TRUE(ReplaceFile(a, "replaced").ok());
  EXPECT_EQ(ReadFile(a), "replaced");
  EXPECT_FALSE(Exists(a + ".tmp"));

  const std::string b = dir.File("b.bin");
  ASSERT_TRUE(CopyFile(a, b, 0751).ok());
  EXPECT_EQ(ReadFile(b), "replaced");
  struct stat st;
  ASSERT_EQ(stat(b.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0751u);
  EXPECT_EQ(CopyFile(dir.File("missing"), b).code(), absl::StatusCode::kNotFound);

  EXPECT_EQ(ReadFile(dir.File("missing")), "");
  EXPECT_FALSE(Exists(dir.File("missing")));
  EXPECT_EQ(WriteFile(dir.File("no/such/dir/x"), "x").code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(SelfExe().empty());
  EXPECT_TRUE(Exists(SelfExe()));
}

TEST(TestSupportFiles, TempDirIsPrivateAndRemovedWithItsContents) {
  std::string path;
  {
    TempDir dir("polykv-support-");
    ASSERT_TRUE(dir.ok());
    path = dir.path();
    EXPECT_EQ(path.rfind("/tmp/polykv-support-", 0), 0u) << path;
    struct stat st;
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    ASSERT_EQ(mkdir(dir.File("sub").c_str(), 0755), 0);
    ASSERT_TRUE(WriteFile(dir.File("sub/f"), "x").ok());
    TempDir moved = std::move(dir);
    EXPECT_EQ(moved.path(), path);
    EXPECT_FALSE(dir.ok());  // NOLINT(bugprone-use-after-move): moved-from is empty
  }
  EXPECT_FALSE(Exists(path));
  TempDir a, b;
  EXPECT_NE(a.path(), b.path());
}

TEST(TestSupportProcess, RunCapturesExitCodeAndBothStreams) {
  RunResult r = RunProcess(Sh("echo to-out; echo to-err >&2; exit 3"));
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.term_signal, 0);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.out, "to-out\n");
  EXPECT_EQ(r.err, "to-err\n");

  TempDir dir;
  r = RunProcess(Sh("printf ok"), dir.path(), 10000);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "ok");
}

TEST(TestSupportProcess, RunAddsEnvironmentWithoutChangingOurs) {
  ASSERT_EQ(std::getenv("POLYKV_SUPPORT_PROBE"), nullptr);
  setenv("POLYKV_SUPPORT_KEEP", "parent", 1);
  RunResult r = RunProcess(Sh("echo \"$POLYKV_SUPPORT_PROBE/$POLYKV_SUPPORT_KEEP/$HOME_SET\""), "",
                           10000, {"POLYKV_SUPPORT_PROBE=child", "HOME_SET=1"});
  EXPECT_EQ(r.out, "child/parent/1\n");
  r = RunProcess(Sh("echo \"$POLYKV_SUPPORT_KEEP\""), "", 10000, {"POLYKV_SUPPORT_KEEP=replaced"});
  EXPECT_EQ(r.out, "replaced\n");
  EXPECT_EQ(std::getenv("POLYKV_SUPPORT_PROBE"), nullptr);
  EXPECT_STREQ(std::getenv("POLYKV_SUPPORT_KEEP"), "parent");
  unsetenv("POLYKV_SUPPORT_KEEP");
}

TEST(TestSupportProcess, RunKillsACommandPastItsTimeout) {
  const auto t0 = std::chrono::steady_clock::now();
  RunResult r = RunProcess(Sh("echo started; exec sleep 30"), "", 300);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.term_signal, SIGKILL);
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
  EXPECT_EQ(r.out, "started\n");
  EXPECT_LT(s, 10.0);
}

TEST(TestSupportProcess, RunReportsACommandThatCannotStart) {
  RunResult r = RunProcess({"/nonexistent/polykv-binary"});
  EXPECT_EQ(r.exit_code, -1);
  EXPECT_NE(r.err.find("/nonexistent/polykv-binary"), std::string::npos) << r.err;
  EXPECT_EQ(Spawn({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Spawn({"/nonexistent/polykv-binary"}).status().code(), absl::StatusCode::kNotFound);
}

TEST(TestSupportProcess, SpawnAppendsOrSharesOneFileForBothStreams) {
  TempDir dir;
  const std::string log = dir.File("log");
  SpawnOptions o;
  o.stdout_path = log;
  o.stderr_path = log;
  auto pid = Spawn(Sh("echo one; echo two >&2"), o);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(WaitExit(*pid, 10000), 0);
  EXPECT_EQ(ReadFile(log), "one\ntwo\n");
  o.append = true;
  pid = Spawn(Sh("echo three"), o);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(WaitExit(*pid, 10000), 0);
  EXPECT_EQ(ReadFile(log), "one\ntwo\nthree\n");
  o.append = false;
  pid = Spawn(Sh("echo four"), o);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(WaitExit(*pid, 10000), 0);
  EXPECT_EQ(ReadFile(log), "four\n");
}

TEST(TestSupportProcess, WaitExitKillsOnTimeoutAndDecodesSignals) {
  auto pid = Spawn({"/bin/sleep", "30"});
  ASSERT_TRUE(pid.ok()) << pid.status();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(WaitExit(*pid, 200), -1);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_NE(kill(*pid, 0), 0) << "killed and reaped: the pid is gone";
  EXPECT_EQ(WaitExit(*pid, 200), -1) << "already reaped";

  pid = Spawn({"/bin/sleep", "30"});
  ASSERT_TRUE(pid.ok());
  ASSERT_EQ(kill(*pid, SIGTERM), 0);
  EXPECT_EQ(WaitExit(*pid, 10000), 128 + SIGTERM);
  pid = Spawn(Sh("exit 7"));
  ASSERT_TRUE(pid.ok());
  EXPECT_EQ(WaitExit(*pid, -1), 7);
}

TEST(TestSupportProcess, ProcessWaitsSignalsStopsAndCleansUp) {
  TempDir dir;
  Process p;
  EXPECT_FALSE(p.running());
  EXPECT_TRUE(p.Wait(0)) << "nothing to wait for";
  ASSERT_TRUE(p.Start(Sh("echo ready; exec sleep 30"), dir.File("out"), dir.File("err")).ok());
  EXPECT_TRUE(p.running());
  EXPECT_EQ(p.Start(Sh("true")).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(WaitFor([&] { return p.out() == "ready\n"; }, 10000));
  EXPECT_FALSE(p.Wait(100));
  EXPECT_EQ(p.exit_code(), -1);
  EXPECT_TRUE(p.Kill(SIGTERM));
  EXPECT_TRUE(p.Wait(10000));
  EXPECT_FALSE(p.running());
  EXPECT_EQ(p.exit_code(), 128 + SIGTERM);
  EXPECT_EQ(p.term_signal(), SIGTERM);
  EXPECT_FALSE(p.Kill(SIGTERM)) << "no child left";

  // Stop: a child that ignores SIGTERM is killed after the grace period (-1).
  ASSERT_TRUE(p.Start(Sh("trap '' TERM; echo armed; while :; do sleep 1; done"), dir.File("out"),
                      dir.File("err"))
                  .ok());
  EXPECT_TRUE(WaitFor([&] { return p.out() == "armed\n"; }, 10000));
  EXPECT_EQ(p.Stop(300), -1);
  EXPECT_EQ(p.term_signal(), SIGKILL);
  // One that honours SIGTERM gives its exit code.
  ASSERT_TRUE(p.Start(Sh("trap 'exit 5' TERM; echo armed; while :; do sleep 1; done"),
                      dir.File("out"), dir.File("err"))
                  .ok());
  EXPECT_TRUE(WaitFor([&] { return p.out() == "armed\n"; }, 10000));
  EXPECT_EQ(p.Stop(10000), 5);
  EXPECT_EQ(p.Stop(10000), 5) << "already ended: its exit code again";

  // The destructor kills and reaps a child that still runs; a moved-to object owns it.
  pid_t pid = -1;
  {
    Process q;
    ASSERT_TRUE(q.Start({"/bin/sleep", "30"}).ok());
    Process owner = std::move(q);
    EXPECT_FALSE(q.running());  // NOLINT(bugprone-use-after-move)
    pid = owner.pid();
    EXPECT_EQ(kill(pid, 0), 0);
  }
  EXPECT_NE(kill(pid, 0), 0) << "reaped, not a zombie";
}

TEST(TestSupportWait, WaitForPollsUntilTheConditionHolds) {
  int calls = 0;
  EXPECT_TRUE(WaitFor([&] { return ++calls >= 3; }, 10000, 1));
  EXPECT_EQ(calls, 3);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(WaitFor([] { return false; }, 100));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(100));
  EXPECT_GE(TimeoutScale(), 1);
}

// The leak check sees a memfd as a descriptor and as a mapping, in this process and in
// another one (a child that inherited the descriptor), and nothing once all are gone.
TEST(TestSupportLeaks, MemfdUsesFindsDescriptorsAndMappingsOfAnyProcess) {
  const std::string prefix = "/polykv-leak" + std::to_string(getpid()) + "-";
  EXPECT_TRUE(MemfdUses(prefix).empty());
  const int fd = memfd_create((prefix.substr(1) + "0123abcd").c_str(), 0);  // inherited
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  std::vector<MemfdUse> uses = MemfdUses(prefix);
  ASSERT_EQ(uses.size(), 1u) << DescribeMemfdUses(uses);
  EXPECT_EQ(uses[0].pid, getpid());
  EXPECT_EQ(uses[0].where, "fd " + std::to_string(fd));
  EXPECT_EQ(uses[0].name, "memfd:" + prefix.substr(1) + "0123abcd");
  void* map = mmap(nullptr, 8192, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(map, MAP_FAILED);
  Process child;
  ASSERT_TRUE(child.Start({"/bin/sleep", "30"}).ok());
  ASSERT_TRUE(WaitFor([&] { return MemfdUses(prefix, child.pid()).size() == 1; }, 5000))
      << DescribeMemfdUses(MemfdUses(prefix));
  close(fd);
  uses = MemfdUses(prefix, getpid());
  ASSERT_EQ(uses.size(), 1u) << DescribeMemfdUses(uses);
  EXPECT_EQ(uses[0].where.rfind("map ", 0), 0u) << uses[0].where;
  EXPECT_EQ(MemfdUses(prefix).size(), 2u) << "the mapping here, the descriptor in the child";
  child.Kill(SIGKILL);
  child.Wait(5000);
  munmap(map, 8192);
  uses = MemfdUsesSettled(prefix, 5000);
  EXPECT_TRUE(uses.empty()) << DescribeMemfdUses(uses);
  EXPECT_EQ(DescribeMemfdUses({}), "none");
}

}  // namespace
}  // namespace polykv::support
