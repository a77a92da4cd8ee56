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
#include "attention_geometry.h"
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

// The calling thread's buffer number `kWhich` of element type T (reused across calls).
template <typename T, int kWhich>
std::vector<T>& ThreadBuffer() {
  thread_local std::vector<T> s;
  return s;
}
// A chunk's keys, values and scores; one chunk task's outputs (m, l, o) or one merge's
// accumulator; unpacked key codes; widened f16 norms.
std::vector<float>& ThreadScratch() { return ThreadBuffer<float, 0>(); }
std::vector<float>& ThreadChunkOutputs() { return ThreadBuffer<float, 1>(); }
std::vector<int8_t>& ThreadKeyScratch() { return ThreadBuffer<int8_t, 0>(); }
std::vector<float>& ThreadNormScratch() { return ThreadBuffer<float, 2>(); }

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

// The fields AttentionArgs and AttentionSession share (suffix, query rows, queries,
// output), copied either way: one field list for both directions.
template <class From, class To>
void CopySessionFields(const From& from, To& to) {
  to.k_suffix = from.k_suffix;
  to.v_suffix = from.v_suffix;
  to.suffix_capacity = from.suffix_capacity;
  to.suffix_length = from.suffix_length;
  to.n = from.n;
  to.q = from.q;
  to.out = from.out;
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

// Whether int8 keys score on AMX-INT8 tiles (AttentionOptions::amx): only in the avx512
// build of the chunk, where the CPU and OS hand out the tiles.
StatusOr<bool> IntScoresForOptions(const AttentionOptions& opt) {
  const bool avx512 =
      opt.isa < 0 ? BestIsa() == Isa::kAvx512 : opt.isa == static_cast<int>(Isa::kAvx512);
  const bool can = avx512 && AmxInt8Supported();
  if (opt.amx == 1 && !can)
    return absl::FailedPreconditionError(
        "attention: AMX integer scores requested (amx = 1) but the ISA is not avx512 or this "
        "CPU/OS has no AMX-INT8 tiles");
  return opt.amx != 0 && can;
}

// The key scale that multiplies element d of KV head kvh's queries against a segment (int8
// keys: the segment's per-tensor, per-head or per-channel scale; 1 otherwise).
float KeyScaleOf(const PrefixView& view, const PrefixLayer& pl, bool k8, int kvh, int hd, int d) {
  if (!k8) return 1.0f;
  switch (view.config.key_scale) {
    case KeyScaleMode::kPerTensor:
      return pl.k_scales[0];
    case KeyScaleMode::kPerHead:
      return pl.k_scales[kvh];
    case KeyScaleMode::kPerChannel:
      return pl.k_scales[kvh * hd + d];
  }
  return 1.0f;
}

// One prefix segment of a CpuAttention call: its layer, length, first chunk task, codebook
// and packed sizes.
struct AttnSegment {
  const PrefixView* view = nullptr;
  const PrefixLayer* layer = nullptr;
  int64_t tokens = 0;
  int64_t first_task = 0;
  math::ValueCodebook cb;
  int value_bits = 0;
  int64_t v_bytes = 0, k_bytes = 0;
  bool packed_keys = false, f16_norms = false;
};

// One session of a CpuAttention call, in stacked order.
struct AttnSession {
  const AttentionSession* s = nullptr;
  int nq = 0;              // n * G
  int64_t qoff = 0;        // first stacked query
  int64_t sc = 0;          // suffix chunks
  int64_t first_task = 0;  // first suffix task (in [pc, tasks_per_head))
  int64_t state_off = 0;   // first suffix state (per KV head, in queries)
};

// The CPU path for sessions with n >= 1 (already checked) over the checked segments, in
// steps. Per KV head: every prefix chunk is one task over the stacked queries of all
// sessions; every suffix chunk of every session is one task over that session's queries
// (RunTask). Then one merge per (KV head, stacked query): prefix states in position order,
// the inverse rotation, the session's suffix states in position order (Merge).
class CpuAttentionRun {
 public:
  // int_scores: int8 keys score on integer codes (ChunkArgs::q_codes) where the head_dim
  // allows it (kIntScoreMaxHeadDim, a multiple of 8).
  CpuAttentionRun(int32_t layer, int32_t heads, int32_t kv_heads, int32_t hd, attn::ChunkFn chunk,
                  bool int_scores)
      : layer_(layer),
        heads_(heads),
        kv_heads_(kv_heads),
        hd_(hd),
        G_(heads / kv_heads),
        softmax_scale_(1.0f / std::sqrt(static_cast<float>(hd))),
        chunk_(chunk),
        int_scores_(int_scores && hd % 8 == 0 && hd <= attn::kIntScoreMaxHeadDim) {}

  // Per segment: its layer, length, first chunk task, codebook and packed sizes.
  Status PlanSegments(const std::vector<const PrefixView*>& segs);
  // Sessions in stacked order, their queries, suffix tasks and suffix states.
  void StackSessions(absl::Span<const AttentionSession> sessions);
  // The scaled query copies, the partial states and the inverse rotation's constants.
  void Prepare();
  // Chunk task `flat` in [0, Tasks()): KV head flat / tasks_per_head, then its prefix chunks
  // and every session's suffix chunks.
  void RunTask(int64_t flat);
  // Output vector `flat` in [0, Merges()): KV head flat / nq_total, stacked query.
  void Merge(int64_t flat);

  int64_t Tasks() const { return kv_heads_ * tasks_per_head_; }
  int64_t Merges() const { return kv_heads_ * nq_total_; }
  int64_t Work() const { return (P_ * nq_total_ + suffix_work_) * kv_heads_; }

 private:
  static constexpr int64_t C = kAttentionChunk;
  static constexpr int64_t kStateScalars = 2;  // m, l before o[hd]

  void ScaleQueries();
  void PrefixChunk(int64_t kvh, int64_t task, attn::ChunkArgs& c) const;
  void SuffixChunk(int64_t kvh, const AttnSession& x, int64_t task, attn::ChunkArgs& c) const;
  // The segment of prefix chunk task `task` (< pc).
  size_t SegmentOf(int64_t task) const {
    size_t s = 0;
    while (s + 1 < seg_.size() && seg_[s + 1].first_task <= task) ++s;
    return s;
  }
  // Partial states m, l, o[hd]: prefix [kv_head][chunk][stacked j], then suffix
  // [kv_head][session's state_off + chunk * nq + local j].
  float* PrefixState(int64_t kvh, int64_t t, int64_t j) {
    return states_.data() + ((kvh * pc_ + t) * nq_total_ + j) * (hd_ + kStateScalars);
  }
  float* SuffixState(int64_t kvh, const AttnSession& x, int64_t chunk, int64_t jl) {
    return states_.data() +
           (prefix_states_ + kvh * suffix_states_ + x.state_off + chunk * x.nq + jl) *
               (hd_ + kStateScalars);
  }

  const int32_t layer_, heads_, kv_heads_, hd_;
  const int G_;
  const float softmax_scale_;
  const attn::ChunkFn chunk_;
  bool int_scores_;  // and k8_ (PlanSegments)
  bool k8_ = false;
  const PrefixView* pv_ = nullptr;
  // The buffers below are the calling thread's (Buffers::Get(), reused: a decode step makes
  // one call per layer), every element written before it is read.
  struct Buffers {
    std::vector<AttnSegment> seg;
    std::vector<AttnSession> ss;
    std::vector<int32_t> task_sess, q_sess;
    std::vector<float> qs, qp, qcode_scale, states, signs, key_scales;
    std::vector<int8_t> qcodes;
    std::vector<int64_t> lim_suffix, lim_prefix;
    static Buffers& Get() {
      thread_local Buffers b;
      b.seg.clear();
      b.ss.clear();
      return b;
    }
  };
  Buffers& b_ = Buffers::Get();
  std::vector<AttnSegment>& seg_ = b_.seg;
  int64_t P_ = 0, pc_ = 0;  // prefix tokens and chunks
  std::vector<AttnSession>& ss_ = b_.ss;
  int64_t nq_total_ = 0, tq_ = 0, tasks_per_head_ = 0, suffix_states_ = 0, suffix_work_ = 0;
  std::vector<int32_t>& task_sess_ = b_.task_sess;  // suffix task - pc -> session
  std::vector<int32_t>& q_sess_ = b_.q_sess;        // stacked query -> session
  size_t q_floats_ = 0;
  std::vector<float>& qs_ = b_.qs;  // suffix queries
  std::vector<float>& qp_ = b_.qp;  // one prefix copy per segment
  // int_scores_: qp_'s rows as integer codes (QuantizeQueryCodes) and their scales.
  std::vector<int8_t>& qcodes_ = b_.qcodes;
  std::vector<float>& qcode_scale_ = b_.qcode_scale;
  std::vector<int64_t>& lim_suffix_ = b_.lim_suffix;
  std::vector<int64_t>& lim_prefix_ = b_.lim_prefix;
  int64_t prefix_states_ = 0;
  std::vector<float>& states_ = b_.states;
  std::vector<float>& signs_ = b_.signs;
  int block_ = 1;
  float unrot_scale_ = 1.0f;
};

Status CpuAttentionRun::PlanSegments(const std::vector<const PrefixView*>& segs) {
  pv_ = segs.empty() ? nullptr : segs.front();
  k8_ = pv_ != nullptr && pv_->codec == PrefixCodec::kK8V;
  int_scores_ = int_scores_ && k8_;
  seg_.resize(segs.size());
  for (size_t s = 0; s < segs.size(); ++s) {
    AttnSegment& g = seg_[s];
    g.view = segs[s];
    g.layer = &segs[s]->layers[layer_];
    g.tokens = segs[s]->tokens;
    g.first_task = pc_;
    if (k8_) {
      g.value_bits = g.view->ValueBitsOf(layer_);
      POLYKV_ASSIGN_OR_RETURN(g.cb, internal::GetValueCodebook(g.value_bits));
      g.v_bytes = PackedVectorBytes(hd_, g.value_bits);
      g.k_bytes = PackedKeyVectorBytes(hd_, g.view->config.key_bits);
      g.packed_keys = g.view->config.key_bits != 8;
      g.f16_norms = g.view->config.norm_dtype == DType::kF16;
    }
    P_ += g.tokens;
    pc_ += (g.tokens + C - 1) / C;
  }
  return absl::OkStatus();
}

// Sessions whose own call would score on transposed keys (nq >= kTransposedQueries) come
// first, so that one prefix chunk call takes that path for exactly the leading `tq` stacked
// queries (ChunkArgs::transposed).
void CpuAttentionRun::StackSessions(absl::Span<const AttentionSession> sessions) {
  for (int pass = 0; pass < 2; ++pass)
    for (const AttentionSession& s : sessions) {
      const int nq = static_cast<int>(G_ * s.n);
      if ((nq >= attn::kTransposedQueries) == (pass == 0)) ss_.push_back(AttnSession{&s, nq});
    }
  int64_t task = pc_;
  for (AttnSession& x : ss_) {
    x.qoff = nq_total_;
    nq_total_ += x.nq;
    if (x.nq >= attn::kTransposedQueries) tq_ += x.nq;
    x.sc = (x.s->suffix_length + C - 1) / C;
    x.first_task = task;
    task += x.sc;
    x.state_off = suffix_states_;
    suffix_states_ += x.sc * x.nq;
    suffix_work_ += x.s->suffix_length * x.nq;
  }
  tasks_per_head_ = task;
  task_sess_.resize(static_cast<size_t>(tasks_per_head_ - pc_));
  for (size_t x = 0; x < ss_.size(); ++x)
    for (int64_t t = 0; t < ss_[x].sc; ++t)
      task_sess_[static_cast<size_t>(ss_[x].first_task - pc_ + t)] = static_cast<int32_t>(x);
  q_sess_.resize(static_cast<size_t>(nq_total_));
  for (size_t x = 0; x < ss_.size(); ++x)
    for (int j = 0; j < ss_[x].nq; ++j)
      q_sess_[static_cast<size_t>(ss_[x].qoff + j)] = static_cast<int32_t>(x);
}

// Queries per KV head, stacked j = qoff + row * G + group: suffix copy (softmax scale) and
// one prefix copy per segment (softmax scale x the segment's key scale for int8 keys).
void CpuAttentionRun::ScaleQueries() {
  const int nqt = static_cast<int>(nq_total_);
  q_floats_ = static_cast<size_t>(kv_heads_) * nqt * hd_;
  qs_.resize(q_floats_);
  qp_.resize(q_floats_ * seg_.size());
  lim_suffix_.resize(nqt);
  lim_prefix_.assign(nqt, P_);
  // Key scales per segment and KV head, element d at [(s * kv_heads + kvh) * hd + d].
  std::vector<float>& ks = b_.key_scales;
  ks.resize(seg_.size() * kv_heads_ * hd_);
  for (size_t s = 0; s < seg_.size(); ++s)
    for (int kvh = 0; kvh < kv_heads_; ++kvh)
      for (int d = 0; d < hd_; ++d)
        ks[(s * kv_heads_ + kvh) * hd_ + d] =
            KeyScaleOf(*seg_[s].view, *seg_[s].layer, k8_, kvh, hd_, d);
  for (const AttnSession& x : ss_) {
    const AttentionSession& a = *x.s;
    for (int64_t i = 0; i < a.n; ++i)
      for (int g = 0; g < G_; ++g) lim_suffix_[x.qoff + i * G_ + g] = a.suffix_length - a.n + i + 1;
    for (int kvh = 0; kvh < kv_heads_; ++kvh) {
      for (int64_t i = 0; i < a.n; ++i) {
        for (int g = 0; g < G_; ++g) {
          const float* src = a.q + (i * heads_ + kvh * G_ + g) * hd_;
          const int64_t j = x.qoff + i * G_ + g;
          float* ds = qs_.data() + (static_cast<int64_t>(kvh) * nqt + j) * hd_;
          for (int d = 0; d < hd_; ++d) ds[d] = src[d] * softmax_scale_;
          for (size_t s = 0; s < seg_.size(); ++s) {
            float* dp = qp_.data() + s * q_floats_ + (static_cast<int64_t>(kvh) * nqt + j) * hd_;
            const float* k = ks.data() + (s * kv_heads_ + kvh) * hd_;
            for (int d = 0; d < hd_; ++d) dp[d] = src[d] * softmax_scale_ * k[d];
          }
        }
      }
    }
  }
}

void CpuAttentionRun::Prepare() {
  ScaleQueries();
  if (int_scores_) {
    const int64_t rows = static_cast<int64_t>(q_floats_ / hd_ * seg_.size());
    const int64_t rb = attn::kQueryCodeLevels * attn::QueryCodeRowBytes(hd_);
    qcodes_.resize(static_cast<size_t>(rows * rb));
    qcode_scale_.resize(static_cast<size_t>(rows));
#ifdef POLYKV_HAVE_AMX_KERNELS  // int_scores_ needs AmxInt8Supported(): never set otherwise
    for (int64_t r = 0; r < rows; ++r)
      attn::QuantizeQueryCodesAvx512(qp_.data() + r * hd_, hd_, qcodes_.data() + r * rb,
                                     qcode_scale_.data() + r);
#endif
  }
  prefix_states_ = kv_heads_ * pc_ * nq_total_;
  states_.resize(
      static_cast<size_t>((prefix_states_ + kv_heads_ * suffix_states_) * (hd_ + kStateScalars)));
  if (k8_) {
    signs_.resize(hd_);
    for (int i = 0; i < hd_; ++i) signs_[i] = math::RotationSign(pv_->config.rotation_seed, i);
    block_ = math::HadamardBlock(hd_);
    unrot_scale_ = 1.0f / std::sqrt(static_cast<float>(hd_) * static_cast<float>(block_));
  }
}

// Prefix chunk `task` of its segment, for every session's queries.
void CpuAttentionRun::PrefixChunk(int64_t kvh, int64_t task, attn::ChunkArgs& c) const {
  const size_t s = SegmentOf(task);
  const AttnSegment& g = seg_[s];
  const PrefixLayer* pl = g.layer;
  const int64_t Ps = g.tokens;
  const int hd = hd_;
  c.q = qp_.data() + s * q_floats_ + kvh * nq_total_ * hd;
  if (int_scores_) {
    const int64_t row = static_cast<int64_t>(s * q_floats_ / hd) + kvh * nq_total_;
    c.q_codes = qcodes_.data() + row * attn::kQueryCodeLevels * attn::QueryCodeRowBytes(hd);
    c.q_code_scale = qcode_scale_.data() + row;
  }
  c.limit = lim_prefix_.data();
  c.transposed = static_cast<int32_t>(tq_);
  c.t0 = (task - g.first_task) * C;
  c.t1 = std::min(Ps, c.t0 + C);
  if (!k8_) {
    const int kind = RawKind(g.view->raw_dtype);
    const int64_t es = static_cast<int64_t>(DTypeSize(g.view->raw_dtype));
    c.key_kind = kind;
    c.value_kind = kind;  // same numbering for raw kinds
    c.k = static_cast<const uint8_t*>(pl->k) + kvh * Ps * hd * es;
    c.v = static_cast<const uint8_t*>(pl->v) + kvh * Ps * hd * es;
    return;
  }
  // The chunk's pointers start at its first token (t0 = 0 below): packed keys and f16
  // norms of the chunk are widened into per-thread scratch first.
  const int64_t t0 = c.t0, cnt = c.t1 - c.t0;
  c.key_kind = attn::kKeyI8;
  if (g.packed_keys && c.q_codes != nullptr && g.value_bits >= attn::kSimdValueBitsMin &&
      g.value_bits <= attn::kSimdValueBitsMax) {
    // Integer scores on tiles read the packed codes as they lie (ChunkArgs::key_bits).
    c.k = static_cast<const uint8_t*>(pl->k) + (kvh * Ps + t0) * g.k_bytes;
    c.key_bits = g.view->config.key_bits;
    c.k_bytes = g.k_bytes;
  } else if (g.packed_keys) {
    std::vector<int8_t>& kq = ThreadKeyScratch();
    if (kq.size() < static_cast<size_t>(cnt * hd)) kq.resize(static_cast<size_t>(cnt * hd));
    UnpackKeyVectors(static_cast<const uint8_t*>(pl->k) + (kvh * Ps + t0) * g.k_bytes, cnt, hd,
                     g.view->config.key_bits, kq.data());
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
}

// Suffix chunk `task` of session x.
void CpuAttentionRun::SuffixChunk(int64_t kvh, const AttnSession& x, int64_t task,
                                  attn::ChunkArgs& c) const {
  const AttentionSession& a = *x.s;
  const int64_t chunk_index = task - x.first_task;
  c.q = qs_.data() + (kvh * nq_total_ + x.qoff) * hd_;
  c.limit = lim_suffix_.data() + x.qoff;
  c.t0 = chunk_index * C;
  c.t1 = std::min(a.suffix_length, c.t0 + C);
  c.key_kind = attn::kKeyF32;
  c.value_kind = attn::kValF32;
  c.k = a.k_suffix + kvh * a.suffix_capacity * hd_;
  c.v = a.v_suffix + kvh * a.suffix_capacity * hd_;
}

void CpuAttentionRun::RunTask(int64_t flat) {
  const int64_t kvh = flat / tasks_per_head_, task = flat % tasks_per_head_;
  const int hd = hd_;
  attn::ChunkArgs c;
  c.hd = hd;
  const AttnSession* x = task < pc_ ? nullptr : &ss_[static_cast<size_t>(task_sess_[task - pc_])];
  c.nq = x == nullptr ? static_cast<int>(nq_total_) : x->nq;
  // m, l and o of the chunk's queries (per-thread buffers: a step runs thousands of tasks).
  std::vector<float>& outs = ThreadChunkOutputs();
  if (outs.size() < static_cast<size_t>(c.nq) * (hd + 2))
    outs.resize(static_cast<size_t>(c.nq) * (hd + 2));
  c.m = outs.data();
  c.l = c.m + c.nq;
  c.o = c.l + c.nq;
  if (x == nullptr)
    PrefixChunk(kvh, task, c);
  else
    SuffixChunk(kvh, *x, task, c);
  std::vector<float>& scratch = ThreadScratch();
  const size_t need =
      static_cast<size_t>((c.t1 - c.t0) * (3 * hd + c.nq) + 16 * hd +
                          (c.q_codes != nullptr ? attn::AmxKeyTileFloats(c.t1 - c.t0, hd) : 0));
  if (scratch.size() < need) scratch.resize(need);
  c.scratch = scratch.data();
  chunk_(c);
  for (int j = 0; j < c.nq; ++j) {
    float* st =
        x == nullptr ? PrefixState(kvh, task, j) : SuffixState(kvh, *x, task - x->first_task, j);
    st[0] = c.m[j];
    st[1] = c.l[j];
    std::copy(c.o + static_cast<int64_t>(j) * hd, c.o + static_cast<int64_t>(j + 1) * hd, st + 2);
  }
}

// The log-sum-exp merge of one output vector.
void CpuAttentionRun::Merge(int64_t flat) {
  const int hd = hd_;
  const int64_t kvh = flat / nq_total_, j = flat % nq_total_;
  const AttnSession& x = ss_[static_cast<size_t>(q_sess_[j])];
  const int64_t jl = j - x.qoff;
  std::vector<float>& merged = ThreadChunkOutputs();
  if (merged.size() < static_cast<size_t>(hd)) merged.resize(static_cast<size_t>(hd));
  float* acc = merged.data();
  std::fill(acc, acc + hd, 0.0f);
  AttentionState s{-std::numeric_limits<float>::infinity(), 0.0f, acc};
  for (int64_t t = 0; t < pc_; ++t) {
    float* st = PrefixState(kvh, t, j);
    MergeAttentionState(s, AttentionState{st[0], st[1], st + 2}, hd);
  }
  if (k8_ && s.l > 0) {  // back from the rotated code domain, once per output vector
    math::BlockFwht(acc, hd, block_);
    for (int i = 0; i < hd; ++i) acc[i] = acc[i] * signs_[i] * unrot_scale_;
  }
  for (int64_t t = 0; t < x.sc; ++t) {
    float* st = SuffixState(kvh, x, t, jl);
    MergeAttentionState(s, AttentionState{st[0], st[1], st + 2}, hd);
  }
  const int64_t i = jl / G_, g = jl % G_;
  float* dst = x.s->out + (i * heads_ + kvh * G_ + g) * hd;
  for (int d = 0; d < hd; ++d) dst[d] = acc[d];
}

// The CPU path for sessions with n >= 1 (already checked) over the checked segments `segs`:
// plan, chunk tasks on the threads, then the merges on the threads.
Status CpuAttention(const std::vector<const PrefixView*>& segs, int32_t layer, int32_t heads,
                    int32_t kv_heads, int32_t hd, absl::Span<const AttentionSession> sessions,
                    const AttentionOptions& opt) {
  POLYKV_ASSIGN_OR_RETURN(const attn::ChunkFn chunk, ChunkForOptions(opt));
  POLYKV_ASSIGN_OR_RETURN(const bool int_scores, IntScoresForOptions(opt));
  CpuAttentionRun run(layer, heads, kv_heads, hd, chunk, int_scores);
  POLYKV_RETURN_IF_ERROR(run.PlanSegments(segs));
  run.StackSessions(sessions);
  run.Prepare();
  const int threads = std::max(1, opt.threads > 0 ? opt.threads : ComputeThreads());
  if (threads <= 1 || run.Tasks() < 2 || run.Work() < 4096) {
    for (int64_t t = 0; t < run.Tasks(); ++t) run.RunTask(t);
    for (int64_t f = 0; f < run.Merges(); ++f) run.Merge(f);
    return absl::OkStatus();
  }
  internal::RunTasks(run.Tasks(), threads, [&run](int64_t t) { run.RunTask(t); });
  internal::RunTasks(run.Merges(), threads, [&run](int64_t f) { run.Merge(f); });
  return absl::OkStatus();
}

#if defined(POLYKV_HAVE_CUDA)
// One CUDA launch per checked segment (one without a prefix), `base` copied into each, the
// segment's prefix fields filled in.
StatusOr<std::vector<cuda::AttentionLaunch>> SegmentLaunches(
    const std::vector<const PrefixView*>& segs, int32_t layer, const cuda::AttentionLaunch& base) {
  if (segs.size() > static_cast<size_t>(attn_geometry::kMaxSegments))
    return absl::InvalidArgumentError(absl::StrCat("attention on CUDA: ", segs.size(),
                                                   " prefix segments; at most ",
                                                   attn_geometry::kMaxSegments));
  std::vector<cuda::AttentionLaunch> out(std::max<size_t>(segs.size(), 1), base);
  for (size_t s = 0; s < segs.size(); ++s) {
    const PrefixView* pv = segs[s];
    cuda::AttentionLaunch& l = out[s];
    const PrefixLayer& pl = pv->layers[layer];
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
                              internal::GetValueCodebook(pv->ValueBitsOf(layer)));
      l.bits = cb.bits;
      for (int i = 0; i < (1 << cb.bits); ++i) l.levels[i] = cb.levels[i];
    }
  }
  return out;
}

// The suffix, query and output fields of a launch (the single call's, or a slot launch's
// slab with its length bound).
cuda::AttentionLaunch SuffixLaunch(const float* k, const float* v, int64_t capacity, int64_t length,
                                   int64_t n, int32_t heads, int32_t kv_heads, int32_t hd,
                                   const float* q, float* out) {
  cuda::AttentionLaunch l;
  l.k_suffix = k;
  l.v_suffix = v;
  l.suffix_capacity = capacity;
  l.suffix_length = length;
  l.n = n;
  l.heads = heads;
  l.kv_heads = kv_heads;
  l.head_dim = hd;
  l.q = q;
  l.out = out;
  return l;
}

// `base` over every segment, on opt.stream; errors name `what`.
Status LaunchCuda(const std::vector<const PrefixView*>& segs, int32_t layer,
                  const cuda::AttentionLaunch& base, const AttentionOptions& opt,
                  const char* what) {
  POLYKV_ASSIGN_OR_RETURN(std::vector<cuda::AttentionLaunch> launches,
                          SegmentLaunches(segs, layer, base));
  return CudaStatus(cuda::InvokeAttention(launches.data(), static_cast<int>(launches.size()),
                                          static_cast<cudaStream_t>(opt.stream)),
                    what);
}
#endif

constexpr char kNoCuda[] = "attention on Device::kCuda requested but PolyKV was built without CUDA";

}  // namespace

Status AttentionForward(const AttentionArgs& a, const AttentionOptions& opt) {
  const int hd = a.head_dim;
  if (a.n < 1 || a.heads < 1 || a.kv_heads < 1 || a.heads % a.kv_heads != 0 || hd < 1 || hd > 512)
    return absl::InvalidArgumentError(absl::StrCat("attention: n ", a.n, ", heads ", a.heads,
                                                   ", kv_heads ", a.kv_heads, ", head_dim ", hd));
  AttentionSession session;
  CopySessionFields(a, session);
  POLYKV_RETURN_IF_ERROR(CheckSession(session, "attention"));
  std::vector<const PrefixView*> segs;
  POLYKV_RETURN_IF_ERROR(PrefixSegments(a.prefix, a.prefix_tail, a.layer, a.kv_heads, hd, &segs));
  if (a.suffix_length_device != nullptr && opt.device != Device::kCuda)
    return absl::InvalidArgumentError(
        "attention: suffix_length_device is a CUDA launch's (device memory); the CPU takes "
        "suffix_length");
  if (opt.device == Device::kCuda) {
    if (a.n * (a.heads / a.kv_heads) > 65535)
      return absl::InvalidArgumentError(absl::StrCat(
          "attention on CUDA: ", a.n, " rows x ", a.heads / a.kv_heads,
          " query heads per KV head > 65535 (the grid's y limit): feed fewer rows per call"));
#if defined(POLYKV_HAVE_CUDA)
    cuda::AttentionLaunch l =
        SuffixLaunch(a.k_suffix, a.v_suffix, a.suffix_capacity, a.suffix_length, a.n, a.heads,
                     a.kv_heads, hd, a.q, a.out);
    l.suffix_length_dev = a.suffix_length_device;
    return LaunchCuda(segs, a.layer, l, opt, "attention kernel");
#else
    return absl::UnimplementedError(kNoCuda);
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
      one.heads = a.heads;
      one.kv_heads = a.kv_heads;
      one.head_dim = a.head_dim;
      CopySessionFields(s, one);
      POLYKV_RETURN_IF_ERROR(AttentionForward(one, opt));
    }
    return absl::OkStatus();
  }
  return CpuAttention(segs, a.layer, a.heads, a.kv_heads, a.head_dim, active, opt);
}

Status AttentionForwardSlots(const SlotAttentionArgs& a, const AttentionOptions& opt) {
  constexpr const char* kWhat = "attention slots";
  POLYKV_RETURN_IF_ERROR(CheckModelShape(a.heads, a.kv_heads, a.head_dim, kWhat));
  if (a.rows < 1 || a.rows > 65535 || a.slots < 1 || a.capacity < 1 || a.max_length < 1 ||
      a.max_length > a.capacity)
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": rows ", a.rows, " (1..65535), slots ", a.slots, ", capacity ",
                     a.capacity, ", max_length ", a.max_length, " (1..capacity)"));
  if (a.k_slab == nullptr || a.v_slab == nullptr || a.row_slot == nullptr ||
      a.row_length == nullptr || a.q == nullptr || a.out == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(kWhat, ": null pointer"));
  const int64_t slot_stride = int64_t{a.kv_heads} * a.capacity * a.head_dim;
  std::vector<const PrefixView*> segs;
  POLYKV_RETURN_IF_ERROR(
      PrefixSegments(a.prefix, a.prefix_tail, a.layer, a.kv_heads, a.head_dim, &segs));
  if (opt.device == Device::kCuda) {
#if defined(POLYKV_HAVE_CUDA)
    cuda::AttentionLaunch l = SuffixLaunch(a.k_slab, a.v_slab, a.capacity, a.max_length, 1, a.heads,
                                           a.kv_heads, a.head_dim, a.q, a.out);
    l.row_slot = a.row_slot;
    l.row_length = a.row_length;
    l.rows = a.rows;
    l.slots = a.slots;
    l.slot_stride = slot_stride;
    return LaunchCuda(segs, a.layer, l, opt, "attention kernel (slots)");
#else
    return absl::UnimplementedError(kNoCuda);
#endif
  }
  std::vector<AttentionSession> sessions(static_cast<size_t>(a.rows));
  const int64_t row_floats = int64_t{a.heads} * a.head_dim;
  for (int64_t r = 0; r < a.rows; ++r) {
    const int64_t slot = a.row_slot[r], len = a.row_length[r];
    if (slot < 0 || slot >= a.slots || len < 1 || len > a.max_length)
      return absl::OutOfRangeError(absl::StrCat(kWhat, ": row ", r, ": slot ", slot, " (of ",
                                                a.slots, ") or length ", len, " (1..", a.max_length,
                                                ") out of range"));
    AttentionSession& s = sessions[static_cast<size_t>(r)];
    s.k_suffix = a.k_slab + slot * slot_stride;
    s.v_suffix = a.v_slab + slot * slot_stride;
    s.suffix_capacity = a.capacity;
    s.suffix_length = len;
    s.n = 1;
    s.q = a.q + r * row_floats;
    s.out = a.out + r * row_floats;
  }
  BatchAttentionArgs b;
  b.prefix = a.prefix;
  b.prefix_tail = a.prefix_tail;
  b.layer = a.layer;
  b.heads = a.heads;
  b.kv_heads = a.kv_heads;
  b.head_dim = a.head_dim;
  b.sessions = sessions;
  return AttentionForwardBatch(b, opt);
}

}  // namespace polykv::kernels
