// polykv-cli eval's library: Student t quantiles, the paired interval on synthetic data with a
// known answer, codec spec strings and their exact pool sizes, windows, and the CSV columns
// (written by a real run on stories260K).
#include "eval/eval.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "eval/eval_agents.h"
#include "eval/eval_extra.h"
#include "polykv/model/llama.h"

namespace polykv::eval {
namespace {

TEST(EvalStats, StudentTQuantilesMatchTables) {
  // Two-sided 95% critical values (any statistics table).
  EXPECT_NEAR(StudentTQuantile(0.975, 1), 12.7062, 1e-3);
  EXPECT_NEAR(StudentTQuantile(0.975, 2), 4.3027, 1e-3);
  EXPECT_NEAR(StudentTQuantile(0.975, 7), 2.3646, 1e-3);
  EXPECT_NEAR(StudentTQuantile(0.975, 15), 2.1314, 1e-3);
  EXPECT_NEAR(StudentTQuantile(0.975, 1e6), 1.9600, 1e-3);
  EXPECT_NEAR(StudentTQuantile(0.025, 7), -2.3646, 1e-3);
  EXPECT_NEAR(StudentTCdf(0, 5), 0.5, 1e-12);
}

TEST(EvalStats, PairedIntervalHandComputed) {
  // Differences 1, 2, 3, 4: mean 2.5, sd sqrt(5/3), t(0.975, 3) = 3.18245.
  const std::vector<double> base = {10, 20, 30, 40};
  const std::vector<double> treated = {11, 22, 33, 44};
  PairedInterval p = PairedMeanInterval(treated, base);
  EXPECT_EQ(p.n, 4);
  EXPECT_DOUBLE_EQ(p.mean, 2.5);
  EXPECT_NEAR(p.sd, std::sqrt(5.0 / 3.0), 1e-12);
  const double half = 3.182446 * std::sqrt(5.0 / 3.0) / 2.0;
  EXPECT_NEAR(p.lo, 2.5 - half, 1e-5);
  EXPECT_NEAR(p.hi, 2.5 + half, 1e-5);
  PercentChange c = AsPplChangePercent(PairedInterval{1, std::log(1.01), 0, 0, std::log(1.02)});
  EXPECT_NEAR(c.mean, 1.0, 1e-9);
  EXPECT_NEAR(c.hi, 2.0, 1e-9);
}

TEST(EvalStats, PairedIntervalCoversKnownShift) {
  // Synthetic windows: baseline NLL varies a lot between windows (N(3, 0.5^2)); the codec
  // adds a known shift 0.01 plus small noise N(0, 0.002^2). The paired interval must cover
  // 0.01 in about 95% of 400 repetitions and be far narrower than an unpaired one.
  std::mt19937_64 rng(7);
  std::normal_distribution<double> win(3.0, 0.5), noise(0.0, 0.002);
  int covered = 0;
  double width = 0;
  const int reps = 400;
  for (int r = 0; r < reps; ++r) {
    std::vector<double> b(8), t(8);
    for (int i = 0; i < 8; ++i) {
      b[i] = win(rng);
      t[i] = b[i] + 0.01 + noise(rng);
    }
    PairedInterval p = PairedMeanInterval(t, b);
    covered += p.lo <= 0.01 && 0.01 <= p.hi;
    width += p.hi - p.lo;
  }
  EXPECT_GE(covered, 360);  // 95% +- 3 sd of a binomial(400, 0.95) is [364, 396]
  EXPECT_LE(covered, 398);
  EXPECT_LT(width / reps, 0.01);  // ~2 * 2.36 * 0.002 / sqrt(8) = 0.0033
}

TEST(EvalStats, OneWindowIsUnbounded) {
  PairedInterval p = PairedMeanInterval({2.0}, {1.0});
  EXPECT_EQ(p.mean, 1.0);
  EXPECT_TRUE(std::isinf(p.lo) && std::isinf(p.hi));
}

TEST(EvalStats, LlamaPerplexityStandardError) {
  PplEstimate e;
  for (double x : {1.0, 2.0, 3.0}) {
    e.count++;
    e.nll += x;
    e.nll2 += x * x;
  }
  // mean 2, var (14/3 - 4) = 2/3, se = sqrt(2/3 / 2) * e^2.
  EXPECT_NEAR(e.Ppl(), std::exp(2.0), 1e-12);
  EXPECT_NEAR(e.StdErr(), std::sqrt(1.0 / 3.0) * std::exp(2.0), 1e-12);
}

TEST(EvalCodecSpec, PresetsAndGrammar) {
  auto paper = ParseCodecSpec("paper");
  ASSERT_TRUE(paper.ok()) << paper.status();
  EXPECT_EQ(paper->Canonical(), "k8t-v3");
  EXPECT_EQ(paper->key_scale, kernels::KeyScaleMode::kPerTensor);
  EXPECT_FALSE(paper->f16_norms);
  auto d = ParseCodecSpec("default");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->Canonical(), kDefaultCodecSpec);
  auto s = ParseCodecSpec("k6c-v4-e4x2-nc-n16-norot-s2a");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->key_bits, 6);
  EXPECT_EQ(s->key_scale, kernels::KeyScaleMode::kPerChannel);
  EXPECT_EQ(s->value_bits, 4);
  EXPECT_EQ(s->edge_value_bits, 4);
  EXPECT_EQ(s->edge_layers, 2);
  EXPECT_TRUE(s->norm_correction && s->f16_norms && !s->rotation);
  EXPECT_EQ(s->seed, 0x2aull);
  EXPECT_EQ(s->Canonical(), "k6c-v4-e4x2-nc-n16-norot-s2a");
  EXPECT_EQ(ParseCodecSpec("k8c-v3-e4").value().ValueBitsOf(0, 30), 4);
  EXPECT_EQ(ParseCodecSpec("k8c-v3-e4").value().ValueBitsOf(1, 30), 3);
  EXPECT_EQ(ParseCodecSpec("k8c-v3-e4").value().ValueBitsOf(29, 30), 4);
  EXPECT_TRUE(ParseCodecSpec("none").value().none);
  for (const char* bad : {"k9t-v3", "k8x-v3", "k8t-v5", "k8t", "v3", "k8t-v3-zz", "k8t-v3-sxyz"})
    EXPECT_FALSE(ParseCodecSpec(bad).ok()) << bad;
}

TEST(EvalCodecSpec, PoolSizeIsExact) {
  // SmolLM2 shape, 1,451 tokens, the paper codec: the README's 11.49 MiB pool.
  const PoolSize p = PoolSizeOf(ParseCodecSpec("paper").value(), 30, 3, 64, 1451);
  const int64_t vectors = 3 * 1451;
  auto align = [](int64_t x) { return (x + 255) / 256 * 256; };
  const int64_t per_layer =
      align(vectors * 64) + align(4) + align(vectors * 24) + align(4 * vectors);
  EXPECT_EQ(p.bytes, 4096 + align(4 * 1451) + 30 * per_layer);
  EXPECT_EQ(p.bf16_bytes, int64_t{30} * 4 * vectors * 64);
  EXPECT_NEAR(p.ratio, 2.77, 0.01);
  // 6-bit per-channel keys, 4-bit values, f16 norms, 1,024 tokens (every section already a
  // multiple of 256): K 3,072 x 48 B, scales 3 x 64 x 4 B, V 3,072 x 32 B, norms 3,072 x 2 B
  // per layer, plus the 4,096-byte header and 4,096 bytes of token ids.
  const PoolSize q = PoolSizeOf(ParseCodecSpec("k6c-v4-n16").value(), 30, 3, 64, 1024);
  EXPECT_EQ(q.bytes, 4096 + 4096 + 30 * (147456 + 768 + 98304 + 6144));
  EXPECT_DOUBLE_EQ(q.bits_per_value, 8.0 * q.bytes / (2.0 * 30 * 3 * 1024 * 64));
  EXPECT_NEAR(q.bits_per_value, 5.1462, 1e-4);  // (6 + 4 + 0.25) / 2 + scales and header
}

TEST(EvalWindows, LayoutOfContextInputAndTargets) {
  std::vector<int32_t> ids(100);
  for (int i = 0; i < 100; ++i) ids[i] = i;
  auto w = MakeWindows(ids, /*L=*/10, /*scored=*/4, /*count=*/3, /*offset=*/5);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->size(), 3u);
  // Window 1 starts at 5 + 11: context 16..21, inputs 22..25, targets 23..26.
  const Window& x = (*w)[1];
  EXPECT_EQ(x.start, 16);
  EXPECT_EQ(x.context, (std::vector<int32_t>{16, 17, 18, 19, 20, 21}));
  EXPECT_EQ(x.input, (std::vector<int32_t>{22, 23, 24, 25}));
  EXPECT_EQ(x.targets, (std::vector<int32_t>{23, 24, 25, 26}));
  EXPECT_FALSE(MakeWindows(ids, 50, 10, 2, 0).ok());  // needs 102 tokens
  EXPECT_FALSE(MakeWindows(ids, 10, 10, 1, 0).ok());  // scored must be < L
}

TEST(EvalRoundTrip, KeyBitsAndNormsBehave) {
  // Random K/V [2][64][16]: key error falls with key bits, f16 norms change values by < 1e-3
  // relative, "none" is exact.
  const kernels::LayerShape shape{2, 64, 16};
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0, 1);
  std::vector<float> k(shape.elements()), v(shape.elements()), ko(k.size()), vo(v.size());
  for (auto& x : k) x = g(rng);
  for (auto& x : v) x = g(rng);
  double prev = 1e9;
  for (int bits : {4, 5, 6, 7, 8}) {
    CodecSpec s = ParseCodecSpec("k" + std::to_string(bits) + "c-v3").value();
    LayerError e;
    ASSERT_TRUE(RoundTripLayer(s, 0, 1, k.data(), v.data(), shape, ko.data(), vo.data(), &e).ok());
    EXPECT_LT(e.key_rel_mse, prev) << bits;
    prev = e.key_rel_mse;
    EXPECT_NEAR(e.value_rel_mse, 0.034, 0.01);
  }
  LayerError a, b;
  ASSERT_TRUE(RoundTripLayer(ParseCodecSpec("k8c-v3").value(), 0, 1, k.data(), v.data(), shape,
                             ko.data(), vo.data(), &a)
                  .ok());
  ASSERT_TRUE(RoundTripLayer(ParseCodecSpec("k8c-v3-n16").value(), 0, 1, k.data(), v.data(), shape,
                             ko.data(), vo.data(), &b)
                  .ok());
  EXPECT_NEAR(a.value_rel_mse, b.value_rel_mse, 1e-3 * a.value_rel_mse + 1e-6);
  LayerError r;
  ASSERT_TRUE(RoundTripLayer(ParseCodecSpec("k8c-v3-norot").value(), 0, 1, k.data(), v.data(),
                             shape, ko.data(), vo.data(), &r)
                  .ok());
  EXPECT_GT(r.value_rel_mse, 0.0);
  LayerError n;
  ASSERT_TRUE(RoundTripLayer(ParseCodecSpec("none").value(), 0, 1, k.data(), v.data(), shape,
                             ko.data(), vo.data(), &n)
                  .ok());
  EXPECT_EQ(n.key_rel_mse, 0.0);
  EXPECT_EQ(vo, v);
}

TEST(EvalPpl, CsvColumnsFromARealRun) {
  model::LoadOptions o;
  o.threads = 1;
  auto m = model::LlamaModel::Load(POLYKV_TEST_DATA_DIR "/models/stories260K", o);
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<int32_t> ids(400);
  for (int i = 0; i < 400; ++i) ids[i] = (i * 7919 + 13) % (*m)->config().vocab;
  PplOptions po;
  po.contexts = {64};
  po.windows = 3;
  auto codecs = ParseCodecList("paper,k8c-v4");
  ASSERT_TRUE(codecs.ok());
  auto rows = PplVsContext(**m, ids, *codecs, po);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  const std::string csv = PplCsv(*rows);
  std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0],
            "section,codec,spec,context,compressed,scored,windows,ppl_full,ppl_codec,change_pct,"
            "ci95_lo_pct,ci95_hi_pct,bits_per_value,effective_ratio,pool_bytes");
  std::vector<std::string> f = absl::StrSplit(lines[1], ',');
  ASSERT_EQ(f.size(), 15u);
  EXPECT_EQ(f[0], "ppl_vs_context");
  EXPECT_EQ(f[1], "paper");
  EXPECT_EQ(f[2], "k8t-v3");
  EXPECT_EQ(f[3], "64");
  EXPECT_EQ(f[4], "32");
  EXPECT_EQ(f[5], "32");
  EXPECT_EQ(f[6], "3");
  const PplRow& r = (*rows)[0];
  EXPECT_GT(r.ppl_full, 1.0);
  EXPECT_LE(r.change.lo, r.change.mean);
  EXPECT_GE(r.change.hi, r.change.mean);
  EXPECT_NEAR(r.change.mean, 100 * (r.ppl_codec / r.ppl_full - 1), 1e-6);
  // The Pareto table lists both rows.
  const std::string pareto = ParetoMarkdown(*rows);
  EXPECT_NE(pareto.find("k8t-v3"), std::string::npos);
  EXPECT_NE(pareto.find("k8c-v4"), std::string::npos);
}

TEST(EvalAgents, NAgentsAtOnceScoreTheSameWindowsAsOne) {
  // The paper's agent-count invariance through a real polykvd and agent processes: 1 and 3
  // agents alive at once on one pool per codec and window. Every agent computes the same
  // numbers (spread 0), the change does not depend on N, codec none is the reference
  // (change 0), and it agrees with the in-process full-precision perplexity.
  const std::string cli = POLYKV_BINARY_DIR "/cli/polykv-cli";
  if (access(cli.c_str(), X_OK) != 0 || access(POLYKV_BINARY_DIR "/daemon/polykvd", X_OK) != 0)
    GTEST_SKIP() << "polykv-cli or polykvd not built";
  const std::string model = POLYKV_TEST_DATA_DIR "/models/stories260K";
  std::vector<int32_t> ids(400);
  for (int i = 0; i < 400; ++i) ids[i] = (i * 7919 + 13) % 512;
  char tmpl[] = "/tmp/polykv-eval-agents-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  AgentEvalOptions o;
  o.model_path = model;
  o.cli = cli;
  o.work_dir = tmpl;
  o.counts = {1, 3};
  o.windows = 2;
  o.context = 64;
  auto codecs = ParseCodecList("paper");
  ASSERT_TRUE(codecs.ok());
  auto rows = AgentInvariance(ids, *codecs, o);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 4u);  // none x {1, 3}, paper x {1, 3}
  for (const AgentRow& r : *rows) {
    SCOPED_TRACE(r.codec + " x" + std::to_string(r.agents));
    EXPECT_EQ(r.windows, 2);
    EXPECT_EQ(r.agent_spread, 0.0);
    EXPECT_TRUE(std::isfinite(r.nll_codec));
    EXPECT_GT(r.nll_codec, 0.0);
  }
  EXPECT_EQ((*rows)[0].codec, "none");
  EXPECT_EQ((*rows)[0].change.mean, 0.0);
  EXPECT_EQ((*rows)[1].nll_codec, (*rows)[0].nll_codec) << "none: 3 agents as 1";
  EXPECT_EQ((*rows)[3].nll_codec, (*rows)[2].nll_codec) << "paper: 3 agents as 1";
  EXPECT_EQ((*rows)[3].change.mean, (*rows)[2].change.mean);
  EXPECT_NE((*rows)[2].nll_codec, (*rows)[0].nll_codec) << "the codec changes the numbers";
  // The same windows in process (full precision prefix): the pool of codec none agrees.
  model::LoadOptions lo;
  lo.threads = 1;
  auto m = model::LlamaModel::Load(model, lo);
  ASSERT_TRUE(m.ok());
  PplOptions po;
  po.contexts = {64};
  po.windows = 2;
  auto inproc = PplVsContext(**m, ids, *codecs, po);
  ASSERT_TRUE(inproc.ok()) << inproc.status();
  EXPECT_NEAR(std::exp((*rows)[0].nll_full), (*inproc)[0].ppl_full, 1e-3 * (*inproc)[0].ppl_full);
  const std::string csv = AgentCsv(*rows);
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "codec,spec,agents,windows,nll_full,nll_codec,ppl_change_pct,ci_lo_pct,ci_hi_pct,"
            "agent_spread");
  std::filesystem::remove_all(tmpl);
}

}  // namespace
}  // namespace polykv::eval
