// Tokenizer loading from tokenizer.json, tokenizer.model and crafted GGUF vocabularies,
// including the errors for unsupported or inconsistent tokenizers.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "gguf_writer.h"
#include "polykv/model/gguf.h"
#include "polykv/model/tokenizer.h"
#include "spm_train_helper.h"
#include "support/files.h"
#include "tokenizer_test_util.h"

namespace polykv::model {
namespace {

using nlohmann::json;
using support::ReadFile;
using testing::DataPath;
using testing::GgufWriter;
using testing::WriteTempFile;

void WriteFile(const std::string& path, const std::string& s) {
  ASSERT_TRUE(support::WriteFile(path, s).ok()) << path;
}

std::string MakeTempDir(const std::string& name) {
  std::string dir = ::testing::TempDir();
  if (!dir.empty() && dir.back() != '/') dir += '/';
  dir += "polykv_" + std::to_string(::getpid()) + "_" + name;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

// Writes tokenizer.json (+ tokenizer_config.json) with the gpt-2 GGUF vocabulary and the
// given pre_tokenizer into a fresh folder; returns the folder.
std::string WriteGpt2Json(const std::string& name, const json& pre_tokenizer) {
  auto g = GgufFile::Open(DataPath("tokenizer/ggml-vocab-gpt-2.gguf"));
  EXPECT_TRUE(g.ok());
  auto tokens = *(*g)->GetStringArray("tokenizer.ggml.tokens");
  auto merges = *(*g)->GetStringArray("tokenizer.ggml.merges");
  json vocab = json::object();
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] != "<|endoftext|>") vocab[tokens[i]] = i;
  }
  json j = {{"version", "1.0"},
            {"added_tokens",
             json::array({{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}})},
            {"normalizer", nullptr},
            {"pre_tokenizer", pre_tokenizer},
            {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
  std::string dir = MakeTempDir(name);
  WriteFile(dir + "/tokenizer.json", j.dump());
  WriteFile(dir + "/tokenizer_config.json",
            json({{"bos_token", "<|endoftext|>"}, {"eos_token", "<|endoftext|>"}}).dump());
  return dir;
}

json ByteLevel() {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
}

TEST(TokenizerJsonTest, ByteLevelMatchesGgufOnAllVectors) {
  std::string dir = WriteGpt2Json("json_bl", ByteLevel());
  auto from_json = LoadTokenizer(dir);  // folder
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  auto from_gguf = LoadTokenizer(DataPath("tokenizer/ggml-vocab-gpt-2.gguf"));
  ASSERT_TRUE(from_gguf.ok());
  EXPECT_EQ((*from_json)->vocab_size(), 50257);
  EXPECT_EQ((*from_json)->family(), "bpe/gpt-2");
  EXPECT_EQ((*from_gguf)->family(), "bpe/gpt-2");
  EXPECT_EQ((*from_json)->Fingerprint(), (*from_gguf)->Fingerprint());
  EXPECT_EQ((*from_json)->eos_id(), 50256);
  EXPECT_EQ((*from_json)->bos_id(), 50256);
  // Every test string, and the expected ids of the .out file.
  std::string inp = ReadFile(DataPath("tokenizer/ggml-vocab-gpt-2.gguf.inp"));
  std::stringstream out(ReadFile(DataPath("tokenizer/ggml-vocab-gpt-2.gguf.out")));
  const std::string sep = "\n__ggml_vocab_test__\n";
  size_t pos = 0, n = 0;
  std::string line;
  for (size_t next; (next = inp.find(sep, pos)) != std::string::npos; pos = next + sep.size()) {
    std::string text = inp.substr(pos, next - pos);
    ASSERT_TRUE(std::getline(out, line));
    auto ids = (*from_json)->Encode(text, false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    std::string got;
    for (int32_t id : *ids) got += " " + std::to_string(id);
    EXPECT_EQ(got, line) << "tokenizer.json mismatch for '" << text << "'";
    EXPECT_EQ(*(*from_json)->Encode(text, false), *(*from_gguf)->Encode(text, false));
    ++n;
  }
  EXPECT_EQ(n, 46u);
  // Explicit file path works as well.
  EXPECT_TRUE(LoadTokenizer(dir + "/tokenizer.json").ok());
}

TEST(TokenizerJsonTest, DigitsSequenceIsSmolLmStyle) {
  json seq = {{"type", "Sequence"},
              {"pretokenizers",
               json::array({{{"type", "Digits"}, {"individual_digits", true}}, ByteLevel()})}};
  auto t = LoadTokenizer(WriteGpt2Json("json_digits", seq));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->family(), "bpe/smollm");
  // "2024" -> four single-digit tokens (gpt-2 ids of '2','0','2','4').
  EXPECT_EQ(*(*t)->Encode("2024", false), (std::vector<int32_t>{17, 15, 17, 19}));
  auto plain = LoadTokenizer(DataPath("tokenizer/ggml-vocab-gpt-2.gguf"));
  EXPECT_EQ(*(*plain)->Encode("2024", false), (std::vector<int32_t>{1238, 1731}));
}

TEST(TokenizerJsonTest, UnsupportedPreTokenizerAndModel) {
  auto t = LoadTokenizer(WriteGpt2Json("json_ws", json{{"type", "Whitespace"}}));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(t.status().message().find("Whitespace"), std::string::npos) << t.status();

  std::string dir = MakeTempDir("json_bad");
  WriteFile(dir + "/tokenizer.json", R"({"model": {"type": "Unigram", "vocab": []}})");
  t = LoadTokenizer(dir + "/tokenizer.json");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(t.status().message().find("Unigram"), std::string::npos) << t.status();
  // Found by fuzz_tokenizer_json: an added token id too large for an integer was converted
  // from a double (undefined behaviour); it is refused.
  WriteFile(dir + "/tokenizer.json",
            R"({"added_tokens": [{"id": 26222222222222222222222222222, "content": "x"}],)"
            R"( "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false},)"
            R"( "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
  t = LoadTokenizer(dir + "/tokenizer.json");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
  EXPECT_NE(std::string(t.status().message()).find("is not an integer id"), std::string::npos)
      << t.status();
  WriteFile(dir + "/tokenizer.json",
            R"({"added_tokens": [{"id": 1.5, "content": "x"}],)"
            R"( "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false},)"
            R"( "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
  EXPECT_EQ(LoadTokenizer(dir + "/tokenizer.json").status().code(),
            absl::StatusCode::kInvalidArgument);
  WriteFile(dir + "/tokenizer.json", "{not json");
  EXPECT_EQ(LoadTokenizer(dir + "/tokenizer.json").status().code(),
            absl::StatusCode::kInvalidArgument);
  WriteFile(dir + "/tokenizer.json",
            R"({"model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []},
                "pre_tokenizer": {"type": "ByteLevel"}})");
  EXPECT_EQ(LoadTokenizer(dir + "/tokenizer.json").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerLoadTest, MissingPaths) {
  EXPECT_EQ(LoadTokenizer("/nonexistent/polykv/tok.gguf").status().code(),
            absl::StatusCode::kNotFound);
  std::string empty = MakeTempDir("empty_dir");
  EXPECT_EQ(LoadTokenizer(empty).status().code(), absl::StatusCode::kNotFound);
}

TEST(TokenizerSentencePieceTest, TrainedModelRoundTrips) {
  std::string wiki = ReadFile(std::string(POLYKV_SOURCE_DIR) + "/data/wikitext-2/wiki.test.raw");
  ASSERT_GT(wiki.size(), 100000u);
  std::string dir = MakeTempDir("spm");
  WriteFile(dir + "/corpus.txt", wiki.substr(0, 100000));
  std::string err;
  ASSERT_TRUE(testing::TrainSentencePiece(dir + "/corpus.txt", dir + "/tokenizer", 400, &err))
      << err;
  auto t = LoadTokenizer(dir);  // finds tokenizer.model
  ASSERT_TRUE(t.ok()) << t.status();
  const Tokenizer& tok = **t;
  EXPECT_EQ(tok.vocab_size(), 400);
  EXPECT_EQ(tok.family(), "spm");
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_TRUE(tok.adds_bos());
  EXPECT_TRUE(tok.IsEndOfGeneration(2));
  EXPECT_EQ(tok.Fingerprint().size(), 64u);
  for (const std::string& text : {std::string("The game 's story takes place in 1935 ."),
                                  std::string("Grüße, 日本 🦙"), wiki.substr(0, 5000)}) {
    auto ids = tok.Encode(text, true);
    ASSERT_TRUE(ids.ok()) << ids.status();
    ASSERT_FALSE(ids->empty());
    EXPECT_EQ((*ids)[0], 1);
    auto back = tok.Decode(*ids);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, text);
  }
  // Digits are split (--split_digits): "1935" is four pieces plus the word boundary.
  auto ids = tok.Encode("1935", false);
  ASSERT_TRUE(ids.ok());
  EXPECT_GE(ids->size(), 4u);
  EXPECT_EQ(tok.Decode({400}).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(tok.ApplyChatTemplate({{"user", "x"}}, true).status().code(),
            absl::StatusCode::kUnimplemented);
}

// Crafted GGUF vocabularies: tokenizer errors name what is wrong.
GgufWriter TinyBpeVocab() {
  GgufWriter w;
  w.AddString("tokenizer.ggml.model", "gpt2");
  w.AddString("tokenizer.ggml.pre", "gpt-2");
  w.AddStringArray("tokenizer.ggml.tokens", {"a", "b", "ab", "<|im_start|>", "<|im_end|>"});
  w.AddI32Array("tokenizer.ggml.token_type", {1, 1, 1, 3, 3});
  w.AddStringArray("tokenizer.ggml.merges", {"a b"});
  w.AddU32("tokenizer.ggml.eos_token_id", 4);
  w.AddString("tokenizer.chat_template",
              "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
              "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
              "{{ '<|im_start|>assistant\\n' }}{% endif %}");
  return w;
}

StatusOr<std::unique_ptr<Tokenizer>> FromBytes(const std::string& bytes) {
  return LoadTokenizer(WriteTempFile("tok.gguf", bytes));
}

TEST(TokenizerGgufTest, TinyVocabulary) {
  auto t = FromBytes(TinyBpeVocab().Build());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*(*t)->Encode("abab<|im_start|>ba", true), (std::vector<int32_t>{2, 2, 3, 1, 0}));
  EXPECT_TRUE((*t)->IsEndOfGeneration(4));
  EXPECT_EQ(*(*t)->ApplyChatTemplate({{"user", "ab"}}, true),
            "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n");
  auto bad_role = (*t)->ApplyChatTemplate({{"", "x"}}, false);
  EXPECT_EQ(bad_role.status().code(), absl::StatusCode::kInvalidArgument);
  // A character outside the vocabulary and no unknown token: a clear error.
  auto e = (*t)->Encode("c", false);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerGgufTest, Errors) {
  {
    GgufWriter w = TinyBpeVocab();
    w.AddString("x", "y");
    std::string b = w.Build();
    // Unknown pre-tokenizer: the error names it and lists the supported ones.
    GgufWriter p;
    p.AddString("tokenizer.ggml.model", "gpt2");
    p.AddString("tokenizer.ggml.pre", "no-such-pre");
    p.AddStringArray("tokenizer.ggml.tokens", {"a"});
    p.AddStringArray("tokenizer.ggml.merges", {});
    auto t = FromBytes(p.Build());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented);
    for (const char* name :
         {"'no-such-pre'", "llama3", "qwen2", "deepseek-v3", "tekken", "gpt-4o"}) {
      EXPECT_NE(t.status().message().find(name), std::string::npos) << name << ": " << t.status();
    }
  }
  {
    GgufWriter p;
    p.AddString("tokenizer.ggml.model", "bert");
    p.AddStringArray("tokenizer.ggml.tokens", {"a"});
    auto t = FromBytes(p.Build());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_NE(t.status().message().find("bert"), std::string::npos) << t.status();
  }
  {
    GgufWriter p;  // token_type array shorter than tokens
    p.AddString("tokenizer.ggml.model", "gpt2");
    p.AddStringArray("tokenizer.ggml.tokens", {"a", "b"});
    p.AddI32Array("tokenizer.ggml.token_type", {1});
    p.AddStringArray("tokenizer.ggml.merges", {});
    EXPECT_EQ(FromBytes(p.Build()).status().code(), absl::StatusCode::kInvalidArgument);
  }
  {
    GgufWriter p;  // malformed merge
    p.AddString("tokenizer.ggml.model", "gpt2");
    p.AddStringArray("tokenizer.ggml.tokens", {"a", "b"});
    p.AddStringArray("tokenizer.ggml.merges", {"ab"});
    auto t = FromBytes(p.Build());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find("merge"), std::string::npos) << t.status();
  }
  {
    GgufWriter p;  // scores/tokens mismatch
    p.AddString("tokenizer.ggml.model", "llama");
    p.AddStringArray("tokenizer.ggml.tokens", {"a", "b"});
    p.AddF32Array("tokenizer.ggml.scores", {0.0f});
    EXPECT_EQ(FromBytes(p.Build()).status().code(), absl::StatusCode::kInvalidArgument);
  }
  {
    GgufWriter p;  // special id outside the vocabulary
    p.AddString("tokenizer.ggml.model", "llama");
    p.AddStringArray("tokenizer.ggml.tokens", {"a", "b"});
    p.AddU32("tokenizer.ggml.bos_token_id", 7);
    EXPECT_EQ(FromBytes(p.Build()).status().code(), absl::StatusCode::kInvalidArgument);
  }
  {
    GgufWriter p;  // no tokenizer at all
    p.AddString("general.architecture", "llama");
    EXPECT_EQ(FromBytes(p.Build()).status().code(), absl::StatusCode::kNotFound);
  }
  {
    GgufWriter p;  // tokens of the wrong type
    p.AddString("tokenizer.ggml.model", "llama");
    p.AddI32Array("tokenizer.ggml.tokens", {1, 2});
    EXPECT_EQ(FromBytes(p.Build()).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace polykv::model
