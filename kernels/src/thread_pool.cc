// Thread pool of the CPU kernels (see thread_pool.h).
//
// One job slot: the caller writes fn, then publishes the job in one atomic word
// `state_` = generation (24 bits) | task count (20 bits) | next task (20 bits). Workers claim
// a task with a CAS on that word, so a worker that wakes late can only claim tasks of the
// current job, and fn stays valid while any claimed task is unfinished (the caller waits
// for done == tasks before it returns). Idle workers spin briefly, then sleep on a
// condition variable. Jobs of more than 2^20 tasks run in slices.
#include "thread_pool.h"

#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace polykv::kernels::internal {
namespace {

class Pool {
 public:
  static Pool& Get() {
    static Pool* p = new Pool();  // never destroyed: workers may outlive static destructors
    return *p;
  }

  void Run(int64_t tasks, int threads, const std::function<void(int64_t)>& fn) {
    if (tasks <= 0) return;
    if (threads <= 1 || tasks == 1 || in_job_) {
      for (int64_t t = 0; t < tasks; ++t) fn(t);
      return;
    }
    if (tasks > kMaxTasks) {
      for (int64_t b = 0; b < tasks; b += kMaxTasks) {
        const int64_t n = tasks - b < kMaxTasks ? tasks - b : kMaxTasks;
        Run(n, threads, [&](int64_t t) { fn(b + t); });
      }
      return;
    }
    std::lock_guard<std::mutex> one_job(run_mu_);
    EnsureWorkers(threads - 1);
    fn_ = &fn;
    const uint32_t count = static_cast<uint32_t>(tasks);
    allowed_.store(threads - 1, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    const uint64_t gen = (Gen(state_.load(std::memory_order_relaxed)) + 1) & kGenMask;
    // seq_cst store and load (with the worker's seq_cst increment and re-check below): either
    // the worker sees the new job before sleeping, or this thread sees it sleeping.
    state_.store(gen << 40 | uint64_t{count} << 20, std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> l(mu_);
      cv_.notify_all();
    }
    in_job_ = true;
    uint32_t mine = 0;
    int64_t t;
    while ((t = Claim(gen)) >= 0) {
      fn(t);
      ++mine;
    }
    in_job_ = false;
    done_.fetch_add(mine, std::memory_order_acq_rel);
    // Wait only for tasks other threads claimed (they are running now).
    for (int spin = 0; done_.load(std::memory_order_acquire) < count; ++spin) {
      if (spin < 20000) {
        _mm_pause();
      } else {
        std::this_thread::yield();
      }
    }
  }

 private:
  static constexpr int64_t kMaxTasks = (1 << 20) - 1;
  static constexpr uint64_t kGenMask = (1u << 24) - 1;
  static uint64_t Gen(uint64_t s) { return s >> 40; }
  static uint32_t Count(uint64_t s) { return static_cast<uint32_t>((s >> 20) & 0xfffff); }
  static uint32_t Next(uint64_t s) { return static_cast<uint32_t>(s & 0xfffff); }

  // A task index of generation `gen`, or -1 when none is left (or the job changed).
  int64_t Claim(uint64_t gen) {
    uint64_t s = state_.load(std::memory_order_acquire);
    while (Gen(s) == gen && Next(s) < Count(s)) {
      if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel))
        return static_cast<int64_t>(Next(s));
    }
    return -1;
  }

  void EnsureWorkers(int n) {
    while (static_cast<int>(workers_.size()) < n) {
      const int id = static_cast<int>(workers_.size());
      workers_.emplace_back([this, id] { Work(id); });
      workers_.back().detach();
    }
  }

  void Work(int id) {
    uint64_t seen = 0;
    for (;;) {
      // Wait for a new generation: spin ~50 us, then sleep.
      uint64_t s = state_.load(std::memory_order_acquire);
      const auto t0 = std::chrono::steady_clock::now();
      int spins = 0;
      while (Gen(s) == seen) {
        if (++spins % 64 == 0 &&
            std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(50)) {
          std::unique_lock<std::mutex> l(mu_);
          sleeping_.fetch_add(1, std::memory_order_seq_cst);
          cv_.wait(l, [&] { return Gen(state_.load(std::memory_order_seq_cst)) != seen; });
          sleeping_.fetch_sub(1, std::memory_order_acq_rel);
        } else {
          _mm_pause();
        }
        s = state_.load(std::memory_order_acquire);
      }
      const uint64_t gen = Gen(s);
      seen = gen;
      if (id >= allowed_.load(std::memory_order_relaxed)) continue;  // fewer threads asked
      uint32_t mine = 0;
      int64_t t;
      in_job_ = true;  // a pool call made inside fn runs inline (run_mu_ is held)
      while ((t = Claim(gen)) >= 0) {
        (*fn_)(t);
        ++mine;
      }
      in_job_ = false;
      if (mine > 0) done_.fetch_add(mine, std::memory_order_acq_rel);
    }
  }

  std::mutex run_mu_;  // one job at a time
  std::mutex mu_;      // sleeping workers
  std::condition_variable cv_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> state_{0};
  std::atomic<uint32_t> done_{0};
  std::atomic<int> sleeping_{0};
  std::atomic<int> allowed_{0};
  const std::function<void(int64_t)>* fn_ = nullptr;
  static thread_local bool in_job_;
};

thread_local bool Pool::in_job_ = false;

}  // namespace

void RunTasks(int64_t tasks, int threads, const std::function<void(int64_t)>& fn) {
  Pool::Get().Run(tasks, threads, fn);
}

}  // namespace polykv::kernels::internal
