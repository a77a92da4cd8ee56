// libpolykv_client against a scripted fake daemon: status strings, thread-local errors, Lazy
// Pirate (dead endpoint, dropped and stale replies), PROGRESS streaming, creates and their
// options, the PoolInfo C struct. Attached pools: client_pool_test.cc.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fake_daemon.h"
#include "polykv/client.h"
#include "polykv/client.hpp"
#include "polykv/ipc/pool_layout.h"
#include "polykv/ipc/protocol.h"
#include "polykv/ipc/sealed_region.h"
#include "polykv/ipc/shm_region.h"
#include "polykv/pool_info_c.h"
#include "support/pool_info.h"

namespace polykv::client {
namespace {

using support::TestPoolInfo;
using testing::FakeDaemon;
using Clock = std::chrono::steady_clock;

TEST(ClientStatusTest, NamesEveryCode) {
  const std::array<const char*, 16> names = {"OK",
                                             "CANCELLED",
                                             "UNKNOWN",
                                             "INVALID_ARGUMENT",
                                             "DEADLINE_EXCEEDED",
                                             "NOT_FOUND",
                                             "ALREADY_EXISTS",
                                             "PERMISSION_DENIED",
                                             "RESOURCE_EXHAUSTED",
                                             "FAILED_PRECONDITION",
                                             "ABORTED",
                                             "OUT_OF_RANGE",
                                             "UNIMPLEMENTED",
                                             "INTERNAL",
                                             "UNAVAILABLE",
                                             "DATA_LOSS"};
  for (int i = 0; i < 16; ++i) {
    EXPECT_STREQ(polykv_status_string(static_cast<polykv_status>(i)), names[i]) << i;
  }
  EXPECT_STREQ(polykv_status_string(static_cast<polykv_status>(99)), "UNKNOWN_STATUS");
  EXPECT_STREQ(polykv_status_string(static_cast<polykv_status>(-1)), "UNKNOWN_STATUS");
}

TEST(ClientStatusTest, LastErrorIsPerThread) {
  EXPECT_EQ(polykv_connect(nullptr, 100, nullptr), POLYKV_INVALID_ARGUMENT);
  EXPECT_STREQ(polykv_last_error(), "polykv_connect: out is NULL");
  std::string other = "unset";
  std::thread([&] { other = polykv_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_STREQ(polykv_last_error(), "polykv_connect: out is NULL");
}

TEST(ClientStatusTest, NullHandlesAreRejectedNotCrashing) {
  polykv_pool_info info = polykv_pool_info_init();
  EXPECT_EQ(polykv_ping(nullptr, nullptr), POLYKV_INVALID_ARGUMENT);
  EXPECT_EQ(polykv_list_pools(nullptr, nullptr, 0, nullptr), POLYKV_INVALID_ARGUMENT);
  EXPECT_EQ(polykv_pool_get_info(nullptr, &info), POLYKV_INVALID_ARGUMENT);
  EXPECT_EQ(polykv_decode_layer(nullptr, 0, nullptr, nullptr, POLYKV_DTYPE_F32),
            POLYKV_INVALID_ARGUMENT);
  EXPECT_EQ(polykv_pool_lease_status(nullptr), POLYKV_INVALID_ARGUMENT);
  EXPECT_EQ(polykv_detach(nullptr), POLYKV_OK);
  polykv_disconnect(nullptr);
}

TEST(ClientLazyPirateTest, MissingSocketFailsUnavailableWithoutWaiting) {
  const std::string path = "/tmp/polykv-client-test-dead-" + std::to_string(getpid()) + ".sock";
  polykv_client* c = reinterpret_cast<polykv_client*>(0x1);
  // A minute per try: were the socket not checked first, this would take 3 minutes and run
  // into ctest's timeout.
  EXPECT_EQ(polykv_connect(("ipc://" + path).c_str(), 60000, &c), POLYKV_UNAVAILABLE);
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(std::string(polykv_last_error()),
            "no polykvd socket at " + path + " (is the daemon running?)");
}

// A socket file nobody listens on: what a SIGKILLed daemon leaves behind.
std::string StaleSocket(const std::string& path) {
  ::unlink(path.c_str());
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ::close(fd);  // bound, never listened: connect() gets ECONNREFUSED
  return path;
}

TEST(ClientLazyPirateTest, StaleSocketOfDeadDaemonFailsUnavailableWithoutWaiting) {
  const std::string path =
      StaleSocket("/tmp/polykv-client-test-stale-" + std::to_string(getpid()) + ".sock");
  polykv_client* c = nullptr;
  EXPECT_EQ(polykv_connect(("ipc://" + path).c_str(), 60000, &c), POLYKV_UNAVAILABLE);
  EXPECT_EQ(std::string(polykv_last_error()),
            "nothing is listening on " + path + " (the daemon is not running; stale socket)");
  ::unlink(path.c_str());
}

TEST(ClientLazyPirateTest, SocketWithoutPermissionIsPermissionDeniedNotUnavailable) {
  FakeDaemon daemon(FakeDaemon::AlwaysOk());
  const std::string path = daemon.endpoint().substr(6);
  // Connecting needs write permission on the socket file; root ignores modes, so the check
  // runs in a child process that drops to uid 65534 when we are root.
  ASSERT_EQ(chmod(path.c_str(), 0000), 0);
  pid_t child = fork();
  if (child == 0) {
    if (getuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(90);
    polykv_client* c = nullptr;
    polykv_status s = polykv_connect(daemon.endpoint().c_str(), 60000, &c);
    const std::string msg = polykv_last_error();
    _exit(s == POLYKV_PERMISSION_DENIED &&
                  msg.rfind("cannot connect to " + path + ": Permission denied", 0) == 0
              ? 0
              : 10 + static_cast<int>(s));
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "child got status " << WEXITSTATUS(status) - 10 << " (7 = PERMISSION_DENIED)";
}

TEST(ClientLazyPirateTest, SilentDaemonFailsUnavailableAfterThreeTries) {
  FakeDaemon daemon([](const ipc::Request&) { return std::vector<ipc::Reply>{}; });
  polykv_client* c = reinterpret_cast<polykv_client*>(0x1);
  EXPECT_EQ(polykv_connect(daemon.endpoint().c_str(), 100, &c), POLYKV_UNAVAILABLE);
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(std::string(polykv_last_error()).find(daemon.endpoint()), std::string::npos)
      << polykv_last_error();
  EXPECT_NE(std::string(polykv_last_error()).find("after 3 tries of 100 ms"), std::string::npos)
      << polykv_last_error();
  EXPECT_EQ(daemon.Count(ipc::MessageType::kPing), 3);
}

TEST(ClientLazyPirateTest, RetriesAfterDroppedRequestAndIgnoresStaleReplies) {
  std::atomic<int> pings{0};
  FakeDaemon daemon([&](const ipc::Request& req) -> std::vector<ipc::Reply> {
    int n = pings++;
    if (n == 0) return {};  // drop the first try: the client must resend on a new socket
    ipc::Reply stale = FakeDaemon::OkReply(req);
    stale.id = req.id + 1000;  // a reply to some other request: must be ignored
    stale.daemon_version = "stale";
    ipc::Reply good = FakeDaemon::OkReply(req);
    good.daemon_version = "9.8.7";
    good.daemon_pid = 4242;
    good.memory_used = 123;
    good.memory_cap = 456;
    return {stale, good};
  });
  polykv_client* c = nullptr;
  ASSERT_EQ(polykv_connect(daemon.endpoint().c_str(), 200, &c), POLYKV_OK) << polykv_last_error();
  polykv_daemon_info info;
  ASSERT_EQ(polykv_ping(c, &info), POLYKV_OK) << polykv_last_error();
  EXPECT_STREQ(info.version, "9.8.7");
  EXPECT_EQ(info.pid, 4242u);
  EXPECT_EQ(info.memory_used, 123u);
  EXPECT_EQ(info.memory_cap, 456u);
  polykv_disconnect(c);
  auto reqs = daemon.requests();
  ASSERT_EQ(reqs.size(), 3u);         // dropped connect ping, its retry, the explicit ping
  EXPECT_EQ(reqs[0].id, reqs[1].id);  // the retry resends the same request
  EXPECT_NE(reqs[1].id, reqs[2].id);
}

// Issue 29: an ATTACH that the daemon answers only after replicating the pool from a peer
// (here 4 s, twice the client's 2 s per try) asks for progress, waits on the heartbeats and
// gets the daemon's own answer, sent once. Before, the client resent the ATTACH after each
// try and ended UNAVAILABLE "no reply ... after 3 tries" while the daemon was still working.
TEST(ClientLazyPirateTest, AttachThatReplicatesWaitsOnHeartbeatsForTheAnswer) {
  FakeDaemon daemon([](const ipc::Request& req) -> std::vector<ipc::Reply> {
    if (req.type != ipc::MessageType::kAttach) return {FakeDaemon::OkReply(req)};
    std::vector<ipc::Reply> out;
    ipc::Reply beat;
    beat.type = ipc::MessageType::kProgress;
    beat.id = req.id;
    beat.stage = "fetch";
    beat.heartbeat = true;
    for (int s = 0; s < 4; ++s) {  // what polykvd sends while a worker replicates
      if (req.progress) out.push_back(beat);
      out.push_back(FakeDaemon::Pause(1000));
    }
    out.push_back(ipc::ErrorReply(
        req.type, req.id,
        absl::NotFoundError("pool eeee is not held here nor by any peer (tcp://a: NOT_FOUND)")));
    return out;
  });
  polykv_client* c = nullptr;
  ASSERT_EQ(polykv_connect(daemon.endpoint().c_str(), 2000, &c), POLYKV_OK) << polykv_last_error();
  polykv_pool* pool = nullptr;
  EXPECT_EQ(polykv_attach(c, std::string(64, 'e').c_str(), &pool), POLYKV_NOT_FOUND)
      << polykv_last_error();
  EXPECT_NE(std::string(polykv_last_error()).find("not held here nor by any peer"),
            std::string::npos)
      << polykv_last_error();
  EXPECT_EQ(daemon.Count(ipc::MessageType::kAttach), 1) << "sent once, not resent per try";
  EXPECT_TRUE(daemon.requests().back().progress) << "heartbeats asked for";
  EXPECT_EQ(pool, nullptr);
  polykv_disconnect(c);
}

TEST(ClientLazyPirateTest, ErrorRepliesKeepCodeAndMessage) {
  FakeDaemon daemon([&](const ipc::Request& req) -> std::vector<ipc::Reply> {
    if (req.type == ipc::MessageType::kPing) return {FakeDaemon::OkReply(req)};
    return {ipc::ErrorReply(req.type, req.id, absl::NotFoundError("no pool " + req.pool_id))};
  });
  auto client = Client::Connect(daemon.endpoint(), 500);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  const std::string id(64, 'a');
  auto info = client->GetPoolInfo(id);
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(info.status().message(), "unknown pool " + id + " (daemon: no pool " + id + ")");
  Status evicted = client->Evict(id, true);
  EXPECT_EQ(evicted.code(), StatusCode::kNotFound);
  EXPECT_EQ(evicted.ToString(), "NOT_FOUND: unknown pool " + id + " (daemon: no pool " + id + ")");
  EXPECT_EQ(daemon.requests().back().force, true);
  auto attached = client->Attach(id);
  ASSERT_FALSE(attached.ok());
  EXPECT_EQ(attached.status().code(), StatusCode::kNotFound);
  auto bad = client->Attach("");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

TEST(ClientCreateTest, StreamsProgressAndReturnsInfo) {
  const std::string id(64, 'b');
  FakeDaemon daemon([&](const ipc::Request& req) -> std::vector<ipc::Reply> {
    if (req.type != ipc::MessageType::kCreatePool) return {FakeDaemon::OkReply(req)};
    std::vector<ipc::Reply> out;
    for (int done : {2, 5}) {
      ipc::Reply p = FakeDaemon::OkReply(req);
      p.type = ipc::MessageType::kProgress;
      p.stage = "prefill";
      p.done = done;
      p.total = 5;
      out.push_back(p);
    }
    ipc::Reply r = FakeDaemon::OkReply(req);
    r.pool = TestPoolInfo(id);
    r.created = true;
    out.push_back(r);
    return out;
  });
  auto client = Client::Connect(daemon.endpoint(), 500);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  CreateOptions opts;
  opts.model = "m";
  opts.token_ids = {1, 2, 3, 4, 5};
  opts.codec = "none";
  opts.key_scale = "head";
  opts.norm_correction = true;
  opts.add_bos = false;
  std::vector<std::string> progress;
  auto created = client->CreatePool(opts, [&](const std::string& s, int64_t d, int64_t t) {
    progress.push_back(s + " " + std::to_string(d) + "/" + std::to_string(t));
  });
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_TRUE(created->created);
  EXPECT_EQ(created->info.id, id);
  EXPECT_EQ(created->info.key_codes_bytes, 1u);
  EXPECT_EQ(created->info.value_norms_bytes, 4u);
  EXPECT_EQ(created->info.overhead_bytes, 5u);
  EXPECT_EQ(created->info.created_unix_ms, 1700000000123);
  EXPECT_DOUBLE_EQ(created->info.publish_ms, 3.5);
  EXPECT_EQ(progress, (std::vector<std::string>{"prefill 2/5", "prefill 5/5"}));
  const ipc::Request sent = daemon.requests().back();
  EXPECT_EQ(sent.type, ipc::MessageType::kCreatePool);
  EXPECT_EQ(sent.token_ids, (std::vector<int32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(sent.codec, "none");
  EXPECT_EQ(sent.key_scale, "head");
  EXPECT_TRUE(sent.norm_correction);
  EXPECT_FALSE(sent.add_bos);
  EXPECT_TRUE(sent.progress);
}

TEST(ClientCreateTest, RejectsBadOptionsBeforeSending) {
  FakeDaemon daemon(FakeDaemon::AlwaysOk());
  auto client = Client::Connect(daemon.endpoint(), 500);
  ASSERT_TRUE(client.ok());
  CreateOptions opts;
  opts.model = "m";
  EXPECT_EQ(client->CreatePool(opts).status().ToString(),
            "INVALID_ARGUMENT: create: no document text and no token ids given");
  opts.document = "text";
  opts.token_ids = {1};
  // The C++ wrapper sends token ids when given; the C API rejects both at once.
  polykv_create_options o;
  polykv_create_options_init(&o);
  o.model = "m";
  o.document = "text";
  int32_t ids[1] = {1};
  o.token_ids = ids;
  o.token_count = 1;
  EXPECT_EQ(polykv_create_pool(client->get(), &o, nullptr, nullptr, nullptr, nullptr),
            POLYKV_INVALID_ARGUMENT);
  EXPECT_STREQ(polykv_last_error(), "create: give either a document or token ids, not both");
  o.document = nullptr;
  o.codec = "k8v9";
  EXPECT_EQ(polykv_create_pool(client->get(), &o, nullptr, nullptr, nullptr, nullptr),
            POLYKV_INVALID_ARGUMENT);
  // Checked with the daemon's codec grammar, before anything is sent.
  const std::string err = polykv_last_error();
  EXPECT_EQ(err.rfind("create: codec 'k8v9'", 0), 0u) << err;
  EXPECT_NE(err.find("k8v3"), std::string::npos) << err;
  o.codec = "k7c-v3-e4x3-nc-n16-norot-zz";
  EXPECT_EQ(polykv_create_pool(client->get(), &o, nullptr, nullptr, nullptr, nullptr),
            POLYKV_INVALID_ARGUMENT);
  o.codec = "k8v3";
  o.struct_version = 7;
  EXPECT_EQ(polykv_create_pool(client->get(), &o, nullptr, nullptr, nullptr, nullptr),
            POLYKV_INVALID_ARGUMENT);
  EXPECT_EQ(daemon.Count(ipc::MessageType::kCreatePool), 0);
}

TEST(ClientCreateTest, CreateTimeoutIsDeadlineExceeded) {
  FakeDaemon daemon([&](const ipc::Request& req) -> std::vector<ipc::Reply> {
    if (req.type == ipc::MessageType::kPing) return {FakeDaemon::OkReply(req)};
    return {};  // never answers the create
  });
  auto client = Client::Connect(daemon.endpoint(), 500);
  ASSERT_TRUE(client.ok());
  CreateOptions opts;
  opts.model = "m";
  opts.token_ids = {1, 2};
  opts.timeout_ms = 300;
  auto created = client->CreatePool(opts);
  EXPECT_EQ(created.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(daemon.Count(ipc::MessageType::kCreatePool), 1);  // a create is never resent
}

// ---- polykv_pool_info: every field of the list, and a struct_size that must fit ---------

// Field number `n` of POLYKV_POOL_INFO_FIELDS as a value no other field has; strings fit
// the smallest C array (backend[8]).
template <typename T>
void SetDistinct(T* field, int n) {
  if constexpr (std::is_same_v<T, std::string>) {
    *field = "s" + std::to_string(n);
  } else {
    *field = static_cast<T>(1000 * n + 7);
  }
}

ipc::PoolInfo EveryFieldSet() {
  ipc::PoolInfo p;
  int n = 0;
#define POLYKV_SET(type, name, json_key, c_name) SetDistinct(&p.name, ++n);
  POLYKV_POOL_INFO_FIELDS(POLYKV_SET)
#undef POLYKV_SET
  return p;
}

template <size_t N>
void ExpectCopied(const char (&c)[N], const std::string& value, const char* key) {
  EXPECT_EQ(std::string(c), value) << key;
}
template <typename T>
void ExpectCopied(const T& c, const T& value, const char* key) {
  EXPECT_EQ(c, value) << key;
}

// Every C member holds its own field's value (the list's c_name mapping).
void ExpectEveryField(const polykv_pool_info& c, const ipc::PoolInfo& p) {
#define POLYKV_EXPECT(type, name, json_key, c_name) ExpectCopied(c.c_name, p.name, json_key);
  POLYKV_POOL_INFO_FIELDS(POLYKV_EXPECT)
#undef POLYKV_EXPECT
}

TEST(ClientPoolInfoTest, CConversionCopiesEveryField) {
  const ipc::PoolInfo p = EveryFieldSet();
  polykv_pool_info c;
  std::memset(&c, 0xab, sizeof(c));
  ToCPoolInfo(p, &c);
  EXPECT_EQ(c.struct_size, sizeof(polykv_pool_info));
  ExpectEveryField(c, p);
  // The members whose C name differs, by name.
  EXPECT_EQ(c.key_codes_bytes, p.key_codes);
  EXPECT_EQ(c.overhead_bytes, p.overhead);
  EXPECT_STREQ(c.origin, "s32");
  // And back: the same PoolInfo, field by field.
  const ipc::PoolInfo back = FromCPoolInfo(c);
#define POLYKV_EXPECT_SAME(type, name, json_key, c_name) EXPECT_EQ(back.name, p.name) << json_key;
  POLYKV_POOL_INFO_FIELDS(POLYKV_EXPECT_SAME)
#undef POLYKV_EXPECT_SAME
  // A string longer than its array is cut, NUL-terminated.
  ipc::PoolInfo long_backend = p;
  long_backend.backend = "abcdefghijk";
  ToCPoolInfo(long_backend, &c);
  EXPECT_STREQ(c.backend, "abcdefg");
}

TEST(ClientPoolInfoTest, LibraryFillsEveryFieldThroughTheWire) {
  const ipc::PoolInfo p = EveryFieldSet();
  FakeDaemon daemon([&](const ipc::Request& req) -> std::vector<ipc::Reply> {
    ipc::Reply r = FakeDaemon::OkReply(req);
    if (req.type == ipc::MessageType::kStats) r.pool = p;
    if (req.type == ipc::MessageType::kList) r.pools = {p, p};
    return {r};
  });
  polykv_client* c = nullptr;
  ASSERT_EQ(polykv_connect(daemon.endpoint().c_str(), 500, &c), POLYKV_OK) << polykv_last_error();
  polykv_pool_info info = polykv_pool_info_init();
  ASSERT_EQ(polykv_pool_info_by_id(c, p.id.c_str(), &info), POLYKV_OK) << polykv_last_error();
  EXPECT_EQ(info.struct_size, sizeof(polykv_pool_info));
  ExpectEveryField(info, p);
  polykv_pool_info list[2] = {polykv_pool_info_init(), polykv_pool_info_init()};
  size_t count = 0;
  ASSERT_EQ(polykv_list_pools(c, list, 2, &count), POLYKV_OK) << polykv_last_error();
  ASSERT_EQ(count, 2u);
  ExpectEveryField(list[1], p);
  EXPECT_EQ(list[1].struct_size, sizeof(polykv_pool_info));
  polykv_disconnect(c);
}

TEST(ClientPoolInfoTest, StructSizeOutsideTheKnownVersionsIsRefusedBeforeSending) {
  FakeDaemon daemon([&](const ipc::Request& req) -> std::vector<ipc::Reply> {
    return {FakeDaemon::OkReply(req)};
  });
  polykv_client* c = nullptr;
  ASSERT_EQ(polykv_connect(daemon.endpoint().c_str(), 500, &c), POLYKV_OK) << polykv_last_error();
  const size_t v1 = offsetof(polykv_pool_info, origin) + sizeof(polykv_pool_info::origin);
  const std::string id(64, 'a');
  polykv_pool_info info = polykv_pool_info_init();
  info.struct_size = 0;  // e.g. `polykv_pool_info info{};`
  EXPECT_EQ(polykv_pool_info_by_id(c, id.c_str(), &info), POLYKV_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(polykv_last_error()),
            absl::StrCat("polykv_pool_info_by_id: out->struct_size is 0, smaller than the first ",
                         "polykv_pool_info (", v1, " bytes): set it to ",
                         "sizeof(polykv_pool_info), e.g. with polykv_pool_info_init()"));
  info.struct_size = static_cast<uint32_t>(v1 - 1);
  EXPECT_EQ(polykv_list_pools(c, &info, 1, nullptr), POLYKV_INVALID_ARGUMENT);
  const std::string too_small =
      absl::StrCat("polykv_list_pools: infos[0]->struct_size is ", v1 - 1, ", smaller");
  EXPECT_EQ(std::string(polykv_last_error()).rfind(too_small, 0), 0u) << polykv_last_error();
  info.struct_size = sizeof(polykv_pool_info) + 8;  // built against a newer client.h
  EXPECT_EQ(polykv_fetch_pool(c, id.c_str(), nullptr, nullptr, &info, nullptr),
            POLYKV_INVALID_ARGUMENT);
  EXPECT_NE(std::string(polykv_last_error()).find("larger than this library's polykv_pool_info"),
            std::string::npos)
      << polykv_last_error();
  polykv_create_options o;
  polykv_create_options_init(&o);
  o.model = "m";
  o.document = "text";
  info.struct_size = 4;
  EXPECT_EQ(polykv_create_pool(c, &o, nullptr, nullptr, &info, nullptr), POLYKV_INVALID_ARGUMENT);
  polykv_peer_info peer = polykv_peer_info_init();
  peer.struct_size = 4;
  size_t peers = 0;
  EXPECT_EQ(polykv_daemon_peers(c, &peer, 1, &peers), POLYKV_INVALID_ARGUMENT);
  const std::string peers_error = polykv_last_error();
  EXPECT_EQ(peers_error.rfind("polykv_daemon_peers: peers[0]->struct_size is 4, smaller", 0), 0u)
      << peers_error;
  EXPECT_EQ(daemon.requests().size(), 1u) << "only polykv_connect's PING was sent";
  polykv_disconnect(c);
}

// ---- D1: a create notices a dead, hung or restarted daemon within seconds ------------

ipc::Reply Stamped(ipc::Reply r, const std::string& instance) {
  r.instance = instance;
  return r;
}

ipc::Reply Progress(const ipc::Request& req, const std::string& stage, bool heartbeat = false) {
  ipc::Reply p = FakeDaemon::OkReply(req);
  p.type = ipc::MessageType::kProgress;
  p.stage = stage;
  p.heartbeat = heartbeat;
  return p;
}

CreateOptions SomeCreate() {
  CreateOptions opts;
  opts.model = "m";
  opts.token_ids = {1, 2, 3};
  return opts;  // default timeout: 10 minutes
}

TEST(ClientCreateTest, RepliesFromAnotherDaemonInstanceAbortTheCreate) {
  const std::string a(32, 'a'), b(32, 'b');
  FakeDaemon daemon([&](const ipc::Request& req) -> std::vector<ipc::Reply> {
    if (req.type != ipc::MessageType::kCreatePool) return {Stamped(FakeDaemon::OkReply(req), a)};
    // The create is acknowledged by instance a, then word comes from instance b: the daemon
    // was restarted and the create is lost.
    return {Stamped(Progress(req, "queued"), a), Stamped(Progress(req, "prefill"), b)};
  });
  auto client = Client::Connect(daemon.endpoint(), 500);
  ASSERT_TRUE(client.ok());
  auto created = client->CreatePool(SomeCreate());
  EXPECT_EQ(created.status().code(), StatusCode::kAborted) << created.status().ToString();
  EXPECT_EQ(created.status().message(),
            "polykvd at " + daemon.endpoint() +
                " restarted while the CREATE_POOL was in progress (instance aaaaaaaa -> "
                "bbbbbbbb): the request was lost; send it again");
}

TEST(ClientCreateTest, SilenceThenAPingFromANewInstanceAbortsTheCreate) {
  const std::string a(32, 'a'), b(32, 'b');
  std::atomic<bool> restarted{false};
  FakeDaemon daemon([&](const ipc::Request& req) -> std::vector<ipc::Reply> {
    if (req.type == ipc::MessageType::kCreatePool) {
      restarted = true;  // from now on another instance answers, which knows no create
      return {};
    }
    return {Stamped(FakeDaemon::OkReply(req), restarted ? b : a)};
  });
  auto client = Client::Connect(daemon.endpoint(), 500);
  ASSERT_TRUE(client.ok());
  auto created = client->CreatePool(SomeCreate());
  EXPECT_EQ(created.status().code(), StatusCode::kAborted) << created.status().ToString();
  EXPECT_EQ(daemon.Count(ipc::MessageType::kCreatePool), 1) << "never resent";
  EXPECT_GE(daemon.Count(ipc::MessageType::kPing), 2) << "connect, then a ping in the silence";
}

TEST(ClientCreateTest, SilenceFromALiveDaemonFailsUnavailableInsteadOfWaitingTenMinutes) {
  const std::string a(32, 'a');
  FakeDaemon daemon([&](const ipc::Request& req) -> std::vector<ipc::Reply> {
    if (req.type != ipc::MessageType::kCreatePool) return {Stamped(FakeDaemon::OkReply(req), a)};
    return {Stamped(Progress(req, "queued"), a)};  // then nothing: a hung daemon
  });
  auto client = Client::Connect(daemon.endpoint(), 500);
  ASSERT_TRUE(client.ok());
  auto created = client->CreatePool(SomeCreate());
  EXPECT_EQ(created.status().code(), StatusCode::kUnavailable) << created.status().ToString();
  EXPECT_NE(created.status().message().find("no word from polykvd at " + daemon.endpoint()),
            std::string::npos)
      << created.status().message();
  EXPECT_NE(created.status().message().find("it sends a heartbeat every 1000 ms"),
            std::string::npos);
}

TEST(ClientCreateTest, HeartbeatsKeepALongCreateAliveAndAreNotShownAsProgress) {
  const std::string a(32, 'a');
  const std::string id(64, 'c');
  FakeDaemon daemon([&](const ipc::Request& req) -> std::vector<ipc::Reply> {
    if (req.type != ipc::MessageType::kCreatePool) return {Stamped(FakeDaemon::OkReply(req), a)};
    std::vector<ipc::Reply> out = {Stamped(Progress(req, "queued"), a)};
    for (int i = 0; i < 3; ++i) out.push_back(Stamped(Progress(req, "prefill", true), a));
    ipc::Reply r = FakeDaemon::OkReply(req);
    r.pool = TestPoolInfo(id);
    out.push_back(Stamped(r, a));
    return out;
  });
  auto client = Client::Connect(daemon.endpoint(), 500);
  ASSERT_TRUE(client.ok());
  std::vector<std::string> stages;
  auto created = client->CreatePool(
      SomeCreate(), [&](const std::string& s, int64_t, int64_t) { stages.push_back(s); });
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_EQ(stages, (std::vector<std::string>{"queued"}));
}

// ---- D4 / D5: the document arrives byte for byte, or is refused --------------------------

TEST(ClientCreateTest, DocumentWithNulBytesArrivesWhole) {
  FakeDaemon daemon([&](const ipc::Request& req) -> std::vector<ipc::Reply> {
    ipc::Reply r = FakeDaemon::OkReply(req);
    if (req.type == ipc::MessageType::kCreatePool) r.pool = TestPoolInfo(std::string(64, 'd'));
    return {r};
  });
  auto client = Client::Connect(daemon.endpoint(), 500);
  ASSERT_TRUE(client.ok());
  CreateOptions opts;
  opts.model = "m";
  opts.document = std::string("A\0B", 3);
  ASSERT_TRUE(client->CreatePool(opts).ok());
  // And through the C API with an explicit size.
  polykv_create_options o;
  polykv_create_options_init(&o);
  o.model = "m";
  const char doc[] = {'x', '\0', 'y', '\0', 'z'};
  ASSERT_EQ(polykv_create_pool_from_text(client->get(), &o, doc, sizeof(doc), nullptr, nullptr,
                                         nullptr, nullptr),
            POLYKV_OK)
      << polykv_last_error();
  std::vector<std::string> docs;
  for (const auto& r : daemon.requests()) {
    if (r.type == ipc::MessageType::kCreatePool) docs.push_back(r.document);
  }
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0], std::string("A\0B", 3));
  EXPECT_EQ(docs[1], std::string(doc, sizeof(doc)));
}

TEST(ClientCreateTest, InvalidUtf8DocumentIsRefusedWithItsByteOffset) {
  FakeDaemon daemon(FakeDaemon::AlwaysOk());
  auto client = Client::Connect(daemon.endpoint(), 500);
  ASSERT_TRUE(client.ok());
  CreateOptions opts;
  opts.model = "m";
  opts.document = "caf\xe9";
  auto created = client->CreatePool(opts);
  EXPECT_EQ(created.status().ToString(),
            "INVALID_ARGUMENT: create: the document is not valid UTF-8 at byte offset 3 (byte "
            "0xe9); send UTF-8 text, or token ids");
  opts.document = "ok \xf0\x9f\x98\x80 then \xed\xa0\x80";  // emoji, then a UTF-16 surrogate
  EXPECT_NE(client->CreatePool(opts).status().message().find("at byte offset 13"),
            std::string::npos);
  EXPECT_EQ(daemon.Count(ipc::MessageType::kCreatePool), 0) << "nothing altered is ever sent";
}

}  // namespace
}  // namespace polykv::client
