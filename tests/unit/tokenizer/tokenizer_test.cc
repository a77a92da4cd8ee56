// Tokenizer tests: llama.cpp's vocabulary test vectors (every line exact), round trips,
// SmolLM2 chat template, tokenizer.json / tokenizer.model loading and bad inputs.
#include "polykv/model/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>

#include "absl/strings/str_join.h"
#include "gguf_writer.h"
#include "polykv/model/gguf.h"
#include "support/files.h"
#include "tokenizer_test_util.h"

namespace polykv::model {
namespace {

using support::ReadFile;
using testing::DataPath;
using testing::Escape;

// llama.cpp test-tokenizer-0 format: strings separated by "\n__ggml_vocab_test__\n" (the
// file ends with one), expected ids one line per string.
struct VocabCase {
  std::string text;
  std::string expected;
};
std::vector<VocabCase> ReadCases(const std::string& vocab) {
  std::string inp = ReadFile(DataPath("tokenizer/" + vocab + ".inp"));
  std::string out = ReadFile(DataPath("tokenizer/" + vocab + ".out"));
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t pos = 0;
  while (true) {
    size_t next = inp.find(sep, pos);
    if (next == std::string::npos) break;
    texts.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::vector<std::string> lines;
  std::stringstream ss(out);
  std::string line;
  while (std::getline(ss, line)) lines.push_back(line);
  std::vector<VocabCase> cases;
  EXPECT_EQ(texts.size(), lines.size()) << vocab;
  for (size_t i = 0; i < texts.size() && i < lines.size(); ++i) {
    // .out lines start with a space before each id: normalize to "a b c".
    std::string e = lines[i];
    size_t b = e.find_first_not_of(' ');
    e = b == std::string::npos ? "" : e.substr(b);
    while (!e.empty() && e.back() == ' ') e.pop_back();
    cases.push_back({texts[i], e});
  }
  return cases;
}

std::unique_ptr<Tokenizer> Load(const std::string& path) {
  auto t = LoadTokenizer(path);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(t).value() : nullptr;
}

void CheckVocab(const std::string& vocab, size_t expected_cases) {
  auto tok = Load(DataPath("tokenizer/" + vocab));
  ASSERT_NE(tok, nullptr);
  auto cases = ReadCases(vocab);
  ASSERT_EQ(cases.size(), expected_cases);
  int failures = 0;
  for (const VocabCase& c : cases) {
    auto ids = tok->Encode(c.text, /*add_bos=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    std::string got = absl::StrJoin(*ids, " ");
    if (got != c.expected) {
      ++failures;
      ADD_FAILURE() << vocab << " mismatch for '" << Escape(c.text)
                    << "'\n  expected: " << c.expected << "\n  got:      " << got;
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(TokenizerVocabTest, Gpt2AllLinesMatch) { CheckVocab("ggml-vocab-gpt-2.gguf", 46); }
TEST(TokenizerVocabTest, LlamaSpmAllLinesMatch) { CheckVocab("ggml-vocab-llama-spm.gguf", 46); }

const char* SmolPath() {
  const char* p = std::getenv("POLYKV_SMOLLM2_GGUF");
  return (p && *p) ? p : nullptr;
}

// Round-trip texts: a wikitext prefix, non-ASCII scripts, emoji, whitespace, empty.
std::vector<std::string> RoundTripTexts() {
  std::string wiki = ReadFile(std::string(POLYKV_SOURCE_DIR) + "/data/wikitext-2/wiki.test.raw");
  EXPECT_GT(wiki.size(), 20000u);
  // Cut at a UTF-8 character boundary.
  size_t n = std::min<size_t>(20000, wiki.size());
  while (n > 0 && (static_cast<unsigned char>(wiki[n]) & 0xC0) == 0x80) --n;
  return {wiki.substr(0, n),
          "",
          " ",
          "\n\n  \t x",
          "Grüße aus Köln — naïve café, Ελληνικά, русский текст, 日本語のテキスト, 한국어",
          "emoji: 🦙🚀😶‍🌫️ 👩🏽‍💻 ✅ flags 🇫🇷",
          "Numbers 3.14159 and 1234567890, code: x+=1; if (a<b) {return;}",
          "  leading and trailing spaces  "};
}

void CheckRoundTrips(const Tokenizer& tok, const std::string& name) {
  for (const std::string& text : RoundTripTexts()) {
    auto ids = tok.Encode(text, /*add_bos=*/true);
    ASSERT_TRUE(ids.ok()) << ids.status();
    if (tok.adds_bos()) {
      ASSERT_FALSE(ids->empty());
      EXPECT_EQ((*ids)[0], tok.bos_id());
    }
    auto back = tok.Decode(*ids);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, text) << name << ": decode(encode(text)) differs for '"
                           << Escape(text.substr(0, 80)) << "'";
    auto again = tok.Encode(*back, /*add_bos=*/true);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *ids) << name << ": encode(decode(ids)) differs for '"
                            << Escape(text.substr(0, 80)) << "'";
  }
  if (!RoundTripTexts()[0].empty()) {
    auto ids = tok.Encode(RoundTripTexts()[0], false);
    ASSERT_TRUE(ids.ok());
    EXPECT_GT(ids->size(), 3000u) << name;  // ~20 kB of English text
    EXPECT_LT(ids->size(), 10000u) << name;
  }
}

TEST(TokenizerRoundTripTest, Gpt2) {
  auto tok = Load(DataPath("tokenizer/ggml-vocab-gpt-2.gguf"));
  ASSERT_NE(tok, nullptr);
  CheckRoundTrips(*tok, "gpt-2");
}

TEST(TokenizerRoundTripTest, LlamaSpm) {
  auto tok = Load(DataPath("tokenizer/ggml-vocab-llama-spm.gguf"));
  ASSERT_NE(tok, nullptr);
  CheckRoundTrips(*tok, "llama-spm");
}

TEST(TokenizerRoundTripTest, SmolLm2) {
  if (!SmolPath()) GTEST_SKIP() << "POLYKV_SMOLLM2_GGUF is not set (scripts/fetch-model.sh)";
  auto tok = Load(SmolPath());
  ASSERT_NE(tok, nullptr);
  CheckRoundTrips(*tok, "smollm2");
}

// Random strings (ASCII, whitespace, multi-byte characters and, for byte-level BPE, raw
// bytes) survive decode(encode(x)) exactly.
TEST(TokenizerRoundTripTest, RandomStrings) {
  auto gpt2 = Load(DataPath("tokenizer/ggml-vocab-gpt-2.gguf"));
  auto spm = Load(DataPath("tokenizer/ggml-vocab-llama-spm.gguf"));
  ASSERT_NE(gpt2, nullptr);
  ASSERT_NE(spm, nullptr);
  const std::vector<std::string> alphabet = {"a",
                                             "Z",
                                             "7",
                                             " ",
                                             "  ",
                                             "\n",
                                             "\t",
                                             "'s",
                                             "'",
                                             ".",
                                             "!",
                                             "\xc3\xa9",
                                             "\xe2\x80\x94",
                                             "\xe6\x97\xa5",
                                             "\xf0\x9f\xa6\x99",
                                             "<",
                                             "|",
                                             "0x"};
  uint64_t state = 12345;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  for (int iter = 0; iter < 300; ++iter) {
    std::string text, raw;
    const int n = static_cast<int>(next() % 40);
    for (int k = 0; k < n; ++k) text += alphabet[next() % alphabet.size()];
    raw = text;
    raw += static_cast<char>(0x80 + next() % 0x80);  // a stray continuation/lead byte
    for (const Tokenizer* t : {gpt2.get(), spm.get()}) {
      auto ids = t->Encode(text, true);
      ASSERT_TRUE(ids.ok());
      EXPECT_EQ(*t->Decode(*ids), text) << "'" << Escape(text) << "'";
    }
    auto ids = gpt2->Encode(raw, false);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*gpt2->Decode(*ids), raw) << "'" << Escape(raw) << "'";
  }
}

TEST(TokenizerPropertiesTest, Gpt2AndSpm) {
  auto gpt2 = Load(DataPath("tokenizer/ggml-vocab-gpt-2.gguf"));
  auto spm = Load(DataPath("tokenizer/ggml-vocab-llama-spm.gguf"));
  ASSERT_NE(gpt2, nullptr);
  ASSERT_NE(spm, nullptr);
  EXPECT_EQ(gpt2->vocab_size(), 50257);
  EXPECT_EQ(gpt2->family(), "bpe/gpt-2");
  EXPECT_EQ(spm->family(), "spm");
  EXPECT_EQ(gpt2->bos_id(), 50256);
  EXPECT_EQ(gpt2->eos_id(), 50256);
  EXPECT_FALSE(gpt2->adds_bos());
  EXPECT_TRUE(gpt2->IsEndOfGeneration(50256));
  EXPECT_FALSE(gpt2->IsEndOfGeneration(198));
  EXPECT_EQ(spm->vocab_size(), 32000);
  EXPECT_EQ(spm->bos_id(), 1);
  EXPECT_EQ(spm->eos_id(), 2);
  EXPECT_TRUE(spm->adds_bos());
  EXPECT_TRUE(spm->IsEndOfGeneration(2));
  auto ids = spm->Encode("Hello world", true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 15043, 3186}));
  // Special tokens in the text are single ids.
  auto g = gpt2->Encode("a<|endoftext|>b", false);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(*g, (std::vector<int32_t>{64, 50256, 65}));
  // Invalid UTF-8 is encoded byte-wise and decodes back to the same bytes.
  const std::string bad = std::string("ok\xff\xfe") + "\xc3";
  for (const auto* t : {gpt2.get(), spm.get()}) {
    auto b = t->Encode(bad, false);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(*t->Decode(*b), bad);
  }
  // Out-of-range ids are errors, never crashes.
  EXPECT_EQ(gpt2->Decode({50257}).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(spm->Decode({-1}).status().code(), absl::StatusCode::kOutOfRange);
  // Fingerprints: stable, distinct, hex SHA-256.
  EXPECT_EQ(gpt2->Fingerprint().size(), 64u);
  EXPECT_EQ(gpt2->Fingerprint(), Load(DataPath("tokenizer/ggml-vocab-gpt-2.gguf"))->Fingerprint());
  EXPECT_NE(gpt2->Fingerprint(), spm->Fingerprint());
  // No chat template in these vocabularies.
  std::vector<ChatMessage> msgs = {{"user", "hi"}};
  EXPECT_EQ(gpt2->ApplyChatTemplate(msgs, true).status().code(), absl::StatusCode::kUnimplemented);
}

TEST(TokenizerSmolLm2Test, ChatTemplateAndSpecialTokens) {
  if (!SmolPath()) GTEST_SKIP() << "POLYKV_SMOLLM2_GGUF is not set (scripts/fetch-model.sh)";
  auto tok = Load(SmolPath());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 49152);
  EXPECT_EQ(tok->family(), "bpe/smollm");
  EXPECT_FALSE(tok->adds_bos());
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_TRUE(tok->IsEndOfGeneration(2));  // <|im_end|>
  EXPECT_TRUE(tok->IsEndOfGeneration(0));  // <|endoftext|>
  EXPECT_FALSE(tok->IsEndOfGeneration(1));
  std::vector<ChatMessage> msgs = {{"system", "You are terse."}, {"user", "What is 2+2?"}};
  auto s = tok->ApplyChatTemplate(msgs, true);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s,
            "<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
  auto ids = tok->Encode(*s, true);
  ASSERT_TRUE(ids.ok());
  ASSERT_GT(ids->size(), 4u);
  EXPECT_EQ((*ids)[0], 1);  // <|im_start|> as one token, no BOS added
  int starts = 0, ends = 0;
  for (int32_t id : *ids) {
    starts += id == 1;
    ends += id == 2;
  }
  EXPECT_EQ(starts, 3);
  EXPECT_EQ(ends, 2);
  EXPECT_EQ(*tok->Decode(*ids), *s);
  // Without a system message the template inserts SmolLM2's default one.
  std::vector<ChatMessage> user_only = {{"user", "Hi"}};
  EXPECT_EQ(*tok->ApplyChatTemplate(user_only, false),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  // Digits are split one by one (pre-tokenizer "smollm").
  auto d = tok->Encode("2024", false);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->size(), 4u);
}

// Reference ids from Hugging Face `tokenizers` 0.23.3 (Digits(individual) + ByteLevel BPE over
// the same vocabulary and merges), which matched PolyKV on 52 strings incl. 60 kB of
// wikitext during development.
TEST(TokenizerSmolLm2Test, MatchesHuggingFaceReference) {
  if (!SmolPath()) GTEST_SKIP() << "POLYKV_SMOLLM2_GGUF is not set (scripts/fetch-model.sh)";
  auto tok = Load(SmolPath());
  ASSERT_NE(tok, nullptr);
  const std::vector<std::pair<std::string, std::vector<int32_t>>> cases = {
      {"Hello, world! 12345", {19556, 28, 905, 17, 216, 33, 34, 35, 36, 37}},
      {"Robert Boulter is an English film, television and theatre actor.",
       {25268, 389, 9226, 352, 314, 354, 2321, 4771, 28, 8552, 284, 16984, 17523, 30}},
      {" na\xc3\xafve caf\xc3\xa9 \xf0\x9f\xa6\x99\n\n  x",
       {15486, 46494, 37366, 15107, 116, 243, 8866, 1792}},
      {"<|im_start|>user\nHi<|im_end|>\n", {1, 4093, 198, 26843, 2, 198}},
  };
  for (const auto& [text, want] : cases) {
    auto ids = tok->Encode(text, false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, want) << "for '" << Escape(text) << "'";
  }
}

}  // namespace
}  // namespace polykv::model
