// CPU path of the codec: parallel loops over the per-vector math of codec_math.h.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "internal.h"

namespace polykv::kernels::internal {
namespace {

using math::kMaxLevels;

constexpr int64_t kNoBadIndex = std::numeric_limits<int64_t>::max();

// Lowers `target` to `value` if smaller (lock-free).
void AtomicMin(std::atomic<int64_t>& target, int64_t value) {
  int64_t cur = target.load(std::memory_order_relaxed);
  while (value < cur && !target.compare_exchange_weak(cur, value, std::memory_order_relaxed)) {
  }
}

// Converts d elements starting at element `off` of `src` (dtype) to f32 in `dst`.
void LoadRow(const void* src, DType dtype, int64_t off, int d, float* __restrict dst) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, static_cast<const float*>(src) + off, sizeof(float) * d);
      break;
    case DType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src) + off;
      for (int i = 0; i < d; ++i) dst[i] = math::F16ToFloat(s[i]);
      break;
    }
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src) + off;
      for (int i = 0; i < d; ++i) dst[i] = math::Bf16ToFloat(s[i]);
      break;
    }
  }
}

// Writes d f32 values to elements [off, off + d) of `dst` (dtype).
void StoreRow(const float* __restrict src, int d, void* dst, DType dtype, int64_t off) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(static_cast<float*>(dst) + off, src, sizeof(float) * d);
      break;
    case DType::kF16: {
      uint16_t* o = static_cast<uint16_t*>(dst) + off;
      for (int i = 0; i < d; ++i) o[i] = math::FloatToF16(src[i]);
      break;
    }
    case DType::kBF16: {
      uint16_t* o = static_cast<uint16_t*>(dst) + off;
      for (int i = 0; i < d; ++i) o[i] = math::FloatToBf16(src[i]);
      break;
    }
  }
}

// Index of the first non-finite value in x[0..d), or -1.
int FirstNonFinite(const float* __restrict x, int d) {
  uint32_t any = 0;
  for (int i = 0; i < d; ++i) any |= math::IsNonFinite(x[i]) ? 1u : 0u;
  if (!any) return -1;
  for (int i = 0; i < d; ++i) {
    if (math::IsNonFinite(x[i])) return i;
  }
  return -1;
}

Status NonFiniteError(const char* what, const void* src, DType dtype, const LayerShape& shape,
                      int64_t index) {
  float x[1] = {0.0f};
  LoadRow(src, dtype, index, 1, x);
  return absl::InvalidArgumentError(absl::StrCat(
      what, " contains ", std::isnan(x[0]) ? "NaN" : "Inf", " at ", DescribeIndex(shape, index)));
}

// Row kernels as separate functions with __restrict parameters (int8_t may alias anything,
// so without this the compiler cannot vectorize).
void QuantizeRow(const float* __restrict x, const float* __restrict s, int d,
                 int8_t* __restrict out) {
  for (int i = 0; i < d; ++i) out[i] = math::QuantizeKey(x[i], s[i]);
}

void DequantizeRow(const int8_t* __restrict q, const float* __restrict s, int d,
                   float* __restrict out) {
  for (int i = 0; i < d; ++i) out[i] = math::DequantizeKey(q[i], s[i]);
}

void AbsmaxRow(const float* __restrict x, int d, float* __restrict mx) {
  for (int i = 0; i < d; ++i) {
    const float a = std::fabs(x[i]);
    mx[i] = mx[i] < a ? a : mx[i];
  }
}

// Fills `row` (d entries) with the scale of each channel of head h.
void ScaleRow(const float* scales, const LayerShape& shape, KeyScaleMode mode, int64_t h,
              float* row) {
  const int d = shape.head_dim;
  switch (mode) {
    case KeyScaleMode::kPerTensor:
      std::fill(row, row + d, scales[0]);
      break;
    case KeyScaleMode::kPerHead:
      std::fill(row, row + d, scales[h]);
      break;
    case KeyScaleMode::kPerChannel:
      std::copy(scales + h * d, scales + (h + 1) * d, row);
      break;
  }
}

// Runs row_fn(v, row, srow) for the key vectors v of `shape` on the threads (tasks of 64),
// srow holding the scales of v's head (ScaleRow) and row a scratch of head_dim floats; a
// task stops at the first row_fn that returns false.
template <class RowFn>
void ForEachScaledRow(const float* scales, const LayerShape& shape, KeyScaleMode mode,
                      RowFn row_fn) {
  const int d = shape.head_dim;
  const int64_t tokens = shape.tokens;
  ParallelFor(shape.vectors(), 64, [&](int64_t b, int64_t e) {
    std::vector<float> row(d), srow(d);
    int64_t cur_head = -1;
    for (int64_t v = b; v < e; ++v) {
      const int64_t h = v / tokens;
      if (h != cur_head) {
        ScaleRow(scales, shape, mode, h, srow.data());
        cur_head = h;
      }
      if (!row_fn(v, row.data(), srow.data())) return;
    }
  });
}

}  // namespace

Status QuantizeKeysCpu(const void* k, DType dtype, const LayerShape& shape, KeyScaleMode mode,
                       const float* given_scales, int8_t* q, float* scales_out, int bits) {
  const int d = shape.head_dim;
  const int64_t heads = shape.kv_heads, tokens = shape.tokens;
  std::atomic<int64_t> bad{kNoBadIndex};
  const float* scales = given_scales;

  if (given_scales == nullptr) {
    // Pass 1: per-channel absmax over (head, token-chunk) tasks, then reduce by mode.
    const int64_t chunks_per_head =
        std::clamp<int64_t>((4 * CodecThreads() + heads - 1) / heads, 1, tokens);
    const int64_t tasks = heads * chunks_per_head;
    std::vector<float> partial(static_cast<size_t>(tasks * d), 0.0f);
    ParallelFor(tasks, 1, [&](int64_t b, int64_t e) {
      std::vector<float> row(d);
      for (int64_t task = b; task < e; ++task) {
        const int64_t h = task / chunks_per_head, c = task % chunks_per_head;
        const int64_t t0 = tokens * c / chunks_per_head, t1 = tokens * (c + 1) / chunks_per_head;
        float* __restrict mx = partial.data() + task * d;
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t off = (h * tokens + t) * d;
          LoadRow(k, dtype, off, d, row.data());
          const int badi = FirstNonFinite(row.data(), d);
          if (badi >= 0) {
            AtomicMin(bad, off + badi);
            break;
          }
          AbsmaxRow(row.data(), d, mx);
        }
      }
    });
    if (bad.load() != kNoBadIndex) return NonFiniteError("K", k, dtype, shape, bad.load());
    const int64_t n_scales = KeyScaleCount(shape, mode);
    std::fill(scales_out, scales_out + n_scales, 0.0f);
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t h = task / chunks_per_head;
      const float* mx = partial.data() + task * d;
      for (int i = 0; i < d; ++i) {
        float& s = mode == KeyScaleMode::kPerTensor ? scales_out[0]
                   : mode == KeyScaleMode::kPerHead ? scales_out[h]
                                                    : scales_out[h * d + i];
        s = std::max(s, mx[i]);
      }
    }
    for (int64_t i = 0; i < n_scales; ++i)
      scales_out[i] = bits == 8 ? math::KeyScaleFromAbsmax(scales_out[i])
                                : math::KeyScaleFromAbsmaxBits(scales_out[i], bits);
    scales = scales_out;
  }

  // Pass 2: quantize every row with its scales.
  const bool check = given_scales != nullptr;
  ForEachScaledRow(scales, shape, mode, [&](int64_t v, float* row, const float* srow) {
    const int64_t off = v * d;
    LoadRow(k, dtype, off, d, row);
    if (check) {
      const int badi = FirstNonFinite(row, d);
      if (badi >= 0) {
        AtomicMin(bad, off + badi);
        return false;
      }
    }
    QuantizeRow(row, srow, d, q + off);
    if (bits < 8) {
      const int qm = math::KeyQMax(bits);
      for (int i = 0; i < d; ++i)
        q[off + i] = static_cast<int8_t>(std::clamp<int>(q[off + i], -qm, qm));
    }
    return true;
  });
  if (bad.load() != kNoBadIndex) return NonFiniteError("K", k, dtype, shape, bad.load());
  return absl::OkStatus();
}

void DequantizeKeysCpu(const int8_t* q, const float* scales, const LayerShape& shape,
                       KeyScaleMode mode, void* out, DType out_dtype) {
  const int d = shape.head_dim;
  ForEachScaledRow(scales, shape, mode, [&](int64_t v, float* row, const float* srow) {
    if (out_dtype == DType::kF32) {
      DequantizeRow(q + v * d, srow, d, static_cast<float*>(out) + v * d);
    } else {
      DequantizeRow(q + v * d, srow, d, row);
      StoreRow(row, d, out, out_dtype, v * d);
    }
    return true;
  });
}

Status EncodeValuesCpu(const void* v, DType dtype, const LayerShape& shape,
                       const CodecConfig& config, const math::ValueCodebook& cb, uint8_t* packed,
                       float* norms) {
  const int d = shape.head_dim;
  const int64_t vec_bytes = math::PackedBytes(d, cb.bits);
  std::vector<float> signs(d);
  for (int i = 0; i < d; ++i) signs[i] = math::RotationSign(config.rotation_seed, i);
  std::atomic<int64_t> bad{kNoBadIndex};
  ParallelFor(shape.vectors(), 64, [&](int64_t b, int64_t e) {
    std::vector<float> x(d);
    std::vector<uint8_t> codes(d);
    for (int64_t vi = b; vi < e; ++vi) {
      const int64_t off = vi * d;
      LoadRow(v, dtype, off, d, x.data());
      const int badi = FirstNonFinite(x.data(), d);
      if (badi >= 0) {
        AtomicMin(bad, off + badi);
        return;
      }
      norms[vi] = math::EncodeValueVector(x.data(), d, signs.data(), cb, config.norm_correction,
                                          codes.data(), packed + vi * vec_bytes);
    }
  });
  if (bad.load() != kNoBadIndex) return NonFiniteError("V", v, dtype, shape, bad.load());
  return absl::OkStatus();
}

void DecodeValuesCpu(const uint8_t* packed, const float* norms, const LayerShape& shape,
                     const CodecConfig& config, const math::ValueCodebook& cb, void* out,
                     DType out_dtype) {
  const int d = shape.head_dim;
  const int64_t vec_bytes = math::PackedBytes(d, cb.bits);
  std::vector<float> signs(d);
  for (int i = 0; i < d; ++i) signs[i] = math::RotationSign(config.rotation_seed, i);
  ParallelFor(shape.vectors(), 64, [&](int64_t b, int64_t e) {
    std::vector<float> x(d);
    for (int64_t vi = b; vi < e; ++vi) {
      float* dst = out_dtype == DType::kF32 ? static_cast<float*>(out) + vi * d : x.data();
      math::DecodeValueVector(packed + vi * vec_bytes, norms[vi], d, signs.data(), cb, dst);
      if (out_dtype != DType::kF32) StoreRow(dst, d, out, out_dtype, vi * d);
    }
  });
}

}  // namespace polykv::kernels::internal
