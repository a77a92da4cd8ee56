// bench_daemon: polykvd pool-create time split into prefill / encode / publish, and the
// ATTACH (+DETACH) round-trip latency over 1000 attaches on the host backend, against PING
// (the protocol floor) measured in the same run; ATTACH again while 15,000 other leases are
// held (lease bookkeeping must not scan them); the agent side of an attach (descriptor over
// SCM_RIGHTS + read-only map) and a payload checksum pass. SmolLM2-135M Q4_1 on robert_boulter.txt
// when POLYKV_SMOLLM2_GGUF is set, else stories260K with fixed token ids.
#include <CLI/CLI.hpp>
#include <algorithm>
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
#include "polykv/ipc/pool_layout.h"
#include "polykv/ipc/protocol.h"
#include "polykv/ipc/sealed_region.h"
#include "support/files.h"

namespace {

using Clock = std::chrono::steady_clock;
using polykv::bench::Client;
using polykv::ipc::MessageType;
using polykv::ipc::Reply;
using polykv::ipc::Request;

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * (v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_daemon: polykvd create split and ATTACH latency"};
  int attaches = 1000;
  polykv::bench::DaemonBenchFlags flags;
  int held = 15000;
  app.add_option("--attaches", attaches, "ATTACH+DETACH round trips")->capture_default_str();
  app.add_option("--held-leases", held, "leases held during the second ATTACH run")
      ->capture_default_str();
  flags.AddTo(app);
  CLI11_PARSE(app, argc, argv);
  std::optional<polykv::bench::DaemonBenchSetup> setup =
      polykv::bench::SetUpDaemonBench(flags, "polykv-bench-");
  if (!setup) return 1;
  const std::string& model_label = setup->model_label;
  const Request& create = setup->create;
  const polykv::daemon::DaemonOptions o =
      polykv::bench::HostDaemonOptions(setup->dir->path(), flags.threads, "polykv-bench");
  std::unique_ptr<polykv::bench::RunningDaemon> running = polykv::bench::StartDaemon(o);

  Client c(o.endpoint);
  auto t0 = Clock::now();
  Reply created = c.Call(create);
  const double create_wall_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  const auto& info = *created.pool;

  // Warm up, then PING (floor) and ATTACH+DETACH.
  Request ping;
  ping.type = MessageType::kPing;
  for (int i = 0; i < 50; ++i) c.Call(ping);
  std::vector<double> ping_us, attach_us, detach_us;
  for (int i = 0; i < attaches; ++i) {
    auto a = Clock::now();
    c.Call(ping);
    ping_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
  }
  Request attach;
  attach.type = MessageType::kAttach;
  attach.pool_id = info.id;
  Request detach;
  detach.type = MessageType::kDetach;
  for (int i = 0; i < attaches; ++i) {
    auto a = Clock::now();
    Reply r = c.Call(attach);
    auto b = Clock::now();
    detach.lease_id = r.lease_id;
    c.Call(detach);
    auto e = Clock::now();
    attach_us.push_back(std::chrono::duration<double, std::micro>(b - a).count());
    detach_us.push_back(std::chrono::duration<double, std::micro>(e - b).count());
  }
  // The agent's side of an attach: fetch the sealed memfd, map it; and one checksum pass.
  std::vector<double> fd_us, verify_ms;
  for (int i = 0; i < std::min(attaches, 200); ++i) {
    Reply r = c.Call(attach);
    auto a = Clock::now();
    auto fd = polykv::ipc::RequestPoolFd(r.memory->fd_socket, r.lease_id, 5000);
    auto region = fd.ok() ? polykv::ipc::SealedRegion::MapSealed(*std::move(fd), 0)
                          : polykv::StatusOr<polykv::ipc::SealedRegion>(fd.status());
    auto b = Clock::now();
    if (!region.ok()) {
      std::fprintf(stderr, "descriptor: %s\n", region.status().ToString().c_str());
      return 1;
    }
    fd_us.push_back(std::chrono::duration<double, std::micro>(b - a).count());
    if (i < 20) {
      auto reader = polykv::ipc::PoolReader::Open(region->data(), region->size(), false);
      auto v0 = Clock::now();
      if (!reader.ok() || !reader->VerifyPayload().ok()) return 1;
      verify_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - v0).count());
    }
    detach.lease_id = r.lease_id;
    c.Call(detach);
  }
  // ATTACH with many other leases held.
  for (int i = 0; i < held; ++i) c.Call(attach);
  std::vector<double> attach_held_us;
  for (int i = 0; i < attaches; ++i) {
    auto a = Clock::now();
    Reply r = c.Call(attach);
    attach_held_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
    detach.lease_id = r.lease_id;
    c.Call(detach);
  }
  running.reset();

  std::printf("bench_daemon: %s, codec %s, %llu tokens, pool %llu bytes (%.2fx vs bf16)\n",
              model_label.c_str(), info.codec.c_str(), static_cast<unsigned long long>(info.tokens),
              static_cast<unsigned long long>(info.total_bytes), info.effective_ratio);
  std::printf("%-28s %-6s %12s %14s %8s\n", "figure", "unit", "value", "baseline", "ratio");
  auto row = [](const char* fig, const char* unit, double v, const char* base_name, double b) {
    if (b > 0) {
      std::printf("%-28s %-6s %12.3f %9.3f %-4s %8.2f\n", fig, unit, v, b, base_name, v / b);
    } else {
      std::printf("%-28s %-6s %12.3f %14s %8s\n", fig, unit, v, "-", "-");
    }
  };
  const double total = info.prefill_ms + info.encode_ms + info.publish_ms;
  row("create: prefill", "ms", info.prefill_ms, "tot", total);
  row("create: encode", "ms", info.encode_ms, "tot", total);
  row("create: publish", "ms", info.publish_ms, "tot", total);
  row("create: wall (client)", "ms", create_wall_ms, "", 0);
  const double ping50 = Percentile(ping_us, 0.5), ping99 = Percentile(ping_us, 0.99);
  row("PING rtt p50", "us", ping50, "", 0);
  row("PING rtt p99", "us", ping99, "", 0);
  row("ATTACH rtt p50", "us", Percentile(attach_us, 0.5), "ping", ping50);
  row("ATTACH rtt p99", "us", Percentile(attach_us, 0.99), "ping", ping99);
  row("DETACH rtt p50", "us", Percentile(detach_us, 0.5), "ping", ping50);
  row("DETACH rtt p99", "us", Percentile(detach_us, 0.99), "ping", ping99);
  const double attach50 = Percentile(attach_us, 0.5), attach99 = Percentile(attach_us, 0.99);
  char label50[64], label99[64];
  std::snprintf(label50, sizeof(label50), "ATTACH p50, %d held", held);
  std::snprintf(label99, sizeof(label99), "ATTACH p99, %d held", held);
  row(label50, "us", Percentile(attach_held_us, 0.5), "att", attach50);
  row(label99, "us", Percentile(attach_held_us, 0.99), "att", attach99);
  row("descriptor+map p50", "us", Percentile(fd_us, 0.5), "ping", ping50);
  row("descriptor+map p99", "us", Percentile(fd_us, 0.99), "ping", ping99);
  row("payload verify p50", "ms", Percentile(verify_ms, 0.5), "", 0);
  std::printf(
      "(%d ATTACH+DETACH round trips over ipc://, host backend; baseline 'tot' = "
      "prefill+encode+publish, 'ping' = PING round trip, 'att' = ATTACH with no other "
      "lease, in the same run)\n",
      attaches);
  return 0;
}
