// polykv-cli eval as a library: windows, codec round trips, paired PPL tables.
#include "eval/eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "polykv/kernels/codec_math.h"
#include "polykv/model/perplexity.h"
#include "polykv/model/prefill.h"

namespace polykv::eval {
namespace {

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double RelMse(const float* x, const float* y, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double e = static_cast<double>(y[i]) - x[i];
    num += e * e;
    den += static_cast<double>(x[i]) * x[i];
  }
  return den > 0 ? num / den : 0;
}

float RoundF16(float x) { return kernels::math::F16ToFloat(kernels::math::FloatToF16(x)); }

// Values without rotation: nearest Lloyd-Max level of sqrt(d) v / ||v||.
Status ValuesWithoutRotation(const CodecSpec& spec, int bits, const float* v,
                             const kernels::LayerShape& shape, float* out) {
  POLYKV_ASSIGN_OR_RETURN(std::vector<float> levels, kernels::LloydMaxCodebook(bits));
  const int d = shape.head_dim;
  const float sd = std::sqrt(static_cast<float>(d));
  for (int64_t i = 0; i < shape.vectors(); ++i) {
    const float* x = v + i * d;
    float* y = out + i * d;
    double ss = 0;
    for (int j = 0; j < d; ++j) ss += static_cast<double>(x[j]) * x[j];
    const float norm = static_cast<float>(std::sqrt(ss));
    if (!(norm > 0)) {
      std::fill(y, y + d, 0.0f);
      continue;
    }
    double lev2 = 0;
    for (int j = 0; j < d; ++j) {
      const float z = x[j] * sd / norm;
      size_t best = 0;
      for (size_t c = 1; c < levels.size(); ++c)
        if (std::fabs(levels[c] - z) < std::fabs(levels[best] - z)) best = c;
      y[j] = levels[best];
      lev2 += static_cast<double>(levels[best]) * levels[best];
    }
    float stored = norm;
    if (spec.norm_correction) stored = norm / static_cast<float>(std::sqrt(lev2 / d));
    if (spec.f16_norms) stored = RoundF16(stored);
    for (int j = 0; j < d; ++j) y[j] = y[j] * stored / sd;
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<std::vector<Window>> MakeWindows(const std::vector<int32_t>& ids, int64_t L,
                                          int64_t scored, int count, int64_t offset) {
  if (scored < 1 || scored > L - 1)
    return absl::InvalidArgumentError(
        absl::StrCat("scored tokens ", scored, " must be in [1, context - 1 = ", L - 1, "]"));
  if (count < 1) return absl::InvalidArgumentError("windows must be >= 1");
  const int64_t need = offset + count * (L + 1);
  if (static_cast<int64_t>(ids.size()) < need)
    return absl::InvalidArgumentError(absl::StrCat(count, " windows of ", L + 1,
                                                   " tokens from token ", offset, " need ", need,
                                                   " tokens; the text has ", ids.size()));
  const int64_t c = L - scored;
  std::vector<Window> out(count);
  for (int w = 0; w < count; ++w) {
    const int64_t s = offset + w * (L + 1);
    Window& win = out[w];
    win.start = s;
    win.context.assign(ids.begin() + s, ids.begin() + s + c);
    win.input.assign(ids.begin() + s + c, ids.begin() + s + L);
    win.targets.assign(ids.begin() + s + c + 1, ids.begin() + s + L + 1);
  }
  return out;
}

Status RoundTripLayer(const CodecSpec& spec, int layer, int layers, const float* k, const float* v,
                      const kernels::LayerShape& shape, float* k_out, float* v_out,
                      LayerError* err) {
  const int64_t n = shape.elements();
  if (spec.none) {
    std::copy(k, k + n, k_out);
    std::copy(v, v + n, v_out);
    if (err != nullptr) *err = {};
    return absl::OkStatus();
  }
  // Keys: the codec's own key encoding (int8, or packed codes for < 8 bits).
  kernels::CodecConfig kc = spec.LayerConfig(layer, layers);
  kc.key_bits = spec.key_bits;
  std::vector<uint8_t> codes(shape.vectors() *
                             kernels::PackedKeyVectorBytes(shape.head_dim, spec.key_bits));
  std::vector<float> scales(kernels::KeyScaleCount(shape, spec.key_scale));
  POLYKV_RETURN_IF_ERROR(
      kernels::EncodeKeys(k, kernels::DType::kF32, shape, kc, codes.data(), scales.data()));
  POLYKV_RETURN_IF_ERROR(
      kernels::DecodeKeys(codes.data(), scales.data(), shape, kc, k_out, kernels::DType::kF32));
  // Values.
  const kernels::CodecConfig cfg = spec.LayerConfig(layer, layers);
  if (!spec.rotation) {
    POLYKV_RETURN_IF_ERROR(ValuesWithoutRotation(spec, cfg.value_bits, v, shape, v_out));
  } else {
    std::vector<uint8_t> packed(shape.vectors() *
                                kernels::PackedVectorBytes(shape.head_dim, cfg.value_bits));
    std::vector<float> norms(shape.vectors());
    POLYKV_RETURN_IF_ERROR(
        kernels::EncodeValues(v, kernels::DType::kF32, shape, cfg, packed.data(), norms.data()));
    if (spec.f16_norms) {
      std::vector<uint16_t> h(norms.size());
      kernels::NormsToF16(norms.data(), static_cast<int64_t>(norms.size()), h.data());
      kernels::NormsFromF16(h.data(), static_cast<int64_t>(h.size()), norms.data());
    }
    POLYKV_RETURN_IF_ERROR(kernels::DecodeValues(packed.data(), norms.data(), shape, cfg, v_out,
                                                 kernels::DType::kF32));
  }
  if (err != nullptr) {
    err->key_rel_mse = RelMse(k, k_out, n);
    err->value_rel_mse = RelMse(v, v_out, n);
  }
  return absl::OkStatus();
}

Status WindowScorer::Prepare(const Window& w) {
  const auto t0 = std::chrono::steady_clock::now();
  w_ = &w;
  POLYKV_ASSIGN_OR_RETURN(pre_, m_.Prefill(w.context, 512));
  prepare_s_ = Seconds(t0);
  return absl::OkStatus();
}

StatusOr<double> WindowScorer::MeanNll(const CodecSpec& spec, std::vector<LayerError>* errors) {
  if (w_ == nullptr) return absl::FailedPreconditionError("WindowScorer: Prepare first");
  const auto t0 = std::chrono::steady_clock::now();
  const model::ModelConfig& cfg = m_.config();
  const int64_t c = static_cast<int64_t>(w_->context.size());
  const kernels::LayerShape shape{cfg.kv_heads, c, cfg.head_dim};
  // The prefix: the prefill's own tensors (baseline) or their codec reconstructions, held
  // raw (f32) and attended to in place.
  std::vector<std::vector<float>> ks, vs;
  if (errors != nullptr) errors->assign(cfg.layers, LayerError{});
  for (int l = 0; l < cfg.layers; ++l) {
    if (spec.none) {
      ks.push_back(pre_.k[l]);
      vs.push_back(pre_.v[l]);
      continue;
    }
    std::vector<float> k(pre_.k[l].size()), v(pre_.v[l].size());
    POLYKV_RETURN_IF_ERROR(RoundTripLayer(spec, l, cfg.layers, pre_.k[l].data(), pre_.v[l].data(),
                                          shape, k.data(), v.data(),
                                          errors != nullptr ? &(*errors)[l] : nullptr));
    ks.push_back(std::move(k));
    vs.push_back(std::move(v));
  }
  POLYKV_ASSIGN_OR_RETURN(std::shared_ptr<model::KvPrefix> prefix,
                          model::MakeRawPrefix(cfg, c, std::move(ks), std::move(vs)));
  const int64_t s = static_cast<int64_t>(w_->input.size());
  POLYKV_ASSIGN_OR_RETURN(model::KvCache cache, m_.NewCacheWithPrefix(prefix, w_->context, s + 1));
  POLYKV_ASSIGN_OR_RETURN(std::vector<double> token_nll,
                          model::ScoreTokens(m_, cache, w_->input, w_->targets, rows_));
  double nll = 0;
  for (double x : token_nll) nll += x;
  score_s_ = Seconds(t0);
  return nll / static_cast<double>(s);
}

StatusOr<std::vector<PplRow>> PplVsContext(model::LlamaModel& m, const std::vector<int32_t>& ids,
                                           const std::vector<CodecSpec>& codecs,
                                           const PplOptions& o) {
  std::vector<PplRow> rows;
  const model::ModelConfig& cfg = m.config();
  for (int64_t L : o.contexts) {
    if (cfg.max_positions > 0 && L > cfg.max_positions) {
      if (o.log)
        o.log(absl::StrCat("context ", L, " skipped: the model's context is ", cfg.max_positions));
      continue;
    }
    const int64_t s = std::max<int64_t>(1, std::llround(L * o.score_fraction));
    POLYKV_ASSIGN_OR_RETURN(std::vector<Window> wins, MakeWindows(ids, L, s, o.windows, o.offset));
    std::vector<double> full;
    std::vector<std::vector<double>> per(codecs.size());
    WindowScorer sc(m);
    for (size_t w = 0; w < wins.size(); ++w) {
      POLYKV_RETURN_IF_ERROR(sc.Prepare(wins[w]));
      POLYKV_ASSIGN_OR_RETURN(double f, sc.MeanNll(ParseCodecSpec("none").value()));
      full.push_back(f);
      std::string line = absl::StrFormat("context %d window %d/%d: prefill %.1fs, full %.4f", L,
                                         w + 1, wins.size(), sc.prepare_s(), std::exp(f));
      for (size_t i = 0; i < codecs.size(); ++i) {
        double x = f;
        if (!codecs[i].none) {
          POLYKV_ASSIGN_OR_RETURN(x, sc.MeanNll(codecs[i]));
        }
        per[i].push_back(x);
        absl::StrAppendFormat(&line, ", %s %+.2f%% (%.1fs)", codecs[i].name,
                              100 * std::expm1(x - f), sc.score_s());
      }
      if (o.log) o.log(line);
    }
    for (size_t i = 0; i < codecs.size(); ++i) {
      PplRow r;
      r.codec = codecs[i].name;
      r.spec = codecs[i].Canonical();
      r.context = L;
      r.compressed = L - s;
      r.scored = s;
      r.windows = static_cast<int>(wins.size());
      double a = 0, b = 0;
      for (double x : full) a += x;
      for (double x : per[i]) b += x;
      r.ppl_full = std::exp(a / full.size());
      r.ppl_codec = std::exp(b / per[i].size());
      r.change = AsPplChangePercent(PairedMeanInterval(per[i], full));
      r.size = PoolSizeOf(codecs[i], cfg.layers, cfg.kv_heads, cfg.head_dim, L - s);
      r.window_nll_full = full;
      r.window_nll_codec = per[i];
      rows.push_back(std::move(r));
    }
  }
  return rows;
}

StatusOr<std::vector<LayerError>> LayerErrors(model::LlamaModel& m,
                                              const std::vector<int32_t>& context,
                                              const CodecSpec& spec) {
  POLYKV_ASSIGN_OR_RETURN(model::PrefillResult pre, m.Prefill(context, 512));
  const model::ModelConfig& cfg = m.config();
  const kernels::LayerShape shape{cfg.kv_heads, static_cast<int64_t>(context.size()), cfg.head_dim};
  std::vector<LayerError> out(cfg.layers);
  for (int l = 0; l < cfg.layers; ++l) {
    std::vector<float> ko(pre.k[l].size()), vo(pre.v[l].size());
    POLYKV_RETURN_IF_ERROR(RoundTripLayer(spec, l, cfg.layers, pre.k[l].data(), pre.v[l].data(),
                                          shape, ko.data(), vo.data(), &out[l]));
  }
  return out;
}

std::string PplCsv(const std::vector<PplRow>& rows, const std::string& section) {
  std::string s = absl::StrCat(kPplCsvHeader, "\n");
  for (const PplRow& r : rows) {
    absl::StrAppendFormat(&s, "%s,%s,%s,%d,%d,%d,%d,%.6f,%.6f,%.4f,%.4f,%.4f,%.4f,%.4f,%d\n",
                          section, r.codec, r.spec, r.context, r.compressed, r.scored, r.windows,
                          r.ppl_full, r.ppl_codec, r.change.mean, r.change.lo, r.change.hi,
                          r.size.bits_per_value, r.size.ratio, r.size.bytes);
  }
  return s;
}

std::string PplMarkdown(const std::vector<PplRow>& rows) {
  std::string s =
      "| context | compressed + scored | windows | codec | bits/value | ratio | PPL full | PPL "
      "codec "
      "| change | 95% interval |\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (const PplRow& r : rows) {
    absl::StrAppendFormat(&s, "| %d | %d + %d | %d | %s (%s) | %.3f | %.3fx | %.4f | %.4f | %s |\n",
                          r.context, r.compressed, r.scored, r.windows, r.codec, r.spec,
                          r.size.bits_per_value, r.size.ratio, r.ppl_full, r.ppl_codec,
                          PercentChangeCells(r.change));
  }
  return s;
}

}  // namespace polykv::eval
