// Regex engine for pre-tokenizer patterns: a recursive-descent parser to an AST
// (bpe_regex_parse.cc), a compiler to a small backtracking program, and an explicit-stack
// matcher with a (state, position) memo so that patterns stay linear on long whitespace or
// letter runs.
#include "bpe_regex.h"

#include <algorithm>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "bpe_regex_internal.h"

namespace polykv::model::bpe {

Subject::Subject(const std::vector<uint32_t>& c) : cps(c) {
  gc.resize(cps.size());
  ws.resize(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) {
    gc[i] = unicode::GetGeneralCategory(cps[i]);
    ws[i] = unicode::IsWhitespace(cps[i]) ? 1 : 0;
  }
}

using regex_internal::AssertKind;
using regex_internal::CharClass;
using regex_internal::GcBit;
using regex_internal::kInf;
using regex_internal::kMaskWord;
using regex_internal::Node;
using regex_internal::NodeKind;
using regex_internal::RepMode;

namespace {

constexpr size_t kMaxProgram = 200000;

bool Nullable(const Node& n) {
  switch (n.kind) {
    case NodeKind::kEmpty:
    case NodeKind::kLook:
    case NodeKind::kAssert:
      return true;
    case NodeKind::kClass:
      return false;
    case NodeKind::kConcat:
      for (const auto& k : n.kids) {
        if (!Nullable(*k)) return false;
      }
      return true;
    case NodeKind::kAlt:
      for (const auto& k : n.kids) {
        if (Nullable(*k)) return true;
      }
      return false;
    case NodeKind::kRepeat:
      return n.min == 0 || Nullable(*n.kids[0]);
  }
  return true;
}

enum class Op : uint8_t { kChar, kRun, kSplit, kJmp, kAssert, kLook, kMatch };

struct Inst {
  Op op;
  RepMode mode = RepMode::kGreedy;
  AssertKind assert_kind = AssertKind::kBol;
  bool negative = false;
  int cls = -1;
  int x = 0, y = 0;  // kSplit: prefer x; kJmp: x; kLook: body at x, continue at y
  uint32_t min = 0, max = 0;
};

class Compiler {
 public:
  explicit Compiler(std::vector<Inst>* prog) : prog_(prog) {}

  Status Emit(const Node& n) {
    if (prog_->size() > kMaxProgram) {
      return absl::UnimplementedError("pre-tokenizer regex is too large once compiled");
    }
    switch (n.kind) {
      case NodeKind::kEmpty:
        return absl::OkStatus();
      case NodeKind::kClass:
        Add({Op::kChar, RepMode::kGreedy, AssertKind::kBol, false, n.cls});
        return absl::OkStatus();
      case NodeKind::kConcat:
        for (const auto& k : n.kids) POLYKV_RETURN_IF_ERROR(Emit(*k));
        return absl::OkStatus();
      case NodeKind::kAlt: {
        std::vector<int> jumps;
        for (size_t i = 0; i < n.kids.size(); ++i) {
          if (i + 1 < n.kids.size()) {
            const int split = Add({Op::kSplit});
            (*prog_)[split].x = split + 1;
            POLYKV_RETURN_IF_ERROR(Emit(*n.kids[i]));
            jumps.push_back(Add({Op::kJmp}));
            (*prog_)[split].y = Size();
          } else {
            POLYKV_RETURN_IF_ERROR(Emit(*n.kids[i]));
          }
        }
        for (int j : jumps) (*prog_)[j].x = Size();
        return absl::OkStatus();
      }
      case NodeKind::kAssert: {
        Inst in{Op::kAssert};
        in.assert_kind = n.assert_kind;
        Add(in);
        return absl::OkStatus();
      }
      case NodeKind::kLook: {
        const int look = Add({Op::kLook});
        (*prog_)[look].negative = n.negative;
        (*prog_)[look].x = Size();
        POLYKV_RETURN_IF_ERROR(Emit(*n.kids[0]));
        Add({Op::kMatch});
        (*prog_)[look].y = Size();
        return absl::OkStatus();
      }
      case NodeKind::kRepeat:
        return EmitRepeat(n);
    }
    return absl::OkStatus();
  }

 private:
  int Size() const { return static_cast<int>(prog_->size()); }
  int Add(Inst in) {
    prog_->push_back(in);
    return Size() - 1;
  }

  Status EmitRepeat(const Node& n) {
    const Node& body = *n.kids[0];
    if (body.kind == NodeKind::kClass) {
      Inst in{Op::kRun, n.mode, AssertKind::kBol, false, body.cls};
      in.min = n.min;
      in.max = n.max;
      Add(in);
      return absl::OkStatus();
    }
    if (n.mode == RepMode::kPossessive) {
      return absl::UnimplementedError("possessive quantifier on a group in a pre-tokenizer regex");
    }
    if (n.max == kInf && Nullable(body)) {
      return absl::UnimplementedError(
          "unbounded quantifier over a body that can match the empty string");
    }
    const bool lazy = n.mode == RepMode::kLazy;
    for (uint32_t i = 0; i < n.min; ++i) POLYKV_RETURN_IF_ERROR(Emit(body));
    if (n.max == kInf) {
      const int split = Add({Op::kSplit});
      POLYKV_RETURN_IF_ERROR(Emit(body));
      const int jmp = Add({Op::kJmp});
      (*prog_)[jmp].x = split;
      SetSplit(split, split + 1, Size(), lazy);
      return absl::OkStatus();
    }
    std::vector<int> splits;
    for (uint32_t i = n.min; i < n.max; ++i) {
      splits.push_back(Add({Op::kSplit}));
      POLYKV_RETURN_IF_ERROR(Emit(body));
      if (prog_->size() > kMaxProgram) {
        return absl::UnimplementedError("pre-tokenizer regex is too large once compiled");
      }
    }
    for (int s : splits) SetSplit(s, s + 1, Size(), lazy);
    return absl::OkStatus();
  }
  void SetSplit(int s, int body, int out, bool lazy) {
    (*prog_)[s].x = lazy ? out : body;
    (*prog_)[s].y = lazy ? body : out;
  }

  std::vector<Inst>* prog_;
};

}  // namespace

struct Regex::Impl {
  std::vector<CharClass> classes;
  std::vector<Inst> prog;

  struct Frame {
    int pc;
    uint32_t pos;
    uint32_t bound;  // kRunBack: lowest position; kRunFwd: highest
    uint8_t kind;    // 0 alt, 1 run back (greedy), 2 run forward (lazy)
  };

  struct Search {
    const Subject* s;
    size_t b, e;
    std::vector<uint64_t> memo;  // (pc, pos - b) visited, empty when disabled
    size_t row_words = 0;
    std::unordered_map<uint64_t, bool> look_cache;
    std::vector<Frame> stack;
    // Greedy or possessive unbounded runs (min >= 1) already started at run_from[pc] and
    // reaching run_end[pc] (top-level only). A later start inside that run has a subset of
    // its continuations, which have all failed or are being explored (greedy tries the
    // longest first), so it fails at once: without this a run re-scanned from every position
    // of a long whitespace run makes "\s+$" quadratic.
    std::vector<uint32_t> run_from, run_end;
  };

  bool IsWord(const Subject& s, size_t i) const { return (kMaskWord & GcBit(s.gc[i])) != 0; }

  bool Assert(const Search& sr, AssertKind k, size_t pos) const {
    const auto& cps = sr.s->cps;
    switch (k) {
      case AssertKind::kBol:
        return pos == sr.b || cps[pos - 1] == '\n';
      case AssertKind::kEol:
        return pos == sr.e || cps[pos] == '\n';
      case AssertKind::kBeginText:
        return pos == sr.b;
      case AssertKind::kEndText:
        return pos == sr.e;
      case AssertKind::kEndTextNl:
        return pos == sr.e || (pos + 1 == sr.e && cps[pos] == '\n');
      case AssertKind::kWordB:
      case AssertKind::kNotWordB: {
        const bool before = pos > sr.b && IsWord(*sr.s, pos - 1);
        const bool after = pos < sr.e && IsWord(*sr.s, pos);
        return (before != after) == (k == AssertKind::kWordB);
      }
    }
    return false;
  }

  bool ClassAt(const Subject& s, int cls, size_t pos) const {
    return classes[cls].Match(s.cps[pos], s.gc[pos], s.ws[pos] != 0);
  }
  bool ClassAt(const Search& sr, int cls, size_t pos) const { return ClassAt(*sr.s, cls, pos); }

  // Runs the program from (pc0, pos0) anchored; true with *end on a match. `memo`: use the
  // search memo (top-level only). `start_nonempty`: reject a match that ends at pos0.
  bool Run(Search& sr, int pc0, size_t pos0, bool memo, bool start_nonempty, size_t* end) const {
    std::vector<Frame> local;
    std::vector<Frame>& st = memo ? sr.stack : local;
    const size_t base = st.size();
    st.push_back({pc0, static_cast<uint32_t>(pos0), 0, 0});
    while (st.size() > base) {
      Frame f = st.back();
      st.pop_back();
      int pc = f.pc;
      size_t pos = f.pos;
      if (f.kind == 1) {
        if (f.pos > f.bound) st.push_back({f.pc, f.pos - 1, f.bound, 1});
      } else if (f.kind == 2) {
        if (f.pos < f.bound) st.push_back({f.pc, f.pos + 1, f.bound, 2});
      }
      while (true) {
        if (memo && !sr.memo.empty()) {
          const size_t bit = static_cast<size_t>(pc) * sr.row_words * 64 + (pos - sr.b);
          uint64_t& w = sr.memo[bit >> 6];
          const uint64_t m = uint64_t{1} << (bit & 63);
          if (w & m) break;
          w |= m;
        }
        const Inst& in = prog[pc];
        bool ok = true;
        switch (in.op) {
          case Op::kChar:
            if (pos < sr.e && ClassAt(sr, in.cls, pos)) {
              ++pc, ++pos;
            } else {
              ok = false;
            }
            break;
          case Op::kRun: {
            const bool prunable =
                memo && in.max == kInf && in.min >= 1 && in.mode != RepMode::kLazy;
            if (prunable && sr.run_from[pc] != kInf && sr.run_from[pc] < pos &&
                pos <= sr.run_end[pc]) {
              ok = false;
              break;
            }
            size_t k = 0;
            while (pos + k < sr.e && k < in.max && ClassAt(sr, in.cls, pos + k)) ++k;
            if (prunable) {
              sr.run_from[pc] = static_cast<uint32_t>(pos);
              sr.run_end[pc] = static_cast<uint32_t>(pos + k);
            }
            if (k < in.min) {
              ok = false;
              break;
            }
            if (in.mode == RepMode::kGreedy) {
              if (k > in.min) {
                st.push_back({pc + 1, static_cast<uint32_t>(pos + k - 1),
                              static_cast<uint32_t>(pos + in.min), 1});
              }
              pos += k;
            } else if (in.mode == RepMode::kLazy) {
              if (k > in.min) {
                st.push_back({pc + 1, static_cast<uint32_t>(pos + in.min + 1),
                              static_cast<uint32_t>(pos + k), 2});
              }
              pos += in.min;
            } else {
              pos += k;
            }
            ++pc;
            break;
          }
          case Op::kSplit:
            st.push_back({in.y, static_cast<uint32_t>(pos), 0, 0});
            pc = in.x;
            break;
          case Op::kJmp:
            pc = in.x;
            break;
          case Op::kAssert:
            if (Assert(sr, in.assert_kind, pos)) {
              ++pc;
            } else {
              ok = false;
            }
            break;
          case Op::kLook: {
            const uint64_t key = (static_cast<uint64_t>(pc) << 32) | pos;
            auto it = sr.look_cache.find(key);
            bool r;
            if (it != sr.look_cache.end()) {
              r = it->second;
            } else {
              size_t unused;
              r = Run(sr, in.x, pos, false, false, &unused);
              sr.look_cache.emplace(key, r);
            }
            if (r != in.negative) {
              pc = in.y;
            } else {
              ok = false;
            }
            break;
          }
          case Op::kMatch:
            if (start_nonempty && pos == pos0) {
              ok = false;
              break;
            }
            *end = pos;
            st.resize(base);
            return true;
        }
        if (!ok) break;
      }
    }
    return false;
  }
};

Regex::~Regex() = default;

StatusOr<std::shared_ptr<const Regex>> Regex::Compile(std::string_view pattern) {
  std::shared_ptr<Regex> r(new Regex());
  r->pattern_ = std::string(pattern);
  r->impl_ = std::make_unique<Impl>();
  POLYKV_ASSIGN_OR_RETURN(std::unique_ptr<Node> root,
                          regex_internal::ParsePattern(pattern, &r->impl_->classes));
  Compiler compiler(&r->impl_->prog);
  POLYKV_RETURN_IF_ERROR(compiler.Emit(*root));
  r->impl_->prog.push_back({Op::kMatch});
  return std::shared_ptr<const Regex>(std::move(r));
}

void Regex::FindAll(const Subject& s, size_t begin, size_t end,
                    std::vector<std::pair<size_t, size_t>>* out) const {
  // Fast path: the whole pattern is one class, once or as a greedy/possessive run with
  // min >= 1 (\p{N}, \p{N}+, \p{N}{1,3} ...): scan directly.
  const auto& prog = impl_->prog;
  if (prog.size() == 2 && prog[1].op == Op::kMatch &&
      (prog[0].op == Op::kChar ||
       (prog[0].op == Op::kRun && prog[0].min >= 1 && prog[0].mode != RepMode::kLazy))) {
    const Inst& in = prog[0];
    const uint32_t mn = in.op == Op::kChar ? 1 : in.min;
    const uint32_t mx = in.op == Op::kChar ? 1 : in.max;
    for (size_t pos = begin; pos < end;) {
      size_t k = 0;
      while (pos + k < end && k < mx && impl_->ClassAt(s, in.cls, pos + k)) ++k;
      if (k >= mn) {
        out->push_back({pos, pos + k});
        pos += k;
      } else {
        ++pos;  // too short a run here; a later start is shorter still until it ends
      }
    }
    return;
  }
  Impl::Search sr;
  sr.s = &s;
  sr.b = begin;
  sr.e = end;
  const size_t n = end - begin;
  const size_t bits = impl_->prog.size() * (n + 1);
  if (bits <= (size_t{1} << 28)) {  // at most 32 MiB of memo
    // Layout: pc-major rows of (n + 1) bits rounded up to whole words.
    sr.row_words = (n + 1 + 63) / 64;
    sr.memo.assign(impl_->prog.size() * sr.row_words, 0);
  }
  sr.run_from.assign(impl_->prog.size(), kInf);
  sr.run_end.assign(impl_->prog.size(), kInf);
  auto clear_column = [&](size_t pos) {
    std::fill(sr.run_from.begin(), sr.run_from.end(), kInf);
    if (sr.memo.empty()) return;
    const size_t col = pos - sr.b;
    for (size_t pc = 0; pc < impl_->prog.size(); ++pc) {
      const size_t bit = pc * sr.row_words * 64 + col;
      sr.memo[bit >> 6] &= ~(uint64_t{1} << (bit & 63));
    }
  };
  size_t pos = begin;
  bool nonempty = false;  // the previous match was empty and ended at pos
  while (pos <= end) {
    size_t m_end = 0;
    if (impl_->Run(sr, 0, pos, true, nonempty, &m_end)) {
      out->push_back({pos, m_end});
      // States on the successful path at m_end may be reached again by the next search.
      clear_column(m_end);
      nonempty = m_end == pos;
      pos = m_end;
      continue;
    }
    nonempty = false;
    ++pos;
  }
}

}  // namespace polykv::model::bpe
