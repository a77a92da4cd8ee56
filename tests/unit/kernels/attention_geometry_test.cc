// The CUDA split attention's work layout (kernels/src/attention_geometry.h), checked on the
// CPU by enumerating every thread block of every launch the CUDA path makes: each partial
// state of every (session, KV head, chunk, query) is written by exactly one block; each
// segment's chunks cover exactly its positions, the suffix chunks the length bound; and a
// head's tasks in index order are segment 0's chunks, segment 1's, ..., then the suffix's
// (the merge kernel's position order). Pool trees, slot launches and GQA shapes; the row
// groups of a call of many query rows over a long prefix.
#include "attention_geometry.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

namespace polykv::kernels::attn_geometry {
namespace {

struct Case {
  std::vector<int64_t> seg_tokens;  // {0}: no prefix
  int64_t suffix_bound;
  int g, kv_heads;
  int64_t rows, sessions;
};

void Check(const Case& c) {
  SCOPED_TRACE(::testing::Message()
               << "segments " << c.seg_tokens.size() << " first " << c.seg_tokens[0] << " suffix "
               << c.suffix_bound << " g " << c.g << " kv " << c.kv_heads << " rows " << c.rows
               << " sessions " << c.sessions);
  const int segments = static_cast<int>(c.seg_tokens.size());
  const Geometry g = Plan(c.seg_tokens.data(), segments, c.suffix_bound, c.g, c.rows);
  ASSERT_EQ(g.nq, c.g * c.rows);
  const int state_floats = 10;
  const int64_t total = c.sessions * c.kv_heads * g.tasks_per_head * g.nq;
  std::vector<int> writes(static_cast<size_t>(total), 0);
  // (session, head, task) -> (segment or -1 for the suffix, t0), from the blocks.
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::pair<int, int64_t>> what;
  for (int s = 0; s < segments; ++s) {
    const Geometry launch = ForSegment(g, c.seg_tokens.data(), segments, s);
    EXPECT_EQ(launch.tasks_per_head, g.tasks_per_head);
    for (int64_t z = 0; z < c.sessions; ++z)
      for (int64_t flat = 0; flat < c.kv_heads * launch.tasks; ++flat)
        for (int64_t j = 0; j < g.nq; ++j) {
          const Task t = TaskOf(launch, flat);
          ASSERT_LT(t.h, c.kv_heads);
          ASSERT_GE(t.task, 0);
          ASSERT_LT(t.task, g.tasks_per_head);
          const int64_t off = StateOffset(g, c.kv_heads, z, t.h, t.task, j, state_floats);
          ASSERT_EQ(off % state_floats, 0);
          ASSERT_GE(off, 0);
          ASSERT_LT(off / state_floats, total);
          ++writes[static_cast<size_t>(off / state_floats)];
          what[{z, t.h, t.task}] = {t.prefix ? s : -1, t.t0};
        }
  }
  for (int64_t i = 0; i < total; ++i) ASSERT_EQ(writes[static_cast<size_t>(i)], 1) << "state " << i;
  // Per (session, head): tasks in index order = each segment's chunks in order, then the
  // suffix's, every one starting where the previous chunk of its part ended.
  for (int64_t z = 0; z < c.sessions; ++z)
    for (int64_t h = 0; h < c.kv_heads; ++h) {
      int64_t task = 0;
      for (int s = 0; s < segments; ++s)
        for (int64_t t0 = 0; t0 < c.seg_tokens[static_cast<size_t>(s)]; t0 += kCudaChunk, ++task)
          ASSERT_EQ(what[std::make_tuple(z, h, task)], std::make_pair(s, t0)) << "task " << task;
      ASSERT_EQ(task, g.pc);
      for (int64_t t0 = 0; t0 < c.suffix_bound; t0 += kCudaChunk, ++task)
        ASSERT_EQ(what[std::make_tuple(z, h, task)], std::make_pair(-1, t0))
            << "suffix task " << task;
      ASSERT_EQ(task, g.tasks_per_head);
    }
}

TEST(AttentionGeometry, EveryStateWrittenOnceInPositionOrder) {
  const std::vector<Case> cases = {
      {{0}, 1, 3, 3, 1, 1},              // no prefix, one decode row
      {{1451}, 20, 3, 3, 1, 1},          // SmolLM2 demo pool, a decode step
      {{1451}, 30, 3, 3, 7, 1},          // a 7-row prompt
      {{64}, 64, 1, 8, 1, 1},            // chunk-aligned lengths, no GQA
      {{65}, 65, 4, 2, 2, 1},            // one past a chunk
      {{300, 70, 129}, 40, 3, 3, 1, 1},  // a pool tree: root, child, grandchild
      {{300, 70, 129}, 40, 3, 3, 7, 1},  // ... with prompt rows
      {{1, 1, 1, 1}, 1, 2, 1, 1, 1},     // tiny segments
      {{1451}, 64, 3, 3, 1, 16},         // a slot launch of 16 sessions
      {{300, 70}, 80, 3, 3, 1, 5},       // a slot launch over a pool tree
      {{0}, 300, 3, 3, 1, 4},            // slots without a prefix
  };
  for (const Case& c : cases) ASSERT_NO_FATAL_FAILURE(Check(c));
}

TEST(AttentionGeometry, SingleSegmentLaunchIsTheWholeHead) {
  // One segment: one launch covering every task of each head (what the kernels launched
  // before pool trees), its first task 0.
  const int64_t tokens[] = {1451};
  const Geometry g = Plan(tokens, 1, 21, 3, 1);
  const Geometry l = ForSegment(g, tokens, 1, 0);
  EXPECT_EQ(l.first, 0);
  EXPECT_EQ(l.tasks, g.tasks_per_head);
  EXPECT_EQ(g.pc, 23);
  EXPECT_EQ(g.sc, 1);
  EXPECT_EQ(Chunks(64), 1);
  EXPECT_EQ(Chunks(65), 2);
  EXPECT_EQ(Chunks(0), 0);
}

// A call of many query rows split into row groups (states over kMaxStateBytes): the groups
// cover rows 0..n-1 once, in order, and each row attends to the same suffix positions in its
// group's call as in the whole call (limit = suffix_length - n + row + 1); StateBytes is the
// states' layout size.
TEST(AttentionGeometry, RowGroupsCoverEveryRowWithItsOwnSuffixLimit) {
  for (auto [n, suffix_length, per_group] : {std::tuple<int64_t, int64_t, int64_t>{256, 256, 100},
                                             {256, 300, 256},
                                             {7, 7, 1},
                                             {256, 4096, 3},
                                             {5, 40, 2},
                                             {1, 1, 1}}) {
    SCOPED_TRACE(::testing::Message()
                 << n << " rows, suffix " << suffix_length << ", groups of " << per_group);
    std::vector<int> seen(static_cast<size_t>(n), 0);
    int64_t next = 0;
    for (int64_t i = 0; i * per_group < n; ++i) {
      const RowGroup rg = RowGroupOf(n, suffix_length, per_group, i);
      ASSERT_EQ(rg.r0, next);
      ASSERT_GE(rg.rows, 1);
      ASSERT_LE(rg.rows, per_group);
      ASSERT_GE(rg.suffix_length, rg.rows);  // what the launch's checks ask of a call
      for (int64_t j = 0; j < rg.rows; ++j) {
        ++seen[static_cast<size_t>(rg.r0 + j)];
        EXPECT_EQ(rg.suffix_length - rg.rows + j + 1, suffix_length - n + (rg.r0 + j) + 1);
      }
      next = rg.r0 + rg.rows;
    }
    EXPECT_EQ(next, n);
    for (int c : seen) EXPECT_EQ(c, 1);
  }
  const int64_t tokens[] = {1451};
  const Geometry g = Plan(tokens, 1, 21, 3, 4);  // 23 + 1 tasks, 12 queries
  EXPECT_EQ(StateBytes(g, 3, 64), int64_t{4} * 3 * 24 * 12 * 66);
}

}  // namespace
}  // namespace polykv::kernels::attn_geometry
