// Compute thread control: the threads of the matrix and attention kernels.
#include <algorithm>
#include <thread>

#include "polykv/kernels/cpu.h"
#include "polykv/model/llama.h"

namespace polykv::model {

int SetComputeThreads(int n) {
  if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  kernels::SetComputeThreads(n);
  // OpenBLAS keeps its own thread count (as it did under libtorch): the sgemm of a long
  // prefill then splits its work the same way whatever n a process asks for, so processes
  // with different thread counts score bit-identically (EvalAgents.NAgentsAtOnce...).
  return n;
}

}  // namespace polykv::model
