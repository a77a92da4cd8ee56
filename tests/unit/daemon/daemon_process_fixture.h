// A gtest fixture for tests that run polykvd as a separate process: a temporary folder with
// the endpoint, a private shared-memory prefix cleaned before and after, the daemon's log
// (printed when the test failed) and every spawned process SIGKILLed at the end.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "daemon_fixture.h"
#include "process_util.h"
#include "test_util.h"

namespace polykv::daemon::testing {

class DaemonProcessFixture : public ShmPrefixTest {
 protected:
  /// `tag` keeps the shared-memory prefixes of different test binaries apart.
  explicit DaemonProcessFixture(const std::string& tag) : ShmPrefixTest(tag) {}
  void SetUp() override {
    ShmPrefixTest::SetUp();
    log_ = dir_.path() + "/polykvd.log";
    ASSERT_TRUE(Exists(DaemonBinary())) << DaemonBinary();
  }
  void TearDown() override {
    for (pid_t p : pids_) {
      if (kill(p, 0) == 0) {
        kill(p, SIGKILL);
        waitpid(p, nullptr, 0);
      }
    }
    ShmPrefixTest::TearDown();
    if (HasFailure()) std::cerr << "--- polykvd log ---\n" << ReadFile(log_);
  }
  /// polykvd's arguments: this test's endpoint and prefix, host backend, 1 thread, debug log.
  std::vector<std::string> Args(std::vector<std::string> extra = {}) {
    std::vector<std::string> a = {
        DaemonBinary(), "--endpoint", dir_.endpoint(), "--backend", "host", "--shm-prefix", prefix_,
        "--threads",    "1",          "--log-level",   "debug"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  TempDir dir_;
  std::string log_;
  std::vector<pid_t> pids_;
};

}  // namespace polykv::daemon::testing
