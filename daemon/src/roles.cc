// polykvd's reader and operator roles (see roles.h).
#include "roles.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace polykv::daemon {

Roles::Roles(const DaemonOptions& o) {
  operator_uids_.insert(o.allow_uids.begin(), o.allow_uids.end());
  operator_uids_.insert(o.operator_uids.begin(), o.operator_uids.end());
  operator_gids_.insert(o.operator_gids.begin(), o.operator_gids.end());
  reader_uids_.insert(o.reader_uids.begin(), o.reader_uids.end());
  reader_gids_.insert(o.reader_gids.begin(), o.reader_gids.end());
  if (operator_uids_.empty() && operator_gids_.empty() && reader_uids_.empty() &&
      reader_gids_.empty()) {
    operator_uids_ = {static_cast<uint32_t>(getuid()), 0u};
  }
}

Roles::Role Roles::Of(uint32_t uid, uint32_t gid) {
  if (operator_uids_.count(uid)) return kOperator;
  const bool groups_matter = !operator_gids_.empty() || !reader_gids_.empty();
  std::vector<uint32_t> groups;
  if (groups_matter) groups = GroupsOf(uid, gid);
  for (uint32_t g : groups) {
    if (operator_gids_.count(g)) return kOperator;
  }
  if (reader_uids_.count(uid)) return kReader;
  for (uint32_t g : groups) {
    if (reader_gids_.count(g)) return kReader;
  }
  return kNone;
}

std::string Roles::Describe(Role role) const {
  if (role == kOperator) {
    return absl::StrCat("operators are uids [", absl::StrJoin(operator_uids_, ", "), "] and gids [",
                        absl::StrJoin(operator_gids_, ", "), "]");
  }
  return absl::StrCat("readers are uids [", absl::StrJoin(reader_uids_, ", "), "] and gids [",
                      absl::StrJoin(reader_gids_, ", "), "], plus every operator (",
                      Describe(kOperator), ")");
}

std::vector<uint32_t> Roles::GroupsOf(uint32_t uid, uint32_t gid) {
  std::lock_guard<std::mutex> lock(mu_);
  auto now = std::chrono::steady_clock::now();
  auto& entry = cache_[uid];
  if (entry.first + std::chrono::seconds(10) < now || entry.second.empty()) {
    std::vector<uint32_t> out = {gid};
    struct passwd pw;
    struct passwd* found = nullptr;
    std::vector<char> buf(16384);
    if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr) {
      int n = 64;
      std::vector<gid_t> gids(n);
      if (getgrouplist(pw.pw_name, pw.pw_gid, gids.data(), &n) < 0 && n > 64) {
        gids.resize(n);
        getgrouplist(pw.pw_name, pw.pw_gid, gids.data(), &n);
      }
      for (int i = 0; i < n && i < static_cast<int>(gids.size()); ++i) out.push_back(gids[i]);
    }
    entry = {now, out};
  }
  std::vector<uint32_t> out = entry.second;
  if (std::find(out.begin(), out.end(), gid) == out.end()) out.push_back(gid);
  return out;
}

}  // namespace polykv::daemon
