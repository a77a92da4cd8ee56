// Scalar reference of the matrix kernels: per-block integer dot products written out
// plainly (the definition every SIMD variant is tested against), and block dequantization.
#include "matmul_internal.h"

namespace polykv::kernels::mm {
namespace {

using dtype::LoadBf16;
using dtype::LoadF16;

// ---- dot products: weight block x activation block ------------------------------------

float DotF32(const uint8_t* w, int64_t n, const float* x) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    float wi;
    std::memcpy(&wi, w + 4 * i, 4);
    acc += wi * x[i];
  }
  return acc;
}

float DotF16(const uint8_t* w, int64_t n, const float* x) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += LoadF16(w + 2 * i) * x[i];
  return acc;
}

float DotBf16(const uint8_t* w, int64_t n, const float* x) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += LoadBf16(w + 2 * i) * x[i];
  return acc;
}

// One Q8 activation row (matmul_internal.h): code v of block b, and the block's dx, ds.
struct Q8Row {
  const uint8_t* row;
  int64_t nb;
  bool permuted;
  /// 256 q1 + q2 of value v of block b (the activation in units of dxs).
  int32_t Code(int64_t b, int v) const {
    const int64_t off = ActQ8CodeOffset(permuted, nb, b, v);
    return 256 * static_cast<int8_t>(row[off]) + static_cast<int8_t>(row[32 * nb + off]);
  }
  float Dx(int64_t b) const { return ActQ8Dx(row, nb)[b]; }
  float Ds(int64_t b) const { return ActQ8Ds(row, nb)[b]; }
};

// A 32-value block's f32 epilogue for its exact integer dot product s: d dx s, then the
// min's term + m ds (kMin: Q4_1, Q5_1; m at w + 2), or the zero point's - kZero d ds
// (sum (q - z) x = sum q x - z sum x; d dx sum x = d ds).
template <bool kMin, int kZero>
[[gnu::always_inline]] inline float BlockEpilogue(const uint8_t* w, const Q8Row& x, int64_t b,
                                                  int32_t s) {
  if constexpr (kMin)
    return LoadF16(w) * x.Dx(b) * static_cast<float>(s) + LoadF16(w + 2) * x.Ds(b);
  else
    return LoadF16(w) * x.Dx(b) * static_cast<float>(s) -
           static_cast<float>(kZero) * LoadF16(w) * x.Ds(b);
}

// Q4_0 (kMin false) / Q4_1 (kMin true).
template <bool kMin>
float DotQ4(const uint8_t* w, int64_t nb, const uint8_t* xr) {
  constexpr int kBytes = kMin ? 20 : 18, kQs = kMin ? 4 : 2;
  const Q8Row x{xr, nb, true};
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b, w += kBytes) {
    const uint8_t* qs = w + kQs;
    int32_t s = 0;
    for (int j = 0; j < 16; ++j)
      s += (qs[j] & 0x0f) * x.Code(b, j) + (qs[j] >> 4) * x.Code(b, j + 16);
    acc += BlockEpilogue<kMin, 8>(w, x, b, s);
  }
  return acc;
}

// Q5_0 / Q5_1: 5-bit codes q5 of a block.
void Q5Codes(const uint8_t* qhp, const uint8_t* qs, uint8_t* q5) {
  uint32_t qh;
  std::memcpy(&qh, qhp, 4);
  for (int j = 0; j < 16; ++j) {
    q5[j] = static_cast<uint8_t>((qs[j] & 0x0f) | (((qh >> j) & 1u) << 4));
    q5[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
  }
}

// Q5_0 (kMin false) / Q5_1 (kMin true).
template <bool kMin>
float DotQ5(const uint8_t* w, int64_t nb, const uint8_t* xr) {
  constexpr int kBytes = kMin ? 24 : 22, kQh = kMin ? 4 : 2;
  const Q8Row x{xr, nb, false};
  float acc = 0.0f;
  uint8_t q5[32];
  for (int64_t b = 0; b < nb; ++b, w += kBytes) {
    Q5Codes(w + kQh, w + kQh + 4, q5);
    int32_t s = 0;
    for (int j = 0; j < 32; ++j) s += q5[j] * x.Code(b, j);
    acc += BlockEpilogue<kMin, 16>(w, x, b, s);
  }
  return acc;
}

float DotQ8_0(const uint8_t* w, int64_t nb, const uint8_t* xr) {
  const Q8Row x{xr, nb, false};
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b, w += 34) {
    const int8_t* qs = reinterpret_cast<const int8_t*>(w + 2);
    int32_t s = 0;
    for (int j = 0; j < 32; ++j) s += qs[j] * x.Code(b, j);
    acc += LoadF16(w) * x.Dx(b) * static_cast<float>(s);
  }
  return acc;
}

// Q4_K / Q5_K: sum_j sc_j * dot_j and sum_j mn_j * xsum_j over the 8 sub-blocks of 32, the
// activation value in units of d being 256 q + r (int64: exact).
float DotQ45_KRef(const uint8_t* w, int64_t nb, const ActQ8K* x, bool q5) {
  const int kBytes = q5 ? 176 : 144;
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b, w += kBytes, ++x) {
    const uint8_t* scales = w + 4;
    const uint8_t* qh = w + 16;
    const uint8_t* qs = w + (q5 ? 48 : 16);
    int64_t sdot = 0, smin = 0;
    for (int i = 0; i < 4; ++i) {  // pairs of sub-blocks 2i, 2i+1
      uint8_t sc0, mn0, sc1, mn1;
      ScaleMinK4(2 * i, scales, &sc0, &mn0);
      ScaleMinK4(2 * i + 1, scales, &sc1, &mn1);
      int64_t d0 = 0, d1 = 0;
      for (int l = 0; l < 32; ++l) {
        int q0 = qs[32 * i + l] & 0x0f, q1 = qs[32 * i + l] >> 4;
        if (q5) {
          q0 |= ((qh[l] >> (2 * i)) & 1) << 4;
          q1 |= ((qh[l] >> (2 * i + 1)) & 1) << 4;
        }
        const int v0 = 64 * i + l, v1 = 64 * i + 32 + l;
        d0 += int64_t{q0} * (256 * x->q[v0] + x->r[v0]);
        d1 += int64_t{q1} * (256 * x->q[v1] + x->r[v1]);
      }
      sdot += sc0 * d0 + sc1 * d1;
      smin += mn0 * (int64_t{x->bsums[4 * i]} + x->bsums[4 * i + 1]) +
              mn1 * (int64_t{x->bsums[4 * i + 2]} + x->bsums[4 * i + 3]);
    }
    acc += LoadF16(w) * x->d * static_cast<float>(sdot) -
           LoadF16(w + 2) * x->d * static_cast<float>(smin);
  }
  return acc;
}

float DotQ4_K(const uint8_t* w, int64_t nb, const ActQ8K* x) {
  return DotQ45_KRef(w, nb, x, false);
}
float DotQ5_K(const uint8_t* w, int64_t nb, const ActQ8K* x) { return DotQ45_KRef(w, nb, x, true); }

float DotQ6_K(const uint8_t* w, int64_t nb, const ActQ8K* x) {
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b, w += 210, ++x) {
    const uint8_t* ql = w;
    const uint8_t* qh = w + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(w + 192);
    int64_t sum = 0;
    for (int h = 0; h < 2; ++h) {
      int64_t part[8] = {};  // sub-blocks of 16 in this half, in value order
      for (int l = 0; l < 32; ++l) {
        const int q1 = (ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4);
        const int q2 = (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4);
        const int q3 = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
        const int q4 = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        const auto v = [&](int i) { return int64_t{256} * x->q[128 * h + i] + x->r[128 * h + i]; };
        part[l / 16 + 0] += q1 * v(l);
        part[l / 16 + 2] += q2 * v(l + 32);
        part[l / 16 + 4] += q3 * v(l + 64);
        part[l / 16 + 6] += q4 * v(l + 96);
      }
      for (int j = 0; j < 8; ++j) sum += sc[j] * (part[j] - 32 * int64_t{x->bsums[8 * h + j]});
      ql += 64;
      qh += 32;
      sc += 8;
    }
    acc += LoadF16(w + 208) * x->d * static_cast<float>(sum);
  }
  return acc;
}

template <typename Act, float (*Dot)(const uint8_t*, int64_t, const Act*)>
void Rows(const uint8_t* w, int64_t nb, const uint8_t* x, int64_t x_row_bytes, int nx, float* out) {
  for (int j = 0; j < nx; ++j)
    out[j] = Dot(w, nb, reinterpret_cast<const Act*>(x + j * x_row_bytes));
}

template <float (*Dot)(const uint8_t*, int64_t, const uint8_t*)>
void RowsQ8(const uint8_t* w, int64_t nb, const uint8_t* x, int64_t x_row_bytes, int nx,
            float* out) {
  for (int j = 0; j < nx; ++j) out[j] = Dot(w, nb, x + j * x_row_bytes);
}

DotTable MakeScalarTable() {
  DotTable t;
  t.isa = "scalar";
  t.dot[kTF32] = Rows<float, DotF32>;
  t.dot[kTF16] = Rows<float, DotF16>;
  t.dot[kTBF16] = Rows<float, DotBf16>;
  t.dot[kTQ4_0] = RowsQ8<DotQ4<false>>;
  t.dot[kTQ4_1] = RowsQ8<DotQ4<true>>;
  t.dot[kTQ5_0] = RowsQ8<DotQ5<false>>;
  t.dot[kTQ5_1] = RowsQ8<DotQ5<true>>;
  t.dot[kTQ8_0] = RowsQ8<DotQ8_0>;
  t.dot[kTQ4_K] = Rows<ActQ8K, DotQ4_K>;
  t.dot[kTQ5_K] = Rows<ActQ8K, DotQ5_K>;
  t.dot[kTQ6_K] = Rows<ActQ8K, DotQ6_K>;
  return t;
}

// ---- dequantization: one block to f32 ---------------------------------------------------

void DeqQ4_0(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0f) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

void DeqQ4_1(const uint8_t* b, float* y) {
  const float d = LoadF16(b), m = LoadF16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0f) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

void DeqQ5_0(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  uint8_t q5[32];
  Q5Codes(b + 2, b + 6, q5);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q5[j] - 16) * d;
}

void DeqQ5_1(const uint8_t* b, float* y) {
  const float d = LoadF16(b), m = LoadF16(b + 2);
  uint8_t q5[32];
  Q5Codes(b + 4, b + 8, q5);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q5[j]) * d + m;
}

void DeqQ8_0(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

// Q4_K (kQ5 false) / Q5_K (kQ5 true, the fifth bits at b + 16).
template <bool kQ5>
void DeqQ45_K(const uint8_t* b, float* y) {
  const float d = LoadF16(b), dmin = LoadF16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* q = b + (kQ5 ? 48 : 16);
  for (int i = 0; i < 4; ++i) {
    uint8_t sc, mn;
    ScaleMinK4(2 * i, scales, &sc, &mn);
    const float d1 = d * sc, m1 = dmin * mn;
    ScaleMinK4(2 * i + 1, scales, &sc, &mn);
    const float d2 = d * sc, m2 = dmin * mn;
    for (int l = 0; l < 32; ++l)
      *y++ =
          d1 * static_cast<float>((q[l] & 0x0f) | (kQ5 ? ((qh[l] >> (2 * i)) & 1) << 4 : 0)) - m1;
    for (int l = 0; l < 32; ++l)
      *y++ =
          d2 * static_cast<float>((q[l] >> 4) | (kQ5 ? ((qh[l] >> (2 * i + 1)) & 1) << 4 : 0)) - m2;
    q += 32;
  }
}

void DeqQ6_K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = LoadF16(b + 208);
  for (int h = 0; h < 2; ++h) {
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

void DeqF32(const uint8_t* b, float* y) { std::memcpy(y, b, 4); }
void DeqF16(const uint8_t* b, float* y) { *y = LoadF16(b); }
void DeqBf16(const uint8_t* b, float* y) { *y = LoadBf16(b); }

}  // namespace

const DotTable& ScalarTable() {
  static const DotTable t = MakeScalarTable();
  return t;
}

BlockDequantFn BlockDequant(int type_index) {
  static constexpr BlockDequantFn kFns[kTypeCount] = {
      DeqF32,  DeqF16,  DeqBf16,         DeqQ4_0,        DeqQ4_1, DeqQ5_0,
      DeqQ5_1, DeqQ8_0, DeqQ45_K<false>, DeqQ45_K<true>, DeqQ6_K};
  return (type_index >= 0 && type_index < kTypeCount) ? kFns[type_index] : nullptr;
}

// ---- activation quantization (shared by every ISA: identical bytes everywhere) ----------

namespace {
// rint under the default rounding mode (ties to even), as the SIMD conversions do.
inline int32_t RoundEven(float v) { return static_cast<int32_t>(__builtin_rintf(v)); }
}  // namespace

void QuantizeActQ8(const float* x, int64_t cols, bool permuted, uint8_t* row) {
  const int64_t nb = cols / 32;
  uint8_t* res = ActQ8Residual(row, nb);
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + 32 * b;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float a = xb[j] < 0 ? -xb[j] : xb[j];
      amax = a > amax ? a : amax;
    }
    const float d = amax / 127.0f;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int j = 0; j < 32; ++j) {
      const float f = xb[j] * id;
      const int32_t q = RoundEven(f);
      // f - q is exact (|f| <= 127, |f - q| <= 1/2); times 256 is exact.
      int32_t r = RoundEven((f - static_cast<float>(q)) * 256.0f);
      r = r > 127 ? 127 : (r < -127 ? -127 : r);
      const int64_t off = ActQ8CodeOffset(permuted, nb, b, j);
      row[off] = static_cast<uint8_t>(static_cast<int8_t>(q));
      res[off] = static_cast<uint8_t>(static_cast<int8_t>(r));
      sum += 256 * q + r;
    }
    SetActQ8Scales(row, nb, b, d, sum);
  }
}

void InterleaveActQ8T(uint8_t* row, int64_t nb) {
  const int64_t full = nb / 16 * 16;
  uint8_t* const regions[2] = {row, row + 32 * nb};
  for (uint8_t* codes : regions) {
    for (int64_t g = 0; g < full; g += 16) {
      uint8_t natural[512];
      std::memcpy(natural, codes + 32 * g, sizeof(natural));
      for (int64_t b = g; b < g + 16; ++b)  // dword v / 4 of each block (ActQ8TCodeOffset)
        for (int v = 0; v < 32; v += 4)
          std::memcpy(codes + ActQ8TCodeOffset(nb, b, v), natural + 32 * (b - g) + v, 4);
    }
  }
}

void QuantizeActQ8K(const float* x, int64_t cols, ActQ8K* out) {
  for (int64_t b = 0; b < cols / 256; ++b) {
    const float* xb = x + 256 * b;
    float amax = 0.0f;
    for (int j = 0; j < 256; ++j) {
      const float a = xb[j] < 0 ? -xb[j] : xb[j];
      amax = a > amax ? a : amax;
    }
    ActQ8K& o = out[b];
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    o.d = amax / 127.0f * (1.0f / 256.0f);
    for (int g = 0; g < 16; ++g) {
      int32_t sum = 0;
      for (int j = 16 * g; j < 16 * g + 16; ++j) {
        const float f = xb[j] * id;
        const int32_t q = RoundEven(f);
        int32_t r = RoundEven((f - static_cast<float>(q)) * 256.0f);
        r = r > 127 ? 127 : (r < -127 ? -127 : r);
        o.q[j] = static_cast<int8_t>(q);
        o.r[j] = static_cast<int8_t>(r);
        sum += 256 * q + r;
      }
      o.bsums[g] = sum;
    }
  }
}

}  // namespace polykv::kernels::mm
