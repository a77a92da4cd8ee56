// Pool memory that outlives its owner: memfds (the daemon's pools) still held by any process,
// as a descriptor (/proc/<pid>/fd links "/memfd:<name> (deleted)") or as a mapping
// (/proc/<pid>/maps lines naming "/memfd:<name>"). Pools are sealed memfds, so nothing ever
// appears under /dev/shm: this is the check that can find a leak.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace polykv::support {

/// One process's hold on a memfd.
struct MemfdUse {
  pid_t pid = 0;
  std::string where;  ///< "fd 7" or "map 7f12c0000000-7f12c0a00000"
  std::string name;   ///< "memfd:<name>", as /proc shows it (without " (deleted)")
};

/// Every descriptor and mapping of a memfd whose name starts with `name_prefix`, in every
/// process this one may inspect (`only_pid` > 0: that process only). A leading '/' of the
/// prefix is dropped, so a daemon's --shm-prefix ("/polykv-x-") names its pools' memfds
/// ("memfd:polykv-x-<id>"). Processes that end while being read, and those /proc hides from
/// this uid, are skipped. Shared mappings of one memfd show once per mapped range.
std::vector<MemfdUse> MemfdUses(const std::string& name_prefix, pid_t only_pid = 0);

/// MemfdUses once it returns nothing, or its last answer after `timeout_ms` (descriptors are
/// closed asynchronously: a process being reaped, a descriptor server's duplicate).
std::vector<MemfdUse> MemfdUsesSettled(const std::string& name_prefix, int timeout_ms = 5000);

/// How many of `uses` are descriptors ("fd ..."), and how many distinct memfds they name.
/// A daemon holds each published pool once as a descriptor and maps it once or more.
struct MemfdCounts {
  int descriptors = 0;
  int memfds = 0;
};
MemfdCounts CountMemfdUses(const std::vector<MemfdUse>& uses);

/// "pid 12 fd 7 memfd:polykv-x-0123; pid 40 map ... memfd:..." ("none" when empty).
std::string DescribeMemfdUses(const std::vector<MemfdUse>& uses);

}  // namespace polykv::support
