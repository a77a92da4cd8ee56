// CUDA IPC (label gpu): PoolWriter/PoolReader on device memory against the CPU path, and
// an arena exported to a second process (this binary re-run with a child-only test) that
// maps it read-only through CudaIpcMapping. Skips without a CUDA device.
#include "polykv/ipc/cuda_ipc.h"

#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include "polykv/ipc/codec_spec.h"
#include "polykv/ipc/pool_layout.h"
#include "polykv/ipc/protocol.h"
#include "pool_test_util.h"

#ifdef POLYKV_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

extern char** environ;

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

#ifdef POLYKV_HAVE_CUDA

PoolParams Params(uint32_t layers = 2) {
  PoolParams p = testing::TestPoolParams(layers, 3, 64, 50);
  p.model_fingerprint = "gpu-test";
  return p;
}

std::vector<float> Kv(const PoolParams& p, uint32_t seed) {
  return testing::RandomKv(p, seed, 1.f);
}

// Builds the same pool on the host and on the device; returns the host bytes.
std::vector<uint8_t> HostPool(const PoolParams& p, const std::vector<int32_t>& ids) {
  auto layout = ComputePoolLayout(p);
  std::vector<uint8_t> host(layout->total_bytes, 0);
  std::vector<uint8_t> id(32, 7);
  auto w = PoolWriter::Create(host.data(), host.size(), p, id, ids);
  EXPECT_TRUE(w.ok());
  for (uint32_t l = 0; l < p.layers; ++l) {
    auto k = Kv(p, 2 * l), v = Kv(p, 2 * l + 1);
    EXPECT_TRUE(w->WriteLayer(l, k.data(), v.data(), kernels::DType::kF32).ok());
  }
  EXPECT_TRUE(w->Finalize().ok());
  return host;
}

// Every codec a pool holds, encoded by the device writer: the same payload bytes (token ids,
// key codes and scales, packed values, f32 or f16 norms) as the host writer's, for packed
// keys of every width, per-layer value bits, norm correction and f16 norms; the header differs
// only in what the host measures (reconstruction errors). Decoded back on the device, too.
TEST(CudaIpcTest, DeviceWriterEncodesEveryCodecAsTheHost) {
  if (!CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  // nullptr: the test pool's own codec (k8v3, per-tensor scale); then codec specs.
  for (const char* spec : {static_cast<const char*>(nullptr), "k7c-v3-e4x3-nc-n16", "k4t-v2-n16",
                           "k5h-v4-nc", "k6c-v3-e4x1", "k8c-v3-n16"}) {
    SCOPED_TRACE(spec != nullptr ? spec : "k8v3");
    PoolParams p = Params(8);
    if (spec != nullptr) {
      auto cs = ParseCodecSpec(spec);
      ASSERT_TRUE(cs.ok()) << cs.status();
      ASSERT_TRUE(ApplyCodecSpec(*cs, p.layers, &p).ok());
    }
    const std::vector<int32_t> ids = testing::Iota(p.tokens);
    auto host = HostPool(p, ids);
    auto arena = CudaArena::Allocate(host.size());
    ASSERT_TRUE(arena.ok()) << arena.status();
    std::vector<uint8_t> id(32, 7);
    auto w = PoolWriter::Create(arena->data(), arena->size(), p, id, ids, kernels::Device::kCuda);
    ASSERT_TRUE(w.ok()) << w.status();
    const size_t n = size_t{p.kv_heads} * p.tokens * p.head_dim;
    float *dk = nullptr, *dv = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dk), 4 * n), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dv), 4 * n), cudaSuccess);
    for (uint32_t l = 0; l < p.layers; ++l) {
      auto k = Kv(p, 2 * l), v = Kv(p, 2 * l + 1);
      cudaMemcpy(dk, k.data(), 4 * n, cudaMemcpyHostToDevice);
      cudaMemcpy(dv, v.data(), 4 * n, cudaMemcpyHostToDevice);
      const Status st = w->WriteLayer(l, dk, dv, kernels::DType::kF32);
      ASSERT_TRUE(st.ok()) << "layer " << l << ": " << st;
    }
    ASSERT_TRUE(w->Finalize().ok());
    std::vector<uint8_t> dev(host.size());
    ASSERT_TRUE(arena->CopyToHost(0, dev.data(), dev.size()).ok());
    ASSERT_EQ(std::memcmp(dev.data() + kPoolHeaderBytes, host.data() + kPoolHeaderBytes,
                          host.size() - kPoolHeaderBytes),
              0)
        << "device-encoded payload differs from the host's";
    auto r = PoolReader::Open(arena->data(), arena->size(), true, kernels::Device::kCuda);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->TokenIds(), ids);
    auto hr = PoolReader::Open(host.data(), host.size(), true);
    ASSERT_TRUE(hr.ok());
    std::vector<float> hk(n), hv(n), gk(n), gv(n);
    for (uint32_t l = 0; l < p.layers; ++l) {
      ASSERT_TRUE(hr->DecodeLayer(l, hk.data(), hv.data(), kernels::DType::kF32).ok());
      const Status st = r->DecodeLayer(l, dk, dv, kernels::DType::kF32);
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      cudaMemcpy(gk.data(), dk, 4 * n, cudaMemcpyDeviceToHost);
      cudaMemcpy(gv.data(), dv, 4 * n, cudaMemcpyDeviceToHost);
      EXPECT_EQ(gk, hk) << "layer " << l << " keys (the same codes and scales)";
      for (size_t i = 0; i < n; ++i)
        ASSERT_NEAR(gv[i], hv[i], 1e-4f * (1 + std::abs(hv[i]))) << "layer " << l << " " << i;
    }
    cudaFree(dk);
    cudaFree(dv);
  }
}

// Child half of CrossProcessMapping: maps the handle from $POLYKV_TEST_CUDA_HANDLE and
// checks the pool's token ids and payload checksum.
TEST(CudaIpcChild, DISABLED_MapsPool) {
  const char* path = std::getenv("POLYKV_TEST_CUDA_HANDLE");
  ASSERT_NE(path, nullptr);
  std::ifstream f(path);
  std::string frame((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto reply = DecodeReply(frame);
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_TRUE(reply->memory.has_value());
  auto m = CudaIpcMapping::Open(reply->memory->cuda);
  ASSERT_TRUE(m.ok()) << m.status();
  auto again = CudaIpcMapping::Open(reply->memory->cuda);  // refcounted reuse
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->data(), m->data());
  auto r = PoolReader::Open(m->data(), m->size(), true, kernels::Device::kCuda);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<int32_t> ids = r->TokenIds();
  ASSERT_EQ(ids.size(), 50u);
  EXPECT_EQ(ids[49], 49);
}

TEST(CudaIpcTest, CrossProcessMapping) {
  if (!CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  PoolParams p = Params();
  const std::vector<int32_t> ids = testing::Iota(p.tokens);
  auto host = HostPool(p, ids);
  auto arena = CudaArena::Allocate(host.size() + 4096);
  ASSERT_TRUE(arena.ok()) << arena.status();
  ASSERT_TRUE(arena->CopyFromHost(4096, host.data(), host.size()).ok());
  auto h = arena->Export(4096, host.size());  // an interior pool: offset matters
  ASSERT_TRUE(h.ok()) << h.status();
  Reply reply;
  reply.type = MessageType::kAttach;
  MemoryHandle mem;
  mem.backend = PoolMemory::kCuda;
  mem.cuda = *h;
  mem.size = host.size();
  reply.memory = mem;
  char tmpl[] = "/tmp/polykv-cuda-XXXXXX";
  int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  std::string frame = EncodeReply(reply);
  ASSERT_EQ(write(fd, frame.data(), frame.size()), static_cast<ssize_t>(frame.size()));
  close(fd);
  setenv("POLYKV_TEST_CUDA_HANDLE", tmpl, 1);
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  std::string a0 = self, a1 = "--gtest_also_run_disabled_tests",
              a2 = "--gtest_filter=CudaIpcChild.DISABLED_MapsPool";
  char* argv[] = {a0.data(), a1.data(), a2.data(), nullptr};
  pid_t pid;
  ASSERT_EQ(posix_spawn(&pid, self, nullptr, nullptr, argv, environ), 0);
  int status = 0;
  waitpid(pid, &status, 0);
  unsetenv("POLYKV_TEST_CUDA_HANDLE");
  unlink(tmpl);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child failed";
}

#endif  // POLYKV_HAVE_CUDA

}  // namespace
}  // namespace polykv::ipc
