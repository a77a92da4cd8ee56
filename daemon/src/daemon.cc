// polykvd's control server (see daemon.h).
#include "daemon.h"

#include <grp.h>
#include <openssl/rand.h>
#include <pwd.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <zmq.hpp>

#ifdef POLYKV_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "fd_server.h"
#include "metrics.h"
#include "polykv/ipc/cuda_ipc.h"
#include "polykv/ipc/protocol.h"
#include "polykv/ipc/sealed_region.h"
#include "polykv/ipc/shm_region.h"
#include "polykv/ipc/zmq_frames.h"
#include "polykv/model/llama.h"
#include "pool_store.h"
#include "serve_guarded.h"

#ifndef POLYKV_VERSION
#define POLYKV_VERSION "0.0.0"
#endif

namespace polykv::daemon {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kZapEndpoint[] = "inproc://zeromq.zap.01";
// zmq drops frames larger than this (the peer is disconnected); frames between
// kMaxMessageBytes and this size get a RESOURCE_EXHAUSTED error reply.
constexpr int64_t kZmqMaxMsgSize = static_cast<int64_t>(ipc::kMaxMessageBytes) + (64 << 10);

bool PidAlive(pid_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

std::string ProcComm(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/comm"));
  std::string comm;
  std::getline(f, comm);
  return comm;
}

Status MkdirP(const std::string& dir) {
  if (dir.empty()) return absl::OkStatus();
  std::string cur;
  for (absl::string_view part : absl::StrSplit(dir, '/')) {
    if (part.empty()) {
      if (cur.empty()) cur = "/";
      continue;
    }
    cur = (cur.empty() || cur == "/") ? absl::StrCat(cur, part) : absl::StrCat(cur, "/", part);
    if (mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create directory ", cur, ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

void WriteFileAtomic(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    if (!f) return;
  }
  std::rename(tmp.c_str(), path.c_str());
}

// Sends PING to `endpoint` and waits up to `timeout_ms` for any reply.
StatusOr<ipc::Reply> Probe(const std::string& endpoint, int timeout_ms) {
  try {
    zmq::context_t ctx;
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.connect(endpoint);
    ipc::Request ping;
    ping.type = ipc::MessageType::kPing;
    ping.id = 1;
    POLYKV_RETURN_IF_ERROR(
        ipc::SendDealerRequest(s, ipc::EncodeRequest(ping), /*dontwait=*/false).status());
    zmq::pollitem_t item{static_cast<void*>(s), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms));
    if (!(item.revents & ZMQ_POLLIN)) return absl::DeadlineExceededError("no reply");
    POLYKV_ASSIGN_OR_RETURN(const std::string payload, ipc::RecvDealerReply(s, /*dontwait=*/false));
    return ipc::DecodeReply(payload);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(e.what());
  }
}

}  // namespace

StatusOr<uint64_t> ParseByteSize(const std::string& text_in) {
  std::string text;
  for (char c : text_in) {
    if (c != ' ' && c != '_') text.push_back(c);
  }
  if (text.empty()) return absl::InvalidArgumentError("empty byte size");
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    return absl::InvalidArgumentError(absl::StrCat("byte size \"", text_in, "\" is not a number"));
  }
  std::string suffix = text.substr(pos);
  for (auto& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const struct {
    const char* s;
    double mult;
  } kSuffixes[] = {
      {"", 1},
      {"B", 1},
      {"K", 1024.0},
      {"KIB", 1024.0},
      {"KB", 1e3},
      {"M", 1048576.0},
      {"MIB", 1048576.0},
      {"MB", 1e6},
      {"G", 1073741824.0},
      {"GIB", 1073741824.0},
      {"GB", 1e9},
      {"T", 1099511627776.0},
      {"TIB", 1099511627776.0},
      {"TB", 1e12},
  };
  for (const auto& s : kSuffixes) {
    if (suffix == s.s) {
      double bytes = value * s.mult;
      if (!(bytes >= 0) || bytes > 1.8e19) {
        return absl::InvalidArgumentError(
            absl::StrCat("byte size \"", text_in, "\" is out of range"));
      }
      return static_cast<uint64_t>(std::llround(bytes));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "byte size \"", text_in, "\" has an unknown suffix (use K, M, G, T, KB, MB, GB, TB)"));
}

void AddDaemonFlags(CLI::App& app, DaemonOptions& o) {
  app.set_config("--config", "", "Config file (TOML or INI; keys are the long flag names)");
  app.add_option("--endpoint", o.endpoint,
                 "Control endpoint (default: $POLYKV_ENDPOINT, /run/polykv/control.sock, "
                 "$XDG_RUNTIME_DIR/polykv/control.sock or /tmp/polykv-<uid>/control.sock)");
  app.add_option("--backend", o.backend,
                 "Pool memory: auto (cuda when a GPU is usable), host, cuda")
      ->check(CLI::IsMember({"auto", "host", "cuda"}))
      ->capture_default_str();
  auto byte_size = [](const char* flag, uint64_t* out) {
    return [flag, out](const std::string& s) {
      auto v = ParseByteSize(s);
      if (!v.ok()) throw CLI::ValidationError(flag, std::string(v.status().message()));
      *out = *v;
    };
  };
  app.add_option_function<std::string>(
      "--memory-cap", byte_size("--memory-cap", &o.memory_cap),
      "Bytes of pools per backend (suffixes K M G T; 0 = unlimited)");
  app.add_option("--lease-seconds", o.lease_seconds, "Lease duration granted by ATTACH/RENEW")
      ->check(CLI::Range(0.05, 86400.0))
      ->capture_default_str();
  app.add_option("--model-path", o.model_path,
                 "Directory searched for relative model names (repeatable)");
  app.add_option("--models-dir", o.models_dirs,
                 "Model folder (repeatable): models are opened only under these, symlinks "
                 "resolved; without one, only the daemon's own uid and root may name models");
  app.add_option("--allow-uid", o.allow_uids,
                 "Operator uid (repeatable; same as --operator-uid, kept for older configs)");
  app.add_option("--operator-uid", o.operator_uids,
                 "Uid that may create and evict pools, and read (repeatable)");
  app.add_option("--operator-gid", o.operator_gids, "Gid whose members are operators (repeatable)");
  app.add_option("--reader-uid", o.reader_uids,
                 "Uid that may list, show and attach pools (repeatable)");
  app.add_option("--reader-gid", o.reader_gids, "Gid whose members are readers (repeatable)");
  app.add_option("--create-workers", o.create_workers, "Threads running pool creates")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--max-queued-creates", o.max_queued_creates,
                 "Creates that may wait for a worker; more get RESOURCE_EXHAUSTED")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  app.add_option("--model-cache-models", o.model_cache_models,
                 "Models kept loaded between creates (least recently used dropped first)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option_function<std::string>(
      "--model-cache-bytes", byte_size("--model-cache-bytes", &o.model_cache_bytes),
      "Bound on the cached models' weights (suffixes K M G T; 0 = no byte bound)");
  app.add_option("--shutdown-grace-seconds", o.shutdown_grace_seconds,
                 "How long SIGTERM waits for busy create workers")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("--fd-socket", o.fd_socket,
                 "Pool-descriptor socket path (default: the control socket path + .fds)");
  app.add_option("--threads", o.threads, "compute threads: kernels and OpenBLAS (0 = all cores)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  app.add_option("--log-level", o.log_level, "trace|debug|info|warn|error|critical|off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}))
      ->capture_default_str();
  app.add_option("--shm-prefix", o.shm_prefix,
                 "Name prefix of pool memfds (and of legacy POSIX shm segments cleaned at start)")
      ->check([](const std::string& s) {
        return (s.size() >= 2 && s[0] == '/' && s.find('/', 1) == std::string::npos)
                   ? std::string()
                   : std::string("must look like /name-");
      })
      ->capture_default_str();
  app.add_option_function<std::string>(
      "--socket-mode",
      [&o](const std::string& s) {
        char* end = nullptr;
        unsigned long m = std::strtoul(s.c_str(), &end, 8);
        if (end == s.c_str() || *end != '\0' || m > 0777) {
          throw CLI::ValidationError("--socket-mode", "must be octal, e.g. 0660");
        }
        o.socket_mode = static_cast<uint32_t>(m);
      },
      "Mode of the ipc socket files (octal, default 0660)");
  app.add_option("--state-dir", o.state_dir,
                 "Folder of persisted pools: every published pool is also written there and "
                 "restored after a restart (systemd: $STATE_DIRECTORY; empty = memory only)");
  app.add_option_function<std::string>("--state-budget",
                                       byte_size("--state-budget", &o.state_budget),
                                       "Disk bytes of pool files; least recently used files go "
                                       "first (0 = unlimited)");
  app.add_flag("--preload", o.preload,
               "Restore every persisted pool at start (default: on first create or attach)");
  app.add_option("--metrics-listen", o.metrics_listen,
                 "Serve Prometheus metrics on http://HOST:PORT/metrics (e.g. 127.0.0.1:9464; "
                 "port 0 = any free port, logged)");
  app.add_option("--listen", o.peer.listen,
                 "Serve other daemons on tcp://ADDR:PORT (CURVE-authenticated; needs "
                 "--key-file and --peer-keys-file)");
  app.add_option("--peer", o.peer.peers,
                 "Another daemon asked for pools this one lacks, tcp://HOST:PORT (repeatable; "
                 "its public key must be in --peer-keys-file)");
  app.add_option("--key-file", o.peer.key_file,
                 "This daemon's CURVE key pair (polykv-cli keys generate FILE; mode 0600)");
  app.add_option("--peer-keys-file", o.peer.peer_keys_file,
                 "Trusted daemons' public keys: '<key> [tcp://HOST:PORT]' per line");
  app.add_option("--peer-ping-seconds", o.peer.ping_seconds, "How often peers' state is checked")
      ->check(CLI::Range(0.05, 3600.0))
      ->capture_default_str();
  app.add_option("--peer-timeout-ms", o.peer.call_timeout_ms,
                 "Round trip allowed to one peer request")
      ->check(CLI::Range(10, 600000))
      ->capture_default_str();
  app.add_option("--transfer-stall-ms", o.peer.stall_timeout_ms,
                 "A pool transfer with no progress this long fails")
      ->check(CLI::Range(100, 3600000))
      ->capture_default_str();
  // Fault injection for the test suites; not shown in --help.
  app.add_option("--test-create-delay-ms", o.test_create_delay_ms)
      ->group("")
      ->check(CLI::Range(0, 3600000));
  app.add_option("--test-transfer-chunk-delay-ms", o.peer.test_chunk_delay_ms)
      ->group("")
      ->check(CLI::Range(0, 60000));
  app.add_option("--test-transfer-chunk-bytes", o.peer.chunk_bytes)
      ->group("")
      ->check(CLI::Range(uint64_t{4096}, uint64_t{1} << 30));
}

std::string IpcPath(const std::string& endpoint) {
  constexpr char kIpc[] = "ipc://";
  if (endpoint.rfind(kIpc, 0) != 0) return "";
  return endpoint.substr(sizeof(kIpc) - 1);
}

// ---------------------------------------------------------------------------------------

namespace {

std::string RandomInstanceId() {
  uint8_t bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    std::random_device rd;
    for (auto& b : bytes) b = static_cast<uint8_t>(rd());
  }
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (uint8_t b : bytes) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

/// Reader / operator roles by uid and gid. Supplementary groups come from the group
/// database (cached for 10 s per uid); the primary gid from the peer's credentials.
class Roles {
 public:
  enum Role { kNone = 0, kReader = 1, kOperator = 2 };

  explicit Roles(const DaemonOptions& o) {
    operator_uids_.insert(o.allow_uids.begin(), o.allow_uids.end());
    operator_uids_.insert(o.operator_uids.begin(), o.operator_uids.end());
    operator_gids_.insert(o.operator_gids.begin(), o.operator_gids.end());
    reader_uids_.insert(o.reader_uids.begin(), o.reader_uids.end());
    reader_gids_.insert(o.reader_gids.begin(), o.reader_gids.end());
    if (operator_uids_.empty() && operator_gids_.empty() && reader_uids_.empty() &&
        reader_gids_.empty()) {
      operator_uids_ = {static_cast<uint32_t>(getuid()), 0u};
    }
  }

  Role Of(uint32_t uid, uint32_t gid) {
    if (operator_uids_.count(uid)) return kOperator;
    const bool groups_matter = !operator_gids_.empty() || !reader_gids_.empty();
    std::vector<uint32_t> groups;
    if (groups_matter) groups = GroupsOf(uid, gid);
    for (uint32_t g : groups) {
      if (operator_gids_.count(g)) return kOperator;
    }
    if (reader_uids_.count(uid)) return kReader;
    for (uint32_t g : groups) {
      if (reader_gids_.count(g)) return kReader;
    }
    return kNone;
  }

  std::string Describe(Role role) const {
    if (role == kOperator) {
      return absl::StrCat("operators are uids [", absl::StrJoin(operator_uids_, ", "),
                          "] and gids [", absl::StrJoin(operator_gids_, ", "), "]");
    }
    return absl::StrCat("readers are uids [", absl::StrJoin(reader_uids_, ", "), "] and gids [",
                        absl::StrJoin(reader_gids_, ", "), "], plus every operator (",
                        Describe(kOperator), ")");
  }

 private:
  std::vector<uint32_t> GroupsOf(uint32_t uid, uint32_t gid) {
    std::lock_guard<std::mutex> lock(mu_);
    auto now = Clock::now();
    auto& entry = cache_[uid];
    if (entry.first + std::chrono::seconds(10) < now || entry.second.empty()) {
      std::vector<uint32_t> out = {gid};
      struct passwd pw;
      struct passwd* found = nullptr;
      std::vector<char> buf(16384);
      if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr) {
        int n = 64;
        std::vector<gid_t> gids(n);
        if (getgrouplist(pw.pw_name, pw.pw_gid, gids.data(), &n) < 0 && n > 64) {
          gids.resize(n);
          getgrouplist(pw.pw_name, pw.pw_gid, gids.data(), &n);
        }
        for (int i = 0; i < n && i < static_cast<int>(gids.size()); ++i) out.push_back(gids[i]);
      }
      entry = {now, out};
    }
    std::vector<uint32_t> out = entry.second;
    if (std::find(out.begin(), out.end(), gid) == out.end()) out.push_back(gid);
    return out;
  }

  std::set<uint32_t> operator_uids_, operator_gids_, reader_uids_, reader_gids_;
  std::mutex mu_;
  std::map<uint32_t, std::pair<Clock::time_point, std::vector<uint32_t>>> cache_;
};

/// The sockets' folder must not let others replace them (squat the names): it is ours or
/// root's, and not writable by others unless sticky (or ours).
Status CheckSocketFolder(const std::string& dir) {
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) return absl::OkStatus();  // MkdirP reported problems
  if (st.st_uid != geteuid() && st.st_uid != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "socket folder ", dir, " belongs to uid ", st.st_uid, ", not to this daemon (uid ",
        geteuid(), ") or root; refusing to serve there"));
  }
  if ((st.st_mode & (S_IWOTH | S_IWGRP)) != 0 && (st.st_mode & S_ISVTX) == 0 &&
      st.st_uid != geteuid()) {
    return absl::FailedPreconditionError(
        absl::StrCat("socket folder ", dir,
                     " is writable by others and not sticky; others could replace "
                     "the daemon's sockets there"));
  }
  return absl::OkStatus();
}

bool NeedsOperator(ipc::MessageType t) {
  return ipc::SpecOf(t).role == ipc::MessageRole::kOperator;
}

/// What makes two CREATE_POOLs the same work: every field the create reads, and who asks
/// (the requester decides which model paths may be opened). Length-prefixed, so no two
/// different requests give one key.
std::string CreateWorkKey(const ipc::Request& r, const Requester& who) {
  std::string key;
  auto add = [&key](absl::string_view part) { absl::StrAppend(&key, part.size(), ":", part, ";"); };
  add(r.model);
  add(r.document);
  add(absl::StrJoin(r.token_ids, ","));
  add(r.codec);
  add(r.key_scale);
  add(r.parent);
  absl::StrAppend(&key, r.add_bos ? 1 : 0, r.norm_correction ? 1 : 0, ";", who.uid, ";",
                  who.trusted_paths ? 1 : 0);
  return key;
}

/// A queued or running CREATE_POOL.
struct CreateJob {
  uint64_t key = 0;
  ipc::Request request;
  Requester who;
  std::shared_ptr<std::atomic<bool>> cancel;
};

/// A message a worker produced for the control loop to send.
struct CreateEvent {
  uint64_t key = 0;
  ipc::Reply reply;
  bool final = false;
};

/// State shared by the control loop and the create workers. Workers hold it by
/// shared_ptr, so one left blocked at shutdown never touches freed memory.
struct CreateShared {
  std::shared_ptr<PoolManager> manager;
  std::shared_ptr<PoolStore> store;  // the manager points at it (may be null)
  std::shared_ptr<Metrics> metrics;
  std::shared_ptr<Peers> peers;  // the manager points at it (may be null)
  std::string instance;
  size_t capacity = 8;  // creates that may wait while every worker is busy
  size_t workers = 1;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<CreateJob> queue;
  size_t running = 0;
  bool stop = false;
  std::deque<CreateEvent> events;
  ipc::UniqueFd event_fd;  // eventfd: wakes the control loop

  void Post(CreateEvent e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(std::move(e));
    }
    uint64_t one = 1;
    (void)!write(event_fd.get(), &one, sizeof(one));
  }
};

void CreateWorker(std::shared_ptr<CreateShared> shared, std::shared_ptr<std::atomic<bool>> done) {
  for (;;) {
    CreateJob job;
    {
      std::unique_lock<std::mutex> lock(shared->mu);
      shared->cv.wait(lock, [&] { return shared->stop || !shared->queue.empty(); });
      if (shared->stop) break;
      job = std::move(shared->queue.front());
      shared->queue.pop_front();
      ++shared->running;
    }
    const ipc::Request& req = job.request;
    auto last = Clock::now() - std::chrono::seconds(1);
    std::string last_stage;
    ProgressFn progress = [&](const std::string& stage, int64_t d, int64_t total) {
      // At most ~20 PROGRESS messages a second, but always the first and last of a stage.
      auto now = Clock::now();
      if (stage == last_stage && d != 0 && d != total &&
          now - last < std::chrono::milliseconds(50)) {
        return;
      }
      last = now;
      last_stage = stage;
      ipc::Reply p;
      p.type = ipc::MessageType::kProgress;
      p.id = req.id;
      p.stage = stage;
      p.done = d;
      p.total = total;
      shared->Post(CreateEvent{job.key, std::move(p), false});
    };
    ipc::Reply reply = ServeGuarded(req, shared->metrics.get(), [&] {
      ipc::Reply r;
      r.type = req.type;
      r.id = req.id;
      // CREATE_POOL; or FETCH, or an ATTACH of a pool this daemon does not hold: replicate.
      StatusOr<CreateResult> result =
          req.type == ipc::MessageType::kCreatePool
              ? shared->manager->CreatePool(req, progress, job.who, job.cancel.get())
              : shared->manager->Replicate(req.pool_id, job.cancel.get(), progress);
      if (result.ok() && req.type == ipc::MessageType::kAttach) {
        auto g = shared->manager->Attach(result->info.id, req.client_pid);
        if (!g.ok()) {
          result = g.status();
        } else {
          r.lease_id = g->lease_id;
          r.lease_expires_unix_ms = g->expires_unix_ms;
          r.lease_ms = g->lease_ms;
          r.memory = g->memory;
          result->info = g->info;
        }
      }
      if (!result.ok()) return ipc::ErrorReply(req.type, req.id, result.status());
      r.pool = result->info;
      r.created = result->created;
      if (result->created && !result->restored && !result->replicated) {
        shared->metrics->AddPrefill(result->info.tokens);
      }
      return r;
    });
    shared->Post(CreateEvent{job.key, std::move(reply), true});
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      --shared->running;
    }
  }
  done->store(true);
}

}  // namespace

struct Daemon::Impl {
  DaemonOptions options;
  std::string endpoint;
  std::string ipc_path;  // "" for tcp
  std::string pid_path, legacy_segments_path, fd_path;
  std::string instance;
  std::unique_ptr<Roles> roles;
  std::shared_ptr<PoolStore> store;  // before manager: the manager points at it
  std::shared_ptr<PoolManager> manager;
  std::shared_ptr<Metrics> metrics = std::make_shared<Metrics>();
  std::unique_ptr<MetricsServer> metrics_server;
  std::shared_ptr<CreateShared> creates;
  std::unique_ptr<FdServer> fd_server;
  std::shared_ptr<Peers> peers;  // --listen / --peer (null without)

  zmq::context_t ctx;
  std::unique_ptr<zmq::socket_t> router;
  std::thread zap_thread;
  std::atomic<bool> zap_stop{false};

  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Worker> workers;

  /// A create the control loop answers for: who asked, and what it last told them.
  struct Tracked {
    std::string identity;
    bool delimiter = false;
    uint64_t request_id = 0;
    ipc::MessageType type = ipc::MessageType::kCreatePool;
    bool progress = false;
    std::string stage = "queued";
    int64_t done = 0, total = 1;
    Clock::time_point last_sent;
    std::shared_ptr<std::atomic<bool>> cancel;
    /// Identical CREATE_POOLs that arrived while this one was queued or running (single
    /// flight): they take no queue slot and get this create's answer (created = false).
    struct Joined {
      std::string identity;
      bool delimiter = false;
      uint64_t request_id = 0;
      bool progress = false;
      Clock::time_point last_sent;
      Clock::time_point joined_at;  ///< for the request's duration in /metrics
    };
    std::vector<Joined> joined;
    std::string work_key;  ///< CreateWorkKey (CREATE_POOL only; "" otherwise)
  };
  std::map<uint64_t, Tracked> tracked;
  /// CreateWorkKey -> key of the tracked create doing that work.
  std::map<std::string, uint64_t> creates_by_work;
  uint64_t next_key = 0;

  bool shut_down = false;
  int left_behind = 0;      // workers still busy when shutdown gave up waiting
  bool owns_files = false;  // set once our socket is bound: only then are the files ours

  ~Impl() { Shutdown(); }

  void ZapLoop(zmq::socket_t zap);
  void HandleRouter();
  void ForwardEvents();
  void Heartbeats();
  void Send(const std::string& identity, bool delimiter, ipc::Reply reply);
  /// Send for a refused or undecodable frame (counted by error code only).
  void SendRefusal(const std::string& identity, bool delimiter, ipc::Reply reply) {
    metrics->ObserveError(reply.code);
    Send(identity, delimiter, std::move(reply));
  }
  ipc::Reply Dispatch(const ipc::Request& req, uint32_t peer_pid);
  void DaemonFigures(ipc::Reply* r);
  void StartCreate(std::string identity, bool delimiter, ipc::Request req, Requester who);
  /// Forgets an answered create (and its single-flight entry).
  void Untrack(std::map<uint64_t, Tracked>::iterator it);
  void Shutdown();

  // Daemon::Start's steps, in the order it runs them. A step that fails returns the error
  // Start returns; the Impl's destructor (Shutdown) then undoes what the earlier steps did.
  /// Resolves --backend (auto: cuda when usable), checks the limits, sets up the roles and
  /// libtorch's threads. Returns the backend ("host" or "cuda").
  [[nodiscard]] StatusOr<std::string> CheckOptions(const DaemonOptions& o);
  /// ipc:// only: the socket folder, a live daemon on the endpoint (kAlreadyExists), a stale
  /// socket or pid file, the shm segments of older versions.
  [[nodiscard]] Status ClaimEndpoint(const DaemonOptions& o);
  /// The pool-descriptor socket's path (--fd-socket, <socket>.fds, or one under /tmp).
  [[nodiscard]] Status ChooseFdPath(const DaemonOptions& o);
  /// The pool manager's options; opens the state folder (--state-dir) into `store`.
  [[nodiscard]] StatusOr<PoolManagerOptions> ConfigurePools(const DaemonOptions& o,
                                                            const std::string& backend);
  /// Starts the ZAP handler and binds the control ROUTER (kUnavailable when binding fails).
  [[nodiscard]] Status BindControlSocket();
  /// The pool manager and the state the create workers share with the control loop.
  void StartPools(PoolManagerOptions pm);
  /// The peer channel (--listen / --peer), when configured.
  [[nodiscard]] Status StartPeers(const DaemonOptions& o);
  /// The create queue's wake-up eventfd and the create worker threads.
  [[nodiscard]] Status StartWorkers(const DaemonOptions& o);
  /// The pool-descriptor socket (readers and operators may map pools).
  [[nodiscard]] Status StartFdServer(const DaemonOptions& o);
  /// GET /metrics (--metrics-listen), when configured.
  [[nodiscard]] Status StartMetricsServer(const DaemonOptions& o);
  /// --preload: restores every persisted pool now.
  void PreloadPools(const DaemonOptions& o);
  /// ipc:// only: the socket's mode and group, and the pid file.
  void PublishSocket(const DaemonOptions& o);
};

void Daemon::Impl::ZapLoop(zmq::socket_t zap) {
  // ZAP (RFC 27): we accept every handshake and pass the peer's "uid:gid:pid" (from
  // SO_PEERCRED, which libzmq appends to the ipc peer address) as the User-Id, so the main
  // loop can answer refused uids with a clear PERMISSION_DENIED error.
  auto accept = [](const ipc::ZapRequest& request) {
    ipc::ZapReply reply;
    reply.user_id = ipc::CredentialsUserId(request.address);
    return reply;
  };
  while (!zap_stop.load()) {
    zmq::pollitem_t item{static_cast<void*>(zap), 0, ZMQ_POLLIN, 0};
    Status s;
    try {
      zmq::poll(&item, 1, std::chrono::milliseconds(100));
    } catch (const zmq::error_t& e) {
      s = ipc::ZmqErrorStatus(e);
    }
    if (s.ok() && (item.revents & ZMQ_POLLIN)) s = ipc::ServeZapRequest(zap, accept);
    if (absl::IsCancelled(s)) break;  // ETERM: the context is shutting down
    if (!s.ok() && !absl::IsAborted(s)) spdlog::warn("ZAP handler: {}", std::string(s.message()));
  }
}

void Daemon::Impl::Send(const std::string& identity, bool delimiter, ipc::Reply reply) {
  reply.instance = instance;
  Status s = ipc::SendRouterReply(*router, identity, delimiter, ipc::EncodeReply(reply));
  if (!s.ok()) spdlog::warn("send reply: {}", std::string(s.message()));
}

void Daemon::Impl::DaemonFigures(ipc::Reply* r) {
  r->daemon_version = POLYKV_VERSION;
  r->daemon_pid = static_cast<uint32_t>(getpid());
  r->memory_used = manager->memory_used();
  r->memory_cap = manager->memory_cap();
  const ModelCacheStats cache = manager->model_cache();
  r->model_cache_bytes = cache.bytes;
  r->model_cache_mapped_bytes = cache.mapped_bytes;
  r->model_cache_models = cache.models;
  r->model_cache_capacity = cache.capacity;
  std::lock_guard<std::mutex> lock(creates->mu);
  r->creates_queued = static_cast<uint32_t>(creates->queue.size());
  r->creates_running = static_cast<uint32_t>(creates->running);
  r->create_queue_capacity = static_cast<uint32_t>(creates->capacity);
}

ipc::Reply Daemon::Impl::Dispatch(const ipc::Request& req, uint32_t peer_pid) {
  ipc::Reply r;
  r.type = req.type;
  r.id = req.id;
  auto fail = [&](const Status& s) { return ipc::ErrorReply(req.type, req.id, s); };
  switch (req.type) {
    case ipc::MessageType::kPing:
      DaemonFigures(&r);
      if (peers) r.peers = peers->States();
      return r;
    case ipc::MessageType::kList:
      // Published pools and, with --state-dir, the pool files not restored yet and the
      // quarantined ones, each with its state: what an operator sees right after a restart.
      r.pools = manager->Catalog();
      DaemonFigures(&r);
      return r;
    case ipc::MessageType::kStats:
      if (!req.pool_id.empty()) {
        auto info = manager->Describe(req.pool_id);
        if (!info.ok()) return fail(info.status());
        r.pool = *info;
        r.pools = {*info};
      } else {
        r.pools = manager->Catalog();
      }
      DaemonFigures(&r);
      return r;
    case ipc::MessageType::kAttach: {
      auto g = manager->Attach(req.pool_id, req.client_pid != 0 ? req.client_pid : peer_pid);
      if (!g.ok()) return fail(g.status());
      r.lease_id = g->lease_id;
      r.lease_expires_unix_ms = g->expires_unix_ms;
      r.lease_ms = g->lease_ms;
      r.pool = g->info;
      r.memory = g->memory;
      return r;
    }
    case ipc::MessageType::kRenew: {
      auto g = manager->Renew(req.lease_id);
      if (!g.ok()) return fail(g.status());
      r.lease_id = g->lease_id;
      r.lease_expires_unix_ms = g->expires_unix_ms;
      r.lease_ms = g->lease_ms;
      if (!g->info.id.empty()) r.pool = g->info;
      return r;
    }
    case ipc::MessageType::kDetach: {
      Status s = manager->Detach(req.lease_id);
      return s.ok() ? r : fail(s);
    }
    case ipc::MessageType::kEvict: {
      Status s = manager->Evict(req.pool_id, req.force);
      return s.ok() ? r : fail(s);
    }
    default:
      if (ipc::SpecOf(req.type).role == ipc::MessageRole::kPeer) {
        return fail(absl::PermissionDeniedError(
            absl::StrCat(std::string(ipc::MessageTypeName(req.type)),
                         " is served only on the CURVE-authenticated peer channel (--listen)")));
      }
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "message type ", std::string(ipc::MessageTypeName(req.type)), " is not a request")));
  }
}

void Daemon::Impl::StartCreate(std::string identity, bool delimiter, ipc::Request req,
                               Requester who) {
  CreateJob job;
  job.key = ++next_key;
  job.who = who;
  job.cancel = std::make_shared<std::atomic<bool>>(false);
  Tracked t;
  t.identity = std::move(identity);
  t.delimiter = delimiter;
  t.request_id = req.id;
  t.type = req.type;
  t.progress = req.progress;
  t.cancel = job.cancel;
  if (req.type == ipc::MessageType::kCreatePool) {
    // Single flight, before admission control: the same work already queued or running is
    // joined (no queue slot taken); only distinct work is counted against the queue.
    t.work_key = CreateWorkKey(req, who);
    if (auto same = creates_by_work.find(t.work_key); same != creates_by_work.end()) {
      Tracked& leader = tracked.at(same->second);
      Tracked::Joined j{t.identity, t.delimiter,  t.request_id,
                        t.progress, Clock::now(), Clock::now()};
      metrics->AddCoalescedCreate();
      spdlog::info("create id={} joins the identical create id={} in flight ({} joined)",
                   t.request_id, leader.request_id, leader.joined.size() + 1);
      if (j.progress) {
        ipc::Reply p;
        p.type = ipc::MessageType::kProgress;
        p.id = j.request_id;
        p.stage = leader.stage;
        p.done = leader.done;
        p.total = leader.total;
        Send(j.identity, j.delimiter, p);
      }
      leader.joined.push_back(std::move(j));
      return;
    }
  }
  size_t queued = 0, running = 0;
  bool full = false;
  {
    std::lock_guard<std::mutex> lock(creates->mu);
    queued = creates->queue.size();
    running = creates->running;
    full = queued + running >= creates->capacity + creates->workers;
    if (!full) {
      job.request = std::move(req);
      creates->queue.push_back(std::move(job));
    }
  }
  if (full) {
    spdlog::warn("refused a create: {} queued, {} running", queued, running);
    SendRefusal(t.identity, t.delimiter,
                ipc::ErrorReply(
                    t.type, t.request_id,
                    absl::ResourceExhaustedError(absl::StrCat(
                        "the create queue is full (", queued, " waiting, ", running,
                        " running; --max-queued-creates ", creates->capacity, "): retry later"))));
    return;
  }
  creates->cv.notify_one();
  const uint64_t key = next_key;
  t.last_sent = Clock::now();
  if (t.progress) {
    ipc::Reply p;
    p.type = ipc::MessageType::kProgress;
    p.id = t.request_id;
    p.stage = "queued";
    p.done = static_cast<int64_t>(queued);
    p.total = static_cast<int64_t>(queued);
    Send(t.identity, t.delimiter, p);
  }
  if (!t.work_key.empty()) creates_by_work[t.work_key] = key;
  tracked.emplace(key, std::move(t));
}

void Daemon::Impl::Untrack(std::map<uint64_t, Tracked>::iterator it) {
  if (!it->second.work_key.empty()) {
    auto w = creates_by_work.find(it->second.work_key);
    if (w != creates_by_work.end() && w->second == it->first) creates_by_work.erase(w);
  }
  tracked.erase(it);
}

void Daemon::Impl::ForwardEvents() {
  uint64_t counter;
  (void)!read(creates->event_fd.get(), &counter, sizeof(counter));
  std::deque<CreateEvent> events;
  {
    std::lock_guard<std::mutex> lock(creates->mu);
    events.swap(creates->events);
  }
  for (CreateEvent& e : events) {
    auto it = tracked.find(e.key);
    if (it == tracked.end()) continue;  // already answered (cancelled at shutdown)
    Tracked& t = it->second;
    if (e.final) {
      // The joined creates get the same answer under their own request ids; the pool was
      // made by the first one (created = false for the others, as for any create that
      // finds its pool made by another).
      for (const Tracked::Joined& j : t.joined) {
        ipc::Reply r = e.reply;
        r.id = j.request_id;
        r.created = false;
        metrics->ObserveRequest(t.type, r,
                                std::chrono::duration<double>(Clock::now() - j.joined_at).count());
        Send(j.identity, j.delimiter, std::move(r));
      }
      Send(t.identity, t.delimiter, std::move(e.reply));
      Untrack(it);
      continue;
    }
    t.stage = e.reply.stage;
    t.done = e.reply.done;
    t.total = e.reply.total;
    const auto now = Clock::now();
    for (Tracked::Joined& j : t.joined) {
      if (!j.progress) continue;
      ipc::Reply p = e.reply;
      p.id = j.request_id;
      j.last_sent = now;
      Send(j.identity, j.delimiter, std::move(p));
    }
    if (t.progress) {
      t.last_sent = now;
      Send(t.identity, t.delimiter, std::move(e.reply));
    }
  }
}

void Daemon::Impl::Heartbeats() {
  const auto now = Clock::now();
  const auto due = [&](bool progress, Clock::time_point last) {
    return progress && now - last >= std::chrono::milliseconds(ipc::kHeartbeatMs);
  };
  for (auto& [key, t] : tracked) {
    ipc::Reply p;
    p.type = ipc::MessageType::kProgress;
    p.stage = t.stage;
    p.done = t.done;
    p.total = t.total;
    p.heartbeat = true;
    for (Tracked::Joined& j : t.joined) {
      if (!due(j.progress, j.last_sent)) continue;
      p.id = j.request_id;
      j.last_sent = now;
      Send(j.identity, j.delimiter, p);
    }
    if (!due(t.progress, t.last_sent)) continue;
    p.id = t.request_id;
    t.last_sent = now;
    Send(t.identity, t.delimiter, p);
  }
}

void Daemon::Impl::HandleRouter() {
  for (int i = 0; i < 256; ++i) {
    StatusOr<std::optional<ipc::RouterMessage>> received = ipc::RecvRouterMessage(*router);
    if (!received.ok()) {
      spdlog::warn("receive: {}", std::string(received.status().message()));
      return;
    }
    if (!received->has_value()) return;
    const ipc::RouterMessage& message = **received;
    if (message.body_frames == 0) continue;  // identity only: nothing to answer
    const std::string& identity = message.identity;
    const bool delimiter = message.delimiter;
    if (Status one = message.CheckOneBody(); !one.ok()) {
      SendRefusal(identity, delimiter, ipc::ErrorReply(ipc::MessageType::kError, 0, one));
      continue;
    }
    // Peer credentials (ipc endpoints): "uid:gid:pid" from the ZAP handler.
    const std::optional<ipc::PeerCredentials> cred = ipc::CredentialsOf(message.body);
    const bool have_cred = cred.has_value();
    const uint32_t peer_uid = have_cred ? cred->uid : 0;
    const uint32_t peer_gid = have_cred ? cred->gid : 0;
    const uint32_t peer_pid = have_cred ? cred->pid : 0;
    const std::string_view frame = message.json();
    Roles::Role role = Roles::kOperator;  // tcp: no credentials to check (see Start)
    if (!ipc_path.empty()) {
      role = have_cred ? roles->Of(peer_uid, peer_gid) : Roles::kNone;
      if (role == Roles::kNone) {
        std::string who = have_cred ? absl::StrCat("uid ", peer_uid, " (pid ", peer_pid, ")")
                                    : std::string("a peer with unknown credentials");
        spdlog::warn("refused request from {}: not in the allowed uids or gids", who);
        SendRefusal(identity, delimiter,
                    ipc::ErrorReplyForFrame(frame, absl::PermissionDeniedError(absl::StrCat(
                                                       who, " is not allowed to use polykvd (",
                                                       roles->Describe(Roles::kReader), ")"))));
        continue;
      }
    }
    auto req = ipc::DecodeRequest(frame);
    if (!req.ok()) {
      spdlog::warn("bad request ({} bytes) from pid {}: {}", frame.size(), peer_pid,
                   req.status().ToString());
      SendRefusal(identity, delimiter, ipc::ErrorReplyForFrame(frame, req.status()));
      continue;
    }
    spdlog::debug("{} id={} from pid {}", std::string(ipc::MessageTypeName(req->type)), req->id,
                  peer_pid);
    if (NeedsOperator(req->type) && role != Roles::kOperator) {
      spdlog::warn("refused {} from uid {} (pid {}): not an operator",
                   std::string(ipc::MessageTypeName(req->type)), peer_uid, peer_pid);
      SendRefusal(
          identity, delimiter,
          ipc::ErrorReply(
              req->type, req->id,
              absl::PermissionDeniedError(absl::StrCat(
                  "uid ", peer_uid, " may not ", std::string(ipc::MessageTypeName(req->type)),
                  ": it is a reader, not an operator (", roles->Describe(Roles::kOperator), ")"))));
      continue;
    }
    const ipc::MessageRuns runs = ipc::SpecOf(req->type).runs;
    if (runs == ipc::MessageRuns::kInlineOrWorker && peers) {
      // A pool neither here nor in the state folder: replicate it on a worker thread (the
      // control loop never waits on the network).
      bool known =
          manager->Info(req->pool_id).ok() || (store && store->Find(req->pool_id).has_value());
      if (!known) {
        if (req->client_pid == 0) req->client_pid = peer_pid;
        StartCreate(identity, delimiter, *std::move(req), Requester{peer_uid, false});
        continue;
      }
    }
    if (runs == ipc::MessageRuns::kWorker) {  // CREATE_POOL, FETCH
      if (req->type == ipc::MessageType::kFetch && !peers) {
        SendRefusal(identity, delimiter,
                    ipc::ErrorReply(req->type, req->id,
                                    absl::FailedPreconditionError(
                                        "FETCH needs peer daemons: start polykvd with --peer")));
        continue;
      }
      Requester who;
      who.uid = peer_uid;
      who.trusted_paths = ipc_path.empty() || !have_cred || peer_uid == 0 ||
                          peer_uid == static_cast<uint32_t>(getuid());
      StartCreate(identity, delimiter, *std::move(req), who);
      continue;
    }
    Send(identity, delimiter,
         ServeGuarded(*req, metrics.get(), [&] { return Dispatch(*req, peer_pid); }));
  }
}

void Daemon::Impl::Shutdown() {
  if (shut_down) return;
  shut_down = true;
  // 1. Tell every client with a create in flight that it is cancelled, before the socket
  //    closes (a client would otherwise wait for a reply that never comes).
  if (creates) {
    {
      std::lock_guard<std::mutex> lock(creates->mu);
      creates->stop = true;
      creates->queue.clear();
    }
    creates->cv.notify_all();
  }
  size_t cancelled = 0;
  for (auto& [key, t] : tracked) {
    t.cancel->store(true);
    const Status why = absl::CancelledError(
        absl::StrCat("polykvd is shutting down: the ",
                     t.type == ipc::MessageType::kCreatePool ? "create" : "fetch",
                     " was cancelled (retry once it is back)"));
    cancelled += 1 + t.joined.size();
    if (!router) continue;
    for (const Tracked::Joined& j : t.joined) {
      Send(j.identity, j.delimiter, ipc::ErrorReply(t.type, j.request_id, why));
    }
    Send(t.identity, t.delimiter, ipc::ErrorReply(t.type, t.request_id, why));
  }
  if (cancelled > 0) spdlog::info("cancelled {} create(s) in flight", cancelled);
  tracked.clear();
  creates_by_work.clear();
  if (manager) manager->Shutdown();  // running creates stop at their next check
  try {
    if (router) {
      router->set(zmq::sockopt::linger, 1000);  // let the CANCELLED replies out
      router->close();
    }
  } catch (const zmq::error_t&) {
  }
  fd_server.reset();
  // 2. Wait a bounded time for the workers; one blocked in a system call is left behind
  //    (it holds only shared state and finds the manager shut down when it returns).
  const auto deadline =
      Clock::now() +
      std::chrono::milliseconds(std::llround(std::max(0.0, options.shutdown_grace_seconds) * 1000));
  for (;;) {
    bool all = true;
    for (const auto& w : workers) all = all && w.done->load();
    if (all || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (auto& w : workers) {
    if (!w.thread.joinable()) continue;
    if (w.done->load()) {
      w.thread.join();
    } else {
      w.thread.detach();
      ++left_behind;
    }
  }
  workers.clear();
  if (left_behind > 0) {
    spdlog::warn("{} create worker(s) still busy after {} s; not waiting for them", left_behind,
                 options.shutdown_grace_seconds);
  }
  zap_stop.store(true);
  if (zap_thread.joinable()) zap_thread.join();
  metrics_server.reset();  // its handler reads the manager
  if (left_behind == 0) {
    if (creates) creates->peers.reset();
    peers.reset();  // stops the peer channel and drops its transfers
  }
  manager.reset();
  creates.reset();
  store.reset();  // a worker left behind still holds it through CreateShared
  try {
    ctx.shutdown();
    ctx.close();
  } catch (const zmq::error_t&) {
  }
  if (!ipc_path.empty() && owns_files) {
    unlink(ipc_path.c_str());
    unlink(pid_path.c_str());
  }
  if (owns_files) spdlog::info("polykvd stopped");
}

// ---------------------------------------------------------------------------------------

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Daemon::~Daemon() = default;
const std::string& Daemon::endpoint() const { return impl_->endpoint; }
const std::string& Daemon::instance() const { return impl_->instance; }
const std::string& Daemon::fd_socket() const { return impl_->fd_path; }
int Daemon::workers_left_behind() const { return impl_->left_behind; }
PoolManager& Daemon::pools() { return *impl_->manager; }
int Daemon::metrics_port() const {
  return impl_->metrics_server ? impl_->metrics_server->port() : 0;
}

StatusOr<std::string> Daemon::Impl::CheckOptions(const DaemonOptions& o) {
  std::string backend = o.backend;
  if (backend == "auto") {
    backend = ipc::CudaAvailable() ? "cuda" : "host";
    spdlog::info("backend auto -> {} ({})", backend,
                 backend == "cuda"
                     ? "a CUDA device is usable: pools live in device memory; agents attend in "
                       "place with --device cuda, CPU agents need --allow-copy"
                     : "no usable CUDA device: pools live in host memory (memfd)");
  } else if (backend == "cuda" && !ipc::CudaAvailable()) {
    return absl::FailedPreconditionError("--backend cuda but no CUDA device is usable");
  } else if (backend != "host" && backend != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("unknown backend \"", backend, "\""));
  }
  if (!(o.lease_seconds > 0)) return absl::InvalidArgumentError("lease seconds must be > 0");
  if (o.create_workers < 1) return absl::InvalidArgumentError("create workers must be >= 1");
  if (o.max_queued_creates < 0)
    return absl::InvalidArgumentError("max queued creates must be >= 0");
  roles = std::make_unique<Roles>(o);
  if (o.threads >= 0) model::SetComputeThreads(o.threads);
  return backend;
}

Status Daemon::Impl::ClaimEndpoint(const DaemonOptions& o) {
  if (ipc_path.empty()) {
    spdlog::warn("endpoint {} is not ipc://: peer uids cannot be checked", endpoint);
    return absl::OkStatus();
  }
  const std::string& path = ipc_path;
  if (path.size() > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("ipc socket path ", path, " is too long (max ~100 chars)"));
  }
  pid_path = path + ".pid";
  legacy_segments_path = path + ".segments";
  const std::string dir = path.rfind('/') == 0 ? "/" : path.substr(0, path.rfind('/'));
  POLYKV_RETURN_IF_ERROR(MkdirP(dir));
  POLYKV_RETURN_IF_ERROR(CheckSocketFolder(dir));
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " exists and is not a socket; refusing to replace it"));
    }
    auto pong = Probe(endpoint, 500);
    if (pong.ok()) {
      return absl::AlreadyExistsError(
          absl::StrCat("another polykvd (pid ", pong->daemon_pid, ") is serving ", endpoint));
    }
    spdlog::warn("removing stale socket {} (no daemon answered)", path);
    unlink(path.c_str());
  }
  std::ifstream pidf(pid_path);
  pid_t old_pid = 0;
  std::string old_comm;
  if (pidf >> old_pid) {
    std::getline(pidf >> std::ws, old_comm);
    if (old_pid != getpid() && PidAlive(old_pid) && ProcComm(old_pid) == old_comm) {
      return absl::AlreadyExistsError(absl::StrCat("polykvd pid ", old_pid, " (", pid_path,
                                                   ") is alive but not answering on ", endpoint,
                                                   "; stop it first"));
    }
    spdlog::warn(
        "previous polykvd (pid {}) died; its pools were sealed memfds and went "
        "with it",
        old_pid);
  }
  // Older polykvd versions kept pools as named POSIX shm segments and listed them in
  // <socket>.segments: remove the ones with our prefix (any prefix, not only /polykv).
  if (std::ifstream segf(legacy_segments_path); segf) {
    std::string name;
    int removed = 0;
    while (std::getline(segf, name)) {
      if (name.size() <= o.shm_prefix.size() || name.rfind(o.shm_prefix, 0) != 0) continue;
      if (ipc::ShmRegion::Remove(name).ok()) ++removed;
    }
    spdlog::warn("removed {} stale shm segment(s) with prefix {} listed by an older polykvd",
                 removed, o.shm_prefix);
    segf.close();
    unlink(legacy_segments_path.c_str());
  }
  return absl::OkStatus();
}

Status Daemon::Impl::ChooseFdPath(const DaemonOptions& o) {
  fd_path = o.fd_socket;
  if (!fd_path.empty()) return absl::OkStatus();
  if (!ipc_path.empty()) {
    fd_path = ipc_path + ".fds";
    return absl::OkStatus();
  }
  const std::string dir = absl::StrCat("/tmp/polykv-", getuid());
  POLYKV_RETURN_IF_ERROR(MkdirP(dir));
  POLYKV_RETURN_IF_ERROR(CheckSocketFolder(dir));
  chmod(dir.c_str(), 0700);
  fd_path = absl::StrCat(dir, "/polykvd-", getpid(), ".fds");
  return absl::OkStatus();
}

StatusOr<PoolManagerOptions> Daemon::Impl::ConfigurePools(const DaemonOptions& o,
                                                          const std::string& backend) {
  PoolManagerOptions pm;
  pm.backend = backend;
  pm.memory_cap = o.memory_cap;
  pm.lease_ms = std::max<int64_t>(1, std::llround(o.lease_seconds * 1000));
  pm.model_path = o.model_path;
  pm.models_dirs = o.models_dirs;
  pm.shm_prefix = o.shm_prefix;
  pm.fd_socket = fd_path;
  pm.loader = o.loader;
  pm.threads = o.threads;
  pm.model_cache_models = o.model_cache_models;
  pm.model_cache_bytes = o.model_cache_bytes;
  pm.test_create_delay_ms = o.test_create_delay_ms;
  // Persisted pools.
  if (!o.state_dir.empty()) {
    POLYKV_ASSIGN_OR_RETURN(std::unique_ptr<PoolStore> opened,
                            PoolStore::Open(o.state_dir, o.state_budget));
    store = std::shared_ptr<PoolStore>(std::move(opened));
    pm.store = store.get();
  } else if (o.preload || o.state_budget) {
    return absl::InvalidArgumentError("--preload and --state-budget need --state-dir");
  }
  return pm;
}

Status Daemon::Impl::BindControlSocket() {
  try {
    zmq::socket_t zap(ctx, zmq::socket_type::rep);
    zap.bind(kZapEndpoint);
    zap_thread = std::thread(&Impl::ZapLoop, this, std::move(zap));
    router = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::router);
    router->set(zmq::sockopt::zap_domain, "polykv");
    router->set(zmq::sockopt::maxmsgsize, kZmqMaxMsgSize);
    router->set(zmq::sockopt::linger, 0);
    router->set(zmq::sockopt::sndhwm, 10000);
    router->bind(endpoint);
    owns_files = true;
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(absl::StrCat("cannot bind ", endpoint, ": ", e.what()));
  }
  return absl::OkStatus();
}

void Daemon::Impl::StartPools(PoolManagerOptions pm) {
  manager = std::make_shared<PoolManager>(std::move(pm));
  creates = std::make_shared<CreateShared>();
  creates->manager = manager;
  creates->store = store;
  creates->metrics = metrics;
}

Status Daemon::Impl::StartPeers(const DaemonOptions& o) {
  if (!o.peer.enabled()) return absl::OkStatus();
  Peers::Hooks hooks;
  std::shared_ptr<PoolManager> m = manager;
  hooks.export_pool = [m](const std::string& id) { return m->ExportForPeer(id); };
  hooks.list_pools = [m] { return m->List(); };
  hooks.instance = instance;
  hooks.version = POLYKV_VERSION;
  POLYKV_ASSIGN_OR_RETURN(std::unique_ptr<Peers> started, Peers::Start(o.peer, std::move(hooks)));
  peers = std::shared_ptr<Peers>(std::move(started));
  manager->SetPeers(peers.get());
  creates->peers = peers;
  return absl::OkStatus();
}

Status Daemon::Impl::StartWorkers(const DaemonOptions& o) {
  creates->instance = instance;
  creates->capacity = static_cast<size_t>(o.max_queued_creates);
  creates->workers = static_cast<size_t>(o.create_workers);
  creates->event_fd.Reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!creates->event_fd.valid()) {
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  for (int i = 0; i < o.create_workers; ++i) {
    auto done = std::make_shared<std::atomic<bool>>(false);
    workers.push_back(Worker{std::thread(CreateWorker, creates, done), done});
  }
  return absl::OkStatus();
}

Status Daemon::Impl::StartFdServer(const DaemonOptions& o) {
  Roles* r = roles.get();
  POLYKV_ASSIGN_OR_RETURN(
      fd_server,
      FdServer::Start(
          fd_path, o.socket_mode, manager, [r](uint32_t uid, uint32_t gid, uint32_t) -> Status {
            if (r->Of(uid, gid) != Roles::kNone) return absl::OkStatus();
            return absl::PermissionDeniedError(absl::StrCat(
                "uid ", uid, " is not allowed to map pools (", r->Describe(Roles::kReader), ")"));
          }));
  return absl::OkStatus();
}

Status Daemon::Impl::StartMetricsServer(const DaemonOptions& o) {
  if (o.metrics_listen.empty()) return absl::OkStatus();
  POLYKV_ASSIGN_OR_RETURN(metrics_server, MetricsServer::Start(o.metrics_listen, [this] {
                            return metrics->Render(*manager, store.get());
                          }));
  return absl::OkStatus();
}

void Daemon::Impl::PreloadPools(const DaemonOptions& o) {
  if (!o.preload || !store) return;
  const auto t0 = Clock::now();
  const int n = manager->PreloadPersisted();
  spdlog::info("preloaded {} of {} persisted pool(s) in {:.1f} ms", n, store->count(),
               std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
}

void Daemon::Impl::PublishSocket(const DaemonOptions& o) {
  if (ipc_path.empty()) return;
  const std::string& path = ipc_path;
  if (chmod(path.c_str(), o.socket_mode) != 0) {
    spdlog::warn("chmod {:o} {}: {}", o.socket_mode, path, std::strerror(errno));
  }
  if (struct group* g = getgrnam("polykv"); g != nullptr) {
    if (chown(path.c_str(), static_cast<uid_t>(-1), g->gr_gid) != 0) {
      spdlog::warn("chgrp polykv {}: {}", path, std::strerror(errno));
    }
  }
  WriteFileAtomic(pid_path, absl::StrCat(getpid(), " ", ProcComm(getpid()), "\n"));
}

StatusOr<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions o) {
  // Each step returns the error Start returns; `impl` going out of scope then undoes what the
  // earlier steps did (Impl::Shutdown: workers, sockets, files).
  auto impl = std::make_unique<Impl>();
  impl->endpoint = o.endpoint.empty() ? ipc::DefaultEndpoint() : o.endpoint;
  impl->ipc_path = IpcPath(impl->endpoint);
  impl->instance = RandomInstanceId();
  POLYKV_ASSIGN_OR_RETURN(const std::string backend, impl->CheckOptions(o));
  POLYKV_RETURN_IF_ERROR(impl->ClaimEndpoint(o));
  if (o.models_dirs.empty()) {
    spdlog::info("no --models-dir: only uid {} and root may name model files", getuid());
  }
  POLYKV_RETURN_IF_ERROR(impl->ChooseFdPath(o));
  POLYKV_ASSIGN_OR_RETURN(PoolManagerOptions pm, impl->ConfigurePools(o, backend));
  POLYKV_RETURN_IF_ERROR(impl->BindControlSocket());
  impl->StartPools(std::move(pm));
  POLYKV_RETURN_IF_ERROR(impl->StartPeers(o));
  POLYKV_RETURN_IF_ERROR(impl->StartWorkers(o));
  POLYKV_RETURN_IF_ERROR(impl->StartFdServer(o));
  POLYKV_RETURN_IF_ERROR(impl->StartMetricsServer(o));
  impl->PreloadPools(o);
  impl->PublishSocket(o);
  impl->options = std::move(o);
  spdlog::info(
      "polykvd {} serving {} (instance {}, backend {}, memory cap {}, lease {} s, "
      "{} create worker(s), queue {}, {}; {})",
      POLYKV_VERSION, impl->endpoint, impl->instance.substr(0, 8), backend,
      impl->options.memory_cap ? std::to_string(impl->options.memory_cap) + " bytes"
                               : std::string("unlimited"),
      impl->options.lease_seconds, impl->options.create_workers, impl->options.max_queued_creates,
      impl->roles->Describe(Roles::kOperator),
      impl->options.models_dirs.empty()
          ? std::string("no model folders")
          : "model folders " + absl::StrJoin(impl->options.models_dirs, ", "));
  return std::unique_ptr<Daemon>(new Daemon(std::move(impl)));
}

Status Daemon::Run(const std::atomic<bool>* external_stop) {
  Impl& d = *impl_;
#ifdef POLYKV_HAVE_SYSTEMD
  sd_notifyf(0, "READY=1\nSTATUS=serving %s\nMAINPID=%d", d.endpoint.c_str(),
             static_cast<int>(getpid()));
  uint64_t watchdog_usec = 0;
  if (sd_watchdog_enabled(0, &watchdog_usec) <= 0) watchdog_usec = 0;
  auto last_watchdog = Clock::now();
#endif
  const auto tick = std::chrono::milliseconds(std::min<int64_t>(
      ipc::kHeartbeatMs / 2, std::max<int64_t>(10, std::llround(d.options.sweep_seconds * 1000))));
  auto last_sweep = Clock::now();
  while (!stop_.load() && !(external_stop && external_stop->load())) {
    zmq::pollitem_t items[] = {{static_cast<void*>(*d.router), 0, ZMQ_POLLIN, 0},
                               {nullptr, d.creates->event_fd.get(), ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 2, tick);
      if (items[0].revents & ZMQ_POLLIN) d.HandleRouter();
      if (items[1].revents & ZMQ_POLLIN) d.ForwardEvents();
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) spdlog::error("control loop: {}", e.what());
      if (e.num() == ETERM) break;
    }
    const auto now = Clock::now();
    d.Heartbeats();
    if (now - last_sweep >= tick) {
      last_sweep = now;
      d.manager->SweepExpiredLeases();
    }
#ifdef POLYKV_HAVE_SYSTEMD
    if (watchdog_usec > 0 && now - last_watchdog >= std::chrono::microseconds(watchdog_usec / 2)) {
      last_watchdog = now;
      sd_notify(0, "WATCHDOG=1");
    }
#endif
  }
  spdlog::info("polykvd stopping: releasing pools");
#ifdef POLYKV_HAVE_SYSTEMD
  sd_notify(0, "STOPPING=1");
#endif
  d.Shutdown();
  return absl::OkStatus();
}

}  // namespace polykv::daemon
