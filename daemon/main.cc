// polykvd: the PolyKV pool daemon. Flags and/or a config file (--config), spdlog to stderr;
// SIGTERM/SIGINT stop it cleanly (pools released, socket and pid files removed, exit 0).
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <iostream>

#include "daemon.h"

namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

}  // namespace

int main(int argc, char** argv) {
  polykv::daemon::DaemonOptions options;
  CLI::App app{"polykvd: shares one compressed KV-cache pool per document among agents"};
  polykv::daemon::AddDaemonFlags(app, options);
  bool dumpable = false;
  app.add_flag("--dumpable", dumpable,
               "Stay ptrace-able and dumpable (debugging; by default other processes of the "
               "daemon's uid cannot attach to it or open its pool memfds through /proc)");
  CLI11_PARSE(app, argc, argv);
  if (!dumpable) prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);

  auto logger = spdlog::stderr_color_mt("polykvd");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(options.log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ polykvd[%P] %v");

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  try {
    auto daemon = polykv::daemon::Daemon::Start(options);
    if (!daemon.ok()) {
      spdlog::error("cannot start: {}", daemon.status().ToString());
      return 1;
    }
    polykv::Status s = (*daemon)->Run(&g_stop);
    const bool stuck = (*daemon)->workers_left_behind() > 0;
    if (!s.ok()) spdlog::error("{}", s.ToString());
    if (stuck) {
      // A create worker is still blocked (e.g. in a read from a hung file system): end now,
      // without the static destructors it could race with. Everything else is shut down.
      spdlog::default_logger()->flush();
      std::fflush(nullptr);
      _exit(s.ok() ? 0 : 1);
    }
    daemon->reset();
    if (!s.ok()) return 1;
  } catch (const std::exception& e) {
    spdlog::critical("fatal: {}", e.what());
    return 1;
  }
  return 0;
}
