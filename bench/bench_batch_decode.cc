// Batched decode over one shared pool (LlamaModel::ForwardBatch) against one session at a
// time, in the same run: S sessions, each with its own question about the demo document
// (data/questions.txt, ChatML) after a pool of the document written in memory with the
// default codec, decode `steps` tokens each. Prints aggregate decode tok/s per S, its ratio
// to S = 1, ms per step, and the bytes read per step (weights + pool once, plus each
// session's private KV) next to what S separate agents read for the same tokens.
// --device cuda[:N]: the same pool copied to that GPU and read in place there, the sessions
// decoded by model::CudaBatch; besides, each S's effective bandwidth (tok/s x the weight and
// pool bytes one token of a private decode reads) against device memcpy measured in the run.
//
// Usage: bench_batch_decode [--model PATH.gguf] [--sessions 1,2,4,8,16] [--steps 48]
//                           [--codec SPEC] [--threads N] [--device cpu|cuda[:N]]
// (default model: $POLYKV_SMOLLM2_GGUF; run scripts/fetch-model.sh).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "bench_documents.h"
#include "polykv/agent.h"
#include "polykv/ipc/codec_spec.h"
#include "polykv/ipc/pool_layout.h"
#include "polykv/kernels/device_ops.h"
#include "polykv/model/cuda_llama.h"
#include "polykv/model/llama.h"

#if defined(POLYKV_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace polykv::bench {
namespace {

using Clock = std::chrono::steady_clock;

std::string ReadText(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> Questions() {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(ReadText(SourceDir() + "/data/questions.txt"), '\n'))
    if (!line.empty() && line[0] != '#') out.emplace_back(line);
  return out;
}

struct Pool {
  std::vector<uint8_t> bytes;
  uint64_t offset = 0, size = 0;  ///< the pool's 64-byte aligned start in `bytes`, its bytes
  std::shared_ptr<model::KvPrefix> prefix;
  int64_t bytes_per_step = 0;
};

// The document's pool written in memory with `spec`, as the daemon writes it.
StatusOr<Pool> MakePool(model::LlamaModel& m, const std::vector<int32_t>& doc,
                        const std::string& spec) {
  POLYKV_ASSIGN_OR_RETURN(model::PrefillResult pre, m.Prefill(doc, 512));
  ipc::PoolParams p;
  p.layers = static_cast<uint32_t>(m.config().layers);
  p.kv_heads = static_cast<uint32_t>(m.config().kv_heads);
  p.head_dim = static_cast<uint32_t>(m.config().head_dim);
  p.tokens = doc.size();
  p.raw_dtype = kernels::DType::kF32;
  p.model_fingerprint = m.fingerprint();
  if (spec == "none") {
    p.codec = ipc::PoolCodec::kNone;
  } else {
    p.codec = ipc::PoolCodec::kK8V;
    POLYKV_ASSIGN_OR_RETURN(ipc::CodecSpec cs, ipc::ParseCodecSpec(spec));
    POLYKV_RETURN_IF_ERROR(ipc::ApplyCodecSpec(cs, p.layers, &p));
  }
  POLYKV_ASSIGN_OR_RETURN(ipc::PoolLayout layout, ipc::ComputePoolLayout(p));
  Pool pool;
  pool.bytes.assign(layout.total_bytes + 64, 0);
  pool.offset = (64 - reinterpret_cast<uintptr_t>(pool.bytes.data()) % 64) % 64;
  pool.size = layout.total_bytes;
  uint8_t* base = pool.bytes.data() + pool.offset;
  POLYKV_ASSIGN_OR_RETURN(
      ipc::PoolWriter w,
      ipc::PoolWriter::Create(base, layout.total_bytes, p, std::vector<uint8_t>(32, 1), doc));
  for (uint32_t l = 0; l < p.layers; ++l)
    POLYKV_RETURN_IF_ERROR(w.WriteLayer(l, pre.k[l].data(), pre.v[l].data(), kernels::DType::kF32));
  POLYKV_RETURN_IF_ERROR(w.Finalize());
  POLYKV_ASSIGN_OR_RETURN(ipc::PoolReader r, ipc::PoolReader::Open(base, layout.total_bytes, true));
  pool.prefix = std::make_shared<model::KvPrefix>();
  POLYKV_ASSIGN_OR_RETURN(pool.prefix->view, ipc::PrefixViewOf(r));
  pool.bytes_per_step = pool.prefix->view.LayerBytes() * p.layers;
  return pool;
}

#if defined(POLYKV_HAVE_CUDA)
// The host pool's bytes copied to CUDA device memory and viewed there (what a daemon's cuda
// pool is to an agent), freed with it.
struct DevicePool {
  void* base = nullptr;
  std::shared_ptr<model::KvPrefix> prefix;
  DevicePool() = default;
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;
  ~DevicePool() {
    if (base != nullptr) cudaFree(base);
  }
};

Status ToDevice(const Pool& pool, DevicePool* out) {
  const uint8_t* base = pool.bytes.data() + pool.offset;
  const uint64_t size = pool.size;
  if (cudaMalloc(&out->base, size) != cudaSuccess ||
      cudaMemcpy(out->base, base, size, cudaMemcpyHostToDevice) != cudaSuccess)
    return absl::ResourceExhaustedError("copying the pool to the device failed");
  POLYKV_ASSIGN_OR_RETURN(ipc::PoolReader r,
                          ipc::PoolReader::Open(out->base, size, false, kernels::Device::kCuda));
  out->prefix = std::make_shared<model::KvPrefix>();
  POLYKV_ASSIGN_OR_RETURN(out->prefix->view, ipc::DevicePrefixViewOf(r));
  return absl::OkStatus();
}

// Device memcpy bandwidth (read + write) of 256 MiB, best of 5.
double MemcpyGbs() {
  const size_t n = size_t{256} << 20;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) return 0;
  double best = 0;
  for (int i = 0; i < 6; ++i) {
    cudaDeviceSynchronize();
    const auto t0 = Clock::now();
    cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
    cudaDeviceSynchronize();
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    if (i > 0) best = std::max(best, 2.0 * n / sec / 1e9);
  }
  cudaFree(a);
  cudaFree(b);
  return best;
}
#endif

struct Row {
  int sessions = 0;
  double ms_per_step = 0, tok_per_s = 0;
  double batched_bytes = 0, separate_bytes = 0;  // per step
};

// The row of S sessions that ran `steps` steps in `sec` seconds, each step reading `shared`
// bytes (weights + pool) once and the sessions' private K/V (suffix_bytes over all steps).
Row MakeRow(int s, int steps, double sec, double shared, double suffix_bytes) {
  Row r;
  r.sessions = s;
  r.ms_per_step = sec * 1000 / steps;
  r.tok_per_s = s * steps / sec;
  r.batched_bytes = shared + suffix_bytes / steps;
  r.separate_bytes = s * shared + suffix_bytes / steps;
  return r;
}

// Bytes of one session's private K/V of `length` positions (f32 K and V, every layer).
double SuffixBytes(const model::ModelConfig& c, int64_t length) {
  return 2.0 * 4 * c.layers * c.kv_heads * c.head_dim * length;
}

// S sessions (questions cycled), prompts fed one by one (untimed), then `steps` batched
// greedy steps (timed).
StatusOr<Row> Measure(model::LlamaModel& m, const Pool& pool, const std::vector<int32_t>& doc,
                      const std::vector<std::vector<int32_t>>& prompts, int s, int steps) {
  std::vector<model::KvCache> caches;
  std::vector<int32_t> next;
  for (int i = 0; i < s; ++i) {
    const std::vector<int32_t>& p = prompts[static_cast<size_t>(i) % prompts.size()];
    POLYKV_ASSIGN_OR_RETURN(model::KvCache c,
                            m.NewCacheWithPrefix(pool.prefix, doc, p.size() + steps + 1));
    POLYKV_ASSIGN_OR_RETURN(model::Logits l, m.Forward(p, c, false));
    POLYKV_ASSIGN_OR_RETURN(int32_t t, model::Argmax(l.row(0)));
    caches.push_back(std::move(c));
    next.push_back(t);
  }
  std::vector<model::KvCache*> ptrs;
  for (model::KvCache& c : caches) ptrs.push_back(&c);
  double suffix_bytes = 0;
  const auto t0 = Clock::now();
  for (int step = 0; step < steps; ++step) {
    for (const model::KvCache& c : caches)  // the private K/V each step reads
      suffix_bytes += SuffixBytes(m.config(), c.suffix_length() + 1);
    POLYKV_ASSIGN_OR_RETURN(model::Logits l, m.ForwardBatch(ptrs, next));
    for (int i = 0; i < s; ++i) {
      POLYKV_ASSIGN_OR_RETURN(next[i], model::Argmax(l.row(i)));
    }
  }
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  return MakeRow(s, steps, sec, static_cast<double>(m.WeightBytesPerToken() + pool.bytes_per_step),
                 suffix_bytes);
}

// As Measure, on a CUDA device: a CudaBatch of S slots over the device pool; prompts fed one
// by one and one batched step (untimed: the first step of more than 16 rows makes what the
// prompts did not - the output matrix's f32 copy, the larger workspace and batch logits -
// and meets cuBLAS's first call for its shapes), then `steps` batched greedy steps (timed).
StatusOr<Row> MeasureCuda(model::CudaLlama& m, const model::KvPrefix& prefix,
                          int64_t pool_bytes_per_step,
                          const std::vector<std::vector<int32_t>>& prompts, int s, int steps) {
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  POLYKV_ASSIGN_OR_RETURN(std::unique_ptr<model::CudaBatch> batch,
                          m.NewBatch(&prefix, s, static_cast<int64_t>(longest) + steps + 3));
  std::vector<int32_t> slots, next(static_cast<size_t>(s));
  for (int i = 0; i < s; ++i) {
    POLYKV_ASSIGN_OR_RETURN(int32_t slot, batch->Open());
    slots.push_back(slot);
    POLYKV_RETURN_IF_ERROR(batch->Prompt(slot, prompts[static_cast<size_t>(i) % prompts.size()],
                                         nullptr, &next[static_cast<size_t>(i)]));
  }
  const std::vector<uint8_t> greedy(static_cast<size_t>(s), 0);
  std::vector<int32_t> ids;
  std::vector<float> logits;
  double suffix_bytes = 0;
  const model::ModelConfig& c = m.config();
  POLYKV_RETURN_IF_ERROR(batch->Decode(slots, next, greedy, &ids, &logits));  // warm-up
  next = ids;
  const auto t0 = Clock::now();
  for (int step = 0; step < steps; ++step) {
    for (int32_t slot : slots) suffix_bytes += SuffixBytes(c, batch->length(slot) + 1);
    POLYKV_RETURN_IF_ERROR(batch->Decode(slots, next, greedy, &ids, &logits));
    next = ids;
  }
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  return MakeRow(s, steps, sec, static_cast<double>(m.weight_bytes() + pool_bytes_per_step),
                 suffix_bytes);
}

// The --device cuda table: S sessions by CudaBatch over the pool copied to the device.
int RunCuda(const std::string& model_path, int device, const Pool& pool,
            const std::vector<std::vector<int32_t>>& prompts, const std::string& sessions,
            int steps) {
#if !defined(POLYKV_HAVE_CUDA)
  (void)model_path, (void)device, (void)pool, (void)prompts, (void)sessions, (void)steps;
  std::fprintf(stderr, "bench_batch_decode: --device cuda needs a CUDA build\n");
  return 2;
#else
  auto m = model::CudaLlama::Load(model_path, device);
  if (!m.ok()) {
    std::fprintf(stderr, "cuda load: %s\n", m.status().ToString().c_str());
    return 1;
  }
  DevicePool dp;
  if (Status st = ToDevice(pool, &dp); !st.ok()) {
    std::fprintf(stderr, "device pool: %s\n", st.ToString().c_str());
    return 1;
  }
  const double memcpy_gbs = MemcpyGbs();
  const double per_token = static_cast<double>((*m)->weight_bytes() + pool.bytes_per_step);
  std::printf(
      "cuda:%d: weights %.2f MiB + pool %.2f MiB read per token of a private decode; "
      "device memcpy %.1f GB/s (read + write, same run)\n\n",
      device, (*m)->weight_bytes() / 1048576.0, pool.bytes_per_step / 1048576.0, memcpy_gbs);
  std::printf("%-9s %12s %10s %10s %16s %17s %14s %10s\n", "sessions", "decode tok/s", "vs S=1",
              "ms/step", "MiB/step batched", "MiB/step separate", "effective GB/s", "/ memcpy");
  double base = 0;
  for (absl::string_view sv : absl::StrSplit(sessions, ',')) {
    const int s = std::atoi(std::string(sv).c_str());
    if (s < 1) continue;
    auto r = MeasureCuda(**m, *dp.prefix, pool.bytes_per_step, prompts, s, steps);
    if (!r.ok()) {
      std::fprintf(stderr, "S=%d: %s\n", s, r.status().ToString().c_str());
      return 1;
    }
    if (base == 0) base = r->tok_per_s;
    const double eff = r->tok_per_s * per_token / 1e9;
    std::printf("%-9d %12.1f %9.2fx %10.2f %16.2f %17.2f %14.1f %10.3f\n", s, r->tok_per_s,
                r->tok_per_s / base, r->ms_per_step, r->batched_bytes / 1048576.0,
                r->separate_bytes / 1048576.0, eff, memcpy_gbs > 0 ? eff / memcpy_gbs : 0.0);
  }
  return 0;
#endif
}

int Main(int argc, char** argv) {
  CLI::App app("Batched decode (ForwardBatch) vs one session, same run");
  const char* env = std::getenv("POLYKV_SMOLLM2_GGUF");
  std::string model_path = env != nullptr ? env : "";
  std::string sessions = "1,2,4,8,16";
  std::string codec = ipc::kDefaultCodecSpec;
  std::string device = "cpu";
  int steps = 48, threads = 0;
  app.add_option("--model", model_path, "SmolLM2 GGUF (default $POLYKV_SMOLLM2_GGUF)");
  app.add_option("--sessions", sessions, "session counts, comma-separated");
  app.add_option("--steps", steps, "decode steps (tokens per session)");
  app.add_option("--codec", codec, "pool codec spec, or none");
  app.add_option("--threads", threads, "compute threads (0 = all cores)");
  app.add_option("--device", device, "cpu, or cuda[:N]: the pool in that GPU's memory");
  CLI11_PARSE(app, argc, argv);
  auto dev = client::ParseAgentDevice(device);
  if (!dev.ok()) {
    std::fprintf(stderr, "bench_batch_decode: --device: %s\n", dev.status().ToString().c_str());
    return 2;
  }
  if (dev->kind == kernels::Device::kCuda) {  // before the prefill: say why at once
    if (Status ok = kernels::CheckDeviceAvailable(kernels::Device::kCuda); !ok.ok()) {
      std::printf("bench_batch_decode: skipped: %s\n", std::string(ok.message()).c_str());
      return 0;
    }
  }
  if (model_path.empty()) {
    std::fprintf(stderr, "bench_batch_decode: give --model or set POLYKV_SMOLLM2_GGUF\n");
    return 2;
  }
  std::unique_ptr<model::LlamaModel> m = polykv::bench::LoadModel(model_path, threads, "load");
  if (m == nullptr) return 1;
  const model::Tokenizer* tok = m->tokenizer();
  auto doc = tok->Encode(
      client::ChatDocument(ReadText(SourceDir() + "/data/wikitext-2/robert_boulter.txt")), false);
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& q : Questions())
    prompts.push_back(*tok->Encode(client::ChatQuestionPrompt(q), false));
  if (prompts.empty()) {
    std::fprintf(stderr,
                 "bench_batch_decode: no questions in %s/data/questions.txt (set "
                 "POLYKV_SOURCE_DIR to the source tree)\n",
                 SourceDir().c_str());
    return 2;
  }
  auto pool = MakePool(*m, *doc, codec);
  if (!pool.ok()) {
    std::fprintf(stderr, "pool: %s\n", pool.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "model %s, document %zu tokens, pool codec %s (%.2f MiB read per step), "
      "%d steps, %d threads\n",
      model_path.c_str(), doc->size(), codec.c_str(), pool->bytes_per_step / 1048576.0, steps,
      model::SetComputeThreads(threads));
  if (dev->kind == kernels::Device::kCuda)
    return RunCuda(model_path, dev->index, *pool, prompts, sessions, steps);
  std::printf("weights read per step: %.2f MiB\n\n", m->WeightBytesPerToken() / 1048576.0);
  std::printf("%-9s %12s %10s %10s %16s %17s %8s\n", "sessions", "decode tok/s", "vs S=1",
              "ms/step", "MiB/step batched", "MiB/step separate", "saved");
  double base = 0;
  for (absl::string_view sv : absl::StrSplit(sessions, ',')) {
    const int s = std::atoi(std::string(sv).c_str());
    if (s < 1) continue;
    auto r = Measure(*m, *pool, *doc, prompts, s, steps);
    if (!r.ok()) {
      std::fprintf(stderr, "S=%d: %s\n", s, r.status().ToString().c_str());
      return 1;
    }
    if (base == 0) base = r->tok_per_s;
    std::printf("%-9d %12.1f %9.2fx %10.1f %16.2f %17.2f %7.1fx\n", s, r->tok_per_s,
                r->tok_per_s / base, r->ms_per_step, r->batched_bytes / 1048576.0,
                r->separate_bytes / 1048576.0, r->separate_bytes / r->batched_bytes);
  }
  return 0;
}

}  // namespace
}  // namespace polykv::bench

int main(int argc, char** argv) { return polykv::bench::Main(argc, argv); }
