// Internal to polykv_ipc: the one JSON form of PoolInfo, shared by the wire protocol
// (protocol.cc) and the pool file manifest (pool_file.cc).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "polykv/ipc/protocol.h"
#include "polykv/status.h"

namespace polykv::ipc::internal {

/// Every PoolInfo field as a JSON object (the names of the wire protocol).
nlohmann::json PoolInfoJson(const PoolInfo& p);

/// Reads what PoolInfoJson wrote: absent fields keep their defaults, a field of the wrong
/// type is kInvalidArgument naming it (`where` names the object in that message).
[[nodiscard]] StatusOr<PoolInfo> PoolInfoFromJsonObject(const nlohmann::json& j,
                                                        const std::string& where);

}  // namespace polykv::ipc::internal
