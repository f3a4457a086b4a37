// The closed form of a routing profile (ProfileTokens, routing_profile_offsets: what meta counts with)
// against the arrays the cpu backend builds: routing_profile_assign's choice, sorted into expert order
// by ops::moe_routing_build, every row's token read off directly. Brute force over every range
// boundary would be slow, so the ranges are random but include the ends and the chunk boundaries.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "backend/cpu/kernels/ops.h"
#include "core/error.h"
#include "model/routing.h"
#include "ops/moe_routing.h"

using namespace fp;

namespace {

struct Routed {
  std::vector<int64_t> offsets;  // (E + 1)
  std::vector<int32_t> rows;     // (m) token of each row in expert order
};

Routed route(const RoutingProfile& p, int64_t n, int64_t k, int64_t E) {
  std::vector<int32_t> topk(static_cast<size_t>(n * k)), slot(static_cast<size_t>(n * k));
  routing_profile_assign(p, n, k, E, topk.data());
  Routed r;
  r.offsets.assign(static_cast<size_t>(E + 1), 0);
  r.rows.resize(static_cast<size_t>(n * k));
  ops::cpu::moe_routing_build(topk.data(), n, k, E, r.rows.data(), slot.data(), r.offsets.data());
  return r;
}

void check_profile(const char* spec, int64_t n, int64_t k, int64_t E) {
  const RoutingProfile p = routing_profile_parse(spec);
  const Routed r = route(p, n, k, E);
  std::vector<int64_t> offsets(static_cast<size_t>(E + 1));
  routing_profile_offsets(p, n, k, E, offsets.data());
  ASSERT_EQ(offsets, r.offsets) << spec << " n=" << n << " k=" << k << " E=" << E;

  std::mt19937_64 rng(static_cast<uint64_t>(n * 131 + k * 7 + E));
  std::uniform_int_distribution<int64_t> tok(0, n);
  for (int64_t e = 0; e < E; ++e) {
    const ProfileTokens t(p, n, k, E, e);
    const int32_t* rows = r.rows.data() + r.offsets[e];
    const int64_t c = r.offsets[e + 1] - r.offsets[e];
    for (int64_t q = 0; q < c; ++q) ASSERT_EQ(t.nth(q), rows[q]) << spec << " expert " << e << " row " << q;
    for (int trial = 0; trial < 40; ++trial) {
      int64_t lo = tok(rng), hi = tok(rng);
      if (trial == 0) lo = 0, hi = n;
      if (lo > hi) std::swap(lo, hi);
      for (int64_t K : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{7}, int64_t{16}, E, E + 1}) {
        std::vector<int64_t> by_class(static_cast<size_t>(K), 0);
        t.count_classes(lo, hi, K, by_class.data());
        for (int64_t ch = 0; ch < K; ++ch) {
          int64_t want = 0;
          for (int64_t q = 0; q < c; ++q) want += rows[q] >= lo && rows[q] < hi && rows[q] % K == ch;
          ASSERT_EQ(t.count_mod(lo, hi, K, ch), want)
              << spec << " expert " << e << " tokens [" << lo << ", " << hi << ") class " << ch << " mod " << K;
          ASSERT_EQ(by_class[ch], want) << spec << " expert " << e << " count_classes, class " << ch << " mod " << K;
        }
      }
      int64_t want = 0;
      for (int64_t q = 0; q < c; ++q) want += rows[q] >= lo && rows[q] < hi;
      ASSERT_EQ(t.count(lo, hi), want) << spec << " expert " << e << " [" << lo << ", " << hi << ")";
    }
  }
}

}  // namespace

TEST(ProfileTokens, BalancedEqualsTheRoutedArrays) {
  check_profile("balanced", 1, 2, 8);
  check_profile("balanced", 97, 2, 8);
  check_profile("balanced", 300, 8, 12);
  check_profile("balanced", 64, 4, 4);  // k = E: every token to every expert
}

TEST(ProfileTokens, HotEqualsTheRoutedArrays) {
  check_profile("hot:0.95:2", 101, 2, 8);
  check_profile("hot:0.9:16", 257, 8, 64);
  check_profile("hot:1:2", 50, 2, 8);  // every token hot: the cold experts get none
  check_profile("hot:0:4", 77, 3, 10);
  check_profile("hot:0.5:3", 128, 3, 6);  // h = E - h = k
}

// Note [Hot routes per slot]: fewer hot experts than slots. The paper's "hot 0.5/4" at top-8: every
// token sends 4 routes to experts 0-3, so each of them gets every token and half of all routes are hot;
// the closed form equals the arrays, every token's experts are distinct, and too large an R is refused.
TEST(ProfileTokens, HotWithFewerHotExpertsThanSlots) {
  check_profile("hot:0.5:4", 96, 8, 32);
  check_profile("hot:0.3:2", 101, 5, 12);  // some tokens partly hot, the rest cold
  check_profile("hot:0.1:1", 64, 3, 7);
  const int64_t n = 96, k = 8, E = 32;
  const RoutingProfile p = routing_profile_parse("hot:0.5:4");
  std::vector<int32_t> topk(static_cast<size_t>(n * k));
  routing_profile_assign(p, n, k, E, topk.data());
  int64_t hot = 0;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int32_t> mine(topk.begin() + i * k, topk.begin() + (i + 1) * k);
    std::sort(mine.begin(), mine.end());
    EXPECT_EQ(std::adjacent_find(mine.begin(), mine.end()), mine.end()) << "token " << i << " repeats an expert";
    for (int32_t e : mine) hot += e < 4;
  }
  EXPECT_EQ(hot, n * k / 2);
  EXPECT_THROW(routing_profile_check(routing_profile_parse("hot:0.6:4"), k, E, "profile"), Error);
  EXPECT_THROW(routing_profile_check(routing_profile_parse("hot:0.5:30"), k, E, "profile"), Error);  // 2 cold experts
  EXPECT_NO_THROW(routing_profile_check(p, k, E, "profile"));
}
