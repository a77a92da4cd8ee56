// Bounded waits for tests and benchmarks: poll a condition (a socket file appears, a log line
// is written, a daemon answers) until it holds or a deadline passes, and the factor
// $POLYKV_TEST_TIMEOUT_SCALE that stretches test bounds in slow (sanitizer) builds.
#pragma once

#include <chrono>
#include <thread>

namespace polykv::support {

/// $POLYKV_TEST_TIMEOUT_SCALE as an integer >= 1 (default 1): the factor tests apply to their
/// wait bounds, since instrumented processes start and run several times slower.
int TimeoutScale();

/// Calls `pred` every `poll_ms` milliseconds until it returns true or `timeout_ms` have passed
/// (not scaled); returns its last value, so a condition that holds at the deadline counts.
template <typename Pred>
bool WaitFor(Pred pred, int timeout_ms, int poll_ms = 20) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
  }
  return pred();
}

}  // namespace polykv::support
