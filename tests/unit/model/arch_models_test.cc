// One tiny randomly initialized checkpoint per supported architecture
// (tests/data/models/arch, written by gen_arch_models.py) against the logits of the numpy
// reference in that script, in both runtimes (mapped: quantized-kernel and GEMM paths; the
// libtorch copy): Llama with Llama 3.1 RoPE scaling and attention biases (GGUF rope_freqs,
// HF rope_scaling llama3), Qwen2 (GGUF and HF) with and without YaRN, and Mistral with a
// sliding window, which runs inside the window and is refused past it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model_test_util.h"
#include "polykv/model/llama.h"
#include "torch_test_util.h"

namespace polykv::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kDir = POLYKV_TEST_DATA_DIR "/models/arch";
// The checkpoints are F32/F16/BF16 and the mapped runtime multiplies those with f32
// activations, so both runtimes compute in f32 against an f64 reference (logits ~ +-3;
// every variant measured within 2e-6).
constexpr float kTolerance = 5e-5f;

struct Case {
  std::string name;
  std::string path;      // a .gguf or HF folder under kDir
  json config;           // non-null: config.json to use with the folder's weights
  json expect;           // ModelConfig fields
  torch::Tensor logits;  // [tokens][vocab]
};

struct Variant {
  const char* name;
  WeightStorage weights;
  int64_t quantized_rows;
};
const Variant kVariants[] = {{"mapped", WeightStorage::kMapped, kMappedGemmRows},
                             {"mapped-gemm", WeightStorage::kMapped, 0},
                             {"copy", WeightStorage::kCopy, kMappedGemmRows}};

class ArchModelsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::ifstream in(kDir + "/expected_logits.json");
    ASSERT_TRUE(in) << "missing " << kDir << "/expected_logits.json";
    const json j = json::parse(in);
    tokens_ = new std::vector<int32_t>(j["tokens"].get<std::vector<int32_t>>());
    cases_ = new std::vector<Case>();
    tmp_ = fs::temp_directory_path() / ("polykv_arch_" + std::to_string(::getpid()));
    fs::create_directories(tmp_);
    for (const json& c : j["cases"]) {
      Case k;
      k.name = c["name"];
      k.path = kDir + "/" + c["path"].get<std::string>();
      k.expect = c["expect"];
      if (c.contains("config")) {
        // The folder's weights with another config.json, in a folder of their own.
        const fs::path d = tmp_ / k.name;
        fs::create_directories(d);
        fs::copy_file(fs::path(k.path) / "model.safetensors", d / "model.safetensors",
                      fs::copy_options::overwrite_existing);
        std::ofstream(d / "config.json") << c["config"].dump(2);
        k.path = d.string();
      }
      const auto rows = c["logits"].get<std::vector<std::vector<float>>>();
      k.logits =
          torch::empty({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
      for (size_t i = 0; i < rows.size(); ++i)
        std::copy(rows[i].begin(), rows[i].end(), k.logits[i].data_ptr<float>());
      cases_->push_back(std::move(k));
    }
  }
  static void TearDownTestSuite() {
    fs::remove_all(tmp_);
    delete cases_;
    delete tokens_;
  }
  static const Case& Find(const std::string& name) {
    for (const Case& c : *cases_)
      if (c.name == name) return c;
    ADD_FAILURE() << "no case " << name;
    return cases_->front();
  }
  static std::unique_ptr<LlamaModel> Load(const Case& c, const Variant& v) {
    LoadOptions o;
    o.threads = 1;
    o.weights = v.weights;
    o.quantized_rows = v.quantized_rows;
    auto m = testing::LoadRuntime(c.path, o);
    EXPECT_TRUE(m.ok()) << c.name << " (" << v.name << "): " << m.status();
    return m.ok() ? std::move(m).value() : nullptr;
  }
  static float MaxDiff(const torch::Tensor& a, const torch::Tensor& b) {
    return (a - b).abs().max().item<float>();
  }
  static float MaxDiff(const Logits& a, const torch::Tensor& b) {
    return MaxDiff(testing::T(a), b);
  }
  static float MaxDiff(const std::vector<float>& a, const torch::Tensor& b) {
    return MaxDiff(torch::from_blob(const_cast<float*>(a.data()), {static_cast<int64_t>(a.size())},
                                    torch::kFloat32),
                   b.reshape({-1}));
  }

  static std::vector<int32_t>* tokens_;
  static std::vector<Case>* cases_;
  static fs::path tmp_;
};
std::vector<int32_t>* ArchModelsTest::tokens_ = nullptr;
std::vector<Case>* ArchModelsTest::cases_ = nullptr;
fs::path ArchModelsTest::tmp_;

TEST_F(ArchModelsTest, EveryCaseIsPresent) {
  std::vector<std::string> names;
  for (const Case& c : *cases_) names.push_back(c.name);
  for (const char* n : {"llama3_gguf", "llama3_hf", "qwen2_gguf", "qwen2_hf", "qwen2_yarn_gguf",
                        "qwen2_yarn_hf", "mistral_hf", "mistral_gguf"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
}

TEST_F(ArchModelsTest, ConfigIsReadFromTheFile) {
  for (const Case& c : *cases_) {
    SCOPED_TRACE(c.name);
    auto m = Load(c, kVariants[0]);
    ASSERT_NE(m, nullptr);
    const ModelConfig& cfg = m->config();
    EXPECT_EQ(cfg.architecture, c.expect["architecture"].get<std::string>());
    EXPECT_STREQ(RopeScalingName(cfg.rope_scaling.type),
                 c.expect["rope_scaling"].get<std::string>().c_str());
    EXPECT_EQ(cfg.qkv_bias, c.expect["qkv_bias"].get<bool>());
    EXPECT_EQ(cfg.o_bias, c.expect["o_bias"].get<bool>());
    EXPECT_EQ(cfg.tied_embeddings, c.expect["tied_embeddings"].get<bool>());
    EXPECT_EQ(cfg.sliding_window, c.expect["sliding_window"].get<int32_t>());
    EXPECT_FLOAT_EQ(cfg.rope_theta, c.expect["rope_theta"].get<float>());
    EXPECT_EQ(cfg.max_positions, c.expect["max_positions"].get<int32_t>());
    // layers, hidden, heads, kv_heads, head_dim, ffn, vocab, bos, eos (-1: not checked)
    testing::ExpectDims(cfg, {2, -1, 4, 2, 16, -1, 64, 1, 2});
    EXPECT_EQ(m->tokenizer(), nullptr);
  }
  // The parameters themselves.
  auto l3 = Load(Find("llama3_hf"), kVariants[0]);
  ASSERT_NE(l3, nullptr);
  const RopeScaling& r = l3->config().rope_scaling;
  EXPECT_DOUBLE_EQ(r.factor, 8);
  EXPECT_DOUBLE_EQ(r.low_freq_factor, 1);
  EXPECT_DOUBLE_EQ(r.high_freq_factor, 4);
  EXPECT_EQ(r.original_max_positions, 64);
  auto ff = Load(Find("llama3_gguf"), kVariants[0]);
  ASSERT_NE(ff, nullptr);
  EXPECT_EQ(ff->config().rope_scaling.freq_factors.size(), 8u);
  for (const char* name : {"qwen2_yarn_gguf", "qwen2_yarn_hf"}) {
    auto y = Load(Find(name), kVariants[0]);
    ASSERT_NE(y, nullptr);
    EXPECT_DOUBLE_EQ(y->config().rope_scaling.factor, 4) << name;
    EXPECT_EQ(y->config().rope_scaling.original_max_positions, 256) << name;
    EXPECT_NEAR(y->config().rope_scaling.attention_factor, 0.1 * std::log(4.0) + 1, 1e-12) << name;
  }
}

// All positions in one forward.
TEST_F(ArchModelsTest, LogitsMatchReference) {
  for (const Case& c : *cases_) {
    for (const Variant& v : kVariants) {
      SCOPED_TRACE(c.name + " " + v.name);
      auto m = Load(c, v);
      ASSERT_NE(m, nullptr);
      EXPECT_EQ(m->weight_storage(), v.weights);
      KvCache cache = m->NewCache(4);  // grows
      auto l = m->Forward(*tokens_, cache, /*all_logits=*/true);
      ASSERT_TRUE(l.ok()) << l.status();
      ASSERT_EQ(testing::T(*l).sizes(), c.logits.sizes());
      const float d = MaxDiff(*l, c.logits);
      EXPECT_LT(d, kTolerance) << "max |logit - reference| = " << d;
      RecordProperty(c.name + "_" + v.name + "_max_diff", std::to_string(d));
    }
  }
}

// A prompt, then one token at a time from the cache; and Prefill in chunks.
TEST_F(ArchModelsTest, IncrementalDecodeAndChunkedPrefillMatchReference) {
  const int64_t n = static_cast<int64_t>(tokens_->size()), first = 5;
  for (const Case& c : *cases_) {
    for (const Variant& v : kVariants) {
      SCOPED_TRACE(c.name + " " + v.name);
      auto m = Load(c, v);
      ASSERT_NE(m, nullptr);
      KvCache cache = m->NewCache(n);
      auto head = m->Forward(absl::MakeConstSpan(tokens_->data(), first), cache, true);
      ASSERT_TRUE(head.ok()) << head.status();
      EXPECT_LT(MaxDiff(*head, c.logits.narrow(0, 0, first)), kTolerance);
      for (int64_t i = first; i < n; ++i) {
        auto step = m->Forward(absl::MakeConstSpan(tokens_->data() + i, 1), cache);
        ASSERT_TRUE(step.ok()) << step.status();
        EXPECT_LT(MaxDiff(*step, c.logits[i]), kTolerance) << "position " << i;
      }
      auto p = m->Prefill(*tokens_, /*chunk=*/5);
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_LT(MaxDiff(p->last_logits, c.logits[n - 1]), kTolerance);
      // The prefilled K/V equal the incremental cache's.
      for (int l = 0; l < 2; ++l)
        EXPECT_LT(MaxDiff(p->k[l], testing::T(cache.k[l], m->config().kv_heads, cache.capacity,
                                              m->config().head_dim)
                                       .narrow(1, 0, n)
                                       .contiguous()),
                  1e-5f)
            << "layer " << l;
    }
  }
}

// The mapped runtime attends to a frozen (codec-none) prefix in place: the continuation
// equals the reference too.
TEST_F(ArchModelsTest, DecodeAfterFrozenPrefixMatchesReference) {
  const int64_t n = static_cast<int64_t>(tokens_->size()), first = 6;
  for (const Case& c : *cases_) {
    SCOPED_TRACE(c.name);
    auto m = Load(c, kVariants[0]);
    ASSERT_NE(m, nullptr);
    KvCache cache = m->NewCache(first);
    ASSERT_TRUE(m->Forward(absl::MakeConstSpan(tokens_->data(), first), cache).ok());
    auto frozen = m->FreezeAsPrefix(std::move(cache), n);
    ASSERT_TRUE(frozen.ok()) << frozen.status();
    auto rest = m->Forward(absl::MakeConstSpan(tokens_->data() + first, n - first), *frozen, true);
    ASSERT_TRUE(rest.ok()) << rest.status();
    EXPECT_LT(MaxDiff(*rest, c.logits.narrow(0, first, n - first)), kTolerance);
  }
}

// The GGUF and HF forms of one model hold the same values: same outputs.
TEST_F(ArchModelsTest, GgufAndHfFormsAgree) {
  for (auto [a, b] :
       std::vector<std::pair<const char*, const char*>>{{"llama3_gguf", "llama3_hf"},
                                                        {"qwen2_gguf", "qwen2_hf"},
                                                        {"qwen2_yarn_gguf", "qwen2_yarn_hf"},
                                                        {"mistral_gguf", "mistral_hf"}}) {
    SCOPED_TRACE(std::string(a) + " vs " + b);
    auto ma = Load(Find(a), kVariants[2]), mb = Load(Find(b), kVariants[2]);
    ASSERT_TRUE(ma && mb);
    KvCache ca = ma->NewCache(12), cb = mb->NewCache(12);
    auto la = ma->Forward(*tokens_, ca, true), lb = mb->Forward(*tokens_, cb, true);
    ASSERT_TRUE(la.ok() && lb.ok());
    EXPECT_LT(MaxDiff(*la, testing::T(*lb)), 1e-5f);
    EXPECT_NE(ma->fingerprint(), mb->fingerprint());
  }
}

// Mistral's window is 12 positions: everything up to 12 runs (and matched above); any step
// that would hold a 13th position is refused, in every entry point and both runtimes.
TEST_F(ArchModelsTest, SlidingWindowIsRefusedPastTheWindow) {
  const auto refused = [](const Status& s, const std::string& what) {
    EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << what << ": " << s;
    EXPECT_NE(std::string(s.message()).find("sliding-window attention over 12 positions"),
              std::string::npos)
        << what << ": " << s;
  };
  std::vector<int32_t> long_doc = *tokens_;
  long_doc.push_back(7);  // 13 tokens
  for (const char* name : {"mistral_hf", "mistral_gguf"}) {
    for (const Variant& v : kVariants) {
      SCOPED_TRACE(std::string(name) + " " + v.name);
      auto m = Load(Find(name), v);
      ASSERT_NE(m, nullptr);
      KvCache big = m->NewCache(16);
      refused(m->Forward(long_doc, big).status(), "Forward of 13");
      EXPECT_EQ(big.length, 0);  // nothing was appended
      refused(m->Prefill(long_doc, 4).status(), "Prefill of 13");
      std::vector<int32_t> ppl_doc = long_doc;
      ppl_doc.push_back(3);  // 14 tokens: windows feed up to n - 1 = 13
      auto ppl_ok = m->Perplexity(ppl_doc, /*context=*/12, /*stride=*/6);
      EXPECT_TRUE(ppl_ok.ok()) << ppl_ok.status();
      refused(m->Perplexity(ppl_doc, 13, 13).status(), "Perplexity context 13");

      KvCache cache = m->NewCache(12);
      ASSERT_TRUE(m->Forward(*tokens_, cache).ok());  // exactly the window
      const int32_t one[1] = {7};
      refused(m->Forward(one, cache).status(), "decode of position 13");
      EXPECT_EQ(cache.length, 12);
      SamplingOptions s;
      s.max_new_tokens = 4;
      s.stop_at_eos = false;
      KvCache gen = m->NewCache(12);
      ASSERT_TRUE(m->Forward(absl::MakeConstSpan(tokens_->data(), 10), gen).ok());
      refused(m->Generate(gen, {7}, s).status(), "Generate past the window");
      if (v.weights == WeightStorage::kMapped) {
        KvCache own = m->NewCache(12);
        ASSERT_TRUE(m->Forward(*tokens_, own).ok());
        auto frozen = m->FreezeAsPrefix(std::move(own), 4);
        ASSERT_TRUE(frozen.ok()) << frozen.status();
        refused(m->Forward(one, *frozen).status(), "decode after a 12-token prefix");
      }
    }
  }
}

// The config.json files of real models as published (every field kept; only the dimensions
// shrunk to the tiny weights, ids kept below the tiny vocabulary) load: no field of theirs is
// refused, and each reads as the model means it. Where the weights fit the config exactly,
// the logits equal the reference.
TEST_F(ArchModelsTest, PublishedConfigsLoad) {
  struct Published {
    const char* name;
    const char* weights;    // case whose safetensors are used
    const char* expect_as;  // case whose reference logits must come out, or nullptr
    const char* config;
  };
  const Published kPublished[] = {
      {"Qwen2.5-0.5B-Instruct", "qwen2_hf", "qwen2_hf", R"({
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu",
        "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
        "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2",
        "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
        "tie_word_embeddings": true, "torch_dtype": "bfloat16",
        "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false,
        "vocab_size": 151936})"},
      {"Mistral-7B-v0.1", "mistral_hf", "mistral_hf", R"({
        "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
        "tie_word_embeddings": false, "torch_dtype": "bfloat16",
        "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 32000})"},
      {"Llama-3.1-8B-Instruct", "mistral_hf", nullptr, R"({
        "architectures": ["LlamaForCausalLM"], "attention_bias": false,
        "attention_dropout": 0.0, "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 14336,
        "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
        "transformers_version": "4.42.3", "use_cache": true, "vocab_size": 128256})"},
  };
  for (const Published& p : kPublished) {
    SCOPED_TRACE(p.name);
    json cfg = json::parse(p.config);
    // The tiny weights' dimensions; ids inside their vocabulary.
    cfg["hidden_size"] = 64;
    cfg["intermediate_size"] = 96;
    cfg["num_attention_heads"] = 4;
    cfg["num_key_value_heads"] = 2;
    cfg["num_hidden_layers"] = 2;
    cfg["vocab_size"] = 64;
    cfg["bos_token_id"] = 1;
    cfg["eos_token_id"] = cfg["eos_token_id"].is_array() ? json{2, 3} : json(2);
    const fs::path d = tmp_ / (std::string("published_") + p.name);
    fs::create_directories(d);
    fs::copy_file(fs::path(Find(p.weights).path) / "model.safetensors", d / "model.safetensors",
                  fs::copy_options::overwrite_existing);
    std::ofstream(d / "config.json") << cfg.dump(2);
    for (const Variant& v : kVariants) {
      SCOPED_TRACE(v.name);
      Case c;
      c.name = p.name;
      c.path = d.string();
      auto m = Load(c, v);
      ASSERT_NE(m, nullptr);
      const ModelConfig& mc = m->config();
      EXPECT_EQ(mc.architecture, cfg["model_type"].get<std::string>());
      EXPECT_FLOAT_EQ(mc.rope_theta, cfg["rope_theta"].get<float>());
      EXPECT_EQ(mc.max_positions, cfg["max_position_embeddings"].get<int32_t>());
      EXPECT_EQ(mc.head_dim, 16);
      EXPECT_EQ(mc.eos_id, 2);
      if (mc.architecture == "qwen2") {
        EXPECT_TRUE(mc.qkv_bias);
        EXPECT_EQ(mc.sliding_window, 0);  // use_sliding_window false
      } else if (mc.architecture == "mistral") {
        EXPECT_EQ(mc.sliding_window, 4096);
      } else {
        EXPECT_FALSE(mc.qkv_bias);
        EXPECT_EQ(mc.rope_scaling.type, RopeScalingType::kLlama3);
        EXPECT_DOUBLE_EQ(mc.rope_scaling.factor, 8);
        EXPECT_EQ(mc.rope_scaling.original_max_positions, 8192);
      }
      KvCache cache = m->NewCache(12);
      auto l = m->Forward(*tokens_, cache, /*all_logits=*/true);
      ASSERT_TRUE(l.ok()) << l.status();
      EXPECT_TRUE(torch::isfinite(testing::T(*l)).all().item<bool>());
      if (p.expect_as != nullptr) {
        const float diff = MaxDiff(*l, Find(p.expect_as).logits);
        EXPECT_LT(diff, kTolerance) << "max |logit - reference| = " << diff;
      }
    }
  }
}

}  // namespace
}  // namespace polykv::model
