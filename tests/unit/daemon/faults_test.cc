// Regression tests for the faults of issue 16 that show in one process: model files that
// block or are spelled differently (D2, D3), documents with NUL bytes or invalid UTF-8
// (D4, D5), pool memory that someone tries to change (D7, D8), roles and model folders
// (D9), the bounded create queue (D10), shutdown with creates in flight (D1, D2), and the
// minor ones (echoed input, lease-expiry log lines, lease counts).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "daemon.h"
#include "daemon_fixture.h"
#include "fake_model.h"
#include "pool_manager.h"
#include "process_util.h"
#include "test_util.h"

namespace polykv::daemon {
namespace {

namespace fs = std::filesystem;
using testing::CreateRequest;
using testing::FakeLoader;
using testing::Gate;
using testing::LlamaConfig;
using testing::MemfdObjects;
using testing::RawClient;
using testing::ShmObjects;
using testing::TempDir;

// Writes `bytes` to `path` (a failure fails the test) and returns `path`.
std::string WriteFile(const std::string& path, const std::string& bytes) {
  EXPECT_TRUE(support::WriteFile(path, bytes).ok()) << path;
  return path;
}

ipc::Request TextRequest(const std::string& model, const std::string& document) {
  ipc::Request r;
  r.type = ipc::MessageType::kCreatePool;
  r.model = model;
  r.document = document;
  r.codec = "k8v3";
  return r;
}

class PoolManagerFaults : public testing::PoolManagerTestBase {
 protected:
  PoolManagerFaults() : PoolManagerTestBase("pf") {}
  void SetUp() override {
    PoolManagerTestBase::SetUp();
    model_ = WriteFile(dir_.path() + "/m.gguf", "not really a model: the loader is a fake");
  }
  PoolManager& Make(PoolManagerOptions o = {}) {
    if (!o.loader) o.loader = loader_.Get();
    return MakeManager(std::move(o));
  }
  TempDir dir_;
  std::string model_;
  FakeLoader loader_;
};

// D2: a FIFO as model blocked open(2) for ever; now it is refused without blocking.
TEST_F(PoolManagerFaults, FifoModelIsRefusedWithoutBlocking) {
  PoolManager& m = Make();
  const std::string fifo = dir_.path() + "/m-fifo.gguf";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto r = m.CreatePool(TextRequest(fifo, "hello"), nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("not a regular file or a folder"),
            std::string::npos)
      << r.status();
  // A folder holding a FIFO (the HF loader would open it by name) is refused as well.
  const std::string folder = dir_.path() + "/hf";
  fs::create_directory(folder);
  ASSERT_EQ(mkfifo((folder + "/model.safetensors").c_str(), 0600), 0);
  WriteFile(folder + "/config.json", "{}");
  r = m.CreatePool(TextRequest(folder, "hello"), nullptr);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("model.safetensors"), std::string::npos)
      << r.status();
}

// D3: one load per file, however it is spelled; bounded; counted.
TEST_F(PoolManagerFaults, ModelCacheIsKeyedByFileIdentityBoundedAndCounted) {
  PoolManagerOptions o;
  o.model_cache_models = 1;
  PoolManager& m = Make(o);
  ASSERT_EQ(symlink(model_.c_str(), (dir_.path() + "/link.gguf").c_str()), 0);
  const std::string spellings[] = {model_, dir_.path() + "/./m.gguf", dir_.path() + "//m.gguf",
                                   dir_.path() + "/link.gguf"};
  for (const auto& path : spellings) {
    auto r = m.CreatePool(TextRequest(path, "the same document"), nullptr);
    ASSERT_TRUE(r.ok()) << path << ": " << r.status();
  }
  EXPECT_EQ(loader_.loads->load(), 1) << "four spellings of one file, one load";
  ModelCacheStats cache = m.model_cache();
  EXPECT_EQ(cache.models, 1u);
  EXPECT_EQ(cache.capacity, 1u);
  testing::FakeModel probe("x");
  EXPECT_EQ(cache.bytes, ModelWeightBytes(probe.config(), kernels::DType::kF32));
  EXPECT_EQ(cache.mapped_bytes, 0u) << "a libtorch copy holds private memory, nothing mapped";
  EXPECT_GT(cache.bytes, 0u);
  // Another file: the cache holds one model, so the first is dropped (LRU) ...
  const std::string other = WriteFile(dir_.path() + "/other.gguf", "another file");
  ASSERT_TRUE(m.CreatePool(TextRequest(other, "doc two"), nullptr).ok());
  EXPECT_EQ(loader_.loads->load(), 2);
  EXPECT_EQ(m.model_cache().models, 1u);
  // ... and loaded again when used again.
  ASSERT_TRUE(m.CreatePool(TextRequest(model_, "doc three"), nullptr).ok());
  EXPECT_EQ(loader_.loads->load(), 3);
  // A file replaced in place (new mtime/size) is a new model, not the stale one.
  WriteFile(model_, "a different model file, longer than before");
  ASSERT_TRUE(m.CreatePool(TextRequest(model_, "doc four"), nullptr).ok());
  EXPECT_EQ(loader_.loads->load(), 4);
}

TEST(ModelWeightBytesTest, CountsEveryTensorOnce) {
  model::ModelConfig c =
      LlamaConfig(/*layers=*/2, /*hidden=*/4, /*heads=*/2, /*kv_heads=*/1, /*ffn=*/8, /*vocab=*/10);
  c.tied_embeddings = true;
  // embed 40 + norm 4 + 2 x (norms 8 + qkv (2+2)*2*4=32 + o 4*4=16 + 3*8*4=96) = 348
  EXPECT_EQ(ModelWeightBytes(c, kernels::DType::kF32), 348u * 4);
  c.tied_embeddings = false;
  EXPECT_EQ(ModelWeightBytes(c, kernels::DType::kBF16), (348u + 40) * 2);
}

// D4: "A\0B" and "A" are different documents, hence different pools.
TEST_F(PoolManagerFaults, DocumentWithNulBytesIsNotCut) {
  PoolManager& m = Make();
  auto a = m.CreatePool(TextRequest(model_, std::string("A")), nullptr);
  auto ab = m.CreatePool(TextRequest(model_, std::string("A\0B", 3)), nullptr);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(ab.ok()) << ab.status();
  EXPECT_NE(a->info.id, ab->info.id);
  EXPECT_GT(ab->info.tokens, a->info.tokens);
  // The same holds over the wire: the JSON frame carries the NUL and the byte count.
  ipc::Request req = TextRequest(model_, std::string("A\0B", 3));
  auto back = ipc::DecodeRequest(ipc::EncodeRequest(req));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->document, std::string("A\0B", 3));
  EXPECT_EQ(back->document_bytes, 3u);
}

// D5: invalid UTF-8 is refused with its byte offset, never replaced.
TEST_F(PoolManagerFaults, InvalidUtf8DocumentIsRefusedWithOffset) {
  PoolManager& m = Make();
  auto r = m.CreatePool(TextRequest(model_, "caf\xe9"), nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "the document is not valid UTF-8 at byte offset 3 (byte 0xe9); send UTF-8 text, or "
            "token ids");
  EXPECT_TRUE(m.List().empty());
  // Valid text that differs only in those bytes gives different pools.
  auto e9 = m.CreatePool(TextRequest(model_, "caf\xc3\xa9"), nullptr);
  auto e8 = m.CreatePool(TextRequest(model_, "caf\xc3\xa8"), nullptr);
  ASSERT_TRUE(e9.ok() && e8.ok());
  EXPECT_NE(e9->info.id, e8->info.id);
}

// D9: model folders - canonical paths, no escape through "..", symlinks or folder entries,
// and the same answer for paths outside whether or not they exist.
TEST_F(PoolManagerFaults, ModelsAreOpenedOnlyUnderTheModelFolders) {
  const std::string root = dir_.path() + "/models";
  const std::string secret = dir_.path() + "/secret";
  fs::create_directories(root + "/sub");
  fs::create_directories(secret);
  WriteFile(root + "/sub/good.gguf", "model bytes");
  WriteFile(secret + "/private.gguf", "someone else's file");
  ASSERT_EQ(symlink((secret + "/private.gguf").c_str(), (root + "/escape.gguf").c_str()), 0);
  fs::create_directories(root + "/hf");
  WriteFile(root + "/hf/config.json", "{}");
  ASSERT_EQ(symlink((secret + "/private.gguf").c_str(), (root + "/hf/model.safetensors").c_str()),
            0);
  PoolManagerOptions o;
  o.models_dirs = {root};
  PoolManager& m = Make(o);
  Requester stranger{4242, /*trusted_paths=*/false};
  auto create = [&](const std::string& model) {
    return m.CreatePool(TextRequest(model, "doc"), nullptr, stranger).status();
  };
  EXPECT_TRUE(create("sub/good.gguf").ok()) << create("sub/good.gguf");
  EXPECT_TRUE(create(root + "/sub/good.gguf").ok());
  EXPECT_TRUE(create(root + "/sub/../sub/good.gguf").ok());
  const std::string outside = "is outside the model folders (--models-dir " + root + ")";
  for (const std::string& path :
       {secret + "/private.gguf", secret + "/does-not-exist.gguf", root + "/../secret/private.gguf",
        std::string("../secret/private.gguf"), std::string("/etc/shadow")}) {
    Status s = create(path);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << path << ": " << s;
    EXPECT_EQ(std::string(s.message()), "model \"" + path + "\" " + outside) << path;
  }
  Status link = create("escape.gguf");
  EXPECT_EQ(link.code(), absl::StatusCode::kPermissionDenied) << link;
  EXPECT_NE(std::string(link.message()).find("through a symlink"), std::string::npos) << link;
  Status entry = create("hf");
  EXPECT_EQ(entry.code(), absl::StatusCode::kPermissionDenied) << entry;
  EXPECT_NE(std::string(entry.message()).find("symlink to a path outside"), std::string::npos);
  Status missing = create("sub/missing.gguf");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_EQ(loader_.loads->load(), 1) << "only the good model was ever loaded";
}

TEST_F(PoolManagerFaults, WithoutModelFoldersOnlyTrustedUidsNameModels) {
  PoolManager& m = Make();
  Requester stranger{4242, /*trusted_paths=*/false};
  Status s = m.CreatePool(TextRequest(model_, "doc"), nullptr, stranger).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(std::string(s.message()).find("has no --models-dir"), std::string::npos) << s;
  EXPECT_EQ(loader_.loads->load(), 0);
  EXPECT_TRUE(m.CreatePool(TextRequest(model_, "doc"), nullptr).ok()) << "trusted by default";
}

// D7: nobody can change a published pool, not even this process (the daemon's uid).
TEST_F(PoolManagerFaults, PublishedPoolCannotBeWrittenEvenByItsOwner) {
  PoolManager& m = Make();
  auto r = m.CreatePool(TextRequest(model_, "a pool that must not change"), nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(MemfdObjects(prefix_).size(), 1u) << "a memfd: no named segment to open O_RDWR";
  auto g = m.Attach(r->info.id, 0);
  ASSERT_TRUE(g.ok());
  auto fd = m.PoolFd(g->lease_id);
  ASSERT_TRUE(fd.ok()) << fd.status();
  const int seals = ipc::GetSeals(fd->get());
  EXPECT_EQ(seals & ipc::kPoolSealsRequired, ipc::kPoolSealsRequired);
  EXPECT_TRUE(seals & F_SEAL_SEAL) << "seals cannot be removed or changed";
  const std::string junk(200000, 'X');
  errno = 0;
  EXPECT_EQ(pwrite(fd->get(), junk.data(), junk.size(), 12288), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(ftruncate(fd->get(), 4096), -1);
  EXPECT_EQ(ftruncate(fd->get(), 1 << 30), -1);
  EXPECT_EQ(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd->get(), 0), MAP_FAILED);
  EXPECT_EQ(errno, EPERM);
  // Re-opening through /proc gives a new open file description: still sealed.
  const std::string proc = "/proc/self/fd/" + std::to_string(fd->get());
  int rw = open(proc.c_str(), O_RDWR);
  ASSERT_GE(rw, 0);
  EXPECT_EQ(pwrite(rw, junk.data(), junk.size(), 12288), -1);
  EXPECT_EQ(errno, EPERM);
  close(rw);
  // A read-only mapping cannot be upgraded either.
  auto region = ipc::SealedRegion::MapSealed(*std::move(fd), 0);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_NE(mprotect(const_cast<void*>(region->data()), 4096, PROT_READ | PROT_WRITE), 0);
  auto reader = ipc::PoolReader::Open(region->data(), region->size(), /*verify_payload=*/true);
  EXPECT_TRUE(reader.ok()) << reader.status();
}

// The minor faults: echoed input is capped; one log line per lease sweep; exact counts.
TEST_F(PoolManagerFaults, ManyExpiredLeasesGiveOneLogLineAndExactCounts) {
  // Leases long enough for the set-up to finish before any expires (also under sanitizers).
  PoolManagerOptions o;
  o.lease_ms = 4000;
  PoolManager& m = Make(o);
  auto r = m.CreatePool(TextRequest(model_, "doc"), nullptr);
  ASSERT_TRUE(r.ok());
  std::vector<std::string> leases;
  for (int i = 0; i < 1000; ++i) leases.push_back(m.Attach(r->info.id, 1)->lease_id);
  for (int i = 0; i < 250; ++i) ASSERT_TRUE(m.Detach(leases[i]).ok());
  EXPECT_EQ(m.Info(r->info.id)->leases, 750u);
  EXPECT_EQ(m.lease_count(), 750u);
  for (int i = 250; i < 300; ++i) ASSERT_TRUE(m.Renew(leases[i]).ok());
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  auto old = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", sink));
  spdlog::set_level(spdlog::level::info);
  std::this_thread::sleep_for(std::chrono::milliseconds(4300));
  EXPECT_EQ(m.SweepExpiredLeases(), 750);
  spdlog::set_default_logger(old);
  const std::string text = log.str();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text.substr(0, 400);
  EXPECT_NE(text.find("750 lease(s) expired"), std::string::npos) << text;
  EXPECT_EQ(m.Info(r->info.id)->leases, 0u);
  EXPECT_EQ(m.lease_count(), 0u);
  EXPECT_TRUE(m.Evict(r->info.id, false).ok()) << "no live lease is left to block it";
}

TEST_F(PoolManagerFaults, HugePoolIdIsNotEchoedBack) {
  PoolManager& m = Make();
  const std::string huge(10 << 20, 'a');
  Status s = m.Attach(huge, 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_LT(s.message().size(), 256u);
  ipc::Reply reply =
      ipc::ErrorReply(ipc::MessageType::kAttach, 1, absl::NotFoundError("unknown pool " + huge));
  EXPECT_LT(ipc::EncodeReply(reply).size(), 2 * ipc::kMaxErrorBytes);
}

// ---------------------------------------------------------------------------------------
// The control server in this process, with a fake model.

class DaemonFaults : public testing::InProcessDaemonTest {
 protected:
  DaemonFaults() : InProcessDaemonTest("df") {}
  void SetUp() override {
    InProcessDaemonTest::SetUp();
    model_ = WriteFile(dir_.path() + "/m.gguf", "fake");
  }
  void StartDaemon(DaemonOptions o = {}) {
    if (!o.loader) o.loader = loader_.Get();
    Serve(std::move(o));
  }
  ipc::Request Create(const std::string& doc) {
    ipc::Request r = TextRequest(model_, doc);
    r.progress = true;
    return r;
  }
  std::string model_;
  FakeLoader loader_;
};

int Threads() {
  int n = 0;
  for (auto& e : fs::directory_iterator("/proc/self/task")) n += e.is_directory();
  return n;
}

// D10: a fixed number of workers and a bounded queue; only running creates hold memory.
TEST_F(DaemonFaults, CreatesAreQueuedBoundedAndReserveOnlyWhenTheyRun) {
  Gate prefill;
  loader_.before_prefill = [&] { prefill.Wait(); };
  DaemonOptions o;
  o.create_workers = 1;
  o.max_queued_creates = 2;
  StartDaemon(o);
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < 4; ++i) clients.push_back(std::make_unique<RawClient>(dir_.endpoint()));
  RawClient probe(dir_.endpoint());
  const int threads_before = Threads();
  for (int i = 0; i < 4; ++i) {
    ipc::Request r = Create("document number " + std::to_string(i));
    r.id = 100 + i;
    clients[i]->SendFrame(ipc::EncodeRequest(r));
    if (i == 0) {  // let the first one reach its prefill before queueing the others
      for (int k = 0; k < 500 && prefill.entered() == 0; ++k) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      ASSERT_EQ(prefill.entered(), 1);
    }
  }
  // One of the three others is refused at once (which one depends on the order the
  // daemon reads them in): one create runs, two wait.
  std::vector<int> accepted = {0};
  int refused = -1;
  for (int i = 1; i < 4; ++i) {
    auto f = clients[i]->RecvFrame(5000);
    ASSERT_TRUE(f.has_value()) << "no answer to create " << i;
    auto r = ipc::DecodeReply(*f);
    ASSERT_TRUE(r.ok());
    if (r->type == ipc::MessageType::kProgress) {
      EXPECT_EQ(r->stage, "queued");
      accepted.push_back(i);
      continue;
    }
    EXPECT_EQ(refused, -1) << "only one create may be refused";
    refused = i;
    EXPECT_EQ(r->code, "RESOURCE_EXHAUSTED") << ipc::EncodeReply(*r);
    EXPECT_EQ(r->error,
              "the create queue is full (2 waiting, 1 running; --max-queued-creates 2): retry "
              "later");
  }
  ASSERT_NE(refused, -1);
  ASSERT_EQ(accepted.size(), 3u);
  auto ping = probe.Ping();
  ASSERT_TRUE(ping.ok() && ping->ok);
  EXPECT_EQ(ping->creates_running, 1u);
  EXPECT_EQ(ping->creates_queued, 2u);
  EXPECT_EQ(ping->create_queue_capacity, 2u);
  const uint64_t used_while_blocked = ping->memory_used;
  EXPECT_LE(Threads(), threads_before) << "no thread per create";
  prefill.Open();
  for (int i : accepted) {
    StatusOr<ipc::Reply> done = absl::UnknownError("no reply");
    std::string seen;
    for (int k = 0; k < 200; ++k) {
      auto f = clients[i]->RecvFrame(10000);
      ASSERT_TRUE(f.has_value()) << "create " << i << " saw " << seen;
      seen += *f + "\n";
      done = ipc::DecodeReply(*f);
      if (done.ok() && done->type != ipc::MessageType::kProgress) break;
    }
    ASSERT_TRUE(done.ok());
    ASSERT_TRUE(done->ok) << i << ": " << done->error;
    // Only the running create had reserved memory (its own pool), none of the queued ones.
    if (i == 0) {
      EXPECT_EQ(used_while_blocked, done->pool->total_bytes);
    }
  }
}

// The value of an unlabelled sample in a Prometheus exposition, or -1 when absent.
double MetricValue(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  }
  return -1;
}

// Issue 29: identical creates coalesce before admission control. 32 clients create the same
// document at once with 2 workers and a queue of 8: every one succeeds with the one pool,
// the model runs once, and /metrics says 31 joined (before: 22 got RESOURCE_EXHAUSTED).
TEST_F(DaemonFaults, IdenticalCreatesCoalesceBeforeTheQueue) {
  Gate prefill;
  loader_.before_prefill = [&] { prefill.Wait(); };
  DaemonOptions o;
  o.create_workers = 2;
  o.max_queued_creates = 8;
  o.metrics_listen = "127.0.0.1:0";
  StartDaemon(o);
  constexpr int kClients = 32;
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<RawClient>(dir_.endpoint()));
  }
  for (int i = 0; i < kClients; ++i) {
    ipc::Request r = Create("the same document for everyone");
    r.id = 1000 + i;
    r.progress = i % 2 == 0;  // half of them without PROGRESS messages
    clients[i]->SendFrame(ipc::EncodeRequest(r));
    if (i == 0) {  // the first one is in its prefill before the others arrive
      for (int k = 0; k < 500 && prefill.entered() == 0; ++k) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      ASSERT_EQ(prefill.entered(), 1);
    }
  }
  RawClient probe(dir_.endpoint());
  // Every create is accepted: PING shows one running create and none queued (the joined
  // ones take no slot). Wait until the control loop has read all of them.
  const bool all_read = testing::WaitFor(
      [&] {
        auto ping = probe.Ping();
        return ping.ok() && ping->creates_running == 1 && ping->creates_queued == 0 &&
               MetricValue(
                   httplib::Client("127.0.0.1", daemon_->metrics_port()).Get("/metrics")->body,
                   "polykv_creates_coalesced_total") == kClients - 1;
      },
      10000);
  EXPECT_TRUE(all_read);
  prefill.Open();
  std::set<std::string> ids;
  int created = 0;
  for (int i = 0; i < kClients; ++i) {
    StatusOr<ipc::Reply> done = absl::UnknownError("no reply");
    for (int k = 0; k < 400; ++k) {
      auto f = clients[i]->RecvFrame(10000);
      ASSERT_TRUE(f.has_value()) << "no answer to create " << i;
      done = ipc::DecodeReply(*f);
      ASSERT_TRUE(done.ok());
      if (done->type != ipc::MessageType::kProgress) break;
      EXPECT_TRUE(i % 2 == 0) << "PROGRESS only to those who asked";
      EXPECT_EQ(done->id, 1000u + i);
    }
    ASSERT_TRUE(done->ok) << i << ": " << done->code << " " << done->error;
    EXPECT_EQ(done->id, 1000u + i) << "each answer under its own request id";
    ASSERT_TRUE(done->pool.has_value());
    ids.insert(done->pool->id);
    created += done->created ? 1 : 0;
  }
  EXPECT_EQ(ids.size(), 1u) << "one id";
  EXPECT_EQ(created, 1) << "one create made it, the others joined";
  EXPECT_EQ(daemon_->pools().List().size(), 1u) << "one pool";
  EXPECT_EQ(prefill.entered(), 1) << "one prefill";
  auto metrics = httplib::Client("127.0.0.1", daemon_->metrics_port()).Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(MetricValue(metrics->body, "polykv_prefills_total"), 1) << metrics->body;
  EXPECT_EQ(MetricValue(metrics->body, "polykv_creates_coalesced_total"), kClients - 1);
  EXPECT_EQ(MetricValue(metrics->body, "polykv_errors_total"), -1) << "no error reply at all";

  // Distinct work still takes queue slots: the same document with another codec is not joined.
  prefill.Open();
  RawClient other(dir_.endpoint());
  ipc::Request r = Create("the same document for everyone");
  r.codec = "none";
  auto reply = other.Call(r, 20000);
  ASSERT_TRUE(reply.ok() && reply->ok) << (reply.ok() ? reply->error : reply.status().ToString());
  EXPECT_TRUE(reply->created);
  EXPECT_EQ(prefill.entered(), 2);
}

// D1 + D2: SIGTERM answers in-flight creates with CANCELLED and does not wait for ever on a
// worker stuck in the model loader.
TEST_F(DaemonFaults, ShutdownCancelsCreatesAndDoesNotWaitForABlockedWorker) {
  Gate load;
  loader_.before_load = [&] { load.Wait(); };
  DaemonOptions o;
  o.create_workers = 1;
  o.shutdown_grace_seconds = 0.3;
  StartDaemon(o);
  RawClient stuck(dir_.endpoint()), waiting(dir_.endpoint());
  stuck.SendFrame(ipc::EncodeRequest(Create("first")));
  for (int k = 0; k < 500 && load.entered() == 0; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(load.entered(), 1) << "the worker is inside the (blocked) loader";
  waiting.SendFrame(ipc::EncodeRequest(Create("second")));
  // Heartbeats keep coming while the worker is stuck.
  int heartbeats = 0;
  for (int k = 0; k < 50 && heartbeats < 2; ++k) {
    auto f = stuck.RecvFrame(3000);
    ASSERT_TRUE(f.has_value()) << "silence while a create is in flight";
    auto r = ipc::DecodeReply(*f);
    ASSERT_TRUE(r.ok());
    heartbeats += r->heartbeat;
  }
  EXPECT_EQ(heartbeats, 2);
  daemon_->Stop();
  thread_.join();  // returns although the worker is still blocked
  for (RawClient* c : {&stuck, &waiting}) {
    StatusOr<ipc::Reply> last = absl::UnknownError("no reply");
    for (int k = 0; k < 50; ++k) {
      auto f = c->RecvFrame(5000);
      ASSERT_TRUE(f.has_value()) << "no CANCELLED reply before the socket closed";
      last = ipc::DecodeReply(*f);
      if (last.ok() && last->type != ipc::MessageType::kProgress) break;
    }
    ASSERT_TRUE(last.ok());
    EXPECT_EQ(last->code, "CANCELLED") << last->error;
  }
  EXPECT_FALSE(fs::exists(dir_.socket()));
  daemon_.reset();
  // Let the left-behind worker finish: it finds the manager shut down, drops the last
  // reference to it (destroying the model), and ends; the test must outlive it.
  load.Open();
  EXPECT_TRUE(testing::WaitFor(
      [&] { return loader_.made->load() == 1 && loader_.live->load() == 0; }, 30000));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

// D9: readers may look and attach; only operators create and evict.
TEST_F(DaemonFaults, ReadersCannotCreateOrEvict) {
  DaemonOptions o;
  o.reader_uids = {static_cast<uint32_t>(getuid())};
  StartDaemon(o);
  RawClient c(dir_.endpoint());
  auto ping = c.Ping();
  ASSERT_TRUE(ping.ok());
  EXPECT_TRUE(ping->ok) << ping->error;
  EXPECT_TRUE(c.List()->ok);
  auto created = c.Call(Create("doc"));
  ASSERT_TRUE(created.ok());
  EXPECT_EQ(created->code, "PERMISSION_DENIED");
  EXPECT_NE(created->error.find("may not CREATE_POOL: it is a reader, not an operator"),
            std::string::npos)
      << created->error;
  ipc::Request evict;
  evict.type = ipc::MessageType::kEvict;
  evict.pool_id = std::string(64, 'a');
  evict.force = true;
  EXPECT_EQ(c.Call(evict)->code, "PERMISSION_DENIED");
  EXPECT_EQ(loader_.loads->load(), 0);
}

TEST_F(DaemonFaults, OperatorsByGidCreateAndPingReportsTheModelCache) {
  DaemonOptions o;
  o.operator_gids = {static_cast<uint32_t>(getgid())};
  StartDaemon(o);
  RawClient c(dir_.endpoint());
  auto created = c.Call(Create("doc"), 20000);
  ASSERT_TRUE(created.ok());
  ASSERT_TRUE(created->ok) << created->error;
  auto ping = c.Ping();
  ASSERT_TRUE(ping.ok() && ping->ok);
  EXPECT_EQ(ping->model_cache_models, 1u);
  EXPECT_EQ(ping->model_cache_capacity, 2u);
  EXPECT_GT(ping->model_cache_bytes, 0u);
  EXPECT_EQ(ping->instance, daemon_->instance());
  EXPECT_EQ(ping->instance.size(), 32u);
}

// D7 through the descriptor socket: the agent path, and a lease is required.
TEST_F(DaemonFaults, DescriptorSocketNeedsALiveLeaseAndHandsOutSealedMemory) {
  StartDaemon();
  RawClient c(dir_.endpoint());
  auto created = c.Call(Create("doc"), 20000);
  ASSERT_TRUE(created.ok() && created->ok);
  auto bad = ipc::RequestPoolFd(daemon_->fd_socket(), std::string(32, '0'), 2000);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound) << bad.status();
  auto a = c.Attach(created->pool->id);
  ASSERT_TRUE(a.ok() && a->ok);
  auto region = testing::MapPool(a->memory->fd_socket, a->lease_id);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ(region->size(), created->pool->total_bytes);
  ASSERT_TRUE(c.Detach(a->lease_id)->ok);
  auto after = ipc::RequestPoolFd(daemon_->fd_socket(), a->lease_id, 2000);
  EXPECT_EQ(after.status().code(), absl::StatusCode::kNotFound) << "lease gone, no descriptor";
}

}  // namespace
}  // namespace polykv::daemon
