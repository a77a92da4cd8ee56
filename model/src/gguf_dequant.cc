// Dequantization of ggml tensor blocks to f32 (block layouts of ggml's dequantize_row_*).
//
// Block layouts (little-endian, "half" = IEEE fp16):
//   Q4_0 (32 values, 18 B): half d | u8 qs[16]          y[j] = (lo(qs[j]) - 8) d, y[j+16] = (hi -
//   8) d Q4_1 (32 values, 20 B): half d | half m | u8 qs[16] y[j] = lo d + m,          y[j+16] = hi
//   d + m Q5_0 (32 values, 22 B): half d | u32 qh | u8 qs[16] 5th bit of y[j] is qh bit j, of
//   y[j+16] bit j+16;
//                                                        y = (q5 - 16) d
//   Q5_1 (32 values, 24 B): half d | half m | u32 qh | u8 qs[16]   y = q5 d + m
//   Q8_0 (32 values, 34 B): half d | i8 qs[32]          y[j] = qs[j] d
//   Q4_K (256, 144 B): half d | half dmin | u8 scales[12] (8 x 6-bit scale, 8 x 6-bit min) | u8
//   qs[128] Q5_K (256, 176 B): half d | half dmin | u8 scales[12] | u8 qh[32] | u8 qs[128] Q6_K
//   (256, 210 B): u8 ql[128] | u8 qh[64] | i8 scales[16] | half d
#include <cstring>

#include "absl/strings/str_cat.h"
#include "polykv/model/gguf.h"

namespace polykv::model {
namespace {

float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return HalfToFloat(h);
}

void DequantQ4_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0f) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

void DequantQ4_1(const uint8_t* b, float* y) {
  const float d = Half(b), m = Half(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0f) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

void DequantQ5(const uint8_t* b, float* y, bool has_min) {
  const float d = Half(b);
  const float m = has_min ? Half(b + 2) : 0.0f;
  const uint8_t* p = b + (has_min ? 4 : 2);
  uint32_t qh;
  std::memcpy(&qh, p, 4);
  const uint8_t* qs = p + 4;
  const int offset = has_min ? 0 : 16;
  for (int j = 0; j < 16; ++j) {
    int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = static_cast<float>(lo - offset) * d + m;
    y[j + 16] = static_cast<float>(hi - offset) * d + m;
  }
}

void DequantQ8_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

// 6-bit scale and min number j (0..7) of a K-quant scales[12] array.
inline void ScaleMinK4(int j, const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void DequantQ4_K(const uint8_t* b, float* y) {
  const float d = Half(b), dmin = Half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  int is = 0;
  for (int j = 0; j < 256; j += 64) {
    uint8_t sc, mn;
    ScaleMinK4(is, scales, &sc, &mn);
    const float d1 = d * sc, m1 = dmin * mn;
    ScaleMinK4(is + 1, scales, &sc, &mn);
    const float d2 = d * sc, m2 = dmin * mn;
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0f) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    q += 32;
    is += 2;
  }
}

void DequantQ5_K(const uint8_t* b, float* y) {
  const float d = Half(b), dmin = Half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  int is = 0;
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0; j < 256; j += 64) {
    uint8_t sc, mn;
    ScaleMinK4(is, scales, &sc, &mn);
    const float d1 = d * sc, m1 = dmin * mn;
    ScaleMinK4(is + 1, scales, &sc, &mn);
    const float d2 = d * sc, m2 = dmin * mn;
    for (int l = 0; l < 32; ++l) {
      *y++ = d1 * static_cast<float>((ql[l] & 0x0f) + ((qh[l] & u1) ? 16 : 0)) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    }
    ql += 32;
    is += 2;
    u1 <<= 2;
    u2 <<= 2;
  }
}

void DequantQ6_K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = Half(b + 208);
  for (int n = 0; n < 256; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is + 0] * q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2] * q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4] * q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6] * q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

}  // namespace

Status DequantizeToF32(uint32_t type, const uint8_t* data, uint64_t data_bytes, int64_t elements,
                       float* out) {
  using BlockFn = void (*)(const uint8_t*, float*);
  BlockFn fn = nullptr;
  int64_t block = 1;
  uint64_t block_bytes = 0;
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
      break;
    case GgmlType::kQ4_0:
      fn = DequantQ4_0;
      block = 32;
      block_bytes = 18;
      break;
    case GgmlType::kQ4_1:
      fn = DequantQ4_1;
      block = 32;
      block_bytes = 20;
      break;
    case GgmlType::kQ5_0:
      fn = [](const uint8_t* b, float* y) { DequantQ5(b, y, false); };
      block = 32;
      block_bytes = 22;
      break;
    case GgmlType::kQ5_1:
      fn = [](const uint8_t* b, float* y) { DequantQ5(b, y, true); };
      block = 32;
      block_bytes = 24;
      break;
    case GgmlType::kQ8_0:
      fn = DequantQ8_0;
      block = 32;
      block_bytes = 34;
      break;
    case GgmlType::kQ4_K:
      fn = DequantQ4_K;
      block = 256;
      block_bytes = 144;
      break;
    case GgmlType::kQ5_K:
      fn = DequantQ5_K;
      block = 256;
      block_bytes = 176;
      break;
    case GgmlType::kQ6_K:
      fn = DequantQ6_K;
      block = 256;
      block_bytes = 210;
      break;
    default:
      return absl::UnimplementedError(absl::StrCat("DequantizeToF32: ggml type ",
                                                   GgmlTypeName(type), " (", type,
                                                   ") is not supported by PolyKV"));
  }
  POLYKV_ASSIGN_OR_RETURN(uint64_t need, GgmlTypeBytes(type, elements));
  if (data_bytes < need) {
    return absl::InvalidArgumentError(absl::StrCat("DequantizeToF32: ", elements, " values of ",
                                                   GgmlTypeName(type), " need ", need,
                                                   " bytes, got ", data_bytes));
  }
  if (elements == 0) return absl::OkStatus();
  if (data == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("DequantizeToF32: null data or output pointer");
  }
  const auto n = static_cast<uint64_t>(elements);
  if (fn == nullptr) {
    if (type == static_cast<uint32_t>(GgmlType::kF32)) {
      std::memcpy(out, data, n * 4);
    } else if (type == static_cast<uint32_t>(GgmlType::kF16)) {
      for (uint64_t i = 0; i < n; ++i) out[i] = Half(data + 2 * i);
    } else {  // BF16: the upper 16 bits of an f32
      for (uint64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, data + 2 * i, 2);
        uint32_t bits = static_cast<uint32_t>(h) << 16;
        std::memcpy(out + i, &bits, 4);
      }
    }
    return absl::OkStatus();
  }
  const uint64_t nblocks = n / static_cast<uint64_t>(block);
  for (uint64_t i = 0; i < nblocks; ++i) fn(data + i * block_bytes, out + i * block);
  return absl::OkStatus();
}

}  // namespace polykv::model
