// PoolManager::Replicate with the real stories260K model and two managers in one process (a
// holder and a requester) joined by an in-process PeerSource that copies from the holder's
// ExportForPeer mapping (the UCX transport itself is tested in ipc_ucx_transfer_test and
// across network namespaces in integration_peers_netns_test): identical bytes under the same
// id, one transfer for concurrent requests, nothing left behind by failed or corrupt
// transfers, a model fingerprint that differs refused, parent chains replicated first.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "polykv/ipc/pool_layout.h"
#include "polykv/ipc/sealed_region.h"
#include "pool_manager.h"
#include "test_util.h"

namespace polykv::daemon {
namespace {

using testing::CreateRequest;
using testing::MemfdObjects;

/// Serves Find from `holder` (ExportForPeer) and Pull by memcpy, with faults to inject.
class LocalPeers : public PeerSource {
 public:
  explicit LocalPeers(PoolManager* holder) : holder_(holder) {}
  StatusOr<Offer> Find(const std::string& pool_id) override {
    ++finds;
    auto e = holder_->ExportForPeer(pool_id);
    if (!e.ok()) return e.status();
    Offer o;
    o.info = e->info;
    if (!fingerprint_override.empty()) o.info.model_fingerprint = fingerprint_override;
    o.pool_bytes = e->size();
    o.peer = "test://holder";
    std::lock_guard<std::mutex> lock(mu_);
    o.transfer_id = std::to_string(++next_);
    o.descriptor = "local";
    exports_.emplace(o.transfer_id, *std::move(e));
    return o;
  }
  Status Pull(const Offer& offer, void* dst, uint64_t size, const std::atomic<bool>*,
              const std::function<void(uint64_t, uint64_t)>& progress) override {
    ++pulls;
    if (pull_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pull_delay_ms));
    std::lock_guard<std::mutex> lock(mu_);
    const PoolExport& e = exports_.at(offer.transfer_id);
    if (size != e.size()) return absl::InvalidArgumentError("size mismatch");
    if (fail_after > 0) {
      std::memcpy(dst, e.data(), std::min(fail_after, size));
      return absl::UnavailableError(
          absl::StrCat("holder died after ", fail_after, " of ", size, " bytes"));
    }
    std::memcpy(dst, e.data(), size);
    if (corrupt_at > 0) static_cast<uint8_t*>(dst)[corrupt_at] ^= 0x40;
    if (progress) progress(size, size);
    return absl::OkStatus();
  }
  void Release(const Offer& offer) override {
    std::lock_guard<std::mutex> lock(mu_);
    exports_.erase(offer.transfer_id);
  }
  size_t open_transfers() {
    std::lock_guard<std::mutex> lock(mu_);
    return exports_.size();
  }

  std::atomic<int> finds{0}, pulls{0};
  int pull_delay_ms = 0;
  uint64_t fail_after = 0;
  uint64_t corrupt_at = 0;
  std::string fingerprint_override;

 private:
  PoolManager* holder_;
  std::mutex mu_;
  uint64_t next_ = 0;
  std::map<std::string, PoolExport> exports_;
};

class ReplicationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    holder_prefix_ = "/polykv-rh" + std::to_string(getpid()) + "-";
    requester_prefix_ = "/polykv-rr" + std::to_string(getpid()) + "-";
    holder_ = Make(holder_prefix_);
    peers_ = std::make_unique<LocalPeers>(holder_.get());
    requester_ = Make(requester_prefix_);
    requester_->SetPeers(peers_.get());
  }
  void TearDown() override {
    requester_.reset();
    peers_.reset();
    holder_.reset();
  }
  static std::unique_ptr<PoolManager> Make(const std::string& prefix) {
    PoolManagerOptions o;
    o.backend = ipc::PoolMemory::kHost;
    o.shm_prefix = prefix;
    return std::make_unique<PoolManager>(std::move(o));
  }
  // Checksum64 of a published pool's whole region, read through a lease as agents map it.
  static uint64_t Digest(PoolManager& m, const std::string& id) {
    auto g = m.Attach(id, 1);
    if (!g.ok()) return 0;
    auto fd = m.PoolFd(g->lease_id);
    uint64_t d = 0;
    if (fd.ok()) {
      auto r = ipc::SealedRegion::MapSealed(*std::move(fd), 0);
      if (r.ok()) d = ipc::Checksum64(r->data(), r->size());
    }
    (void)m.Detach(g->lease_id);
    return d;
  }
  std::string holder_prefix_, requester_prefix_;
  std::unique_ptr<PoolManager> holder_, requester_;
  std::unique_ptr<LocalPeers> peers_;
};

TEST_F(ReplicationTest, ReplicaHasTheSameIdAndBytes) {
  for (const char* codec : {"none", "k8v3", "default"}) {
    auto made = holder_->CreatePool(CreateRequest(codec), nullptr);
    ASSERT_TRUE(made.ok()) << made.status();
    const std::string id = made->info.id;
    EXPECT_EQ(made->info.origin, "prefill");
    // By a unique prefix, as `pools fetch` may name it.
    auto r = requester_->Replicate(id.substr(0, 12));
    ASSERT_TRUE(r.ok()) << codec << ": " << r.status();
    EXPECT_TRUE(r->created && r->replicated);
    EXPECT_EQ(r->info.id, id);
    EXPECT_EQ(r->info.origin, "peer test://holder");
    EXPECT_EQ(r->info.tokens, made->info.tokens);
    EXPECT_EQ(r->info.total_bytes, made->info.total_bytes);
    EXPECT_EQ(r->info.codec, made->info.codec);
    const uint64_t d = Digest(*holder_, id);
    ASSERT_NE(d, 0u);
    EXPECT_EQ(Digest(*requester_, id), d) << codec;
    // A second request finds it published: no second transfer.
    const int pulls = peers_->pulls.load();
    auto again = requester_->Replicate(id);
    ASSERT_TRUE(again.ok());
    EXPECT_FALSE(again->created);
    EXPECT_EQ(peers_->pulls.load(), pulls);
  }
  EXPECT_EQ(requester_->replicated_count(), 3u);
  EXPECT_EQ(peers_->open_transfers(), 0u) << "every offer released";
}

TEST_F(ReplicationTest, ConcurrentRequestsShareOneTransfer) {
  auto made = holder_->CreatePool(CreateRequest("k8v3"), nullptr);
  ASSERT_TRUE(made.ok());
  peers_->pull_delay_ms = 300;
  std::vector<std::thread> threads;
  std::vector<StatusOr<CreateResult>> results(4, absl::InternalError("not run"));
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] { results[i] = requester_->Replicate(made->info.id); });
  }
  for (auto& t : threads) t.join();
  int created = 0;
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->info.id, made->info.id);
    created += r->created ? 1 : 0;
  }
  EXPECT_EQ(created, 1);
  EXPECT_EQ(peers_->pulls.load(), 1) << "one transfer for four concurrent requests";
  EXPECT_EQ(requester_->List().size(), 1u);
  EXPECT_EQ(requester_->memory_used(), made->info.total_bytes);
}

TEST_F(ReplicationTest, FailedTransferLeavesNothing) {
  auto made = holder_->CreatePool(CreateRequest("k8v3"), nullptr);
  ASSERT_TRUE(made.ok());
  peers_->fail_after = 4096;
  auto r = requester_->Replicate(made->info.id);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("after 4096 of"), std::string::npos);
  EXPECT_TRUE(requester_->List().empty());
  EXPECT_EQ(requester_->memory_used(), 0u);
  EXPECT_TRUE(MemfdObjects(requester_prefix_).empty()) << "no segment left";
  EXPECT_EQ(peers_->open_transfers(), 0u);
  // Corrupt bytes: the payload checksum refuses them.
  peers_->fail_after = 0;
  peers_->corrupt_at = made->info.total_bytes - 5;
  r = requester_->Replicate(made->info.id);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_TRUE(requester_->List().empty());
  EXPECT_EQ(requester_->memory_used(), 0u);
  EXPECT_TRUE(MemfdObjects(requester_prefix_).empty());
  // Then a good transfer publishes it.
  peers_->corrupt_at = 0;
  r = requester_->Replicate(made->info.id);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Digest(*requester_, made->info.id), Digest(*holder_, made->info.id));
}

TEST_F(ReplicationTest, ModelFingerprintMustMatch) {
  auto made = holder_->CreatePool(CreateRequest("k8v3"), nullptr);
  ASSERT_TRUE(made.ok());
  peers_->fingerprint_override = std::string(64, 'f');
  auto r = requester_->Replicate(made->info.id);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("different model file"), std::string::npos)
      << r.status();
  EXPECT_EQ(peers_->pulls.load(), 0) << "refused before any byte moved";
  EXPECT_TRUE(requester_->List().empty());
  EXPECT_EQ(requester_->memory_used(), 0u);
}

TEST_F(ReplicationTest, ChildPoolBringsItsParentChain) {
  auto parent = holder_->CreatePool(CreateRequest("k8v3"), nullptr);
  ASSERT_TRUE(parent.ok());
  ipc::Request child = CreateRequest("");
  child.model.clear();
  child.token_ids.assign(24, 9);
  child.parent = parent->info.id;
  auto c = holder_->CreatePool(child, nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  auto r = requester_->Replicate(c->info.id);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->info.parent, parent->info.id);
  ASSERT_EQ(requester_->List().size(), 2u);
  EXPECT_EQ(Digest(*requester_, parent->info.id), Digest(*holder_, parent->info.id));
  EXPECT_EQ(Digest(*requester_, c->info.id), Digest(*holder_, c->info.id));
}

TEST_F(ReplicationTest, UnknownPoolsAndNoPeers) {
  auto r = requester_->Replicate(std::string(64, 'a'));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  auto lone = Make("/polykv-rl" + std::to_string(getpid()) + "-");
  r = lone->Replicate(std::string(64, 'a'));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(r.status().message()).find("no peer daemons"), std::string::npos);
}

}  // namespace
}  // namespace polykv::daemon
