// LlamaModel::Load on crafted inputs: malformed safetensors, config.json errors and
// unsupported architecture fields each give a clear error; F16 and sharded checkpoints load.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "polykv/model/llama.h"
#include "support/files.h"
#include "torch_test_util.h"

namespace polykv::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kStories = POLYKV_TEST_DATA_DIR "/models/stories260K";

using support::ReadFile;
// Writes a new file and renames it over `p` (support::ReplaceFile), as model files must be
// replaced: a model loaded earlier keeps its mapping of the old file (rewriting a mapped file in
// place would change the weights under it). A failure fails the test.
void WriteFile(const std::string& p, const std::string& bytes) {
  EXPECT_TRUE(support::ReplaceFile(p, bytes).ok()) << p;
}
std::string U64Le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}
std::string Safetensors(const json& header, const std::string& data) {
  const std::string h = header.dump();
  return U64Le(h.size()) + h + data;
}

// The stories260K checkpoint split into header JSON and data bytes.
struct Checkpoint {
  json header;
  std::string data;
};
Checkpoint LoadStories() {
  const std::string raw = ReadFile(kStories + "/model.safetensors");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(raw[i]);
  return {json::parse(raw.substr(8, n)), raw.substr(8 + n)};
}

class LoaderErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    config_ = json::parse(ReadFile(kStories + "/config.json"));
  }

  // Writes config_ and `st` as model.safetensors, loads, returns the status.
  absl::Status LoadWith(const std::string& st) {
    WriteFile((dir_ / "config.json").string(), config_.dump());
    WriteFile((dir_ / "model.safetensors").string(), st);
    auto m = LlamaModel::Load(dir_.string());
    return m.status();
  }
  absl::Status LoadWithRealWeights() {
    fs::copy_file(kStories + "/model.safetensors", dir_ / "model.safetensors",
                  fs::copy_options::overwrite_existing);
    WriteFile((dir_ / "config.json").string(), config_.dump());
    return LlamaModel::Load(dir_.string()).status();
  }
  static void ExpectError(const absl::Status& s, absl::StatusCode code, const std::string& needle) {
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_NE(std::string(s.message()).find(needle), std::string::npos)
        << "message '" << s.message() << "' lacks '" << needle << "'";
  }
  support::TempDir tmp_{"polykv-model-test-"};  // removed after each test, pass or fail
  fs::path dir_ = tmp_.path();
  json config_;
};

TEST_F(LoaderErrorsTest, MissingPaths) {
  ExpectError(LlamaModel::Load((dir_ / "nope").string()).status(), absl::StatusCode::kNotFound,
              "no such file");
  ExpectError(LlamaModel::Load(dir_.string()).status(), absl::StatusCode::kNotFound, "config.json");
  WriteFile((dir_ / "config.json").string(), config_.dump());
  ExpectError(LlamaModel::Load(dir_.string()).status(), absl::StatusCode::kNotFound,
              "model.safetensors");
  WriteFile((dir_ / "weights.bin").string(), "garbage");
  ExpectError(LlamaModel::Load((dir_ / "weights.bin").string()).status(),
              absl::StatusCode::kInvalidArgument, "not a model");
}

TEST_F(LoaderErrorsTest, TruncatedHeaderLength) {
  ExpectError(LoadWith("abcd"), absl::StatusCode::kInvalidArgument, "8-byte header length");
}

TEST_F(LoaderErrorsTest, HeaderLengthBeyondFile) {
  ExpectError(LoadWith(U64Le(1000) + "{}"), absl::StatusCode::kInvalidArgument,
              "exceeds the file size");
  ExpectError(LoadWith(U64Le(~0ull) + "{}"), absl::StatusCode::kInvalidArgument,
              "exceeds the file size");
}

TEST_F(LoaderErrorsTest, HeaderNotJson) {
  ExpectError(LoadWith(U64Le(5) + "{abc}"), absl::StatusCode::kInvalidArgument, "not valid JSON");
  ExpectError(LoadWith(U64Le(2) + "[]"), absl::StatusCode::kInvalidArgument, "not a JSON object");
}

TEST_F(LoaderErrorsTest, OffsetsOutsideFile) {
  json h = {{"x", {{"dtype", "F32"}, {"shape", {250}}, {"data_offsets", {0, 1000}}}}};
  ExpectError(LoadWith(Safetensors(h, std::string(16, '\0'))), absl::StatusCode::kInvalidArgument,
              "outside the data section");
  json rev = {{"x", {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {8, 4}}}}};
  ExpectError(LoadWith(Safetensors(rev, std::string(16, '\0'))), absl::StatusCode::kInvalidArgument,
              "begin 8 > end 4");
  json neg = {{"x", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {-4, 0}}}}};
  ExpectError(LoadWith(Safetensors(neg, std::string(16, '\0'))), absl::StatusCode::kInvalidArgument,
              "non-negative");
}

TEST_F(LoaderErrorsTest, UnknownDtype) {
  json h = {{"x", {{"dtype", "F33"}, {"shape", {4}}, {"data_offsets", {0, 16}}}}};
  ExpectError(LoadWith(Safetensors(h, std::string(16, '\0'))), absl::StatusCode::kInvalidArgument,
              "unknown dtype 'F33'");
}

TEST_F(LoaderErrorsTest, ShapeTimesDtypeDiffersFromBytes) {
  json h = {{"x", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 8}}}}};
  ExpectError(LoadWith(Safetensors(h, std::string(16, '\0'))), absl::StatusCode::kInvalidArgument,
              "shape x dtype size = 16 bytes but data_offsets span 8");
  json ovf = {
      {"x", {{"dtype", "F32"}, {"shape", {1ll << 40, 1ll << 40}}, {"data_offsets", {0, 8}}}}};
  ExpectError(LoadWith(Safetensors(ovf, std::string(16, '\0'))), absl::StatusCode::kInvalidArgument,
              "overflows");
}

TEST_F(LoaderErrorsTest, MissingTensorIsNamed) {
  Checkpoint ck = LoadStories();
  ck.header.erase("model.layers.3.mlp.up_proj.weight");
  ExpectError(LoadWith(Safetensors(ck.header, ck.data)), absl::StatusCode::kInvalidArgument,
              "missing tensor 'model.layers.3.mlp.up_proj.weight'");
}

TEST_F(LoaderErrorsTest, WrongShapeIsNamed) {
  Checkpoint ck = LoadStories();
  ck.header["model.layers.1.mlp.gate_proj.weight"]["shape"] = {64, 172};
  ExpectError(
      LoadWith(Safetensors(ck.header, ck.data)), absl::StatusCode::kInvalidArgument,
      "tensor 'model.layers.1.mlp.gate_proj.weight' has shape [64, 172], expected [172, 64]");
}

TEST_F(LoaderErrorsTest, UnsupportedTensorDtype) {
  Checkpoint ck = LoadStories();
  ck.header["model.norm.weight"]["dtype"] = "I32";  // same size as F32
  ExpectError(LoadWith(Safetensors(ck.header, ck.data)), absl::StatusCode::kUnimplemented,
              "'model.norm.weight' has dtype I32");
}

TEST_F(LoaderErrorsTest, ConfigNotJsonOrMissingFields) {
  WriteFile((dir_ / "config.json").string(), "{ not json");
  fs::copy_file(kStories + "/model.safetensors", dir_ / "model.safetensors");
  ExpectError(LlamaModel::Load(dir_.string()).status(), absl::StatusCode::kInvalidArgument,
              "not valid JSON");
  config_.erase("hidden_size");
  ExpectError(LoadWithRealWeights(), absl::StatusCode::kInvalidArgument,
              "missing required field 'hidden_size'");
  config_ = json::parse(ReadFile(kStories + "/config.json"));
  config_["num_hidden_layers"] = "five";
  ExpectError(LoadWithRealWeights(), absl::StatusCode::kInvalidArgument,
              "field 'num_hidden_layers' must be a 32-bit integer");
  config_ = json::parse(ReadFile(kStories + "/config.json"));
  config_["num_key_value_heads"] = 3;
  ExpectError(LoadWithRealWeights(), absl::StatusCode::kInvalidArgument,
              "KV head count 3 must be > 0 and divide the head count 8");
  config_ = json::parse(ReadFile(kStories + "/config.json"));
  config_["rms_norm_eps"] = -1;
  ExpectError(LoadWithRealWeights(), absl::StatusCode::kInvalidArgument, "epsilon");
  config_ = json::parse(ReadFile(kStories + "/config.json"));
  config_["vocab_size"] = 513;  // embed_tokens no longer matches
  ExpectError(LoadWithRealWeights(), absl::StatusCode::kInvalidArgument,
              "'model.embed_tokens.weight' has shape [512, 64], expected [513, 64]");
}

TEST_F(LoaderErrorsTest, UnsupportedArchitectureFields) {
  const json base = config_;
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"model_type", "gpt2"}}, "'model_type': 'gpt2'"},
      {{{"sliding_window", 4096}}, "'sliding_window'"},  // not a LlamaConfig field
      {{{"mlp_bias", true}}, "'mlp_bias'"},
      {{{"hidden_act", "gelu"}}, "'hidden_act'"},
      {{{"rope_scaling", {{"rope_type", "dynamic"}, {"factor", 8.0}}}}, "type 'dynamic'"},
      {{{"rope_scaling", {{"rope_type", "longrope"}, {"factor", 8.0}}}}, "type 'longrope'"},
      {{{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}, {"short_factor", {1.0}}}}},
       "'rope_scaling.short_factor' for rope type 'yarn'"},
      {{{"partial_rotary_factor", 0.5}}, "partial RoPE"},
      {{{"quantization_config", {{"bits", 4}}}}, "'quantization_config'"},
      {{{"auto_map", {{"AutoModelForCausalLM", "modeling_x.X"}}}}, "'auto_map'"},
      {{{"some_new_knob", 3}}, "unsupported field 'some_new_knob'"},
      {{{"logit_scale", 0.5}}, "unsupported field 'logit_scale'"},
      {{{"model_type", "qwen2"}, {"attention_bias", true}}, "unsupported field 'attention_bias'"},
      {{{"model_type", "mistral"}, {"mlp_bias", false}}, "unsupported field 'mlp_bias'"},
      {{{"architectures", {"LlamaForSequenceClassification"}}}, "LlamaForSequenceClassification"},
  };
  for (const auto& [patch, needle] : cases) {
    config_ = base;
    config_.merge_patch(patch);
    ExpectError(LoadWithRealWeights(), absl::StatusCode::kUnimplemented, needle);
  }
  // Present but incomplete or unmatched by the weights: kInvalidArgument naming what lacks.
  for (const auto& [patch, needle] : std::vector<std::pair<json, std::string>>{
           {{{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}}}, "'low_freq_factor'"},
           {{{"rope_scaling", {{"rope_type", "yarn"}}}}, "'factor'"},
           {{{"attention_bias", true}}, "missing tensor 'model.layers.0.self_attn.q_proj.bias'"},
           {{{"model_type", "qwen2"}}, "missing tensor 'model.layers.0.self_attn.q_proj.bias'"}}) {
    config_ = base;
    config_.merge_patch(patch);
    ExpectError(LoadWithRealWeights(), absl::StatusCode::kInvalidArgument, needle);
  }
  // Accepted: mistral without sliding window, null rope_scaling, inert fields, transformers
  // v5's rope_parameters.
  for (const json& patch :
       {json{{"model_type", "mistral"}, {"sliding_window", nullptr}},
        json{{"rope_scaling", nullptr}},
        json{{"use_cache", false},
             {"pretraining_tp", 1},
             {"transformers_version", "4.46.0"},
             {"pad_token_id", 0},
             {"attention_dropout", 0.0},
             {"attention_bias", false}},
        json{{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}}}) {
    config_ = base;
    config_.merge_patch(patch);
    config_.update(patch);  // merge_patch drops nulls; keep them explicitly
    EXPECT_TRUE(LoadWithRealWeights().ok()) << patch.dump();
  }
  // Mistral's window defaults to 4096 (MistralConfig) when config.json does not say.
  config_ = base;
  config_["model_type"] = "mistral";
  ASSERT_TRUE(LoadWithRealWeights().ok());
  auto m = LlamaModel::Load(dir_.string());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->config().sliding_window, 4096);
}

TEST_F(LoaderErrorsTest, UnusedTensorsAreRefused) {
  for (const std::string name : {"model.layers.0.self_attn.q_norm.weight",
                                 "model.layers.1.mlp.up_proj.bias", "lm_head.weight"}) {
    Checkpoint ck = LoadStories();
    // Reuse model.norm.weight's bytes ([64] f32) under the extra name.
    json e = ck.header["model.norm.weight"];
    if (name == "lm_head.weight") e = ck.header["model.embed_tokens.weight"];
    ck.header[name] = e;
    const absl::Status s = LoadWith(Safetensors(ck.header, ck.data));
    if (name == "lm_head.weight") {  // tied: HF ties lm_head to the embedding on load
      EXPECT_TRUE(s.ok()) << s;
      continue;
    }
    ExpectError(s, absl::StatusCode::kUnimplemented, "unsupported tensor '" + name + "'");
  }
  // Old checkpoints' RoPE buffer is not a weight.
  Checkpoint ck = LoadStories();
  ck.header["model.layers.0.self_attn.rotary_emb.inv_freq"] = ck.header["model.norm.weight"];
  EXPECT_TRUE(LoadWith(Safetensors(ck.header, ck.data)).ok());
}

TEST_F(LoaderErrorsTest, LinearRopeScalingChangesOutputs) {
  config_["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  ASSERT_TRUE(LoadWithRealWeights().ok());
  auto scaled = LlamaModel::Load(dir_.string());
  auto plain = LlamaModel::Load(kStories);
  ASSERT_TRUE(scaled.ok() && plain.ok());
  EXPECT_FLOAT_EQ((*scaled)->config().rope_linear_scale, 2.0f);
  const std::vector<int32_t> ids = {1, 461, 461, 401};
  KvCache a = (*scaled)->NewCache(4), b = (*plain)->NewCache(4);
  auto la = (*scaled)->Forward(ids, a), lb = (*plain)->Forward(ids, b);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_GT((testing::T(*la) - testing::T(*lb)).abs().max().item<float>(), 1e-3f);
  EXPECT_NE((*scaled)->fingerprint(), (*plain)->fingerprint());  // config is hashed too
}

// F16 / BF16 copies of the checkpoint must give exactly the logits of an F32 checkpoint
// holding the same rounded values (the half -> f32 conversion is exact).
TEST_F(LoaderErrorsTest, F16AndBf16CheckpointsLoad) {
  auto ref = LlamaModel::Load(kStories);
  ASSERT_TRUE(ref.ok());
  const std::vector<int32_t> ids = {1, 461, 461, 401, 401, 401};
  const auto logits = [&](LlamaModel& m) {
    KvCache c = m.NewCache(8);
    auto l = m.Forward(ids, c, true);
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? testing::T(*l) : torch::zeros({1});
  };
  const torch::Tensor rl = logits(**ref);
  for (auto [name, st] : std::vector<std::pair<std::string, torch::ScalarType>>{
           {"F16", torch::kFloat16}, {"BF16", torch::kBFloat16}}) {
    Checkpoint ck = LoadStories();
    json h, h32;
    std::string data, data32;
    for (auto it = ck.header.begin(); it != ck.header.end(); ++it) {
      if (it.key() == "__metadata__") continue;
      const auto& e = it.value();
      const uint64_t b = e["data_offsets"][0], end = e["data_offsets"][1];
      std::vector<int64_t> shape = e["shape"].get<std::vector<int64_t>>();
      torch::Tensor f = torch::from_blob(ck.data.data() + b, {static_cast<int64_t>((end - b) / 4)},
                                         torch::kFloat32)
                            .to(st);
      torch::Tensor r = f.to(torch::kFloat32);
      size_t off = data.size();
      data.append(static_cast<const char*>(f.data_ptr()), f.numel() * 2);
      h[it.key()] = {{"dtype", name}, {"shape", shape}, {"data_offsets", {off, data.size()}}};
      off = data32.size();
      data32.append(static_cast<const char*>(r.data_ptr()), r.numel() * 4);
      h32[it.key()] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {off, data32.size()}}};
    }
    ASSERT_TRUE(LoadWith(Safetensors(h, data)).ok()) << name;
    auto half = LlamaModel::Load(dir_.string());
    ASSERT_TRUE(LoadWith(Safetensors(h32, data32)).ok()) << name;
    auto rounded = LlamaModel::Load(dir_.string());
    ASSERT_TRUE(half.ok() && rounded.ok());
    const torch::Tensor lh = logits(**half);
    EXPECT_LT((lh - logits(**rounded)).abs().max().item<float>(), 1e-5f) << name;
    EXPECT_GT((lh - rl).abs().max().item<float>(), 0.f) << name << ": rounding had no effect?";
    if (st == torch::kFloat16) {
      EXPECT_TRUE(torch::equal(lh.argmax(-1), rl.argmax(-1)));
    }
  }
}

TEST_F(LoaderErrorsTest, ShardedCheckpointEqualsSingleFile) {
  Checkpoint ck = LoadStories();
  json h1, h2, index = {{"metadata", json::object()}, {"weight_map", json::object()}};
  std::string d1, d2;
  int i = 0;
  for (auto it = ck.header.begin(); it != ck.header.end(); ++it, ++i) {
    if (it.key() == "__metadata__") continue;
    const uint64_t b = it.value()["data_offsets"][0], e = it.value()["data_offsets"][1];
    json& h = (i % 2) ? h1 : h2;
    std::string& d = (i % 2) ? d1 : d2;
    const size_t off = d.size();
    d += ck.data.substr(b, e - b);
    h[it.key()] = {
        {"dtype", "F32"}, {"shape", it.value()["shape"]}, {"data_offsets", {off, d.size()}}};
    index["weight_map"][it.key()] =
        (i % 2) ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  WriteFile((dir_ / "model-00001-of-00002.safetensors").string(), Safetensors(h1, d1));
  WriteFile((dir_ / "model-00002-of-00002.safetensors").string(), Safetensors(h2, d2));
  WriteFile((dir_ / "model.safetensors.index.json").string(), index.dump());
  WriteFile((dir_ / "config.json").string(), config_.dump());
  auto sharded = LlamaModel::Load(dir_.string());
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  auto ref = LlamaModel::Load(kStories);
  ASSERT_TRUE(ref.ok());
  const std::vector<int32_t> ids = {1, 461, 461, 401};
  KvCache a = (*sharded)->NewCache(4), b = (*ref)->NewCache(4);
  auto la = (*sharded)->Forward(ids, a, true), lb = (*ref)->Forward(ids, b, true);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_EQ(la->values, lb->values);
  // A shard that names a missing tensor file.
  index["weight_map"]["model.norm.weight"] = "../escape.safetensors";
  WriteFile((dir_ / "model.safetensors.index.json").string(), index.dump());
  EXPECT_EQ(LlamaModel::Load(dir_.string()).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace polykv::model
