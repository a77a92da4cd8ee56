// bench_restart: how long until a pool is attachable again after a polykvd restart, with
// --state-dir (restore from the pool file: lazily on ATTACH, on CREATE_POOL, or --preload at
// start) against the baseline without it (a fresh daemon re-prefills the document), all
// measured in the same run, each from Daemon::Start to an answered ATTACH. Also the cost of
// persisting on the first create (create with vs without --state-dir). SmolLM2-135M Q4_1 on
// robert_boulter.txt when POLYKV_SMOLLM2_GGUF is set, else stories260K with fixed token ids.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "bench_documents.h"
#include "daemon.h"
#include "polykv/ipc/protocol.h"
#include "support/files.h"

namespace {

using Clock = std::chrono::steady_clock;
using polykv::ipc::MessageType;
using polykv::ipc::Reply;
using polykv::ipc::Request;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

Reply Call(const std::string& endpoint, Request req) {
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.connect(endpoint);
  req.id = 1;
  std::string frame = polykv::ipc::EncodeRequest(req);
  s.send(zmq::message_t(), zmq::send_flags::sndmore);
  s.send(zmq::buffer(frame), zmq::send_flags::none);
  for (;;) {
    std::vector<zmq::message_t> parts;
    (void)zmq::recv_multipart(s, std::back_inserter(parts));
    auto r = polykv::ipc::DecodeReply(parts.back().to_string_view());
    if (!r.ok() || (r->type != MessageType::kProgress && !r->ok)) {
      std::fprintf(stderr, "%s failed: %s\n",
                   std::string(polykv::ipc::MessageTypeName(req.type)).c_str(),
                   r.ok() ? (r->code + " " + r->error).c_str() : r.status().ToString().c_str());
      std::exit(1);
    }
    if (r->type == MessageType::kProgress) continue;
    return *r;
  }
}

// A daemon in this process, served on a thread until destroyed.
struct Running {
  std::unique_ptr<polykv::daemon::Daemon> daemon;
  std::thread server;
  ~Running() {
    daemon->Stop();
    server.join();
  }
};

std::unique_ptr<Running> Start(const polykv::daemon::DaemonOptions& o) {
  auto d = polykv::daemon::Daemon::Start(o);
  if (!d.ok()) {
    std::fprintf(stderr, "daemon: %s\n", d.status().ToString().c_str());
    std::exit(1);
  }
  auto r = std::make_unique<Running>();
  r->daemon = *std::move(d);
  polykv::daemon::Daemon* p = r->daemon.get();
  r->server = std::thread([p] { (void)p->Run(); });
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_restart: restart-to-attachable with --state-dir vs re-prefill"};
  std::string codec = "k8v3";
  int threads = 0;
  app.add_option("--codec", codec, "k8v2|k8v3|k8v4|none")->capture_default_str();
  app.add_option("--threads", threads, "libtorch threads (0 = all cores)");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);

  std::string model_label;
  const Request create = polykv::bench::DocumentCreateRequest(codec, &model_label);

  polykv::support::TempDir tmp("polykv-bench-restart-");  // removed on every way out
  if (!tmp.ok()) {
    std::fprintf(stderr, "error: cannot create a temporary folder under /tmp\n");
    return 1;
  }
  const std::string dir = tmp.path();
  polykv::daemon::DaemonOptions base;
  base.endpoint = "ipc://" + dir + "/control.sock";
  base.backend = "host";
  base.threads = threads;
  base.shm_prefix = "/polykv-bres" + std::to_string(getpid()) + "-";
  polykv::daemon::DaemonOptions with_state = base;
  with_state.state_dir = dir + "/state";

  Request attach;
  attach.type = MessageType::kAttach;
  // Start -> create -> attach, from the Start call.
  auto start_create_attach = [&](const polykv::daemon::DaemonOptions& o, Reply* created) {
    auto t0 = Clock::now();
    auto d = Start(o);
    Reply c = Call(o.endpoint, create);
    attach.pool_id = c.pool->id;
    (void)Call(o.endpoint, attach);
    const double ms = MsSince(t0);
    if (created) *created = c;
    return ms;
  };
  Reply info;
  // Baseline: no state folder, so a restarted daemon prefills again (model load included).
  const double reprefill_ms = start_create_attach(base, &info);
  // First create with a state folder: the same, plus writing the pool file.
  const double first_ms = start_create_attach(with_state, nullptr);
  std::filesystem::path file =
      std::filesystem::path(with_state.state_dir) / "pools" / (info.pool->id + ".pkv");
  const uint64_t file_bytes = std::filesystem::exists(file) ? std::filesystem::file_size(file) : 0;
  // Restart: lazy restore on ATTACH (loads the model to check its fingerprint).
  double lazy_ms;
  {
    auto t0 = Clock::now();
    auto d = Start(with_state);
    attach.pool_id = info.pool->id;
    (void)Call(with_state.endpoint, attach);
    lazy_ms = MsSince(t0);
  }
  // Restart: the agents' CREATE_POOL finds the file (tokenize + model load, no prefill).
  const double create_restore_ms = start_create_attach(with_state, nullptr);
  // Restart with --preload: published before Start returns.
  double preload_ms;
  {
    polykv::daemon::DaemonOptions o = with_state;
    o.preload = true;
    auto t0 = Clock::now();
    auto d = Start(o);
    attach.pool_id = info.pool->id;
    (void)Call(o.endpoint, attach);
    preload_ms = MsSince(t0);
  }

  const auto& p = *info.pool;
  std::printf("bench_restart: %s, codec %s, %llu tokens, pool %llu bytes, file %llu bytes\n",
              model_label.c_str(), p.codec.c_str(), static_cast<unsigned long long>(p.tokens),
              static_cast<unsigned long long>(p.total_bytes),
              static_cast<unsigned long long>(file_bytes));
  std::printf("%-40s %-4s %10s %12s %8s\n", "figure (Start -> ATTACH answered)", "unit", "value",
              "re-prefill", "ratio");
  auto row = [&](const char* fig, double v) {
    std::printf("%-40s %-4s %10.1f %12.1f %8.3f\n", fig, "ms", v, reprefill_ms, v / reprefill_ms);
  };
  row("no --state-dir: re-prefill (baseline)", reprefill_ms);
  row("first create, --state-dir (persist)", first_ms);
  row("restart: lazy restore on ATTACH", lazy_ms);
  row("restart: restore on CREATE_POOL", create_restore_ms);
  row("restart: --preload", preload_ms);
  std::printf(
      "(each row a fresh in-process polykvd; prefill in the baseline %.1f ms of it, "
      "encode %.1f ms; the model is loaded in every row, page cache warm)\n",
      p.prefill_ms, p.encode_ms);
  return 0;
}
