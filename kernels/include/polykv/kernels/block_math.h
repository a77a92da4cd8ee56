// Weight-block math of the device matrix kernels, written once for g++ and nvcc: block
// dequantization (the GGUF layouts of matmul.h, values in the scalar reference's order and
// arithmetic, so results equal kernels::DequantizeRows byte for byte) and the per-lane block
// dot products and warp reduction order of the CUDA matrix-vector kernels
// (kernels/cuda/matvec_kernels.cu), so that the CPU can compute bit for bit what one warp
// computes (MatVecRowWarpOrder) and CI without a GPU tests the GPU's arithmetic.
//
// Types are ggml's numbers (matmul.h WeightType): F32 0, F16 1, Q4_0 2, Q4_1 3, Q5_0 6,
// Q5_1 7, Q8_0 8, BF16 30. Blocks are read byte by byte (any alignment; GGUF blocks of 18,
// 20, 22, 24 and 34 bytes are only 2-byte aligned), little-endian.
//
// Exactness: a dequantized value is the format's own f32 arithmetic: (q - 8) d, q d + m,
// (q5 - 16) d, q5 d + m, q d, with d and m converted from f16 exactly (dtype_convert.h). The
// host build uses -ffp-contract=off and the CUDA build -fmad=false, so q d + m is one
// rounded multiply and one rounded add on both.
//
// Nothing in this header allocates, throws or touches global state.
#pragma once

#include <cstdint>

#include "polykv/kernels/dtype_convert.h"

/// Full unrolling of a constant-count loop in device code (nothing on the host, where g++
/// would warn about the pragma).
#if defined(__CUDA_ARCH__)
#define POLYKV_DEVICE_UNROLL _Pragma("unroll")
#else
#define POLYKV_DEVICE_UNROLL
#endif

namespace polykv::kernels::blocks {

/// ggml type numbers of the block types with device kernels (values of matmul.h WeightType).
inline constexpr uint32_t kF32 = 0;
inline constexpr uint32_t kF16 = 1;
inline constexpr uint32_t kQ4_0 = 2;
inline constexpr uint32_t kQ4_1 = 3;
inline constexpr uint32_t kQ5_0 = 6;
inline constexpr uint32_t kQ5_1 = 7;
inline constexpr uint32_t kQ8_0 = 8;
inline constexpr uint32_t kBF16 = 30;

/// Whether `type` has device kernels (the types above).
POLYKV_HD inline bool DeviceTypeSupported(uint32_t type) {
  return type == kF32 || type == kF16 || type == kBF16 || type == kQ4_0 || type == kQ4_1 ||
         type == kQ5_0 || type == kQ5_1 || type == kQ8_0;
}

/// Values per block: 1 for F32/F16/BF16, 32 for the quantized types; 0 for another type.
POLYKV_HD inline int BlockValues(uint32_t type) {
  switch (type) {
    case kF32:
    case kF16:
    case kBF16:
      return 1;
    case kQ4_0:
    case kQ4_1:
    case kQ5_0:
    case kQ5_1:
    case kQ8_0:
      return 32;
    default:
      return 0;
  }
}

/// Bytes per block: 4, 2, 2, 18, 20, 22, 24, 34; 0 for another type.
POLYKV_HD inline int BlockBytes(uint32_t type) {
  switch (type) {
    case kF32:
      return 4;
    case kF16:
    case kBF16:
      return 2;
    case kQ4_0:
      return 18;
    case kQ4_1:
      return 20;
    case kQ5_0:
      return 22;
    case kQ5_1:
      return 24;
    case kQ8_0:
      return 34;
    default:
      return 0;
  }
}

/// Little-endian u16 / u32 / f16 / bf16 / f32 at any byte address.
POLYKV_DTYPE_INLINE uint16_t LoadU16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (static_cast<uint16_t>(p[1]) << 8));
}
POLYKV_DTYPE_INLINE uint32_t LoadU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
POLYKV_DTYPE_INLINE float LoadF16At(const uint8_t* p) { return dtype::F16ToFloat(LoadU16(p)); }
POLYKV_DTYPE_INLINE float LoadBf16At(const uint8_t* p) { return dtype::Bf16ToFloat(LoadU16(p)); }
POLYKV_DTYPE_INLINE float LoadF32At(const uint8_t* p) { return dtype::BitsFloat(LoadU32(p)); }

// ---------------------------------------------------------------------------------------
// Dequantization of one block to f32 (the scalar reference's formulas and order).
// ---------------------------------------------------------------------------------------

/// Q4_0 (18 B: f16 d | u8 qs[16]): y[j] = (lo(qs[j]) - 8) d, y[j + 16] = (hi(qs[j]) - 8) d.
POLYKV_HD inline void DequantizeQ4_0(const uint8_t* b, float* y) {
  const float d = LoadF16At(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0f) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

/// Q4_1 (20 B: f16 d | f16 m | u8 qs[16]): y[j] = lo d + m, y[j + 16] = hi d + m.
POLYKV_HD inline void DequantizeQ4_1(const uint8_t* b, float* y) {
  const float d = LoadF16At(b), m = LoadF16At(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0f) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

/// 5-bit code j (0..31) of a Q5_0 / Q5_1 block: the nibble of qs (low for j < 16, high for
/// j >= 16) with bit j of the u32 qh as its 5th bit.
POLYKV_HD inline int Q5Code(uint32_t qh, const uint8_t* qs, int j) {
  const int nib = j < 16 ? (qs[j] & 0x0f) : (qs[j - 16] >> 4);
  return nib | static_cast<int>(((qh >> j) & 1u) << 4);
}

/// Q5_0 (22 B: f16 d | u32 qh | u8 qs[16]): y[j] = (q5 - 16) d.
POLYKV_HD inline void DequantizeQ5_0(const uint8_t* b, float* y) {
  const float d = LoadF16At(b);
  const uint32_t qh = LoadU32(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(Q5Code(qh, b + 6, j) - 16) * d;
}

/// Q5_1 (24 B: f16 d | f16 m | u32 qh | u8 qs[16]): y[j] = q5 d + m.
POLYKV_HD inline void DequantizeQ5_1(const uint8_t* b, float* y) {
  const float d = LoadF16At(b), m = LoadF16At(b + 2);
  const uint32_t qh = LoadU32(b + 4);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(Q5Code(qh, b + 8, j)) * d + m;
}

/// Q8_0 (34 B: f16 d | i8 qs[32]): y[j] = qs[j] d.
POLYKV_HD inline void DequantizeQ8_0(const uint8_t* b, float* y) {
  const float d = LoadF16At(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

/// Dequantizes one block of `type` (BlockValues(type) values) to y. Returns false (nothing
/// written) for a type without device kernels.
POLYKV_HD inline bool DequantizeBlock(uint32_t type, const uint8_t* b, float* y) {
  switch (type) {
    case kF32:
      y[0] = LoadF32At(b);
      return true;
    case kF16:
      y[0] = LoadF16At(b);
      return true;
    case kBF16:
      y[0] = LoadBf16At(b);
      return true;
    case kQ4_0:
      DequantizeQ4_0(b, y);
      return true;
    case kQ4_1:
      DequantizeQ4_1(b, y);
      return true;
    case kQ5_0:
      DequantizeQ5_0(b, y);
      return true;
    case kQ5_1:
      DequantizeQ5_1(b, y);
      return true;
    case kQ8_0:
      DequantizeQ8_0(b, y);
      return true;
    default:
      return false;
  }
}

/// Value `i` of a row of `type` (i < cols): the same value DequantizeBlock writes.
POLYKV_HD inline float RowValue(uint32_t type, const uint8_t* row, int64_t i) {
  switch (type) {
    case kF32:
      return LoadF32At(row + 4 * i);
    case kF16:
      return LoadF16At(row + 2 * i);
    case kBF16:
      return LoadBf16At(row + 2 * i);
    default:
      break;
  }
  const int bytes = BlockBytes(type);
  const uint8_t* b = row + (i / 32) * bytes;
  const int j = static_cast<int>(i % 32);
  switch (type) {
    case kQ4_0: {
      const uint8_t q = b[2 + (j & 15)];
      return static_cast<float>((j < 16 ? (q & 0x0f) : (q >> 4)) - 8) * LoadF16At(b);
    }
    case kQ4_1: {
      const uint8_t q = b[4 + (j & 15)];
      return static_cast<float>(j < 16 ? (q & 0x0f) : (q >> 4)) * LoadF16At(b) + LoadF16At(b + 2);
    }
    case kQ5_0:
      return static_cast<float>(Q5Code(LoadU32(b + 2), b + 6, j) - 16) * LoadF16At(b);
    case kQ5_1:
      return static_cast<float>(Q5Code(LoadU32(b + 4), b + 8, j)) * LoadF16At(b) + LoadF16At(b + 2);
    case kQ8_0:
      return static_cast<float>(static_cast<int8_t>(b[2 + j])) * LoadF16At(b);
    default:
      return 0.0f;
  }
}

// ---------------------------------------------------------------------------------------
// Matrix-vector products: what one lane of a warp computes, and the warp's reduction.
//
// One warp computes one output y[o] = sum_i W[o][i] x[i] (matvec_kernels.cu):
//  - 32-value block types: lane l takes blocks l, l + 32, l + 64, ... of the row, in that
//    order; per block it sums q x over the 32 values (f32, in DotBlock's order) and adds
//    the block's scale times that sum to its f32 accumulator (the block's d factored out:
//    d sum (q - 8) x for Q4_0, d sum q x + m sum x for Q4_1, ...);
//  - F32 / F16 / BF16: lane l takes values l, l + 32, l + 64, ... (consecutive lanes read
//    consecutive values: coalesced), acc += w x;
//  - the 32 lane sums are added by the xor butterfly v += shfl_xor(v, o) for o = 16, 8, 4,
//    2, 1 (WarpSumOrder), and lane 0 writes the result.
// A batch of rows (n <= 16) multiplies each weight block read by a lane with every row, in
// the same per-row order, so a row's result does not depend on n.
// ---------------------------------------------------------------------------------------

/// Lanes per warp.
inline constexpr int kWarp = 32;

/// Dot product of one 32-value block of `type` with x[0..32) in the kernels' order.
template <uint32_t kType>
POLYKV_HD inline float DotBlock(const uint8_t* b, const float* x) {
  if constexpr (kType == kQ4_0) {
    const uint8_t* qs = b + 2;
    float s = 0.0f;
    POLYKV_DEVICE_UNROLL
    for (int j = 0; j < 16; ++j) {
      s += static_cast<float>((qs[j] & 0x0f) - 8) * x[j];
      s += static_cast<float>((qs[j] >> 4) - 8) * x[j + 16];
    }
    return LoadF16At(b) * s;
  } else if constexpr (kType == kQ4_1) {
    const uint8_t* qs = b + 4;
    float s = 0.0f, sx = 0.0f;
    POLYKV_DEVICE_UNROLL
    for (int j = 0; j < 16; ++j) {
      s += static_cast<float>(qs[j] & 0x0f) * x[j];
      s += static_cast<float>(qs[j] >> 4) * x[j + 16];
      sx += x[j];
      sx += x[j + 16];
    }
    return LoadF16At(b) * s + LoadF16At(b + 2) * sx;
  } else if constexpr (kType == kQ5_0) {
    const uint32_t qh = LoadU32(b + 2);
    float s = 0.0f;
    POLYKV_DEVICE_UNROLL
    for (int j = 0; j < 32; ++j) s += static_cast<float>(Q5Code(qh, b + 6, j) - 16) * x[j];
    return LoadF16At(b) * s;
  } else if constexpr (kType == kQ5_1) {
    const uint32_t qh = LoadU32(b + 4);
    float s = 0.0f, sx = 0.0f;
    POLYKV_DEVICE_UNROLL
    for (int j = 0; j < 32; ++j) {
      s += static_cast<float>(Q5Code(qh, b + 8, j)) * x[j];
      sx += x[j];
    }
    return LoadF16At(b) * s + LoadF16At(b + 2) * sx;
  } else {
    static_assert(kType == kQ8_0, "DotBlock: a 32-value block type");
    float s = 0.0f;
    POLYKV_DEVICE_UNROLL
    for (int j = 0; j < 32; ++j) s += static_cast<float>(static_cast<int8_t>(b[2 + j])) * x[j];
    return LoadF16At(b) * s;
  }
}

/// Element i of an F32 / F16 / BF16 row.
template <uint32_t kType>
POLYKV_HD inline float FloatRowValue(const uint8_t* row, int64_t i) {
  if constexpr (kType == kF32) {
    return LoadF32At(row + 4 * i);
  } else if constexpr (kType == kF16) {
    return LoadF16At(row + 2 * i);
  } else {
    static_assert(kType == kBF16, "FloatRowValue: F32, F16 or BF16");
    return LoadBf16At(row + 2 * i);
  }
}

/// Lane `lane`'s partial sum of row . x (`cols` values; see the comment above).
template <uint32_t kType>
POLYKV_HD inline float LanePartial(const uint8_t* row, int64_t cols, const float* x, int lane) {
  float acc = 0.0f;
  if constexpr (kType == kF32 || kType == kF16 || kType == kBF16) {
    for (int64_t i = lane; i < cols; i += kWarp) acc += FloatRowValue<kType>(row, i) * x[i];
  } else {
    constexpr int kBytes = kType == kQ4_0   ? 18
                           : kType == kQ4_1 ? 20
                           : kType == kQ5_0 ? 22
                           : kType == kQ5_1 ? 24
                                            : 34;
    const int64_t nb = cols / 32;
    for (int64_t b = lane; b < nb; b += kWarp) acc += DotBlock<kType>(row + b * kBytes, x + 32 * b);
  }
  return acc;
}

/// The warp's xor-butterfly sum of 32 lane values, as lane 0 ends with it: for o = 16, 8,
/// 4, 2, 1: v[l] = v[l] + v[l ^ o]. `v` is overwritten.
POLYKV_HD inline float WarpSumOrder(float* v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    float t[kWarp];
    for (int l = 0; l < kWarp; ++l) t[l] = v[l] + v[l ^ o];
    for (int l = 0; l < kWarp; ++l) v[l] = t[l];
  }
  return v[0];
}

/// row . x exactly as one warp of the CUDA matrix-vector kernel computes it (host
/// emulation: the 32 lane partials, then WarpSumOrder).
template <uint32_t kType>
POLYKV_HD inline float MatVecRowWarpOrder(const uint8_t* row, int64_t cols, const float* x) {
  float v[kWarp];
  for (int l = 0; l < kWarp; ++l) v[l] = LanePartial<kType>(row, cols, x, l);
  return WarpSumOrder(v);
}

/// The one dispatch of a device weight type to a compile-time constant: runs `...` with
/// `constexpr uint32_t kType` equal to `type`; another type runs `on_unsupported`.
#define POLYKV_DISPATCH_DEVICE_WEIGHT_TYPE(type, kType, on_unsupported, ...) \
  switch (type) {                                                            \
    POLYKV_DEVICE_WEIGHT_TYPE_CASE(kF32, kType, __VA_ARGS__)                 \
    POLYKV_DEVICE_WEIGHT_TYPE_CASE(kF16, kType, __VA_ARGS__)                 \
    POLYKV_DEVICE_WEIGHT_TYPE_CASE(kBF16, kType, __VA_ARGS__)                \
    POLYKV_DEVICE_WEIGHT_TYPE_CASE(kQ4_0, kType, __VA_ARGS__)                \
    POLYKV_DEVICE_WEIGHT_TYPE_CASE(kQ4_1, kType, __VA_ARGS__)                \
    POLYKV_DEVICE_WEIGHT_TYPE_CASE(kQ5_0, kType, __VA_ARGS__)                \
    POLYKV_DEVICE_WEIGHT_TYPE_CASE(kQ5_1, kType, __VA_ARGS__)                \
    POLYKV_DEVICE_WEIGHT_TYPE_CASE(kQ8_0, kType, __VA_ARGS__)                \
    default:                                                                 \
      on_unsupported;                                                        \
  }
/// One case of POLYKV_DISPATCH_DEVICE_WEIGHT_TYPE: blocks::`name` as `constexpr kType`.
#define POLYKV_DEVICE_WEIGHT_TYPE_CASE(name, kType, ...)        \
  case ::polykv::kernels::blocks::name: {                       \
    constexpr uint32_t kType = ::polykv::kernels::blocks::name; \
    __VA_ARGS__;                                                \
    break;                                                      \
  }

// ---------------------------------------------------------------------------------------
// Launch shapes (host logic, unit-tested on the CPU).
// ---------------------------------------------------------------------------------------

/// Warps (= output rows) per thread block of the matrix-vector kernels.
inline constexpr int kMatVecWarps = 4;
/// Most activation rows one matrix-vector launch multiplies (larger batches are split into
/// launches of this many rows, or go to cuBLAS for F32/F16/BF16).
inline constexpr int kMatVecMaxRows = 16;

/// Grid and block of a matrix-vector launch over `rows` outputs: one warp per output.
struct MatVecShape {
  int64_t blocks = 0;  ///< ceil(rows / kMatVecWarps)
  int threads = 0;     ///< kMatVecWarps * kWarp
};
POLYKV_HD inline MatVecShape MatVecLaunchShape(int64_t rows) {
  MatVecShape s;
  s.blocks = (rows + kMatVecWarps - 1) / kMatVecWarps;
  s.threads = kMatVecWarps * kWarp;
  return s;
}

/// Compile-time activation-row count of the kernel that multiplies `n` rows (1..16): the
/// smallest of 1, 2, 4, 8, 16 that is >= n (0 for n outside 1..16).
POLYKV_HD inline int MatVecRowTile(int64_t n) {
  if (n < 1 || n > kMatVecMaxRows) return 0;
  int t = 1;
  while (t < n) t *= 2;
  return t;
}

}  // namespace polykv::kernels::blocks
