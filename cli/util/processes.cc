// posix_spawn'ed children with bounded concurrency (see processes.h).
#include "util/processes.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "absl/status/status.h"
#include "util/files.h"

extern char** environ;

namespace polykv::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

Status Spawn(Child& c, const std::vector<std::string>& argv) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, c.out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, c.err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::vector<char*> cargv;
  for (const auto& s : argv) cargv.push_back(const_cast<char*>(s.c_str()));
  cargv.push_back(nullptr);
  c.start = std::chrono::steady_clock::now();
  int rc = posix_spawn(&c.pid, cargv[0], &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    return absl::InternalError("posix_spawn " + argv[0] + ": " + std::strerror(rc));
  }
  return absl::OkStatus();
}

void Finish(Child& c, int status, const struct rusage& ru) {
  c.wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c.start).count();
  c.max_rss_bytes = static_cast<uint64_t>(ru.ru_maxrss) * 1024;
  if (WIFEXITED(status)) c.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) c.signal = WTERMSIG(status);
  std::string out = ReadFile(c.out_path).value_or("");
  if (c.exit_code == 0) {
    try {
      c.result = json::parse(out);
    } catch (const std::exception& e) {
      c.error = std::string("unparsable agent output: ") + e.what();
    }
  } else {
    std::string err = ReadFile(c.err_path).value_or("");
    while (!err.empty() && err.back() == '\n') err.pop_back();
    size_t nl = err.rfind('\n');
    c.error = c.signal ? "killed by signal " + std::to_string(c.signal)
                       : (nl == std::string::npos ? err : err.substr(nl + 1));
    if (c.error.empty()) c.error = "exit code " + std::to_string(c.exit_code);
  }
}

}  // namespace

std::string SelfExe() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("polykv-cli") : p.string();
}

Status RunAll(std::vector<Child>& children, int jobs,
              const std::function<std::vector<std::string>(const Child&)>& argv_of) {
  std::map<pid_t, size_t> alive;
  size_t next = 0;
  while (next < children.size() || !alive.empty()) {
    while (next < children.size() && static_cast<int>(alive.size()) < jobs) {
      Child& c = children[next];
      Status s = Spawn(c, argv_of(c));
      if (!s.ok()) {
        c.error = std::string(s.message());
      } else {
        alive[c.pid] = next;
      }
      ++next;
    }
    if (alive.empty()) continue;
    int status = 0;
    struct rusage ru {};
    pid_t pid = wait4(-1, &status, 0, &ru);
    if (pid < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(std::string("wait4: ") + std::strerror(errno));
    }
    auto it = alive.find(pid);
    if (it == alive.end()) continue;  // not ours
    Finish(children[it->second], status, ru);
    alive.erase(it);
  }
  return absl::OkStatus();
}

}  // namespace polykv::cli
