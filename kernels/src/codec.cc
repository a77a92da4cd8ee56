// Device-neutral entry points of the codec: validation, CPU/CUDA routing, byte accounting.
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec_internal.h"
#include "internal.h"
#include "polykv/kernels/cpu.h"
#if defined(POLYKV_HAVE_CUDA)
#include "codec_cuda.h"
#include "polykv/cuda_status.h"
#endif

namespace polykv::kernels {
namespace {

using internal::DTypeCode;

Status CheckDType(DType dtype, const char* name) {
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": unknown dtype code ", static_cast<int>(dtype)));
  }
  return absl::OkStatus();
}

Status CheckMode(KeyScaleMode mode) {
  if (mode != KeyScaleMode::kPerTensor && mode != KeyScaleMode::kPerHead &&
      mode != KeyScaleMode::kPerChannel) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown key scale mode ", static_cast<int>(mode)));
  }
  return absl::OkStatus();
}

Status CheckShape(const LayerShape& shape) {
  if (shape.kv_heads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("kv_heads must be >= 1, got ", shape.kv_heads));
  }
  if (shape.tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tokens must be >= 1, got ", shape.tokens));
  }
  if (shape.head_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim must be >= 1, got ", shape.head_dim));
  }
  return absl::OkStatus();
}

Status CheckPtr(const void* p, const char* name) {
  if (p == nullptr) return absl::InvalidArgumentError(absl::StrCat(name, " is null"));
  return absl::OkStatus();
}

// The names of a codec call's dtype and its three pointers (input or output first, then the
// codes and the side data: key scales or value norms), for CheckIo's messages.
struct IoNames {
  const char* dtype;
  const char* ptrs[3];
};
constexpr IoNames kKeyEncode{"K dtype", {"K input", "K codes output", "K scales output"}};
constexpr IoNames kKeyEncodeWithScales{"K dtype", {"K input", "K codes output", "K scales"}};
constexpr IoNames kKeyDecode{"K output dtype", {"K codes", "K scales", "K output"}};
constexpr IoNames kValueEncode{"V dtype", {"V input", "V codes output", "V norms output"}};
constexpr IoNames kValueDecode{"V output dtype", {"V codes", "V norms", "V output"}};

// The dtype, then p0, p1, p2 (in the order of `names`).
Status CheckIo(const IoNames& names, DType dtype, const void* p0, const void* p1, const void* p2) {
  POLYKV_RETURN_IF_ERROR(CheckDType(dtype, names.dtype));
  POLYKV_RETURN_IF_ERROR(CheckPtr(p0, names.ptrs[0]));
  POLYKV_RETURN_IF_ERROR(CheckPtr(p1, names.ptrs[1]));
  return CheckPtr(p2, names.ptrs[2]);
}

Status CheckDevice(Device device, const LayerShape& shape) {
  if (device == Device::kCpu) return absl::OkStatus();
  if (device != Device::kCuda) {
    return absl::InvalidArgumentError(absl::StrCat("unknown device ", static_cast<int>(device)));
  }
#if defined(POLYKV_HAVE_CUDA)
  if (shape.head_dim > math::kMaxCudaHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim ", shape.head_dim,
                                                   " exceeds the CUDA kernels' maximum of ",
                                                   math::kMaxCudaHeadDim));
  }
  return absl::OkStatus();
#else
  (void)shape;
  return absl::UnimplementedError(
      "Device::kCuda requested but PolyKV was built without CUDA (POLYKV_ENABLE_CUDA=OFF or "
      "no nvcc)");
#endif
}

// The Device::kCuda branch of an entry point: `statement` in CUDA builds; elsewhere
// CheckDevice has already refused kCuda, so reaching it is an internal error.
#if defined(POLYKV_HAVE_CUDA)
#define POLYKV_CUDA_BRANCH(statement) statement
#else
#define POLYKV_CUDA_BRANCH(statement) \
  (void)stream;                       \
  return absl::InternalError("CUDA branch reached in a build without CUDA")
#endif

#if defined(POLYKV_HAVE_CUDA)
// A device-side "first bad index" cell: allocated, set to ~0, read back after the kernels.
class DeviceBadIndex {
 public:
  Status Init(cudaStream_t stream) {
    stream_ = stream;
    POLYKV_RETURN_IF_ERROR(CudaStatus(
        cudaMalloc(reinterpret_cast<void**>(&ptr_), sizeof(unsigned long long)), "cudaMalloc"));
    return CudaStatus(cudaMemsetAsync(ptr_, 0xFF, sizeof(unsigned long long), stream),
                      "cudaMemset");
  }
  ~DeviceBadIndex() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  unsigned long long* get() { return ptr_; }
  // Waits for the stream; returns the bad index or -1.
  StatusOr<int64_t> Read() {
    unsigned long long host = ~0ull;
    POLYKV_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(&host, ptr_, sizeof(host), cudaMemcpyDeviceToHost, stream_), "cudaMemcpy"));
    POLYKV_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
    return host == ~0ull ? int64_t{-1} : static_cast<int64_t>(host);
  }

 private:
  unsigned long long* ptr_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

Status DeviceNonFiniteError(const char* what, const void* src, DType dtype, const LayerShape& shape,
                            int64_t index) {
  const size_t es = DTypeSize(dtype);
  uint32_t raw = 0;
  cudaMemcpy(&raw, static_cast<const char*>(src) + index * es, es, cudaMemcpyDeviceToHost);
  float x = dtype == DType::kF32   ? math::BitsFloat(raw)
            : dtype == DType::kF16 ? math::F16ToFloat(static_cast<uint16_t>(raw))
                                   : math::Bf16ToFloat(static_cast<uint16_t>(raw));
  return absl::InvalidArgumentError(absl::StrCat(what, " contains ", std::isnan(x) ? "NaN" : "Inf",
                                                 " at ", internal::DescribeIndex(shape, index)));
}

// `bits` 4..8: the codes of EncodeKeys before packing (QuantizeKeysCpu's bits).
Status QuantizeKeysCuda(const void* k, DType dtype, const LayerShape& shape, KeyScaleMode mode,
                        const float* given_scales, int8_t* q, float* scales_out, Stream stream,
                        int bits = 8) {
  auto s = static_cast<cudaStream_t>(stream);
  DeviceBadIndex bad;
  POLYKV_RETURN_IF_ERROR(bad.Init(s));
  const float* scales = given_scales;
  if (scales == nullptr) {
    POLYKV_RETURN_IF_ERROR(CudaStatus(
        cuda::InvokeKeyScales(k, DTypeCode(dtype), shape.kv_heads, shape.tokens, shape.head_dim,
                              static_cast<int>(mode), bits, scales_out, bad.get(), s),
        "key scales kernel"));
    scales = scales_out;
  }
  POLYKV_RETURN_IF_ERROR(CudaStatus(
      cuda::InvokeQuantizeKeys(k, DTypeCode(dtype), shape.kv_heads, shape.tokens, shape.head_dim,
                               static_cast<int>(mode), bits, scales, q, bad.get(), s),
      "key quantize kernel"));
  POLYKV_ASSIGN_OR_RETURN(int64_t bad_index, bad.Read());
  if (bad_index >= 0) return DeviceNonFiniteError("K", k, dtype, shape, bad_index);
  return absl::OkStatus();
}

// Packed keys (bits 4..7) on the device: the int8 codes of QuantizeKeysCuda at `bits` into a
// stream-ordered scratch, then PackKeyCodes per vector (the CPU's bytes).
Status EncodeKeysCuda(const void* k, DType dtype, const LayerShape& shape,
                      const CodecConfig& config, uint8_t* codes, float* scales, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  return WithStreamScratch(
      static_cast<size_t>(shape.elements()), s, "key codes", [&](void* scratch) -> Status {
        auto* q = static_cast<int8_t*>(scratch);
        POLYKV_RETURN_IF_ERROR(QuantizeKeysCuda(k, dtype, shape, config.key_scale, nullptr, q,
                                                scales, stream, config.key_bits));
        return CudaStatus(
            cuda::InvokePackedKeys(q, shape.vectors(), shape.head_dim, config.key_bits,
                                   /*pack=*/true, codes, s),
            "key pack kernel");
      });
}

// Packed keys decoded on the device: unpacked into an int8 scratch, then DequantizeKeys.
Status DecodeKeysCuda(const uint8_t* codes, const float* scales, const LayerShape& shape,
                      const CodecConfig& config, void* out, DType out_dtype, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  return WithStreamScratch(
      static_cast<size_t>(shape.elements()), s, "key codes", [&](void* scratch) -> Status {
        auto* q = static_cast<int8_t*>(scratch);
        POLYKV_RETURN_IF_ERROR(CudaStatus(
            cuda::InvokePackedKeys(codes, shape.vectors(), shape.head_dim, config.key_bits,
                                   /*pack=*/false, q, s),
            "key unpack kernel"));
        return CudaStatus(cuda::InvokeDequantizeKeys(
                              q, scales, shape.kv_heads, shape.tokens, shape.head_dim,
                              static_cast<int>(config.key_scale), out, DTypeCode(out_dtype), s),
                          "key dequantize kernel");
      });
}

Status EncodeValuesCuda(const void* v, DType dtype, const LayerShape& shape,
                        const CodecConfig& config, const math::ValueCodebook& cb, uint8_t* packed,
                        float* norms, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  DeviceBadIndex bad;
  POLYKV_RETURN_IF_ERROR(bad.Init(s));
  POLYKV_RETURN_IF_ERROR(
      CudaStatus(cuda::InvokeEncodeValues(v, DTypeCode(dtype), shape.vectors(), shape.head_dim, cb,
                                          config.rotation_seed, config.norm_correction, packed,
                                          norms, bad.get(), s),
                 "value encode kernel"));
  POLYKV_ASSIGN_OR_RETURN(int64_t bad_index, bad.Read());
  if (bad_index >= 0) return DeviceNonFiniteError("V", v, dtype, shape, bad_index);
  return absl::OkStatus();
}
#endif  // POLYKV_HAVE_CUDA

}  // namespace

Status ValidateConfig(const LayerShape& shape, const CodecConfig& config) {
  POLYKV_RETURN_IF_ERROR(CheckShape(shape));
  if (config.key_bits < 4 || config.key_bits > 8) {
    return absl::InvalidArgumentError(absl::StrCat("key_bits must be 4..8, got ", config.key_bits));
  }
  if (config.norm_dtype != DType::kF32 && config.norm_dtype != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat("norm_dtype must be f32 or f16, got code ",
                                                   static_cast<int>(config.norm_dtype)));
  }
  if (config.value_bits < 2 || config.value_bits > 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("value_bits must be 2, 3 or 4, got ", config.value_bits));
  }
  return CheckMode(config.key_scale);
}

int64_t KeyScaleCount(const LayerShape& shape, KeyScaleMode mode) {
  switch (mode) {
    case KeyScaleMode::kPerTensor:
      return 1;
    case KeyScaleMode::kPerHead:
      return shape.kv_heads;
    case KeyScaleMode::kPerChannel:
      return int64_t{shape.kv_heads} * shape.head_dim;
  }
  return 0;
}

Status QuantizeKeys(const void* k, DType dtype, const LayerShape& shape, KeyScaleMode mode,
                    int8_t* q, float* scales, Device device, Stream stream) {
  POLYKV_RETURN_IF_ERROR(CheckShape(shape));
  POLYKV_RETURN_IF_ERROR(CheckMode(mode));
  POLYKV_RETURN_IF_ERROR(CheckIo(kKeyEncode, dtype, k, q, scales));
  POLYKV_RETURN_IF_ERROR(CheckDevice(device, shape));
  if (device == Device::kCpu) {
    return internal::QuantizeKeysCpu(k, dtype, shape, mode, nullptr, q, scales);
  }
  POLYKV_CUDA_BRANCH(return QuantizeKeysCuda(k, dtype, shape, mode, nullptr, q, scales, stream));
}

Status QuantizeKeysWithScales(const void* k, DType dtype, const LayerShape& shape,
                              KeyScaleMode mode, const float* scales, int8_t* q, Device device,
                              Stream stream) {
  POLYKV_RETURN_IF_ERROR(CheckShape(shape));
  POLYKV_RETURN_IF_ERROR(CheckMode(mode));
  POLYKV_RETURN_IF_ERROR(CheckIo(kKeyEncodeWithScales, dtype, k, q, scales));
  POLYKV_RETURN_IF_ERROR(CheckDevice(device, shape));
  if (device == Device::kCpu) {
    const int64_t n = KeyScaleCount(shape, mode);
    for (int64_t i = 0; i < n; ++i) {
      if (!(scales[i] > 0.0f) || math::IsNonFinite(scales[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("key scale ", i, " must be finite and > 0, got ", scales[i]));
      }
    }
    return internal::QuantizeKeysCpu(k, dtype, shape, mode, scales, q, nullptr);
  }
  POLYKV_CUDA_BRANCH(return QuantizeKeysCuda(k, dtype, shape, mode, scales, q, nullptr, stream));
}

Status DequantizeKeys(const int8_t* q, const float* scales, const LayerShape& shape,
                      KeyScaleMode mode, void* out, DType out_dtype, Device device, Stream stream) {
  POLYKV_RETURN_IF_ERROR(CheckShape(shape));
  POLYKV_RETURN_IF_ERROR(CheckMode(mode));
  POLYKV_RETURN_IF_ERROR(CheckIo(kKeyDecode, out_dtype, q, scales, out));
  POLYKV_RETURN_IF_ERROR(CheckDevice(device, shape));
  if (device == Device::kCpu) {
    internal::DequantizeKeysCpu(q, scales, shape, mode, out, out_dtype);
    return absl::OkStatus();
  }
  POLYKV_CUDA_BRANCH(return CudaStatus(
      cuda::InvokeDequantizeKeys(q, scales, shape.kv_heads, shape.tokens, shape.head_dim,
                                 static_cast<int>(mode), out, DTypeCode(out_dtype),
                                 static_cast<cudaStream_t>(stream)),
      "key dequantize kernel"));
}

int64_t PackedKeyVectorBytes(int32_t head_dim, int32_t bits) {
  return bits >= 8 ? int64_t{head_dim} : math::PackedBytes(head_dim, bits);
}

Status EncodeKeys(const void* k, DType dtype, const LayerShape& shape, const CodecConfig& config,
                  uint8_t* codes, float* scales, Device device, Stream stream) {
  POLYKV_RETURN_IF_ERROR(ValidateConfig(shape, config));
  if (config.key_bits == 8)
    return QuantizeKeys(k, dtype, shape, config.key_scale, reinterpret_cast<int8_t*>(codes), scales,
                        device, stream);
  POLYKV_RETURN_IF_ERROR(CheckIo(kKeyEncode, dtype, k, codes, scales));
  POLYKV_RETURN_IF_ERROR(CheckDevice(device, shape));
  if (device != Device::kCpu) {
    POLYKV_CUDA_BRANCH(return EncodeKeysCuda(k, dtype, shape, config, codes, scales, stream));
  }
  std::vector<int8_t> q(static_cast<size_t>(shape.elements()));
  POLYKV_RETURN_IF_ERROR(internal::QuantizeKeysCpu(k, dtype, shape, config.key_scale, nullptr,
                                                   q.data(), scales, config.key_bits));
  const int d = shape.head_dim;
  const int64_t vb = PackedKeyVectorBytes(d, config.key_bits);
  internal::ParallelFor(shape.vectors(), 256, [&](int64_t b, int64_t e) {
    for (int64_t v = b; v < e; ++v)
      math::PackKeyCodes(q.data() + v * d, d, config.key_bits, codes + v * vb);
  });
  return absl::OkStatus();
}

Status DecodeKeys(const uint8_t* codes, const float* scales, const LayerShape& shape,
                  const CodecConfig& config, void* out, DType out_dtype, Device device,
                  Stream stream) {
  POLYKV_RETURN_IF_ERROR(ValidateConfig(shape, config));
  if (config.key_bits == 8)
    return DequantizeKeys(reinterpret_cast<const int8_t*>(codes), scales, shape, config.key_scale,
                          out, out_dtype, device, stream);
  POLYKV_RETURN_IF_ERROR(CheckIo(kKeyDecode, out_dtype, codes, scales, out));
  POLYKV_RETURN_IF_ERROR(CheckDevice(device, shape));
  if (device != Device::kCpu) {
    POLYKV_CUDA_BRANCH(return DecodeKeysCuda(codes, scales, shape, config, out, out_dtype, stream));
  }
  std::vector<int8_t> q(static_cast<size_t>(shape.elements()));
  UnpackKeyVectors(codes, shape.vectors(), shape.head_dim, config.key_bits, q.data());
  internal::DequantizeKeysCpu(q.data(), scales, shape, config.key_scale, out, out_dtype);
  return absl::OkStatus();
}

void UnpackKeyVectors(const uint8_t* codes, int64_t n, int32_t head_dim, int32_t bits, int8_t* q) {
  if (bits >= 8) {
    std::memcpy(q, codes, static_cast<size_t>(n * head_dim));
    return;
  }
#ifdef POLYKV_HAVE_AVX2_KERNELS
  static const bool bmi2 = BestIsa() >= Isa::kAvx2;  // every kAvx2 CPU has BMI2
  if (bmi2) {
    codec::UnpackKeyVectorsBmi2(codes, n, head_dim, bits, q);
    return;
  }
#endif
  UnpackKeyVectorsScalar(codes, n, head_dim, bits, q);
}

void UnpackKeyVectorsScalar(const uint8_t* codes, int64_t n, int32_t head_dim, int32_t bits,
                            int8_t* q) {
  if (bits >= 8) {
    std::memcpy(q, codes, static_cast<size_t>(n * head_dim));
    return;
  }
  const int64_t vb = PackedKeyVectorBytes(head_dim, bits);
  for (int64_t v = 0; v < n; ++v)
    math::UnpackKeyCodes(codes + v * vb, head_dim, bits, q + v * head_dim);
}

void NormsToF16(const float* in, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = math::FloatToF16(in[i]);
}

Status ConvertNorms(const void* in, DType from, int64_t n, void* out, Device device,
                    Stream stream) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("norm count ", n, " < 0"));
  if (from != DType::kF32 && from != DType::kF16)
    return absl::InvalidArgumentError("ConvertNorms: norms are f32 or f16");
  if (n > 0 && (in == nullptr || out == nullptr))
    return absl::InvalidArgumentError("ConvertNorms: null pointer");
  const bool to_f16 = from == DType::kF32;
  if (device == Device::kCpu) {
    if (to_f16) {
      NormsToF16(static_cast<const float*>(in), n, static_cast<uint16_t*>(out));
    } else {
      NormsFromF16(static_cast<const uint16_t*>(in), n, static_cast<float*>(out));
    }
    return absl::OkStatus();
  }
  POLYKV_RETURN_IF_ERROR(CheckDevice(device, LayerShape{1, 1, 1}));
  POLYKV_CUDA_BRANCH(return CudaStatus(
      cuda::InvokeConvertNorms(in, n, to_f16, out, static_cast<cudaStream_t>(stream)),
      "norm conversion kernel"));
}

void NormsFromF16(const uint16_t* in, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = math::F16ToFloat(in[i]);
}

int64_t PackedVectorBytes(int32_t head_dim, int32_t bits) {
  return math::PackedBytes(head_dim, bits);
}

Status EncodeValues(const void* v, DType dtype, const LayerShape& shape, const CodecConfig& config,
                    uint8_t* packed, float* norms, Device device, Stream stream) {
  POLYKV_RETURN_IF_ERROR(ValidateConfig(shape, config));
  POLYKV_RETURN_IF_ERROR(CheckIo(kValueEncode, dtype, v, packed, norms));
  POLYKV_RETURN_IF_ERROR(CheckDevice(device, shape));
  POLYKV_ASSIGN_OR_RETURN(math::ValueCodebook cb, internal::GetValueCodebook(config.value_bits));
  if (device == Device::kCpu) {
    return internal::EncodeValuesCpu(v, dtype, shape, config, cb, packed, norms);
  }
  POLYKV_CUDA_BRANCH(return EncodeValuesCuda(v, dtype, shape, config, cb, packed, norms, stream));
}

Status DecodeValues(const uint8_t* packed, const float* norms, const LayerShape& shape,
                    const CodecConfig& config, void* out, DType out_dtype, Device device,
                    Stream stream) {
  POLYKV_RETURN_IF_ERROR(ValidateConfig(shape, config));
  POLYKV_RETURN_IF_ERROR(CheckIo(kValueDecode, out_dtype, packed, norms, out));
  POLYKV_RETURN_IF_ERROR(CheckDevice(device, shape));
  POLYKV_ASSIGN_OR_RETURN(math::ValueCodebook cb, internal::GetValueCodebook(config.value_bits));
  if (device == Device::kCpu) {
    internal::DecodeValuesCpu(packed, norms, shape, config, cb, out, out_dtype);
    return absl::OkStatus();
  }
  POLYKV_CUDA_BRANCH(
      return CudaStatus(cuda::InvokeDecodeValues(packed, norms, shape.vectors(), shape.head_dim, cb,
                                                 config.rotation_seed, out, DTypeCode(out_dtype),
                                                 static_cast<cudaStream_t>(stream)),
                        "value decode kernel"));
}

LayerBytes CompressedLayerBytes(const LayerShape& shape, const CodecConfig& config) {
  LayerBytes b;
  b.key_codes = shape.vectors() * PackedKeyVectorBytes(shape.head_dim, config.key_bits);
  b.key_scales = 4 * KeyScaleCount(shape, config.key_scale);
  b.value_codes = shape.vectors() * PackedVectorBytes(shape.head_dim, config.value_bits);
  b.value_norms = (config.norm_dtype == DType::kF16 ? 2 : 4) * shape.vectors();
  return b;
}

int64_t Bf16LayerBytes(const LayerShape& shape) { return 2 * 2 * shape.elements(); }

CompressionRatio ModelCompressionRatio(int32_t layers, const LayerShape& shape,
                                       const CodecConfig& config) {
  CompressionRatio r;
  r.compressed_bytes = int64_t{layers} * CompressedLayerBytes(shape, config).total();
  r.bf16_bytes = int64_t{layers} * Bf16LayerBytes(shape);
  r.effective = r.compressed_bytes > 0
                    ? static_cast<double>(r.bf16_bytes) / static_cast<double>(r.compressed_bytes)
                    : 0.0;
  r.nominal = 16.0 / ((config.key_bits + config.value_bits) / 2.0);
  return r;
}

}  // namespace polykv::kernels
