// The CUDA split attention's work layout (kernels/cuda/attention_kernels.cu), as host-and-
// device functions so that the CPU tests check it (attention_geometry_test.cc): which chunk
// each thread block of each launch computes and where its partial state lies, for every
// prefix segment (a pool tree: one launch per segment, the last one also running the suffix
// chunks), every session of a slot launch (grid z) and every query (grid y).
//
// Per KV head the tasks are the chunks of kCudaChunk positions of segment 0, segment 1, ...,
// then of the suffix (tasks_per_head = pc + sc). States: f32 [sessions][kv_heads]
// [tasks_per_head][nq][head_dim + 2]; the merge reads a head's tasks in that order.
#pragma once

#include <cstdint>

#include "polykv/kernels/dtype_convert.h"  // POLYKV_HD

namespace polykv::kernels::attn_geometry {

/// Positions per CUDA chunk (smaller than the CPU's kAttentionChunk so that one decode query
/// still spreads over many blocks).
inline constexpr int kCudaChunk = 64;
/// Most prefix segments one call takes (a pool tree's depth; the daemon's limit is 64).
inline constexpr int kMaxSegments = 64;

/// pc: prefix chunks of every segment, sc: suffix chunks (of the length bound), per KV head;
/// g: query heads per KV head, nq: queries per KV head and session (g * rows). A launch runs
/// tasks [first, first + tasks) of each head; its first seg_pc tasks are chunks of its own
/// segment, the rest suffix chunks.
struct Geometry {
  int64_t pc = 0, sc = 0, tasks_per_head = 0;
  int64_t first = 0, tasks = 0, seg_pc = 0;
  int g = 1, nq = 0;
};

/// Chunks of `tokens` positions.
POLYKV_HD inline int64_t Chunks(int64_t tokens) { return (tokens + kCudaChunk - 1) / kCudaChunk; }

/// The totals of a call: seg_tokens[0 .. segments) prefix positions per segment (segments
/// >= 1; one segment of 0 tokens: no prefix), the suffix length bound, GQA group g and query
/// rows n per session.
inline Geometry Plan(const int64_t* seg_tokens, int segments, int64_t suffix_bound, int g,
                     int64_t n) {
  Geometry geo;
  geo.g = g;
  geo.nq = static_cast<int>(g * n);
  for (int s = 0; s < segments; ++s) geo.pc += Chunks(seg_tokens[s]);
  geo.sc = Chunks(suffix_bound);
  geo.tasks_per_head = geo.pc + geo.sc;
  return geo;
}

/// The launch of segment s (0-based; the last one takes the suffix chunks too): `geo` with
/// first, tasks and seg_pc set. A launch of 0 tasks is skipped.
inline Geometry ForSegment(Geometry geo, const int64_t* seg_tokens, int segments, int s) {
  geo.first = 0;
  for (int i = 0; i < s; ++i) geo.first += Chunks(seg_tokens[i]);
  geo.seg_pc = Chunks(seg_tokens[s]);
  geo.tasks = geo.seg_pc + (s == segments - 1 ? geo.sc : 0);
  return geo;
}

/// What thread block x = `flat` of a launch computes: KV head h, task (its index among the
/// head's tasks), whether it is a prefix chunk, and its first position (in its segment, or in
/// the suffix).
struct Task {
  int64_t h = 0, task = 0, t0 = 0;
  bool prefix = false;
};
POLYKV_HD inline Task TaskOf(const Geometry& geo, int64_t flat) {
  Task t;
  t.h = flat / geo.tasks;
  const int64_t local = flat % geo.tasks;
  t.task = geo.first + local;
  t.prefix = local < geo.seg_pc;
  t.t0 = (t.prefix ? local : t.task - geo.pc) * kCudaChunk;
  return t;
}

/// Offset in floats of the partial state of (session, KV head h, task, query j), each state
/// `state_floats` (head_dim + 2) floats.
POLYKV_HD inline int64_t StateOffset(const Geometry& geo, int kv_heads, int64_t session, int64_t h,
                                     int64_t task, int64_t j, int state_floats) {
  return (((session * kv_heads + h) * geo.tasks_per_head + task) * geo.nq + j) * state_floats;
}

/// Bytes of one session's partial states: f32 [kv_heads][tasks_per_head][nq][head_dim + 2].
inline int64_t StateBytes(const Geometry& geo, int kv_heads, int head_dim) {
  return int64_t{4} * kv_heads * geo.tasks_per_head * geo.nq * (head_dim + 2);
}

/// Query rows [r0, r0 + rows) of a call of n rows (row i attends to the suffix positions below
/// suffix_length - n + i + 1), run as a call of their own: that call's suffix_length. The
/// rows of a call whose states would not fit one scratch allocation run in such groups.
struct RowGroup {
  int64_t r0 = 0, rows = 0, suffix_length = 0;
};
/// Group `index` of rows_per_group (>= 1) rows each (the last one shorter).
inline RowGroup RowGroupOf(int64_t n, int64_t suffix_length, int64_t rows_per_group,
                           int64_t index) {
  RowGroup rg;
  rg.r0 = index * rows_per_group;
  rg.rows = n - rg.r0 < rows_per_group ? n - rg.r0 : rows_per_group;
  rg.suffix_length = suffix_length - n + rg.r0 + rg.rows;
  return rg;
}

}  // namespace polykv::kernels::attn_geometry
