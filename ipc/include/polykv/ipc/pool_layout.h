// The pool format: one contiguous region holding a document's compressed KV cache.
// The header alone lets a reader decode the pool; the ipc module knows no model.
//
//   offset 0                                   (every section 256-byte aligned)
//   +--------------------------------------------+
//   | PoolHeader (4096 bytes, fixed)              |  magic "PKVPOOL1", format_version,
//   |                                             |  shape, codec, seed, checksums
//   +--------------------------------------------+
//   | token ids: int32 [tokens]                   |
//   +--------------------------------------------+
//   | layer 0: codec k8vb:                        |
//   |   K codes   int8  [kv_heads][tokens][head_dim]  (key_bits 8; 4..7: packed,
//   |                   [kv_heads*tokens][PackedKeyVectorBytes(head_dim, key_bits)])
//   |   K scales  f32   [KeyScaleCount]           |
//   |   V codes   u8    [kv_heads*tokens][PackedVectorBytes(head_dim, the layer's bits)]
//   |   V norms   f32 or f16 (norm_dtype) [kv_heads*tokens]
//   |          codec none:                        |
//   |   K raw     dtype [kv_heads][tokens][head_dim]
//   |   V raw     dtype [kv_heads][tokens][head_dim]
//   +--------------------------------------------+
//   | layer 1 ...                                 |
//   +--------------------------------------------+
//
// Offsets of every section are computed by ComputePoolLayout from the header fields, so
// they are not stored per layer. payload_checksum covers [header_bytes, total_bytes);
// header_checksum covers the header with header_checksum itself zeroed. Both XXH64-style
// 64-bit (see pool_layout.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "polykv/kernels/attention.h"
#include "polykv/kernels/codec.h"
#include "polykv/status.h"

namespace polykv::ipc {

inline constexpr char kPoolMagic[8] = {'P', 'K', 'V', 'P', 'O', 'O', 'L', '1'};
inline constexpr uint32_t kPoolFormatVersion = 1;
inline constexpr uint32_t kPoolHeaderBytes = 4096;
inline constexpr uint64_t kPoolSectionAlign = 256;
/// Most layers whose reconstruction error the header records (PoolHeader::fidelity_layers).
inline constexpr uint32_t kPoolFidelityLayers = 256;

/// How K and V are stored.
enum class PoolCodec : uint32_t {
  kNone = 0,  ///< K and V unchanged in `raw_dtype` (memory baseline, bit-exact reference)
  kK8V = 1,   ///< int8 keys + TurboQuant-MSE values at codec.value_bits
};

/// The fixed 4096-byte header at offset 0. Plain old data, little-endian.
struct PoolHeader {
  char magic[8];               ///< kPoolMagic
  uint32_t format_version;     ///< kPoolFormatVersion
  uint32_t header_bytes;       ///< kPoolHeaderBytes
  uint64_t total_bytes;        ///< whole region, header included
  uint8_t pool_id[32];         ///< SHA-256 content address (see daemon)
  char model_fingerprint[72];  ///< hex SHA-256, NUL-terminated
  char tokenizer_fingerprint[72];
  uint32_t layers;
  uint32_t kv_heads;
  uint32_t head_dim;
  uint32_t codec;  ///< PoolCodec
  uint64_t tokens;
  uint32_t raw_dtype;       ///< kernels::DType of kNone payloads
  uint32_t key_bits;        ///< 8 (int8 codes) or 4..7 (packed, kernels::EncodeKeys)
  uint32_t value_bits;      ///< 2, 3 or 4
  uint32_t key_scale_mode;  ///< kernels::KeyScaleMode
  uint64_t rotation_seed;
  uint32_t norm_correction;  ///< 0 or 1
  uint32_t reserved0;
  uint64_t payload_checksum;  ///< over [header_bytes, total_bytes)
  uint64_t header_checksum;   ///< over the header with this field zeroed
  /// Model architecture the pool was prefilled with ("llama", "qwen2", "mistral"),
  /// NUL-terminated; empty in pools written before it was recorded (the bytes were reserved
  /// and zero).
  char architecture[32];
  /// Tokenizer family ("bpe/llama3", "bpe/qwen2", "spm", "none" without a tokenizer),
  /// NUL-terminated; empty in older pools.
  char tokenizer_family[48];
  /// Reconstruction error measured when the pool was written (PoolWriter, host writes): per
  /// layer, the relative MSE sum((x' - x)^2) / sum(x^2) of the decoded keys (values) x' against
  /// the K (V) given to WriteLayer, over the whole layer. 0 layers: not recorded (pools
  /// written on a device, with more than kPoolFidelityLayers layers, or before it was
  /// recorded: these bytes were reserved and zero). Covered by header_checksum.
  uint32_t fidelity_layers;
  uint32_t reserved1;
  float key_rel_mse[kPoolFidelityLayers];
  float value_rel_mse[kPoolFidelityLayers];
  /// A pool tree: positions of the parent chain this pool continues (0: a root pool). The
  /// pool's `tokens` are its own, at positions parent_tokens .. parent_tokens + tokens - 1,
  /// and its K/V were prefilled attending to the parent chain's KV.
  uint64_t parent_tokens;
  /// SHA-256 id of the parent pool (all zero for a root pool). Covered by header_checksum.
  uint8_t parent_id[32];
  /// kK8V: how the value norms are stored: kernels::DType kF32 (0; also every pool written
  /// before it was recorded) or kF16 (1).
  uint32_t norm_dtype;
  /// kK8V: per-layer value bits (2..4; 0 = value_bits), e.g. boundary layers at higher
  /// precision; all 0 in pools of one width (and of more than kPoolFidelityLayers layers).
  uint8_t layer_value_bits[kPoolFidelityLayers];
  uint8_t reserved[4096 - 8 - 4 - 4 - 8 - 32 - 72 - 72 - 4 * 4 - 8 - 4 * 4 - 8 - 4 - 4 - 8 - 8 -
                   32 - 48 - 4 - 4 - 2 * 4 * kPoolFidelityLayers - 8 - 32 - 4 -
                   kPoolFidelityLayers];
};
static_assert(sizeof(PoolHeader) == kPoolHeaderBytes, "PoolHeader must be 4096 bytes");

/// Everything needed to size and describe a pool.
struct PoolParams {
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint64_t tokens = 0;
  PoolCodec codec = PoolCodec::kK8V;
  kernels::CodecConfig codec_config;
  kernels::DType raw_dtype = kernels::DType::kF32;  ///< for PoolCodec::kNone
  std::string model_fingerprint;
  std::string tokenizer_fingerprint;
  std::string architecture;      ///< < 32 chars (PoolHeader::architecture)
  std::string tokenizer_family;  ///< < 48 chars (PoolHeader::tokenizer_family)
  /// A child pool (pool tree): the parent's id (64 lowercase hex) and the positions of the
  /// whole parent chain; empty and 0 for a root pool.
  std::string parent_id;
  uint64_t parent_tokens = 0;
  /// kK8V: value bits per layer (empty = codec_config.value_bits for every layer; else
  /// `layers` entries of 2..4, at most kPoolFidelityLayers layers).
  std::vector<int32_t> layer_value_bits;
  /// Value bits of layer `l`.
  int32_t ValueBitsOf(uint32_t l) const {
    return l < layer_value_bits.size() && layer_value_bits[l] > 0 ? layer_value_bits[l]
                                                                  : codec_config.value_bits;
  }
};

/// Byte offsets of one layer's sections from the start of the region.
struct LayerOffsets {
  uint64_t k = 0;         ///< K codes (int8) or raw K
  uint64_t k_scales = 0;  ///< f32 scales (kK8V only)
  uint64_t v = 0;         ///< packed V codes or raw V
  uint64_t v_norms = 0;   ///< f32 norms (kK8V only)
  uint64_t end = 0;       ///< one past the layer's last byte
};

/// The computed layout of a pool.
struct PoolLayout {
  uint64_t token_ids = 0;  ///< offset of int32 [tokens]
  std::vector<LayerOffsets> layer;
  uint64_t total_bytes = 0;
  /// Bytes by part, for `pools show`: K codes, K scales, V codes, V norms (raw K/V for
  /// kNone go to key_codes/value_codes), and header + token ids + alignment padding.
  uint64_t key_codes = 0, key_scales = 0, value_codes = 0, value_norms = 0, overhead = 0;
};

/// Validates params (kInvalidArgument naming the field) and computes the layout.
[[nodiscard]] StatusOr<PoolLayout> ComputePoolLayout(const PoolParams& params);

/// Bytes of the same KV cache held privately in bf16 (2 bytes x 2 tensors x elements).
uint64_t Bf16CacheBytes(const PoolParams& params);

/// Fills a pool in a writable region `base` of `size` bytes (host memory, or device memory
/// with Device::kCuda). Layers may be written in any order; Finalize computes checksums and
/// must be the last write before the region is published.
class PoolWriter {
 public:
  /// Errors: kInvalidArgument when `size` < layout total, or token_ids.size() != tokens.
  [[nodiscard]] static StatusOr<PoolWriter> Create(void* base, uint64_t size,
                                                   const PoolParams& params,
                                                   absl::Span<const uint8_t> pool_id,
                                                   absl::Span<const int32_t> token_ids,
                                                   kernels::Device device = kernels::Device::kCpu);
  /// Encodes one layer's K and V ([kv_heads][tokens][head_dim], `dtype`, on `device`).
  [[nodiscard]] Status WriteLayer(uint32_t layer, const void* k, const void* v,
                                  kernels::DType dtype);
  /// Computes the checksums and writes the header. Errors: kFailedPrecondition if a layer
  /// was not written.
  [[nodiscard]] Status Finalize();
  const PoolLayout& layout() const { return layout_; }
  /// Per-layer reconstruction error of the layers written so far (host writes; empty on a
  /// device): what Finalize records in the header.
  const std::vector<float>& key_rel_mse() const { return key_rel_mse_; }
  const std::vector<float>& value_rel_mse() const { return value_rel_mse_; }

 private:
  PoolWriter() = default;
  void* base_ = nullptr;
  uint64_t size_ = 0;
  PoolParams params_;
  PoolLayout layout_;
  std::vector<bool> written_;
  std::vector<uint8_t> pool_id_;
  kernels::Device device_ = kernels::Device::kCpu;
  std::vector<float> key_rel_mse_, value_rel_mse_;  ///< [layers] (host writes)
};

/// Relative reconstruction error of one layer: sum((x' - x)^2) / sum(x^2) of the keys and of
/// the values (when sum(x^2) = 0: 0 if the decoded values are 0 too, else 1).
struct LayerFidelity {
  double key_rel_mse = 0;
  double value_rel_mse = 0;
};

/// Read-only view of a published pool. Never writes to the region.
class PoolReader {
 public:
  /// Checks magic, version, header checksum, sizes; with `verify_payload` also the payload
  /// checksum (a full pass over the region). Errors: kDataLoss naming what failed,
  /// kInvalidArgument for an unknown version or a region smaller than total_bytes.
  [[nodiscard]] static StatusOr<PoolReader> Open(const void* base, uint64_t size,
                                                 bool verify_payload,
                                                 kernels::Device device = kernels::Device::kCpu);
  const PoolHeader& header() const { return header_; }
  const PoolParams& params() const { return params_; }
  const PoolLayout& layout() const { return layout_; }
  /// Token ids of the document (host pools; for device pools copies to host).
  std::vector<int32_t> TokenIds() const;
  /// Decodes layer `layer` into K and V outputs [kv_heads][tokens][head_dim] of
  /// `out_dtype` on `device` (the pool's device). kNone copies (converting dtype).
  [[nodiscard]] Status DecodeLayer(uint32_t layer, void* k_out, void* v_out,
                                   kernels::DType out_dtype,
                                   kernels::Stream stream = nullptr) const;
  /// Recomputes the payload checksum and compares it with the header's.
  [[nodiscard]] Status VerifyPayload() const;
  /// The per-layer reconstruction error recorded in the header at build (empty when not
  /// recorded; see PoolHeader::fidelity_layers).
  std::vector<LayerFidelity> RecordedFidelity() const;
  /// Decodes layer `layer` (host pools) and measures it against reference K and V
  /// ([kv_heads][tokens][head_dim] in `dtype`, host memory), e.g. a fresh prefill of the
  /// pool's tokens. Errors: kInvalidArgument (layer, null), kFailedPrecondition on a device.
  [[nodiscard]] StatusOr<LayerFidelity> MeasureFidelity(uint32_t layer, const void* k,
                                                        const void* v, kernels::DType dtype) const;
  /// First byte of the region (host or device address).
  const uint8_t* base() const { return base_; }
  kernels::Device device() const { return device_; }

 private:
  PoolReader() = default;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  PoolHeader header_{};
  PoolParams params_;
  PoolLayout layout_;
  kernels::Device device_ = kernels::Device::kCpu;
};

/// Decodes layer `layer` on the CPU from a host copy of its bytes: `bytes` holds the pool
/// region's [layout.layer[layer].k, layout.layer[layer].end) (e.g. a CUDA pool's layer copied
/// to the host: every codec, packed keys and f16 norms included). Outputs as
/// PoolReader::DecodeLayer, host memory. Errors: kOutOfRange (layer), the codec's errors.
[[nodiscard]] Status DecodeLayerCopy(const uint8_t* bytes, const PoolParams& params,
                                     const PoolLayout& layout, uint32_t layer, void* k_out,
                                     void* v_out, kernels::DType out_dtype);

/// A read-only view of a host pool's K/V for attention in place (kernels/attention.h): per
/// layer, pointers into the region `reader` was opened on (valid while it stays mapped).
/// Errors: kFailedPrecondition for a device (CUDA) reader.
[[nodiscard]] StatusOr<kernels::PrefixView> PrefixViewOf(const PoolReader& reader);

/// The same view of a pool in CUDA memory: every pointer is device memory (for the CUDA
/// attention kernels, AttentionOptions::device = kCuda), valid while the CUDA IPC mapping
/// lives. Errors: kFailedPrecondition for a host reader.
[[nodiscard]] StatusOr<kernels::PrefixView> DevicePrefixViewOf(const PoolReader& reader);

/// 64-bit checksum used by the pool format (XXH64 over `bytes`, seed 0).
uint64_t Checksum64(const void* data, uint64_t bytes);

}  // namespace polykv::ipc
