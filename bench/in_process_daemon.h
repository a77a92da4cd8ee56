// The daemon benchmarks' polykvd: their common flags, a private folder, host-backend options
// in it, a daemon served on a thread of this process, and a DEALER client that exits on any
// failed reply.
#pragma once

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "bench_documents.h"
#include "daemon.h"
#include "polykv/ipc/pool_memory.h"
#include "polykv/ipc/protocol.h"
#include "support/files.h"

namespace polykv::bench {

/// The flags every daemon benchmark takes.
struct DaemonBenchFlags {
  std::string codec = "k8v3";  ///< --codec: the pool codec
  int threads = 0;             ///< --threads: libtorch threads (0 = all cores)

  /// Adds --codec and --threads to `app`.
  void AddTo(CLI::App& app) {
    app.add_option("--codec", codec, "k8v2|k8v3|k8v4|none")->capture_default_str();
    app.add_option("--threads", threads, "libtorch threads (0 = all cores)");
  }
};

/// What a daemon benchmark starts from once its flags are parsed.
struct DaemonBenchSetup {
  std::string model_label;                ///< which model and document (DocumentCreateRequest)
  ipc::Request create;                    ///< the benchmark document's CREATE_POOL request
  std::unique_ptr<support::TempDir> dir;  ///< a private folder, removed on every way out
};

/// Sets spdlog to warn, builds the document's CREATE_POOL request with the flags' codec and
/// makes a private folder /tmp/<dir_prefix>...; nullopt after printing why not.
inline std::optional<DaemonBenchSetup> SetUpDaemonBench(const DaemonBenchFlags& flags,
                                                        const std::string& dir_prefix) {
  spdlog::set_level(spdlog::level::warn);
  DaemonBenchSetup setup;
  setup.create = DocumentCreateRequest(flags.codec, &setup.model_label);
  setup.dir = std::make_unique<support::TempDir>(dir_prefix);
  if (!setup.dir->ok()) {
    std::fprintf(stderr, "error: cannot create a temporary folder under /tmp\n");
    return std::nullopt;
  }
  return setup;
}

/// Options of a host-backend daemon with its control socket in `dir`, `threads` libtorch
/// threads and shm names "/<shm_tag><pid>-".
inline daemon::DaemonOptions HostDaemonOptions(const std::string& dir, int threads,
                                               const std::string& shm_tag) {
  daemon::DaemonOptions o;
  o.endpoint = "ipc://" + dir + "/control.sock";
  o.backend = ipc::PoolMemoryName(ipc::PoolMemory::kHost);
  o.threads = threads;
  o.shm_prefix = "/" + shm_tag + std::to_string(getpid()) + "-";
  return o;
}

/// A daemon in this process, served on a thread until destroyed (Stop, then join).
struct RunningDaemon {
  std::unique_ptr<daemon::Daemon> daemon;
  std::thread server;
  ~RunningDaemon() {
    daemon->Stop();
    server.join();
  }
};

/// Starts a daemon with `o` and serves it on a thread; exits the process with the reason
/// when it does not start.
inline std::unique_ptr<RunningDaemon> StartDaemon(const daemon::DaemonOptions& o) {
  auto d = daemon::Daemon::Start(o);
  if (!d.ok()) {
    std::fprintf(stderr, "daemon: %s\n", d.status().ToString().c_str());
    std::exit(1);
  }
  auto r = std::make_unique<RunningDaemon>();
  r->daemon = *std::move(d);
  daemon::Daemon* p = r->daemon.get();
  r->server = std::thread([p] { (void)p->Run(); });
  return r;
}

/// A DEALER socket on the control endpoint; Call exits the process on a bad or failed reply.
class Client {
 public:
  explicit Client(const std::string& endpoint) : s_(ctx_, zmq::socket_type::dealer) {
    s_.set(zmq::sockopt::linger, 0);
    s_.connect(endpoint);
  }
  /// Sends `req` (with the next request id) and returns its final reply (progress skipped).
  ipc::Reply Call(ipc::Request req) {
    req.id = ++id_;
    std::string frame = ipc::EncodeRequest(req);
    s_.send(zmq::message_t(), zmq::send_flags::sndmore);
    s_.send(zmq::buffer(frame), zmq::send_flags::none);
    for (;;) {
      std::vector<zmq::message_t> parts;
      (void)zmq::recv_multipart(s_, std::back_inserter(parts));
      auto r = ipc::DecodeReply(parts.back().to_string_view());
      if (!r.ok()) {
        std::fprintf(stderr, "bad reply: %s\n", r.status().ToString().c_str());
        std::exit(1);
      }
      if (r->type == ipc::MessageType::kProgress || r->id != req.id) continue;
      if (!r->ok) {
        std::fprintf(stderr, "%s failed: %s %s\n",
                     std::string(ipc::MessageTypeName(req.type)).c_str(), r->code.c_str(),
                     r->error.c_str());
        std::exit(1);
      }
      return *r;
    }
  }

 private:
  zmq::context_t ctx_;
  zmq::socket_t s_;
  uint64_t id_ = 0;
};

}  // namespace polykv::bench
