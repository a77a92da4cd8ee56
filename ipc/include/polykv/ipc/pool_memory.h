// Where a pool's bytes live: the one name table of the pool memory kinds ("host", "cuda"), as
// the daemon's --backend, ATTACH replies (MemoryHandle::backend) and PoolInfo::backend name
// them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "polykv/enum_names.h"

namespace polykv::ipc {

/// Host memory (a sealed memfd, or a legacy POSIX shm object) or CUDA device memory (CUDA
/// IPC).
enum class PoolMemory : uint8_t { kHost, kCuda };

/// The one name table of the pool memory kinds.
inline constexpr EnumName<PoolMemory> kPoolMemoryNames[] = {{PoolMemory::kHost, "host"},
                                                            {PoolMemory::kCuda, "cuda"}};

/// "host" | "cuda" (static storage).
inline const char* PoolMemoryName(PoolMemory memory) {
  return EnumToName(kPoolMemoryNames, memory, "?");
}

/// The kind named `name` ("host" | "cuda"); nullopt for any other name (callers say which
/// field held it).
inline std::optional<PoolMemory> ParsePoolMemory(std::string_view name) {
  return EnumFromName(kPoolMemoryNames, name);
}

/// Every kind's name, in the table's order (for flag checks such as CLI::IsMember).
inline std::vector<std::string> PoolMemoryNames() {
  std::vector<std::string> names;
  for (const auto& n : kPoolMemoryNames) names.emplace_back(n.name);
  return names;
}

}  // namespace polykv::ipc
