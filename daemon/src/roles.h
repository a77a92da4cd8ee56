// polykvd's reader and operator roles by uid and gid (--operator-uid/gid, --reader-uid/gid).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "daemon.h"

namespace polykv::daemon {

/// Reader / operator roles by uid and gid. Supplementary groups come from the group
/// database (cached for 10 s per uid); the primary gid from the peer's credentials.
class Roles {
 public:
  enum Role { kNone = 0, kReader = 1, kOperator = 2 };

  /// The roles of `o`; with none configured, the daemon's own uid and root are operators.
  explicit Roles(const DaemonOptions& o);
  /// The role of a peer of `uid` and primary group `gid` (an operator is also a reader).
  Role Of(uint32_t uid, uint32_t gid);
  /// Who holds `role`, for error texts ("operators are uids [...] and gids [...]").
  std::string Describe(Role role) const;

 private:
  std::vector<uint32_t> GroupsOf(uint32_t uid, uint32_t gid);

  std::set<uint32_t> operator_uids_, operator_gids_, reader_uids_, reader_gids_;
  std::mutex mu_;
  std::map<uint32_t, std::pair<std::chrono::steady_clock::time_point, std::vector<uint32_t>>>
      cache_;
};

}  // namespace polykv::daemon
