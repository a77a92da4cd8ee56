// Compute thread control: the threads of the matrix and attention kernels.
#include <algorithm>
#include <thread>

#include "polykv/kernels/cpu.h"
#include "polykv/model/llama.h"

namespace polykv::model {

int SetComputeThreads(int n) {
  if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  kernels::SetComputeThreads(n);
  // A long prefill's sgemms run single-threaded, one per row tile (or attention block) on
  // the kernels' pool (mapped_llama.cc); the tiles do not depend on n, so processes with
  // different thread counts score bit-identically (EvalAgents.NAgentsAtOnce...).
  return n;
}

}  // namespace polykv::model
