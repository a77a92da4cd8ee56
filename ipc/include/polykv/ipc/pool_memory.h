// Where a pool's bytes live: the one name table of the pool memory kinds ("host", "cuda"), as
// the daemon's --backend, ATTACH replies (MemoryHandle::backend) and PoolInfo::backend name
// them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace polykv::ipc {

/// Host memory (a sealed memfd, or a legacy POSIX shm object) or CUDA device memory (CUDA
/// IPC).
enum class PoolMemory : uint8_t { kHost, kCuda };

namespace pool_memory_internal {
struct Named {
  PoolMemory memory;
  const char* name;
};
inline constexpr Named kNames[] = {{PoolMemory::kHost, "host"}, {PoolMemory::kCuda, "cuda"}};
}  // namespace pool_memory_internal

/// "host" | "cuda" (static storage).
inline const char* PoolMemoryName(PoolMemory memory) {
  for (const auto& n : pool_memory_internal::kNames) {
    if (n.memory == memory) return n.name;
  }
  return "?";
}

/// The kind named `name` ("host" | "cuda"); nullopt for any other name (callers say which
/// field held it).
inline std::optional<PoolMemory> ParsePoolMemory(std::string_view name) {
  for (const auto& n : pool_memory_internal::kNames) {
    if (n.name == name) return n.memory;
  }
  return std::nullopt;
}

/// Every kind's name, in the table's order (for flag checks such as CLI::IsMember).
inline std::vector<std::string> PoolMemoryNames() {
  std::vector<std::string> names;
  for (const auto& n : pool_memory_internal::kNames) names.emplace_back(n.name);
  return names;
}

}  // namespace polykv::ipc
