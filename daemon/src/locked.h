// A copy of a member read under its object's mutex: the body of the daemon's locked getters.
#pragma once

#include <mutex>

namespace polykv::daemon {

/// `value` copied while `mu` is held.
template <typename T>
T ReadLocked(std::mutex& mu, const T& value) {
  std::lock_guard<std::mutex> lock(mu);
  return value;
}

/// What `read()` returns (e.g. a container's size), called while `mu` is held.
template <typename F>
auto ReadLockedBy(std::mutex& mu, F&& read) {
  std::lock_guard<std::mutex> lock(mu);
  return read();
}

}  // namespace polykv::daemon
