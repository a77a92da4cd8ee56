// Scalar reference of one attention chunk (the definition the SIMD variants are tested
// against): scores, max, exp, sum, and the value accumulation, written out plainly.
#include <cmath>
#include <cstring>
#include <limits>

#include "attention_internal.h"
#include "polykv/kernels/codec_math.h"

namespace polykv::kernels::attn {
namespace {

float KeyAt(const ChunkArgs& a, int64_t t, int i) {
  const int64_t idx = t * a.hd + i;
  switch (a.key_kind) {
    case kKeyF32:
      return static_cast<const float*>(a.k)[idx];
    case kKeyF16:
      return math::F16ToFloat(static_cast<const uint16_t*>(a.k)[idx]);
    case kKeyBf16:
      return math::Bf16ToFloat(static_cast<const uint16_t*>(a.k)[idx]);
    default:
      return static_cast<float>(static_cast<const int8_t*>(a.k)[idx]);
  }
}

// Value vector of token t (raw, or norm_t * levels[code] in the rotated domain).
void ValueAt(const ChunkArgs& a, int64_t t, float* out) {
  if (a.value_kind == kValPacked) {
    const uint8_t* p = static_cast<const uint8_t*>(a.v) + t * a.v_bytes;
    uint8_t codes[512];
    math::UnpackCodes(p, a.hd, a.bits, codes);
    const float n = a.v_norms[t];
    for (int i = 0; i < a.hd; ++i) out[i] = n * a.levels[codes[i]];
    return;
  }
  for (int i = 0; i < a.hd; ++i) {
    const int64_t idx = t * a.hd + i;
    switch (a.value_kind) {
      case kValF32:
        out[i] = static_cast<const float*>(a.v)[idx];
        break;
      case kValF16:
        out[i] = math::F16ToFloat(static_cast<const uint16_t*>(a.v)[idx]);
        break;
      default:
        out[i] = math::Bf16ToFloat(static_cast<const uint16_t*>(a.v)[idx]);
        break;
    }
  }
}

}  // namespace

int QueryCodeRowBytes(int hd) { return (hd + 63) / 64 * 64; }

int64_t AmxKeyTileFloats(int64_t tokens, int hd) {
  // Per group of 16 keys, one 16 x 64-byte tile per 64 elements of head_dim.
  return (tokens + 15) / 16 * (QueryCodeRowBytes(hd) / 64) * 256;
}

namespace {

// Round to nearest even of |v| <= 2^22 (the default rounding mode; no library call, so the
// loop below vectorizes).
inline float RoundNearest(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return (v + kMagic) - kMagic;
}

}  // namespace

void QuantizeQueryCodes(const float* q, int hd, int8_t* codes, float* scale) {
  const int rb = QueryCodeRowBytes(hd);
  std::memset(codes, 0, static_cast<size_t>(kQueryCodeLevels) * rb);
  float amax = 0.0f;
  bool finite = true;
  for (int i = 0; i < hd; ++i) {
    const float a = std::fabs(q[i]);
    amax = a > amax ? a : amax;
    finite = finite && a <= std::numeric_limits<float>::max();
  }
  if (!finite || amax == 0.0f) {
    *scale = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    return;
  }
  // x = q / step in [-127, 127] (one f32 rounding), then q1 = round(x) and two residual levels
  // of step / 254 and step / 254^2: x - q1 and each residual before its code are in [-0.5,
  // 0.5] of their unit, so the codes are in [-127, 127] (no clamp).
  constexpr float kBase = kQueryCodeBase;
  const float inv_step = 127.0f / amax;
  for (int i = 0; i < hd; ++i) {
    float x = q[i] * inv_step;
    x = x > 127.0f ? 127.0f : (x < -127.0f ? -127.0f : x);
    const float c1 = RoundNearest(x);
    const float r1 = (x - c1) * kBase;
    const float c2 = RoundNearest(r1);
    const float c3 = RoundNearest((r1 - c2) * kBase);
    codes[i] = static_cast<int8_t>(c1);
    codes[rb + i] = static_cast<int8_t>(c2);
    codes[2 * rb + i] = static_cast<int8_t>(c3);
  }
  *scale = amax / 127.0f / (kBase * kBase);
}

float ScoreI8(const int8_t* codes, float scale, const int8_t* key, int hd) {
  const int rb = QueryCodeRowBytes(hd);
  int32_t c[kQueryCodeLevels] = {0, 0, 0};
  for (int l = 0; l < kQueryCodeLevels; ++l)
    for (int i = 0; i < hd; ++i) c[l] += int32_t{codes[l * rb + i]} * int32_t{key[i]};
  constexpr float kBase = kQueryCodeBase;
  float f = std::fma(static_cast<float>(c[0]), kBase, static_cast<float>(c[1]));
  f = std::fma(f, kBase, static_cast<float>(c[2]));
  return f * scale;
}

void ChunkScalar(const ChunkArgs& a) {
  const int hd = a.hd;
  float vbuf[512];
  for (int j = 0; j < a.nq; ++j) {
    float* o = a.o + static_cast<int64_t>(j) * hd;
    const int64_t end = a.limit[j] < a.t1 ? a.limit[j] : a.t1;
    for (int i = 0; i < hd; ++i) o[i] = 0.0f;
    if (end <= a.t0) {
      a.m[j] = -std::numeric_limits<float>::infinity();
      a.l[j] = 0.0f;
      continue;
    }
    const float* q = a.q + static_cast<int64_t>(j) * hd;
    float* s = a.scratch;  // scores of tokens t0..end
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t t = a.t0; t < end; ++t) {
      float acc = 0.0f;
      if (a.q_codes != nullptr && a.key_kind == kKeyI8) {
        acc =
            ScoreI8(a.q_codes + static_cast<int64_t>(j) * kQueryCodeLevels * QueryCodeRowBytes(hd),
                    a.q_code_scale[j], static_cast<const int8_t*>(a.k) + t * hd, hd);
      } else {
        for (int i = 0; i < hd; ++i) acc += q[i] * KeyAt(a, t, i);
      }
      s[t - a.t0] = acc;
      m = acc > m ? acc : m;
    }
    float l = 0.0f;
    for (int64_t t = a.t0; t < end; ++t) {
      const float p = std::exp(s[t - a.t0] - m);
      l += p;
      ValueAt(a, t, vbuf);
      for (int i = 0; i < hd; ++i) o[i] += p * vbuf[i];
    }
    const float inv = 1.0f / l;
    for (int i = 0; i < hd; ++i) o[i] *= inv;
    a.m[j] = m;
    a.l[j] = l;
  }
}

}  // namespace polykv::kernels::attn
