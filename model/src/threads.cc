// Compute thread control: the threads of the matrix and attention kernels and of OpenBLAS
// (the sgemm of long prefills).
#include <dlfcn.h>

#include <algorithm>
#include <thread>

#include "polykv/kernels/cpu.h"
#include "polykv/model/llama.h"

namespace polykv::model {

int SetComputeThreads(int n) {
  if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  kernels::SetComputeThreads(n);
  // OpenBLAS (selected as libblas.so.3) exports openblas_set_num_threads; the reference
  // BLAS has no threads to set.
  using SetFn = void (*)(int);
  static const auto set_blas =
      reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (set_blas != nullptr) set_blas(n);
  return n;
}

}  // namespace polykv::model
