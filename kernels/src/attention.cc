// Split attention over [prefix | suffix]: validation, query scaling (softmax scale and key
// scales folded in once), chunk tasks over the threads, the log-sum-exp merge in position
// order, and the inverse rotation of TurboQuant-MSE values once per output vector.
#include "polykv/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attention_internal.h"
#if defined(POLYKV_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "attention_cuda.h"
#endif
#include "internal.h"
#include "thread_pool.h"
#include "polykv/kernels/codec_math.h"

namespace polykv::kernels {
namespace {

attn::ChunkFn ChunkFor(Isa isa) {
  switch (isa) {
#ifdef POLYKV_HAVE_AVX512_KERNELS
    case Isa::kAvx512:
      return attn::ChunkAvx512;
#endif
#ifdef POLYKV_HAVE_AVX2_KERNELS
    case Isa::kAvx2:
      return attn::ChunkAvx2;
#endif
    default:
      return attn::ChunkScalar;
  }
}

int RawKind(DType t) {
  switch (t) {
    case DType::kF16:
      return attn::kKeyF16;
    case DType::kBF16:
      return attn::kKeyBf16;
    default:
      return attn::kKeyF32;
  }
}

std::vector<float>& ThreadScratch() {
  thread_local std::vector<float> s;
  return s;
}

std::vector<int8_t>& ThreadKeyScratch() {
  thread_local std::vector<int8_t> s;
  return s;
}

std::vector<float>& ThreadNormScratch() {
  thread_local std::vector<float> s;
  return s;
}

}  // namespace

int64_t PrefixView::LayerBytes() const {
  const LayerShape shape{kv_heads, tokens, head_dim};
  if (codec == PrefixCodec::kRaw) return 2 * shape.elements() * static_cast<int64_t>(DTypeSize(raw_dtype));
  if (layers.empty()) return CompressedLayerBytes(shape, config).total();
  int64_t sum = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    CodecConfig c = config;
    c.value_bits = ValueBitsOf(l);
    sum += CompressedLayerBytes(shape, c).total();
  }
  return sum / static_cast<int64_t>(layers.size());
}

Status ValidatePrefixView(const PrefixView& v) {
  if (v.kv_heads < 1 || v.head_dim < 1 || v.head_dim > 512 || v.tokens < 0)
    return absl::InvalidArgumentError(absl::StrCat("prefix view: kv_heads ", v.kv_heads,
                                                   ", head_dim ", v.head_dim, " (1..512), tokens ",
                                                   v.tokens));
  if (v.codec == PrefixCodec::kK8V) {
    if (v.tokens > 0) {
      POLYKV_RETURN_IF_ERROR(
          ValidateConfig(LayerShape{v.kv_heads, v.tokens, v.head_dim}, v.config));
      for (size_t l = 0; l < v.layers.size(); ++l) {
        const int b = v.ValueBitsOf(l);
        if (b < 2 || b > 4)
          return absl::InvalidArgumentError(
              absl::StrCat("prefix view: layer ", l, " value_bits must be 2, 3 or 4, got ", b));
      }
    }
  } else if (v.codec != PrefixCodec::kRaw) {
    return absl::InvalidArgumentError("prefix view: unknown codec");
  }
  for (size_t l = 0; l < v.layers.size(); ++l) {
    const PrefixLayer& p = v.layers[l];
    if (v.tokens > 0 && (p.k == nullptr || p.v == nullptr ||
                         (v.codec == PrefixCodec::kK8V && (p.k_scales == nullptr || p.v_norms == nullptr))))
      return absl::InvalidArgumentError(absl::StrCat("prefix view: layer ", l, " has a null section"));
  }
  return absl::OkStatus();
}

void MergeAttentionState(AttentionState& a, const AttentionState& b, int32_t hd) {
  if (!(b.l > 0)) return;  // empty b
  if (!(a.l > 0)) {
    a.m = b.m;
    a.l = b.l;
    for (int i = 0; i < hd; ++i) a.o[i] = b.o[i];
    return;
  }
  const float m = a.m > b.m ? a.m : b.m;
  const float wa = a.l * std::exp(a.m - m), wb = b.l * std::exp(b.m - m);
  const float inv = 1.0f / (wa + wb);
  for (int i = 0; i < hd; ++i) a.o[i] = (wa * a.o[i] + wb * b.o[i]) * inv;
  a.m = m;
  a.l = wa + wb;
}

Status AttentionForward(const AttentionArgs& a, const AttentionOptions& opt) {
  const int hd = a.head_dim;
  if (a.n < 1 || a.heads < 1 || a.kv_heads < 1 || a.heads % a.kv_heads != 0 || hd < 1 || hd > 512)
    return absl::InvalidArgumentError(absl::StrCat("attention: n ", a.n, ", heads ", a.heads,
                                                   ", kv_heads ", a.kv_heads, ", head_dim ", hd));
  if (a.suffix_length < a.n || a.suffix_length > a.suffix_capacity)
    return absl::InvalidArgumentError(absl::StrCat("attention: suffix_length ", a.suffix_length,
                                                   " must be in [n=", a.n, ", capacity=",
                                                   a.suffix_capacity, "]"));
  if (a.q == nullptr || a.out == nullptr || a.k_suffix == nullptr || a.v_suffix == nullptr)
    return absl::InvalidArgumentError("attention: null query, output or suffix pointer");
  const PrefixView* pv = a.prefix != nullptr && a.prefix->tokens > 0 ? a.prefix : nullptr;
  if (pv != nullptr) {
    if (pv->kv_heads != a.kv_heads || pv->head_dim != hd)
      return absl::InvalidArgumentError(absl::StrCat(
          "attention: prefix has kv_heads ", pv->kv_heads, ", head_dim ", pv->head_dim,
          "; the model ", a.kv_heads, ", ", hd));
    if (a.layer < 0 || a.layer >= static_cast<int32_t>(pv->layers.size()))
      return absl::InvalidArgumentError(
          absl::StrCat("attention: layer ", a.layer, " outside the prefix's ", pv->layers.size()));
  }
  if (opt.device == Device::kCuda) {
#if defined(POLYKV_HAVE_CUDA)
    cuda::AttentionLaunch l;
    if (pv != nullptr && pv->codec == PrefixCodec::kK8V &&
        (pv->config.key_bits != 8 || pv->config.norm_dtype != DType::kF32 ||
         pv->ValueBitsOf(a.layer) != pv->config.value_bits))
      return absl::UnimplementedError(
          "attention on CUDA reads 8-bit keys, f32 norms and one value bit width: this "
          "prefix has packed keys, f16 norms or per-layer value bits (attend on the CPU, or "
          "decode the pool)");
    if (pv != nullptr) {
      const PrefixLayer& pl = pv->layers[a.layer];
      l.prefix_tokens = pv->tokens;
      l.codec = pv->codec == PrefixCodec::kK8V ? 1 : 0;
      l.raw_dtype = internal::DTypeCode(pv->raw_dtype);
      l.pk = pl.k;
      l.pk_scales = pl.k_scales;
      l.pv = pl.v;
      l.pv_norms = static_cast<const float*>(pl.v_norms);
      l.key_scale_mode = static_cast<int>(pv->config.key_scale);
      l.seed = pv->config.rotation_seed;
      if (l.codec == 1) {
        POLYKV_ASSIGN_OR_RETURN(math::ValueCodebook cb,
                                internal::GetValueCodebook(pv->config.value_bits));
        l.bits = cb.bits;
        for (int i = 0; i < (1 << cb.bits); ++i) l.levels[i] = cb.levels[i];
      }
    }
    l.k_suffix = a.k_suffix;
    l.v_suffix = a.v_suffix;
    l.suffix_capacity = a.suffix_capacity;
    l.suffix_length = a.suffix_length;
    l.n = a.n;
    l.heads = a.heads;
    l.kv_heads = a.kv_heads;
    l.head_dim = a.head_dim;
    l.q = a.q;
    l.out = a.out;
    const cudaError_t e = cuda::InvokeAttention(l, static_cast<cudaStream_t>(opt.stream));
    if (e != cudaSuccess)
      return absl::InternalError(absl::StrCat("attention on CUDA: ", cudaGetErrorString(e)));
    return absl::OkStatus();
#else
    return absl::UnimplementedError(
        "attention on Device::kCuda requested but PolyKV was built without CUDA");
#endif
  }
  Isa isa = BestIsa();
  if (opt.isa >= 0) {
    isa = static_cast<Isa>(opt.isa);
    if (opt.isa > static_cast<int>(Isa::kAvx512) || !IsaSupported(isa))
      return absl::FailedPreconditionError(
          absl::StrCat("attention: ISA ", opt.isa, " is not supported by this CPU or build"));
  }
  const attn::ChunkFn chunk = ChunkFor(isa);

  const int G = a.heads / a.kv_heads;
  const int nq = static_cast<int>(G * a.n);
  const int64_t P = pv != nullptr ? pv->tokens : 0;
  const int64_t C = kAttentionChunk;
  const int64_t pc = (P + C - 1) / C, sc = (a.suffix_length + C - 1) / C;
  const int64_t tasks_per_head = pc + sc;
  const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(hd));

  // Queries per KV head, j = row * G + group: suffix copy (softmax scale) and prefix copy
  // (softmax scale x key scale for int8 keys).
  std::vector<float> qs(static_cast<size_t>(a.kv_heads) * nq * hd);
  std::vector<float> qp(pv != nullptr ? qs.size() : 0);
  std::vector<int64_t> lim_suffix(nq), lim_prefix(nq, P);
  for (int64_t i = 0; i < a.n; ++i)
    for (int g = 0; g < G; ++g) lim_suffix[i * G + g] = a.suffix_length - a.n + i + 1;
  const bool k8 = pv != nullptr && pv->codec == PrefixCodec::kK8V;
  const PrefixLayer* pl = pv != nullptr ? &pv->layers[a.layer] : nullptr;
  for (int kvh = 0; kvh < a.kv_heads; ++kvh) {
    for (int64_t i = 0; i < a.n; ++i) {
      for (int g = 0; g < G; ++g) {
        const float* src = a.q + (i * a.heads + kvh * G + g) * hd;
        const int64_t j = i * G + g;
        float* ds = qs.data() + (static_cast<int64_t>(kvh) * nq + j) * hd;
        for (int d = 0; d < hd; ++d) ds[d] = src[d] * softmax_scale;
        if (pv == nullptr) continue;
        float* dp = qp.data() + (static_cast<int64_t>(kvh) * nq + j) * hd;
        for (int d = 0; d < hd; ++d) {
          float ks = 1.0f;
          if (k8) {
            switch (pv->config.key_scale) {
              case KeyScaleMode::kPerTensor:
                ks = pl->k_scales[0];
                break;
              case KeyScaleMode::kPerHead:
                ks = pl->k_scales[kvh];
                break;
              case KeyScaleMode::kPerChannel:
                ks = pl->k_scales[kvh * hd + d];
                break;
            }
          }
          dp[d] = src[d] * softmax_scale * ks;
        }
      }
    }
  }

  math::ValueCodebook cb;
  int64_t v_bytes = 0, k_bytes = 0;
  int value_bits = 0;
  const bool packed_keys = k8 && pv->config.key_bits != 8;
  const bool f16_norms = k8 && pv->config.norm_dtype == DType::kF16;
  if (k8) {
    value_bits = pv->ValueBitsOf(a.layer);
    POLYKV_ASSIGN_OR_RETURN(cb, internal::GetValueCodebook(value_bits));
    v_bytes = PackedVectorBytes(hd, value_bits);
    k_bytes = PackedKeyVectorBytes(hd, pv->config.key_bits);
  }

  // Partial states [kv_head][task][j]: m, l, o[hd].
  const int64_t state_floats = hd + 2;
  std::vector<float> states(static_cast<size_t>(a.kv_heads * tasks_per_head * nq * state_floats));
  auto state_ptr = [&](int64_t kvh, int64_t task, int64_t j) {
    return states.data() + ((kvh * tasks_per_head + task) * nq + j) * state_floats;
  };
  const int64_t total_tasks = a.kv_heads * tasks_per_head;
  auto run_task = [&](int64_t flat) {
    const int64_t kvh = flat / tasks_per_head, task = flat % tasks_per_head;
    attn::ChunkArgs c;
    c.hd = hd;
    c.nq = nq;
    std::vector<float> m(nq), l(nq);
    std::vector<float> o(static_cast<size_t>(nq) * hd);
    c.m = m.data();
    c.l = l.data();
    c.o = o.data();
    if (task < pc) {  // prefix chunk
      c.q = qp.data() + kvh * nq * hd;
      c.limit = lim_prefix.data();
      c.t0 = task * C;
      c.t1 = std::min(P, c.t0 + C);
      if (k8) {
        // The chunk's pointers start at its first token (t0 = 0 below): packed keys and f16
        // norms of the chunk are widened into per-thread scratch first.
        const int64_t t0 = c.t0, cnt = c.t1 - c.t0;
        c.key_kind = attn::kKeyI8;
        if (packed_keys) {
          std::vector<int8_t>& kq = ThreadKeyScratch();
          if (kq.size() < static_cast<size_t>(cnt * hd)) kq.resize(static_cast<size_t>(cnt * hd));
          UnpackKeyVectors(static_cast<const uint8_t*>(pl->k) + (kvh * P + t0) * k_bytes, cnt, hd,
                           pv->config.key_bits, kq.data());
          c.k = kq.data();
        } else {
          c.k = static_cast<const int8_t*>(pl->k) + (kvh * P + t0) * hd;
        }
        c.value_kind = attn::kValPacked;
        c.v = static_cast<const uint8_t*>(pl->v) + (kvh * P + t0) * v_bytes;
        c.v_bytes = v_bytes;
        if (f16_norms) {
          std::vector<float>& nf = ThreadNormScratch();
          if (nf.size() < static_cast<size_t>(cnt)) nf.resize(static_cast<size_t>(cnt));
          NormsFromF16(static_cast<const uint16_t*>(pl->v_norms) + kvh * P + t0, cnt, nf.data());
          c.v_norms = nf.data();
        } else {
          c.v_norms = static_cast<const float*>(pl->v_norms) + kvh * P + t0;
        }
        c.bits = value_bits;
        c.levels = cb.levels;
        c.t0 = 0;
        c.t1 = cnt;
      } else {
        const int kind = RawKind(pv->raw_dtype);
        const int64_t es = static_cast<int64_t>(DTypeSize(pv->raw_dtype));
        c.key_kind = kind;
        c.value_kind = kind;  // same numbering for raw kinds
        c.k = static_cast<const uint8_t*>(pl->k) + kvh * P * hd * es;
        c.v = static_cast<const uint8_t*>(pl->v) + kvh * P * hd * es;
      }
    } else {  // suffix chunk
      const int64_t s = task - pc;
      c.q = qs.data() + kvh * nq * hd;
      c.limit = lim_suffix.data();
      c.t0 = s * C;
      c.t1 = std::min(a.suffix_length, c.t0 + C);
      c.key_kind = attn::kKeyF32;
      c.value_kind = attn::kValF32;
      c.k = a.k_suffix + kvh * a.suffix_capacity * hd;
      c.v = a.v_suffix + kvh * a.suffix_capacity * hd;
    }
    std::vector<float>& scratch = ThreadScratch();
    const size_t need = static_cast<size_t>((c.t1 - c.t0) * (2 * hd + nq));
    if (scratch.size() < need) scratch.resize(need);
    c.scratch = scratch.data();
    chunk(c);
    for (int j = 0; j < nq; ++j) {
      float* st = state_ptr(kvh, task, j);
      st[0] = m[j];
      st[1] = l[j];
      std::copy(o.begin() + static_cast<int64_t>(j) * hd, o.begin() + static_cast<int64_t>(j + 1) * hd, st + 2);
    }
  };

  std::vector<float> signs;
  int block = 1;
  float unrot_scale = 1.0f;
  if (k8) {
    signs.resize(hd);
    for (int i = 0; i < hd; ++i) signs[i] = math::RotationSign(pv->config.rotation_seed, i);
    block = math::HadamardBlock(hd);
    unrot_scale = 1.0f / std::sqrt(static_cast<float>(hd) * static_cast<float>(block));
  }
  auto merge = [&](int64_t flat) {
    const int64_t kvh = flat / nq, j = flat % nq;
    std::vector<float> acc(hd);
    AttentionState s{-std::numeric_limits<float>::infinity(), 0.0f, acc.data()};
    for (int64_t t = 0; t < pc; ++t) {
      float* st = state_ptr(kvh, t, j);
      MergeAttentionState(s, AttentionState{st[0], st[1], st + 2}, hd);
    }
    if (k8 && s.l > 0) {  // back from the rotated code domain, once per output vector
      math::BlockFwht(acc.data(), hd, block);
      for (int i = 0; i < hd; ++i) acc[i] = acc[i] * signs[i] * unrot_scale;
    }
    for (int64_t t = pc; t < tasks_per_head; ++t) {
      float* st = state_ptr(kvh, t, j);
      MergeAttentionState(s, AttentionState{st[0], st[1], st + 2}, hd);
    }
    const int64_t i = j / G, g = j % G;
    float* dst = a.out + (i * a.heads + kvh * G + g) * hd;
    for (int d = 0; d < hd; ++d) dst[d] = acc[d];
  };

  const int threads = std::max(1, opt.threads > 0 ? opt.threads : ComputeThreads());
  const int64_t work = (P + a.suffix_length) * a.kv_heads * nq;
  if (threads <= 1 || total_tasks < 2 || work < 4096) {
    for (int64_t t = 0; t < total_tasks; ++t) run_task(t);
    for (int64_t f = 0; f < a.kv_heads * nq; ++f) merge(f);
    return absl::OkStatus();
  }
  internal::RunTasks(total_tasks, threads, run_task);
  internal::RunTasks(a.kv_heads * nq, threads, merge);
  return absl::OkStatus();
}

}  // namespace polykv::kernels
