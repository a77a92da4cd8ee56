// polykvd's control server (see daemon.h).
#include "daemon.h"

#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <list>
#include <set>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#ifdef POLYKV_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "polykv/ipc/cuda_ipc.h"
#include "polykv/ipc/protocol.h"
#include "polykv/model/llama.h"
#include "metrics.h"
#include "pool_store.h"

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
    std::string frame = ipc::EncodeRequest(ping);
    s.send(zmq::message_t(), zmq::send_flags::sndmore);
    s.send(zmq::buffer(frame), zmq::send_flags::none);
    zmq::pollitem_t item{static_cast<void*>(s), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms));
    if (!(item.revents & ZMQ_POLLIN)) return absl::DeadlineExceededError("no reply");
    std::vector<zmq::message_t> parts;
    (void)zmq::recv_multipart(s, std::back_inserter(parts));
    if (parts.empty()) return absl::DataLossError("empty reply");
    return ipc::DecodeReply(parts.back().to_string_view());
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
      {"", 1},           {"B", 1},
      {"K", 1024.0},     {"KIB", 1024.0},     {"KB", 1e3},
      {"M", 1048576.0},  {"MIB", 1048576.0},  {"MB", 1e6},
      {"G", 1073741824.0}, {"GIB", 1073741824.0}, {"GB", 1e9},
      {"T", 1099511627776.0}, {"TIB", 1099511627776.0}, {"TB", 1e12},
  };
  for (const auto& s : kSuffixes) {
    if (suffix == s.s) {
      double bytes = value * s.mult;
      if (!(bytes >= 0) || bytes > 1.8e19) {
        return absl::InvalidArgumentError(absl::StrCat("byte size \"", text_in,
                                                       "\" is out of range"));
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
  app.add_option("--backend", o.backend, "Pool memory: auto (cuda when a GPU is usable), host, cuda")
      ->check(CLI::IsMember({"auto", "host", "cuda"}))
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--memory-cap",
         [&o](const std::string& s) {
           auto v = ParseByteSize(s);
           if (!v.ok()) throw CLI::ValidationError("--memory-cap", std::string(v.status().message()));
           o.memory_cap = *v;
         },
         "Bytes of pools per backend (suffixes K M G T; 0 = unlimited)");
  app.add_option("--lease-seconds", o.lease_seconds, "Lease duration granted by ATTACH/RENEW")
      ->check(CLI::Range(0.05, 86400.0))
      ->capture_default_str();
  app.add_option("--model-path", o.model_path,
                 "Directory searched for relative model names (repeatable)");
  app.add_option("--allow-uid", o.allow_uids,
                 "Uid allowed to use the daemon (repeatable; default: own uid and root)");
  app.add_option("--threads", o.threads, "libtorch intra-op threads (0 = all cores)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  app.add_option("--log-level", o.log_level, "trace|debug|info|warn|error|critical|off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}))
      ->capture_default_str();
  app.add_option("--shm-prefix", o.shm_prefix, "POSIX shm name prefix of host pools")
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
         "Mode of the ipc socket file (octal, default 0660)");
  app.add_option("--state-dir", o.state_dir,
                 "Folder of persisted pools: every published pool is also written there and "
                 "restored after a restart (systemd: $STATE_DIRECTORY; empty = memory only)");
  app.add_option_function<std::string>(
         "--state-budget",
         [&o](const std::string& s) {
           auto v = ParseByteSize(s);
           if (!v.ok()) throw CLI::ValidationError("--state-budget", std::string(v.status().message()));
           o.state_budget = *v;
         },
         "Disk bytes of pool files; least recently used files go first (0 = unlimited)");
  app.add_flag("--preload", o.preload,
               "Restore every persisted pool at start (default: on first create or attach)");
  app.add_option("--metrics-listen", o.metrics_listen,
                 "Serve Prometheus metrics on http://HOST:PORT/metrics (e.g. 127.0.0.1:9464; "
                 "port 0 = any free port, logged)");
}

std::string IpcPath(const std::string& endpoint) {
  constexpr char kIpc[] = "ipc://";
  if (endpoint.rfind(kIpc, 0) != 0) return "";
  return endpoint.substr(sizeof(kIpc) - 1);
}

// ---------------------------------------------------------------------------------------

struct Daemon::Impl {
  DaemonOptions options;
  std::string endpoint;
  std::string ipc_path;  // "" for tcp
  std::string pid_path, segments_path;
  std::set<uint32_t> allowed;
  std::unique_ptr<PoolStore> store;  // before manager: the manager points at it
  std::unique_ptr<PoolManager> manager;
  Metrics metrics;
  std::unique_ptr<MetricsServer> metrics_server;

  zmq::context_t ctx;
  std::unique_ptr<zmq::socket_t> router;
  std::unique_ptr<zmq::socket_t> results;  // PULL: worker -> main loop
  std::string results_endpoint;
  std::thread zap_thread;
  std::atomic<bool> zap_stop{false};

  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::list<Worker> workers;
  bool shut_down = false;
  bool owns_files = false;  // set once our socket is bound: only then are the files ours

  ~Impl() { Shutdown(); }

  void ZapLoop(zmq::socket_t zap);
  void HandleRouter();
  void ForwardResults();
  void Send(const zmq::message_t& identity, bool delimiter, const std::string& payload);
  void SendReply(const zmq::message_t& identity, bool delimiter, const ipc::Reply& reply) {
    Send(identity, delimiter, ipc::EncodeReply(reply));
  }
  // A refused or undecodable frame (no request type to count it under).
  void SendRefusal(const zmq::message_t& identity, bool delimiter, const ipc::Reply& reply) {
    metrics.ObserveError(reply.code);
    SendReply(identity, delimiter, reply);
  }
  ipc::Reply Dispatch(const ipc::Request& req, uint32_t peer_pid);
  void StartCreate(zmq::message_t identity, bool delimiter, ipc::Request req);
  void ReapWorkers(bool all);
  void Shutdown();
};

void Daemon::Impl::ZapLoop(zmq::socket_t zap) {
  // ZAP (RFC 27): we accept every handshake and pass the peer's "uid:gid:pid" (from
  // SO_PEERCRED, which libzmq appends to the ipc peer address) as the User-Id, so the main
  // loop can answer refused uids with a clear PERMISSION_DENIED error.
  while (!zap_stop.load()) {
    zmq::pollitem_t item{static_cast<void*>(zap), 0, ZMQ_POLLIN, 0};
    try {
      zmq::poll(&item, 1, std::chrono::milliseconds(100));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> req;
      if (!zmq::recv_multipart(zap, std::back_inserter(req))) continue;
      std::string request_id = req.size() > 1 ? req[1].to_string() : "";
      std::string address = req.size() > 3 ? req[3].to_string() : "";
      std::string user_id;
      std::vector<std::string> parts = absl::StrSplit(address, ':');
      if (parts.size() >= 4) {
        user_id = absl::StrCat(parts[parts.size() - 3], ":", parts[parts.size() - 2], ":",
                               parts[parts.size() - 1]);
      }
      std::array<zmq::const_buffer, 6> reply = {
          zmq::str_buffer("1.0"), zmq::buffer(request_id), zmq::str_buffer("200"),
          zmq::str_buffer("OK"),  zmq::buffer(user_id),    zmq::const_buffer(nullptr, 0)};
      (void)zmq::send_multipart(zap, reply);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) break;
      if (e.num() != EINTR) spdlog::warn("ZAP handler: {}", e.what());
    }
  }
}

void Daemon::Impl::Send(const zmq::message_t& identity, bool delimiter,
                        const std::string& payload) {
  try {
    zmq::message_t id(identity.data(), identity.size());
    router->send(id, zmq::send_flags::sndmore);
    if (delimiter) router->send(zmq::message_t(), zmq::send_flags::sndmore);
    router->send(zmq::buffer(payload), zmq::send_flags::none);
  } catch (const zmq::error_t& e) {
    spdlog::warn("send reply: {}", e.what());
  }
}

ipc::Reply Daemon::Impl::Dispatch(const ipc::Request& req, uint32_t peer_pid) {
  ipc::Reply r;
  r.type = req.type;
  r.id = req.id;
  auto fail = [&](const Status& s) { return ipc::ErrorReply(req.type, req.id, s); };
  switch (req.type) {
    case ipc::MessageType::kPing:
      r.daemon_version = POLYKV_VERSION;
      r.daemon_pid = static_cast<uint32_t>(getpid());
      r.memory_used = manager->memory_used();
      r.memory_cap = manager->memory_cap();
      return r;
    case ipc::MessageType::kList:
      r.pools = manager->List();
      return r;
    case ipc::MessageType::kStats:
      if (!req.pool_id.empty()) {
        auto info = manager->Info(req.pool_id);
        if (!info.ok()) return fail(info.status());
        r.pool = *info;
        r.pools = {*info};
      } else {
        r.pools = manager->List();
      }
      r.daemon_version = POLYKV_VERSION;
      r.daemon_pid = static_cast<uint32_t>(getpid());
      r.memory_used = manager->memory_used();
      r.memory_cap = manager->memory_cap();
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
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "message type ", std::string(ipc::MessageTypeName(req.type)), " is not a request")));
  }
}

void Daemon::Impl::StartCreate(zmq::message_t identity, bool delimiter, ipc::Request req) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  auto id = std::make_shared<zmq::message_t>(std::move(identity));
  std::thread t([this, id, delimiter, req = std::move(req), done]() {
    try {
      zmq::socket_t push(ctx, zmq::socket_type::push);
      push.set(zmq::sockopt::linger, 0);
      push.connect(results_endpoint);
      auto send = [&](const ipc::Reply& reply) {
        std::string payload = ipc::EncodeReply(reply);
        zmq::message_t ident;
        ident.copy(*id);
        std::array<zmq::message_t, 3> parts = {
            std::move(ident), zmq::message_t(delimiter ? "d" : "n", 1),
            zmq::message_t(payload.data(), payload.size())};
        (void)zmq::send_multipart(push, parts);
      };
      auto last = Clock::now() - std::chrono::seconds(1);
      ProgressFn progress = [&](const std::string& stage, int64_t d, int64_t total) {
        if (!req.progress) return;
        // At most ~20 PROGRESS messages a second, but always the first and last of a stage.
        auto now = Clock::now();
        if (d != 0 && d != total && now - last < std::chrono::milliseconds(50)) return;
        last = now;
        ipc::Reply p;
        p.type = ipc::MessageType::kProgress;
        p.id = req.id;
        p.stage = stage;
        p.done = d;
        p.total = total;
        send(p);
      };
      StatusOr<CreateResult> result = absl::InternalError("create did not run");
      const auto t0 = Clock::now();
      try {
        result = manager->CreatePool(req, progress);
      } catch (const std::exception& e) {
        result = absl::InternalError(absl::StrCat("create pool threw: ", e.what()));
      }
      ipc::Reply r;
      if (result.ok()) {
        r.type = ipc::MessageType::kCreatePool;
        r.id = req.id;
        r.pool = result->info;
        r.created = result->created;
        if (result->created && !result->restored) metrics.AddPrefillTokens(result->info.tokens);
      } else {
        r = ipc::ErrorReply(ipc::MessageType::kCreatePool, req.id, result.status());
      }
      metrics.ObserveRequest(ipc::MessageType::kCreatePool, r,
                             std::chrono::duration<double>(Clock::now() - t0).count());
      send(r);
    } catch (const zmq::error_t& e) {
      if (e.num() != ETERM) spdlog::warn("create worker: {}", e.what());
    }
    done->store(true);
  });
  workers.push_back(Worker{std::move(t), done});
}

void Daemon::Impl::ReapWorkers(bool all) {
  for (auto it = workers.begin(); it != workers.end();) {
    if (all || it->done->load()) {
      if (it->thread.joinable()) it->thread.join();
      it = workers.erase(it);
    } else {
      ++it;
    }
  }
}

void Daemon::Impl::ForwardResults() {
  for (int i = 0; i < 64; ++i) {
    std::vector<zmq::message_t> parts;
    auto n = zmq::recv_multipart(*results, std::back_inserter(parts), zmq::recv_flags::dontwait);
    if (!n) return;
    if (parts.size() != 3) continue;
    Send(parts[0], parts[1].to_string_view() == "d", parts[2].to_string());
  }
}

void Daemon::Impl::HandleRouter() {
  for (int i = 0; i < 256; ++i) {
    std::vector<zmq::message_t> parts;
    std::optional<size_t> n;
    try {
      n = zmq::recv_multipart(*router, std::back_inserter(parts), zmq::recv_flags::dontwait);
    } catch (const zmq::error_t& e) {
      spdlog::warn("receive: {}", e.what());
      return;
    }
    if (!n) return;
    if (parts.size() < 2) continue;  // identity only: nothing to answer
    const zmq::message_t& identity = parts[0];
    bool delimiter = parts.size() >= 3 && parts[1].size() == 0;
    const size_t body_frames = parts.size() - 1 - (delimiter ? 1 : 0);
    zmq::message_t& payload = parts.back();
    if (body_frames != 1) {
      SendRefusal(identity, delimiter,
                ipc::ErrorReply(ipc::MessageType::kError, 0,
                                absl::InvalidArgumentError(absl::StrCat(
                                    "expected one JSON frame after the delimiter, got ",
                                    body_frames))));
      continue;
    }
    // Peer credentials (ipc endpoints): "uid:gid:pid" from the ZAP handler.
    uint32_t peer_uid = 0, peer_pid = 0;
    bool have_cred = false;
    try {
      std::string user = payload.gets("User-Id");
      std::vector<std::string> f = absl::StrSplit(user, ':');
      if (f.size() == 3) {
        peer_uid = static_cast<uint32_t>(std::stoul(f[0]));
        peer_pid = static_cast<uint32_t>(std::stoul(f[2]));
        have_cred = true;
      }
    } catch (const std::exception&) {
    }
    std::string_view frame(static_cast<const char*>(payload.data()), payload.size());
    if (!ipc_path.empty()) {
      if (!have_cred || !allowed.count(peer_uid)) {
        std::string who = have_cred ? absl::StrCat("uid ", peer_uid, " (pid ", peer_pid, ")")
                                    : std::string("a peer with unknown credentials");
        spdlog::warn("refused request from {}: not in the allowed uids", who);
        SendRefusal(identity, delimiter,
                  ipc::ErrorReplyForFrame(
                      frame, absl::PermissionDeniedError(absl::StrCat(
                                 who, " is not allowed to use polykvd (allowed uids: ",
                                 absl::StrJoin(allowed, ", "), ")"))));
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
    if (req->type == ipc::MessageType::kCreatePool) {
      zmq::message_t ident;
      ident.copy(parts[0]);
      StartCreate(std::move(ident), delimiter, *std::move(req));
      continue;
    }
    ipc::Reply reply;
    const auto t0 = Clock::now();
    try {
      reply = Dispatch(*req, peer_pid);
    } catch (const std::exception& e) {
      reply = ipc::ErrorReply(req->type, req->id,
                              absl::InternalError(absl::StrCat("internal error: ", e.what())));
    }
    metrics.ObserveRequest(req->type, reply,
                           std::chrono::duration<double>(Clock::now() - t0).count());
    SendReply(identity, delimiter, reply);
  }
}

void Daemon::Impl::Shutdown() {
  if (shut_down) return;
  shut_down = true;
  try {
    if (router) router->close();  // stop accepting
  } catch (const zmq::error_t&) {
  }
  if (manager) manager->Shutdown();
  ReapWorkers(/*all=*/true);
  try {
    if (results) results->close();
  } catch (const zmq::error_t&) {
  }
  zap_stop.store(true);
  if (zap_thread.joinable()) zap_thread.join();
  metrics_server.reset();  // its handler reads the manager
  manager.reset();
  store.reset();
  try {
    ctx.shutdown();
    ctx.close();
  } catch (const zmq::error_t&) {
  }
  if (!ipc_path.empty() && owns_files) {
    unlink(ipc_path.c_str());
    unlink(pid_path.c_str());
    unlink(segments_path.c_str());
  }
  if (owns_files) spdlog::info("polykvd stopped");
}

// ---------------------------------------------------------------------------------------

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Daemon::~Daemon() = default;
const std::string& Daemon::endpoint() const { return impl_->endpoint; }
PoolManager& Daemon::pools() { return *impl_->manager; }

StatusOr<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions o) {
  auto impl = std::make_unique<Impl>();
  impl->endpoint = o.endpoint.empty() ? ipc::DefaultEndpoint() : o.endpoint;
  impl->ipc_path = IpcPath(impl->endpoint);

  // Backend.
  std::string backend = o.backend;
  if (backend == "auto") {
    backend = ipc::CudaAvailable() ? "cuda" : "host";
    spdlog::info("backend auto -> {} ({})", backend,
                 backend == "cuda" ? "a CUDA device is usable" : "no usable CUDA device");
  } else if (backend == "cuda" && !ipc::CudaAvailable()) {
    return absl::FailedPreconditionError("--backend cuda but no CUDA device is usable");
  } else if (backend != "host" && backend != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("unknown backend \"", backend, "\""));
  }
  if (!(o.lease_seconds > 0)) return absl::InvalidArgumentError("lease seconds must be > 0");
  if (o.allow_uids.empty()) {
    impl->allowed = {static_cast<uint32_t>(getuid()), 0u};
  } else {
    impl->allowed.insert(o.allow_uids.begin(), o.allow_uids.end());
  }
  if (o.threads >= 0) model::SetComputeThreads(o.threads);

  // Live daemon / stale socket / stale segments.
  if (!impl->ipc_path.empty()) {
    const std::string& path = impl->ipc_path;
    if (path.size() > 100) {
      return absl::InvalidArgumentError(
          absl::StrCat("ipc socket path ", path, " is too long (max ~100 chars)"));
    }
    impl->pid_path = path + ".pid";
    impl->segments_path = path + ".segments";
    POLYKV_RETURN_IF_ERROR(MkdirP(path.substr(0, path.rfind('/'))));
    struct stat st;
    if (lstat(path.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) {
        return absl::FailedPreconditionError(
            absl::StrCat(path, " exists and is not a socket; refusing to replace it"));
      }
      auto pong = Probe(impl->endpoint, 500);
      if (pong.ok()) {
        return absl::AlreadyExistsError(absl::StrCat("another polykvd (pid ", pong->daemon_pid,
                                                     ") is serving ", impl->endpoint));
      }
      spdlog::warn("removing stale socket {} (no daemon answered)", path);
      unlink(path.c_str());
    }
    std::ifstream pidf(impl->pid_path);
    pid_t old_pid = 0;
    std::string old_comm;
    if (pidf >> old_pid) {
      std::getline(pidf >> std::ws, old_comm);
      if (old_pid != getpid() && PidAlive(old_pid) && ProcComm(old_pid) == old_comm) {
        return absl::AlreadyExistsError(absl::StrCat(
            "polykvd pid ", old_pid, " (", impl->pid_path, ") is alive but not answering on ",
            impl->endpoint, "; stop it first"));
      }
      std::ifstream segf(impl->segments_path);
      std::string name;
      int removed = 0;
      while (std::getline(segf, name)) {
        if (name.rfind("/polykv", 0) != 0) continue;
        if (ipc::ShmRegion::Remove(name).ok()) ++removed;
      }
      spdlog::warn("previous polykvd (pid {}) died; removed {} stale shm segment(s)", old_pid,
                   removed);
    }
  } else {
    spdlog::warn("endpoint {} is not ipc://: peer uids cannot be checked", impl->endpoint);
  }

  // Pools.
  PoolManagerOptions pm;
  pm.backend = backend;
  pm.memory_cap = o.memory_cap;
  pm.lease_ms = std::max<int64_t>(1, std::llround(o.lease_seconds * 1000));
  pm.model_path = o.model_path;
  pm.shm_prefix = o.shm_prefix;
  pm.loader = o.loader;
  pm.threads = o.threads;
  if (!impl->segments_path.empty()) {
    std::string seg_path = impl->segments_path;
    pm.on_segments_changed = [seg_path](const std::vector<std::string>& names) {
      WriteFileAtomic(seg_path, names.empty() ? "" : absl::StrJoin(names, "\n") + "\n");
    };
  }

  // Persisted pools.
  if (!o.state_dir.empty()) {
    auto store = PoolStore::Open(o.state_dir, o.state_budget);
    if (!store.ok()) return store.status();
    impl->store = *std::move(store);
    pm.store = impl->store.get();
  } else if (o.preload || o.state_budget) {
    return absl::InvalidArgumentError("--preload and --state-budget need --state-dir");
  }

  // Sockets.
  try {
    zmq::socket_t zap(impl->ctx, zmq::socket_type::rep);
    zap.bind(kZapEndpoint);
    impl->zap_thread = std::thread(&Impl::ZapLoop, impl.get(), std::move(zap));
    impl->results_endpoint =
        absl::StrCat("inproc://polykvd-results-", reinterpret_cast<uintptr_t>(impl.get()));
    impl->results = std::make_unique<zmq::socket_t>(impl->ctx, zmq::socket_type::pull);
    impl->results->bind(impl->results_endpoint);
    impl->router = std::make_unique<zmq::socket_t>(impl->ctx, zmq::socket_type::router);
    impl->router->set(zmq::sockopt::zap_domain, "polykv");
    impl->router->set(zmq::sockopt::maxmsgsize, kZmqMaxMsgSize);
    impl->router->set(zmq::sockopt::linger, 0);
    impl->router->set(zmq::sockopt::sndhwm, 10000);
    impl->router->bind(impl->endpoint);
    impl->owns_files = true;
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(absl::StrCat("cannot bind ", impl->endpoint, ": ", e.what()));
  }
  impl->manager = std::make_unique<PoolManager>(std::move(pm));
  if (!o.metrics_listen.empty()) {
    Impl* d = impl.get();
    auto server = MetricsServer::Start(o.metrics_listen, [d] {
      return d->metrics.Render(*d->manager, d->store.get());
    });
    if (!server.ok()) return server.status();
    impl->metrics_server = *std::move(server);
  }
  if (o.preload && impl->store) {
    const auto t0 = Clock::now();
    const int n = impl->manager->PreloadPersisted();
    spdlog::info("preloaded {} of {} persisted pool(s) in {:.1f} ms", n, impl->store->count(),
                 std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  if (!impl->ipc_path.empty()) {
    const std::string& path = impl->ipc_path;
    if (chmod(path.c_str(), o.socket_mode) != 0) {
      spdlog::warn("chmod {:o} {}: {}", o.socket_mode, path, std::strerror(errno));
    }
    if (struct group* g = getgrnam("polykv"); g != nullptr) {
      if (chown(path.c_str(), static_cast<uid_t>(-1), g->gr_gid) != 0) {
        spdlog::warn("chgrp polykv {}: {}", path, std::strerror(errno));
      }
    }
    WriteFileAtomic(impl->pid_path, absl::StrCat(getpid(), " ", ProcComm(getpid()), "\n"));
  }
  impl->options = std::move(o);
  spdlog::info("polykvd {} serving {} (backend {}, memory cap {}, lease {} s, allowed uids {})",
               POLYKV_VERSION, impl->endpoint, backend,
               impl->options.memory_cap ? std::to_string(impl->options.memory_cap) + " bytes"
                                        : std::string("unlimited"),
               impl->options.lease_seconds, absl::StrJoin(impl->allowed, ","));
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
  const auto tick = std::chrono::milliseconds(
      std::max<int64_t>(10, std::llround(d.options.sweep_seconds * 1000)));
  auto last_sweep = Clock::now();
  while (!stop_.load() && !(external_stop && external_stop->load())) {
    zmq::pollitem_t items[] = {{static_cast<void*>(*d.router), 0, ZMQ_POLLIN, 0},
                               {static_cast<void*>(*d.results), 0, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 2, tick);
      if (items[0].revents & ZMQ_POLLIN) d.HandleRouter();
      if (items[1].revents & ZMQ_POLLIN) d.ForwardResults();
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) spdlog::error("control loop: {}", e.what());
      if (e.num() == ETERM) break;
    }
    const auto now = Clock::now();
    if (now - last_sweep >= tick) {
      last_sweep = now;
      d.manager->SweepExpiredLeases();
      d.ReapWorkers(false);
    }
#ifdef POLYKV_HAVE_SYSTEMD
    if (watchdog_usec > 0 &&
        now - last_watchdog >= std::chrono::microseconds(watchdog_usec / 2)) {
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
