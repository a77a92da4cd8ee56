// Memfds still held by any process (see leaks.h).
#include "support/leaks.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

#include "support/wait.h"

namespace polykv::support {
namespace {

std::vector<pid_t> Pids() {
  std::vector<pid_t> out;
  if (DIR* d = opendir("/proc")) {
    while (dirent* e = readdir(d)) {
      char* end = nullptr;
      const long pid = std::strtol(e->d_name, &end, 10);
      if (pid > 0 && end != nullptr && *end == '\0') out.push_back(static_cast<pid_t>(pid));
    }
    closedir(d);
  }
  return out;
}

// "/memfd:NAME (deleted)" or "memfd:NAME" -> "memfd:NAME"; "" for anything else.
std::string MemfdName(std::string s) {
  if (!s.empty() && s[0] == '/') s.erase(0, 1);
  if (s.rfind("memfd:", 0) != 0) return "";
  const std::string deleted = " (deleted)";
  if (s.size() > deleted.size() &&
      s.compare(s.size() - deleted.size(), deleted.size(), deleted) == 0) {
    s.resize(s.size() - deleted.size());
  }
  return s;
}

void Scan(pid_t pid, const std::string& want, std::vector<MemfdUse>* out) {
  const std::string base = "/proc/" + std::to_string(pid);
  if (DIR* d = opendir((base + "/fd").c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      char buf[512];
      const ssize_t n = readlink((base + "/fd/" + e->d_name).c_str(), buf, sizeof(buf) - 1);
      if (n <= 0) continue;
      const std::string name = MemfdName(std::string(buf, static_cast<size_t>(n)));
      if (!name.empty() && name.rfind(want, 0) == 0) {
        out->push_back(MemfdUse{pid, std::string("fd ") + e->d_name, name});
      }
    }
    closedir(d);
  }
  std::ifstream maps(base + "/maps");
  for (std::string line; std::getline(maps, line);) {
    // "start-end perms offset dev inode   path"
    const size_t path = line.find('/');
    if (path == std::string::npos) continue;
    const std::string name = MemfdName(line.substr(path));
    if (name.empty() || name.rfind(want, 0) != 0) continue;
    out->push_back(MemfdUse{pid, "map " + line.substr(0, line.find(' ')), name});
  }
}

}  // namespace

std::vector<MemfdUse> MemfdUses(const std::string& name_prefix, pid_t only_pid) {
  const std::string want =
      "memfd:" + (name_prefix.rfind('/', 0) == 0 ? name_prefix.substr(1) : name_prefix);
  std::vector<MemfdUse> out;
  if (only_pid > 0) {
    Scan(only_pid, want, &out);
  } else {
    for (pid_t pid : Pids()) Scan(pid, want, &out);
  }
  return out;
}

std::vector<MemfdUse> MemfdUsesSettled(const std::string& name_prefix, int timeout_ms) {
  std::vector<MemfdUse> last;
  WaitFor(
      [&] {
        last = MemfdUses(name_prefix);
        return last.empty();
      },
      timeout_ms * TimeoutScale());
  return last;
}

std::string DescribeMemfdUses(const std::vector<MemfdUse>& uses) {
  if (uses.empty()) return "none";
  std::string s;
  for (const MemfdUse& u : uses) {
    if (!s.empty()) s += "; ";
    s += "pid " + std::to_string(u.pid) + " " + u.where + " " + u.name;
  }
  return s;
}

MemfdCounts CountMemfdUses(const std::vector<MemfdUse>& uses) {
  MemfdCounts c;
  std::set<std::string> names;
  for (const MemfdUse& u : uses) {
    if (u.where.rfind("fd ", 0) == 0) ++c.descriptors;
    names.insert(u.name);
  }
  c.memfds = static_cast<int>(names.size());
  return c;
}

}  // namespace polykv::support
