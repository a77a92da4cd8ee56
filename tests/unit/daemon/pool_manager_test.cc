// PoolManager with the real stories260K model: content-addressed creates (none, k8v3),
// dedup (sequential and concurrent), leases, expiry, eviction, memory cap.
#include "pool_manager.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "daemon_fixture.h"
#include "polykv/ipc/codec_spec.h"
#include "polykv/ipc/sealed_region.h"
#include "test_util.h"

namespace polykv::daemon {
namespace {

using testing::CreateRequest;
using testing::MemfdObjects;
using testing::ShmObjects;

// Maps the pool of a lease as an agent would: the sealed memfd, read-only.
StatusOr<ipc::SealedRegion> MapLease(PoolManager& m, const std::string& lease_id) {
  POLYKV_ASSIGN_OR_RETURN(ipc::UniqueFd fd, m.PoolFd(lease_id));
  return ipc::SealedRegion::MapSealed(std::move(fd), 0);
}

class PoolManagerTest : public testing::PoolManagerTestBase {
 protected:
  PoolManagerTest() : PoolManagerTestBase("pm") {}
  PoolManager& Make(uint64_t cap = 0, int64_t lease_ms = 30000, int create_delay_ms = 0) {
    PoolManagerOptions o;
    o.memory_cap = cap;
    o.lease_ms = lease_ms;
    o.test_create_delay_ms = create_delay_ms;
    return MakeManager(std::move(o));
  }
};

TEST_F(PoolManagerTest, CodecNames) {
  EXPECT_EQ(ParseCodecName("k8v3")->value_bits, 3);
  EXPECT_EQ(ParseCodecName("k8v2")->value_bits, 2);
  EXPECT_EQ(ParseCodecName("k8v4")->value_bits, 4);
  EXPECT_EQ(ParseCodecName("none")->codec, ipc::PoolCodec::kNone);
  auto bad = ParseCodecName("k4v4");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.status().message()).find("k8v3"), std::string::npos);
  EXPECT_EQ(*ParseKeyScale("channel"), kernels::KeyScaleMode::kPerChannel);
  EXPECT_FALSE(ParseKeyScale("row").ok());
}

TEST_F(PoolManagerTest, PoolIdIsContentAddressed) {
  ipc::PoolParams p;
  p.codec_config.value_bits = 3;
  std::vector<int32_t> ids = {1, 2, 3};
  std::string a = ComputePoolId("m", "t", p, ids);
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a, ComputePoolId("m", "t", p, ids));
  EXPECT_NE(a, ComputePoolId("m2", "t", p, ids));
  EXPECT_NE(a, ComputePoolId("m", "t2", p, ids));
  EXPECT_NE(a, ComputePoolId("m", "t", p, {1, 2, 4}));
  auto q = p;
  q.codec_config.value_bits = 4;
  EXPECT_NE(a, ComputePoolId("m", "t", q, ids));
  q = p;
  q.codec_config.rotation_seed ^= 1;
  EXPECT_NE(a, ComputePoolId("m", "t", q, ids));
  q = p;
  q.codec_config.norm_correction = true;
  EXPECT_NE(a, ComputePoolId("m", "t", q, ids));
  // A child pool (pool tree): the same tokens after another parent are another pool.
  q = p;
  q.parent_id = std::string(64, 'a');
  q.parent_tokens = 10;
  const std::string child = ComputePoolId("m", "t", q, ids);
  EXPECT_NE(a, child);
  q.parent_id = std::string(64, 'b');
  EXPECT_NE(child, ComputePoolId("m", "t", q, ids));
}

TEST_F(PoolManagerTest, CreateNoneAndK8v3PublishReadablePools) {
  PoolManager& m = Make();
  bool first = true;
  for (const char* codec : {"none", "k8v3"}) {
    std::vector<std::string> stages;
    auto r = m.CreatePool(CreateRequest(codec), [&](const std::string& s, int64_t, int64_t) {
      if (stages.empty() || stages.back() != s) stages.push_back(s);
    });
    ASSERT_TRUE(r.ok()) << codec << ": " << r.status();
    EXPECT_TRUE(r->created);
    // The model is loaded by the first create only (then it is in the cache).
    if (first) {
      EXPECT_EQ(stages, (std::vector<std::string>{"load", "prefill", "encode", "publish"}));
    } else {
      EXPECT_EQ(stages, (std::vector<std::string>{"prefill", "encode", "publish"}));
    }
    first = false;
    const ipc::PoolInfo& info = r->info;
    EXPECT_EQ(info.codec, codec);
    EXPECT_EQ(info.backend, "host");
    EXPECT_EQ(info.tokens, 40u);
    EXPECT_EQ(info.layers, 5u);  // stories260K: 5 layers, 4 KV heads, head_dim 8
    EXPECT_EQ(info.kv_heads, 4u);
    EXPECT_EQ(info.head_dim, 8u);
    EXPECT_EQ(info.bf16_bytes, 2u * 2 * 5 * 4 * 40 * 8);
    EXPECT_EQ(info.leases, 0u);

    auto g = m.Attach(info.id, 123);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->memory.backend, ipc::PoolMemory::kHost);
    EXPECT_EQ(g->memory.transport, "memfd");
    EXPECT_TRUE(g->memory.shm_name.empty()) << "no named segment anyone could squat";
    auto shm = MapLease(m, g->lease_id);
    ASSERT_TRUE(shm.ok()) << shm.status();
    EXPECT_EQ(shm->size(), info.total_bytes);
    auto reader = ipc::PoolReader::Open(shm->data(), shm->size(), /*verify_payload=*/true);
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_EQ(reader->TokenIds(), testing::StoryIds());
    EXPECT_EQ(reader->header().total_bytes, info.total_bytes);
    EXPECT_EQ(reader->params().codec,
              std::string(codec) == "none" ? ipc::PoolCodec::kNone : ipc::PoolCodec::kK8V);
    std::vector<float> k(4 * 40 * 8), v(k.size());
    ASSERT_TRUE(reader->DecodeLayer(4, k.data(), v.data(), kernels::DType::kF32).ok());
    double norm = 0;
    for (float x : v) norm += std::abs(x);
    EXPECT_GT(norm, 0) << "decoded V must not be all zero";
    ASSERT_TRUE(m.Detach(g->lease_id).ok());
  }
  auto list = m.List();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].codec, "none");
  EXPECT_EQ(list[1].codec, "k8v3");
  EXPECT_NE(list[0].id, list[1].id);
  EXPECT_GT(list[0].total_bytes, list[1].total_bytes);
  EXPECT_EQ(m.memory_used(), list[0].total_bytes + list[1].total_bytes);
  EXPECT_EQ(MemfdObjects(prefix_).size(), 2u);
}

TEST_F(PoolManagerTest, NoneMatchesThePrefillBitExactly) {
  PoolManager& m = Make();
  auto r = m.CreatePool(CreateRequest("none"), nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  auto model = model::LlamaModel::Load(testing::Stories260K());
  ASSERT_TRUE(model.ok());
  auto ids = testing::StoryIds();
  auto pre = (*model)->Prefill(ids);
  ASSERT_TRUE(pre.ok());
  auto g = m.Attach(r->info.id, 0);
  ASSERT_TRUE(g.ok());
  auto shm = MapLease(m, g->lease_id);
  ASSERT_TRUE(shm.ok()) << shm.status();
  auto reader = ipc::PoolReader::Open(shm->data(), shm->size(), true);
  ASSERT_TRUE(reader.ok());
  for (uint32_t l = 0; l < 5; ++l) {
    const std::vector<float>&k = pre->k[l], &v = pre->v[l];
    std::vector<float> ko(k.size()), vo(v.size());
    ASSERT_TRUE(reader->DecodeLayer(l, ko.data(), vo.data(), kernels::DType::kF32).ok());
    ASSERT_EQ(k.size(), ko.size());
    EXPECT_EQ(0, std::memcmp(ko.data(), k.data(), 4 * ko.size())) << l;
    EXPECT_EQ(0, std::memcmp(vo.data(), v.data(), 4 * vo.size())) << l;
  }
}

TEST_F(PoolManagerTest, SameCreateTwiceYieldsOnePool) {
  PoolManager& m = Make();
  auto a = m.CreatePool(CreateRequest("k8v3"), nullptr);
  auto b = m.CreatePool(CreateRequest("k8v3"), nullptr);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->created);
  EXPECT_FALSE(b->created);
  EXPECT_EQ(a->info.id, b->info.id);
  EXPECT_EQ(m.List().size(), 1u);
  // Different content -> another pool.
  auto c = m.CreatePool(CreateRequest("k8v3", /*salt=*/1), nullptr);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->info.id, a->info.id);
  EXPECT_EQ(m.List().size(), 2u);
}

TEST_F(PoolManagerTest, ConcurrentCreatesJoin) {
  PoolManager& m = Make();
  constexpr int kThreads = 4;
  std::vector<StatusOr<CreateResult>> results(kThreads, absl::UnknownError("unset"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] { results[i] = m.CreatePool(CreateRequest("k8v4"), nullptr); });
  }
  for (auto& t : threads) t.join();
  int created = 0;
  for (auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    created += r->created;
    EXPECT_EQ(r->info.id, results[0]->info.id);
  }
  EXPECT_EQ(created, 1);
  EXPECT_EQ(m.List().size(), 1u);
  EXPECT_EQ(MemfdObjects(prefix_).size(), 1u);
}

TEST_F(PoolManagerTest, LeasesRenewDetachAndExpire) {
  PoolManager& m = Make(0, /*lease_ms=*/300);
  auto r = m.CreatePool(CreateRequest("k8v3"), nullptr);
  ASSERT_TRUE(r.ok());
  const std::string id = r->info.id;
  auto g1 = m.Attach(id, 1);
  auto g2 = m.Attach(id.substr(0, 12), 2);  // unique prefix
  ASSERT_TRUE(g1.ok() && g2.ok());
  EXPECT_EQ(g1->lease_id.size(), 32u);
  EXPECT_NE(g1->lease_id, g2->lease_id);
  EXPECT_EQ(g1->lease_ms, 300);
  EXPECT_EQ(m.Info(id)->leases, 2u);
  ASSERT_TRUE(m.Detach(g2->lease_id).ok());
  EXPECT_EQ(m.Detach(g2->lease_id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(m.Info(id)->leases, 1u);
  // Renew keeps g1 alive past its first expiry.
  for (int i = 0; i < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    ASSERT_TRUE(m.Renew(g1->lease_id).ok()) << i;
  }
  EXPECT_EQ(m.Info(id)->leases, 1u);
  // Stop renewing: expires, is swept, and cannot be renewed.
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(m.Info(id)->leases, 0u);
  EXPECT_EQ(m.SweepExpiredLeases(), 1);
  auto late = m.Renew(g1->lease_id);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(m.Attach("ffffffffffff", 0).status().code(), absl::StatusCode::kNotFound);
  // With no live lease, a plain evict works.
  EXPECT_TRUE(m.Evict(id, false).ok());
  EXPECT_TRUE(m.List().empty());
}

TEST_F(PoolManagerTest, EvictRefusedWithLeasesForcedInvalidates) {
  PoolManager& m = Make();
  auto r = m.CreatePool(CreateRequest("k8v3"), nullptr);
  ASSERT_TRUE(r.ok());
  auto g = m.Attach(r->info.id, 1);
  ASSERT_TRUE(g.ok());
  auto shm = MapLease(m, g->lease_id);  // a mapped reader
  ASSERT_TRUE(shm.ok()) << shm.status();
  Status refused = m.Evict(r->info.id, false);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(refused.message()).find("1 live lease"), std::string::npos) << refused;
  EXPECT_EQ(m.List().size(), 1u);
  ASSERT_TRUE(m.Evict(r->info.id, true).ok());
  EXPECT_TRUE(m.List().empty());
  EXPECT_EQ(m.memory_used(), 0u);
  EXPECT_EQ(MemfdObjects(prefix_).size(), 1u) << "only the reader's descriptor is left";
  EXPECT_EQ(m.PoolFd(g->lease_id).status().code(), absl::StatusCode::kNotFound);
  // The mapped reader's pages stay valid, and the header still checks out.
  EXPECT_TRUE(ipc::PoolReader::Open(shm->data(), shm->size(), true).ok());
  auto renew = m.Renew(g->lease_id);
  EXPECT_EQ(renew.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(renew.status().message()).find("pool evicted"), std::string::npos);
  EXPECT_EQ(m.Attach(r->info.id, 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(m.Evict(r->info.id, true).code(), absl::StatusCode::kNotFound);
}

TEST_F(PoolManagerTest, MemoryCapExceededLeavesNothingBehind) {
  // First learn the size of one k8v3 pool, then cap just below two of them.
  uint64_t one = 0;
  {
    PoolManager& m = Make();
    auto r = m.CreatePool(CreateRequest("k8v3"), nullptr);
    ASSERT_TRUE(r.ok());
    one = r->info.total_bytes;
  }
  manager_.reset();
  EXPECT_TRUE(MemfdObjects(prefix_).empty()) << "destruction releases pools";
  PoolManager& m = Make(2 * one - 1);
  ASSERT_TRUE(m.CreatePool(CreateRequest("k8v3"), nullptr).ok());
  auto r = m.CreatePool(CreateRequest("k8v3", /*salt=*/2), nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string msg(r.status().message());
  EXPECT_NE(msg.find("used " + std::to_string(one)), std::string::npos) << msg;
  EXPECT_NE(msg.find("cap " + std::to_string(2 * one - 1)), std::string::npos) << msg;
  EXPECT_NE(msg.find("needs " + std::to_string(one)), std::string::npos) << msg;
  EXPECT_EQ(m.List().size(), 1u);
  EXPECT_EQ(m.memory_used(), one);
  EXPECT_EQ(MemfdObjects(prefix_).size(), 1u);
  // A cap smaller than one pool: nothing at all.
  manager_.reset();
  PoolManager& tiny = Make(1000);
  EXPECT_EQ(tiny.CreatePool(CreateRequest("none"), nullptr).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(tiny.List().empty());
  EXPECT_TRUE(MemfdObjects(prefix_).empty());
}

TEST_F(PoolManagerTest, ChildCreateAbortsWhenItsParentIsEvictedMeanwhile) {
  // The child's prefill reads the parent through its own read-only mappings, so a forced
  // evict during the create cannot pull the memory away; the child is then not published
  // (it could never be attended to), and its memory is released.
  PoolManager& m = Make(0, 30000, /*create_delay_ms=*/600);
  auto parent = m.CreatePool(CreateRequest("k8v3"), nullptr);
  ASSERT_TRUE(parent.ok()) << parent.status();
  const uint64_t used = m.memory_used();
  ipc::Request child = CreateRequest("");
  child.model.clear();
  child.token_ids.resize(40);
  child.parent = parent->info.id.substr(0, 10);
  StatusOr<CreateResult> r = absl::InternalError("not run");
  std::thread t([&] { r = m.CreatePool(child, nullptr); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(m.Evict(parent->info.id, /*force=*/true).ok());
  t.join();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("evicted"), std::string::npos) << r.status();
  EXPECT_TRUE(m.List().empty());
  EXPECT_EQ(m.memory_used(), 0u);
  EXPECT_GT(used, 0u);
  EXPECT_TRUE(MemfdObjects(prefix_).empty());
  // Without the race the same child publishes, holding only its own 40 tokens.
  auto p2 = m.CreatePool(CreateRequest("k8v3"), nullptr);
  ASSERT_TRUE(p2.ok());
  child.parent = p2->info.id;
  auto c2 = m.CreatePool(child, nullptr);
  ASSERT_TRUE(c2.ok()) << c2.status();
  EXPECT_EQ(c2->info.tokens, 40u);
  EXPECT_EQ(c2->info.parent, p2->info.id);
  EXPECT_EQ(c2->info.parent_tokens, p2->info.tokens);
  EXPECT_EQ(c2->info.model, p2->info.model) << "the parent's model by default";
  EXPECT_EQ(m.Evict(p2->info.id, false).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(PoolManagerTest, CodecSpecPoolsAreBuiltReadAndNamed) {
  // A pool of the measured default spec: packed 7-bit keys (per channel), boundary layers at
  // 4 bits, norm correction, f16 norms. Its size is the eval's (PoolSizeOf), "default" names
  // the same pool, and an ablation-only spec is refused.
  PoolManager& m = Make();
  auto r = m.CreatePool(CreateRequest("k7c-v3-e4x2-nc-n16"), nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->info.codec, "k7c-v3-e4x2-nc-n16");
  const auto spec = ipc::ParseCodecSpec("k7c-v3-e4x2-nc-n16");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(static_cast<int64_t>(r->info.total_bytes),
            ipc::PoolSizeOf(*spec, 5, 4, 8, 40).bytes);  // stories260K, 40 tokens
  EXPECT_EQ(r->info.fidelity_layers, 5u);
  EXPECT_GT(r->info.value_rel_mse_max, 0.0);
  EXPECT_LT(r->info.value_rel_mse_max, 0.05);
  auto again = m.CreatePool(CreateRequest("k7c-v3-e4x2-nc-n16"), nullptr);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->info.id, r->info.id);
  // No codec = "default" = ipc::kDefaultCodecSpec on the host backend (stories260K has 5
  // layers: the first and last three overlap, every layer's values at 4 bits).
  auto dflt = m.CreatePool(CreateRequest(""), nullptr);
  ASSERT_TRUE(dflt.ok()) << dflt.status();
  auto named = m.CreatePool(CreateRequest(ipc::kDefaultCodecSpec), nullptr);
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(named->info.id, dflt->info.id);
  EXPECT_FALSE(named->created);
  EXPECT_EQ(dflt->info.codec, "k7c-v3-e4x5-nc-n16");
  // The mapped pool reads back with every parameter.
  auto lease = m.Attach(r->info.id, 1);
  ASSERT_TRUE(lease.ok());
  auto region = MapLease(m, lease->lease_id);
  ASSERT_TRUE(region.ok()) << region.status();
  auto reader = ipc::PoolReader::Open(region->data(), region->size(), true);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->params().codec_config.key_bits, 7);
  EXPECT_EQ(reader->params().codec_config.norm_dtype, kernels::DType::kF16);
  EXPECT_EQ(reader->params().layer_value_bits, (std::vector<int32_t>{4, 4, 3, 4, 4}));
  EXPECT_TRUE(m.Detach(lease->lease_id).ok());
  // k8v3 with another key scale keeps its name; pools never skip the rotation.
  auto req = CreateRequest("k8v3");
  req.key_scale = "channel";
  auto k8 = m.CreatePool(req, nullptr);
  ASSERT_TRUE(k8.ok());
  EXPECT_EQ(k8->info.codec, "k8v3");
  EXPECT_EQ(m.CreatePool(CreateRequest("k8t-v3-norot"), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.CreatePool(CreateRequest("k9t-v3"), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(PoolManagerTest, BadRequestsAreErrors) {
  PoolManager& m = Make();
  auto req = CreateRequest("k8v9");
  EXPECT_EQ(m.CreatePool(req, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  req = CreateRequest("k8v3");
  req.model = "/nonexistent/model";
  EXPECT_EQ(m.CreatePool(req, nullptr).status().code(), absl::StatusCode::kNotFound);
  req = CreateRequest("k8v3");
  req.token_ids[3] = 100000;
  auto s = m.CreatePool(req, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("token_ids[3]"), std::string::npos) << s;
  req = CreateRequest("k8v3");
  req.token_ids.clear();
  req.document = "text for a model without tokenizer";
  s = m.CreatePool(req, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("tokenizer"), std::string::npos) << s;
  EXPECT_TRUE(m.List().empty());
  EXPECT_TRUE(MemfdObjects(prefix_).empty());
}

}  // namespace
}  // namespace polykv::daemon
