// Element-wise decoder ops: scalar reference and dispatch to the AVX2 variants.
#include "polykv/kernels/ops.h"

#include <algorithm>
#include <cmath>

#include "ops_internal.h"
#include "polykv/kernels/cpu.h"
#include "polykv/kernels/ops_math.h"
#include "thread_pool.h"

namespace polykv::kernels {
namespace ops {

void SiluMulScalar(const float* gate, const float* up, int64_t count, float* out) {
  for (int64_t i = 0; i < count; ++i) out[i] = opmath::SiluMulValue(gate[i], up[i]);
}

}  // namespace ops

namespace {

// Element-wise work of at least this many values (a batched decode step's rows) is split
// over the compute threads; every value is computed as on one thread.
constexpr int64_t kParallelValues = 8192;

void RmsNormRange(const float* x, const float* w, int64_t r0, int64_t r1, int64_t dim, float eps,
                  float* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * dim;
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double{xr[i]} * xr[i];
    const float inv = opmath::RmsNormInverse(ss, dim, eps);
    float* o = out + r * dim;
    for (int64_t i = 0; i < dim; ++i) o[i] = opmath::RmsNormValue(xr[i], inv, w[i]);
  }
}

void SiluMulRange(const float* gate, const float* up, int64_t count, float* out) {
#ifdef POLYKV_HAVE_AVX2_KERNELS
  if (BestIsa() >= Isa::kAvx2) {
    ops::SiluMulAvx2(gate, up, count, out);
    return;
  }
#endif
  ops::SiluMulScalar(gate, up, count, out);
}

}  // namespace

void RmsNormRows(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* out) {
  const int threads = ComputeThreads();
  if (threads <= 1 || rows < 2 || rows * dim < kParallelValues) {
    RmsNormRange(x, w, 0, rows, dim, eps, out);
    return;
  }
  const int64_t tasks = std::min<int64_t>(rows, threads);
  internal::RunTasks(tasks, threads, [&](int64_t t) {
    RmsNormRange(x, w, rows * t / tasks, rows * (t + 1) / tasks, dim, eps, out);
  });
}

void SiluMul(const float* gate, const float* up, int64_t count, float* out) {
  const int threads = ComputeThreads();
  if (threads <= 1 || count < kParallelValues) {
    SiluMulRange(gate, up, count, out);
    return;
  }
  // Pieces of a multiple of 8 values (the vector width), the remainder in the last one: each
  // value takes the path it takes on one thread.
  const int64_t piece = (count / threads + 7) / 8 * 8;
  internal::RunTasks(threads, threads, [&](int64_t t) {
    const int64_t b = std::min(count, t * piece);
    const int64_t e = t + 1 == threads ? count : std::min(count, b + piece);
    SiluMulRange(gate + b, up + b, e - b, out + b);
  });
}

void RopeHeads(float* x, int32_t heads, int32_t head_dim, const float* cos, const float* sin) {
  const int32_t half = head_dim / 2;
  for (int32_t h = 0; h < heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    for (int32_t i = 0; i < half; ++i) {
      opmath::RopePair(v[i], v[i + half], cos[i], sin[i], cos[i + half], sin[i + half], &v[i],
                       &v[i + half]);
    }
  }
}

}  // namespace polykv::kernels
