// Codec configurations, named by short spec strings: what `pools create --codec` and
// `polykv-cli eval --codecs` take.
//
// Grammar: a preset name, or tokens joined by '-':
//   k<bits><t|h|c>   keys: int<bits> (4..8) with one scale per tensor, KV head or channel
//   v<bits>          values: TurboQuant-MSE at <bits> (2..4)
//   e<bits>[x<n>]    the first n and last n layers' values at <bits> (boundary layers; n = 1)
//   nc               norm correction (store ||v|| / ||u_hat||)
//   n16              value norms stored as f16 instead of f32
//   norot            no random signs / Walsh-Hadamard rotation (ablation only)
//   s<hex>           rotation seed
// Presets: "none" (full precision, the baseline), "paper" = k8t-v3 (PolyKV's exact
// configuration: int8 keys, one scale per tensor, 3-bit values, f32 norms), "k8v2", "k8v3",
// "k8v4" (the pool codecs of `pools create --codec`, per-tensor key scale), and "default"
// (kDefaultCodecSpec).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "polykv/kernels/codec.h"
#include "polykv/status.h"

namespace polykv::ipc {

struct PoolParams;  // pool_layout.h

/// The default codec of host pools and of the eval, chosen from the measured Pareto table
/// (README, "Choosing the default codec"; SmolLM2-135M, 2K setting, 20 windows: +0.46%
/// [+0.31%, +0.61%] at 5.25 bits per value, 3.05x): 7-bit keys with one scale per channel,
/// 3-bit values with the first and last three layers at 4 bits, norm correction, f16 norms.
inline constexpr char kDefaultCodecSpec[] = "k7c-v3-e4x3-nc-n16";

/// One key scale granularity's names: the flag word ("tensor" | "head" | "channel": `pools
/// create --key-scale`, CREATE_POOL's key_scale, `codec roundtrip --key-scale`, `eval
/// --ablate-key-scale`) and the spec letter of k<bits><t|h|c>.
struct KeyScaleName {
  kernels::KeyScaleMode mode;
  const char* name;
  char letter;
};
/// The one table of key scale names.
inline constexpr KeyScaleName kKeyScaleNames[] = {
    {kernels::KeyScaleMode::kPerTensor, "tensor", 't'},
    {kernels::KeyScaleMode::kPerHead, "head", 'h'},
    {kernels::KeyScaleMode::kPerChannel, "channel", 'c'},
};

/// The mode whose flag word is `name`; nullopt for any other (callers say which flag held it).
inline std::optional<kernels::KeyScaleMode> ParseKeyScaleName(std::string_view name) {
  for (const KeyScaleName& n : kKeyScaleNames) {
    if (n.name == name) return n.mode;
  }
  return std::nullopt;
}

struct CodecSpec {
  std::string name;  ///< as given (preset or spec)
  bool none = false;
  int key_bits = 8;
  kernels::KeyScaleMode key_scale = kernels::KeyScaleMode::kPerTensor;
  int value_bits = 3;
  int edge_value_bits = 0;  ///< 0: boundary layers like the others
  int edge_layers = 1;
  bool norm_correction = false;
  bool f16_norms = false;
  bool rotation = true;
  uint64_t seed = kernels::CodecConfig{}.rotation_seed;

  /// Value bits of layer `layer` of `layers`.
  int ValueBitsOf(int layer, int layers) const;
  /// Canonical spec string (e.g. "k8t-v3"); "none" for full precision.
  std::string Canonical() const;
  /// The kernels codec config of layer `layer` (value_bits, key_scale, seed, correction).
  kernels::CodecConfig LayerConfig(int layer, int layers) const;
};

/// Parses a preset or spec (see the file comment). kInvalidArgument naming the bad token.
[[nodiscard]] StatusOr<CodecSpec> ParseCodecSpec(const std::string& text);

/// Parses a comma-separated list of specs.
[[nodiscard]] StatusOr<std::vector<CodecSpec>> ParseCodecList(const std::string& text);

/// Exact bytes of a pool holding `tokens` tokens with `spec` (the pool layout of
/// ipc/pool_layout.h: 4096-byte header, int32 token ids, every section 256-byte aligned;
/// keys of < 8 bits packed densely per vector, norms 2 or 4 bytes), and derived figures.
struct PoolSize {
  int64_t bytes = 0;          ///< whole pool, header and token ids included
  int64_t payload_bytes = 0;  ///< K/V codes, scales and norms only
  int64_t bf16_bytes = 0;     ///< the same KV cache in bf16
  double bits_per_value = 0;  ///< 8 * bytes / (2 * layers * kv_heads * tokens * head_dim)
  double ratio = 0;           ///< bf16_bytes / bytes (effective ratio)
};
PoolSize PoolSizeOf(const CodecSpec& spec, int layers, int kv_heads, int head_dim, int64_t tokens);

/// The pool parameters of `spec` for a model of `layers` layers: codec, codec_config (key
/// bits, value bits, key scale, rotation seed, norm correction, norm dtype) and per-layer
/// value bits (boundary layers). Errors: kInvalidArgument for "norot" (an eval ablation;
/// pools always rotate) or boundary layers on a model of more than kPoolFidelityLayers
/// layers.
[[nodiscard]] Status ApplyCodecSpec(const CodecSpec& spec, uint32_t layers, PoolParams* params);

/// The spec a pool's parameters describe (the inverse of ApplyCodecSpec).
CodecSpec CodecSpecOf(const PoolParams& params);

/// The label a pool's codec is shown and matched by: "none", "k8v2" / "k8v3" / "k8v4" for
/// int8 keys with f32 norms and one value width (any key scale; the names pools had before
/// specs), else the canonical spec (e.g. "k7c-v3-e4x3-nc-n16").
std::string PoolCodecLabel(const PoolParams& params);

}  // namespace polykv::ipc
