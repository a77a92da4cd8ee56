// Public API of the PolyKV KV codec: int8 keys and b-bit TurboQuant-MSE values.
//
// Shapes: one layer's K or V is a dense row-major tensor [kv_heads][tokens][head_dim]
// (GQA: the KV heads, never the repeated query heads). Inputs may be f32, f16 or bf16;
// all arithmetic accumulates in f32.
//
// Math sources:
//  - Keys: symmetric linear int8 quantization, PolyKV paper (Patel & Joshi, 2026) sec. 3.2:
//    scale = absmax / 127, q = round(x / scale) clamped to [-127, 127], x_hat = q * scale.
//  - Values: TurboQuant-MSE (Zandieh et al., 2025, "TurboQuant", Alg. 1) as used by
//    PolyKV sec. 3.3: store ||v||; u = v / ||v||; y = H * D * u (D random signs from the
//    pool's rotation seed, H the orthonormal Walsh-Hadamard transform); z = sqrt(d) * y;
//    each z_i -> nearest Lloyd-Max level for N(0,1) at b bits; indices packed densely.
//    Decode reverses every step.
//
// Keys with fewer bits (key_bits b in 4..7): scale = absmax / (2^(b-1) - 1) per group,
// q = rne(x / scale) clamped to +-(2^(b-1) - 1), stored as the unsigned code q + 2^(b-1)
// (1 .. 2^b - 1; 0 is never written) in the same dense LSB-first bit stream as the value
// codes below, one key vector = PackedKeyVectorBytes(head_dim, b) bytes, vectors in the order
// [kv_heads][tokens]. b = 8 stores the int8 q itself (two's complement), as before.
//
// Rounding: keys round to nearest, ties to EVEN (x / scale clamped to +-127, then rounded
// with the 1.5 * 2^23 constant, equal to rintf). Values pick the nearest Lloyd-Max level; a
// z exactly on a midpoint between two levels takes the lower level. A zero V vector stores
// norm 0 and code 2^(b-1) everywhere and decodes to exact zeros.
//
// Random signs D: D_i = -1 if bit 63 of Mix64(seed + (i + 1) * 0x9E3779B97F4A7C15) is set,
// else +1 (splitmix64, counter-based: no table, host and device agree); the same D for every
// vector. The norm is a sum of squares in a fixed 8-lane order (codec_math.h SumSquares).
//
// CPU and CUDA run the same per-vector functions (codec_math.h) and give identical bytes;
// CUDA calls take device pointers, run on `stream`, accept head_dim <= 512, and return
// kInternal for CUDA errors. Encode calls on CUDA synchronize the stream (to report NaN/Inf).
//
// Rotation for head_dim not a power of two: H is block-diagonal, head_dim / B orthonormal
// Walsh-Hadamard blocks of B = the largest power of two dividing head_dim (48 -> 3 x 16,
// 80 -> 5 x 16, 96 -> 3 x 32; odd head_dim -> B = 1, i.e. no rotation, only signs).
// Cost: a block mixes only its own B coordinates, so a vector whose energy sits in one
// block is not spread over all head_dim coordinates and the N(0,1) codebook fits worse
// (the big coordinates clip at the outer level, the empty blocks cost +-0.2451 each).
// On i.i.d. Gaussian vectors there is no loss (they need no rotation). Measured relative
// MSE sum|x_hat - x|^2 / sum|x|^2 at 3 bits, 1000 vectors each (test
// CodecValues.BlockRotationCostTable): "spike" = one channel of 3.0 plus N(0, 0.1^2) noise,
// "one block" = N(0,1) in channels 0..15 and zeros elsewhere:
//
//   head_dim  B    gaussian  spike    one block
//      8      8    0.0293    0.0488   0.0294    (d = 8 is short: a spike stays flat)
//     48     16    0.0331    0.0367   0.1224    <- block-diagonal cost
//     64     64    0.0332    0.0287   0.0310
//     80     16    0.0336    0.0287   0.1999    <- block-diagonal cost
//     96     32    0.0333    0.0322   0.1218    <- block-diagonal cost
//    128    128    0.0338    0.0285   0.0312
//
// Gaussian relative MSE by bits (1200 vectors, all head_dims 8..128): 2 bits 0.095-0.116,
// 3 bits 0.030-0.034, 4 bits 0.0084-0.0093 (Lloyd-Max N(0,1) distortion: 0.1175, 0.0345,
// 0.0095). A full-length rotation for such head_dims would need a dense d x d matrix
// (O(d^2) per vector) or a Hadamard of the next power of two with padding (more codes).
//
// ---------------------------------------------------------------------------------------
// Packed value layout (one vector = PackedVectorBytes(head_dim, bits) bytes)
// ---------------------------------------------------------------------------------------
// Codes c_0 .. c_{d-1} (each < 2^b) form one little-endian bit stream: code i occupies
// stream bits [i*b, i*b + b), its least significant bit first, and stream bit k is bit
// (k % 8) of byte k / 8. Unused high bits of the last byte are zero. Example, b = 3,
// codes [1, 2, 3, 4, 5, 6, 7, 0] (8 codes -> 3 bytes):
//
//   stream bit:  7 6 5 4 3 2 1 0 | 15 14 13 12 11 10 9 8 | 23 22 21 20 19 18 17 16
//   byte 0 = 0xD1:  c2[1:0] c1[2:0] c0[2:0] = 1 1 | 0 1 0 | 0 0 1
//   byte 1 = 0x58:  c5[0] c4[2:0] c3[2:0] c2[2] = 0 | 1 0 1 | 1 0 0 | 0
//   byte 2 = 0x1F:  c7[2:0] c6[2:0] c5[2:1] = 0 0 0 | 1 1 1 | 1 1
//
// i.e. c2 straddles bytes 0 and 1 and c5 straddles bytes 1 and 2. With b = 2 and b = 4 no
// code straddles a byte. Vectors follow each other with no padding, in the order
// [kv_heads][tokens]; norms are a separate f32 array [kv_heads][tokens].
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "polykv/status.h"

namespace polykv::kernels {

/// Element type of an uncompressed K/V tensor.
enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

/// Size in bytes of one element of `dtype` (4, 2 or 2).
size_t DTypeSize(DType dtype);

/// Where a call runs. kCuda requires a build with POLYKV_HAVE_CUDA and device pointers.
enum class Device : uint8_t { kCpu = 0, kCuda = 1 };

/// Opaque stream handle: a cudaStream_t for Device::kCuda (nullptr = default stream);
/// ignored on the CPU.
using Stream = void*;

/// Granularity of the int8 key scales.
enum class KeyScaleMode : uint8_t {
  kPerTensor = 0,   ///< one scale per layer tensor (the paper's default)
  kPerHead = 1,     ///< one scale per KV head: [kv_heads]
  kPerChannel = 2,  ///< one scale per (KV head, channel): [kv_heads][head_dim]
};

/// Shape of one layer's K or V tensor: [kv_heads][tokens][head_dim].
struct LayerShape {
  int32_t kv_heads = 0;
  int64_t tokens = 0;
  int32_t head_dim = 0;
  /// kv_heads * tokens * head_dim.
  int64_t elements() const { return int64_t{kv_heads} * tokens * head_dim; }
  /// kv_heads * tokens: the number of head_dim-long vectors.
  int64_t vectors() const { return int64_t{kv_heads} * tokens; }
};

/// Codec parameters; all of them are part of a pool's format.
struct CodecConfig {
  int32_t key_bits = 8;    ///< 8 (int8 codes) or 4..7 (packed codes, see above)
  int32_t value_bits = 3;  ///< 2, 3 or 4
  KeyScaleMode key_scale = KeyScaleMode::kPerTensor;
  uint64_t rotation_seed = 0x9E3779B97F4A7C15ull;  ///< seeds the random signs D
  bool norm_correction = false;  ///< store ||v|| / ||reconstruction of u|| instead of ||v||
  /// How a pool stores the value norms: kF32 or kF16 (round to nearest even). EncodeValues
  /// and DecodeValues always take f32 norms; NormsToF16 / NormsFromF16 convert, so an f16
  /// pool decodes with the rounded norms.
  DType norm_dtype = DType::kF32;
};

/// Sets the number of CPU threads the codec uses (n < 1: all hardware threads, the
/// default). Thread-safe; applies to calls that start afterwards.
void SetCodecThreads(int n);

/// Number of CPU threads the codec uses (>= 1).
int CodecThreads();

/// Checks a shape and config; kInvalidArgument naming the bad field (kv_heads, tokens,
/// head_dim >= 1; key_bits 4..8; value_bits 2, 3 or 4; norm_dtype f32 or f16).
[[nodiscard]] Status ValidateConfig(const LayerShape& shape, const CodecConfig& config);

// ---------------------------------------------------------------------------------------
// Keys: int8 symmetric linear quantization.
// ---------------------------------------------------------------------------------------

/// Number of f32 scales for `mode`: 1, kv_heads, or kv_heads * head_dim.
int64_t KeyScaleCount(const LayerShape& shape, KeyScaleMode mode);

/// Quantizes K [kv_heads][tokens][head_dim] (dtype) to int8 `q` (same shape) and f32
/// `scales` (KeyScaleCount entries). scale = absmax/127 over the scale's group; an all-zero
/// group gets scale 1 (decodes to exact zeros).
/// Errors: kInvalidArgument for NaN/Inf input (naming the first bad index) or a bad shape;
/// kUnimplemented for Device::kCuda in a CPU-only build.
[[nodiscard]] Status QuantizeKeys(const void* k, DType dtype, const LayerShape& shape,
                                  KeyScaleMode mode, int8_t* q, float* scales,
                                  Device device = Device::kCpu, Stream stream = nullptr);

/// Quantizes K with caller-given `scales` (KeyScaleCount entries, each finite and > 0),
/// e.g. scales computed once over a whole document, so that tokens appended later (or a
/// tensor quantized token by token) give the same bytes as one batch: q = rne(x / scale)
/// clamped to [-127, 127]. Errors: kInvalidArgument for NaN/Inf input (naming the first
/// bad index), a bad shape, or a bad scale (checked on the CPU path only: on CUDA the
/// scales are device memory); kUnimplemented for Device::kCuda in a CPU-only build.
[[nodiscard]] Status QuantizeKeysWithScales(const void* k, DType dtype, const LayerShape& shape,
                                            KeyScaleMode mode, const float* scales, int8_t* q,
                                            Device device = Device::kCpu, Stream stream = nullptr);

/// Inverse of QuantizeKeys: out[i] = q[i] * scale(i), written as `out_dtype`.
/// |out - x| <= scale/2 elementwise (before rounding to out_dtype).
[[nodiscard]] Status DequantizeKeys(const int8_t* q, const float* scales, const LayerShape& shape,
                                    KeyScaleMode mode, void* out, DType out_dtype,
                                    Device device = Device::kCpu, Stream stream = nullptr);

/// Bytes of one key vector's codes: head_dim for 8 bits, else ceil(bits * head_dim / 8).
int64_t PackedKeyVectorBytes(int32_t head_dim, int32_t bits);

/// Encodes K [kv_heads][tokens][head_dim] (dtype) at config.key_bits with config.key_scale
/// into `codes` ([vectors][PackedKeyVectorBytes]) and f32 `scales` (KeyScaleCount). 8 bits:
/// the bytes of QuantizeKeys. On Device::kCuda the same bytes as the CPU for every key width
/// (codec_math.h's per-element math; packed keys through a stream-ordered int8 scratch).
/// Errors as QuantizeKeys.
[[nodiscard]] Status EncodeKeys(const void* k, DType dtype, const LayerShape& shape,
                                const CodecConfig& config, uint8_t* codes, float* scales,
                                Device device = Device::kCpu, Stream stream = nullptr);

/// Inverse of EncodeKeys: out = q * scale as `out_dtype` (on either device, the same
/// values). Same errors.
[[nodiscard]] Status DecodeKeys(const uint8_t* codes, const float* scales, const LayerShape& shape,
                                const CodecConfig& config, void* out, DType out_dtype,
                                Device device = Device::kCpu, Stream stream = nullptr);

/// The signed key values q of `n` packed key vectors of `bits` (4..8) into int8
/// [n][head_dim] (8 bits: a copy). Host memory.
void UnpackKeyVectors(const uint8_t* codes, int64_t n, int32_t head_dim, int32_t bits, int8_t* q);
/// The plain C++ reference of UnpackKeyVectors (which uses BMI2 PDEP on CPUs that have it;
/// both give the same bytes).
void UnpackKeyVectorsScalar(const uint8_t* codes, int64_t n, int32_t head_dim, int32_t bits,
                            int8_t* q);

/// Value norms f32 -> f16 (round to nearest even; host memory) and back.
void NormsToF16(const float* in, int64_t n, uint16_t* out);
/// NormsToF16 (from == kF32: `in` f32, `out` f16) or NormsFromF16 (from == kF16) of n norms
/// on `device` (kCuda: device pointers, enqueued on `stream`; the same bits as the host).
/// Errors: kInvalidArgument (n < 0, another dtype, null pointers), kUnimplemented (CUDA not
/// built), kInternal (CUDA error).
[[nodiscard]] Status ConvertNorms(const void* in, DType from, int64_t n, void* out, Device device,
                                  Stream stream = nullptr);
void NormsFromF16(const uint16_t* in, int64_t n, float* out);

// ---------------------------------------------------------------------------------------
// Values: TurboQuant-MSE at b bits.
// ---------------------------------------------------------------------------------------

/// Bytes of one packed vector: ceil(bits * head_dim / 8).
int64_t PackedVectorBytes(int32_t head_dim, int32_t bits);

/// Lloyd-Max reconstruction levels for N(0,1) at `bits` (2^bits ascending levels),
/// computed by Lloyd's algorithm on the Gaussian density (not tabulated).
/// 3 bits: +-0.2451, +-0.7560, +-1.3439, +-2.1519. Errors: kInvalidArgument for bits
/// outside 1..4.
[[nodiscard]] StatusOr<std::vector<float>> LloydMaxCodebook(int32_t bits);

/// Encodes V [kv_heads][tokens][head_dim] (dtype) into `packed`
/// ([vectors][PackedVectorBytes]) and f32 `norms` ([vectors]).
/// Errors: kInvalidArgument for NaN/Inf input or a bad config.
[[nodiscard]] Status EncodeValues(const void* v, DType dtype, const LayerShape& shape,
                                  const CodecConfig& config, uint8_t* packed, float* norms,
                                  Device device = Device::kCpu, Stream stream = nullptr);

/// Decodes `packed` + `norms` back to [kv_heads][tokens][head_dim] as `out_dtype`.
[[nodiscard]] Status DecodeValues(const uint8_t* packed, const float* norms,
                                  const LayerShape& shape, const CodecConfig& config, void* out,
                                  DType out_dtype, Device device = Device::kCpu,
                                  Stream stream = nullptr);

// ---------------------------------------------------------------------------------------
// Byte accounting.
// ---------------------------------------------------------------------------------------

/// Exact compressed size of one layer (K and V), in bytes.
struct LayerBytes {
  int64_t key_codes = 0;    ///< vectors * PackedKeyVectorBytes (int8 K: elements)
  int64_t key_scales = 0;   ///< 4 * KeyScaleCount
  int64_t value_codes = 0;  ///< vectors * PackedVectorBytes
  int64_t value_norms = 0;  ///< 4 (f32) or 2 (f16) * vectors
  int64_t total() const { return key_codes + key_scales + value_codes + value_norms; }
};

/// Compressed bytes of one layer, without alignment padding or pool headers.
LayerBytes CompressedLayerBytes(const LayerShape& shape, const CodecConfig& config);

/// bf16 bytes of one layer's K and V: 2 * 2 * elements.
int64_t Bf16LayerBytes(const LayerShape& shape);

/// Compression of a whole model's KV cache relative to bf16.
struct CompressionRatio {
  int64_t compressed_bytes = 0;  ///< layers * CompressedLayerBytes(...).total()
  int64_t bf16_bytes = 0;        ///< layers * Bf16LayerBytes(...)
  double effective = 0.0;        ///< bf16_bytes / compressed_bytes (scales and norms counted)
  double nominal = 0.0;          ///< the paper's 16 / ((key_bits + value_bits) / 2): 2.91 for K8/V3
};

/// Effective and nominal compression ratio vs bf16 for `layers` layers of `shape`
/// (e.g. SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64; Llama-3-8B: 32, 8, 128).
CompressionRatio ModelCompressionRatio(int32_t layers, const LayerShape& shape,
                                       const CodecConfig& config);

}  // namespace polykv::kernels
