// libpolykv_client against a real polykvd process (stories260K pool from token ids):
// list / attach / info / token ids / bit-exact decode (codec none vs the model's own
// prefill), read-only mapping, lease renewal past the lease time, evict (refused with a
// lease, forced) -> decode NOT_FOUND, unknown pools.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "daemon_process.h"
#include "polykv/client.hpp"
#include "polykv/model/llama.h"

namespace polykv::client {
namespace {

using testing::DaemonProcess;
using Clock = std::chrono::steady_clock;

// Greedy continuation of [1] on stories260K (tests/data): a realistic document of 11 ids.
const std::vector<int32_t> kIds = {1, 461, 461, 401, 401, 401, 461, 378, 455, 473, 456};
constexpr double kLeaseSeconds = 0.5;

class ClientDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    struct stat st;
    if (stat(testing::DaemonBinary().c_str(), &st) != 0) {
      GTEST_SKIP() << "polykvd not built at " << testing::DaemonBinary();
    }
    daemon_ = std::make_unique<DaemonProcess>(kLeaseSeconds);
    ASSERT_TRUE(daemon_->ready()) << "polykvd did not start:\n" << daemon_->log();
    auto client = Client::Connect(daemon_->endpoint(), 2000);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_.emplace(std::move(*client));
  }
  void TearDown() override {
    client_.reset();
    daemon_.reset();  // SIGTERM / SIGKILL, removes the temp dir and shm segments
  }

  std::string CreateNonePool() {
    CreateOptions opts;
    opts.model = testing::Stories260K();
    opts.token_ids = kIds;
    opts.codec = "none";
    opts.timeout_ms = 120000;
    auto created = client_->CreatePool(opts);
    EXPECT_TRUE(created.ok()) << created.status().ToString() << "\n" << daemon_->log();
    if (!created.ok()) return "";
    daemon_->Track(created->info.id);
    EXPECT_TRUE(created->created);
    return created->info.id;
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::optional<Client> client_;
};

TEST_F(ClientDaemonTest, PingReportsDaemon) {
  auto info = client_->Ping();
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_FALSE(info->version.empty());
  EXPECT_GT(info->pid, 0u);
}

TEST_F(ClientDaemonTest, AttachDecodesBitExactlyLikeTheModelsOwnPrefill) {
  const std::string id = CreateNonePool();
  ASSERT_FALSE(id.empty());
  auto pools = client_->ListPools();
  ASSERT_TRUE(pools.ok()) << pools.status().ToString();
  ASSERT_EQ(pools->size(), 1u);
  EXPECT_EQ((*pools)[0].id, id);

  model::SetComputeThreads(2);
  auto model = model::LlamaModel::Load(testing::Stories260K());
  ASSERT_TRUE(model.ok()) << model.status();
  const model::ModelConfig& cfg = (*model)->config();
  auto prefill = (*model)->Prefill(kIds);
  ASSERT_TRUE(prefill.ok()) << prefill.status();

  auto pool = client_->Attach(id);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  const PoolInfo& info = pool->info();
  EXPECT_EQ(info.codec, "none");
  EXPECT_EQ(info.backend, "host");
  EXPECT_EQ(info.layers, static_cast<uint32_t>(cfg.layers));
  EXPECT_EQ(info.kv_heads, 4u);
  EXPECT_EQ(info.head_dim, 8u);
  EXPECT_EQ(info.tokens, kIds.size());
  EXPECT_EQ(info.model_fingerprint, (*model)->fingerprint());
  EXPECT_EQ(info.architecture, "llama");
  EXPECT_EQ(info.tokenizer_family, "none");  // stories260K ships no tokenizer
  EXPECT_EQ(info.key_codes_bytes + info.key_scales_bytes + info.value_codes_bytes +
                info.value_norms_bytes + info.overhead_bytes,
            info.total_bytes);
  auto ids = pool->TokenIds();
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, kIds);

  const size_t n = pool->LayerElements();
  std::vector<float> k(n), v(n);
  for (uint32_t l = 0; l < info.layers; ++l) {
    ASSERT_TRUE(pool->DecodeLayer(l, k.data(), v.data(), DType::kF32).ok());
    const std::vector<float>&mk = prefill->k[l], &mv = prefill->v[l];
    ASSERT_EQ(mk.size(), n);
    ASSERT_EQ(mk.size(), static_cast<size_t>(n)) << "K layer " << l;
    EXPECT_EQ(0, std::memcmp(k.data(), mk.data(), n * sizeof(float))) << "K layer " << l;
    EXPECT_EQ(0, std::memcmp(v.data(), mv.data(), n * sizeof(float))) << "V layer " << l;
  }
  EXPECT_TRUE(pool->Verify().ok());

  // Mapped read-only: the pool's sealed memfd has exactly one mapping in this process, r--s,
  // and no named segment exists.
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int mappings = 0;
  while (std::getline(maps, line)) {
    if (line.find(daemon_->MemfdName(id)) == std::string::npos) continue;
    EXPECT_EQ(line.substr(line.find(' ') + 1, 4), "r--s") << line;
    ++mappings;
  }
  EXPECT_EQ(mappings, 1);
  EXPECT_NE(access(daemon_->ShmPath(id).c_str(), F_OK), 0);
}

TEST_F(ClientDaemonTest, HostPoolHasHostViewsAndNoDeviceView) {
  const std::string id = CreateNonePool();
  ASSERT_FALSE(id.empty());
  auto pool = client_->Attach(id);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  int cuda_device = 7;
  ASSERT_EQ(polykv_pool_cuda_device(pool->get(), &cuda_device), POLYKV_OK);
  EXPECT_EQ(cuda_device, -1);  // a host pool
  EXPECT_EQ(polykv_pool_cuda_device(pool->get(), nullptr), POLYKV_INVALID_ARGUMENT);
  polykv_attention_view a = polykv_attention_view_init();
  ASSERT_EQ(polykv_pool_attention_view(pool->get(), &a), POLYKV_OK) << polykv_last_error();
  EXPECT_EQ(a.tokens, kIds.size());
  polykv_attention_view d = polykv_attention_view_init();
  EXPECT_EQ(polykv_pool_device_attention_view(pool->get(), &d), POLYKV_FAILED_PRECONDITION);
  EXPECT_NE(std::string(polykv_last_error()).find("lives in host memory"), std::string::npos)
      << polykv_last_error();
  polykv_layer_view l = polykv_layer_view_init();
  EXPECT_EQ(polykv_pool_device_layer_view(pool->get(), 0, &l), POLYKV_FAILED_PRECONDITION);
  EXPECT_EQ(l.k, nullptr);
  ASSERT_EQ(polykv_pool_layer_view(pool->get(), 0, &l), POLYKV_OK) << polykv_last_error();
  EXPECT_NE(l.k, nullptr);
  EXPECT_EQ(polykv_pool_layer_view(pool->get(), a.layers, &l), POLYKV_INVALID_ARGUMENT);
  EXPECT_NE(std::string(polykv_last_error()).find("polykv_pool_layer_view: layer"),
            std::string::npos)
      << polykv_last_error();
}

TEST_F(ClientDaemonTest, RenewalKeepsPoolAttachedThenForcedEvictRefusesDecode) {
  const std::string id = CreateNonePool();
  ASSERT_FALSE(id.empty());
  auto pool = client_->Attach(id);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  std::vector<float> k(pool->LayerElements()), v(k.size());
  // Three lease times later the renewal thread has kept the lease alive.
  std::this_thread::sleep_for(
      std::chrono::milliseconds(static_cast<int>(3000 * kLeaseSeconds) + 300));
  EXPECT_TRUE(pool->LeaseStatus().ok()) << pool->LeaseStatus().ToString();
  EXPECT_TRUE(pool->DecodeLayer(0, k.data(), v.data()).ok());
  auto stats = client_->GetPoolInfo(id);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->leases, 1u);

  Status refused = client_->Evict(id, /*force=*/false);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  ASSERT_TRUE(client_->Evict(id, /*force=*/true).ok());

  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (pool->LeaseStatus().ok() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Status decoded = pool->DecodeLayer(0, k.data(), v.data());
  EXPECT_EQ(decoded.code(), StatusCode::kNotFound) << decoded.ToString();
  EXPECT_EQ(decoded.message().rfind("pool " + id + " was evicted", 0), 0u) << decoded.message();
  EXPECT_TRUE(pool->Detach().ok());

  auto gone = client_->GetPoolInfo(id);
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(gone.status().message().rfind("unknown pool " + id, 0), 0u) << gone.status().message();
}

TEST_F(ClientDaemonTest, UnknownPoolIsNotFound) {
  const std::string id(64, '0');
  auto pool = client_->Attach(id);
  EXPECT_EQ(pool.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(pool.status().message().rfind("unknown pool " + id, 0), 0u);
  EXPECT_EQ(client_->Evict(id).code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace polykv::client
