// The agent's device seam: parsing --device and routing a pool to the way an agent reads it.
#include "polykv/agent_device.h"

#include <cstdio>
#include <optional>

#include "absl/strings/str_cat.h"
#include "polykv/enum_names.h"
#include "polykv/ipc/pool_memory.h"

namespace polykv::client {

StatusOr<AgentDevice> ParseAgentDevice(std::string_view text) {
  const auto bad = [&](const char* why) {
    return absl::InvalidArgumentError(
        absl::StrCat("device '", std::string(text), "': ", why, " (expected cpu, cuda or cuda:N)"));
  };
  if (text == "cpu") return AgentDevice{};
  if (text == "cuda") return AgentDevice{kernels::Device::kCuda, 0};
  constexpr std::string_view kPrefix = "cuda:";
  if (text.substr(0, kPrefix.size()) != kPrefix) return bad("unknown device");
  const std::string_view digits = text.substr(kPrefix.size());
  if (digits.empty() || digits.size() > 4) return bad("bad ordinal");
  for (char c : digits)
    if (c < '0' || c > '9') return bad("bad ordinal");
  int index = 0;
  for (char c : digits) index = index * 10 + (c - '0');
  if (index > 1023) return bad("ordinal out of range");
  return AgentDevice{kernels::Device::kCuda, index};
}

std::string AgentDeviceName(const AgentDevice& device) {
  if (device.kind == kernels::Device::kCpu) return "cpu";
  return absl::StrCat("cuda:", device.index);
}

const char* PoolRouteName(PoolRoute route) {
  static constexpr EnumName<PoolRoute> kNames[] = {
      {PoolRoute::kHostInPlace, "host-in-place"},
      {PoolRoute::kHostDecoded, "host-decoded"},
      {PoolRoute::kCudaCopiedToHost, "cuda-copied-to-host"},
      {PoolRoute::kCudaInPlace, "cuda-in-place"}};
  return EnumToName(kNames, route, "?");
}

StatusOr<PoolRoute> RoutePool(const RouteInput& in) {
  const std::string pool(in.pool_id);
  const std::string dev = AgentDeviceName(in.device);
  const std::optional<ipc::PoolMemory> memory = ipc::ParsePoolMemory(in.backend);
  if (!memory) {
    return absl::InvalidArgumentError(absl::StrCat("pool ", pool, " has unknown backend \"",
                                                   std::string(in.backend),
                                                   "\" (expected host or cuda)"));
  }
  const bool cuda_pool = *memory == ipc::PoolMemory::kCuda;
  if (in.device.kind == kernels::Device::kCpu) {
    if (!cuda_pool) {
      return in.in_place && in.mapped_weights ? PoolRoute::kHostInPlace : PoolRoute::kHostDecoded;
    }
    if (in.allow_copy) return PoolRoute::kCudaCopiedToHost;
    return absl::FailedPreconditionError(absl::StrCat(
        "pool ", pool,
        " lies in CUDA device memory (daemon backend cuda) and this agent computes on the CPU "
        "(--device cpu): it cannot attend to the pool where it lies. Run the agent with "
        "--device cuda, or pass --allow-copy (AgentOptions::allow_copy) to copy the pool's KV "
        "into a private host cache of this agent, or start polykvd with --backend host"));
  }
  if (cuda_pool) {
    if (!in.in_place) {
      return absl::FailedPreconditionError(
          absl::StrCat("pool ", pool, " (backend cuda): --attend decompressed is not available on ",
                       dev, "; a cuda agent attends to the pool in place (--attend in-place)"));
    }
    return PoolRoute::kCudaInPlace;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "pool ", pool, " lies in host memory (daemon backend host) and this agent computes on ", dev,
      " (--device cuda): a cuda agent attends to cuda pools only. Start polykvd with "
      "--backend cuda, or run the agent with --device cpu"));
}

std::string CopyCostLine(std::string_view pool_id, uint64_t pool_bytes, uint64_t private_bytes) {
  char buf[320];
  std::snprintf(buf, sizeof(buf),
                "agent: --allow-copy: pool %.*s lies in CUDA memory (backend cuda); copying "
                "%.1f MiB of compressed KV to the host, decoded there into a private host cache of "
                "%.1f MiB for this agent alone, instead of attending in place",
                static_cast<int>(pool_id.size()), pool_id.data(), pool_bytes / 1048576.0,
                private_bytes / 1048576.0);
  return buf;
}

}  // namespace polykv::client
