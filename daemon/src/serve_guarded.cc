// Exceptions to error replies, and request latency, for every handler (see serve_guarded.h).
#include "serve_guarded.h"

#include <chrono>
#include <exception>
#include <string>

#include "absl/strings/str_cat.h"

namespace polykv::daemon {

ipc::Reply ServeGuarded(const ipc::Request& request, Metrics* metrics,
                        const std::function<ipc::Reply()>& handler) {
  const auto t0 = std::chrono::steady_clock::now();
  auto internal = [&](const char* what) {
    return ipc::ErrorReply(
        request.type, request.id,
        absl::InternalError(absl::StrCat(
            "internal error in ", std::string(ipc::MessageTypeName(request.type)), ": ", what)));
  };
  ipc::Reply reply;
  try {
    reply = handler();
  } catch (const std::exception& e) {  // c10::Error derives from it
    reply = internal(e.what());
  } catch (...) {
    reply = internal("unknown exception");
  }
  if (metrics != nullptr) {
    metrics->ObserveRequest(
        request.type, reply,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return reply;
}

}  // namespace polykv::daemon
