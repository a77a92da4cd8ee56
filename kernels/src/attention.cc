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
#include "polykv/cuda_status.h"
#endif
#include "internal.h"
#include "polykv/kernels/codec_math.h"
#include "thread_pool.h"

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
  if (codec == PrefixCodec::kRaw)
    return 2 * shape.elements() * static_cast<int64_t>(DTypeSize(raw_dtype));
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
    if (v.tokens > 0 &&
        (p.k == nullptr || p.v == nullptr ||
         (v.codec == PrefixCodec::kK8V && (p.k_scales == nullptr || p.v_norms == nullptr))))
      return absl::InvalidArgumentError(
          absl::StrCat("prefix view: layer ", l, " has a null section"));
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
                                                   " must be in [n=", a.n,
                                                   ", capacity=", a.suffix_capacity, "]"));
  if (a.q == nullptr || a.out == nullptr || a.k_suffix == nullptr || a.v_suffix == nullptr)
    return absl::InvalidArgumentError("attention: null query, output or suffix pointer");
  // The prefix's segments in position order (empty ones dropped); pv = the first.
  std::vector<const PrefixView*> segs;
  if (a.prefix != nullptr && a.prefix->tokens > 0) segs.push_back(a.prefix);
  for (const PrefixView& t : a.prefix_tail)
    if (t.tokens > 0) segs.push_back(&t);
  const PrefixView* pv = segs.empty() ? nullptr : segs.front();
  for (size_t s = 0; s < segs.size(); ++s) {
    const PrefixView* sv = segs[s];
    if (sv->kv_heads != a.kv_heads || sv->head_dim != hd)
      return absl::InvalidArgumentError(
          absl::StrCat("attention: prefix segment ", s, " has kv_heads ", sv->kv_heads,
                       ", head_dim ", sv->head_dim, "; the model ", a.kv_heads, ", ", hd));
    if (a.layer < 0 || a.layer >= static_cast<int32_t>(sv->layers.size()))
      return absl::InvalidArgumentError(absl::StrCat(
          "attention: layer ", a.layer, " outside prefix segment ", s, "'s ", sv->layers.size()));
    if (sv->codec != pv->codec ||
        (pv->codec == PrefixCodec::kK8V && sv->config.rotation_seed != pv->config.rotation_seed))
      return absl::InvalidArgumentError(absl::StrCat(
          "attention: prefix segment ", s, " differs from segment 0 in codec or rotation seed"));
  }
  if (opt.device == Device::kCuda) {
#if defined(POLYKV_HAVE_CUDA)
    cuda::AttentionLaunch l;
    if (segs.size() > 1)
      return absl::UnimplementedError(
          "attention on CUDA reads one prefix segment: this prefix has a parent pool's "
          "segments too (attend on the CPU, or decode the pools)");
    if (pv != nullptr) {
      const PrefixLayer& pl = pv->layers[a.layer];
      l.prefix_tokens = pv->tokens;
      l.codec = pv->codec == PrefixCodec::kK8V ? 1 : 0;
      l.raw_dtype = internal::DTypeCode(pv->raw_dtype);
      l.pk = pl.k;
      l.pk_scales = pl.k_scales;
      l.pv = pl.v;
      l.pv_norms = pl.v_norms;
      l.key_scale_mode = static_cast<int>(pv->config.key_scale);
      l.seed = pv->config.rotation_seed;
      if (l.codec == 1) {
        // Every codec a pool holds: 8-bit or packed (4..7-bit) keys, f32 or f16 norms, this
        // layer's value bits.
        l.key_bits = pv->config.key_bits;
        l.norms_f16 = pv->config.norm_dtype == DType::kF16;
        POLYKV_ASSIGN_OR_RETURN(math::ValueCodebook cb,
                                internal::GetValueCodebook(pv->ValueBitsOf(a.layer)));
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
    return CudaStatus(cuda::InvokeAttention(l, static_cast<cudaStream_t>(opt.stream)),
                      "attention kernel");
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
  const int64_t C = kAttentionChunk;
  const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const bool k8 = pv != nullptr && pv->codec == PrefixCodec::kK8V;

  // Per segment: its layer, length, first chunk task, codebook and packed sizes.
  struct Segment {
    const PrefixView* view = nullptr;
    const PrefixLayer* layer = nullptr;
    int64_t tokens = 0;
    int64_t first_task = 0;
    math::ValueCodebook cb;
    int value_bits = 0;
    int64_t v_bytes = 0, k_bytes = 0;
    bool packed_keys = false, f16_norms = false;
  };
  std::vector<Segment> seg(segs.size());
  int64_t P = 0, pc = 0;
  for (size_t s = 0; s < segs.size(); ++s) {
    Segment& g = seg[s];
    g.view = segs[s];
    g.layer = &segs[s]->layers[a.layer];
    g.tokens = segs[s]->tokens;
    g.first_task = pc;
    if (k8) {
      g.value_bits = g.view->ValueBitsOf(a.layer);
      POLYKV_ASSIGN_OR_RETURN(g.cb, internal::GetValueCodebook(g.value_bits));
      g.v_bytes = PackedVectorBytes(hd, g.value_bits);
      g.k_bytes = PackedKeyVectorBytes(hd, g.view->config.key_bits);
      g.packed_keys = g.view->config.key_bits != 8;
      g.f16_norms = g.view->config.norm_dtype == DType::kF16;
    }
    P += g.tokens;
    pc += (g.tokens + C - 1) / C;
  }
  const int64_t sc = (a.suffix_length + C - 1) / C;
  const int64_t tasks_per_head = pc + sc;
  // The segment of prefix chunk task `task` (< pc).
  auto segment_of = [&](int64_t task) {
    size_t s = 0;
    while (s + 1 < seg.size() && seg[s + 1].first_task <= task) ++s;
    return s;
  };

  // Queries per KV head, j = row * G + group: suffix copy (softmax scale) and one prefix copy
  // per segment (softmax scale x the segment's key scale for int8 keys).
  const size_t q_floats = static_cast<size_t>(a.kv_heads) * nq * hd;
  std::vector<float> qs(q_floats);
  std::vector<float> qp(q_floats * seg.size());
  std::vector<int64_t> lim_suffix(nq), lim_prefix(nq, P);
  for (int64_t i = 0; i < a.n; ++i)
    for (int g = 0; g < G; ++g) lim_suffix[i * G + g] = a.suffix_length - a.n + i + 1;
  for (int kvh = 0; kvh < a.kv_heads; ++kvh) {
    for (int64_t i = 0; i < a.n; ++i) {
      for (int g = 0; g < G; ++g) {
        const float* src = a.q + (i * a.heads + kvh * G + g) * hd;
        const int64_t j = i * G + g;
        float* ds = qs.data() + (static_cast<int64_t>(kvh) * nq + j) * hd;
        for (int d = 0; d < hd; ++d) ds[d] = src[d] * softmax_scale;
        for (size_t s = 0; s < seg.size(); ++s) {
          const PrefixLayer* pl = seg[s].layer;
          float* dp = qp.data() + s * q_floats + (static_cast<int64_t>(kvh) * nq + j) * hd;
          for (int d = 0; d < hd; ++d) {
            float ks = 1.0f;
            if (k8) {
              switch (seg[s].view->config.key_scale) {
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
    if (task < pc) {  // prefix chunk of segment s
      const size_t s = segment_of(task);
      const Segment& g = seg[s];
      const PrefixLayer* pl = g.layer;
      const int64_t Ps = g.tokens;
      c.q = qp.data() + s * q_floats + kvh * nq * hd;
      c.limit = lim_prefix.data();
      c.t0 = (task - g.first_task) * C;
      c.t1 = std::min(Ps, c.t0 + C);
      if (k8) {
        // The chunk's pointers start at its first token (t0 = 0 below): packed keys and f16
        // norms of the chunk are widened into per-thread scratch first.
        const int64_t t0 = c.t0, cnt = c.t1 - c.t0;
        c.key_kind = attn::kKeyI8;
        if (g.packed_keys) {
          std::vector<int8_t>& kq = ThreadKeyScratch();
          if (kq.size() < static_cast<size_t>(cnt * hd)) kq.resize(static_cast<size_t>(cnt * hd));
          UnpackKeyVectors(static_cast<const uint8_t*>(pl->k) + (kvh * Ps + t0) * g.k_bytes, cnt,
                           hd, g.view->config.key_bits, kq.data());
          c.k = kq.data();
        } else {
          c.k = static_cast<const int8_t*>(pl->k) + (kvh * Ps + t0) * hd;
        }
        c.value_kind = attn::kValPacked;
        c.v = static_cast<const uint8_t*>(pl->v) + (kvh * Ps + t0) * g.v_bytes;
        c.v_bytes = g.v_bytes;
        if (g.f16_norms) {
          std::vector<float>& nf = ThreadNormScratch();
          if (nf.size() < static_cast<size_t>(cnt)) nf.resize(static_cast<size_t>(cnt));
          NormsFromF16(static_cast<const uint16_t*>(pl->v_norms) + kvh * Ps + t0, cnt, nf.data());
          c.v_norms = nf.data();
        } else {
          c.v_norms = static_cast<const float*>(pl->v_norms) + kvh * Ps + t0;
        }
        c.bits = g.value_bits;
        c.levels = g.cb.levels;
        c.t0 = 0;
        c.t1 = cnt;
      } else {
        const int kind = RawKind(g.view->raw_dtype);
        const int64_t es = static_cast<int64_t>(DTypeSize(g.view->raw_dtype));
        c.key_kind = kind;
        c.value_kind = kind;  // same numbering for raw kinds
        c.k = static_cast<const uint8_t*>(pl->k) + kvh * Ps * hd * es;
        c.v = static_cast<const uint8_t*>(pl->v) + kvh * Ps * hd * es;
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
    const size_t need = static_cast<size_t>((c.t1 - c.t0) * (3 * hd + nq) + 16 * hd);
    if (scratch.size() < need) scratch.resize(need);
    c.scratch = scratch.data();
    chunk(c);
    for (int j = 0; j < nq; ++j) {
      float* st = state_ptr(kvh, task, j);
      st[0] = m[j];
      st[1] = l[j];
      std::copy(o.begin() + static_cast<int64_t>(j) * hd,
                o.begin() + static_cast<int64_t>(j + 1) * hd, st + 2);
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
