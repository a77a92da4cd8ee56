// Two hosts on one machine: two network namespaces joined by a veth pair (made and removed by
// the test, as root; skipped visibly where namespaces cannot be made). polykvd A in the first
// prefills pools; an agent in the second, talking only to polykvd B, answers from them
// through replication (ZeroMQ CURVE between the daemons, UCX over TCP for the bytes; all
// traffic stays inside the test's namespaces). Asserted: the replica's bytes and checksum
// equal the original; the agent's greedy output equals an agent's on host A (codec none and
// K8/V3); killing daemon A mid-transfer gives the agent a clear error and leaves no pool and
// no segment on B; a daemon whose CURVE key A does not trust is refused; a daemon without
// keys refuses to listen on TCP.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

namespace polykv::testing {
namespace {

using nlohmann::json;

const char kIp[] = "/usr/sbin/ip";

/// Two namespaces A and B with a veth pair: A = 10.M.N.1, B = 10.M.N.2 (/30 from the pid).
class NamespacePair {
 public:
  NamespacePair() {
    const int pid = static_cast<int>(getpid());
    a_ = "pkvA" + std::to_string(pid);
    b_ = "pkvB" + std::to_string(pid);
    const std::string va = "pkva" + std::to_string(pid % 10000000);
    const std::string vb = "pkvb" + std::to_string(pid % 10000000);
    const std::string net = "10." + std::to_string(100 + (pid >> 14) % 100) + "." +
                            std::to_string((pid >> 6) % 256) + ".";
    const int host = (pid % 64) * 4;
    ip_a_ = net + std::to_string(host + 1);
    ip_b_ = net + std::to_string(host + 2);
    if (geteuid() != 0) {
      why_ = "needs root to create network namespaces";
      return;
    }
    if (access(kIp, X_OK) != 0) {
      why_ = "no /usr/sbin/ip (iproute2)";
      return;
    }
    const std::vector<std::vector<std::string>> steps = {
        {kIp, "netns", "add", a_},
        {kIp, "netns", "add", b_},
        {kIp, "link", "add", va, "type", "veth", "peer", "name", vb},
        {kIp, "link", "set", va, "netns", a_},
        {kIp, "link", "set", vb, "netns", b_},
        {kIp, "-n", a_, "addr", "add", ip_a_ + "/30", "dev", va},
        {kIp, "-n", b_, "addr", "add", ip_b_ + "/30", "dev", vb},
        {kIp, "-n", a_, "link", "set", va, "up"},
        {kIp, "-n", b_, "link", "set", vb, "up"},
        {kIp, "-n", a_, "link", "set", "lo", "up"},
        {kIp, "-n", b_, "link", "set", "lo", "up"},
    };
    for (const auto& argv : steps) {
      ProcessResult r = RunProcess(argv, dir_.path(), 20000);
      if (r.exit_code != 0) {
        why_ = "cannot set up network namespaces (" + argv[1] + " " + argv[2] + "): " + r.err;
        return;
      }
    }
    ok_ = true;
  }
  ~NamespacePair() {
    // Deleting a namespace removes the veth end inside it (and so the pair).
    for (const std::string& ns : {a_, b_})
      RunProcess({kIp, "netns", "del", ns}, dir_.path(), 20000);
  }
  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  std::vector<std::string> ExecA() const { return {kIp, "netns", "exec", a_}; }
  std::vector<std::string> ExecB() const { return {kIp, "netns", "exec", b_}; }
  const std::string& ip_a() const { return ip_a_; }
  const std::string& ip_b() const { return ip_b_; }

 private:
  TempDir dir_;
  std::string a_, b_, ip_a_, ip_b_, why_;
  bool ok_ = false;
};

/// Key pairs for daemons A, B and an untrusted C, and a peer-keys file trusting A and B.
struct Keys {
  Keys(const std::string& dir, const std::string& endpoint_a, const std::string& endpoint_b) {
    auto gen = [&](const std::string& name) {
      ProcessResult r = RunProcess({CliPath(), "keys", "generate", dir + "/" + name + ".key"}, dir);
      EXPECT_EQ(r.exit_code, 0) << r.err;
      std::string key = r.out.substr(0, r.out.find('\n'));
      EXPECT_EQ(key.size(), 40u) << r.out;
      return key;
    };
    const std::string a = gen("a"), b = gen("b"), c = gen("c");
    a_key = dir + "/a.key";
    b_key = dir + "/b.key";
    c_key = dir + "/c.key";
    peers = dir + "/peers";
    std::ofstream(peers) << "# the cluster\n"
                         << a << " " << endpoint_a << "\n"
                         << b << " " << endpoint_b << "\n";
    // C knows A's key, but A does not trust C.
    c_peers = dir + "/c-peers";
    std::ofstream(c_peers) << a << " " << endpoint_a << "\n" << c << "\n";
  }
  std::string a_key, b_key, c_key, peers, c_peers;
};

std::vector<int32_t> Document(int n, int salt) {
  std::vector<int32_t> ids = {1};
  for (int i = 1; i < n; ++i) ids.push_back((i * 53 + 7 * salt) % 500 + 3);
  return ids;
}

/// Greedy answer of a `polykv-cli agent` process (under `prefix`, e.g. in namespace B).
ProcessResult RunAgent(const std::vector<std::string>& prefix, const std::string& endpoint,
                       const std::string& pool, const std::string& dir) {
  std::vector<std::string> argv = prefix;
  for (const std::string& a :
       {CliPath(), std::string("agent"), std::string("--pool"), pool, std::string("--model"),
        StoriesPath(), std::string("--endpoint"), endpoint, std::string("--prompt-ids"),
        std::string("1,45,99,210"), std::string("--max-new-tokens"), std::string("24"),
        std::string("--ignore-eos"), std::string("--json"), std::string("--threads"),
        std::string("1")}) {
    argv.push_back(a);
  }
  return RunProcess(argv, dir, 120000);
}

/// Pool memfds a process holds as descriptors (support::MemfdUses; every daemon of this test
/// process has a prefix starting with ShmPrefix()).
int MemfdsOf(pid_t pid) {
  int n = 0;
  for (const support::MemfdUse& u : support::MemfdUses(ShmPrefix(), pid)) {
    n += u.where.rfind("fd ", 0) == 0 ? 1 : 0;
  }
  return n;
}

json PingJson(const std::string& endpoint, const std::string& dir) {
  ProcessResult r = RunProcess({CliPath(), "ping", "--endpoint", endpoint, "--json"}, dir, 20000);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  try {
    return json::parse(r.out);
  } catch (const std::exception&) {
    return json::object();
  }
}

/// Waits until daemon `endpoint` reports peer 0 in `state` (the ping thread runs every 0.2 s),
/// for 60 s at most (a deadline, not a count of tries: each try starts a polykv-cli process,
/// which a loaded machine can make slow; 100 tries of 0.1 s made the test flaky under load).
json WaitPeerState(const std::string& endpoint, const std::string& state, const std::string& dir) {
  json j;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  do {
    j = PingJson(endpoint, dir);
    if (j.contains("peers") && !j["peers"].empty() && j["peers"][0]["state"] == state) return j;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  } while (std::chrono::steady_clock::now() < deadline);
  return j;
}

class PeersNetns : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(DaemonPath()) || !fs::exists(CliPath())) GTEST_SKIP() << "not built";
    ns_ = std::make_unique<NamespacePair>();
    if (!ns_->ok()) GTEST_SKIP() << "network namespaces unavailable: " << ns_->why();
    // UCX over TCP only: the namespaces share this machine's memory, and a shared-memory
    // transport would bypass the network this test is about.
    setenv("UCX_TLS", "tcp", 1);
    const int port = 20000 + static_cast<int>(getpid() % 20000);
    endpoint_a_ = "tcp://" + ns_->ip_a() + ":" + std::to_string(port);
    endpoint_b_ = "tcp://" + ns_->ip_b() + ":" + std::to_string(port);
    keys_ = std::make_unique<Keys>(dir_.path(), endpoint_a_, endpoint_b_);
  }
  std::vector<std::string> FlagsA() const {
    return {
        "--listen", endpoint_a_, "--key-file", keys_->a_key, "--peer-keys-file", keys_->peers,
    };
  }
  std::vector<std::string> FlagsB(std::vector<std::string> more = {}) const {
    std::vector<std::string> f = {
        "--listen",   endpoint_b_,        "--peer",     endpoint_a_,           "--key-file",
        keys_->b_key, "--peer-keys-file", keys_->peers, "--peer-ping-seconds", "0.2"};
    f.insert(f.end(), more.begin(), more.end());
    return f;
  }
  TempDir dir_;
  std::unique_ptr<NamespacePair> ns_;
  std::unique_ptr<Keys> keys_;
  std::string endpoint_a_, endpoint_b_;
};

TEST_F(PeersNetns, AgentOnHostBAnswersFromHostAsPool) {
  Daemon a(30, FlagsA(), ns_->ExecA());
  ASSERT_TRUE(a.ready()) << a.log();
  Daemon b(30, FlagsB(), ns_->ExecB());
  ASSERT_TRUE(b.ready()) << b.log();
  json ping = WaitPeerState(b.endpoint(), "up", dir_.path());
  ASSERT_EQ(ping["peers"][0]["endpoint"], endpoint_a_) << ping.dump();
  ASSERT_EQ(ping["peers"][0]["state"], "up") << ping.dump() << b.log();
  for (const char* codec : {"none", "k8v3"}) {
    SCOPED_TRACE(codec);
    std::string err;
    const std::string pool = a.CreatePool(StoriesPath(), Document(200, 1), codec, &err);
    ASSERT_FALSE(pool.empty()) << err;
    const std::vector<int32_t> on_a =
        AgentAnswerIds(RunAgent(ns_->ExecA(), a.endpoint(), pool, dir_.path()));
    ASSERT_EQ(on_a.size(), 24u);
    EXPECT_EQ(b.Info(pool).id[0], '\0') << "B does not hold it before an agent asks";
    // The agent talks only to daemon B; B replicates the pool from A on the agent's attach.
    const std::vector<int32_t> on_b =
        AgentAnswerIds(RunAgent(ns_->ExecB(), b.endpoint(), pool, dir_.path()));
    EXPECT_EQ(on_b, on_a) << "greedy output through the replica equals host A's";
    const polykv_pool_info info = b.Info(pool);
    EXPECT_STREQ(info.id, pool.c_str());
    EXPECT_EQ(std::string(info.origin), "peer " + endpoint_a_);
    EXPECT_EQ(std::string(a.Info(pool).origin), "prefill");
    EXPECT_EQ(info.total_bytes, a.Info(pool).total_bytes);
    const uint64_t digest = PoolDigest(a.endpoint(), pool);
    ASSERT_NE(digest, 0u);
    EXPECT_EQ(PoolDigest(b.endpoint(), pool), digest) << "replica bytes equal the original";
  }
  // `pools list` on B names where each pool came from; `pools fetch` of a held pool is a no-op.
  ProcessResult list =
      RunProcess({CliPath(), "pools", "list", "--endpoint", b.endpoint()}, dir_.path(), 20000);
  EXPECT_EQ(list.exit_code, 0) << list.err;
  EXPECT_NE(list.out.find("peer " + endpoint_a_), std::string::npos) << list.out;
  std::string err;
  const std::string third = a.CreatePool(StoriesPath(), Document(150, 3), "k8v3", &err);
  ASSERT_FALSE(third.empty()) << err;
  ProcessResult fetch = RunProcess(
      {CliPath(), "pools", "fetch", third.substr(0, 12), "--endpoint", b.endpoint(), "--json"},
      dir_.path(), 60000);
  ASSERT_EQ(fetch.exit_code, 0) << fetch.err;
  EXPECT_EQ(json::parse(fetch.out).value("fetched", false), true) << fetch.out;
  EXPECT_EQ(PoolDigest(b.endpoint(), third), PoolDigest(a.endpoint(), third));
  fetch = RunProcess({CliPath(), "pools", "fetch", third, "--endpoint", b.endpoint(), "--json"},
                     dir_.path(), 60000);
  ASSERT_EQ(fetch.exit_code, 0) << fetch.err;
  EXPECT_EQ(json::parse(fetch.out).value("fetched", true), false) << "already held";
  // An id no daemon holds: NOT_FOUND naming the peer's answer.
  ProcessResult missing = RunAgent(ns_->ExecB(), b.endpoint(), std::string(64, 'e'), dir_.path());
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("not held here nor by any peer"), std::string::npos) << missing.err;
  EXPECT_EQ(b.Stop(), 0) << b.log();
  EXPECT_EQ(a.Stop(), 0) << a.log();
}

TEST_F(PeersNetns, HolderKilledMidTransferLeavesNothingOnB) {
  Daemon a(30, FlagsA(), ns_->ExecA());
  ASSERT_TRUE(a.ready()) << a.log();
  // A slow link: 4 KiB per get and 40 ms after each, so the 0.5 MB pool takes ~5 s.
  Daemon b(30,
           FlagsB({"--test-transfer-chunk-bytes", "4096", "--test-transfer-chunk-delay-ms", "40",
                   "--transfer-stall-ms", "3000"}),
           ns_->ExecB());
  ASSERT_TRUE(b.ready()) << b.log();
  ASSERT_EQ(WaitPeerState(b.endpoint(), "up", dir_.path())["peers"][0]["state"], "up");
  std::string err;
  const std::string pool = a.CreatePool(StoriesPath(), Document(400, 2), "none", &err);
  ASSERT_FALSE(pool.empty()) << err;
  ASSERT_GT(a.Info(pool).total_bytes, 400000u);
  Process agent;
  std::vector<std::string> argv = ns_->ExecB();
  for (const std::string& s :
       {CliPath(), std::string("agent"), std::string("--pool"), pool, std::string("--model"),
        StoriesPath(), std::string("--endpoint"), b.endpoint(), std::string("--prompt-ids"),
        std::string("1,45"), std::string("--max-new-tokens"), std::string("4"),
        std::string("--threads"), std::string("1")}) {
    argv.push_back(s);
  }
  ASSERT_TRUE(agent.Start(argv, dir_.path() + "/agent.out", dir_.path() + "/agent.err").ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  ASSERT_TRUE(agent.running()) << "the transfer should still be running: " << agent.err();
  a.process().Kill(SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_TRUE(agent.Wait(30000)) << "the agent must not hang";
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_NE(agent.exit_code(), 0);
  const std::string msg = agent.err();
  EXPECT_NE(msg.find("from peer " + endpoint_a_ + " failed"), std::string::npos) << msg;
  // Not a timed assertion (the bound is agent.Wait above): the figure, for the log.
  std::printf("agent failed %.2f s after the holder was killed: %s\n", seconds, msg.c_str());
  // Nothing half-visible on B: no pool, no memory held, no pool memfd in the daemon.
  EXPECT_EQ(b.Info(pool).id[0], '\0');
  json ping = PingJson(b.endpoint(), dir_.path());
  EXPECT_EQ(ping.value("memory_used", 1), 0) << ping.dump();
  EXPECT_EQ(MemfdsOf(b.process().pid()), 0);
  // B notices its peer is gone.
  EXPECT_EQ(WaitPeerState(b.endpoint(), "down", dir_.path())["peers"][0]["state"], "down");
  EXPECT_EQ(b.Stop(), 0) << b.log();
}

TEST_F(PeersNetns, UntrustedCurveKeyIsRefused) {
  Daemon a(30, FlagsA(), ns_->ExecA());
  ASSERT_TRUE(a.ready()) << a.log();
  std::string err;
  const std::string pool = a.CreatePool(StoriesPath(), Document(100, 4), "k8v3", &err);
  ASSERT_FALSE(pool.empty()) << err;
  // Daemon C (in namespace B) knows A's public key, but A's peer-keys file lacks C's.
  Daemon c(30,
           {"--peer", endpoint_a_, "--key-file", keys_->c_key, "--peer-keys-file", keys_->c_peers,
            "--peer-ping-seconds", "0.2", "--peer-timeout-ms", "2000"},
           ns_->ExecB());
  ASSERT_TRUE(c.ready()) << c.log();
  json ping = WaitPeerState(c.endpoint(), "refused", dir_.path());
  ASSERT_EQ(ping["peers"][0]["state"], "refused") << ping.dump();
  EXPECT_NE(ping["peers"][0]["detail"].get<std::string>().find("refused this daemon's CURVE key"),
            std::string::npos)
      << ping.dump();
  ProcessResult agent = RunAgent(ns_->ExecB(), c.endpoint(), pool, dir_.path());
  EXPECT_NE(agent.exit_code, 0);
  EXPECT_NE(agent.err.find("refused this daemon's CURVE key"), std::string::npos) << agent.err;
  EXPECT_EQ(c.Info(pool).id[0], '\0') << "nothing replicated";
  EXPECT_EQ(c.Stop(), 0) << c.log();
  EXPECT_EQ(a.Stop(), 0);
  EXPECT_NE(a.log().find("is not in " + keys_->peers), std::string::npos) << a.log();
}

// No namespaces needed: configuration errors at start.
TEST(PeersConfig, NoKeysNoTcpAndPrivateKeyFiles) {
  if (!fs::exists(DaemonPath()) || !fs::exists(CliPath())) GTEST_SKIP() << "not built";
  TempDir dir;
  const std::string endpoint = "ipc://" + dir.path() + "/c.sock";
  ProcessResult r = RunProcess({DaemonPath(), "--endpoint", endpoint, "--listen",
                                "tcp://127.0.0.1:1", "--shm-prefix", ShmPrefix()},
                               dir.path(), 30000);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("needs CURVE keys"), std::string::npos) << r.err;
  // A key file others may read is refused.
  ProcessResult gen =
      RunProcess({CliPath(), "keys", "generate", dir.path() + "/k.key"}, dir.path());
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  struct stat st {};
  ASSERT_EQ(stat((dir.path() + "/k.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::ofstream(dir.path() + "/peers") << gen.out.substr(0, 40) << " tcp://127.0.0.1:1\n";
  ASSERT_EQ(chmod((dir.path() + "/k.key").c_str(), 0644), 0);
  r = RunProcess({DaemonPath(), "--endpoint", endpoint, "--listen", "tcp://127.0.0.1:1",
                  "--key-file", dir.path() + "/k.key", "--peer-keys-file", dir.path() + "/peers",
                  "--shm-prefix", ShmPrefix()},
                 dir.path(), 30000);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("group or others may read its secret key"), std::string::npos) << r.err;
  // A --peer whose key the peer-keys file lacks.
  ASSERT_EQ(chmod((dir.path() + "/k.key").c_str(), 0600), 0);
  r = RunProcess({DaemonPath(), "--endpoint", endpoint, "--peer", "tcp://127.0.0.1:2", "--key-file",
                  dir.path() + "/k.key", "--peer-keys-file", dir.path() + "/peers", "--shm-prefix",
                  ShmPrefix()},
                 dir.path(), 30000);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("names no public key for it"), std::string::npos) << r.err;
  // Writing over an existing key file needs --force.
  gen = RunProcess({CliPath(), "keys", "generate", dir.path() + "/k.key"}, dir.path());
  EXPECT_NE(gen.exit_code, 0);
  EXPECT_NE(gen.err.find("--force"), std::string::npos) << gen.err;
}

}  // namespace
}  // namespace polykv::testing
