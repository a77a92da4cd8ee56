// The CPU-side logic of the CUDA model runtime, run in CI without a device: the GGUF Q/K row
// permutation it applies at upload (the CPU runtime's per-output de-interleave, done once on
// the weights), and that Load refuses (never runs on the CPU) where no device is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "polykv/kernels/device_ops.h"
#include "polykv/model/cuda_llama.h"

namespace polykv::model {
namespace {

TEST(CudaLlamaCpuTest, InterleavedRowsMatchTheCpuDeinterleave) {
  for (int32_t hd : {2, 8, 64, 128}) {
    const int32_t heads = 3;
    // The CPU runtime (mapped_llama.cc Deinterleave): HF[j] = file[2j], HF[j + hd/2] =
    // file[2j + 1] within each head. Apply it to file row indices.
    std::vector<int64_t> file(static_cast<size_t>(heads * hd));
    std::iota(file.begin(), file.end(), 0);
    std::vector<int64_t> hf(file.size());
    for (int32_t h = 0; h < heads; ++h)
      for (int32_t j = 0; j < hd / 2; ++j) {
        hf[h * hd + j] = file[h * hd + 2 * j];
        hf[h * hd + j + hd / 2] = file[h * hd + 2 * j + 1];
      }
    std::vector<bool> seen(file.size(), false);
    for (int64_t r = 0; r < heads * hd; ++r) {
      const int64_t src = GgufInterleavedSourceRow(r, hd);
      ASSERT_EQ(src, hf[static_cast<size_t>(r)]) << "head_dim " << hd << " row " << r;
      ASSERT_FALSE(seen[static_cast<size_t>(src)]) << "not a permutation at " << r;
      seen[static_cast<size_t>(src)] = true;
    }
  }
  // Fixed values, head_dim 8: HF rows 0..7 come from file rows 0 2 4 6 1 3 5 7.
  const int64_t want[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  for (int r = 0; r < 8; ++r) EXPECT_EQ(GgufInterleavedSourceRow(r, 8), want[r]);
  EXPECT_EQ(GgufInterleavedSourceRow(8 + 5, 8), 8 + 3);
}

TEST(CudaLlamaCpuTest, LoadRefusesWithoutAUsableDevice) {
  if (kernels::CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  auto m = CudaLlama::Load(std::string(POLYKV_TEST_DATA_DIR) + "/models/stories260K", 0);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), CudaRuntimeBuilt() ? absl::StatusCode::kFailedPrecondition
                                                  : absl::StatusCode::kUnimplemented)
      << m.status();
}

}  // namespace
}  // namespace polykv::model
