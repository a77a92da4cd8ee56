// The one place where a request handler's exceptions become error replies (and where the
// request's latency is recorded): no exception leaves a handler for the socket loops.
#pragma once

#include <functional>

#include "metrics.h"
#include "polykv/ipc/protocol.h"

namespace polykv::daemon {

/// Runs `handler` for `request` and returns its reply. An exception it throws (std::exception,
/// c10::Error among them, or anything else) becomes an INTERNAL error reply "internal error in
/// <TYPE>: <what>" for the request's type and id. When `metrics` is not null, records the
/// request (Metrics::ObserveRequest) with the handler's wall time in seconds.
ipc::Reply ServeGuarded(const ipc::Request& request, Metrics* metrics,
                        const std::function<ipc::Reply()>& handler);

}  // namespace polykv::daemon
