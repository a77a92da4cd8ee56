// polykvd's control server internals shared by its files (not installed): the create
// queue's shared state and the server's Impl. The server's files, by role:
//   daemon.cc         the control loop: ZAP, receive, roles, dispatch of inline requests,
//                     Run, Shutdown
//   daemon_create.cc  creates and fetches: single flight, admission to the queue, the worker
//                     threads, PROGRESS forwarding and heartbeats
//   daemon_start.cc   Daemon::Start's steps (endpoint, sockets, pools, peers, workers, files)
//   daemon_flags.cc   the command-line flags and byte sizes
//   roles.h           reader and operator roles
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "daemon.h"
#include "fd_server.h"
#include "metrics.h"
#include "peers.h"
#include "polykv/ipc/protocol.h"
#include "pool_manager.h"
#include "pool_store.h"
#include "roles.h"

namespace polykv::daemon {

using Clock = std::chrono::steady_clock;

/// What makes two CREATE_POOLs the same work: every field the create reads, and who asks
/// (the requester decides which model paths may be opened). Length-prefixed, so no two
/// different requests give one key.
std::string CreateWorkKey(const ipc::Request& r, const Requester& who);

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

/// A create worker thread: runs queued creates and fetches until `shared->stop`, posting
/// their PROGRESS and final replies; sets `done` when it returns.
void CreateWorker(std::shared_ptr<CreateShared> shared, std::shared_ptr<std::atomic<bool>> done);

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
  /// libtorch's threads. Returns where pools live.
  [[nodiscard]] StatusOr<ipc::PoolMemory> CheckOptions(const DaemonOptions& o);
  /// ipc:// only: the socket folder, a live daemon on the endpoint (kAlreadyExists), a stale
  /// socket or pid file, the shm segments of older versions.
  [[nodiscard]] Status ClaimEndpoint(const DaemonOptions& o);
  /// The pool-descriptor socket's path (--fd-socket, <socket>.fds, or one under /tmp).
  [[nodiscard]] Status ChooseFdPath(const DaemonOptions& o);
  /// The pool manager's options; opens the state folder (--state-dir) into `store`.
  [[nodiscard]] StatusOr<PoolManagerOptions> ConfigurePools(const DaemonOptions& o,
                                                            ipc::PoolMemory backend);
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

}  // namespace polykv::daemon
