// libtorch intra-op thread control (Debian's libtorch starts with 1 thread).
#include <thread>

#include <torch/torch.h>

#include "polykv/model/llama.h"

namespace polykv::model {

int SetComputeThreads(int n) {
  if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  torch::set_num_threads(n);
  return n;
}

}  // namespace polykv::model
