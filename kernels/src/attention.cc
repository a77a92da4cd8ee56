// Split attention over [prefix | suffix]: validation, query scaling (softmax scale and key
// scales folded in once), chunk tasks over the threads, the log-sum-exp merge in position
// order, and the inverse rotation of TurboQuant-MSE values once per output vector.
#include "polykv/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
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

namespace {

// The prefix's segments in position order (empty ones dropped), checked against the model's
// shape and against each other.
Status PrefixSegments(const PrefixView* prefix, absl::Span<const PrefixView> tail, int32_t layer,
                      int32_t kv_heads, int32_t hd, std::vector<const PrefixView*>* segs) {
  if (prefix != nullptr && prefix->tokens > 0) segs->push_back(prefix);
  for (const PrefixView& t : tail)
    if (t.tokens > 0) segs->push_back(&t);
  const PrefixView* pv = segs->empty() ? nullptr : segs->front();
  for (size_t s = 0; s < segs->size(); ++s) {
    const PrefixView* sv = (*segs)[s];
    if (sv->kv_heads != kv_heads || sv->head_dim != hd)
      return absl::InvalidArgumentError(
          absl::StrCat("attention: prefix segment ", s, " has kv_heads ", sv->kv_heads,
                       ", head_dim ", sv->head_dim, "; the model ", kv_heads, ", ", hd));
    if (layer < 0 || layer >= static_cast<int32_t>(sv->layers.size()))
      return absl::InvalidArgumentError(absl::StrCat(
          "attention: layer ", layer, " outside prefix segment ", s, "'s ", sv->layers.size()));
    if (sv->codec != pv->codec ||
        (pv->codec == PrefixCodec::kK8V && sv->config.rotation_seed != pv->config.rotation_seed))
      return absl::InvalidArgumentError(absl::StrCat(
          "attention: prefix segment ", s, " differs from segment 0 in codec or rotation seed"));
  }
  return absl::OkStatus();
}

Status CheckModelShape(int32_t heads, int32_t kv_heads, int32_t hd, const char* what) {
  if (heads < 1 || kv_heads < 1 || heads % kv_heads != 0 || hd < 1 || hd > 512)
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": heads ", heads, ", kv_heads ", kv_heads, ", head_dim ", hd));
  return absl::OkStatus();
}

// One session's rows and suffix (n >= 1 checked by the caller where required).
Status CheckSession(const AttentionSession& s, const std::string& who) {
  if (s.suffix_length < s.n || s.suffix_length > s.suffix_capacity)
    return absl::InvalidArgumentError(absl::StrCat(who, ": suffix_length ", s.suffix_length,
                                                   " must be in [n=", s.n,
                                                   ", capacity=", s.suffix_capacity, "]"));
  if (s.q == nullptr || s.out == nullptr || s.k_suffix == nullptr || s.v_suffix == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(who, ": null query, output or suffix pointer"));
  return absl::OkStatus();
}

StatusOr<attn::ChunkFn> ChunkForOptions(const AttentionOptions& opt) {
  Isa isa = BestIsa();
  if (opt.isa >= 0) {
    isa = static_cast<Isa>(opt.isa);
    if (opt.isa > static_cast<int>(Isa::kAvx512) || !IsaSupported(isa))
      return absl::FailedPreconditionError(
          absl::StrCat("attention: ISA ", opt.isa, " is not supported by this CPU or build"));
  }
  return ChunkFor(isa);
}

// The CPU path for sessions with n >= 1 (already checked) over the checked segments `segs`.
// Per KV head: every prefix chunk is one task over the stacked queries of all sessions;
// every suffix chunk of every session is one task over that session's queries. Then one
// merge per (KV head, stacked query): prefix states in position order, the inverse
// rotation, the session's suffix states in position order.
Status CpuAttention(const std::vector<const PrefixView*>& segs, int32_t layer, int32_t heads,
                    int32_t kv_heads, int32_t hd, absl::Span<const AttentionSession> sessions,
                    const AttentionOptions& opt) {
  POLYKV_ASSIGN_OR_RETURN(const attn::ChunkFn chunk, ChunkForOptions(opt));
  const PrefixView* pv = segs.empty() ? nullptr : segs.front();
  const int G = heads / kv_heads;
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
    g.layer = &segs[s]->layers[layer];
    g.tokens = segs[s]->tokens;
    g.first_task = pc;
    if (k8) {
      g.value_bits = g.view->ValueBitsOf(layer);
      POLYKV_ASSIGN_OR_RETURN(g.cb, internal::GetValueCodebook(g.value_bits));
      g.v_bytes = PackedVectorBytes(hd, g.value_bits);
      g.k_bytes = PackedKeyVectorBytes(hd, g.view->config.key_bits);
      g.packed_keys = g.view->config.key_bits != 8;
      g.f16_norms = g.view->config.norm_dtype == DType::kF16;
    }
    P += g.tokens;
    pc += (g.tokens + C - 1) / C;
  }
  // The segment of prefix chunk task `task` (< pc).
  auto segment_of = [&](int64_t task) {
    size_t s = 0;
    while (s + 1 < seg.size() && seg[s + 1].first_task <= task) ++s;
    return s;
  };

  // Sessions in stacked order: those whose own call would score on transposed keys
  // (nq >= kTransposedQueries) first, so that one prefix chunk call takes that path for
  // exactly the leading `tq` stacked queries (ChunkArgs::transposed).
  struct Sess {
    const AttentionSession* s = nullptr;
    int nq = 0;              // n * G
    int64_t qoff = 0;        // first stacked query
    int64_t sc = 0;          // suffix chunks
    int64_t first_task = 0;  // first suffix task (in [pc, tasks_per_head))
    int64_t state_off = 0;   // first suffix state (per KV head, in queries)
  };
  std::vector<Sess> ss;
  for (int pass = 0; pass < 2; ++pass)
    for (const AttentionSession& s : sessions) {
      const int nq = static_cast<int>(G * s.n);
      if ((nq >= attn::kTransposedQueries) == (pass == 0)) ss.push_back(Sess{&s, nq});
    }
  int64_t nq_total = 0, tq = 0, task = pc, state_off = 0, suffix_work = 0;
  for (Sess& x : ss) {
    x.qoff = nq_total;
    nq_total += x.nq;
    if (x.nq >= attn::kTransposedQueries) tq += x.nq;
    x.sc = (x.s->suffix_length + C - 1) / C;
    x.first_task = task;
    task += x.sc;
    x.state_off = state_off;
    state_off += x.sc * x.nq;
    suffix_work += x.s->suffix_length * x.nq;
  }
  const int64_t tasks_per_head = task;
  const int64_t suffix_states = state_off;  // per KV head
  const int nqt = static_cast<int>(nq_total);
  // Suffix task -> session.
  std::vector<int32_t> task_sess(static_cast<size_t>(tasks_per_head - pc));
  for (size_t x = 0; x < ss.size(); ++x)
    for (int64_t t = 0; t < ss[x].sc; ++t)
      task_sess[static_cast<size_t>(ss[x].first_task - pc + t)] = static_cast<int32_t>(x);
  // Stacked query -> session.
  std::vector<int32_t> q_sess(static_cast<size_t>(nq_total));
  for (size_t x = 0; x < ss.size(); ++x)
    for (int j = 0; j < ss[x].nq; ++j)
      q_sess[static_cast<size_t>(ss[x].qoff + j)] = static_cast<int32_t>(x);

  // Queries per KV head, stacked j = qoff + row * G + group: suffix copy (softmax scale) and
  // one prefix copy per segment (softmax scale x the segment's key scale for int8 keys).
  const size_t q_floats = static_cast<size_t>(kv_heads) * nqt * hd;
  std::vector<float> qs(q_floats);
  std::vector<float> qp(q_floats * seg.size());
  std::vector<int64_t> lim_suffix(nqt), lim_prefix(nqt, P);
  for (const Sess& x : ss) {
    const AttentionSession& a = *x.s;
    for (int64_t i = 0; i < a.n; ++i)
      for (int g = 0; g < G; ++g) lim_suffix[x.qoff + i * G + g] = a.suffix_length - a.n + i + 1;
    for (int kvh = 0; kvh < kv_heads; ++kvh) {
      for (int64_t i = 0; i < a.n; ++i) {
        for (int g = 0; g < G; ++g) {
          const float* src = a.q + (i * heads + kvh * G + g) * hd;
          const int64_t j = x.qoff + i * G + g;
          float* ds = qs.data() + (static_cast<int64_t>(kvh) * nqt + j) * hd;
          for (int d = 0; d < hd; ++d) ds[d] = src[d] * softmax_scale;
          for (size_t s = 0; s < seg.size(); ++s) {
            const PrefixLayer* pl = seg[s].layer;
            float* dp = qp.data() + s * q_floats + (static_cast<int64_t>(kvh) * nqt + j) * hd;
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
  }

  // Partial states m, l, o[hd]: prefix [kv_head][chunk][stacked j], then suffix
  // [kv_head][session's state_off + chunk * nq + local j].
  const int64_t state_floats = hd + 2;
  const int64_t prefix_states = kv_heads * pc * nq_total;
  std::vector<float> states(
      static_cast<size_t>((prefix_states + kv_heads * suffix_states) * state_floats));
  auto prefix_state = [&](int64_t kvh, int64_t t, int64_t j) {
    return states.data() + ((kvh * pc + t) * nq_total + j) * state_floats;
  };
  auto suffix_state = [&](int64_t kvh, const Sess& x, int64_t chunk, int64_t jl) {
    return states.data() +
           (prefix_states + kvh * suffix_states + x.state_off + chunk * x.nq + jl) * state_floats;
  };
  const int64_t total_tasks = kv_heads * tasks_per_head;
  auto run_task = [&](int64_t flat) {
    const int64_t kvh = flat / tasks_per_head, task = flat % tasks_per_head;
    attn::ChunkArgs c;
    c.hd = hd;
    const Sess* x = task < pc ? nullptr : &ss[static_cast<size_t>(task_sess[task - pc])];
    c.nq = x == nullptr ? nqt : x->nq;
    std::vector<float> m(c.nq), l(c.nq);
    std::vector<float> o(static_cast<size_t>(c.nq) * hd);
    c.m = m.data();
    c.l = l.data();
    c.o = o.data();
    if (x == nullptr) {  // prefix chunk of segment s, for every session's queries
      const size_t s = segment_of(task);
      const Segment& g = seg[s];
      const PrefixLayer* pl = g.layer;
      const int64_t Ps = g.tokens;
      c.q = qp.data() + s * q_floats + kvh * nq_total * hd;
      c.limit = lim_prefix.data();
      c.transposed = static_cast<int32_t>(tq);
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
    } else {  // suffix chunk of session x
      const AttentionSession& a = *x->s;
      const int64_t chunk_index = task - x->first_task;
      c.q = qs.data() + (kvh * nq_total + x->qoff) * hd;
      c.limit = lim_suffix.data() + x->qoff;
      c.t0 = chunk_index * C;
      c.t1 = std::min(a.suffix_length, c.t0 + C);
      c.key_kind = attn::kKeyF32;
      c.value_kind = attn::kValF32;
      c.k = a.k_suffix + kvh * a.suffix_capacity * hd;
      c.v = a.v_suffix + kvh * a.suffix_capacity * hd;
    }
    std::vector<float>& scratch = ThreadScratch();
    const size_t need = static_cast<size_t>((c.t1 - c.t0) * (3 * hd + c.nq) + 16 * hd);
    if (scratch.size() < need) scratch.resize(need);
    c.scratch = scratch.data();
    chunk(c);
    for (int j = 0; j < c.nq; ++j) {
      float* st = x == nullptr ? prefix_state(kvh, task, j)
                               : suffix_state(kvh, *x, task - x->first_task, j);
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
    const int64_t kvh = flat / nq_total, j = flat % nq_total;
    const Sess& x = ss[static_cast<size_t>(q_sess[j])];
    const int64_t jl = j - x.qoff;
    std::vector<float> acc(hd);
    AttentionState s{-std::numeric_limits<float>::infinity(), 0.0f, acc.data()};
    for (int64_t t = 0; t < pc; ++t) {
      float* st = prefix_state(kvh, t, j);
      MergeAttentionState(s, AttentionState{st[0], st[1], st + 2}, hd);
    }
    if (k8 && s.l > 0) {  // back from the rotated code domain, once per output vector
      math::BlockFwht(acc.data(), hd, block);
      for (int i = 0; i < hd; ++i) acc[i] = acc[i] * signs[i] * unrot_scale;
    }
    for (int64_t t = 0; t < x.sc; ++t) {
      float* st = suffix_state(kvh, x, t, jl);
      MergeAttentionState(s, AttentionState{st[0], st[1], st + 2}, hd);
    }
    const int64_t i = jl / G, g = jl % G;
    float* dst = x.s->out + (i * heads + kvh * G + g) * hd;
    for (int d = 0; d < hd; ++d) dst[d] = acc[d];
  };

  const int threads = std::max(1, opt.threads > 0 ? opt.threads : ComputeThreads());
  const int64_t work = (P * nq_total + suffix_work) * kv_heads;
  if (threads <= 1 || total_tasks < 2 || work < 4096) {
    for (int64_t t = 0; t < total_tasks; ++t) run_task(t);
    for (int64_t f = 0; f < kv_heads * nq_total; ++f) merge(f);
    return absl::OkStatus();
  }
  internal::RunTasks(total_tasks, threads, run_task);
  internal::RunTasks(kv_heads * nq_total, threads, merge);
  return absl::OkStatus();
}

}  // namespace

Status AttentionForward(const AttentionArgs& a, const AttentionOptions& opt) {
  const int hd = a.head_dim;
  if (a.n < 1 || a.heads < 1 || a.kv_heads < 1 || a.heads % a.kv_heads != 0 || hd < 1 || hd > 512)
    return absl::InvalidArgumentError(absl::StrCat("attention: n ", a.n, ", heads ", a.heads,
                                                   ", kv_heads ", a.kv_heads, ", head_dim ", hd));
  AttentionSession session;
  session.k_suffix = a.k_suffix;
  session.v_suffix = a.v_suffix;
  session.suffix_capacity = a.suffix_capacity;
  session.suffix_length = a.suffix_length;
  session.n = a.n;
  session.q = a.q;
  session.out = a.out;
  POLYKV_RETURN_IF_ERROR(CheckSession(session, "attention"));
  std::vector<const PrefixView*> segs;
  POLYKV_RETURN_IF_ERROR(PrefixSegments(a.prefix, a.prefix_tail, a.layer, a.kv_heads, hd, &segs));
  const PrefixView* pv = segs.empty() ? nullptr : segs.front();
  if (a.suffix_length_device != nullptr && opt.device != Device::kCuda)
    return absl::InvalidArgumentError(
        "attention: suffix_length_device is a CUDA launch's (device memory); the CPU takes "
        "suffix_length");
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
    l.suffix_length_dev = a.suffix_length_device;
    l.n = a.n;
    l.heads = a.heads;
    l.kv_heads = a.kv_heads;
    l.head_dim = a.head_dim;
    l.q = a.q;
    l.out = a.out;
    return CudaStatus(cuda::InvokeAttention(l, static_cast<cudaStream_t>(opt.stream)),
                      "attention kernel");
#else
    (void)pv;
    return absl::UnimplementedError(
        "attention on Device::kCuda requested but PolyKV was built without CUDA");
#endif
  }
  return CpuAttention(segs, a.layer, a.heads, a.kv_heads, hd, absl::MakeConstSpan(&session, 1),
                      opt);
}

Status AttentionForwardBatch(const BatchAttentionArgs& a, const AttentionOptions& opt) {
  POLYKV_RETURN_IF_ERROR(CheckModelShape(a.heads, a.kv_heads, a.head_dim, "attention batch"));
  std::vector<AttentionSession> active;
  active.reserve(a.sessions.size());
  for (size_t i = 0; i < a.sessions.size(); ++i) {
    const AttentionSession& s = a.sessions[i];
    if (s.n < 0)
      return absl::InvalidArgumentError(
          absl::StrCat("attention batch: session ", i, ": n ", s.n, " must be >= 0"));
    if (s.n == 0) continue;
    POLYKV_RETURN_IF_ERROR(CheckSession(s, absl::StrCat("attention batch: session ", i)));
    active.push_back(s);
  }
  std::vector<const PrefixView*> segs;
  POLYKV_RETURN_IF_ERROR(
      PrefixSegments(a.prefix, a.prefix_tail, a.layer, a.kv_heads, a.head_dim, &segs));
  if (active.empty()) return absl::OkStatus();
  if (opt.device == Device::kCuda) {
    // Not batched on the GPU yet: one call per session, the same results.
    for (size_t i = 0; i < active.size(); ++i) {
      const AttentionSession& s = active[i];
      AttentionArgs one;
      one.prefix = a.prefix;
      one.prefix_tail = a.prefix_tail;
      one.layer = a.layer;
      one.k_suffix = s.k_suffix;
      one.v_suffix = s.v_suffix;
      one.suffix_capacity = s.suffix_capacity;
      one.suffix_length = s.suffix_length;
      one.n = s.n;
      one.heads = a.heads;
      one.kv_heads = a.kv_heads;
      one.head_dim = a.head_dim;
      one.q = s.q;
      one.out = s.out;
      POLYKV_RETURN_IF_ERROR(AttentionForward(one, opt));
    }
    return absl::OkStatus();
  }
  return CpuAttention(segs, a.layer, a.heads, a.kv_heads, a.head_dim, active, opt);
}

}  // namespace polykv::kernels
