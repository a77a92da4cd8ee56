// Persisted pools (PoolStore + PoolManager, stories260K): a pool survives the manager (a
// restart) byte for byte and is restored lazily on attach or create, or by preload; evict
// removes its file; corrupt and truncated files are quarantined and never served; a model
// that is absent or changed is refused; the disk budget evicts the least recently used file.
#include "pool_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "daemon_fixture.h"
#include "metrics.h"
#include "polykv/ipc/sealed_region.h"
#include "pool_manager.h"
#include "test_util.h"

namespace polykv::daemon {
namespace {

namespace fs = std::filesystem;
using testing::CreateRequest;

// Files in `dir`, the ".why" notes beside quarantined files left out.
size_t FilesIn(const std::string& dir) {
  if (!fs::exists(dir)) return 0;
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".why") ++n;
  }
  return n;
}

const ipc::PoolInfo* FindIn(const std::vector<ipc::PoolInfo>& list, const std::string& id) {
  for (const auto& p : list) {
    if (p.id == id) return &p;
  }
  return nullptr;
}

class PoolStoreTest : public testing::PoolManagerTestBase {
 protected:
  PoolStoreTest() : PoolManagerTestBase("ps") {}
  void SetUp() override {
    PoolManagerTestBase::SetUp();
    state_ = dir_.path() + "/state";
  }
  void TearDown() override {
    manager_.reset();
    store_.reset();
    PoolManagerTestBase::TearDown();
  }
  // A fresh store + manager on the same state folder: what a daemon restart sees.
  PoolManager& Restart(uint64_t budget = 0, uint64_t cap = 0) {
    manager_.reset();
    store_.reset();
    auto s = PoolStore::Open(state_, budget);
    EXPECT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
    PoolManagerOptions o;
    o.memory_cap = cap;
    o.store = store_.get();
    return MakeManager(std::move(o));
  }
  // The bytes agents map for pool `id` (attaches, maps the sealed memfd as an agent does,
  // detaches).
  std::string MappedBytes(const std::string& id) {
    auto g = manager_->Attach(id, 1);
    EXPECT_TRUE(g.ok()) << g.status();
    if (!g.ok()) return "";
    EXPECT_EQ(g->memory.transport, "memfd");
    auto fd = manager_->PoolFd(g->lease_id);
    EXPECT_TRUE(fd.ok()) << fd.status();
    if (!fd.ok()) return "";
    auto region = ipc::SealedRegion::MapSealed(*std::move(fd), g->memory.size);
    EXPECT_TRUE(region.ok()) << region.status();
    if (!region.ok()) return "";
    EXPECT_EQ(ipc::GetSeals(region->fd()) & ipc::kPoolSealsRequired, ipc::kPoolSealsRequired);
    std::string bytes(static_cast<const char*>(region->data()), g->memory.size);
    EXPECT_TRUE(manager_->Detach(g->lease_id).ok());
    return bytes;
  }
  testing::TempDir dir_;
  std::string state_;
  std::unique_ptr<PoolStore> store_;
};

TEST_F(PoolStoreTest, PoolSurvivesRestartByteForByteAndRestoresOnAttach) {
  PoolManager& a = Restart();
  auto r = a.CreatePool(CreateRequest("k8v3"), nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->restored);
  const ipc::PoolInfo before = r->info;
  const std::string bytes = MappedBytes(before.id);
  ASSERT_EQ(bytes.size(), before.total_bytes);
  const std::string file = store_->PathOf(before.id);
  ASSERT_TRUE(fs::exists(file));
  EXPECT_EQ(store_->count(), 1u);
  EXPECT_EQ(store_->bytes(), fs::file_size(file));
  EXPECT_EQ(support::ReadFile(file).substr(fs::file_size(file) - bytes.size()), bytes);

  PoolManager& b = Restart();
  EXPECT_TRUE(testing::MemfdObjects(prefix_).empty()) << "the old manager released its pool";
  EXPECT_TRUE(b.List().empty()) << "lazy: nothing is published before use";
  EXPECT_EQ(store_->count(), 1u);
  EXPECT_EQ(MappedBytes(before.id.substr(0, 12)), bytes) << "restored by a prefix attach";
  EXPECT_EQ(b.restored_count(), 1u);
  auto list = b.List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].id, before.id);
  EXPECT_EQ(list[0].total_bytes, before.total_bytes);
  EXPECT_EQ(list[0].tokens, before.tokens);
  EXPECT_EQ(list[0].codec, before.codec);
  EXPECT_EQ(list[0].model, before.model);
  EXPECT_EQ(list[0].created_unix_ms, before.created_unix_ms);
  EXPECT_EQ(list[0].key_codes, before.key_codes);
  EXPECT_EQ(list[0].value_codes, before.value_codes);
  EXPECT_EQ(list[0].overhead, before.overhead);
  EXPECT_DOUBLE_EQ(list[0].effective_ratio, before.effective_ratio);
  EXPECT_EQ(b.memory_used(), before.total_bytes);
  // A create of the same content now finds it published.
  auto again = b.CreatePool(CreateRequest("k8v3"), nullptr);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->created);
  EXPECT_EQ(b.restored_count(), 1u);
}

TEST_F(PoolStoreTest, CreateAfterRestartRestoresInsteadOfPrefilling) {
  std::string id, bytes;
  {
    PoolManager& a = Restart();
    auto r = a.CreatePool(CreateRequest("none"), nullptr);
    ASSERT_TRUE(r.ok()) << r.status();
    id = r->info.id;
    bytes = MappedBytes(id);
  }
  PoolManager& b = Restart();
  std::vector<std::string> stages;
  auto r = b.CreatePool(CreateRequest("none"), [&](const std::string& s, int64_t, int64_t) {
    if (stages.empty() || stages.back() != s) stages.push_back(s);
  });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->created);
  EXPECT_TRUE(r->restored);
  // The fresh manager loads the model (for the content id), then publishes from the file.
  EXPECT_EQ(stages, (std::vector<std::string>{"load", "publish"})) << "no prefill, no encode";
  EXPECT_EQ(r->info.id, id);
  EXPECT_EQ(MappedBytes(id), bytes);
  EXPECT_EQ(b.restored_count(), 1u);
}

TEST_F(PoolStoreTest, PreloadPublishesEveryPersistedPool) {
  {
    PoolManager& a = Restart();
    ASSERT_TRUE(a.CreatePool(CreateRequest("k8v3", 1), nullptr).ok());
    ASSERT_TRUE(a.CreatePool(CreateRequest("k8v2", 2), nullptr).ok());
  }
  PoolManager& b = Restart();
  EXPECT_EQ(b.PreloadPersisted(), 2);
  EXPECT_EQ(b.List().size(), 2u);
  EXPECT_EQ(testing::MemfdObjects(prefix_).size(), 2u) << "one sealed memfd per pool";
  EXPECT_TRUE(testing::ShmObjects(prefix_).empty()) << "no POSIX shm objects";
  EXPECT_EQ(b.restored_count(), 2u);
  EXPECT_EQ(b.PreloadPersisted(), 2) << "already published pools count, nothing is redone";
  EXPECT_EQ(b.restored_count(), 2u);
}

TEST_F(PoolStoreTest, EvictRemovesTheFileAlsoForPoolsOnlyOnDisk) {
  std::string a_id, b_id;
  {
    PoolManager& a = Restart();
    a_id = a.CreatePool(CreateRequest("k8v3", 1), nullptr)->info.id;
    b_id = a.CreatePool(CreateRequest("k8v3", 2), nullptr)->info.id;
    ASSERT_TRUE(a.Evict(a_id, false).ok());
    EXPECT_FALSE(fs::exists(store_->PathOf(a_id)));
    EXPECT_TRUE(fs::exists(store_->PathOf(b_id)));
  }
  PoolManager& b = Restart();
  EXPECT_EQ(store_->count(), 1u);
  ASSERT_TRUE(b.Evict(b_id.substr(0, 10), false).ok()) << "not restored, still evictable";
  EXPECT_FALSE(fs::exists(store_->PathOf(b_id)));
  EXPECT_EQ(store_->count(), 0u);
  EXPECT_EQ(b.Attach(b_id, 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b.Evict(b_id, false).code(), absl::StatusCode::kNotFound);
}

TEST_F(PoolStoreTest, CorruptFileIsQuarantinedAndNeverServed) {
  std::string id;
  {
    PoolManager& a = Restart();
    id = a.CreatePool(CreateRequest("k8v3"), nullptr)->info.id;
  }
  const std::string file = state_ + "/pools/" + id + ".pkv";
  std::string bytes = support::ReadFile(file);
  bytes[bytes.size() - 100] ^= 0x04;  // one bit of the last layer
  { std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes; }
  PoolManager& b = Restart();
  EXPECT_EQ(store_->count(), 1u) << "the manifest is intact; the region is checked on use";
  auto g = b.Attach(id, 1);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kDataLoss) << g.status();
  EXPECT_FALSE(fs::exists(file));
  EXPECT_EQ(FilesIn(state_ + "/quarantine"), 1u);
  EXPECT_EQ(store_->quarantined(), 1u);
  EXPECT_EQ(store_->count(), 0u);
  EXPECT_TRUE(b.List().empty());
  EXPECT_EQ(b.memory_used(), 0u) << "the reservation was released";
  EXPECT_TRUE(testing::MemfdObjects(prefix_).empty()) << "the memfd was closed";
  // The next create prefills again and persists a good file.
  auto r = b.CreatePool(CreateRequest("k8v3"), nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->restored);
  EXPECT_TRUE(fs::exists(file));

  // A truncated file is caught by the scan at start.
  bytes = support::ReadFile(file);
  { std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2); }
  Restart();
  EXPECT_EQ(store_->count(), 0u);
  EXPECT_EQ(store_->quarantined(), 1u);
  EXPECT_EQ(FilesIn(state_ + "/quarantine"), 2u);
  EXPECT_FALSE(fs::exists(file));
}

// Issue 29: right after a restart the daemon lists its persisted pools (with their parent)
// without restoring them; a quarantined file is listed with why, also after a further restart.
TEST_F(PoolStoreTest, CatalogListsPersistedPoolsAfterRestartWithoutRestoring) {
  std::string root, child, other;
  {
    PoolManager& a = Restart();
    auto r = a.CreatePool(CreateRequest("k8v3"), nullptr);
    ASSERT_TRUE(r.ok()) << r.status();
    root = r->info.id;
    ipc::Request c;
    c.type = ipc::MessageType::kCreatePool;
    c.parent = root;
    c.codec = "";
    c.token_ids = {7, 8, 9, 10, 11};
    auto rc = a.CreatePool(c, nullptr);
    ASSERT_TRUE(rc.ok()) << rc.status();
    child = rc->info.id;
    auto ro = a.CreatePool(CreateRequest("k8v3", 5), nullptr);
    ASSERT_TRUE(ro.ok()) << ro.status();
    other = ro->info.id;
    std::vector<ipc::PoolInfo> before = a.Catalog();
    ASSERT_EQ(before.size(), 3u);
    for (const auto& p : before) EXPECT_EQ(p.state, "memory") << p.id;
  }
  PoolManager& b = Restart();
  std::vector<ipc::PoolInfo> list = b.Catalog();
  ASSERT_EQ(list.size(), 3u);
  for (const std::string& id : {root, child, other}) {
    const ipc::PoolInfo* p = FindIn(list, id);
    ASSERT_NE(p, nullptr) << id;
    EXPECT_EQ(p->state, "disk");
    EXPECT_EQ(p->state_detail, store_->PathOf(id));
    EXPECT_EQ(p->leases, 0u);
    EXPECT_GT(p->total_bytes, 0u);
  }
  EXPECT_EQ(FindIn(list, child)->parent, root);
  EXPECT_EQ(FindIn(list, root)->parent, "");
  EXPECT_EQ(b.memory_used(), 0u) << "listing restores nothing";
  EXPECT_EQ(b.restored_count(), 0u);
  EXPECT_TRUE(b.List().empty());
  auto shown = b.Describe(child.substr(0, 12));
  ASSERT_TRUE(shown.ok()) << shown.status();
  EXPECT_EQ(shown->id, child);
  EXPECT_EQ(shown->state, "disk");
  EXPECT_EQ(b.Info(child).status().code(), absl::StatusCode::kNotFound) << "not published";
  // /metrics names every pool with its state and parent.
  Metrics metrics;
  const std::string text = metrics.Render(b, store_.get());
  EXPECT_NE(text.find("polykv_pools_by_state{state=\"disk\"} 3"), std::string::npos) << text;
  EXPECT_NE(text.find("polykv_pools_by_state{state=\"memory\"} 0"), std::string::npos);
  EXPECT_NE(text.find(absl::StrCat("polykv_pool_state{pool=\"", child,
                                   "\",state=\"disk\",parent=\"", root, "\"} 1")),
            std::string::npos)
      << text;

  // Attaching the child restores the chain: both move to "memory", the third stays on disk.
  auto g = b.Attach(child, 1);
  ASSERT_TRUE(g.ok()) << g.status();
  list = b.Catalog();
  ASSERT_EQ(list.size(), 3u) << "each pool once";
  EXPECT_EQ(FindIn(list, root)->state, "memory");
  EXPECT_EQ(FindIn(list, child)->state, "memory");
  EXPECT_EQ(FindIn(list, other)->state, "disk");
  ASSERT_TRUE(b.Detach(g->lease_id).ok());

  // A corrupt manifest is quarantined by the next start's scan and listed with why, and so
  // it stays after another restart (the reason is kept beside the file).
  const std::string file = store_->PathOf(other);
  std::string bytes = support::ReadFile(file);
  bytes[ipc::kPoolFilePrelude + 2] ^= 0x20;
  { std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes; }
  for (int restart = 0; restart < 2; ++restart) {
    PoolManager& c = Restart();
    list = c.Catalog();
    ASSERT_EQ(list.size(), 3u) << "restart " << restart;
    const ipc::PoolInfo* q = FindIn(list, other);
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->state, "quarantined");
    EXPECT_NE(q->state_detail.find("/quarantine/" + other + ".pkv."), std::string::npos)
        << q->state_detail;
    EXPECT_NE(q->state_detail.find("checksum"), std::string::npos) << q->state_detail;
    auto d = c.Describe(other);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->state, "quarantined");
    EXPECT_EQ(c.Attach(other, 1).status().code(), absl::StatusCode::kNotFound);
  }
}

// Issue 29: Evict reads the state folder before it takes the pool lock, so a slow disk stalls
// only the evict, not every other request. A FIFO named like a pool file stands in for a
// read that does not come back (its open blocks until a writer appears).
TEST_F(PoolStoreTest, EvictReadsTheStateFolderOutsideThePoolLock) {
  PoolManager& m = Restart();
  auto r = m.CreatePool(CreateRequest("k8v3"), nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string stuck_id(64, 'a');
  const std::string fifo = store_->PathOf(stuck_id);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::thread evict(
      [&] { EXPECT_EQ(m.Evict(stuck_id, false).code(), absl::StatusCode::kNotFound); });
  // Give the evict time to reach the read, then ask for what every client asks for.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto list = std::async(std::launch::async, [&] { return m.List().size(); });
  auto attach = std::async(std::launch::async, [&] { return m.Attach(r->info.id, 1).ok(); });
  const bool answered = list.wait_for(std::chrono::seconds(5)) == std::future_status::ready &&
                        attach.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  // Let the read finish: a writer that writes nothing (the "file" is then truncated).
  const int w = open(fifo.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(w, 0);
  close(w);
  evict.join();
  ASSERT_TRUE(answered) << "List/Attach waited for the evict's disk read";
  EXPECT_EQ(list.get(), 1u);
  EXPECT_TRUE(attach.get());
  EXPECT_FALSE(fs::exists(fifo)) << "the unreadable file went to quarantine";
}

TEST_F(PoolStoreTest, AbsentOrChangedModelIsRefusedAndTheFileKept) {
  const std::string model = dir_.path() + "/model";
  fs::create_directories(model);
  for (const char* f : {"config.json", "model.safetensors"}) {
    fs::copy_file(testing::Stories260K() + "/" + f, model + "/" + f);
  }
  std::string id;
  {
    PoolManager& a = Restart();
    auto req = CreateRequest("k8v3");
    req.model = model;
    auto r = a.CreatePool(req, nullptr);
    ASSERT_TRUE(r.ok()) << r.status();
    id = r->info.id;
  }
  // Changed: the same path now holds another file (one more newline in config.json).
  { std::ofstream(model + "/config.json", std::ios::app) << "\n"; }
  PoolManager& b = Restart();
  auto g = b.Attach(id, 1);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition) << g.status();
  EXPECT_NE(std::string(g.status().message()).find("different model"), std::string::npos)
      << g.status();
  EXPECT_TRUE(fs::exists(store_->PathOf(id)));
  EXPECT_EQ(store_->quarantined(), 0u);
  // Absent.
  fs::remove_all(model);
  PoolManager& c = Restart();
  g = c.Attach(id, 1);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition) << g.status();
  EXPECT_NE(std::string(g.status().message()).find("absent"), std::string::npos) << g.status();
  EXPECT_TRUE(fs::exists(store_->PathOf(id)));
  EXPECT_EQ(c.PreloadPersisted(), 0);
  EXPECT_TRUE(c.List().empty());
}

TEST_F(PoolStoreTest, DiskBudgetEvictsTheLeastRecentlyUsedFile) {
  std::vector<std::string> ids;
  uint64_t file_bytes = 0;
  {
    PoolManager& a = Restart();
    auto r = a.CreatePool(CreateRequest("k8v3", 1), nullptr);
    ASSERT_TRUE(r.ok());
    ids.push_back(r->info.id);
    file_bytes = store_->bytes();
  }
  // Budget of two files (all three pools have the same size).
  PoolManager& a = Restart(2 * file_bytes);
  for (int salt : {2, 3}) {
    if (salt == 3) store_->Touch(ids[0]);  // pool 1 used after pool 2
    auto r = a.CreatePool(CreateRequest("k8v3", salt), nullptr);
    ASSERT_TRUE(r.ok()) << r.status();
    ids.push_back(r->info.id);
  }
  EXPECT_EQ(store_->count(), 2u);
  EXPECT_EQ(store_->bytes(), 2 * file_bytes);
  EXPECT_EQ(store_->evicted_for_budget(), 1u);
  EXPECT_TRUE(fs::exists(store_->PathOf(ids[0])));
  EXPECT_FALSE(fs::exists(store_->PathOf(ids[1]))) << "the least recently used one went";
  EXPECT_TRUE(fs::exists(store_->PathOf(ids[2])));
  EXPECT_EQ(a.List().size(), 2u) << "in memory, pools stay until evicted";
  // A budget smaller than one pool: the pool is served but not persisted.
  PoolManager& b = Restart(file_bytes / 2);
  EXPECT_EQ(store_->count(), 0u) << "the scan enforces the new budget";
  auto r = b.CreatePool(CreateRequest("k8v3", 4), nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(store_->count(), 0u);
}

}  // namespace
}  // namespace polykv::daemon
