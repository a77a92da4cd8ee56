// gtest fixtures for the daemon tests that run PoolManager or the control server in this
// process: a private shared-memory prefix removed before and after each test, a PoolManager
// on it, and polykvd's control server on a temp-dir endpoint served from a background thread.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "daemon.h"
#include "pool_manager.h"
#include "test_util.h"

namespace polykv::daemon::testing {

/// A test with its own shared-memory prefix "/polykv-<tag><pid>-", cleaned before and after.
class ShmPrefixTest : public ::testing::Test {
 protected:
  /// `tag` keeps the prefixes of different fixtures and test binaries apart.
  explicit ShmPrefixTest(std::string tag) : tag_(std::move(tag)) {}
  void SetUp() override {
    prefix_ = "/polykv-" + tag_ + std::to_string(getpid()) + "-";
    RemoveShmObjects(prefix_);
  }
  void TearDown() override { RemoveShmObjects(prefix_); }

  std::string tag_;
  std::string prefix_;
};

/// A PoolManager on the test's prefix (host memory); destroyed before the prefix is cleaned.
class PoolManagerTestBase : public ShmPrefixTest {
 protected:
  using ShmPrefixTest::ShmPrefixTest;
  void TearDown() override {
    manager_.reset();
    ShmPrefixTest::TearDown();
  }
  /// Replaces the manager with one made from `o`, on host memory and this test's prefix.
  PoolManager& MakeManager(PoolManagerOptions o) {
    o.backend = ipc::PoolMemory::kHost;
    o.shm_prefix = prefix_;
    manager_ = std::make_unique<PoolManager>(std::move(o));
    return *manager_;
  }

  std::unique_ptr<PoolManager> manager_;
};

/// The control server in this process on a temp-dir endpoint, run from a background thread;
/// stopped before the prefix is cleaned.
class InProcessDaemonTest : public ShmPrefixTest {
 protected:
  using ShmPrefixTest::ShmPrefixTest;
  void TearDown() override {
    StopDaemon();
    ShmPrefixTest::TearDown();
  }
  /// Starts the daemon with `o` on this test's endpoint and prefix (host backend, expiry
  /// sweeps every 50 ms) and serves it from a thread.
  void Serve(DaemonOptions o) {
    o.endpoint = dir_.endpoint();
    o.backend = "host";
    o.shm_prefix = prefix_;
    o.sweep_seconds = 0.05;
    auto d = Daemon::Start(o);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    thread_ = std::thread([this] { (void)daemon_->Run(); });
  }
  void StopDaemon() {
    if (daemon_) daemon_->Stop();
    if (thread_.joinable()) thread_.join();
    daemon_.reset();
  }

  TempDir dir_;
  std::unique_ptr<Daemon> daemon_;
  std::thread thread_;
};

}  // namespace polykv::daemon::testing
