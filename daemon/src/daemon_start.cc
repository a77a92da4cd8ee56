// polykvd's start (see daemon.h): Daemon::Start's steps, from the options to a bound control
// socket, the pool manager, the peers, the create workers, the descriptor and metrics servers
// and the socket's files; and the checks of an endpoint another daemon may hold.
#include <grp.h>
#include <openssl/rand.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "daemon_internal.h"
#include "polykv/ipc/cuda_ipc.h"
#include "polykv/ipc/shm_region.h"
#include "polykv/ipc/zmq_frames.h"
#include "polykv/model/llama.h"

#ifndef POLYKV_VERSION
#define POLYKV_VERSION "0.0.0"
#endif

namespace polykv::daemon {
namespace {

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

}  // namespace

StatusOr<ipc::PoolMemory> Daemon::Impl::CheckOptions(const DaemonOptions& o) {
  ipc::PoolMemory backend = ipc::PoolMemory::kHost;
  if (o.backend == "auto") {
    backend = ipc::CudaAvailable() ? ipc::PoolMemory::kCuda : ipc::PoolMemory::kHost;
    spdlog::info("backend auto -> {} ({})", ipc::PoolMemoryName(backend),
                 backend == ipc::PoolMemory::kCuda
                     ? "a CUDA device is usable: pools live in device memory; agents attend in "
                       "place with --device cuda, CPU agents need --allow-copy"
                     : "no usable CUDA device: pools live in host memory (memfd)");
  } else if (std::optional<ipc::PoolMemory> named = ipc::ParsePoolMemory(o.backend)) {
    backend = *named;
    if (backend == ipc::PoolMemory::kCuda && !ipc::CudaAvailable()) {
      return absl::FailedPreconditionError("--backend cuda but no CUDA device is usable");
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown backend \"", o.backend, "\""));
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
                                                          ipc::PoolMemory backend) {
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
  pm.prefill_on_device = ipc::ParsePoolMemory(o.prefill_device) == ipc::PoolMemory::kCuda;
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
  POLYKV_ASSIGN_OR_RETURN(const ipc::PoolMemory backend, impl->CheckOptions(o));
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
      POLYKV_VERSION, impl->endpoint, impl->instance.substr(0, 8), ipc::PoolMemoryName(backend),
      impl->options.memory_cap ? std::to_string(impl->options.memory_cap) + " bytes"
                               : std::string("unlimited"),
      impl->options.lease_seconds, impl->options.create_workers, impl->options.max_queued_creates,
      impl->roles->Describe(Roles::kOperator),
      impl->options.models_dirs.empty()
          ? std::string("no model folders")
          : "model folders " + absl::StrJoin(impl->options.models_dirs, ", "));
  return std::unique_ptr<Daemon>(new Daemon(std::move(impl)));
}

}  // namespace polykv::daemon
