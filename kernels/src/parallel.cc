// CPU thread count and a minimal parallel-for over contiguous chunks (std::thread).
#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "internal.h"

namespace polykv::kernels {
namespace {
std::atomic<int> g_threads{0};
}  // namespace

void SetCodecThreads(int n) { g_threads.store(n < 1 ? 0 : n); }

int CodecThreads() {
  const int n = g_threads.load();
  if (n >= 1) return n;
  return std::max(1u, std::thread::hardware_concurrency());
}

namespace internal {

void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t chunks = std::min<int64_t>(CodecThreads(), (n + grain - 1) / grain);
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> threads;
  threads.reserve(chunks - 1);
  const int64_t per = n / chunks, extra = n % chunks;
  int64_t begin = 0;
  int64_t first_end = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = begin + per + (c < extra ? 1 : 0);
    if (c == 0) {
      first_end = end;
    } else {
      threads.emplace_back([&fn, begin, end] { fn(begin, end); });
    }
    begin = end;
  }
  fn(0, first_end);
  for (auto& t : threads) t.join();
}

std::string DescribeIndex(const LayerShape& shape, int64_t i) {
  const int64_t d = shape.head_dim, t = shape.tokens;
  return absl::StrCat("element ", i, " (head ", i / (t * d), ", token ", (i / d) % t, ", dim ",
                      i % d, ")");
}

}  // namespace internal
}  // namespace polykv::kernels
