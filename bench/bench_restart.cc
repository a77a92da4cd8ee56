// bench_restart: how long until a pool is attachable again after a polykvd restart, with
// --state-dir (restore from the pool file: lazily on ATTACH, on CREATE_POOL, or --preload at
// start) against the baseline without it (a fresh daemon re-prefills the document), all
// measured in the same run, each from Daemon::Start to an answered ATTACH. Also the cost of
// persisting on the first create (create with vs without --state-dir). SmolLM2-135M Q4_1 on
// robert_boulter.txt when POLYKV_SMOLLM2_GGUF is set, else stories260K with fixed token ids.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_documents.h"
#include "in_process_daemon.h"
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

// One request on a fresh connection.
Reply Call(const std::string& endpoint, const Request& req) {
  return polykv::bench::Client(endpoint).Call(req);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_restart: restart-to-attachable with --state-dir vs re-prefill"};
  polykv::bench::DaemonBenchFlags flags;
  flags.AddTo(app);
  CLI11_PARSE(app, argc, argv);
  std::optional<polykv::bench::DaemonBenchSetup> setup =
      polykv::bench::SetUpDaemonBench(flags, "polykv-bench-restart-");
  if (!setup) return 1;
  const std::string& model_label = setup->model_label;
  const Request& create = setup->create;
  const std::string dir = setup->dir->path();
  const polykv::daemon::DaemonOptions base =
      polykv::bench::HostDaemonOptions(dir, flags.threads, "polykv-bres");
  polykv::daemon::DaemonOptions with_state = base;
  with_state.state_dir = dir + "/state";

  Request attach;
  attach.type = MessageType::kAttach;
  // Start -> create -> attach, from the Start call.
  auto start_create_attach = [&](const polykv::daemon::DaemonOptions& o, Reply* created) {
    auto t0 = Clock::now();
    auto d = polykv::bench::StartDaemon(o);
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
    auto d = polykv::bench::StartDaemon(with_state);
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
    auto d = polykv::bench::StartDaemon(o);
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
