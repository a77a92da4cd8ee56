// polykvd in-process: the control protocol over a real ipc:// ROUTER (CREATE_POOL with
// progress, LIST/STATS, dedup, ATTACH/RENEW/DETACH, lease expiry, EVICT, memory cap,
// malformed/truncated/oversized frames), flags/config parsing, and uid refusal.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "daemon.h"
#include "daemon_fixture.h"
#include "polykv/model/llama.h"
#include "pool_manager.h"
#include "test_util.h"

namespace polykv::daemon {
namespace {

using testing::CreateRequest;
using testing::MemfdCountSettled;
using testing::MemfdObjects;
using testing::RawClient;
using testing::ShmObjects;
using testing::TempDir;

TEST(ParseByteSizeTest, Suffixes) {
  EXPECT_EQ(*ParseByteSize("0"), 0u);
  EXPECT_EQ(*ParseByteSize("1234"), 1234u);
  EXPECT_EQ(*ParseByteSize("4G"), 4ull << 30);
  EXPECT_EQ(*ParseByteSize("4GiB"), 4ull << 30);
  EXPECT_EQ(*ParseByteSize("512m"), 512ull << 20);
  EXPECT_EQ(*ParseByteSize("1.5K"), 1536u);
  EXPECT_EQ(*ParseByteSize("2GB"), 2000000000u);
  EXPECT_EQ(*ParseByteSize("1T"), 1ull << 40);
  EXPECT_EQ(ParseByteSize("4X").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseByteSize("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseByteSize("-1G").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseByteSize("G").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DaemonFlagsTest, FlagsAndConfigFile) {
  TempDir dir;
  const std::string conf = dir.path() + "/polykvd.conf";
  {
    std::ofstream f(conf);
    f << "endpoint = \"ipc:///tmp/x/control.sock\"\n"
         "backend = \"host\"\n"
         "memory-cap = \"4G\"\n"
         "lease-seconds = 12.5\n"
         "allow-uid = [1000, 1001]\n"
         "model-path = [\"/models\", \"/opt/models\"]\n"
         "threads = 2\n"
         "log-level = \"debug\"\n";
  }
  {
    DaemonOptions o;
    CLI::App app;
    AddDaemonFlags(app, o);
    std::vector<std::string> args = {"polykvd", "--config", conf};
    std::vector<const char*> argv;
    for (auto& a : args) argv.push_back(a.c_str());
    ASSERT_NO_THROW(app.parse(static_cast<int>(argv.size()), argv.data()));
    EXPECT_EQ(o.endpoint, "ipc:///tmp/x/control.sock");
    EXPECT_EQ(o.backend, "host");
    EXPECT_EQ(o.memory_cap, 4ull << 30);
    EXPECT_DOUBLE_EQ(o.lease_seconds, 12.5);
    EXPECT_EQ(o.allow_uids, (std::vector<uint32_t>{1000, 1001}));
    EXPECT_EQ(o.model_path, (std::vector<std::string>{"/models", "/opt/models"}));
    EXPECT_EQ(o.threads, 2);
    EXPECT_EQ(o.log_level, "debug");
  }
  {  // Command-line flags override the file.
    DaemonOptions o;
    CLI::App app;
    AddDaemonFlags(app, o);
    ASSERT_NO_THROW(app.parse(
        std::vector<std::string>{"--memory-cap=512M", "--backend=auto", "--config=" + conf}));
    EXPECT_EQ(o.memory_cap, 512ull << 20);
    EXPECT_EQ(o.backend, "auto");
  }
  {
    DaemonOptions o;
    CLI::App app;
    AddDaemonFlags(app, o);
    EXPECT_THROW(app.parse(std::vector<std::string>{"--memory-cap=4X"}), CLI::ValidationError);
  }
  {
    DaemonOptions o;
    CLI::App app;
    AddDaemonFlags(app, o);
    EXPECT_THROW(app.parse(std::vector<std::string>{"--backend=tpu"}), CLI::ValidationError);
  }
  {  // Where documents are prefilled: the host (default) or cuda (the GPU, cuda backend).
    DaemonOptions o;
    CLI::App app;
    AddDaemonFlags(app, o);
    EXPECT_EQ(o.prefill_device, "host");
    ASSERT_NO_THROW(app.parse(std::vector<std::string>{"--prefill-device=cuda"}));
    EXPECT_EQ(o.prefill_device, "cuda");
  }
  {
    DaemonOptions o;
    CLI::App app;
    AddDaemonFlags(app, o);
    EXPECT_THROW(app.parse(std::vector<std::string>{"--prefill-device=tpu"}), CLI::ValidationError);
  }
}

TEST(DaemonFlagsTest, RolesModelFoldersQueueAndTheShippedExampleConfig) {
  {
    DaemonOptions o;
    CLI::App app;
    AddDaemonFlags(app, o);
    ASSERT_NO_THROW(app.parse(std::vector<std::string>{
        "--shutdown-grace-seconds=2.5", "--model-cache-bytes=4G", "--model-cache-models=3",
        "--max-queued-creates=5", "--create-workers=3", "--reader-gid=1001", "--reader-uid=1000",
        "--operator-gid=1002", "--operator-uid=7", "--models-dir=/m2", "--models-dir=/m1",
        "--fd-socket=/run/x.fds"}));
    // (CLI11 parses the vector in reverse order.)
    EXPECT_EQ(o.models_dirs, (std::vector<std::string>{"/m1", "/m2"}));
    EXPECT_EQ(o.operator_uids, (std::vector<uint32_t>{7}));
    EXPECT_EQ(o.operator_gids, (std::vector<uint32_t>{1002}));
    EXPECT_EQ(o.reader_uids, (std::vector<uint32_t>{1000}));
    EXPECT_EQ(o.reader_gids, (std::vector<uint32_t>{1001}));
    EXPECT_EQ(o.create_workers, 3);
    EXPECT_EQ(o.max_queued_creates, 5);
    EXPECT_EQ(o.model_cache_models, 3u);
    EXPECT_EQ(o.model_cache_bytes, 4ull << 30);
    EXPECT_DOUBLE_EQ(o.shutdown_grace_seconds, 2.5);
    EXPECT_EQ(o.fd_socket, "/run/x.fds");
  }
  {
    DaemonOptions o;
    CLI::App app;
    AddDaemonFlags(app, o);
    const std::string conf = std::string(POLYKV_SOURCE_DIR) + "/systemd/polykvd.conf.example";
    ASSERT_NO_THROW(app.parse(std::vector<std::string>{"--config=" + conf})) << conf;
    EXPECT_EQ(o.models_dirs, (std::vector<std::string>{"/var/lib/polykv/models"}));
    EXPECT_EQ(o.max_queued_creates, 8);
    EXPECT_EQ(o.memory_cap, 8ull << 30);
  }
}

// A daemon serving on a temp-dir endpoint from a background thread.
class DaemonServerTest : public testing::InProcessDaemonTest {
 protected:
  DaemonServerTest() : InProcessDaemonTest("ds") {}
  void StartDaemon(uint64_t cap = 0, double lease_s = 30, std::vector<uint32_t> allow = {}) {
    DaemonOptions o;
    o.memory_cap = cap;
    o.lease_seconds = lease_s;
    o.allow_uids = std::move(allow);
    Serve(std::move(o));
  }
};

TEST_F(DaemonServerTest, PingListStats) {
  StartDaemon(1 << 30);
  struct stat st;
  ASSERT_EQ(stat(dir_.socket().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  RawClient c(dir_.endpoint());
  auto pong = c.Ping();
  ASSERT_TRUE(pong.ok()) << pong.status();
  EXPECT_TRUE(pong->ok);
  EXPECT_EQ(pong->daemon_pid, static_cast<uint32_t>(getpid()));
  EXPECT_FALSE(pong->daemon_version.empty());
  EXPECT_EQ(pong->memory_cap, 1u << 30);
  auto l = c.List();
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(l->ok);
  EXPECT_TRUE(l->pools.empty());
}

TEST_F(DaemonServerTest, CreateWithProgressThenListStatsAttach) {
  StartDaemon();
  RawClient c(dir_.endpoint());
  for (const char* codec : {"none", "k8v3"}) {
    auto req = CreateRequest(codec);
    req.progress = true;
    std::vector<ipc::Reply> progress;
    auto r = c.Call(req, 60000, &progress);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->ok) << r->code << ": " << r->error;
    EXPECT_TRUE(r->created);
    ASSERT_TRUE(r->pool.has_value());
    EXPECT_EQ(r->pool->codec, codec);
    EXPECT_EQ(r->pool->tokens, 40u);
    ASSERT_FALSE(progress.empty());
    // Acknowledged at once ("queued"), then the stages of the build.
    EXPECT_EQ(progress.front().stage, "queued");
    EXPECT_TRUE(std::any_of(progress.begin(), progress.end(),
                            [](const ipc::Reply& p) { return p.stage == "prefill"; }));
    for (const auto& p : progress) EXPECT_FALSE(p.instance.empty()) << "instance on every reply";
    EXPECT_EQ(progress.back().stage, "publish");
    EXPECT_EQ(progress.back().done, progress.back().total);
  }
  ipc::Request stats;
  stats.type = ipc::MessageType::kStats;
  auto s = c.Call(stats);
  ASSERT_TRUE(s.ok() && s->ok);
  ASSERT_EQ(s->pools.size(), 2u);
  EXPECT_EQ(s->memory_used, s->pools[0].total_bytes + s->pools[1].total_bytes);
  {
    // The model cache counts what the loaded model holds: stories260K's weights are used where
    // they lie in the file, so all of them are mapped bytes, in the file's own formats (f32
    // here; for a Q4_1 file this is the file's blocks, not a dequantized size).
    auto probe = model::LlamaModel::Load(testing::Stories260K());
    ASSERT_TRUE(probe.ok()) << probe.status();
    ASSERT_EQ((*probe)->weight_storage(), model::WeightStorage::kMapped);
    EXPECT_EQ(s->model_cache_models, 1u);
    EXPECT_EQ(s->model_cache_mapped_bytes, static_cast<uint64_t>((*probe)->WeightBytesPerToken()));
    EXPECT_EQ(s->model_cache_bytes, s->model_cache_mapped_bytes);
  }
  EXPECT_EQ(MemfdObjects(prefix_).size(), 2u) << "host pools are memfds";

  // Same create again -> same pool, created=false.
  auto again = c.Call(CreateRequest("k8v3"), 60000);
  ASSERT_TRUE(again.ok() && again->ok);
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->pool->id, s->pools[1].id);

  auto a = c.Attach(s->pools[1].id);
  ASSERT_TRUE(a.ok() && a->ok) << a->error;
  EXPECT_EQ(a->lease_id.size(), 32u);
  EXPECT_EQ(a->lease_ms, 30000);
  ASSERT_TRUE(a->memory.has_value());
  EXPECT_EQ(a->memory->backend, ipc::PoolMemory::kHost);
  EXPECT_EQ(a->memory->transport, "memfd");
  EXPECT_EQ(a->memory->fd_socket, dir_.socket() + ".fds");
  EXPECT_EQ(a->pool->leases, 1u);
  auto shm = testing::MapPool(a->memory->fd_socket, a->lease_id);
  ASSERT_TRUE(shm.ok()) << shm.status();
  EXPECT_TRUE(ipc::PoolReader::Open(shm->data(), shm->size(), true).ok());

  ipc::Request renew;
  renew.type = ipc::MessageType::kRenew;
  renew.lease_id = a->lease_id;
  auto rn = c.Call(renew);
  ASSERT_TRUE(rn.ok() && rn->ok);
  EXPECT_GE(rn->lease_expires_unix_ms, a->lease_expires_unix_ms);

  ipc::Request evict;
  evict.type = ipc::MessageType::kEvict;
  evict.pool_id = s->pools[1].id;
  auto ev = c.Call(evict);
  ASSERT_TRUE(ev.ok());
  EXPECT_FALSE(ev->ok);
  EXPECT_EQ(ev->code, "FAILED_PRECONDITION");

  auto dt = c.Detach(a->lease_id);
  ASSERT_TRUE(dt.ok() && dt->ok);
  auto ev2 = c.Call(evict);
  ASSERT_TRUE(ev2.ok() && ev2->ok) << ev2->error;
  auto rn2 = c.Call(renew);
  ASSERT_TRUE(rn2.ok());
  EXPECT_EQ(rn2->code, "NOT_FOUND");
  shm = absl::UnknownError("unmapped");
  EXPECT_EQ(MemfdCountSettled(prefix_, 1), 1u);
}

TEST_F(DaemonServerTest, ConcurrentCreatesFromTwoClientsYieldOnePool) {
  StartDaemon();
  StatusOr<ipc::Reply> r1 = absl::UnknownError(""), r2 = absl::UnknownError("");
  std::thread t1([&] {
    RawClient c(dir_.endpoint());
    r1 = c.Call(CreateRequest("k8v2"), 60000);
  });
  std::thread t2([&] {
    RawClient c(dir_.endpoint());
    r2 = c.Call(CreateRequest("k8v2"), 60000);
  });
  t1.join();
  t2.join();
  ASSERT_TRUE(r1.ok() && r2.ok());
  ASSERT_TRUE(r1->ok && r2->ok) << r1->error << r2->error;
  EXPECT_EQ(r1->pool->id, r2->pool->id);
  EXPECT_EQ(r1->created + r2->created, 1);
  EXPECT_EQ(MemfdObjects(prefix_).size(), 1u);
}

TEST_F(DaemonServerTest, ForcedEvictInvalidatesLeasesAndPingAnswersDuringCreate) {
  StartDaemon();
  RawClient c(dir_.endpoint());
  auto created = c.Call(CreateRequest("k8v3"), 60000);
  ASSERT_TRUE(created.ok() && created->ok);
  auto a = c.Attach(created->pool->id);
  ASSERT_TRUE(a.ok() && a->ok);
  ipc::Request evict;
  evict.type = ipc::MessageType::kEvict;
  evict.pool_id = created->pool->id;
  evict.force = true;
  auto ev = c.Call(evict);
  ASSERT_TRUE(ev.ok() && ev->ok) << ev->error;
  ipc::Request renew;
  renew.type = ipc::MessageType::kRenew;
  renew.lease_id = a->lease_id;
  auto rn = c.Call(renew);
  ASSERT_TRUE(rn.ok());
  EXPECT_FALSE(rn->ok);
  EXPECT_EQ(rn->code, "NOT_FOUND");
  EXPECT_NE(rn->error.find("pool evicted"), std::string::npos) << rn->error;
  EXPECT_TRUE(MemfdObjects(prefix_).empty());
  auto again = c.Attach(created->pool->id);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->code, "NOT_FOUND");
}

TEST_F(DaemonServerTest, LeaseExpiresWithoutRenew) {
  StartDaemon(0, /*lease_s=*/1.0);
  RawClient c(dir_.endpoint());
  auto created = c.Call(CreateRequest("k8v3"), 60000);
  ASSERT_TRUE(created.ok() && created->ok);
  auto a = c.Attach(created->pool->id);
  ASSERT_TRUE(a.ok() && a->ok);
  EXPECT_EQ(a->lease_ms, 1000);
  ipc::Request evict;
  evict.type = ipc::MessageType::kEvict;
  evict.pool_id = created->pool->id;
  EXPECT_EQ(c.Call(evict)->code, "FAILED_PRECONDITION");
  std::this_thread::sleep_for(std::chrono::milliseconds(1400));
  auto l = c.List();
  ASSERT_TRUE(l.ok() && l->ok);
  ASSERT_EQ(l->pools.size(), 1u);
  EXPECT_EQ(l->pools[0].leases, 0u);
  ipc::Request renew;
  renew.type = ipc::MessageType::kRenew;
  renew.lease_id = a->lease_id;
  EXPECT_EQ(c.Call(renew)->code, "NOT_FOUND");
  auto ev = c.Call(evict);
  EXPECT_TRUE(ev.ok() && ev->ok) << "an expired lease no longer blocks eviction";
}

TEST_F(DaemonServerTest, MemoryCapExceededIsAnErrorAndLeavesNothing) {
  StartDaemon(/*cap=*/4096 * 2);
  RawClient c(dir_.endpoint());
  auto r = c.Call(CreateRequest("none"), 60000);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->ok);
  EXPECT_EQ(r->code, "RESOURCE_EXHAUSTED");
  EXPECT_NE(r->error.find("cap 8192"), std::string::npos) << r->error;
  EXPECT_TRUE(c.List()->pools.empty());
  EXPECT_TRUE(MemfdObjects(prefix_).empty());
}

TEST_F(DaemonServerTest, BadFramesGetErrorsAndDaemonKeepsServing) {
  StartDaemon();
  RawClient c(dir_.endpoint());
  struct Case {
    std::string frame;
    std::string code;
  } cases[] = {
      {"not json at all", "INVALID_ARGUMENT"},
      {R"({"magic":"PKV1","version":1,"type":"PING","id":3)", "INVALID_ARGUMENT"},  // truncated
      {R"({"magic":"PKV1","version":7,"type":"PING","id":3})", "FAILED_PRECONDITION"},
      {R"({"magic":"NOPE","version":1,"type":"PING","id":3})", "INVALID_ARGUMENT"},
      {R"({"magic":"PKV1","version":1,"type":"FLY","id":3})", "INVALID_ARGUMENT"},
      {R"({"magic":"PKV1","version":1,"type":"ATTACH","id":3,"pool_id":[1]})", "INVALID_ARGUMENT"},
      {std::string("\xff\xfe\x00\x01", 4), "INVALID_ARGUMENT"},
      {std::string(ipc::kMaxMessageBytes + 100, ' '), "RESOURCE_EXHAUSTED"},
  };
  for (const auto& tc : cases) {
    c.SendFrame(tc.frame);
    auto f = c.RecvFrame(10000);
    ASSERT_TRUE(f.has_value()) << "no reply to " << tc.frame.substr(0, 60);
    auto r = ipc::DecodeReply(*f);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->ok);
    EXPECT_EQ(r->code, tc.code) << tc.frame.substr(0, 60) << " -> " << r->error;
    EXPECT_FALSE(r->error.empty());
  }
  // Wrong envelope: two JSON frames.
  c.SendRaw({"", "{}", "{}"});
  auto f = c.RecvFrame(5000);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(ipc::DecodeReply(*f)->code, "INVALID_ARGUMENT");
  // The same request id and type are echoed where readable.
  c.SendFrame(R"({"magic":"PKV1","version":1,"type":"EVICT","id":99})");
  f = c.RecvFrame(5000);
  ASSERT_TRUE(f.has_value());
  auto r = ipc::DecodeReply(*f);
  EXPECT_EQ(r->type, ipc::MessageType::kEvict);
  EXPECT_EQ(r->id, 99u);
  EXPECT_NE(r->error.find("pool_id"), std::string::npos);

  // 64 MiB: zmq drops it (over ZMQ_MAXMSGSIZE) or we reject it; either way keep serving.
  {
    RawClient big(dir_.endpoint());
    big.SendFrame(std::string(64u << 20, 'x'));
    auto reply = big.RecvFrame(3000);
    if (reply) {
      EXPECT_EQ(ipc::DecodeReply(*reply)->code, "RESOURCE_EXHAUSTED");
    }
  }
  auto pong = c.Ping();
  ASSERT_TRUE(pong.ok()) << pong.status();
  EXPECT_TRUE(pong->ok);
  RawClient fresh(dir_.endpoint());
  EXPECT_TRUE(fresh.Ping().ok());
}

TEST_F(DaemonServerTest, SecondDaemonOnLiveEndpointRefuses) {
  StartDaemon();
  DaemonOptions o;
  o.endpoint = dir_.endpoint();
  o.backend = "host";
  o.shm_prefix = prefix_;
  auto second = Daemon::Start(o);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(std::string(second.status().message()).find("another polykvd"), std::string::npos);
  RawClient c(dir_.endpoint());
  EXPECT_TRUE(c.Ping().ok()) << "the first daemon is unaffected";
}

TEST_F(DaemonServerTest, RefusesASocketFolderSomeoneElseOwns) {
  if (getuid() != 0) GTEST_SKIP() << "needs root to give a folder to another uid";
  TempDir d;
  const std::string dir = d.path() + "/theirs";
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  ASSERT_EQ(chown(dir.c_str(), 4242, 4242), 0);
  DaemonOptions o;
  o.endpoint = "ipc://" + dir + "/control.sock";
  o.backend = "host";
  o.shm_prefix = prefix_;
  auto owned = Daemon::Start(o);
  ASSERT_FALSE(owned.ok());
  EXPECT_EQ(owned.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(owned.status().message()).find("belongs to uid 4242"), std::string::npos)
      << owned.status();
}

TEST_F(DaemonServerTest, StopRemovesSocketPidAndSegments) {
  StartDaemon();
  {
    RawClient c(dir_.endpoint());
    ASSERT_TRUE(c.Call(CreateRequest("k8v3"), 60000)->ok);
  }
  EXPECT_EQ(MemfdObjects(prefix_).size(), 1u);
  EXPECT_EQ(access((dir_.socket() + ".pid").c_str(), F_OK), 0);
  EXPECT_EQ(access((dir_.socket() + ".fds").c_str(), F_OK), 0);
  StopDaemon();
  EXPECT_TRUE(MemfdObjects(prefix_).empty());
  EXPECT_NE(access(dir_.socket().c_str(), F_OK), 0);
  EXPECT_NE(access((dir_.socket() + ".pid").c_str(), F_OK), 0);
  EXPECT_NE(access((dir_.socket() + ".fds").c_str(), F_OK), 0);
}

TEST_F(DaemonServerTest, UidNotAllowedGetsPermissionDenied) {
  // Allow only a uid that is not ours: our own requests must be refused with a clear error.
  const uint32_t other = getuid() == 4242 ? 4243 : 4242;
  StartDaemon(0, 30, {other});
  RawClient c(dir_.endpoint());
  auto r = c.Ping();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->ok);
  EXPECT_EQ(r->code, "PERMISSION_DENIED");
  EXPECT_NE(r->error.find("uid " + std::to_string(getuid())), std::string::npos) << r->error;
}

}  // namespace
}  // namespace polykv::daemon
