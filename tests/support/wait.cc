// Bounded waits for tests and benchmarks (see wait.h).
#include "support/wait.h"

#include <cstdlib>

namespace polykv::support {

int TimeoutScale() {
  static const int scale = [] {
    const char* v = std::getenv("POLYKV_TEST_TIMEOUT_SCALE");
    const int s = v != nullptr ? std::atoi(v) : 1;
    return s >= 1 ? s : 1;
  }();
  return scale;
}

}  // namespace polykv::support
