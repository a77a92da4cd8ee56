// polykv-cli eval, as a library: the PolyKV paper's fidelity tables for a model, a text and
// codec configurations, with paired intervals over windows.
//
// Protocol of one PPL window at context length L with S scored tokens (C = L - S compressed):
// tokens t_0 .. t_L of the text (L + 1 tokens). The context t_0 .. t_{C-1} is prefilled once in
// full precision; its K/V is then taken through each codec (or left as it is: the baseline)
// and held as a read-only prefix attended to in place (kernels/attention.h); the inputs
// t_C .. t_{L-1} are run over it and positions C .. L-1 predict t_{C+1} .. t_L (S tokens). The
// prediction of t_C comes from the context's own prefill and is the same for every codec, so
// it is not scored. Every codec sees the same windows; the per-window difference of mean NLL
// (codec - baseline) gives a paired Student-t interval, reported as a PPL change in percent.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "eval/codec_spec.h"
#include "eval/stats.h"
#include "polykv/model/llama.h"
#include "polykv/status.h"

namespace polykv::eval {

/// One scoring window (see the file comment).
struct Window {
  int64_t start = 0;             ///< index of t_0 in the text's tokens
  std::vector<int32_t> context;  ///< t_0 .. t_{C-1}
  std::vector<int32_t> input;    ///< t_C .. t_{L-1}
  std::vector<int32_t> targets;  ///< t_{C+1} .. t_L
};

/// `count` consecutive non-overlapping windows of L + 1 tokens from token `offset` on.
/// kInvalidArgument when the text is too short (naming how many tokens are needed) or
/// scored is outside [1, L - 1].
[[nodiscard]] StatusOr<std::vector<Window>> MakeWindows(const std::vector<int32_t>& ids,
                                                        int64_t context_length, int64_t scored,
                                                        int count, int64_t offset = 0);

/// Relative MSE sum |x_hat - x|^2 / sum |x|^2 of one layer's keys and values.
struct LayerError {
  double key_rel_mse = 0;
  double value_rel_mse = 0;
};

/// Takes one layer's K and V (f32 [kv_heads][tokens][head_dim], contiguous) through `spec` at
/// layer `layer` of `layers` with the codec kernels, writing the reconstructions. Keys with
/// < 8 bits use scale = absmax / (2^(b-1) - 1); f16 norms are rounded between encode and
/// decode; "norot" quantizes sqrt(d) v / ||v|| with the same codebook without rotation.
[[nodiscard]] Status RoundTripLayer(const CodecSpec& spec, int layer, int layers, const float* k,
                                    const float* v, const kernels::LayerShape& shape, float* k_out,
                                    float* v_out, LayerError* err = nullptr);

/// Scores windows with a model: prefill once per window, then one scoring pass per codec.
class WindowScorer {
 public:
  /// `rows`: query rows per forward while scoring (bounds the logits' memory).
  explicit WindowScorer(model::LlamaModel& m, int64_t rows = 512) : m_(m), rows_(rows) {}
  /// Prefills the window's context (full precision).
  [[nodiscard]] Status Prepare(const Window& w);
  /// Mean NLL (nats per scored token) of the prepared window with the context's K/V taken
  /// through `spec` ("none": unchanged). Per-layer errors go to `errors` when non-null.
  [[nodiscard]] StatusOr<double> MeanNll(const CodecSpec& spec,
                                         std::vector<LayerError>* errors = nullptr);
  /// Wall seconds of the last Prepare / MeanNll.
  double prepare_s() const { return prepare_s_; }
  double score_s() const { return score_s_; }

 private:
  model::LlamaModel& m_;
  int64_t rows_;
  const Window* w_ = nullptr;
  model::PrefillResult pre_;
  double prepare_s_ = 0, score_s_ = 0;
};

/// One row of the PPL-vs-context table.
struct PplRow {
  std::string codec;       ///< as given
  std::string spec;        ///< canonical spec
  int64_t context = 0;     ///< L
  int64_t compressed = 0;  ///< C
  int64_t scored = 0;      ///< S per window
  int windows = 0;
  double ppl_full = 0;  ///< exp(mean NLL) over all scored tokens, baseline
  double ppl_codec = 0;
  PercentChange change;  ///< paired, 95%
  PoolSize size;         ///< pool of the compressed context (C tokens)
  std::vector<double> window_nll_full, window_nll_codec;
};

/// Options of PplVsContext.
struct PplOptions {
  std::vector<int64_t> contexts = {600, 1851, 2048, 4096, 7194};
  double score_fraction = 0.5;  ///< S = round(L * fraction)
  int windows = 8;
  int64_t offset = 0;
  /// Progress lines ("context 2048 window 3/8 ...").
  std::function<void(const std::string&)> log;
};

/// The PPL-vs-context table for `codecs` (the baseline is always scored): one row per
/// (context, codec). Contexts above the model's max_positions are skipped (logged).
[[nodiscard]] StatusOr<std::vector<PplRow>> PplVsContext(model::LlamaModel& m,
                                                         const std::vector<int32_t>& ids,
                                                         const std::vector<CodecSpec>& codecs,
                                                         const PplOptions& o);

/// Per-layer reconstruction error of `spec` for a real prefill of `context` (the model's K/V
/// of those tokens).
[[nodiscard]] StatusOr<std::vector<LayerError>> LayerErrors(model::LlamaModel& m,
                                                            const std::vector<int32_t>& context,
                                                            const CodecSpec& spec);

/// CSV of PPL rows; the header line is kPplCsvHeader.
inline constexpr char kPplCsvHeader[] =
    "section,codec,spec,context,compressed,scored,windows,ppl_full,ppl_codec,change_pct,"
    "ci95_lo_pct,ci95_hi_pct,bits_per_value,effective_ratio,pool_bytes";
std::string PplCsv(const std::vector<PplRow>& rows, const std::string& section = "ppl_vs_context");
/// Markdown table of PPL rows.
std::string PplMarkdown(const std::vector<PplRow>& rows);

}  // namespace polykv::eval
