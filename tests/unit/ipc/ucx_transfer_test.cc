// UcxEngine: loopback pulls (sizes, chunking, concurrency, progress), descriptor parsing,
// cancellation, and a holder process SIGKILLed mid-transfer (UCX over TCP).
#include "polykv/ipc/ucx_transfer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/random.h"

extern char** environ;

namespace polykv::ipc {
namespace {

constexpr char kHolderEnv[] = "POLYKV_UCX_TEST_HOLDER_FD";

using support::SplitMix64Bytes;

// Calls `io` (read or write) until all `n` bytes at `c` have moved; false on an error or at
// end of file.
template <typename Io, typename Byte>
bool MoveAll(Io io, int fd, Byte* c, size_t n) {
  while (n > 0) {
    const ssize_t k = io(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool WriteAll(int fd, const void* p, size_t n) {
  return MoveAll(write, fd, static_cast<const char*>(p), n);
}

bool ReadAll(int fd, void* p, size_t n) { return MoveAll(read, fd, static_cast<char*>(p), n); }

constexpr uint64_t kHolderBytes = 32ull << 20;

// The holder role: when the test binary is exec'd with kHolderEnv set (by KilledHolder
// below), expose a region, send its descriptor through the pipe and wait to be killed.
// Runs before main(), so gtest never starts in the holder.
int HolderMainIfRequested() {
  const char* fd_env = std::getenv(kHolderEnv);
  if (fd_env == nullptr) return 0;
  const int fd = std::atoi(fd_env);
  auto engine = UcxEngine::Create();
  if (!engine.ok()) _exit(2);
  static std::vector<uint8_t> region = SplitMix64Bytes(kHolderBytes, 7);
  auto exposure = (*engine)->Expose(region.data(), region.size());
  if (!exposure.ok()) _exit(3);
  const std::string& d = (*exposure)->descriptor();
  const uint32_t len = static_cast<uint32_t>(d.size());
  if (!WriteAll(fd, &len, sizeof(len)) || !WriteAll(fd, d.data(), d.size())) _exit(4);
  close(fd);
  for (;;) pause();
}
[[maybe_unused]] const int kHolderRole = HolderMainIfRequested();

// Sets an environment variable for the scope (UCX reads it at UcxEngine::Create).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = std::string(old);
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::unique_ptr<UcxEngine> MakeEngine() {
  auto e = UcxEngine::Create();
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? *std::move(e) : nullptr;
}

void CheckLoopbackPull(uint64_t bytes, uint64_t chunk, int outstanding) {
  auto holder = MakeEngine();
  auto requester = MakeEngine();
  ASSERT_NE(holder, nullptr);
  ASSERT_NE(requester, nullptr);
  EXPECT_FALSE(holder->transports().empty());
  const std::vector<uint8_t> src = SplitMix64Bytes(bytes, bytes);
  auto exposure = holder->Expose(src.data(), src.size());
  ASSERT_TRUE(exposure.ok()) << exposure.status();
  EXPECT_EQ((*exposure)->size(), bytes);
  std::vector<uint8_t> dst(bytes, 0);
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  UcxPullOptions o;
  o.chunk_bytes = chunk;
  o.max_outstanding = outstanding;
  o.progress = [&](uint64_t done, uint64_t total) { calls.emplace_back(done, total); };
  Status s = requester->Pull((*exposure)->descriptor(), dst.data(), dst.size(), o);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), bytes), 0);
  const uint64_t chunks = (bytes + chunk - 1) / chunk;
  ASSERT_EQ(calls.size(), chunks);
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].second, bytes);
    if (i > 0) {
      EXPECT_GT(calls[i].first, calls[i - 1].first);
    }
  }
  EXPECT_EQ(calls.back(), std::make_pair(bytes, bytes));
}

TEST(UcxTransferTest, LoopbackPullIsBytewiseEqualWithMonotoneProgress) {
  CheckLoopbackPull((37ull << 20) + 123, 1ull << 20, 4);
}

TEST(UcxTransferTest, LoopbackPullOverTcp) {
  ScopedEnv tls("UCX_TLS", "tcp");
  {
    auto e = MakeEngine();
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->transports(), "tcp");  // so the gets below are served by the progress thread
  }
  CheckLoopbackPull((9ull << 20) + 77, 1ull << 20, 4);
}

TEST(UcxTransferTest, ChunkLargerThanRegion) { CheckLoopbackPull(100000, 4ull << 20, 8); }

TEST(UcxTransferTest, RegionSmallerThanOneMinimumChunk) { CheckLoopbackPull(123, 4096, 1); }

TEST(UcxTransferTest, OneOutstandingManyChunks) {
  CheckLoopbackPull((3ull << 20) + 5, 4096 * 7, 1);
}

TEST(UcxTransferTest, ConcurrentPullsFromThreeThreads) {
  auto holder = MakeEngine();
  auto requester = MakeEngine();
  ASSERT_NE(holder, nullptr);
  ASSERT_NE(requester, nullptr);
  const uint64_t bytes = (8ull << 20) + 999;
  const std::vector<uint8_t> src = SplitMix64Bytes(bytes, 3);
  auto exposure = holder->Expose(src.data(), src.size());
  ASSERT_TRUE(exposure.ok()) << exposure.status();
  const std::string desc = (*exposure)->descriptor();
  std::vector<std::vector<uint8_t>> dst(3, std::vector<uint8_t>(bytes, 0));
  std::vector<Status> status(3);
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      UcxPullOptions o;
      o.chunk_bytes = (t + 1) * (256ull << 10);
      o.max_outstanding = 2 + t;
      status[t] = requester->Pull(desc, dst[t].data(), bytes, o);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 3; ++t) {
    ASSERT_TRUE(status[t].ok()) << "thread " << t << ": " << status[t];
    EXPECT_EQ(std::memcmp(src.data(), dst[t].data(), bytes), 0) << "thread " << t;
  }
}

TEST(UcxTransferTest, MalformedDescriptorsAreInvalidArgument) {
  auto holder = MakeEngine();
  auto requester = MakeEngine();
  ASSERT_NE(holder, nullptr);
  ASSERT_NE(requester, nullptr);
  std::vector<uint8_t> src = SplitMix64Bytes(65536, 1);
  std::vector<uint8_t> dst(src.size());
  auto exposure = holder->Expose(src.data(), src.size());
  ASSERT_TRUE(exposure.ok()) << exposure.status();
  const std::string good = (*exposure)->descriptor();
  ASSERT_GT(good.size(), 32u);
  UcxPullOptions o;
  o.stall_timeout_ms = 2000;
  EXPECT_EQ(requester->Pull("", dst.data(), dst.size(), o).code(),
            absl::StatusCode::kInvalidArgument);
  for (size_t n = 1; n < good.size(); ++n) {
    EXPECT_EQ(requester->Pull(good.substr(0, n), dst.data(), dst.size(), o).code(),
              absl::StatusCode::kInvalidArgument)
        << "truncated at " << n;
  }
  std::string bad_magic = good;
  bad_magic[0] ^= 0x5a;
  EXPECT_EQ(requester->Pull(bad_magic, dst.data(), dst.size(), o).code(),
            absl::StatusCode::kInvalidArgument);
  std::string bad_version = good;
  bad_version[4] = 9;
  EXPECT_EQ(requester->Pull(bad_version, dst.data(), dst.size(), o).code(),
            absl::StatusCode::kInvalidArgument);
  std::string long_addr = good;  // worker address length past the end
  long_addr[8] = '\xff';
  long_addr[9] = '\xff';
  long_addr[10] = '\x0f';
  EXPECT_EQ(requester->Pull(long_addr, dst.data(), dst.size(), o).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(requester->Pull(good + "x", dst.data(), dst.size(), o).code(),
            absl::StatusCode::kInvalidArgument);
  Status mismatch = requester->Pull(good, dst.data(), dst.size() - 1, o);
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kInvalidArgument) << mismatch;
  o.chunk_bytes = 100;
  EXPECT_EQ(requester->Pull(good, dst.data(), dst.size(), o).code(),
            absl::StatusCode::kInvalidArgument);
  // The good one still works after all that.
  o.chunk_bytes = 4096;
  ASSERT_TRUE(requester->Pull(good, dst.data(), dst.size(), o).ok());
  EXPECT_EQ(dst, src);
}

TEST(UcxTransferTest, ExposeRejectsNullAndEmpty) {
  auto engine = MakeEngine();
  ASSERT_NE(engine, nullptr);
  char c = 0;
  EXPECT_EQ(engine->Expose(nullptr, 10).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->Expose(&c, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(UcxTransferTest, ExposureMayOutliveItsEngine) {
  auto engine = MakeEngine();
  ASSERT_NE(engine, nullptr);
  std::vector<uint8_t> src(8192, 1);
  auto exposure = engine->Expose(src.data(), src.size());
  ASSERT_TRUE(exposure.ok()) << exposure.status();
  engine.reset();
  EXPECT_EQ((*exposure)->size(), 8192u);
  exposure->reset();
}

TEST(UcxTransferTest, CancelAfterFirstChunk) {
  auto holder = MakeEngine();
  auto requester = MakeEngine();
  ASSERT_NE(holder, nullptr);
  ASSERT_NE(requester, nullptr);
  const uint64_t bytes = 4ull << 20;
  std::vector<uint8_t> src = SplitMix64Bytes(bytes, 5);
  std::vector<uint8_t> dst(bytes);
  auto exposure = holder->Expose(src.data(), src.size());
  ASSERT_TRUE(exposure.ok()) << exposure.status();
  std::atomic<bool> cancel{false};
  int calls = 0;
  UcxPullOptions o;
  o.chunk_bytes = 64 << 10;  // 64 chunks
  o.max_outstanding = 2;
  o.test_chunk_delay_ms = 20;
  o.cancel = &cancel;
  o.progress = [&](uint64_t, uint64_t) {
    ++calls;
    cancel.store(true);
  };
  Status s = requester->Pull((*exposure)->descriptor(), dst.data(), bytes, o);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_GE(calls, 1);
  EXPECT_LE(calls, 2);  // at most the chunks already completed in the same reap
  // The engine still serves pulls afterwards.
  o.cancel = nullptr;
  o.progress = nullptr;
  o.test_chunk_delay_ms = 0;
  ASSERT_TRUE(requester->Pull((*exposure)->descriptor(), dst.data(), bytes, o).ok());
  EXPECT_EQ(dst, src);
}

// A holder process (this binary re-exec'd) receives `signal` in the middle of a slow pull
// (after 4 MiB of 32): SIGKILL (the connection breaks) or SIGSTOP (the peer hangs).
void HolderSignalledMidTransfer(int signal) {
  ScopedEnv tls("UCX_TLS", "tcp");  // the holder inherits it; TCP detects the peer's death
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  // The write end must survive exec: clear its close-on-exec flag.
  ASSERT_EQ(fcntl(fds[1], F_SETFD, 0), 0);
  const std::string fd_var = std::string(kHolderEnv) + "=" + std::to_string(fds[1]);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  envp.push_back(const_cast<char*>(fd_var.c_str()));
  envp.push_back(nullptr);
  char self[] = "/proc/self/exe";
  char* argv[] = {self, nullptr};
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    execve("/proc/self/exe", argv, envp.data());
    _exit(127);
  }
  close(fds[1]);
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } reaper{child};
  uint32_t len = 0;
  ASSERT_TRUE(ReadAll(fds[0], &len, sizeof(len))) << "holder did not start";
  ASSERT_GT(len, 0u);
  ASSERT_LT(len, 1u << 20);
  std::string desc(len, '\0');
  ASSERT_TRUE(ReadAll(fds[0], desc.data(), len));
  close(fds[0]);

  auto requester = MakeEngine();
  ASSERT_NE(requester, nullptr);
  std::vector<uint8_t> dst(kHolderBytes);
  const std::vector<uint8_t> expect = SplitMix64Bytes(kHolderBytes, 7);
  std::atomic<uint64_t> done{0};
  UcxPullOptions o;
  o.chunk_bytes = 256 << 10;  // 128 chunks x 50 ms: several seconds
  o.max_outstanding = 2;
  o.test_chunk_delay_ms = 50;
  o.stall_timeout_ms = 3000;
  o.progress = [&](uint64_t d, uint64_t) { done.store(d); };
  std::chrono::steady_clock::time_point signalled_at = std::chrono::steady_clock::now();
  std::atomic<bool> returned{false};
  std::thread signaller([&] {
    while (done.load() < (4ull << 20) && !returned.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    signalled_at = std::chrono::steady_clock::now();
    kill(child, signal);
  });
  Status s = requester->Pull(desc, dst.data(), dst.size(), o);
  const auto returned_at = std::chrono::steady_clock::now();
  returned.store(true);
  signaller.join();
  EXPECT_TRUE(s.code() == absl::StatusCode::kUnavailable ||
              s.code() == absl::StatusCode::kDeadlineExceeded)
      << s;
  const std::string msg(s.message());
  EXPECT_NE(msg.find(" of " + std::to_string(kHolderBytes) + " bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("after "), std::string::npos) << msg;
  const double secs = std::chrono::duration<double>(returned_at - signalled_at).count();
  EXPECT_LT(secs, 3.0 + 5.0);
  EXPECT_GE(done.load(), 4ull << 20);
  EXPECT_LT(done.load(), kHolderBytes);
  // The prefix that completed before the signal is the holder's bytes (completions may come
  // out of order within the 2 in flight, so check a little less than 4 MiB).
  const uint64_t ok_prefix = 3ull << 20;
  EXPECT_EQ(std::memcmp(dst.data(), expect.data(), ok_prefix), 0);
  std::printf("holder got signal %d after %llu bytes; Pull returned in %.2f s: %s\n", signal,
              static_cast<unsigned long long>(done.load()), secs, s.ToString().c_str());
}

TEST(UcxTransferTest, HolderKilledMidTransfer) { HolderSignalledMidTransfer(SIGKILL); }

TEST(UcxTransferTest, HolderStoppedMidTransferHitsStallTimeout) {
  HolderSignalledMidTransfer(SIGSTOP);
}

}  // namespace
}  // namespace polykv::ipc
