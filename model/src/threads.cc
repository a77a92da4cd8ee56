// Compute thread control: libtorch intra-op threads (Debian's libtorch starts with 1 thread)
// and the threads of the matrix and attention kernels.
#include <torch/torch.h>

#include <thread>

#include "polykv/kernels/cpu.h"
#include "polykv/model/llama.h"

namespace polykv::model {

int SetComputeThreads(int n) {
  if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  torch::set_num_threads(n);
  kernels::SetComputeThreads(n);
  return n;
}

}  // namespace polykv::model
