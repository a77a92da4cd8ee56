// `polykv-cli codec roundtrip`: encodes a tensor file as K (int8) and as V (TurboQuant-MSE),
// decodes both and prints sizes, compression ratio and reconstruction errors.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "commands.h"
#include "polykv/ipc/codec_spec.h"
#include "polykv/kernels/codec.h"
#include "polykv/kernels/codec_math.h"
#include "util/files.h"

namespace polykv::cli {
namespace {

namespace k = ::polykv::kernels;

struct RoundtripOptions {
  std::string shape;  // "H,T,D"
  std::string dtype = "bf16";
  int k_bits = 8;
  int v_bits = 3;
  std::string key_scale = "tensor";
  uint64_t seed = k::CodecConfig{}.rotation_seed;
  bool norm_correction = false;
  std::string out;
  std::string file;
};

bool ParseShape(const std::string& s, k::LayerShape* shape, std::string* err) {
  long long v[3];
  char tail;
  if (std::sscanf(s.c_str(), "%lld,%lld,%lld%c", &v[0], &v[1], &v[2], &tail) != 3) {
    *err = "--shape must be H,T,D (three positive integers), got '" + s + "'";
    return false;
  }
  if (v[0] < 1 || v[1] < 1 || v[2] < 1 || v[0] > (1 << 20) || v[2] > (1 << 20)) {
    *err = "--shape entries must be >= 1 (and sane), got '" + s + "'";
    return false;
  }
  shape->kv_heads = static_cast<int32_t>(v[0]);
  shape->tokens = v[1];
  shape->head_dim = static_cast<int32_t>(v[2]);
  return true;
}

// Parses a .npy header (format 1.0, 2.0 or 3.0) and returns the payload offset. Checks the
// dtype descr against `dtype` (f32 '<f4', f16 '<f2', bf16 raw bits as '<u2', '<i2', '|V2'
// or 'bfloat16'), C order, and a shape equal to [H, T, D].
bool ParseNpy(const std::string& data, k::DType dtype, const k::LayerShape& shape, size_t* payload,
              std::string* err) {
  if (data.size() < 10 || data.compare(0, 6, "\x93NUMPY") != 0) {
    *err = "not a .npy file";
    return false;
  }
  const int major = static_cast<unsigned char>(data[6]);
  size_t header_len = 0, start = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(data[8]) | (static_cast<unsigned char>(data[9]) << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (data.size() < 12) {
      *err = ".npy header truncated";
      return false;
    }
    for (int i = 0; i < 4; ++i)
      header_len |= size_t{static_cast<unsigned char>(data[8 + i])} << (8 * i);
    start = 12;
  } else {
    *err = "unsupported .npy format version " + std::to_string(major);
    return false;
  }
  if (start + header_len > data.size()) {
    *err = ".npy header length " + std::to_string(header_len) + " exceeds the file";
    return false;
  }
  const std::string h = data.substr(start, header_len);
  auto value_of = [&](const std::string& key) -> std::string {
    const size_t p = h.find("'" + key + "'");
    if (p == std::string::npos) return "";
    size_t c = h.find(':', p);
    if (c == std::string::npos) return "";
    ++c;
    while (c < h.size() && h[c] == ' ') ++c;
    if (c < h.size() && h[c] == '(') return h.substr(c, h.find(')', c) - c + 1);
    if (c < h.size() && (h[c] == '\'' || h[c] == '"')) {
      const size_t e = h.find(h[c], c + 1);
      return h.substr(c + 1, e - c - 1);
    }
    size_t e = c;
    while (e < h.size() && h[e] != ',' && h[e] != '}') ++e;
    return h.substr(c, e - c);
  };
  const std::string descr = value_of("descr");
  const std::string fortran = value_of("fortran_order");
  const std::string shp = value_of("shape");
  bool descr_ok = false;
  switch (dtype) {
    case k::DType::kF32:
      descr_ok = descr == "<f4";
      break;
    case k::DType::kF16:
      descr_ok = descr == "<f2";
      break;
    case k::DType::kBF16:
      descr_ok = descr == "<u2" || descr == "<i2" || descr == "|V2" || descr == "bfloat16";
      break;
  }
  if (!descr_ok) {
    *err = ".npy dtype '" + descr + "' does not match --dtype";
    return false;
  }
  if (fortran != "False") {
    *err = ".npy file must be C-ordered (fortran_order False), got '" + fortran + "'";
    return false;
  }
  std::vector<long long> dims;
  for (size_t i = 0; i < shp.size();) {
    if (std::isdigit(static_cast<unsigned char>(shp[i]))) {
      size_t e = i;
      while (e < shp.size() && std::isdigit(static_cast<unsigned char>(shp[e]))) ++e;
      dims.push_back(std::stoll(shp.substr(i, e - i)));
      i = e;
    } else {
      ++i;
    }
  }
  const std::vector<long long> want = {shape.kv_heads, shape.tokens, shape.head_dim};
  if (dims != want) {
    *err = ".npy shape " + shp + " does not match --shape (" + std::to_string(want[0]) + ", " +
           std::to_string(want[1]) + ", " + std::to_string(want[2]) + ")";
    return false;
  }
  *payload = start + header_len;
  return true;
}

// Elementwise error statistics of `approx` against `exact` (both f32).
struct ErrorStats {
  double max_abs = 0;
  double rel_mse = 0;
};

ErrorStats Compare(const std::vector<float>& approx, const std::vector<float>& exact) {
  ErrorStats s;
  double num = 0, den = 0;
  for (size_t i = 0; i < exact.size(); ++i) {
    const double e = double{approx[i]} - double{exact[i]};
    s.max_abs = std::max(s.max_abs, std::fabs(e));
    num += e * e;
    den += double{exact[i]} * double{exact[i]};
  }
  s.rel_mse = den > 0 ? num / den : (num > 0 ? INFINITY : 0.0);
  return s;
}

Status RunRoundtrip(const RoundtripOptions& o) {
  k::LayerShape shape;
  std::string err;
  if (!ParseShape(o.shape, &shape, &err)) return absl::InvalidArgumentError(err);
  k::DType dtype;
  if (o.dtype == "f32") {
    dtype = k::DType::kF32;
  } else if (o.dtype == "f16") {
    dtype = k::DType::kF16;
  } else if (o.dtype == "bf16") {
    dtype = k::DType::kBF16;
  } else {
    return absl::InvalidArgumentError("--dtype must be bf16, f16 or f32, got '" + o.dtype + "'");
  }
  // The round trip measures int8 keys (QuantizeKeys); packed 4..7-bit keys are measured by
  // `polykv-cli eval` (k<bits><t|h|c> specs).
  if (o.k_bits != 8)
    return absl::InvalidArgumentError(
        "--k-bits: key_bits must be 8 for codec roundtrip, got " + std::to_string(o.k_bits) +
        " (packed 4..7-bit keys: polykv-cli eval --codecs k<bits>c-v3)");
  k::CodecConfig cfg;
  cfg.key_bits = o.k_bits;
  cfg.value_bits = o.v_bits;
  cfg.rotation_seed = o.seed;
  cfg.norm_correction = o.norm_correction;
  std::optional<k::KeyScaleMode> key_scale = ipc::ParseKeyScaleName(o.key_scale);
  if (!key_scale) {
    return absl::InvalidArgumentError("--key-scale must be tensor, head or channel, got '" +
                                      o.key_scale + "'");
  }
  cfg.key_scale = *key_scale;
  POLYKV_RETURN_IF_ERROR(k::ValidateConfig(shape, cfg));

  POLYKV_ASSIGN_OR_RETURN(const std::string data, ReadFile(o.file));
  size_t payload = 0;
  const bool npy = data.size() >= 6 && data.compare(0, 6, "\x93NUMPY") == 0;
  if (npy && !ParseNpy(data, dtype, shape, &payload, &err)) {
    return absl::InvalidArgumentError(o.file + ": " + err);
  }
  const size_t es = k::DTypeSize(dtype);
  const size_t want = static_cast<size_t>(shape.elements()) * es;
  const size_t have = data.size() - payload;
  if (have != want) {
    return absl::InvalidArgumentError(o.file + ": " + std::to_string(have) +
                                      " bytes of data, but shape " + o.shape + " x " + o.dtype +
                                      " needs " + std::to_string(want) +
                                      (have < want ? " (file too small)" : " (file too large)"));
  }
  // The exact input values as f32 (little-endian host assumed, as the file is).
  std::vector<float> x(shape.elements());
  std::vector<uint8_t> raw(data.begin() + payload, data.end());
  for (int64_t i = 0; i < shape.elements(); ++i) {
    x[i] = k::math::LoadF32(raw.data(), static_cast<int>(dtype), i);
  }

  // K: int8.
  std::vector<int8_t> q(shape.elements());
  std::vector<float> scales(k::KeyScaleCount(shape, cfg.key_scale));
  POLYKV_RETURN_IF_ERROR(
      k::QuantizeKeys(raw.data(), dtype, shape, cfg.key_scale, q.data(), scales.data()));
  std::vector<float> k_hat(shape.elements());
  POLYKV_RETURN_IF_ERROR(k::DequantizeKeys(q.data(), scales.data(), shape, cfg.key_scale,
                                           k_hat.data(), k::DType::kF32));
  // V: TurboQuant-MSE.
  std::vector<uint8_t> packed(shape.vectors() *
                              k::PackedVectorBytes(shape.head_dim, cfg.value_bits));
  std::vector<float> norms(shape.vectors());
  POLYKV_RETURN_IF_ERROR(
      k::EncodeValues(raw.data(), dtype, shape, cfg, packed.data(), norms.data()));
  std::vector<float> v_hat(shape.elements());
  POLYKV_RETURN_IF_ERROR(
      k::DecodeValues(packed.data(), norms.data(), shape, cfg, v_hat.data(), k::DType::kF32));
  std::set<int> used;
  std::vector<uint8_t> codes(shape.head_dim);
  const int64_t vb = k::PackedVectorBytes(shape.head_dim, cfg.value_bits);
  for (int64_t v = 0; v < shape.vectors(); ++v) {
    k::math::UnpackCodes(packed.data() + v * vb, shape.head_dim, cfg.value_bits, codes.data());
    used.insert(codes.begin(), codes.end());
  }

  const k::LayerBytes lb = k::CompressedLayerBytes(shape, cfg);
  const int64_t k_bytes = lb.key_codes + lb.key_scales;
  const int64_t v_bytes = lb.value_codes + lb.value_norms;
  const ErrorStats ke = Compare(k_hat, x), ve = Compare(v_hat, x);
  std::printf("input: %s (%s), shape [%d][%lld][%d], dtype %s\n", o.file.c_str(),
              npy ? "npy" : "raw", shape.kv_heads, static_cast<long long>(shape.tokens),
              shape.head_dim, o.dtype.c_str());
  std::printf("original_bytes: %zu\n", want);
  std::printf("k_bytes: %lld (int8 codes %lld + f32 scales %lld)\n",
              static_cast<long long>(k_bytes), static_cast<long long>(lb.key_codes),
              static_cast<long long>(lb.key_scales));
  std::printf("v_bytes: %lld (%d-bit codes %lld + f32 norms %lld)\n",
              static_cast<long long>(v_bytes), cfg.value_bits,
              static_cast<long long>(lb.value_codes), static_cast<long long>(lb.value_norms));
  std::printf("ratio: %.4f (original as both K and V / (k_bytes + v_bytes))\n",
              2.0 * static_cast<double>(want) / static_cast<double>(k_bytes + v_bytes));
  std::printf("k_max_abs_error: %.6g\n", ke.max_abs);
  std::printf("k_rel_mse: %.6g\n", ke.rel_mse);
  std::printf("v_max_abs_error: %.6g\n", ve.max_abs);
  std::printf("v_rel_mse: %.6g\n", ve.rel_mse);
  std::printf("v_codes_used: %zu/%d\n", used.size(), 1 << cfg.value_bits);

  if (!o.out.empty()) {
    std::vector<uint8_t> out(want);
    POLYKV_RETURN_IF_ERROR(
        k::DecodeValues(packed.data(), norms.data(), shape, cfg, out.data(), dtype));
    POLYKV_RETURN_IF_ERROR(
        WriteFile(o.out, std::string_view(reinterpret_cast<const char*>(out.data()), out.size())));
    std::printf("out: %s (decoded V, raw little-endian %s, %zu bytes)\n", o.out.c_str(),
                o.dtype.c_str(), out.size());
  }
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace

void RegisterCodecCommands(CLI::App& app) {
  CLI::App* codec =
      app.add_subcommand("codec", "Check the KV codec on a tensor file (local, no daemon)");
  codec->require_subcommand(1);
  auto o = std::make_shared<RoundtripOptions>();
  CLI::App* rt = codec->add_subcommand(
      "roundtrip",
      "Encode+decode FILE (raw little-endian or .npy, [H][T][D]) as K (int8) and as V "
      "(TurboQuant-MSE); print bytes, ratio, max abs error, relative MSE, V codes used");
  rt->add_option("--shape", o->shape, "H,T,D: KV heads, tokens, head_dim")->required();
  rt->add_option("--dtype", o->dtype, "bf16 | f16 | f32 (element type of FILE)");
  rt->add_option("--k-bits", o->k_bits, "key bits (only 8)");
  rt->add_option("--v-bits", o->v_bits, "value bits: 2, 3 or 4");
  rt->add_option("--key-scale", o->key_scale, "tensor | head | channel");
  rt->add_option("--seed", o->seed, "rotation seed of the random signs");
  rt->add_flag("--norm-correction", o->norm_correction, "store ||v|| / ||reconstruction||");
  rt->add_option("--out", o->out, "write the decoded V tensor here (raw, same dtype)");
  rt->add_option("file", o->file, "input tensor file")->required();
  rt->callback([o] {
    if (Status s = RunRoundtrip(*o); !s.ok()) FailWith(s);
  });
}

}  // namespace polykv::cli
