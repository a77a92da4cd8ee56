// polykvd's control server (see daemon.h; its files by role are listed in daemon_internal.h):
// the control loop (ZAP, receive, roles, inline requests), Run and Shutdown.
#include "daemon.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <thread>
#include <zmq.hpp>

#ifdef POLYKV_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "absl/strings/str_cat.h"
#include "daemon_internal.h"
#include "polykv/ipc/protocol.h"
#include "polykv/ipc/zmq_frames.h"
#include "serve_guarded.h"

#ifndef POLYKV_VERSION
#define POLYKV_VERSION "0.0.0"
#endif

namespace polykv::daemon {
namespace {

bool NeedsOperator(ipc::MessageType t) {
  return ipc::SpecOf(t).role == ipc::MessageRole::kOperator;
}

}  // namespace

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
