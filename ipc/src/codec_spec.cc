// Codec spec strings, their pool parameters and their exact pool sizes.
#include "polykv/ipc/codec_spec.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "polykv/ipc/pool_layout.h"

namespace polykv::ipc {
namespace {

int64_t Align(int64_t x) { return (x + 255) / 256 * 256; }

}  // namespace

int CodecSpec::ValueBitsOf(int layer, int layers) const {
  if (edge_value_bits > 0 && (layer < edge_layers || layer >= layers - edge_layers))
    return edge_value_bits;
  return value_bits;
}

std::string CodecSpec::Canonical() const {
  if (none) return "none";
  char scale = '?';
  for (const KeyScaleName& n : kKeyScaleNames) {
    if (n.mode == key_scale) scale = n.letter;
  }
  std::string s = absl::StrCat("k", key_bits, std::string(1, scale), "-v", value_bits);
  if (edge_value_bits > 0) {
    absl::StrAppend(&s, "-e", edge_value_bits);
    if (edge_layers != 1) absl::StrAppend(&s, "x", edge_layers);
  }
  if (norm_correction) s += "-nc";
  if (f16_norms) s += "-n16";
  if (!rotation) s += "-norot";
  if (seed != kernels::CodecConfig{}.rotation_seed) absl::StrAppend(&s, "-s", absl::Hex(seed));
  return s;
}

kernels::CodecConfig CodecSpec::LayerConfig(int layer, int layers) const {
  kernels::CodecConfig c;
  c.key_bits = key_bits;
  c.value_bits = ValueBitsOf(layer, layers);
  c.key_scale = key_scale;
  c.norm_dtype = f16_norms ? kernels::DType::kF16 : kernels::DType::kF32;
  c.rotation_seed = seed;
  c.norm_correction = norm_correction;
  return c;
}

StatusOr<CodecSpec> ParseCodecSpec(const std::string& text) {
  CodecSpec s;
  s.name = text;
  std::string body = text;
  if (text == "none" || text == "full") {
    s.none = true;
    return s;
  }
  if (text == "paper" || text == "k8v3")
    body = "k8t-v3";
  else if (text == "k8v2")
    body = "k8t-v2";
  else if (text == "k8v4")
    body = "k8t-v4";
  else if (text == "default")
    body = kDefaultCodecSpec;
  bool have_k = false, have_v = false;
  for (absl::string_view tok : absl::StrSplit(body, '-')) {
    auto bad = [&](const char* why) {
      return absl::InvalidArgumentError(
          absl::StrCat("codec '", text, "': token '", tok, "' ", why,
                       " (grammar: k<4..8><t|h|c>-v<2..4>[-e<bits>[x<n>]][-nc][-n16][-norot]"
                       "[-s<hex>], or none, paper, default, k8v2, k8v3, k8v4)"));
    };
    int v = 0;
    if (tok == "nc") {
      s.norm_correction = true;
    } else if (tok == "n16") {
      s.f16_norms = true;
    } else if (tok == "norot") {
      s.rotation = false;
    } else if (tok.size() >= 3 && tok[0] == 'k') {
      if (!absl::SimpleAtoi(tok.substr(1, tok.size() - 2), &v) || v < 4 || v > 8)
        return bad("needs key bits 4..8");
      s.key_bits = v;
      const KeyScaleName* scale = nullptr;
      for (const KeyScaleName& n : kKeyScaleNames) {
        if (n.letter == tok.back()) scale = &n;
      }
      if (scale == nullptr) return bad("needs a key scale t, h or c");
      s.key_scale = scale->mode;
      have_k = true;
    } else if (tok.size() == 2 && tok[0] == 'v') {
      if (!absl::SimpleAtoi(tok.substr(1), &v) || v < 2 || v > 4)
        return bad("needs value bits 2..4");
      s.value_bits = v;
      have_v = true;
    } else if (tok.size() >= 2 && tok[0] == 'e') {
      std::vector<std::string> parts = absl::StrSplit(tok.substr(1), 'x');
      if (!absl::SimpleAtoi(parts[0], &v) || v < 2 || v > 4) return bad("needs boundary bits 2..4");
      s.edge_value_bits = v;
      if (parts.size() == 2) {
        if (!absl::SimpleAtoi(parts[1], &v) || v < 1) return bad("needs a layer count >= 1");
        s.edge_layers = v;
      } else if (parts.size() > 2) {
        return bad("is malformed");
      }
    } else if (tok.size() >= 2 && tok[0] == 's') {
      uint64_t seed = 0;
      if (!absl::SimpleHexAtoi(tok.substr(1), &seed)) return bad("needs a hex seed");
      s.seed = seed;
    } else {
      return bad("is unknown");
    }
  }
  if (!have_k || !have_v)
    return absl::InvalidArgumentError(absl::StrCat(
        "codec '", text, "': needs a key token (k8t, k8c, ...) and a value token (v3)"));
  return s;
}

StatusOr<std::vector<CodecSpec>> ParseCodecList(const std::string& text) {
  std::vector<CodecSpec> out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    POLYKV_ASSIGN_OR_RETURN(CodecSpec s, ParseCodecSpec(std::string(item)));
    out.push_back(std::move(s));
  }
  if (out.empty()) return absl::InvalidArgumentError("no codec given");
  return out;
}

PoolSize PoolSizeOf(const CodecSpec& spec, int layers, int kv_heads, int head_dim, int64_t tokens) {
  PoolSize r;
  const int64_t vectors = int64_t{kv_heads} * tokens;
  const int64_t elements = vectors * head_dim;
  int64_t total = Align(4096) + Align(4 * tokens);
  for (int l = 0; l < layers; ++l) {
    int64_t payload = 0;
    if (spec.none) {
      // Codec none stores f32 here (the eval's raw prefix); a bf16 pool would be half.
      payload = 2 * 4 * elements;
      total += 2 * Align(4 * elements);
    } else {
      const int64_t kcodes = vectors * ((int64_t{head_dim} * spec.key_bits + 7) / 8);
      const int64_t kscales =
          4 * kernels::KeyScaleCount({kv_heads, tokens, head_dim}, spec.key_scale);
      const int64_t vcodes =
          vectors * kernels::PackedVectorBytes(head_dim, spec.ValueBitsOf(l, layers));
      const int64_t norms = (spec.f16_norms ? 2 : 4) * vectors;
      payload = kcodes + kscales + vcodes + norms;
      total += Align(kcodes) + Align(kscales) + Align(vcodes) + Align(norms);
    }
    r.payload_bytes += payload;
  }
  r.bytes = total;
  r.bf16_bytes = int64_t{layers} * 2 * 2 * elements;
  r.bits_per_value = 8.0 * static_cast<double>(r.bytes) / (2.0 * layers * elements);
  r.ratio = static_cast<double>(r.bf16_bytes) / static_cast<double>(r.bytes);
  return r;
}

Status ApplyCodecSpec(const CodecSpec& spec, uint32_t layers, PoolParams* p) {
  if (spec.none) {
    p->codec = PoolCodec::kNone;
    p->layer_value_bits.clear();
    return absl::OkStatus();
  }
  if (!spec.rotation) {
    return absl::InvalidArgumentError(absl::StrCat(
        "codec '", spec.name, "': pools always rotate values (norot is an eval ablation)"));
  }
  p->codec = PoolCodec::kK8V;
  kernels::CodecConfig& c = p->codec_config;
  c.key_bits = spec.key_bits;
  c.value_bits = spec.value_bits;
  c.key_scale = spec.key_scale;
  c.rotation_seed = spec.seed;
  c.norm_correction = spec.norm_correction;
  c.norm_dtype = spec.f16_norms ? kernels::DType::kF16 : kernels::DType::kF32;
  p->layer_value_bits.clear();
  if (spec.edge_value_bits > 0 && spec.edge_value_bits != spec.value_bits) {
    if (layers > kPoolFidelityLayers) {
      return absl::InvalidArgumentError(
          absl::StrCat("codec '", spec.name, "': boundary-layer bits need at most ",
                       kPoolFidelityLayers, " layers, the model has ", layers));
    }
    for (uint32_t l = 0; l < layers; ++l) {
      p->layer_value_bits.push_back(
          spec.ValueBitsOf(static_cast<int>(l), static_cast<int>(layers)));
    }
  }
  return absl::OkStatus();
}

CodecSpec CodecSpecOf(const PoolParams& p) {
  CodecSpec s;
  if (p.codec == PoolCodec::kNone) {
    s.none = true;
    s.name = "none";
    return s;
  }
  const kernels::CodecConfig& c = p.codec_config;
  s.key_bits = c.key_bits;
  s.key_scale = c.key_scale;
  s.value_bits = c.value_bits;
  s.seed = c.rotation_seed;
  s.norm_correction = c.norm_correction;
  s.f16_norms = c.norm_dtype == kernels::DType::kF16;
  // Boundary layers: the first n and last n layers at one other width.
  const int layers = static_cast<int>(p.layer_value_bits.size());
  if (layers > 0) {
    int n = 0;  // the leading run (boundary regions that overlap cover every layer)
    while (n < layers && p.ValueBitsOf(n) != c.value_bits) ++n;
    if (n > 0) {
      s.edge_value_bits = p.ValueBitsOf(0);
      s.edge_layers = n;
    }
  }
  s.name = s.Canonical();
  return s;
}

std::string PoolCodecLabel(const PoolParams& p) {
  if (p.codec == PoolCodec::kNone) return "none";
  const kernels::CodecConfig& c = p.codec_config;
  bool one_width = true;
  for (uint32_t l = 0; l < p.layer_value_bits.size(); ++l)
    one_width &= p.ValueBitsOf(l) == c.value_bits;
  if (c.key_bits == 8 && c.norm_dtype == kernels::DType::kF32 && one_width &&
      c.rotation_seed == kernels::CodecConfig{}.rotation_seed) {
    return absl::StrCat("k8v", c.value_bits);
  }
  return CodecSpecOf(p).Canonical();
}

}  // namespace polykv::ipc
