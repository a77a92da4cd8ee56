// bench_pool_ppl: perplexity of a document continuation given a KV cache that went through
// the pool codec (int8 keys + b-bit TurboQuant-MSE values) versus the full-precision cache.
// For each context length C: prefill C tokens of WikiText-2, round-trip every layer's K/V
// through the codec (kernels API, the same calls the pool writer/reader make), then score the
// next S tokens with Forward over that cache; the same window with the untouched cache is
// the baseline. PolyKV paper (Patel & Joshi, 2026) reports +1.59% at 2K, +0.57% at 4K.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_documents.h"
#include "polykv/ipc/codec_spec.h"
#include "polykv/kernels/codec.h"
#include "polykv/model/llama.h"
#include "polykv/model/perplexity.h"

using polykv::Status;
using polykv::StatusOr;
namespace ipc = polykv::ipc;
namespace kernels = polykv::kernels;
namespace model = polykv::model;

namespace {

// Round-trips one layer tensor [kv_heads][tokens][head_dim] through the codec, in place.
Status RoundTrip(std::vector<float>& k, std::vector<float>& v, const kernels::LayerShape& shape,
                 const kernels::CodecConfig& cfg) {
  const kernels::DType dt = kernels::DType::kF32;
  std::vector<int8_t> q(shape.elements());
  std::vector<float> scales(kernels::KeyScaleCount(shape, cfg.key_scale));
  POLYKV_RETURN_IF_ERROR(
      kernels::QuantizeKeys(k.data(), dt, shape, cfg.key_scale, q.data(), scales.data()));
  POLYKV_RETURN_IF_ERROR(
      kernels::DequantizeKeys(q.data(), scales.data(), shape, cfg.key_scale, k.data(), dt));
  std::vector<uint8_t> packed(shape.vectors() *
                              kernels::PackedVectorBytes(shape.head_dim, cfg.value_bits));
  std::vector<float> norms(shape.vectors());
  POLYKV_RETURN_IF_ERROR(
      kernels::EncodeValues(v.data(), dt, shape, cfg, packed.data(), norms.data()));
  POLYKV_RETURN_IF_ERROR(
      kernels::DecodeValues(packed.data(), norms.data(), shape, cfg, v.data(), dt));
  return absl::OkStatus();
}

struct Score {
  double nll_sum = 0;
  int64_t n = 0;
};

// Scores targets tokens[C+1 .. C+S] given a cache holding tokens[0..C) and the input
// tokens[C .. C+S).
StatusOr<Score> ScoreWindow(model::LlamaModel& m, const model::PrefillResult& pre,
                            const std::vector<int32_t>& ctx, const std::vector<int32_t>& next,
                            const kernels::CodecConfig* codec) {
  const int64_t c = static_cast<int64_t>(ctx.size());
  const int64_t s = static_cast<int64_t>(next.size()) - 1;
  model::KvCache cache = m.NewCache(c + s + 1);
  const model::ModelConfig& mc = m.config();
  const kernels::LayerShape shape{mc.kv_heads, c, mc.head_dim};
  for (size_t l = 0; l < pre.k.size(); ++l) {
    std::vector<float> k = pre.k[l], v = pre.v[l];
    if (codec != nullptr) POLYKV_RETURN_IF_ERROR(RoundTrip(k, v, shape, *codec));
    for (int64_t h = 0; h < mc.kv_heads; ++h) {
      std::copy_n(k.begin() + h * c * mc.head_dim, c * mc.head_dim,
                  cache.k[l].begin() + h * cache.capacity * mc.head_dim);
      std::copy_n(v.begin() + h * c * mc.head_dim, c * mc.head_dim,
                  cache.v[l].begin() + h * cache.capacity * mc.head_dim);
    }
  }
  cache.tokens = ctx;
  cache.length = c;
  std::vector<int32_t> in(next.begin(), next.begin() + s);
  std::vector<int32_t> tgt(next.begin() + 1, next.end());
  POLYKV_ASSIGN_OR_RETURN(std::vector<double> nll, model::ScoreTokens(m, cache, in, tgt, s));
  Score sc;
  for (double x : nll) sc.nll_sum += x;
  sc.n = s;
  return sc;
}

// data/<rel> from the working directory, or next to the build tree (build/bench/../../data).
std::string DataFile(const std::string& rel) {
  namespace fs = std::filesystem;
  if (fs::exists("data/" + rel)) return "data/" + rel;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  for (fs::path d = exe.parent_path(); !ec && !d.empty() && d != d.root_path();
       d = d.parent_path()) {
    if (fs::exists(d / "data" / rel)) return (d / "data" / rel).string();
  }
  return "data/" + rel;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_pool_ppl: perplexity with the compressed pool vs full precision"};
  std::string model_path =
      std::getenv("POLYKV_SMOLLM2_GGUF") ? std::getenv("POLYKV_SMOLLM2_GGUF") : "";
  std::string text_path = DataFile("wikitext-2/wiki.test.raw");
  std::vector<int64_t> contexts = {512, 2048, 4096};
  int64_t score = 256;
  int windows = 1;
  int threads = 0;
  std::vector<int> value_bits = {3};
  bool norm_correction = false;
  std::string key_scale = "tensor";
  app.add_option("--model", model_path, "model (.gguf or HF folder); default $POLYKV_SMOLLM2_GGUF");
  app.add_option("--text", text_path, "text file to score (default WikiText-2 test)");
  app.add_option("--contexts", contexts, "context lengths")->delimiter(',');
  app.add_option("--score", score, "tokens scored after each context");
  app.add_option("--windows", windows, "windows per context (consecutive, non-overlapping)");
  app.add_option("--threads", threads, "compute threads (0 = all cores)");
  app.add_option("--value-bits", value_bits, "value bits to test (2,3,4)")->delimiter(',');
  app.add_flag("--norm-correction", norm_correction, "TurboQuant norm correction");
  app.add_option("--key-scale", key_scale, "tensor|head|channel");
  CLI11_PARSE(app, argc, argv);
  if (model_path.empty()) {
    std::fprintf(stderr,
                 "error: give --model or set POLYKV_SMOLLM2_GGUF (scripts/fetch-model.sh)\n");
    return 1;
  }
  std::unique_ptr<model::LlamaModel> loaded =
      polykv::bench::LoadModel(model_path, threads, "error");
  if (loaded == nullptr) return 1;
  model::LlamaModel& m = *loaded;
  if (m.tokenizer() == nullptr) {
    std::fprintf(stderr, "error: model has no tokenizer\n");
    return 1;
  }
  std::ifstream in(text_path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "error: cannot read %s\n", text_path.c_str());
    return 1;
  }
  int64_t cmax = 0;
  for (int64_t c : contexts) cmax = std::max(cmax, c);
  const int64_t need = windows * (cmax + score + 1);
  std::string text(static_cast<size_t>(need * 8 + 4096), '\0');
  in.read(text.data(), text.size());
  text.resize(in.gcount());
  auto ids = m.tokenizer()->Encode(text, /*add_bos=*/false);
  if (!ids.ok() || static_cast<int64_t>(ids->size()) < need) {
    std::fprintf(stderr, "error: tokenizing %s: %s\n", text_path.c_str(),
                 ids.ok() ? "text too short" : ids.status().ToString().c_str());
    return 1;
  }
  // Any other word: per tensor, as before.
  const kernels::KeyScaleMode ks =
      ipc::ParseKeyScaleName(key_scale).value_or(kernels::KeyScaleMode::kPerTensor);
  std::printf(
      "bench_pool_ppl: %s, %s, %d window(s) x %lld scored tokens per context, keys int8 "
      "(%s scale), values TurboQuant-MSE%s\n",
      model_path.c_str(), text_path.c_str(), windows, (long long)score, key_scale.c_str(),
      norm_correction ? " + norm correction" : "");
  std::printf("%-9s %-7s %8s %12s %12s %10s %10s\n", "context", "codec", "scored", "ppl full",
              "ppl pool", "change %", "prefill s");
  for (int64_t c : contexts) {
    std::vector<Score> full_sum(1), pool_sum(value_bits.size());
    double prefill_s = 0;
    for (int w = 0; w < windows; ++w) {
      const int64_t start = w * (cmax + score + 1);
      std::vector<int32_t> ctx(ids->begin() + start, ids->begin() + start + c);
      std::vector<int32_t> next(ids->begin() + start + c, ids->begin() + start + c + score + 1);
      auto t0 = std::chrono::steady_clock::now();
      auto pre = m.Prefill(ctx, 512);
      prefill_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!pre.ok()) {
        std::fprintf(stderr, "error: prefill: %s\n", pre.status().ToString().c_str());
        return 1;
      }
      auto f = ScoreWindow(m, *pre, ctx, next, nullptr);
      if (!f.ok()) {
        std::fprintf(stderr, "error: %s\n", f.status().ToString().c_str());
        return 1;
      }
      full_sum[0].nll_sum += f->nll_sum;
      full_sum[0].n += f->n;
      for (size_t b = 0; b < value_bits.size(); ++b) {
        kernels::CodecConfig cfg;
        cfg.value_bits = value_bits[b];
        cfg.key_scale = ks;
        cfg.norm_correction = norm_correction;
        auto p = ScoreWindow(m, *pre, ctx, next, &cfg);
        if (!p.ok()) {
          std::fprintf(stderr, "error: codec: %s\n", p.status().ToString().c_str());
          return 1;
        }
        pool_sum[b].nll_sum += p->nll_sum;
        pool_sum[b].n += p->n;
      }
    }
    const double ppl_full = std::exp(full_sum[0].nll_sum / full_sum[0].n);
    for (size_t b = 0; b < value_bits.size(); ++b) {
      const double ppl_pool = std::exp(pool_sum[b].nll_sum / pool_sum[b].n);
      std::printf("%-9lld k8v%-4d %8lld %12.4f %12.4f %+10.2f %10.1f\n", (long long)c,
                  value_bits[b], (long long)pool_sum[b].n, ppl_full, ppl_pool,
                  100.0 * (ppl_pool / ppl_full - 1.0), prefill_s);
    }
    std::fflush(stdout);
  }
  return 0;
}
