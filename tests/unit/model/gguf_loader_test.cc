// GGUF loading path on a GGUF built from stories260K in the test: llama.* metadata, ggml
// tensor names and dims order, llama.cpp's Q/K row permutation (undone by the loader) and
// tied vs separate output; outputs must equal the safetensors model. Plus error cases.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gguf_writer.h"
#include "model_test_util.h"
#include "polykv/model/gguf.h"
#include "polykv/model/llama.h"
#include "torch_test_util.h"

namespace polykv::model {
namespace {

using testing::GgufWriter;
using testing::WriteTempFile;

const char* kStories = POLYKV_TEST_DATA_DIR "/models/stories260K";

// llama.cpp convert_hf_to_gguf.py `permute`: HF rotate_half rows -> interleaved pairs.
torch::Tensor PermuteForGguf(const torch::Tensor& w, int64_t n_head) {
  const int64_t rows = w.size(0), in = w.size(1);
  return w.reshape({n_head, 2, rows / n_head / 2, in})
      .transpose(1, 2)
      .reshape({rows, in})
      .contiguous();
}

std::string Bytes(const torch::Tensor& t) {
  torch::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
}

struct Options {
  std::string arch = "llama";
  bool separate_output = false;
  bool f16_ffn = false;      // store the FFN matrices as F16 (ggml type 1)
  std::string drop_tensor;   // leave one tensor out
  std::string extra_key;     // add a u32 metadata key with value 4096
  std::string rope_scaling;  // llama.rope.scaling.type
  std::string extra_tensor;  // add a [64] F32 tensor of this name
};

// Builds a GGUF of stories260K from its safetensors weights, read back through the model's
// own safetensors path is not public: read the file directly here.
std::string BuildStoriesGguf(const Options& o) {
  // Pull the weights out of the reference model via a forward-free route: the safetensors
  // file parsed with torch (F32, little-endian, header as documented).
  std::FILE* f = std::fopen((std::string(kStories) + "/model.safetensors").c_str(), "rb");
  EXPECT_NE(f, nullptr);
  std::string raw;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) raw.append(buf, n);
  std::fclose(f);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | static_cast<uint8_t>(raw[i]);
  const std::string header = raw.substr(8, hlen);
  const char* data = raw.data() + 8 + hlen;
  // Minimal header lookup: find "name":{..."data_offsets":[a,b]}.
  const auto get = [&](const std::string& name, std::vector<int64_t> shape) {
    const size_t at = header.find("\"" + name + "\"");
    EXPECT_NE(at, std::string::npos) << name;
    const size_t off = header.find("\"data_offsets\"", at);
    const size_t lb = header.find('[', off);
    const uint64_t a = std::stoull(header.substr(lb + 1));
    return torch::from_blob(const_cast<char*>(data) + a, shape, torch::kFloat32).clone();
  };
  GgufWriter w;
  w.AddString("general.architecture", o.arch);
  w.AddU32(o.arch + ".block_count", 5);
  w.AddU32(o.arch + ".embedding_length", 64);
  w.AddU32(o.arch + ".attention.head_count", 8);
  w.AddU32(o.arch + ".attention.head_count_kv", 4);
  w.AddU32(o.arch + ".feed_forward_length", 172);
  w.AddU32(o.arch + ".context_length", 512);
  w.AddU32(o.arch + ".rope.dimension_count", 8);
  w.AddF32(o.arch + ".rope.freq_base", 10000.f);
  w.AddF32(o.arch + ".attention.layer_norm_rms_epsilon", 1e-5f);
  w.AddU32("tokenizer.ggml.bos_token_id", 1);
  w.AddU32("tokenizer.ggml.eos_token_id", 2);
  if (!o.extra_key.empty()) w.AddU32(o.extra_key, 4096);
  if (!o.rope_scaling.empty()) w.AddString("llama.rope.scaling.type", o.rope_scaling);
  const auto add = [&](const std::string& name, const torch::Tensor& t, bool f16 = false) {
    if (name == o.drop_tensor) return;
    std::vector<uint64_t> dims(t.sizes().rbegin(), t.sizes().rend());  // ggml order
    if (f16)
      w.AddTensor(name, dims, /*F16=*/1, Bytes(t.to(torch::kFloat16)));
    else
      w.AddTensor(name, dims, /*F32=*/0, Bytes(t));
  };
  torch::Tensor embed = get("model.embed_tokens.weight", {512, 64});
  add("token_embd.weight", embed);
  for (int l = 0; l < 5; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".",
                      b = "blk." + std::to_string(l) + ".";
    add(b + "attn_norm.weight", get(p + "input_layernorm.weight", {64}));
    add(b + "attn_q.weight", PermuteForGguf(get(p + "self_attn.q_proj.weight", {64, 64}), 8));
    add(b + "attn_k.weight", PermuteForGguf(get(p + "self_attn.k_proj.weight", {32, 64}), 4));
    add(b + "attn_v.weight", get(p + "self_attn.v_proj.weight", {32, 64}));
    add(b + "attn_output.weight", get(p + "self_attn.o_proj.weight", {64, 64}));
    add(b + "ffn_norm.weight", get(p + "post_attention_layernorm.weight", {64}));
    add(b + "ffn_gate.weight", get(p + "mlp.gate_proj.weight", {172, 64}), o.f16_ffn);
    add(b + "ffn_up.weight", get(p + "mlp.up_proj.weight", {172, 64}), o.f16_ffn);
    add(b + "ffn_down.weight", get(p + "mlp.down_proj.weight", {64, 172}), o.f16_ffn);
  }
  add("output_norm.weight", get("model.norm.weight", {64}));
  if (o.separate_output) add("output.weight", embed);
  if (!o.extra_tensor.empty()) add(o.extra_tensor, torch::ones({64}));
  return w.Build();
}

torch::Tensor Logits(LlamaModel& m) {
  const std::vector<int32_t> ids = {1, 461, 461, 401, 401, 401, 461, 378};
  KvCache c = m.NewCache(8);
  auto r = m.Forward(ids, c, true);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? testing::T(*r) : torch::zeros({1});
}

class GgufLoaderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = LlamaModel::Load(kStories);
    ASSERT_TRUE(m.ok()) << m.status();
    ref_ = new torch::Tensor(Logits(**m));
  }
  static void TearDownTestSuite() { delete ref_; }
  static StatusOr<std::unique_ptr<LlamaModel>> LoadGguf(const Options& o, const std::string& name) {
    return LlamaModel::Load(WriteTempFile(name, BuildStoriesGguf(o)));
  }
  static torch::Tensor* ref_;
};
torch::Tensor* GgufLoaderTest::ref_ = nullptr;

TEST_F(GgufLoaderTest, TiedF32MatchesSafetensors) {
  auto m = LoadGguf({}, "stories_tied.gguf");
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& c = (*m)->config();
  // layers, hidden, heads, kv_heads, head_dim, ffn, vocab, bos, eos (-1: not checked)
  testing::ExpectDims(c, {5, -1, 8, 4, 8, -1, 512, 1, 2});
  EXPECT_EQ(c.max_positions, 512);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ((*m)->tokenizer(), nullptr);  // no tokenizer.ggml.model in this file
  EXPECT_LT((Logits(**m) - *ref_).abs().max().item<float>(), 1e-5f);
  // Reference greedy ids through the GGUF path.
  KvCache cache = (*m)->NewCache(4);
  SamplingOptions s;
  s.max_new_tokens = 10;
  s.stop_at_eos = false;
  auto g = (*m)->Generate(cache, {1}, s);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->tokens, (std::vector<int32_t>{461, 461, 401, 401, 401, 461, 378, 455, 473, 456}));
}

TEST_F(GgufLoaderTest, SeparateOutputAndF16Tensors) {
  Options o;
  o.separate_output = true;
  auto m = LoadGguf(o, "stories_untied.gguf");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE((*m)->config().tied_embeddings);
  EXPECT_LT((Logits(**m) - *ref_).abs().max().item<float>(), 1e-5f);
  o.f16_ffn = true;
  auto h = LoadGguf(o, "stories_f16.gguf");
  ASSERT_TRUE(h.ok()) << h.status();
  torch::Tensor l = Logits(**h);
  EXPECT_LT((l - *ref_).abs().max().item<float>(), 0.05f);
  EXPECT_TRUE(torch::equal(l.argmax(-1), ref_->argmax(-1)));
  EXPECT_NE((*h)->fingerprint(), (*m)->fingerprint());
}

TEST_F(GgufLoaderTest, Errors) {
  Options o;
  o.arch = "gpt2";
  auto a = LoadGguf(o, "stories_gpt2.gguf");
  EXPECT_EQ(a.status().code(), absl::StatusCode::kUnimplemented) << a.status();
  EXPECT_NE(std::string(a.status().message()).find("general.architecture 'gpt2'"),
            std::string::npos);

  o = {};
  o.drop_tensor = "blk.2.ffn_up.weight";
  auto b = LoadGguf(o, "stories_missing.gguf");
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(b.status().message()).find("missing tensor 'blk.2.ffn_up.weight'"),
            std::string::npos)
      << b.status();

  // A sliding window loads; sequences longer than it are refused (tests/unit/model/
  // arch_models_test.cc checks every entry point on a Mistral model).
  o = {};
  o.extra_key = "llama.attention.sliding_window";
  auto c = LoadGguf(o, "stories_swa.gguf");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->config().sliding_window, 4096);
  auto long_prefill = (*c)->Prefill(std::vector<int32_t>(4097, 1), 512);
  EXPECT_EQ(long_prefill.status().code(), absl::StatusCode::kOutOfRange) << long_prefill.status();
  EXPECT_NE(std::string(long_prefill.status().message()).find("sliding-window"), std::string::npos);

  o = {};
  o.rope_scaling = "longrope";
  auto d = LoadGguf(o, "stories_longrope.gguf");
  EXPECT_EQ(d.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(std::string(d.status().message()).find("'longrope'"), std::string::npos);

  // Every other metadata key and every unused tensor is refused by name.
  for (const auto& [k, needle] : std::vector<std::pair<std::string, std::string>>{
           {"llama.attention.scale", "unsupported metadata 'llama.attention.scale'"},
           {"llama.logit_scale", "unsupported metadata 'llama.logit_scale'"},
           {"llama.expert_count", "mixture of experts"},
           {"llama.attention.value_length", "different key and value head sizes"},
           {"llama.rope.scaling.yarn_beta_fast", "a YaRN parameter"},
           {"qwen2.block_count", "outside the namespaces"},
           {"split.count", "split over several GGUF files"}}) {
    o = {};
    o.extra_key = k;
    auto r = LoadGguf(o, "stories_extra_key.gguf");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << k << ": " << r.status();
    EXPECT_NE(std::string(r.status().message()).find(needle), std::string::npos) << r.status();
  }
  for (const WeightStorage ws : {WeightStorage::kMapped, WeightStorage::kCopy}) {
    o = {};
    o.extra_tensor = "blk.0.attn_q_norm.weight";  // Qwen3-style QK-norm
    LoadOptions lo;
    lo.weights = ws;
    auto r = testing::LoadRuntime(WriteTempFile("stories_qnorm.gguf", BuildStoriesGguf(o)), lo);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << r.status();
    EXPECT_NE(
        std::string(r.status().message()).find("unsupported tensor 'blk.0.attn_q_norm.weight'"),
        std::string::npos)
        << r.status();
  }
  // Biases come in q/k/v threes: a lone k bias is unused, and refused.
  o = {};
  o.extra_tensor = "blk.0.attn_k.bias";
  auto lone = LoadGguf(o, "stories_kbias.gguf");
  EXPECT_EQ(lone.status().code(), absl::StatusCode::kUnimplemented) << lone.status();

  o = {};
  o.drop_tensor = "token_embd.weight";
  auto e = LoadGguf(o, "stories_noembd.gguf");
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(e.status().message()).find("token_embd.weight"), std::string::npos);

  auto trunc =
      LlamaModel::Load(WriteTempFile("stories_trunc.gguf", BuildStoriesGguf({}).substr(0, 300)));
  EXPECT_FALSE(trunc.ok());
}

}  // namespace
}  // namespace polykv::model
