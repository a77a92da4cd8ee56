// libpolykv_client's attached pools against a scripted fake daemon: attach of a real pool
// (sealed memfd, legacy POSIX shm; read-only mapping, bit-exact decode), an unsealed memfd
// refused, lease renewal, eviction and local expiry, the C++ wrapper.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fake_daemon.h"
#include "polykv/client.h"
#include "polykv/client.hpp"
#include "polykv/ipc/pool_layout.h"
#include "polykv/ipc/protocol.h"
#include "polykv/ipc/sealed_region.h"
#include "polykv/ipc/shm_region.h"
#include "support/pool_info.h"

namespace polykv::client {
namespace {

using support::TestPoolInfo;
using testing::FakeDaemon;
using Clock = std::chrono::steady_clock;

// ---- D7: the client maps only sealed pool memory ------------------------------------------

/// Answers "PKVFD1 <lease>" on a SOCK_SEQPACKET socket with a descriptor of the test's choice.
class FakeFdServer {
 public:
  explicit FakeFdServer(int fd) : fd_(fd) {
    path_ = "/tmp/polykv-client-test-fds-" + std::to_string(getpid()) + ".sock";
    ::unlink(path_.c_str());
    listen_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(bind(listen_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(listen_, 8), 0);
    thread_ = std::thread([this] {
      int c = accept(listen_, nullptr, nullptr);
      if (c < 0) return;
      auto msg = ipc::RecvWithFd(c, 256, 5000);
      if (msg.ok()) request_ = msg->first;
      (void)ipc::SendWithFd(c, "OK", fd_);
      ::close(c);
    });
  }
  ~FakeFdServer() {
    ::shutdown(listen_, SHUT_RDWR);
    ::close(listen_);
    thread_.join();
    ::unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }
  std::string request() const { return request_; }

 private:
  int fd_;
  int listen_ = -1;
  std::string path_, request_;
  std::thread thread_;
};

/// A real pool in POSIX shm (codec none or k8v3) served by a fake daemon with leases.
class FakePoolTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kLayers = 2, kHeads = 2, kDim = 8;
  static constexpr uint64_t kTokens = 5;

  /// `memfd`: the pool lives in a memfd announced as transport "memfd" (sealed or not).
  void MakePool(ipc::PoolCodec codec, bool memfd = false, bool seal = true) {
    ipc::PoolParams params;
    params.layers = kLayers;
    params.kv_heads = kHeads;
    params.head_dim = kDim;
    params.tokens = kTokens;
    params.codec = codec;
    params.raw_dtype = kernels::DType::kF32;
    params.model_fingerprint = std::string(64, 'f');
    params.tokenizer_fingerprint = std::string(64, 'e');
    auto layout = ipc::ComputePoolLayout(params);
    ASSERT_TRUE(layout.ok()) << layout.status();
    shm_name_ = "/polykv-client-test-" + std::to_string(getpid());
    ipc::ShmRegion::Remove(shm_name_).IgnoreError();
    void* base = nullptr;
    uint64_t size = 0;
    if (memfd) {
      auto region = ipc::SealedRegion::Create("polykv-client-test", layout->total_bytes);
      ASSERT_TRUE(region.ok()) << region.status();
      memfd_.emplace(std::move(*region));
      base = memfd_->writable_data();
      size = memfd_->size();
    } else {
      auto region = ipc::ShmRegion::Create(shm_name_, layout->total_bytes);
      ASSERT_TRUE(region.ok()) << region.status();
      region_.emplace(std::move(*region));
      base = region_->data();
      size = region_->size();
    }
    std::vector<uint8_t> pool_id(32);
    for (int i = 0; i < 32; ++i) pool_id[i] = static_cast<uint8_t>(0x10 + i);
    id_.clear();
    for (uint8_t b : pool_id) {
      static const char* kHex = "0123456789abcdef";
      id_ += kHex[b >> 4];
      id_ += kHex[b & 15];
    }
    tokens_ = {1, 461, 401, 378, 455};
    auto writer = ipc::PoolWriter::Create(base, size, params, pool_id, tokens_);
    ASSERT_TRUE(writer.ok()) << writer.status();
    const size_t n = kHeads * kTokens * kDim;
    k_.assign(kLayers, std::vector<float>(n));
    v_.assign(kLayers, std::vector<float>(n));
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (size_t i = 0; i < n; ++i) {
        k_[l][i] = 0.37f * static_cast<float>(i) - 3.1f * static_cast<float>(l) + 0.001f;
        v_[l][i] = std::sin(0.7f * static_cast<float>(i + 13 * l));
      }
      ASSERT_TRUE(writer->WriteLayer(l, k_[l].data(), v_[l].data(), kernels::DType::kF32).ok());
    }
    ASSERT_TRUE(writer->Finalize().ok());
    if (memfd) {
      if (seal) {
        ASSERT_TRUE(memfd_->Seal().ok());
      }
      fd_server_.emplace(memfd_->fd());
    }
    info_ = TestPoolInfo(id_);
    info_.codec = codec == ipc::PoolCodec::kNone ? "none" : "k8v3";
    info_.total_bytes = layout->total_bytes;
    daemon_.emplace([this](const ipc::Request& req) { return Handle(req); });
  }

  std::vector<ipc::Reply> Handle(const ipc::Request& req) {
    ipc::Reply r = FakeDaemon::OkReply(req);
    std::lock_guard<std::mutex> lock(mu_);
    r.instance = instance_;
    switch (req.type) {
      case ipc::MessageType::kAttach: {
        if (req.pool_id != id_ || evicted_) {
          return {ipc::ErrorReply(req.type, req.id, absl::NotFoundError("unknown pool"))};
        }
        r.pool = info_;
        r.lease_id = "lease-1";
        r.lease_ms = lease_ms_;
        ipc::MemoryHandle m;
        m.backend = ipc::PoolMemory::kHost;
        if (fd_server_) {
          m.transport = "memfd";
          m.fd_socket = fd_server_->path();
        } else {
          m.shm_name = shm_name_;
        }
        m.size = info_.total_bytes;
        r.memory = m;
        return {r};
      }
      case ipc::MessageType::kRenew:
        if (evicted_) {
          return {ipc::ErrorReply(req.type, req.id,
                                  absl::NotFoundError("pool " + id_ + " was evicted"))};
        }
        if (req.lease_id != "lease-1") {
          return {ipc::ErrorReply(req.type, req.id, absl::NotFoundError("unknown lease"))};
        }
        r.lease_ms = lease_ms_;
        return {r};
      default:
        return {r};
    }
  }

  void Evict() {
    std::lock_guard<std::mutex> lock(mu_);
    evicted_ = true;
  }

  /// Connects client_ to the fake daemon (`timeout_ms` per request) and attaches pool id_:
  /// the attach's result, or the connect's error.
  Result<Pool> ConnectAndAttach(int timeout_ms = 500) {
    auto client = Client::Connect(daemon_->endpoint(), timeout_ms);
    if (!client.ok()) return client.status();
    client_.emplace(std::move(*client));
    return client_->Attach(id_);
  }

  void TearDown() override {
    client_.reset();
    daemon_.reset();
    fd_server_.reset();
    memfd_.reset();
    region_.reset();  // the owner unlinks on destruction
  }

  std::mutex mu_;
  std::string instance_;  // "" = a daemon that does not stamp replies
  bool evicted_ = false;
  int64_t lease_ms_ = 300;
  std::string shm_name_, id_;
  std::vector<int32_t> tokens_;
  std::vector<std::vector<float>> k_, v_;
  ipc::PoolInfo info_;
  std::optional<ipc::ShmRegion> region_;
  std::optional<ipc::SealedRegion> memfd_;
  std::optional<FakeFdServer> fd_server_;
  std::optional<FakeDaemon> daemon_;
  std::optional<Client> client_;  ///< ConnectAndAttach's
};

TEST_F(FakePoolTest, SealedMemfdPoolAttachesAndDecodesBitExact) {
  MakePool(ipc::PoolCodec::kNone, /*memfd=*/true, /*seal=*/true);
  auto pool = ConnectAndAttach();
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_EQ(fd_server_->request(), "PKVFD1 lease-1");
  std::vector<float> k(pool->LayerElements()), v(k.size());
  for (uint32_t l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(pool->DecodeLayer(l, k.data(), v.data(), DType::kF32).ok());
    EXPECT_EQ(0, std::memcmp(k.data(), k_[l].data(), k.size() * 4)) << "layer " << l;
    EXPECT_EQ(0, std::memcmp(v.data(), v_[l].data(), v.size() * 4)) << "layer " << l;
  }
  // One read-only mapping of the whole region.
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int mappings = 0;
  while (std::getline(maps, line)) {
    if (line.find("/memfd:polykv-client-test") == std::string::npos) continue;
    EXPECT_EQ(line.substr(line.find(' ') + 1, 4), "r--s") << line;
    ++mappings;
  }
  EXPECT_EQ(mappings, 2) << "the test's own (sealed, read-only) mapping and the client's";
  // In-place attention reads the pool where the client mapped it: polykv_pool_mapping gives
  // that mapping (the pool's header first) for a memfd pool too, not only for named shm.
  const void* base = nullptr;
  uint64_t size = 0;
  ASSERT_EQ(polykv_pool_mapping(pool->get(), &base, &size), POLYKV_OK) << polykv_last_error();
  ASSERT_NE(base, nullptr);
  EXPECT_EQ(size, info_.total_bytes);
  EXPECT_EQ(0, std::memcmp(base, memfd_->data(), size));
  EXPECT_EQ(std::memcmp(base, ipc::kPoolMagic, sizeof(ipc::kPoolMagic)), 0);
}

TEST_F(FakePoolTest, UnsealedMemfdIsRefusedNotMapped) {
  MakePool(ipc::PoolCodec::kNone, /*memfd=*/true, /*seal=*/false);
  auto pool = ConnectAndAttach();
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), StatusCode::kPermissionDenied) << pool.status().ToString();
  EXPECT_EQ(pool.status().message(),
            "the pool descriptor is not sealed against writes (seals: none); refusing to map "
            "memory its sender could still change");
  EXPECT_EQ(daemon_->Count(ipc::MessageType::kDetach), 1);  // the lease was given back
}

TEST_F(FakePoolTest, LegacyShmPoolIsVerifiedOnAttach) {
  MakePool(ipc::PoolCodec::kNone);
  // Someone with the daemon's uid rewrites a payload byte of the named segment.
  auto* bytes = static_cast<uint8_t*>(region_->data());
  bytes[region_->size() - 1] ^= 0x5a;
  auto pool = ConnectAndAttach();
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), StatusCode::kDataLoss) << pool.status().ToString();
  EXPECT_NE(pool.status().message().find("payload checksum mismatch"), std::string::npos);
}

TEST_F(FakePoolTest, RenewalAnsweredByAnotherInstanceLosesTheLease) {
  MakePool(ipc::PoolCodec::kNone);
  auto client = Client::Connect(daemon_->endpoint(), 500);
  ASSERT_TRUE(client.ok());
  {
    std::lock_guard<std::mutex> lock(mu_);
    instance_ = std::string(32, '1');
  }
  auto pool = client->Attach(id_);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  {
    std::lock_guard<std::mutex> lock(mu_);
    instance_ = std::string(32, '2');  // the daemon restarted
  }
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (pool->LeaseStatus().ok() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(pool->LeaseStatus().code(), StatusCode::kNotFound);
  EXPECT_EQ(pool->LeaseStatus().message(),
            "pool " + id_ + " is gone: polykvd restarted (instance 11111111 -> 22222222)");
}

TEST_F(FakePoolTest, AttachMapsReadOnlyAndDecodesBitExact) {
  MakePool(ipc::PoolCodec::kNone);
  auto pool = ConnectAndAttach();
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_EQ(pool->info().id, id_);
  EXPECT_EQ(pool->info().codec, "none");
  EXPECT_EQ(pool->LayerElements(), size_t{kHeads * kTokens * kDim});
  EXPECT_EQ(polykv_pool_layer_elements(pool->get()), size_t{kHeads * kTokens * kDim});
  auto ids = pool->TokenIds();
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, tokens_);
  std::vector<float> k(pool->LayerElements()), v(k.size());
  for (uint32_t l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(pool->DecodeLayer(l, k.data(), v.data(), DType::kF32).ok());
    EXPECT_EQ(0, std::memcmp(k.data(), k_[l].data(), k.size() * 4)) << "layer " << l;
    EXPECT_EQ(0, std::memcmp(v.data(), v_[l].data(), v.size() * 4)) << "layer " << l;
  }
  Status oob = pool->DecodeLayer(kLayers, k.data(), v.data());
  EXPECT_EQ(oob.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(oob.message(),
            "polykv_decode_layer: layer 2 out of range: pool " + id_ + " has 2 layers");
  EXPECT_TRUE(pool->Verify().ok());
  // The pool is mapped read-only into this process: its line in /proc/self/maps is r--s.
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int mappings = 0;
  while (std::getline(maps, line)) {
    if (line.find("/dev/shm" + shm_name_) == std::string::npos) continue;
    std::string perms = line.substr(line.find(' ') + 1, 4);
    if (perms[1] == 'w') continue;  // this test's own writable (owner) mapping
    EXPECT_EQ(perms, "r--s") << line;
    ++mappings;
  }
  EXPECT_EQ(mappings, 1);
  ASSERT_TRUE(pool->Detach().ok());
  EXPECT_EQ(daemon_->Count(ipc::MessageType::kDetach), 1);
  EXPECT_EQ(daemon_->requests().back().lease_id, "lease-1");
}

TEST_F(FakePoolTest, CompressedDecodeMatchesPoolReader) {
  MakePool(ipc::PoolCodec::kK8V);
  auto pool = ConnectAndAttach();
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  auto reader = ipc::PoolReader::Open(region_->data(), region_->size(), true);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const size_t n = pool->LayerElements();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<uint8_t> k(n * DTypeBytes(dt)), v(k.size()), rk(k.size()), rv(k.size());
    for (uint32_t l = 0; l < kLayers; ++l) {
      ASSERT_TRUE(pool->DecodeLayer(l, k.data(), v.data(), dt).ok());
      ASSERT_TRUE(
          reader->DecodeLayer(l, rk.data(), rv.data(), static_cast<kernels::DType>(dt)).ok());
      EXPECT_EQ(k, rk);
      EXPECT_EQ(v, rv);
    }
  }
}

TEST_F(FakePoolTest, RenewalKeepsLeasePastLeaseTimeThenEvictionRefusesDecode) {
  MakePool(ipc::PoolCodec::kNone);
  auto pool = ConnectAndAttach();
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  std::vector<float> k(pool->LayerElements()), v(k.size());
  // Three lease times (300 ms each) later the lease is still valid thanks to RENEW.
  std::this_thread::sleep_for(std::chrono::milliseconds(3 * lease_ms_));
  EXPECT_TRUE(pool->LeaseStatus().ok()) << pool->LeaseStatus().ToString();
  EXPECT_TRUE(pool->DecodeLayer(0, k.data(), v.data()).ok());
  EXPECT_GE(daemon_->Count(ipc::MessageType::kRenew), 3);
  Evict();
  // The renewal thread learns of the eviction within about lease_ms / 3.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (pool->LeaseStatus().ok() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Status lease = pool->LeaseStatus();
  EXPECT_EQ(lease.code(), StatusCode::kNotFound);
  EXPECT_EQ(lease.message(), "pool " + id_ + " was evicted (daemon: pool " + id_ + " was evicted)");
  Status decoded = pool->DecodeLayer(0, k.data(), v.data());
  EXPECT_EQ(decoded.code(), StatusCode::kNotFound);
  EXPECT_EQ(decoded.message(), lease.message());
  // Detach after eviction is quiet: no lease left to release.
  EXPECT_TRUE(pool->Detach().ok());
  EXPECT_EQ(daemon_->Count(ipc::MessageType::kDetach), 0);
}

TEST_F(FakePoolTest, LeaseExpiresLocallyWhenDaemonStopsAnswering) {
  MakePool(ipc::PoolCodec::kNone);
  auto pool = ConnectAndAttach(100);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  daemon_.reset();  // daemon gone: renewals time out
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (pool->LeaseStatus().ok() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(pool->LeaseStatus().code(), StatusCode::kFailedPrecondition);
  std::vector<float> k(pool->LayerElements()), v(k.size());
  Status decoded = pool->DecodeLayer(0, k.data(), v.data());
  EXPECT_EQ(decoded.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(decoded.message().find("lease on pool " + id_ + " expired"), std::string::npos)
      << decoded.message();
}

TEST_F(FakePoolTest, AttachFailsCleanlyWhenShmIsMissing) {
  MakePool(ipc::PoolCodec::kNone);
  region_.reset();  // unlinks the object: the announced shm name no longer exists
  auto pool = ConnectAndAttach();
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), StatusCode::kNotFound) << pool.status().ToString();
  EXPECT_EQ(daemon_->Count(ipc::MessageType::kDetach), 1);  // the lease was given back
}

}  // namespace
}  // namespace polykv::client
