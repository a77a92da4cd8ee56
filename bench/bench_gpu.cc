// bench_gpu: the GPU figures of scripts/gpu-check.sh, each next to a baseline measured in the
// same run: device memcpy bandwidth (the roofline), the CUDA codec's throughput (int8 keys,
// TurboQuant-MSE values: encode and decode), and the CUDA model runtime's decode speed in
// weight bytes per second against that bandwidth. Prints a table (figure, value, unit,
// baseline, ratio); exits 0 with a line saying why when no CUDA device is usable.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "polykv/kernels/codec.h"
#include "polykv/kernels/device_ops.h"
#include "polykv/model/cuda_llama.h"

#if defined(POLYKV_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace {

[[maybe_unused]] void Row(const char* figure, double value, const char* unit, double baseline,
                          const char* of) {
  std::printf("  %-36s %12.2f %-8s baseline %12.2f (%s)  ratio %.3f\n", figure, value, unit,
              baseline, of, baseline > 0 ? value / baseline : 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("GPU figures: codec and model decode vs device memcpy");
  std::string model;
  int tokens = 64, device = 0;
  app.add_option("--model", model, "model for decode tok/s (empty: skip)");
  app.add_option("--tokens", tokens, "decode steps for the model figure");
  app.add_option("--device", device, "CUDA ordinal");
  CLI11_PARSE(app, argc, argv);
  using polykv::kernels::Device;
  const polykv::Status ok = polykv::kernels::CheckDeviceAvailable(Device::kCuda);
  if (!ok.ok()) {
    std::printf("bench_gpu: skipped: %s\n", std::string(ok.message()).c_str());
    return 0;
  }
#if defined(POLYKV_HAVE_CUDA)
  namespace k = polykv::kernels;
  cudaSetDevice(device);
  using Clock = std::chrono::steady_clock;
  const auto secs = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  // A document-sized layer: 8 KV heads x 32768 tokens x 128 (f32: 128 MiB).
  const k::LayerShape shape{8, 32768, 128};
  const size_t n = static_cast<size_t>(shape.elements());
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i)
    host[i] = static_cast<float>((i * 2654435761u) % 2001) / 1000.f - 1;
  float *x = nullptr, *y = nullptr, *norms = nullptr, *scales = nullptr;
  uint8_t* codes = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&x), n * 4);
  cudaMalloc(reinterpret_cast<void**>(&y), n * 4);
  cudaMalloc(reinterpret_cast<void**>(&codes), n);
  cudaMalloc(reinterpret_cast<void**>(&norms), static_cast<size_t>(shape.vectors()) * 4);
  cudaMalloc(reinterpret_cast<void**>(&scales),
             static_cast<size_t>(shape.elements() / shape.tokens) * 4);
  cudaMemcpy(x, host.data(), n * 4, cudaMemcpyHostToDevice);
  const int reps = 10;
  auto t0 = Clock::now();
  for (int r = 0; r < reps; ++r) cudaMemcpy(y, x, n * 4, cudaMemcpyDeviceToDevice);
  cudaDeviceSynchronize();
  const double memcpy_gbs = 2.0 * n * 4 * reps / secs(t0) / 1e9;  // read + write
  std::printf("bench_gpu: device %d, layer [%d][%lld][%d] f32 (%.0f MiB)\n", device, shape.kv_heads,
              static_cast<long long>(shape.tokens), shape.head_dim, n * 4 / 1048576.0);
  Row("device memcpy (read + write)", memcpy_gbs, "GB/s", memcpy_gbs, "memcpy");
  k::CodecConfig cfg;  // k8v3
  struct Op {
    const char* name;
    std::function<polykv::Status()> run;
  };
  const std::vector<Op> ops = {
      {"encode keys int8 (f32 in)",
       [&] {
         return k::QuantizeKeys(x, k::DType::kF32, shape, cfg.key_scale,
                                reinterpret_cast<int8_t*>(codes), scales, Device::kCuda);
       }},
      {"encode values 3-bit (f32 in)",
       [&] { return k::EncodeValues(x, k::DType::kF32, shape, cfg, codes, norms, Device::kCuda); }},
      {"decode values 3-bit (f32 out)",
       [&] { return k::DecodeValues(codes, norms, shape, cfg, y, k::DType::kF32, Device::kCuda); }},
  };
  for (const Op& op : ops) {
    polykv::Status s = op.run();  // warm-up
    cudaDeviceSynchronize();
    t0 = Clock::now();
    for (int r = 0; r < reps && s.ok(); ++r) s = op.run();
    cudaDeviceSynchronize();
    if (!s.ok()) {
      std::printf("  %-36s error: %s\n", op.name, s.ToString().c_str());
      continue;
    }
    Row(op.name, 1.0 * n * 4 * reps / secs(t0) / 1e9, "GB/s f32", memcpy_gbs, "memcpy");
  }
  cudaFree(x);
  cudaFree(y);
  cudaFree(codes);
  cudaFree(norms);
  cudaFree(scales);
  if (!model.empty()) {
    size_t free0 = 0, total = 0;
    cudaMemGetInfo(&free0, &total);
    auto m = polykv::model::CudaLlama::Load(model, device);
    if (!m.ok()) {
      std::printf("  model: %s\n", m.status().ToString().c_str());
      return 1;
    }
    polykv::model::SamplingOptions s;
    s.max_new_tokens = tokens;
    s.stop_at_eos = false;
    const std::vector<int32_t> prompt = {1, 2, 3, 4};
    // Decode tok/s with every kernel launched from the host (the baseline) and by CUDA graph
    // replay, alternating, best of 3 each; greedy tokens must agree.
    double best[2] = {0, 0};
    std::vector<int32_t> answer[2];
    for (int rep = 0; rep < 6; ++rep) {
      const int graphs = rep % 2;
      (*m)->set_cuda_graphs(graphs == 1);
      auto gen = (*m)->Generate(nullptr, prompt, s);
      if (!gen.ok()) {
        std::printf("  model: %s\n", gen.status().ToString().c_str());
        return 1;
      }
      const double dt = (gen->total_ms - gen->first_token_ms) / 1000.0;
      best[graphs] = std::max(best[graphs], dt > 0 ? (gen->tokens.size() - 1) / dt : 0);
      answer[graphs] = gen->tokens;
    }
    const double weight_bytes = static_cast<double>((*m)->device_bytes());
    Row("model decode, host launches", best[0], "tok/s", memcpy_gbs * 1e9 / weight_bytes,
        "memcpy-bound tok/s");
    Row("model decode, CUDA graph", best[1], "tok/s", best[0], "host launches");
    std::printf("  model decode: graph and host-launch tokens %s; %.1f us per token (graph)\n",
                answer[0] == answer[1] ? "equal" : "DIFFER", best[1] > 0 ? 1e6 / best[1] : 0);
    std::printf("  model device memory %.1f MiB (weights + workspace)\n",
                (*m)->device_bytes() / 1048576.0);
  }
#endif
  return 0;
}
