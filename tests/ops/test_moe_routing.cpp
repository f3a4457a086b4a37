// moe_routing_build (the kernel of the routing sort): the stable counting sort of routed copies by
// expert, against std::stable_sort and the scalar reference (ops/ref/moe_routing.h) for 1 and 2
// threads, with empty experts, repeated experts within a token (routing profiles), the degenerate
// sizes, and the assertion on out-of-range expert ids.
// n tokens, k slots, E experts, m = n * k copies.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include <omp.h>

#include "backend/cpu/kernels/ops.h"
#include "core/error.h"
#include "core/rng.h"
#include "op_test.h"
#include "ops/moe_routing.h"
#include "ops/ref/moe_routing.h"

namespace {

struct Built {
  std::vector<int32_t> rows, slot_pos;
  std::vector<int64_t> offsets;
};

Built build(const std::vector<int32_t>& idx, int64_t n, int64_t k, int64_t E) {
  // Poisoned outputs: every entry must be written.
  Built b{std::vector<int32_t>(n * k, -7), std::vector<int32_t>(n * k, -7), std::vector<int64_t>(E + 1, -7)};
  fp::ops::cpu::moe_routing_build(idx.data(), n, k, E, b.rows.data(), b.slot_pos.data(), b.offsets.data());
  return b;
}

// Against an independent construction: copies c = t * k + j, stably sorted by expert.
void expect_matches_stable_sort(const std::vector<int32_t>& idx, int64_t n, int64_t k, int64_t E) {
  SCOPED_TRACE(testing::Message() << "n=" << n << " k=" << k << " E=" << E);
  const Built b = build(idx, n, k, E);
  std::vector<int32_t> copies(n * k);
  std::iota(copies.begin(), copies.end(), 0);
  std::stable_sort(copies.begin(), copies.end(), [&](int32_t a, int32_t c) { return idx[a] < idx[c]; });
  for (int64_t i = 0; i < n * k; ++i) {
    EXPECT_EQ(b.rows[i], copies[i] / k) << "rows[" << i << "]";
    EXPECT_EQ(b.slot_pos[copies[i]], i) << "slot_pos of token " << copies[i] / k << " slot " << copies[i] % k;
  }
  ASSERT_EQ(b.offsets[0], 0);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t count = std::count(idx.begin(), idx.end(), static_cast<int32_t>(e));
    EXPECT_EQ(b.offsets[e + 1] - b.offsets[e], count) << "expert " << e;
    // Each row in expert e's range holds a copy routed to e (found through slot_pos, the inverse).
    for (int64_t i = b.offsets[e]; i < b.offsets[e + 1]; ++i) {
      const int64_t t = b.rows[i];
      int64_t hits = 0;
      for (int64_t j = 0; j < k; ++j)
        if (b.slot_pos[t * k + j] == i) {
          ++hits;
          EXPECT_EQ(idx[t * k + j], e) << "row " << i << " (token " << t << " slot " << j << ") in expert " << e;
        }
      EXPECT_EQ(hits, 1) << "row " << i << ": slot_pos is not the inverse of rows";
    }
  }
  EXPECT_EQ(b.offsets[E], n * k);
}

TEST(MoeRouting, MatchesStableSortWithEmptyExperts) {
  fp::Rng rng(31);
  for (int64_t E : {1, 2, 7, 8, 64})
    for (int64_t k : {1, 2, 4})
      for (int64_t n : {1, 5, 33, 200}) {
        // Distinct experts per token where E allows (like the router), skipping experts 0 and E/2 when
        // there are enough others, so the first and a middle expert receive nothing.
        std::vector<int32_t> pool;
        for (int32_t e = 0; e < E; ++e)
          if (E - 2 < k || (e != 0 && e != E / 2)) pool.push_back(e);
        std::vector<int32_t> idx(n * k);
        for (int64_t t = 0; t < n; ++t)
          for (int64_t j = 0; j < k; ++j) {
            if (static_cast<int64_t>(pool.size()) >= k) {
              const int64_t pick = j + static_cast<int64_t>(rng.below(pool.size() - j));
              std::swap(pool[j], pool[pick]);
              idx[t * k + j] = pool[j];
            } else {
              idx[t * k + j] = pool[rng.below(pool.size())];
            }
          }
        expect_matches_stable_sort(idx, n, k, E);
      }
}

TEST(MoeRouting, RepeatedExpertsKeepSlotOrder) {
  // hot(1, 1) with k = 3: every slot of every token goes to expert 0 (E - 1 experts empty, the last
  // one included); rows must list token 0's three copies, then token 1's, ...
  const int64_t n = 4, k = 3, E = 5;
  const std::vector<int32_t> idx(n * k, 0);
  const Built b = build(idx, n, k, E);
  for (int64_t i = 0; i < n * k; ++i) {
    EXPECT_EQ(b.rows[i], i / k);
    EXPECT_EQ(b.slot_pos[i], i);
  }
  EXPECT_EQ(b.offsets, (std::vector<int64_t>{0, 12, 12, 12, 12, 12}));
  // Mixed repeats: token 0 -> {2, 2, 0}, token 1 -> {0, 2, 2}.
  const std::vector<int32_t> idx2 = {2, 2, 0, 0, 2, 2};
  const Built c = build(idx2, 2, 3, 3);
  EXPECT_EQ(c.rows, (std::vector<int32_t>{0, 1, 0, 0, 1, 1}));
  EXPECT_EQ(c.slot_pos, (std::vector<int32_t>{2, 3, 0, 1, 4, 5}));
  EXPECT_EQ(c.offsets, (std::vector<int64_t>{0, 2, 2, 6}));
  expect_matches_stable_sort(idx2, 2, 3, 3);
}

// The kernel against the scalar reference, byte for byte, for 1 and 2 threads, on random choices
// (repeats allowed, so slots of one token may share an expert) at sizes around the SIMD widths.
TEST(MoeRouting, KernelMatchesRefForOneAndTwoThreads) {
  fp::Rng rng(32);
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    for (int64_t E : {1, 3, 8, 17})
      for (int64_t k : {1, 2, 8})
        for (int64_t n : {1, 7, 8, 9, 63, 257}) {
          SCOPED_TRACE(testing::Message() << "threads=" << threads << " n=" << n << " k=" << k << " E=" << E);
          const std::vector<int32_t> idx = fp::op_test::random_ids(n * k, E, rng);
          Built ref{std::vector<int32_t>(n * k, -7), std::vector<int32_t>(n * k, -7), std::vector<int64_t>(E + 1, -7)};
          fp::ops::ref::moe_routing_build(idx.data(), n, k, E, ref.rows.data(), ref.slot_pos.data(), ref.offsets.data());
          const Built got = build(idx, n, k, E);
          EXPECT_EQ(got.rows, ref.rows);
          EXPECT_EQ(got.slot_pos, ref.slot_pos);
          EXPECT_EQ(got.offsets, ref.offsets);
        }
  }
  omp_set_num_threads(saved);
}

TEST(MoeRouting, NoCopies) {
  for (auto [n, k] : {std::pair<int64_t, int64_t>{0, 2}, {3, 0}}) {
    const Built b = build(std::vector<int32_t>(1, 0), n, k, 4);  // one dummy element: data() non-null
    EXPECT_EQ(b.offsets, (std::vector<int64_t>{0, 0, 0, 0, 0})) << "n=" << n << " k=" << k;
  }
}

TEST(MoeRouting, OutOfRangeExpertAsserts) {
  const int64_t n = 3, k = 2, E = 4;
  for (int32_t bad : {-1, 4, 1000, -2147483647 - 1}) {
    std::vector<int32_t> idx = {0, 1, 2, 3, 1, 0};
    idx[3] = bad;
    std::vector<int32_t> rows(n * k), slot(n * k);
    std::vector<int64_t> off(E + 1);
    EXPECT_THROW(fp::ops::cpu::moe_routing_build(idx.data(), n, k, E, rows.data(), slot.data(), off.data()),
                 fp::InternalError)
        << "expert " << bad;
  }
}

}  // namespace
