// The pool format: layout computation, PoolWriter (encode into a region) and PoolReader
// (validate and decode a published region). See pool_layout.h for the diagram.
#include "polykv/ipc/pool_layout.h"

#include <xxhash.h>

#include <cstring>
#include <limits>
#include <memory>
#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "device_memory.h"
#include "polykv/ipc/cuda_ipc.h"
#include "polykv/kernels/dtype_convert.h"

namespace polykv::ipc {
namespace {

using kernels::Device;
using kernels::DType;

constexpr uint64_t AlignUp(uint64_t x) {
  return (x + kPoolSectionAlign - 1) / kPoolSectionAlign * kPoolSectionAlign;
}

kernels::LayerShape ShapeOf(const PoolParams& p) {
  kernels::LayerShape s;
  s.kv_heads = static_cast<int32_t>(p.kv_heads);
  s.tokens = static_cast<int64_t>(p.tokens);
  s.head_dim = static_cast<int32_t>(p.head_dim);
  return s;
}

// ---- dtype conversion for PoolCodec::kNone (host only; kernels/dtype_convert.h) ----

using kernels::dtype::Bf16ToFloat;
using kernels::dtype::F16ToFloat;
using kernels::dtype::FloatToBf16;
using kernels::dtype::FloatToF16;

float LoadAsF32(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kF16:
      return F16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kBF16:
      return Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
  }
  return 0;
}
void StoreF32(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::kF16:
      static_cast<uint16_t*>(p)[i] = FloatToF16(v);
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(p)[i] = FloatToBf16(v);
      break;
  }
}

// Copies `elements` from src (src_t) to dst (dst_t), on the host or within one device.
Status CopyConvert(void* dst, DType dst_t, const void* src, DType src_t, int64_t elements,
                   Device device, kernels::Stream stream) {
  const uint64_t bytes = static_cast<uint64_t>(elements) * kernels::DTypeSize(src_t);
  if (device == Device::kCuda) {
    if (dst_t != src_t) {
      return absl::UnimplementedError(
          "dtype conversion of raw (codec none) pools is not implemented on CUDA");
    }
    return internal::CopyDeviceToDevice(dst, src, bytes, stream);
  }
  if (dst_t == src_t) {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  for (int64_t i = 0; i < elements; ++i) StoreF32(dst, dst_t, i, LoadAsF32(src, src_t, i));
  return absl::OkStatus();
}

Status CopyIn(void* dst, const void* host_src, uint64_t bytes, Device device) {
  if (device == Device::kCuda) return internal::CopyToDevice(dst, host_src, bytes);
  std::memcpy(dst, host_src, bytes);
  return absl::OkStatus();
}

Status CopyOut(void* host_dst, const void* src, uint64_t bytes, Device device) {
  if (device == Device::kCuda) return internal::CopyToHost(host_dst, src, bytes);
  std::memcpy(host_dst, src, bytes);
  return absl::OkStatus();
}

// XXH64 of [data, data+bytes), streaming through a host buffer for device memory.
StatusOr<uint64_t> ChecksumRange(const uint8_t* data, uint64_t bytes, Device device) {
  if (device == Device::kCpu) return Checksum64(data, bytes);
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> state(XXH64_createState(),
                                                                   &XXH64_freeState);
  if (!state) return absl::ResourceExhaustedError("XXH64_createState failed");
  XXH64_reset(state.get(), 0);
  constexpr uint64_t kChunk = 16u << 20;
  std::vector<uint8_t> buf(std::min<uint64_t>(kChunk, bytes));
  for (uint64_t off = 0; off < bytes; off += kChunk) {
    uint64_t n = std::min(kChunk, bytes - off);
    POLYKV_RETURN_IF_ERROR(internal::CopyToHost(buf.data(), data + off, n));
    XXH64_update(state.get(), buf.data(), n);
  }
  return XXH64_digest(state.get());
}

uint64_t HeaderChecksum(const PoolHeader& h) {
  PoolHeader copy = h;
  copy.header_checksum = 0;
  return Checksum64(&copy, sizeof(copy));
}

Status CheckLayerArgs(uint32_t layer, uint32_t layers) {
  if (layer >= layers) {
    return absl::OutOfRangeError(absl::StrCat("layer ", layer, " out of range [0, ", layers, ")"));
  }
  return absl::OkStatus();
}

// f32 value norms of one layer where the codec runs: host memory, or a CUDA allocation whose
// cudaFree (on destruction) waits for the kernels that use it.
class NormScratch {
 public:
  static StatusOr<NormScratch> Make(kernels::Device device, int64_t n) {
    NormScratch s;
    if (device == kernels::Device::kCpu) {
      s.host_.resize(static_cast<size_t>(n));
    } else {
      POLYKV_ASSIGN_OR_RETURN(CudaArena a, CudaArena::Allocate(4 * static_cast<uint64_t>(n)));
      s.device_.emplace(std::move(a));
    }
    return s;
  }
  float* data() { return device_ ? static_cast<float*>(device_->data()) : host_.data(); }

 private:
  std::vector<float> host_;
  std::optional<CudaArena> device_;
};

// Decodes the layer at `lo` of a region (host or device) into K and V of `out_dtype`.
Status DecodeLayerAt(const uint8_t* base, const PoolParams& params, const LayerOffsets& lo,
                     int32_t value_bits, void* k_out, void* v_out, DType out_dtype,
                     kernels::Device device, kernels::Stream stream) {
  const kernels::LayerShape shape = ShapeOf(params);
  if (params.codec == PoolCodec::kNone) {
    POLYKV_RETURN_IF_ERROR(CopyConvert(k_out, out_dtype, base + lo.k, params.raw_dtype,
                                       shape.elements(), device, stream));
    return CopyConvert(v_out, out_dtype, base + lo.v, params.raw_dtype, shape.elements(), device,
                       stream);
  }
  const kernels::CodecConfig& c = params.codec_config;
  if (c.key_bits == 8) {
    POLYKV_RETURN_IF_ERROR(
        kernels::DequantizeKeys(reinterpret_cast<const int8_t*>(base + lo.k),
                                reinterpret_cast<const float*>(base + lo.k_scales), shape,
                                c.key_scale, k_out, out_dtype, device, stream));
  } else {
    POLYKV_RETURN_IF_ERROR(kernels::DecodeKeys(base + lo.k,
                                               reinterpret_cast<const float*>(base + lo.k_scales),
                                               shape, c, k_out, out_dtype, device, stream));
  }
  kernels::CodecConfig vc = c;
  vc.value_bits = value_bits;
  if (c.norm_dtype == DType::kF32) {
    return kernels::DecodeValues(base + lo.v, reinterpret_cast<const float*>(base + lo.v_norms),
                                 shape, vc, v_out, out_dtype, device, stream);
  }
  // f16 norms: widened into an f32 scratch where the codec runs, then decoded.
  POLYKV_ASSIGN_OR_RETURN(NormScratch norms, NormScratch::Make(device, shape.vectors()));
  POLYKV_RETURN_IF_ERROR(kernels::ConvertNorms(base + lo.v_norms, DType::kF16, shape.vectors(),
                                               norms.data(), device, stream));
  return kernels::DecodeValues(base + lo.v, norms.data(), shape, vc, v_out, out_dtype, device,
                               stream);
}

// sum((dec - ref)^2) / sum(ref^2), in double; when ref is all zero: 0 if dec is too, else 1.
double RelativeMse(const float* ref, const float* dec, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double r = ref[i], d = static_cast<double>(dec[i]) - r;
    num += d * d;
    den += r * r;
  }
  if (den > 0) return num / den;
  return num > 0 ? 1.0 : 0.0;
}

// Decodes the host layer at `lo` and measures it against K and V of `dtype` (host memory).
Status MeasureLayerAt(const uint8_t* base, const PoolParams& params, uint32_t layer,
                      const LayerOffsets& lo, const void* k, const void* v, DType dtype,
                      LayerFidelity* out) {
  const int64_t n = ShapeOf(params).elements();
  std::vector<float> kd(static_cast<size_t>(n)), vd(static_cast<size_t>(n));
  POLYKV_RETURN_IF_ERROR(DecodeLayerAt(base, params, lo, params.ValueBitsOf(layer), kd.data(),
                                       vd.data(), DType::kF32, kernels::Device::kCpu, nullptr));
  std::vector<float> kr, vr;
  const float* kf = static_cast<const float*>(k);
  const float* vf = static_cast<const float*>(v);
  if (dtype != DType::kF32) {
    kr.resize(static_cast<size_t>(n));
    vr.resize(static_cast<size_t>(n));
    POLYKV_RETURN_IF_ERROR(
        CopyConvert(kr.data(), DType::kF32, k, dtype, n, kernels::Device::kCpu, nullptr));
    POLYKV_RETURN_IF_ERROR(
        CopyConvert(vr.data(), DType::kF32, v, dtype, n, kernels::Device::kCpu, nullptr));
    kf = kr.data();
    vf = vr.data();
  }
  out->key_rel_mse = RelativeMse(kf, kd.data(), n);
  out->value_rel_mse = RelativeMse(vf, vd.data(), n);
  return absl::OkStatus();
}

}  // namespace

StatusOr<PoolLayout> ComputePoolLayout(const PoolParams& p) {
  if (p.layers < 1) return absl::InvalidArgumentError("pool layers must be >= 1");
  if (p.kv_heads < 1) return absl::InvalidArgumentError("pool kv_heads must be >= 1");
  if (p.head_dim < 1) return absl::InvalidArgumentError("pool head_dim must be >= 1");
  if (p.tokens < 1) return absl::InvalidArgumentError("pool tokens must be >= 1");
  if (p.tokens > (uint64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat("pool tokens ", p.tokens, " exceed 2^31"));
  }
  if (p.layers > 4096 || p.kv_heads > 4096 || p.head_dim > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool shape layers=", p.layers, " kv_heads=", p.kv_heads,
                     " head_dim=", p.head_dim, " is implausibly large"));
  }
  if (p.model_fingerprint.size() >= sizeof(PoolHeader::model_fingerprint) ||
      p.tokenizer_fingerprint.size() >= sizeof(PoolHeader::tokenizer_fingerprint)) {
    return absl::InvalidArgumentError("pool fingerprints must be shorter than 72 chars");
  }
  if (p.architecture.size() >= sizeof(PoolHeader::architecture) ||
      p.tokenizer_family.size() >= sizeof(PoolHeader::tokenizer_family)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool architecture '", p.architecture, "' / tokenizer family '", p.tokenizer_family,
        "' must be shorter than ", sizeof(PoolHeader::architecture), " / ",
        sizeof(PoolHeader::tokenizer_family), " chars"));
  }
  if (p.parent_id.empty() != (p.parent_tokens == 0)) {
    return absl::InvalidArgumentError(absl::StrCat("pool parent id '", p.parent_id,
                                                   "' and parent_tokens ", p.parent_tokens,
                                                   " must be given together"));
  }
  if (!p.parent_id.empty() &&
      (p.parent_id.size() != 64 ||
       p.parent_id.find_first_not_of("0123456789abcdef") != std::string::npos)) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool parent id '", p.parent_id, "' is not 64 lowercase hex chars"));
  }
  if (p.parent_tokens + p.tokens > (uint64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat("pool parent_tokens ", p.parent_tokens,
                                                   " + tokens ", p.tokens, " exceed 2^31"));
  }
  const kernels::LayerShape shape = ShapeOf(p);
  PoolLayout l;
  uint64_t off = kPoolHeaderBytes;
  l.token_ids = off;
  off = AlignUp(off + 4 * p.tokens);
  const uint64_t elements = static_cast<uint64_t>(shape.elements());
  switch (p.codec) {
    case PoolCodec::kNone: {
      if (p.raw_dtype != DType::kF32 && p.raw_dtype != DType::kF16 && p.raw_dtype != DType::kBF16) {
        return absl::InvalidArgumentError("pool raw_dtype must be f32, f16 or bf16");
      }
      const uint64_t raw = elements * kernels::DTypeSize(p.raw_dtype);
      for (uint32_t i = 0; i < p.layers; ++i) {
        LayerOffsets lo;
        lo.k = off;
        off = AlignUp(off + raw);
        lo.v = off;
        off = AlignUp(off + raw);
        lo.k_scales = lo.v_norms = 0;
        lo.end = off;
        l.layer.push_back(lo);
        l.key_codes += raw;
        l.value_codes += raw;
      }
      break;
    }
    case PoolCodec::kK8V: {
      const auto& c = p.codec_config;
      if (c.key_bits < 4 || c.key_bits > 8) {
        return absl::InvalidArgumentError(
            absl::StrCat("codec key_bits must be 4..8, got ", c.key_bits));
      }
      if (c.value_bits < 2 || c.value_bits > 4) {
        return absl::InvalidArgumentError(
            absl::StrCat("codec value_bits must be 2, 3 or 4, got ", c.value_bits));
      }
      if (c.norm_dtype != DType::kF32 && c.norm_dtype != DType::kF16) {
        return absl::InvalidArgumentError("codec norm dtype must be f32 or f16");
      }
      if (!p.layer_value_bits.empty()) {
        if (p.layer_value_bits.size() != p.layers || p.layers > kPoolFidelityLayers) {
          return absl::InvalidArgumentError(
              absl::StrCat("per-layer value bits: ", p.layer_value_bits.size(), " entries for ",
                           p.layers, " layers (at most ", kPoolFidelityLayers, ")"));
        }
        for (size_t i = 0; i < p.layer_value_bits.size(); ++i) {
          const int32_t b = p.layer_value_bits[i];
          if (b != 0 && (b < 2 || b > 4)) {
            return absl::InvalidArgumentError(
                absl::StrCat("layer ", i, " value bits must be 2, 3 or 4, got ", b));
          }
        }
      }
      if (c.key_scale != kernels::KeyScaleMode::kPerTensor &&
          c.key_scale != kernels::KeyScaleMode::kPerHead &&
          c.key_scale != kernels::KeyScaleMode::kPerChannel) {
        return absl::InvalidArgumentError("codec key_scale mode is unknown");
      }
      const uint64_t vectors = static_cast<uint64_t>(shape.vectors());
      const uint64_t kc = vectors * static_cast<uint64_t>(
                                        kernels::PackedKeyVectorBytes(shape.head_dim, c.key_bits));
      const uint64_t ks = 4 * static_cast<uint64_t>(kernels::KeyScaleCount(shape, c.key_scale));
      const uint64_t vn = (c.norm_dtype == DType::kF16 ? 2 : 4) * vectors;
      for (uint32_t i = 0; i < p.layers; ++i) {
        const uint64_t vc = vectors * static_cast<uint64_t>(kernels::PackedVectorBytes(
                                          shape.head_dim, p.ValueBitsOf(i)));
        LayerOffsets lo;
        lo.k = off;
        off = AlignUp(off + kc);
        lo.k_scales = off;
        off = AlignUp(off + ks);
        lo.v = off;
        off = AlignUp(off + vc);
        lo.v_norms = off;
        off = AlignUp(off + vn);
        lo.end = off;
        l.layer.push_back(lo);
        l.key_codes += kc;
        l.key_scales += ks;
        l.value_codes += vc;
        l.value_norms += vn;
      }
      break;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("pool codec ", static_cast<uint32_t>(p.codec), " is unknown"));
  }
  l.total_bytes = off;
  l.overhead = l.total_bytes - l.key_codes - l.key_scales - l.value_codes - l.value_norms;
  return l;
}

uint64_t Bf16CacheBytes(const PoolParams& p) {
  return uint64_t{2} * 2 * p.layers * p.kv_heads * p.tokens * p.head_dim;
}

// ---------------------------------------------------------------------------------------
// PoolWriter
// ---------------------------------------------------------------------------------------

StatusOr<PoolWriter> PoolWriter::Create(void* base, uint64_t size, const PoolParams& params,
                                        absl::Span<const uint8_t> pool_id,
                                        absl::Span<const int32_t> token_ids,
                                        kernels::Device device) {
  if (base == nullptr) return absl::InvalidArgumentError("pool region is null");
  POLYKV_ASSIGN_OR_RETURN(PoolLayout layout, ComputePoolLayout(params));
  if (size < layout.total_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("pool region of ", size,
                                                   " bytes is smaller than the layout's ",
                                                   layout.total_bytes, " bytes"));
  }
  if (token_ids.size() != params.tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "got ", token_ids.size(), " token ids for a pool of ", params.tokens, " tokens"));
  }
  if (pool_id.size() > sizeof(PoolHeader::pool_id)) {
    return absl::InvalidArgumentError("pool id must be at most 32 bytes");
  }
  PoolWriter w;
  w.base_ = base;
  w.size_ = size;
  w.params_ = params;
  w.layout_ = std::move(layout);
  w.written_.assign(params.layers, false);
  if (device == kernels::Device::kCpu) {
    w.key_rel_mse_.assign(params.layers, 0.0f);
    w.value_rel_mse_.assign(params.layers, 0.0f);
  }
  w.pool_id_.assign(pool_id.begin(), pool_id.end());
  w.device_ = device;
  // An all-zero header (no magic) until Finalize: a half-written pool never reads as valid.
  std::vector<uint8_t> zeros(kPoolHeaderBytes, 0);
  POLYKV_RETURN_IF_ERROR(CopyIn(base, zeros.data(), zeros.size(), device));
  POLYKV_RETURN_IF_ERROR(CopyIn(static_cast<uint8_t*>(base) + w.layout_.token_ids, token_ids.data(),
                                4 * token_ids.size(), device));
  return w;
}

Status PoolWriter::WriteLayer(uint32_t layer, const void* k, const void* v, kernels::DType dtype) {
  POLYKV_RETURN_IF_ERROR(CheckLayerArgs(layer, params_.layers));
  if (k == nullptr || v == nullptr) return absl::InvalidArgumentError("K or V is null");
  const LayerOffsets& lo = layout_.layer[layer];
  uint8_t* base = static_cast<uint8_t*>(base_);
  const kernels::LayerShape shape = ShapeOf(params_);
  if (params_.codec == PoolCodec::kNone) {
    POLYKV_RETURN_IF_ERROR(
        CopyConvert(base + lo.k, params_.raw_dtype, k, dtype, shape.elements(), device_, nullptr));
    POLYKV_RETURN_IF_ERROR(
        CopyConvert(base + lo.v, params_.raw_dtype, v, dtype, shape.elements(), device_, nullptr));
  } else {
    const auto& c = params_.codec_config;
    // Every codec on either device (same bytes): keys at their width, this layer's value
    // bits, norms f32 or f16 (on a device through an f32 scratch converted in place there).
    POLYKV_RETURN_IF_ERROR(kernels::EncodeKeys(
        k, dtype, shape, c, base + lo.k, reinterpret_cast<float*>(base + lo.k_scales), device_));
    kernels::CodecConfig vc = c;
    vc.value_bits = params_.ValueBitsOf(layer);
    if (c.norm_dtype == DType::kF32) {
      POLYKV_RETURN_IF_ERROR(kernels::EncodeValues(
          v, dtype, shape, vc, base + lo.v, reinterpret_cast<float*>(base + lo.v_norms), device_));
    } else {  // f16 norms: encoded as f32 into a scratch where the codec runs, then rounded
      POLYKV_ASSIGN_OR_RETURN(NormScratch norms, NormScratch::Make(device_, shape.vectors()));
      POLYKV_RETURN_IF_ERROR(
          kernels::EncodeValues(v, dtype, shape, vc, base + lo.v, norms.data(), device_));
      POLYKV_RETURN_IF_ERROR(kernels::ConvertNorms(norms.data(), DType::kF32, shape.vectors(),
                                                   base + lo.v_norms, device_));
    }
  }
  if (device_ == kernels::Device::kCpu) {
    // What the codec lost on this layer, measured on the bytes just written.
    LayerFidelity f;
    POLYKV_RETURN_IF_ERROR(MeasureLayerAt(base, params_, layer, lo, k, v, dtype, &f));
    key_rel_mse_[layer] = static_cast<float>(f.key_rel_mse);
    value_rel_mse_[layer] = static_cast<float>(f.value_rel_mse);
  }
  written_[layer] = true;
  return absl::OkStatus();
}

Status PoolWriter::Finalize() {
  for (uint32_t i = 0; i < params_.layers; ++i) {
    if (!written_[i]) {
      return absl::FailedPreconditionError(absl::StrCat("layer ", i, " was not written"));
    }
  }
  PoolHeader h;
  std::memset(&h, 0, sizeof(h));
  std::memcpy(h.magic, kPoolMagic, sizeof(h.magic));
  h.format_version = kPoolFormatVersion;
  h.header_bytes = kPoolHeaderBytes;
  h.total_bytes = layout_.total_bytes;
  std::memcpy(h.pool_id, pool_id_.data(), pool_id_.size());
  std::memcpy(h.model_fingerprint, params_.model_fingerprint.data(),
              params_.model_fingerprint.size());
  std::memcpy(h.tokenizer_fingerprint, params_.tokenizer_fingerprint.data(),
              params_.tokenizer_fingerprint.size());
  std::memcpy(h.architecture, params_.architecture.data(), params_.architecture.size());
  std::memcpy(h.tokenizer_family, params_.tokenizer_family.data(), params_.tokenizer_family.size());
  h.layers = params_.layers;
  h.kv_heads = params_.kv_heads;
  h.head_dim = params_.head_dim;
  h.codec = static_cast<uint32_t>(params_.codec);
  h.tokens = params_.tokens;
  h.raw_dtype = static_cast<uint32_t>(params_.raw_dtype);
  h.key_bits = static_cast<uint32_t>(params_.codec_config.key_bits);
  h.value_bits = static_cast<uint32_t>(params_.codec_config.value_bits);
  h.key_scale_mode = static_cast<uint32_t>(params_.codec_config.key_scale);
  h.rotation_seed = params_.codec_config.rotation_seed;
  h.norm_correction = params_.codec_config.norm_correction ? 1 : 0;
  h.norm_dtype = static_cast<uint32_t>(params_.codec_config.norm_dtype);
  for (size_t l = 0; l < params_.layer_value_bits.size() && l < kPoolFidelityLayers; ++l) {
    h.layer_value_bits[l] = static_cast<uint8_t>(params_.layer_value_bits[l]);
  }
  if (!params_.parent_id.empty()) {
    const std::string parent = absl::HexStringToBytes(params_.parent_id);
    std::memcpy(h.parent_id, parent.data(), std::min(parent.size(), sizeof(h.parent_id)));
    h.parent_tokens = params_.parent_tokens;
  }
  if (!key_rel_mse_.empty() && params_.layers <= kPoolFidelityLayers) {
    h.fidelity_layers = params_.layers;
    for (uint32_t l = 0; l < params_.layers; ++l) {
      h.key_rel_mse[l] = key_rel_mse_[l];
      h.value_rel_mse[l] = value_rel_mse_[l];
    }
  }
  const uint8_t* base = static_cast<const uint8_t*>(base_);
  POLYKV_ASSIGN_OR_RETURN(
      h.payload_checksum,
      ChecksumRange(base + kPoolHeaderBytes, layout_.total_bytes - kPoolHeaderBytes, device_));
  h.header_checksum = HeaderChecksum(h);
  return CopyIn(base_, &h, sizeof(h), device_);
}

// ---------------------------------------------------------------------------------------
// PoolReader
// ---------------------------------------------------------------------------------------

StatusOr<PoolReader> PoolReader::Open(const void* base, uint64_t size, bool verify_payload,
                                      kernels::Device device) {
  if (base == nullptr) return absl::InvalidArgumentError("pool region is null");
  if (size < kPoolHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool region of ", size, " bytes is smaller than the ", kPoolHeaderBytes, "-byte header"));
  }
  PoolReader r;
  r.base_ = static_cast<const uint8_t*>(base);
  r.size_ = size;
  r.device_ = device;
  PoolHeader& h = r.header_;
  POLYKV_RETURN_IF_ERROR(CopyOut(&h, base, sizeof(h), device));
  if (std::memcmp(h.magic, kPoolMagic, sizeof(h.magic)) != 0) {
    return absl::DataLossError("pool header magic is not \"PKVPOOL1\" (not a pool, or unfinished)");
  }
  if (h.format_version != kPoolFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat("pool format version ", h.format_version,
                                                   " is not supported (expected ",
                                                   kPoolFormatVersion, ")"));
  }
  if (HeaderChecksum(h) != h.header_checksum) {
    return absl::DataLossError("pool header checksum mismatch (header corrupted)");
  }
  if (h.header_bytes != kPoolHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat("pool header_bytes ", h.header_bytes, " != ", kPoolHeaderBytes));
  }
  if (h.total_bytes > size) {
    return absl::InvalidArgumentError(absl::StrCat("pool region of ", size,
                                                   " bytes is smaller than its total_bytes ",
                                                   h.total_bytes, " (truncated)"));
  }
  PoolParams& p = r.params_;
  p.layers = h.layers;
  p.kv_heads = h.kv_heads;
  p.head_dim = h.head_dim;
  p.tokens = h.tokens;
  p.codec = static_cast<PoolCodec>(h.codec);
  p.raw_dtype = static_cast<DType>(h.raw_dtype);
  p.codec_config.key_bits = static_cast<int32_t>(h.key_bits);
  p.codec_config.value_bits = static_cast<int32_t>(h.value_bits);
  p.codec_config.key_scale = static_cast<kernels::KeyScaleMode>(h.key_scale_mode);
  p.codec_config.rotation_seed = h.rotation_seed;
  p.codec_config.norm_correction = h.norm_correction != 0;
  p.model_fingerprint.assign(h.model_fingerprint,
                             strnlen(h.model_fingerprint, sizeof(h.model_fingerprint)));
  p.tokenizer_fingerprint.assign(h.tokenizer_fingerprint,
                                 strnlen(h.tokenizer_fingerprint, sizeof(h.tokenizer_fingerprint)));
  p.architecture.assign(h.architecture, strnlen(h.architecture, sizeof(h.architecture)));
  p.tokenizer_family.assign(h.tokenizer_family,
                            strnlen(h.tokenizer_family, sizeof(h.tokenizer_family)));
  static constexpr uint8_t kNoParent[sizeof(h.parent_id)] = {};
  if (std::memcmp(h.parent_id, kNoParent, sizeof(h.parent_id)) != 0) {
    p.parent_id = absl::BytesToHexString(
        absl::string_view(reinterpret_cast<const char*>(h.parent_id), sizeof(h.parent_id)));
  }
  p.parent_tokens = h.parent_tokens;
  p.codec_config.norm_dtype = static_cast<DType>(h.norm_dtype);
  bool per_layer = false;
  for (uint32_t l = 0; l < kPoolFidelityLayers; ++l) per_layer |= h.layer_value_bits[l] != 0;
  if (per_layer) {
    if (h.layers > kPoolFidelityLayers) {
      return absl::DataLossError("pool header has per-layer value bits for too many layers");
    }
    p.layer_value_bits.assign(h.layer_value_bits, h.layer_value_bits + h.layers);
  }
  auto layout = ComputePoolLayout(p);
  if (!layout.ok()) {
    return absl::DataLossError(
        absl::StrCat("pool header describes an invalid pool: ", layout.status().message()));
  }
  if (layout->total_bytes != h.total_bytes) {
    return absl::DataLossError(absl::StrCat("pool header total_bytes ", h.total_bytes,
                                            " != computed layout ", layout->total_bytes));
  }
  r.layout_ = *std::move(layout);
  if (verify_payload) POLYKV_RETURN_IF_ERROR(r.VerifyPayload());
  return r;
}

std::vector<int32_t> PoolReader::TokenIds() const {
  std::vector<int32_t> ids(params_.tokens);
  Status s = CopyOut(ids.data(), base_ + layout_.token_ids, 4 * ids.size(), device_);
  if (!s.ok()) ids.clear();
  return ids;
}

Status PoolReader::DecodeLayer(uint32_t layer, void* k_out, void* v_out, kernels::DType out_dtype,
                               kernels::Stream stream) const {
  POLYKV_RETURN_IF_ERROR(CheckLayerArgs(layer, params_.layers));
  if (k_out == nullptr || v_out == nullptr) {
    return absl::InvalidArgumentError("K or V output is null");
  }
  return DecodeLayerAt(base_, params_, layout_.layer[layer], params_.ValueBitsOf(layer), k_out,
                       v_out, out_dtype, device_, stream);
}

Status DecodeLayerCopy(const uint8_t* bytes, const PoolParams& params, const PoolLayout& layout,
                       uint32_t layer, void* k_out, void* v_out, DType out_dtype) {
  POLYKV_RETURN_IF_ERROR(CheckLayerArgs(layer, static_cast<uint32_t>(layout.layer.size())));
  if (bytes == nullptr || k_out == nullptr || v_out == nullptr)
    return absl::InvalidArgumentError("layer bytes, K or V output is null");
  LayerOffsets rel = layout.layer[layer];  // offsets from the copy's first byte
  const uint64_t first = rel.k;
  for (uint64_t* o : {&rel.k, &rel.k_scales, &rel.v, &rel.v_norms, &rel.end})
    *o = *o >= first ? *o - first : 0;
  return DecodeLayerAt(bytes, params, rel, params.ValueBitsOf(layer), k_out, v_out, out_dtype,
                       kernels::Device::kCpu, nullptr);
}

std::vector<LayerFidelity> PoolReader::RecordedFidelity() const {
  std::vector<LayerFidelity> out;
  const uint32_t n = header_.fidelity_layers;
  if (n == 0 || n != params_.layers || n > kPoolFidelityLayers) return out;
  out.resize(n);
  for (uint32_t l = 0; l < n; ++l) {
    out[l].key_rel_mse = header_.key_rel_mse[l];
    out[l].value_rel_mse = header_.value_rel_mse[l];
  }
  return out;
}

StatusOr<LayerFidelity> PoolReader::MeasureFidelity(uint32_t layer, const void* k, const void* v,
                                                    kernels::DType dtype) const {
  POLYKV_RETURN_IF_ERROR(CheckLayerArgs(layer, params_.layers));
  if (k == nullptr || v == nullptr) return absl::InvalidArgumentError("reference K or V is null");
  if (device_ != kernels::Device::kCpu)
    return absl::FailedPreconditionError("measuring fidelity needs a host pool");
  LayerFidelity f;
  POLYKV_RETURN_IF_ERROR(
      MeasureLayerAt(base_, params_, layer, layout_.layer[layer], k, v, dtype, &f));
  return f;
}

Status PoolReader::VerifyPayload() const {
  POLYKV_ASSIGN_OR_RETURN(
      uint64_t sum,
      ChecksumRange(base_ + kPoolHeaderBytes, header_.total_bytes - kPoolHeaderBytes, device_));
  if (sum != header_.payload_checksum) {
    return absl::DataLossError(absl::StrCat("pool payload checksum mismatch: computed ",
                                            absl::Hex(sum), ", header says ",
                                            absl::Hex(header_.payload_checksum)));
  }
  return absl::OkStatus();
}

}  // namespace polykv::ipc

namespace polykv::ipc {

namespace {
// The view at the reader's base, wherever it lies (pointer arithmetic only).
StatusOr<kernels::PrefixView> ViewAtBase(const PoolReader& reader);
}  // namespace

StatusOr<kernels::PrefixView> PrefixViewOf(const PoolReader& reader) {
  if (reader.device() != kernels::Device::kCpu)
    return absl::FailedPreconditionError("a pool in device memory has no host view");
  return ViewAtBase(reader);
}

StatusOr<kernels::PrefixView> DevicePrefixViewOf(const PoolReader& reader) {
  if (reader.device() != kernels::Device::kCuda)
    return absl::FailedPreconditionError("a pool in host memory has no device view");
  return ViewAtBase(reader);
}

namespace {
StatusOr<kernels::PrefixView> ViewAtBase(const PoolReader& reader) {
  const PoolParams& p = reader.params();
  kernels::PrefixView v;
  v.kv_heads = static_cast<int32_t>(p.kv_heads);
  v.head_dim = static_cast<int32_t>(p.head_dim);
  v.tokens = static_cast<int64_t>(p.tokens);
  if (p.codec == PoolCodec::kNone) {
    v.codec = kernels::PrefixCodec::kRaw;
    v.raw_dtype = p.raw_dtype;
  } else {
    v.codec = kernels::PrefixCodec::kK8V;
    v.config = p.codec_config;
  }
  const uint8_t* b = reader.base();
  for (uint32_t l = 0; l < reader.layout().layer.size(); ++l) {
    const LayerOffsets& lo = reader.layout().layer[l];
    kernels::PrefixLayer pl;
    pl.k = b + lo.k;
    pl.v = b + lo.v;
    if (v.codec == kernels::PrefixCodec::kK8V) {
      pl.k_scales = reinterpret_cast<const float*>(b + lo.k_scales);
      pl.v_norms = b + lo.v_norms;  // f32 or f16 (config.norm_dtype)
      pl.value_bits = p.ValueBitsOf(l);
    }
    v.layers.push_back(pl);
  }
  POLYKV_RETURN_IF_ERROR(kernels::ValidatePrefixView(v));
  return v;
}
}  // namespace

}  // namespace polykv::ipc
