// The CPU kernels' thread pool: persistent workers that claim tasks from a shared counter.
//
// Unlike a fork-join barrier (OpenMP), the calling thread never waits for a worker that has
// not started a task: it runs tasks itself until none are left, then waits only for tasks
// other threads already claimed. On a busy host (other processes on the cores, e.g. many
// agents) a descheduled worker therefore delays nothing it did not take, and results never
// depend on which thread ran which task.
#pragma once

#include <cstdint>
#include <functional>

namespace polykv::kernels::internal {

/// Runs fn(t) for every t in [0, tasks) on up to `threads` threads (the caller included).
/// Blocks until all are done. fn must not throw. Calls from several threads at once are
/// serialized (one job at a time in the pool); a nested call runs inline.
void RunTasks(int64_t tasks, int threads, const std::function<void(int64_t)>& fn);

}  // namespace polykv::kernels::internal
