// CUDA split attention over [prefix (compressed pool or raw) | f32 suffix]: one thread block
// per (chunk task, query) computes a partial softmax state, one block per (KV head, query)
// merges them by log-sum-exp in position order, un-rotating TurboQuant-MSE values once (the
// rotation's signs and block size from codec_math.h, shared with the CPU path).
//
// Work split inside a chunk (kChunk = 64 tokens, smaller than the CPU's kAttentionChunk so
// that one decode query still spreads over many blocks): scores one warp per token (lanes
// over head_dim, a shuffle sum), values blockDim / head_dim thread groups over the tokens
// (each thread one dimension), summed in shared memory. The suffix length may be read from
// device memory (suffix_length_dev: a captured CUDA graph serves every decode step; the grid
// is sized by the bound suffix_length and chunks past the live length stay empty).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "attention_cuda.h"
#include "attention_geometry.h"
#include "polykv/kernels/attention.h"
#include "polykv/kernels/codec_math.h"

namespace polykv::kernels::cuda {
namespace {

namespace m = ::polykv::kernels::math;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = attn_geometry::kCudaChunk;
constexpr int kMaxHd = 512;
using attn_geometry::Geometry;

__device__ inline float BlockReduce(float v, float* red, bool is_max) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s)
      red[threadIdx.x] = is_max ? fmaxf(red[threadIdx.x], red[threadIdx.x + s])
                                : red[threadIdx.x] + red[threadIdx.x + s];
    __syncthreads();
  }
  const float r = red[0];
  __syncthreads();
  return r;
}

// Key element d of token t of KV head h: the int8 code, a packed key code (key_bits 4..7:
// code q + 2^(bits-1) at stream bits [d bits, (d + 1) bits) of the vector, PackKeyCodes'
// layout; at most 2 bytes hold it) or the raw value.
__device__ inline float PrefixKey(const AttentionLaunch& a, int h, int64_t t, int d) {
  if (a.codec == 1 && a.key_bits < 8) {
    const int64_t vbytes = m::PackedBytes(a.head_dim, a.key_bits);
    const uint8_t* p = static_cast<const uint8_t*>(a.pk) + (h * a.prefix_tokens + t) * vbytes;
    const int bit = d * a.key_bits;
    uint32_t w = p[bit / 8];
    if (bit / 8 + 1 < vbytes) w |= static_cast<uint32_t>(p[bit / 8 + 1]) << 8;
    const int code = static_cast<int>((w >> (bit % 8)) & ((1u << a.key_bits) - 1u));
    return static_cast<float>(code - (1 << (a.key_bits - 1)));
  }
  const int64_t idx = (h * a.prefix_tokens + t) * a.head_dim + d;
  if (a.codec == 1) return static_cast<float>(static_cast<const int8_t*>(a.pk)[idx]);
  return m::LoadF32(a.pk, a.raw_dtype, idx);
}

// Norm of value vector `vec` (f32, or f16 widened exactly as NormsFromF16 does).
__device__ inline float PrefixNorm(const AttentionLaunch& a, int64_t vec) {
  if (a.norms_f16) return m::F16ToFloat(static_cast<const uint16_t*>(a.pv_norms)[vec]);
  return static_cast<const float*>(a.pv_norms)[vec];
}

// Value element d of token t of KV head h (packed: norm * level, rotated domain).
__device__ inline float PrefixValue(const AttentionLaunch& a, int h, int64_t t, int d) {
  if (a.codec == 1) {
    const int64_t vec = h * a.prefix_tokens + t;
    const int64_t vbytes = m::PackedBytes(a.head_dim, a.bits);
    const uint8_t* p = static_cast<const uint8_t*>(a.pv) + vec * vbytes;
    const int bit = d * a.bits;
    uint32_t w = p[bit / 8];
    if (bit / 8 + 1 < vbytes) w |= static_cast<uint32_t>(p[bit / 8 + 1]) << 8;
    const uint32_t code = (w >> (bit % 8)) & ((1u << a.bits) - 1u);
    return PrefixNorm(a, vec) * a.levels[code];
  }
  return m::LoadF32(a.pv, a.raw_dtype, (h * a.prefix_tokens + t) * a.head_dim + d);
}

// The live suffix length: from device memory when the launch names it (graph replay).
__device__ inline int64_t SuffixLength(const AttentionLaunch& a) {
  return a.suffix_length_dev != nullptr ? *a.suffix_length_dev : a.suffix_length;
}

// Slot mode: the launch as seen by session (grid z) `z`: its suffix slot, live length, query
// and output row (AttentionLaunch's slot fields). A slot or length out of range reads as an
// empty suffix (the host keeps them in range; a bad one must not read another's memory).
__device__ inline AttentionLaunch SessionOf(const AttentionLaunch& a, int64_t z) {
  AttentionLaunch s = a;
  if (a.row_slot == nullptr) return s;
  const int64_t slot = a.row_slot[z];
  int64_t len = a.row_length[z];
  if (slot < 0 || slot >= a.slots || len < 1 || len > a.suffix_length) len = 0;
  const int64_t base = (slot >= 0 && slot < a.slots ? slot : 0) * a.slot_stride;
  s.k_suffix = a.k_suffix + base;
  s.v_suffix = a.v_suffix + base;
  s.suffix_length = len;
  s.suffix_length_dev = nullptr;
  s.n = 1;
  s.q = a.q + z * a.heads * a.head_dim;
  s.out = a.out + z * a.heads * a.head_dim;
  return s;
}

// Partial state of query j of KV head h over one chunk: grid (tasks, nq).
__global__ void PartialKernel(AttentionLaunch launch, Geometry geo, float* states) {
  const AttentionLaunch a = SessionOf(launch, blockIdx.z);
  __shared__ float qs[kMaxHd];
  __shared__ float sc[kChunk];
  __shared__ float red[kThreads];
  const int j = blockIdx.y;
  const attn_geometry::Task tk = attn_geometry::TaskOf(geo, blockIdx.x);
  const int h = static_cast<int>(tk.h);
  const bool prefix = tk.prefix;
  const int64_t slen = SuffixLength(a);
  const int64_t t0 = tk.t0;
  const int64_t part_len = prefix ? a.prefix_tokens : slen;
  const int64_t t1 = t0 + kChunk < part_len ? t0 + kChunk : part_len;
  const int64_t row = j / geo.g, grp = j % geo.g;
  const int64_t limit = prefix ? part_len : slen - a.n + row + 1;
  const int64_t end = limit < t1 ? limit : t1;  // slot mode, empty suffix (slen 0): end <= 0
  float* st = states + attn_geometry::StateOffset(geo, a.kv_heads, blockIdx.z, h, tk.task, j,
                                                  a.head_dim + 2);
  const int hd = a.head_dim;
  if (end <= t0) {
    for (int d = threadIdx.x; d < hd; d += blockDim.x) st[2 + d] = 0.0f;
    if (threadIdx.x == 0) {
      st[0] = -INFINITY;
      st[1] = 0.0f;
    }
    return;
  }
  const float softmax_scale = 1.0f / sqrtf(static_cast<float>(hd));
  const float* q = a.q + (row * a.heads + h * geo.g + grp) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float ks = 1.0f;
    if (prefix && a.codec == 1) {
      ks = a.key_scale_mode == 0   ? a.pk_scales[0]
           : a.key_scale_mode == 1 ? a.pk_scales[h]
                                   : a.pk_scales[h * hd + d];
    }
    qs[d] = q[d] * softmax_scale * ks;
  }
  __syncthreads();
  const int count = static_cast<int>(end - t0);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // Scores: warp w takes tokens w, w + kWarps, ...; lanes over the head dimension.
  for (int i = warp; i < count; i += kWarps) {
    const int64_t t = t0 + i;
    float s = 0.0f;
    if (prefix) {
      for (int d = lane; d < hd; d += 32) s += qs[d] * PrefixKey(a, h, t, d);
    } else {
      const float* k = a.k_suffix + (h * a.suffix_capacity + t) * hd;
      for (int d = lane; d < hd; d += 32) s += qs[d] * k[d];
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) sc[i] = s;
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < count; i += blockDim.x) mx = fmaxf(mx, sc[i]);
  mx = BlockReduce(mx, red, true);
  float lsum = 0.0f;
  for (int i = threadIdx.x; i < count; i += blockDim.x) {
    sc[i] = expf(sc[i] - mx);
    lsum += sc[i];
  }
  const float l = BlockReduce(lsum, red, false);  // its barriers publish sc[] too
  // Values: `groups` groups of hd threads; group p sums tokens p, p + groups, ...
  const int groups = hd <= kThreads ? kThreads / hd : 1;
  if (groups > 1) {
    const int p = threadIdx.x / hd, d = threadIdx.x % hd;
    float acc = 0.0f;
    if (p < groups) {
      for (int i = p; i < count; i += groups) {
        const int64_t t = t0 + i;
        const float v =
            prefix ? PrefixValue(a, h, t, d) : a.v_suffix[(h * a.suffix_capacity + t) * hd + d];
        acc += sc[i] * v;
      }
    }
    red[threadIdx.x] = p < groups ? acc : 0.0f;
    __syncthreads();
    if (threadIdx.x < hd) {
      float sum = 0.0f;
      for (int g = 0; g < groups; ++g) sum += red[g * hd + threadIdx.x];
      st[2 + threadIdx.x] = sum / l;
    }
  } else {
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
      float acc = 0.0f;
      for (int i = 0; i < count; ++i) {
        const int64_t t = t0 + i;
        const float v =
            prefix ? PrefixValue(a, h, t, d) : a.v_suffix[(h * a.suffix_capacity + t) * hd + d];
        acc += sc[i] * v;
      }
      st[2 + d] = acc / l;
    }
  }
  if (threadIdx.x == 0) {
    st[0] = mx;
    st[1] = l;
  }
}

// Merges the chunk states of query j of KV head h and writes the output: grid kv_heads * nq.
__global__ void MergeKernel(AttentionLaunch launch, Geometry geo, const float* states) {
  const AttentionLaunch a = SessionOf(launch, blockIdx.y);
  __shared__ float o[kMaxHd];
  const int hd = a.head_dim;
  const int h = blockIdx.x / geo.nq, j = blockIdx.x % geo.nq;
  float mcur = -INFINITY, lcur = 0.0f;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) o[d] = 0.0f;
  __syncthreads();
  auto merge = [&](int64_t task) {
    const float* st =
        states + attn_geometry::StateOffset(geo, a.kv_heads, blockIdx.y, h, task, j, hd + 2);
    const float mb = st[0], lb = st[1];
    if (!(lb > 0.0f)) return;
    if (!(lcur > 0.0f)) {
      for (int d = threadIdx.x; d < hd; d += blockDim.x) o[d] = st[2 + d];
      mcur = mb;
      lcur = lb;
      __syncthreads();
      return;
    }
    const float mm = fmaxf(mcur, mb);
    const float wa = lcur * expf(mcur - mm), wb = lb * expf(mb - mm);
    const float inv = 1.0f / (wa + wb);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) o[d] = (wa * o[d] + wb * st[2 + d]) * inv;
    mcur = mm;
    lcur = wa + wb;
    __syncthreads();
  };
  for (int64_t t = 0; t < geo.pc; ++t) merge(t);
  if (a.codec == 1 && geo.pc > 0 && lcur > 0.0f) {
    // Back from the rotated code domain: unnormalized block Walsh-Hadamard, signs, scale.
    const int block = m::HadamardBlock(hd);
    for (int half = 1; half < block; half *= 2) {
      for (int i = threadIdx.x; i < hd / 2; i += blockDim.x) {
        const int b0 = i / (block / 2), r = i % (block / 2);
        const int lo = b0 * block + (r / half) * 2 * half + r % half;
        const float x = o[lo], y = o[lo + half];
        o[lo] = x + y;
        o[lo + half] = x - y;
      }
      __syncthreads();
    }
    const float scale = 1.0f / sqrtf(static_cast<float>(hd) * static_cast<float>(block));
    for (int d = threadIdx.x; d < hd; d += blockDim.x)
      o[d] = o[d] * m::RotationSign(a.seed, d) * scale;
    __syncthreads();
  }
  for (int64_t t = geo.pc; t < geo.tasks_per_head; ++t) merge(t);
  const int64_t row = j / geo.g, grp = j % geo.g;
  float* dst = a.out + (row * a.heads + h * geo.g + grp) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) dst[d] = o[d];
}

}  // namespace

namespace {

// The launch of `l` for sessions [z0, z0 + zn) of a slot launch (its rows' slots, lengths,
// queries and outputs from row z0 on); `l` itself when not a slot launch.
AttentionLaunch SessionGroup(AttentionLaunch l, int64_t z0, int64_t zn) {
  if (l.row_slot == nullptr) return l;
  const int64_t row = static_cast<int64_t>(l.heads) * l.head_dim;
  l.row_slot += z0;
  l.row_length += z0;
  l.q += z0 * row;
  l.out += z0 * row;
  l.rows = zn;
  return l;
}

// Most bytes of partial states one scratch allocation holds: sessions of a slot launch, and
// query rows of a launch of many rows over a long prefix, run in groups that fit.
constexpr size_t kMaxStateBytes = size_t{512} << 20;

// kMaxStateBytes, or POLYKV_CUDA_ATTENTION_STATE_BYTES when set to a positive count (the gpu
// tests: groups small enough to split a small call).
size_t MaxStateBytes() {
  const char* v = std::getenv("POLYKV_CUDA_ATTENTION_STATE_BYTES");
  const long long b = v != nullptr ? std::atoll(v) : 0;
  return b > 0 ? static_cast<size_t>(b) : kMaxStateBytes;
}

// InvokeAttention of validated launches whose rows' states fit the groups below.
cudaError_t InvokeSessions(const AttentionLaunch* segs, int segments, cudaStream_t stream) {
  const AttentionLaunch& a = segs[segments - 1];
  const bool slots = a.row_slot != nullptr;
  const int64_t sessions = slots ? a.rows : 1;
  int64_t seg_tokens[attn_geometry::kMaxSegments];
  for (int s = 0; s < segments; ++s) seg_tokens[s] = segs[s].prefix_tokens;
  const Geometry g =
      attn_geometry::Plan(seg_tokens, segments, a.suffix_length, a.heads / a.kv_heads, a.n);
  if (g.nq > 65535 || static_cast<int64_t>(a.kv_heads) * g.tasks_per_head > 0x7FFFFFFF)
    return cudaErrorInvalidValue;  // grid y / x limits (the host refuses such calls first)
  // The partial states of one session; sessions run in groups whose states fit in
  // kMaxStateBytes (many sessions over a long prefix), one after another on the stream.
  const size_t per_session =
      static_cast<size_t>(attn_geometry::StateBytes(g, a.kv_heads, a.head_dim));
  const int64_t group = std::max<int64_t>(
      1, std::min<int64_t>(sessions, static_cast<int64_t>(MaxStateBytes() / per_session)));
  float* states = nullptr;
  cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&states),
                                  per_session * static_cast<size_t>(group), stream);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky: the caller's next launch must not report it again
    return e;
  }
  for (int64_t z0 = 0; z0 < sessions && e == cudaSuccess; z0 += group) {
    const int64_t zn = std::min(group, sessions - z0);
    // One launch per prefix segment (its chunks are positions after the segments before it);
    // the last also runs the suffix chunks. One segment: one launch, as before segments.
    for (int s = 0; s < segments && e == cudaSuccess; ++s) {
      const Geometry launch = attn_geometry::ForSegment(g, seg_tokens, segments, s);
      if (launch.tasks > 0) {
        PartialKernel<<<dim3(static_cast<unsigned>(a.kv_heads * launch.tasks),
                             static_cast<unsigned>(g.nq), static_cast<unsigned>(zn)),
                        kThreads, 0, stream>>>(SessionGroup(segs[s], z0, zn), launch, states);
        e = cudaGetLastError();
      }
    }
    if (e == cudaSuccess) {
      MergeKernel<<<dim3(static_cast<unsigned>(a.kv_heads * g.nq), static_cast<unsigned>(zn)),
                    kThreads, 0, stream>>>(SessionGroup(a, z0, zn), g, states);
      e = cudaGetLastError();
    }
  }
  const cudaError_t f = cudaFreeAsync(states, stream);
  return e != cudaSuccess ? e : f;
}

}  // namespace

cudaError_t InvokeAttention(const AttentionLaunch* segs, int segments, cudaStream_t stream) {
  if (segments < 1 || segments > attn_geometry::kMaxSegments) return cudaErrorInvalidValue;
  const AttentionLaunch& a = segs[segments - 1];  // the suffix and queries: every launch's
  if (a.head_dim > kMaxHd || a.n < 1 || a.kv_heads < 1 || a.heads % a.kv_heads != 0)
    return cudaErrorInvalidValue;
  const bool slots = a.row_slot != nullptr;
  if (slots && (a.n != 1 || a.rows < 1 || a.rows > 65535 || a.row_length == nullptr))
    return cudaErrorInvalidValue;
  if (slots || a.n == 1 || a.suffix_length_dev != nullptr)
    return InvokeSessions(segs, segments, stream);
  // Many query rows of one session (a prefill chunk, a scored chunk, a long prompt): in
  // groups of rows whose states fit kMaxStateBytes, each as a launch of its own (its rows
  // attend to the same positions as in the whole call: attn_geometry::RowGroupOf).
  int64_t seg_tokens[attn_geometry::kMaxSegments];
  for (int s = 0; s < segments; ++s) seg_tokens[s] = segs[s].prefix_tokens;
  const Geometry one_row =
      attn_geometry::Plan(seg_tokens, segments, a.suffix_length, a.heads / a.kv_heads, 1);
  const int64_t per_row = attn_geometry::StateBytes(one_row, a.kv_heads, a.head_dim);
  const int64_t rows_per_group =
      std::max<int64_t>(1, static_cast<int64_t>(MaxStateBytes()) / std::max<int64_t>(1, per_row));
  if (rows_per_group >= a.n) return InvokeSessions(segs, segments, stream);
  // Every segment's launch reads the queries (and the merge writes the output) through its
  // own entry: each entry gets the group's rows, not only the last.
  AttentionLaunch group[attn_geometry::kMaxSegments];
  for (int s = 0; s < segments; ++s) group[s] = segs[s];
  const int64_t row = static_cast<int64_t>(a.heads) * a.head_dim;
  cudaError_t e = cudaSuccess;
  for (int64_t i = 0; i * rows_per_group < a.n && e == cudaSuccess; ++i) {
    const attn_geometry::RowGroup rg =
        attn_geometry::RowGroupOf(a.n, a.suffix_length, rows_per_group, i);
    for (int s = 0; s < segments; ++s) {
      group[s].n = rg.rows;
      group[s].suffix_length = rg.suffix_length;
      group[s].q = segs[s].q + rg.r0 * row;
      group[s].out = segs[s].out + rg.r0 * row;
    }
    e = InvokeSessions(group, segments, stream);
  }
  return e;
}

}  // namespace polykv::kernels::cuda
