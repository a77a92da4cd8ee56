// llama-perplexity's protocol (model/perplexity.h) on stories260K: exactly which positions a
// 2-chunk text scores, BOS replacement, running values and the standard error, each checked
// against a hand computation with Forward.
#include "polykv/model/perplexity.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model_test_util.h"
#include "polykv/model/llama.h"

namespace polykv::model {
namespace {

using testing::LoadModel;

const char* kStories = POLYKV_TEST_DATA_DIR "/models/stories260K";

TEST(ChunkedPerplexity, PlanOfTwoChunks) {
  // 40 tokens, N = 16: floor(40/16) = 2 chunks (tokens 32..39 dropped); first = 8; positions
  // 8..14 predict tokens 9..15 of each chunk: 7 per chunk.
  auto plan = PlanChunks(40, 16, -1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 2u);
  EXPECT_EQ((*plan)[0].start, 0);
  EXPECT_EQ((*plan)[1].start, 16);
  EXPECT_EQ((*plan)[0].first, 8);
  EXPECT_EQ((*plan)[0].scored, 7);
  // Odd N = 15: first = 7, positions 7..13 predict 8..14: 7 scored.
  auto odd = PlanChunks(40, 15, -1);
  ASSERT_TRUE(odd.ok());
  EXPECT_EQ((*odd)[0].first, 7);
  EXPECT_EQ((*odd)[0].scored, 7);
  // --chunks 1 keeps the first chunk only; fewer than 2N tokens is an error, as llama.cpp.
  EXPECT_EQ(PlanChunks(40, 16, 1)->size(), 1u);
  EXPECT_FALSE(PlanChunks(31, 16, -1).ok());
  EXPECT_EQ(PlanChunks(32, 16, -1)->size(), 2u);
}

// -log softmax(row)[target] as llama.cpp computes it.
double Nll(const float* row, int64_t vocab, int32_t target) {
  float mx = row[0];
  for (int64_t v = 1; v < vocab; ++v) mx = std::max(mx, row[v]);
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - mx);
  return -(static_cast<double>(row[target] - mx) - std::log(sum));
}

void CheckAgainstHand(bool replace_bos, int64_t rows) {
  auto m = LoadModel(kStories, 1);
  ASSERT_TRUE(m.ok()) << m.status();
  const int32_t vocab = (*m)->config().vocab;
  std::vector<int32_t> text(40);
  for (int i = 0; i < 40; ++i) text[i] = 2 + (i * 37 + 11) % (vocab - 2);
  ChunkedPerplexityOptions o;
  o.context = 16;
  o.replace_bos = replace_bos;
  o.bos_id = 1;
  o.rows = rows;
  auto r = ChunkedPerplexity(**m, text, o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->chunks, 2);
  ASSERT_EQ(r->count, 14);
  ASSERT_EQ(r->token_nll.size(), 14u);
  ASSERT_EQ(r->running.size(), 2u);
  // By hand: each chunk from an empty cache, all logits, positions 8..14 vs tokens 9..15.
  double nll = 0, nll2 = 0, first_chunk = 0;
  int k = 0;
  for (int c = 0; c < 2; ++c) {
    std::vector<int32_t> chunk(text.begin() + 16 * c, text.begin() + 16 * c + 16);
    if (replace_bos) chunk[0] = 1;
    KvCache cache = (*m)->NewCache(16);
    auto logits = (*m)->Forward(chunk, cache, /*all_logits=*/true);
    ASSERT_TRUE(logits.ok()) << logits.status();
    for (int p = 8; p <= 14; ++p) {
      const double x = Nll(logits->row(p).data(), vocab, text[16 * c + p + 1]);
      EXPECT_NEAR(r->token_nll[k], x, 1e-4) << "chunk " << c << " position " << p;
      ++k;
      nll += x;
      nll2 += x * x;
    }
    if (c == 0) first_chunk = nll;
  }
  EXPECT_NEAR(r->nll, nll, 1e-3);
  EXPECT_NEAR(r->running[0], std::exp(first_chunk / 7), 1e-3 * r->running[0]);
  EXPECT_NEAR(r->ppl(), std::exp(nll / 14), 1e-3 * r->ppl());
  const double mean = nll / 14, var = nll2 / 14 - mean * mean;
  EXPECT_NEAR(r->stderr_ppl(), std::sqrt(var / 13) * std::exp(mean), 1e-3 * r->stderr_ppl());
}

TEST(ChunkedPerplexity, StoriesMatchesHandComputation) { CheckAgainstHand(false, 512); }
TEST(ChunkedPerplexity, StoriesBosReplacedInEveryChunk) { CheckAgainstHand(true, 512); }
TEST(ChunkedPerplexity, StoriesSmallForwardPiecesSameResult) { CheckAgainstHand(false, 5); }

TEST(ChunkedPerplexity, BosReplacementChangesOnlyWhatItShould) {
  auto m = LoadModel(kStories, 1);
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<int32_t> text(32);
  for (int i = 0; i < 32; ++i) text[i] = 5 + i;
  text[0] = 1;  // the text starts with BOS, as a model that adds BOS tokenizes it
  ChunkedPerplexityOptions a, b;
  a.context = b.context = 16;
  b.replace_bos = true;
  b.bos_id = 1;
  auto ra = ChunkedPerplexity(**m, text, a);
  auto rb = ChunkedPerplexity(**m, text, b);
  ASSERT_TRUE(ra.ok() && rb.ok());
  // Chunk 0 starts with BOS either way: identical; chunk 1's first token differs.
  for (int i = 0; i < 7; ++i) EXPECT_DOUBLE_EQ(ra->token_nll[i], rb->token_nll[i]);
  bool differs = false;
  for (int i = 7; i < 14; ++i) differs |= ra->token_nll[i] != rb->token_nll[i];
  EXPECT_TRUE(differs);
  ChunkedPerplexityOptions bad = b;
  bad.bos_id = -1;
  EXPECT_FALSE(ChunkedPerplexity(**m, text, bad).ok());
}

}  // namespace
}  // namespace polykv::model
