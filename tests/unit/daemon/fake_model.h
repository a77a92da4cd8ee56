// A LlamaModel stand-in for daemon fault tests: real tokenizer (the GPT-2 vocabulary GGUF of
// tests/data/tokenizer), deterministic K/V, and hooks that let a test hold a prefill or a
// load where it wants (to create "in flight", "queued" or "blocked" states on purpose).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "polykv/model/llama.h"
#include "polykv/model/tokenizer.h"
#include "pool_manager.h"

namespace polykv::daemon::testing {

/// Opens once; every waiter returns after Open().
class Gate {
 public:
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void Wait() {
    entered_.fetch_add(1);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return open_; });
  }
  /// How many callers reached Wait().
  int entered() const { return entered_.load(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  std::atomic<int> entered_{0};
};

/// A Llama-architecture config of the given sizes (head_dim = hidden / heads); every other
/// field keeps ModelConfig's default.
inline model::ModelConfig LlamaConfig(int32_t layers, int32_t hidden, int32_t heads,
                                      int32_t kv_heads, int32_t ffn, int32_t vocab) {
  model::ModelConfig c;
  c.architecture = "llama";
  c.layers = layers;
  c.hidden = hidden;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.ffn = ffn;
  c.vocab = vocab;
  return c;
}

class FakeModel : public model::LlamaModel {
 public:
  /// `before_prefill` runs at the start of every Prefill (e.g. Gate::Wait).
  explicit FakeModel(std::string fingerprint, std::function<void()> before_prefill = {},
                     std::shared_ptr<std::atomic<int>> live = nullptr)
      : fingerprint_(std::move(fingerprint)),
        before_prefill_(std::move(before_prefill)),
        live_(std::move(live)) {
    if (live_) live_->fetch_add(1);
    auto tok = model::LoadTokenizer(std::string(POLYKV_TEST_DATA_DIR) +
                                    "/tokenizer/ggml-vocab-gpt-2.gguf");
    if (tok.ok()) tokenizer_ = *std::move(tok);
    config_ = LlamaConfig(/*layers=*/2, /*hidden=*/16, /*heads=*/2, /*kv_heads=*/2, /*ffn=*/32,
                          /*vocab=*/tokenizer_ ? tokenizer_->vocab_size() : 512);
    config_.max_positions = 4096;
  }
  ~FakeModel() override {
    if (live_) live_->fetch_sub(1);
  }
  const model::ModelConfig& config() const override { return config_; }
  const model::Tokenizer* tokenizer() const override { return tokenizer_.get(); }
  const std::string& fingerprint() const override { return fingerprint_; }
  kernels::DType dtype() const override { return kernels::DType::kF32; }
  model::KvCache NewCache(int64_t) const override { return {}; }
  [[nodiscard]] StatusOr<model::KvCache> NewCacheWithPrefix(std::shared_ptr<const model::KvPrefix>,
                                                            std::vector<int32_t>,
                                                            int64_t) const override {
    return absl::UnimplementedError("fake model");
  }
  [[nodiscard]] StatusOr<model::KvCache> FreezeAsPrefix(model::KvCache&&, int64_t) const override {
    return absl::UnimplementedError("fake model");
  }
  model::WeightStorage weight_storage() const override { return model::WeightStorage::kCopy; }
  int64_t WeightBytesPerToken() const override { return 0; }
  [[nodiscard]] StatusOr<model::Logits> Forward(absl::Span<const int32_t>, model::KvCache&,
                                                bool) override {
    return absl::UnimplementedError("fake model");
  }
  [[nodiscard]] StatusOr<model::Logits> ForwardBatch(absl::Span<model::KvCache* const>,
                                                     absl::Span<const int32_t>) override {
    return absl::UnimplementedError("fake model");
  }
  [[nodiscard]] StatusOr<model::PrefillResult> Prefill(
      absl::Span<const int32_t> tokens, int64_t chunk,
      const std::function<void(int64_t, int64_t)>& progress) override {
    if (before_prefill_) before_prefill_();
    const int64_t n = static_cast<int64_t>(tokens.size());
    model::PrefillResult r;
    for (int l = 0; l < config_.layers; ++l) {
      std::vector<float> k(static_cast<size_t>(config_.kv_heads * n * config_.head_dim));
      std::vector<float> v(k.size());
      float* kp = k.data();
      float* vp = v.data();
      for (int64_t i = 0; i < static_cast<int64_t>(k.size()); ++i) {
        const int64_t t = (i / config_.head_dim) % n;
        kp[i] = 0.01f * static_cast<float>(tokens[t] % 97) + 0.1f * l + 0.001f * (i % 7);
        vp[i] = 0.02f * static_cast<float>(tokens[t] % 89) - 0.05f * l + 0.003f * (i % 5);
      }
      r.k.push_back(k);
      r.v.push_back(v);
    }
    for (int64_t done = std::min(chunk, n); progress; done = std::min(done + chunk, n)) {
      progress(done, n);
      if (done == n) break;
    }
    r.tokens = n;
    r.last_logits.assign(static_cast<size_t>(config_.vocab), 0.f);
    return r;
  }
  [[nodiscard]] StatusOr<model::GenerateResult> Generate(model::KvCache&, absl::Span<const int32_t>,
                                                         const model::SamplingOptions&) override {
    return absl::UnimplementedError("fake model");
  }
  [[nodiscard]] StatusOr<model::PerplexityResult> Perplexity(absl::Span<const int32_t>, int64_t,
                                                             int64_t) override {
    return absl::UnimplementedError("fake model");
  }

 private:
  model::ModelConfig config_;
  std::unique_ptr<model::Tokenizer> tokenizer_;
  std::string fingerprint_;
  std::function<void()> before_prefill_;
  std::shared_ptr<std::atomic<int>> live_;
};

/// A loader making FakeModels (fingerprint "fake"), counting its calls and optionally
/// running `before_load` first (e.g. to block a load).
struct FakeLoader {
  std::shared_ptr<std::atomic<int>> loads = std::make_shared<std::atomic<int>>(0);
  /// FakeModels alive (0 again once every PoolManager holding one is gone), and made.
  std::shared_ptr<std::atomic<int>> live = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<std::atomic<int>> made = std::make_shared<std::atomic<int>>(0);
  std::function<void()> before_load;
  std::function<void()> before_prefill;
  ModelLoader Get() const {
    auto loads_ = loads;
    auto live_ = live;
    auto made_ = made;
    auto before_load_ = before_load;
    auto before_prefill_ = before_prefill;
    return [loads_, live_, made_, before_load_,
            before_prefill_](const std::string&) -> StatusOr<std::unique_ptr<model::LlamaModel>> {
      loads_->fetch_add(1);
      if (before_load_) before_load_();
      auto m = std::make_unique<FakeModel>("fake", before_prefill_, live_);
      made_->fetch_add(1);
      return std::unique_ptr<model::LlamaModel>(std::move(m));
    };
  }
};

}  // namespace polykv::daemon::testing
