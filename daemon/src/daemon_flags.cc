// polykvd's command-line flags (see daemon.h) and byte sizes ("8G", "512 MiB").
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon.h"
#include "polykv/ipc/pool_memory.h"

namespace polykv::daemon {
namespace {

// --backend's words: auto, then the pool memory kinds.
std::vector<std::string> BackendWords() {
  std::vector<std::string> words = {"auto"};
  for (std::string& name : ipc::PoolMemoryNames()) words.push_back(std::move(name));
  return words;
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
      ->check(CLI::IsMember(BackendWords()))
      ->capture_default_str();
  app.add_option("--prefill-device", o.prefill_device,
                 "Where documents are prefilled: host, or cuda (the GPU with --backend cuda "
                 "when the CUDA model runtime is usable, else the host, logged)")
      ->check(CLI::IsMember(ipc::PoolMemoryNames()))
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
  app.add_option("--threads", o.threads, "compute threads of the kernels' pool (0 = all cores)")
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

}  // namespace polykv::daemon
