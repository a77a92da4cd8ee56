// The CUDA model runtime (model::CudaLlama) against the CPU runtime on stories260K (f32
// weights), label gpu: logits of a forward within 1e-3 absolute (cuBLAS f32 without TF32 and
// the warp kernels sum in another order than the CPU), greedy answers equal token for token,
// without a prefix and after a raw prefix in device memory attended in place (decode steps by
// CUDA graph replay and by direct launches: the same tokens). Skips without
// a CUDA device; without CUDA in the build, Load must refuse (kUnimplemented), never run on
// the CPU.
#include "polykv/model/cuda_llama.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "polykv/kernels/device_ops.h"
#include "polykv/model/llama.h"
#include "polykv/model/perplexity.h"
#include "polykv/model/prefill.h"

#if defined(POLYKV_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace polykv::model {
namespace {

std::string ModelPath() { return std::string(POLYKV_TEST_DATA_DIR) + "/models/stories260K"; }

#define POLYKV_REQUIRE_CUDA_DEVICE()                                          \
  do {                                                                        \
    const Status st_ = kernels::CheckDeviceAvailable(kernels::Device::kCuda); \
    if (!st_.ok()) GTEST_SKIP() << "no CUDA device: " << st_.message();       \
  } while (0)

// stories260K on the CPU runtime and on CUDA device 0.
struct Runtimes {
  std::unique_ptr<LlamaModel> cpu;
  std::unique_ptr<CudaLlama> gpu;
};

// Loads both runtimes into *r (a test that calls it requires a CUDA device first).
void LoadBoth(Runtimes* r) {
  auto cpu = LlamaModel::Load(ModelPath());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto gpu = CudaLlama::Load(ModelPath(), 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  r->cpu = *std::move(cpu);
  r->gpu = *std::move(gpu);
}

// `n` ids spread over the vocabulary (never 0): the tests' document.
std::vector<int32_t> Document(const ModelConfig& c, size_t n) {
  std::vector<int32_t> doc(n);
  for (size_t i = 0; i < n; ++i) doc[i] = 1 + static_cast<int32_t>(i * 53) % (c.vocab - 1);
  return doc;
}

// A device prefill's K/V per layer and last logits within 1e-3 of the CPU's (f32 weights:
// float rounding of the other summation orders).
void ExpectPrefillNear(const PrefillResult& got, const PrefillResult& want) {
  ASSERT_EQ(got.k.size(), want.k.size());
  float worst = 0;
  for (size_t l = 0; l < want.k.size(); ++l) {
    ASSERT_EQ(got.k[l].size(), want.k[l].size());
    ASSERT_EQ(got.v[l].size(), want.v[l].size());
    for (size_t i = 0; i < want.k[l].size(); ++i) {
      worst = std::max(worst, std::fabs(got.k[l][i] - want.k[l][i]));
      worst = std::max(worst, std::fabs(got.v[l][i] - want.v[l][i]));
    }
  }
  EXPECT_LE(worst, 1e-3f);
  ASSERT_EQ(got.last_logits.size(), want.last_logits.size());
  for (size_t i = 0; i < got.last_logits.size(); ++i)
    ASSERT_NEAR(got.last_logits[i], want.last_logits[i], 1e-3f) << i;
}

#if defined(POLYKV_HAVE_CUDA)
// A keep_on_device prefill's K/V, left in device memory, equal layer by layer to the bits of
// the same prefill copied to the host (`host`).
void ExpectKeptOnDeviceEqual(const PrefillResult& kept, const PrefillResult& host) {
  EXPECT_TRUE(kept.k.empty());
  ASSERT_EQ(PrefilledLayerCount(kept), host.k.size());
  for (size_t l = 0; l < host.k.size(); ++l) {
    auto layer = ExportPrefilledLayer(kept, l, /*to_host=*/false);
    ASSERT_TRUE(layer.ok()) << layer.status();
    EXPECT_EQ(layer->device(), kernels::Device::kCuda);
    ASSERT_EQ(layer->elements(), static_cast<int64_t>(host.k[l].size()));
    std::vector<float> k(host.k[l].size()), v(k.size());
    ASSERT_EQ(cudaMemcpy(k.data(), layer->k(), k.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(v.data(), layer->v(), v.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(k, host.k[l]) << "layer " << l;
    EXPECT_EQ(v, host.v[l]) << "layer " << l;
  }
  EXPECT_EQ(kept.last_logits, host.last_logits);
}
#endif

TEST(CudaLlamaTest, RefusesWithoutADeviceInsteadOfRunningOnTheCpu) {
  if (kernels::CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  auto m = CudaLlama::Load(ModelPath(), 0);
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(m.status().code() == absl::StatusCode::kUnimplemented ||
              m.status().code() == absl::StatusCode::kFailedPrecondition)
      << m.status();
  EXPECT_EQ(CudaRuntimeBuilt(), kernels::CheckDeviceAvailable(kernels::Device::kCuda).code() !=
                                    absl::StatusCode::kUnimplemented);
}

TEST(CudaLlamaTest, LogitsMatchTheCpuRuntime) {
  POLYKV_REQUIRE_CUDA_DEVICE();
  Runtimes m;
  ASSERT_NO_FATAL_FAILURE(LoadBoth(&m));
  EXPECT_EQ(m.gpu->fingerprint(), m.cpu->fingerprint());
  for (int n : {1, 7, 40}) {  // warp kernels (<= 16 rows) and cuBLAS (> 16)
    std::vector<int32_t> ids(n);
    for (int i = 0; i < n; ++i) ids[i] = 1 + (i * 37) % (m.cpu->config().vocab - 1);
    KvCache cache;
    auto want = m.cpu->Forward(ids, cache);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = m.gpu->LastLogits(ids);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want->values.size());
    float worst = 0;
    for (size_t i = 0; i < got->size(); ++i)
      worst = std::max(worst, std::fabs((*got)[i] - want->values[i]));
    EXPECT_LE(worst, 1e-3f) << n << " rows";
  }
}

// A document prefilled on the device: K/V per layer and the last logits as the CPU's
// Prefill gives them (f32 weights: float rounding of the other summation orders, 1e-3).
TEST(CudaLlamaTest, PrefillMatchesTheCpuPrefill) {
  POLYKV_REQUIRE_CUDA_DEVICE();
  Runtimes m;
  ASSERT_NO_FATAL_FAILURE(LoadBoth(&m));
  std::vector<int32_t> doc(300);
  for (size_t i = 0; i < doc.size(); ++i)
    doc[i] = 1 + static_cast<int32_t>(i * 29) % (m.cpu->config().vocab - 1);
  auto want = m.cpu->Prefill(doc);
  ASSERT_TRUE(want.ok()) << want.status();
  int64_t last_done = 0;
  auto got = m.gpu->Prefill(nullptr, doc, 128, [&](int64_t done, int64_t total) {
    EXPECT_EQ(total, 300);
    last_done = done;
  });
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(last_done, 300);
  EXPECT_EQ(got->tokens, 300);
  ASSERT_NO_FATAL_FAILURE(ExpectPrefillNear(*got, *want));
  EXPECT_EQ(m.gpu->Prefill(nullptr, {}).status().code(), absl::StatusCode::kInvalidArgument);
#if defined(POLYKV_HAVE_CUDA)
  // keep_on_device: the same computation, its K/V left in device memory (what polykvd encodes
  // into a cuda pool there): the host copy's bits, layer by layer.
  auto kept = m.gpu->Prefill(nullptr, doc, 128, nullptr, /*keep_on_device=*/true);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_NO_FATAL_FAILURE(ExpectKeptOnDeviceEqual(*kept, *got));
#endif
}

TEST(CudaLlamaTest, GreedyAnswerEqualsTheCpuRuntime) {
  POLYKV_REQUIRE_CUDA_DEVICE();
  Runtimes m;
  ASSERT_NO_FATAL_FAILURE(LoadBoth(&m));
  SamplingOptions s;
  s.max_new_tokens = 40;
  s.stop_at_eos = false;
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 285};
  KvCache cache;
  auto want = m.cpu->Generate(cache, prompt, s);
  ASSERT_TRUE(want.ok()) << want.status();
  auto got = m.gpu->Generate(nullptr, prompt, s);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->tokens, want->tokens);
  EXPECT_EQ(got->tokens.size(), 40u);
}

#if defined(POLYKV_HAVE_CUDA)
// A prefill's K/V copied to device memory as a raw f32 prefix (freed with it).
struct DevicePrefix {
  KvPrefix prefix;
  std::vector<void*> blocks;
  ~DevicePrefix() {
    for (void* b : blocks) cudaFree(b);
  }
};

void UploadPrefix(const ModelConfig& c, const PrefillResult& pre, DevicePrefix* out) {
  const size_t bytes = static_cast<size_t>(c.kv_heads) * pre.tokens * c.head_dim * 4;
  KvPrefix& prefix = out->prefix;
  prefix.view.kv_heads = c.kv_heads;
  prefix.view.head_dim = c.head_dim;
  prefix.view.tokens = pre.tokens;
  prefix.view.codec = kernels::PrefixCodec::kRaw;
  prefix.view.raw_dtype = kernels::DType::kF32;
  for (int l = 0; l < c.layers; ++l) {
    void* k = nullptr;
    void* v = nullptr;
    ASSERT_EQ(cudaMalloc(&k, bytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&v, bytes), cudaSuccess);
    out->blocks.push_back(k);
    out->blocks.push_back(v);
    ASSERT_EQ(cudaMemcpy(k, pre.k[l].data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(v, pre.v[l].data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    prefix.view.layers.push_back(kernels::PrefixLayer{k, nullptr, v, nullptr, 0});
  }
}

TEST(CudaLlamaTest, AttendsInPlaceToADevicePrefixAsTheCpuDoes) {
  POLYKV_REQUIRE_CUDA_DEVICE();
  Runtimes m;
  ASSERT_NO_FATAL_FAILURE(LoadBoth(&m));
  const ModelConfig& c = m.cpu->config();
  const std::vector<int32_t> doc = Document(c, 300);
  const std::vector<int32_t> prompt = {403, 407, 261};
  SamplingOptions s;
  s.max_new_tokens = 24;
  s.stop_at_eos = false;
  // CPU: the document as a raw read-only prefix (the split attention of a codec-none pool).
  auto pre = m.cpu->Prefill(doc);
  ASSERT_TRUE(pre.ok()) << pre.status();
  KvCache cache;
  ASSERT_TRUE(m.cpu->Forward(doc, cache).ok());
  auto frozen = m.cpu->FreezeAsPrefix(std::move(cache), 64);
  ASSERT_TRUE(frozen.ok()) << frozen.status();
  auto want = m.cpu->Generate(*frozen, prompt, s);
  ASSERT_TRUE(want.ok()) << want.status();
  // CUDA: the same K/V copied to device memory, attended in place there.
  DevicePrefix dp;
  ASSERT_NO_FATAL_FAILURE(UploadPrefix(c, *pre, &dp));
  KvPrefix& prefix = dp.prefix;
  int checks = 0;
  prefix.check = [&checks]() -> Status {
    ++checks;
    return absl::OkStatus();
  };
  auto got = m.gpu->Generate(&prefix, prompt, s);  // decode steps replay a CUDA graph
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->tokens, want->tokens);
  EXPECT_EQ(checks, 24);  // the prompt step + 23 decode steps (the last token is not fed)
  // Every kernel launched from the host instead: the same tokens, the same checks.
  m.gpu->set_cuda_graphs(false);
  checks = 0;
  auto direct = m.gpu->Generate(&prefix, prompt, s);
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(direct->tokens, got->tokens);
  EXPECT_EQ(checks, 24);
}

// Scoring a continuation after a device prefix (agent --score-ids --device cuda): every
// position's -log p within 1e-3 of the CPU's ScoreTokens over the same prefix held raw, in
// forwards of 7 rows (several chunks) and of 256.
TEST(CudaLlamaTest, ScoreMatchesTheCpuScore) {
  POLYKV_REQUIRE_CUDA_DEVICE();
  Runtimes m;
  ASSERT_NO_FATAL_FAILURE(LoadBoth(&m));
  const ModelConfig& c = m.cpu->config();
  const std::vector<int32_t> doc = Document(c, 200);
  std::vector<int32_t> cont(30);
  for (size_t i = 0; i < cont.size(); ++i)
    cont[i] = 1 + static_cast<int32_t>(i * 17 + 5) % (c.vocab - 1);
  const std::vector<int32_t> in(cont.begin(), cont.end() - 1), tgt(cont.begin() + 1, cont.end());
  auto pre = m.cpu->Prefill(doc);
  ASSERT_TRUE(pre.ok()) << pre.status();
  KvCache cache;
  ASSERT_TRUE(m.cpu->Forward(doc, cache).ok());
  auto frozen = m.cpu->FreezeAsPrefix(std::move(cache), static_cast<int64_t>(in.size()) + 1);
  ASSERT_TRUE(frozen.ok()) << frozen.status();
  auto want = ScoreTokens(*m.cpu, *frozen, in, tgt, 512);
  ASSERT_TRUE(want.ok()) << want.status();
  DevicePrefix dp;
  ASSERT_NO_FATAL_FAILURE(UploadPrefix(c, *pre, &dp));
  for (int64_t rows : {7, 256}) {
    auto got = m.gpu->Score(&dp.prefix, in, tgt, rows);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want->size());
    for (size_t i = 0; i < want->size(); ++i)
      EXPECT_NEAR((*got)[i], (*want)[i], 1e-3) << "position " << i << ", rows " << rows;
  }
  EXPECT_EQ(m.gpu->Score(&dp.prefix, in, {}, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A child pool's prefill on the device (polykvd --prefill-device cuda, a child of a cuda
// pool): the new positions' K/V and last logits within 1e-3 of the CPU's PrefillAfterPrefix
// over the same prefix held raw (f32 weights), in chunks of 50 rows; left on the device
// with keep_on_device, the same bits; a prefix of another shape is refused.
TEST(CudaLlamaTest, PrefillAfterADevicePrefixMatchesTheCpu) {
  POLYKV_REQUIRE_CUDA_DEVICE();
  Runtimes m;
  ASSERT_NO_FATAL_FAILURE(LoadBoth(&m));
  const ModelConfig& c = m.cpu->config();
  const std::vector<int32_t> doc = Document(c, 200);
  std::vector<int32_t> child(120);
  for (size_t i = 0; i < child.size(); ++i)
    child[i] = 1 + static_cast<int32_t>(i * 19 + 3) % (c.vocab - 1);
  auto pre = m.cpu->Prefill(doc);
  ASSERT_TRUE(pre.ok()) << pre.status();
  KvCache cache;
  ASSERT_TRUE(m.cpu->Forward(doc, cache).ok());
  auto frozen = m.cpu->FreezeAsPrefix(std::move(cache), 1);
  ASSERT_TRUE(frozen.ok()) << frozen.status();
  auto want =
      PrefillAfterPrefix(*m.cpu, {frozen->prefix->view}, doc, child, 64, [](int64_t, int64_t) {});
  ASSERT_TRUE(want.ok()) << want.status();
  DevicePrefix dp;
  ASSERT_NO_FATAL_FAILURE(UploadPrefix(c, *pre, &dp));
  int64_t last_done = 0;
  auto got = m.gpu->Prefill(&dp.prefix, child, 50, [&](int64_t done, int64_t total) {
    EXPECT_EQ(total, 120);
    last_done = done;
  });
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(last_done, 120);
  EXPECT_EQ(got->tokens, 120);
  ASSERT_NO_FATAL_FAILURE(ExpectPrefillNear(*got, *want));
  auto kept = m.gpu->Prefill(&dp.prefix, child, 50, nullptr, /*keep_on_device=*/true);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_NO_FATAL_FAILURE(ExpectKeptOnDeviceEqual(*kept, *got));
  KvPrefix wrong = dp.prefix;
  wrong.view.layers.pop_back();
  EXPECT_EQ(m.gpu->Prefill(&wrong, child).status().code(), absl::StatusCode::kInvalidArgument);
}

// CudaBatch (batched decode over one device prefix): 20 sessions, the second half joining
// after three steps, each row's greedy answer equal to its own Generate's (more than 16 rows:
// cuBLAS products for all rows at once, one slot-attention launch per layer); a prompt's
// logits within 1e-3 of the whole sequence run without a prefix; slot bookkeeping errors.
TEST(CudaLlamaTest, BatchedSessionsEqualTheirOwnGenerate) {
  POLYKV_REQUIRE_CUDA_DEVICE();
  Runtimes m;
  ASSERT_NO_FATAL_FAILURE(LoadBoth(&m));
  const ModelConfig& c = m.cpu->config();
  const std::vector<int32_t> doc = Document(c, 300);
  auto pre = m.cpu->Prefill(doc);
  ASSERT_TRUE(pre.ok()) << pre.status();
  DevicePrefix dp;
  ASSERT_NO_FATAL_FAILURE(UploadPrefix(c, *pre, &dp));
  constexpr int kSessions = 20, kTokens = 12;
  SamplingOptions s;
  s.max_new_tokens = kTokens;
  s.stop_at_eos = false;
  std::vector<std::vector<int32_t>> prompts(kSessions), want(kSessions), got(kSessions);
  for (int i = 0; i < kSessions; ++i) {
    for (int j = 0; j < 2 + i % 5; ++j) prompts[i].push_back(1 + (i * 31 + j * 7) % (c.vocab - 1));
    auto g = m.gpu->Generate(&dp.prefix, prompts[i], s);
    ASSERT_TRUE(g.ok()) << g.status();
    want[i] = g->tokens;
  }
  auto batch = m.gpu->NewBatch(&dp.prefix, kSessions, 32);
  ASSERT_TRUE(batch.ok()) << batch.status();
  CudaBatch& b = **batch;
  std::vector<int32_t> slot(kSessions, -1), next(kSessions, -1);
  auto join = [&](int i) {
    auto sl = b.Open();
    ASSERT_TRUE(sl.ok()) << sl.status();
    slot[i] = *sl;
    std::vector<float> logits;
    ASSERT_TRUE(b.Prompt(slot[i], prompts[i], &logits, &next[i]).ok());
    got[i].push_back(next[i]);
    std::vector<int32_t> all = doc;
    all.insert(all.end(), prompts[i].begin(), prompts[i].end());
    auto ref = m.gpu->LastLogits(all);
    ASSERT_TRUE(ref.ok()) << ref.status();
    float worst = 0;
    for (size_t v = 0; v < logits.size(); ++v)
      worst = std::max(worst, std::fabs(logits[v] - (*ref)[v]));
    EXPECT_LE(worst, 1e-3f) << "session " << i;
  };
  for (int i = 0; i < kSessions / 2; ++i) ASSERT_NO_FATAL_FAILURE(join(i));
  for (int step = 0; step < kTokens + 3; ++step) {
    if (step == 3) {
      for (int i = kSessions / 2; i < kSessions; ++i) ASSERT_NO_FATAL_FAILURE(join(i));
    }
    std::vector<int32_t> slots, tokens, rows;
    for (int i = 0; i < kSessions; ++i) {
      if (slot[i] < 0 || got[i].size() >= static_cast<size_t>(kTokens)) continue;
      slots.push_back(slot[i]);
      tokens.push_back(next[i]);
      rows.push_back(i);
    }
    if (slots.empty()) break;
    std::vector<uint8_t> need(slots.size(), 0);
    need[0] = 1;
    std::vector<int32_t> ids;
    std::vector<float> logits;
    const Status st = b.Decode(slots, tokens, need, &ids, &logits);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(ids.size(), slots.size());
    ASSERT_GE(logits.size(), static_cast<size_t>(c.vocab));
    EXPECT_EQ(*Argmax(absl::MakeConstSpan(logits.data(), static_cast<size_t>(c.vocab))), ids[0]);
    for (size_t r = 0; r < rows.size(); ++r) {
      next[rows[r]] = ids[r];
      got[rows[r]].push_back(ids[r]);
    }
  }
  for (int i = 0; i < kSessions; ++i) EXPECT_EQ(got[i], want[i]) << "session " << i;
  // Bookkeeping: every slot taken, a closed or repeated slot, a full slot.
  EXPECT_EQ(b.Open().status().code(), absl::StatusCode::kResourceExhausted);
  std::vector<int32_t> ids;
  std::vector<float> logits;
  const std::vector<uint8_t> one = {0}, two = {0, 0};
  b.Close(slot[0]);
  EXPECT_EQ(b.Decode({slot[0]}, {5}, one, &ids, &logits).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.Decode({slot[1], slot[1]}, {5, 6}, two, &ids, &logits).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> long_prompt(40, 3);
  EXPECT_EQ(b.Prompt(slot[2], long_prompt, nullptr, nullptr).code(), absl::StatusCode::kOutOfRange);
}
#endif

}  // namespace
}  // namespace polykv::model
