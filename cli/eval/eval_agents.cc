// The agents section of polykv-cli eval (see eval_agents.h).
#include "eval/eval_agents.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "eval/eval.h"
#include "polykv/client.hpp"
#include "polykv/ipc/pool_memory.h"
#include "util/processes.h"

extern char** environ;

namespace polykv::eval {
namespace {

namespace fs = std::filesystem;
namespace pc = polykv::client;

Status FromClient(const pc::Status& s, const std::string& what) {
  return Status(static_cast<absl::StatusCode>(s.code()), absl::StrCat(what, ": ", s.message()));
}

std::string FindDaemon(const AgentEvalOptions& o) {
  if (!o.daemon.empty()) return o.daemon;
  const fs::path dir = fs::path(o.cli).parent_path();
  for (const fs::path& p :
       {dir / ".." / "daemon" / "polykvd", dir / ".." / "sbin" / "polykvd", dir / "polykvd"}) {
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p.lexically_normal().string();
  }
  return "";
}

// polykvd started for the run (host backend, private endpoint); SIGTERM at the end.
class OwnDaemon {
 public:
  ~OwnDaemon() { Stop(); }
  Status Start(const std::string& binary, const std::string& dir, std::string* endpoint) {
    *endpoint = absl::StrCat("ipc://", dir, "/control.sock");
    const std::vector<std::string> argv = {binary,
                                           "--endpoint",
                                           *endpoint,
                                           "--backend",
                                           ipc::PoolMemoryName(ipc::PoolMemory::kHost),
                                           "--threads",
                                           "1",
                                           "--log-level",
                                           "warn",
                                           "--lease-seconds",
                                           "120"};
    std::vector<char*> cargv;
    for (const auto& s : argv) cargv.push_back(const_cast<char*>(s.c_str()));
    cargv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    const std::string log = dir + "/polykvd.log";
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0600);
    posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
    const int rc = posix_spawn(&pid_, binary.c_str(), &fa, nullptr, cargv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
      pid_ = -1;
      return absl::InternalError(absl::StrCat("posix_spawn ", binary, ": ", std::strerror(rc)));
    }
    for (int i = 0; i < 300; ++i) {
      auto c = pc::Client::Connect(*endpoint, 500);
      if (c.ok()) return absl::OkStatus();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return absl::UnavailableError(
        absl::StrCat("polykvd (", binary, ") did not answer on ", *endpoint, "; see ", log));
  }
  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

}  // namespace

StatusOr<std::vector<AgentRow>> AgentInvariance(const std::vector<int32_t>& ids,
                                                const std::vector<CodecSpec>& codecs_in,
                                                const AgentEvalOptions& o) {
  auto log = [&](const std::string& s) {
    if (o.log) o.log(s);
  };
  if (o.counts.empty() || *std::min_element(o.counts.begin(), o.counts.end()) < 1)
    return absl::InvalidArgumentError("agents: agent counts must be >= 1");
  const int64_t scored = std::llround(static_cast<double>(o.context) * o.score_fraction);
  POLYKV_ASSIGN_OR_RETURN(std::vector<Window> wins,
                          MakeWindows(ids, o.context, scored, o.windows, o.offset));
  std::vector<CodecSpec> codecs;
  CodecSpec none;
  none.none = true;
  none.name = "none";
  codecs.push_back(none);
  for (const CodecSpec& c : codecs_in)
    if (!c.none) codecs.push_back(c);

  std::error_code ec;
  fs::create_directories(o.work_dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(o.work_dir, ": ", ec.message()));
  OwnDaemon own;
  std::string endpoint = o.endpoint;
  if (endpoint.empty()) {
    const std::string bin = FindDaemon(o);
    if (bin.empty())
      return absl::NotFoundError("agents: no polykvd next to " + o.cli +
                                 " (give --daemon or --endpoint)");
    POLYKV_RETURN_IF_ERROR(own.Start(bin, o.work_dir, &endpoint));
    log(absl::StrCat("agents: started ", bin, " on ", endpoint));
  }
  auto client = pc::Client::Connect(endpoint, 5000);
  if (!client.ok()) return FromClient(client.status(), "agents: connect to " + endpoint);

  // nll[codec][count][window] = the agents' mean NLL; spread likewise.
  std::map<std::string, std::map<int, std::vector<double>>> nll, spread;
  for (size_t w = 0; w < wins.size(); ++w) {
    const Window& win = wins[w];
    std::vector<int32_t> cont = win.input;
    cont.push_back(win.targets.back());  // t_C .. t_L: --score-ids feeds all but the last
    const std::string cont_ids = absl::StrJoin(cont, ",");
    for (const CodecSpec& c : codecs) {
      pc::CreateOptions co;
      co.model = o.model_path;
      co.token_ids = win.context;
      co.codec = c.none ? "none" : c.Canonical();
      co.add_bos = false;
      auto pool = client->CreatePool(co);
      if (!pool.ok()) return FromClient(pool.status(), "agents: create pool " + co.codec);
      const std::string id = pool->info.id;
      for (int n : o.counts) {
        std::vector<cli::Child> kids(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) {
          kids[i].index = i;
          kids[i].out_path = absl::StrCat(o.work_dir, "/agent", i, ".out");
          kids[i].err_path = absl::StrCat(o.work_dir, "/agent", i, ".err");
        }
        const auto t0 = std::chrono::steady_clock::now();
        POLYKV_RETURN_IF_ERROR(cli::RunAll(kids, n, [&](const cli::Child&) {
          return std::vector<std::string>{o.cli,         "agent",        "--pool",     id,
                                          "--model",     o.model_path,   "--endpoint", endpoint,
                                          "--score-ids", cont_ids,       "--json",     "--threads",
                                          "1",           "--timeout-ms", "30000"};
        }));
        // The mean as first + mean of the differences: exactly the agents' value when they all
        // agree ((x + x + x) / 3 need not round back to x).
        double lo = 1e300, hi = -1e300, sum = 0, first = 0;
        bool have_first = false;
        for (const cli::Child& k : kids) {
          if (!k.error.empty() || !k.result.contains("mean_nll"))
            return absl::InternalError(absl::StrCat("agents: agent ", k.index, " of ", n, " on ",
                                                    co.codec, ": ", k.error));
          const double x = k.result["mean_nll"].get<double>();
          lo = std::min(lo, x);
          hi = std::max(hi, x);
          if (!have_first) {
            first = x;
            have_first = true;
          }
          sum += x - first;
        }
        nll[c.name][n].push_back(first + sum / n);
        spread[c.name][n].push_back(hi - lo);
        log(absl::StrFormat(
            "agents: window %d/%d %s, %d agent(s) at once: mean NLL %.6f (spread "
            "%.2g) in %.1fs",
            static_cast<int>(w + 1), static_cast<int>(wins.size()), c.name, n, sum / n, hi - lo,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
      }
      (void)client->Evict(id, /*force=*/true);
    }
  }
  std::vector<AgentRow> rows;
  const std::vector<double>& base = nll["none"][o.counts.front()];
  for (const CodecSpec& c : codecs) {
    for (int n : o.counts) {
      AgentRow r;
      r.codec = c.name;
      r.spec = c.none ? "none" : c.Canonical();
      r.agents = n;
      r.windows = static_cast<int>(wins.size());
      const std::vector<double>& v = nll[c.name][n];
      for (size_t w = 0; w < v.size(); ++w) {
        r.nll_full += base[w] / static_cast<double>(v.size());
        r.nll_codec += v[w] / static_cast<double>(v.size());
      }
      r.change = AsPplChangePercent(PairedMeanInterval(v, base));
      for (double s : spread[c.name][n]) r.agent_spread = std::max(r.agent_spread, s);
      rows.push_back(r);
    }
  }
  return rows;
}

std::string AgentCsv(const std::vector<AgentRow>& rows) {
  std::string s =
      "codec,spec,agents,windows,nll_full,nll_codec,ppl_change_pct,ci_lo_pct,ci_hi_pct,agent_"
      "spread\n";
  for (const AgentRow& r : rows)
    absl::StrAppendFormat(&s, "%s,%s,%d,%d,%.8f,%.8f,%.4f,%.4f,%.4f,%.3g\n", r.codec, r.spec,
                          r.agents, r.windows, r.nll_full, r.nll_codec, r.change.mean, r.change.lo,
                          r.change.hi, r.agent_spread);
  return s;
}

std::string AgentMarkdown(const std::vector<AgentRow>& rows) {
  std::string s =
      "| codec | agents at once | windows | PPL full (pool none) | PPL codec | change | 95% "
      "interval | spread between agents (NLL) |\n"
      "|---|---|---|---|---|---|---|---|\n";
  for (const AgentRow& r : rows)
    absl::StrAppendFormat(&s, "| %s | %d | %d | %.4f | %.4f | %s | %.2g |\n",
                          r.codec == r.spec ? r.codec : absl::StrCat(r.codec, " (", r.spec, ")"),
                          r.agents, r.windows, std::exp(r.nll_full), std::exp(r.nll_codec),
                          PercentChangeCells(r.change), r.agent_spread);
  return s;
}

}  // namespace polykv::eval
