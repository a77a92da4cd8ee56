// The agent's device seam: where an agent computes (`--device cpu|cuda[:N]`) and how it reads
// a pool given where the pool lies (the daemon's backend, "host" or "cuda"). Pure decisions,
// no daemon and no device needed, so the routing is unit-tested on the CPU.
//
// Routing (RoutePool), one row per (agent device, pool backend):
//   cpu  + host: kHostInPlace (attend in place, mapped weights) or kHostDecoded (asked for
//                with --attend decompressed, or weights not mapped);
//   cpu  + cuda: kFailedPrecondition naming the pool, its backend and --allow-copy; with
//                allow_copy: kCudaCopiedToHost (every layer's compressed bytes copied to the host
//                and decoded into a private host cache, which the agent logs with its cost);
//   cuda + cuda: kCudaInPlace (attend in place to the CUDA IPC mapping);
//   cuda + host: kFailedPrecondition (a cuda agent attends to cuda pools only).
// Nothing is ever copied between device and host without allow_copy.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "polykv/kernels/codec.h"
#include "polykv/status.h"

namespace polykv::client {

/// Where an agent computes: the CPU, or CUDA device `index` (cudaSetDevice ordinal).
struct AgentDevice {
  kernels::Device kind = kernels::Device::kCpu;
  int index = 0;  ///< CUDA ordinal, >= 0; 0 for the CPU
  bool operator==(const AgentDevice& o) const { return kind == o.kind && index == o.index; }
};

/// Parses "cpu", "cuda" (= cuda:0) or "cuda:N" (N a decimal ordinal in [0, 1023]).
/// Errors: kInvalidArgument quoting the text and the accepted forms.
StatusOr<AgentDevice> ParseAgentDevice(std::string_view text);

/// "cpu" or "cuda:N" (ParseAgentDevice's inverse).
std::string AgentDeviceName(const AgentDevice& device);

/// How one Run reads the pools of its chain (see the table at the top of this file).
enum class PoolRoute : uint8_t {
  kHostInPlace = 0,  ///< host pool, attended in place by the CPU runtime
  kHostDecoded = 1,  ///< host pool decoded into a private host cache
  kCudaCopiedToHost =
      2,             ///< cuda pool copied (compressed) to the host, decoded into a private cache
  kCudaInPlace = 3,  ///< cuda pool attended in place by the CUDA runtime
};

/// "host-in-place", "host-decoded", "cuda-copied-to-host", "cuda-in-place".
const char* PoolRouteName(PoolRoute route);

/// What RoutePool decides from.
struct RouteInput {
  AgentDevice device;          ///< where the agent computes
  bool in_place = true;        ///< Attend::kInPlace asked for (false: decompressed)
  bool mapped_weights = true;  ///< the CPU runtime's weights are mapped (split attention)
  bool allow_copy = false;     ///< AgentOptions::allow_copy (`--allow-copy`)
  std::string_view backend;    ///< the pool's backend: "host" or "cuda"
  std::string_view pool_id;    ///< for the error message
};

/// Decides how a Run reads a pool (the table at the top of this file). Errors:
/// kFailedPrecondition for a pool the agent cannot attend to where it lies (the message names
/// the pool, its backend, the agent's device and the flag that changes it);
/// kInvalidArgument for a backend other than "host" / "cuda".
StatusOr<PoolRoute> RoutePool(const RouteInput& in);

/// The one log line of an allowed copy: what it moves and what it costs, e.g.
/// "agent: --allow-copy: pool 1a2b.. lies in CUDA memory (backend cuda); copying 12.0 MiB of
/// compressed KV to the host, decoded there into a private host cache of 96.0 MiB for this
/// agent alone, instead of attending in place".
/// `pool_bytes`: the pool's encoded bytes; `private_bytes`: the private cache it fills.
std::string CopyCostLine(std::string_view pool_id, uint64_t pool_bytes, uint64_t private_bytes);

}  // namespace polykv::client
