// LLEP's assignment plan and its pieces, and PipelinedLLEP's chunking (sched/dispatch/llep_plan.h,
// chunk_plan.h): hand-worked plans (ties, empty experts, the forced remainder, the fallback below
// lambda), invariants on random loads (every copy planned exactly once, the same plan from the same
// loads), and the per-chunk receive bound under hot routing profiles, on the dispatch the engine runs
// (W ranks of pipelined_llep on meta through flatpeak plan's thread world).
// Legend: E experts, W ranks, k top-k, n tokens per rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <numeric>
#include <random>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "model/config.h"
#include "model/routing.h"
#include "plan/plan.h"
#include "train/run_config.h"
#include "sched/dispatch/chunk_plan.h"
#include "sched/dispatch/llep_plan.h"

namespace fp {

namespace {

// The intervals of expert e as (rank, start, end) triples, for readable expectations.
std::vector<std::array<int64_t, 3>> intervals_of(const LlepPlan& p, int64_t e) {
  std::vector<std::array<int64_t, 3>> out;
  for (int64_t i = p.interval_first[e]; i < p.interval_first[e + 1]; ++i)
    out.push_back({p.intervals[i].rank, p.intervals[i].start, p.intervals[i].end});
  return out;
}
using Iv = std::vector<std::array<int64_t, 3>>;

// Every expert's intervals tile [0, load[e]) in order; rank loads add up.
void expect_plan_consistent(const LlepPlan& p, const std::vector<int64_t>& load) {
  std::vector<int64_t> by_rank(static_cast<size_t>(p.W), 0);
  for (int64_t e = 0; e < p.E; ++e) {
    int64_t at = 0;
    for (int64_t i = p.interval_first[e]; i < p.interval_first[e + 1]; ++i) {
      const LlepInterval& iv = p.intervals[i];
      ASSERT_EQ(iv.start, at) << "expert " << e << " interval " << i;
      ASSERT_LT(iv.start, iv.end) << "expert " << e << " has an empty interval";
      ASSERT_GE(iv.rank, 0);
      ASSERT_LT(iv.rank, p.W);
      by_rank[iv.rank] += iv.end - iv.start;
      at = iv.end;
    }
    ASSERT_EQ(at, load[e]) << "expert " << e;
  }
  EXPECT_EQ(by_rank, p.rank_load);
}

// counts (W, E) of W ranks routing n tokens each by a profile.
std::vector<int64_t> profile_counts(const RoutingProfile& prof, int64_t W, int64_t n, int64_t k, int64_t E,
                                    std::vector<int32_t>& topk) {
  topk.resize(static_cast<size_t>(n * k));
  routing_profile_assign(prof, n, k, E, topk.data());
  std::vector<int64_t> counts(static_cast<size_t>(W * E), 0);
  for (int64_t s = 0; s < W; ++s)
    for (int32_t e : topk) ++counts[s * E + e];
  return counts;
}

std::vector<int64_t> column_sums(const std::vector<int64_t>& counts, int64_t W, int64_t E) {
  std::vector<int64_t> load(static_cast<size_t>(E), 0);
  for (int64_t s = 0; s < W; ++s)
    for (int64_t e = 0; e < E; ++e) load[e] += counts[s * E + e];
  return load;
}

}  // namespace

TEST(LlepPlan, BelowLambdaFallsBackToHome) {
  // native loads 1200 / 1000: max/mean = 1.09 < 1.3.
  const std::vector<int64_t> load = {700, 500, 600, 400};
  const LlepPlan p = llep_plan_build(load.data(), 4, 2, {});
  EXPECT_FALSE(p.active);
  EXPECT_NEAR(p.imbalance, 1200.0 / 1100.0, 1e-12);
  for (int64_t e = 0; e < 4; ++e) EXPECT_EQ(intervals_of(p, e), (Iv{{p.home(e), 0, load[e]}})) << e;
  EXPECT_EQ(p.rank_load, (std::vector<int64_t>{1200, 1000}));
  expect_plan_consistent(p, load);
  // The same loads with a lower lambda plan.
  LlepParams low;
  low.lambda = 1.05;
  EXPECT_TRUE(llep_plan_build(load.data(), 4, 2, low).active);
}

TEST(LlepPlan, NothingRoutedIsInactive) {
  const std::vector<int64_t> load(8, 0);
  const LlepPlan p = llep_plan_build(load.data(), 8, 4, {});
  EXPECT_FALSE(p.active);
  EXPECT_EQ(p.imbalance, 1.0);
  EXPECT_TRUE(p.intervals.empty());
  EXPECT_EQ(p.load_ratio(), 1.0);
}

TEST(LlepPlan, SpillsTheHottestExpert) {
  // native 8000 / 2000, cap 5000. e0: pending0 = 2000, keeps 3000, spills 3000 to rank 1 (eff 2000);
  // e1 then fits at home (eff0 = 3000); e2, e3 fit on rank 1 (eff 4000, then 5000).
  const std::vector<int64_t> load = {6000, 2000, 1000, 1000};
  const LlepPlan p = llep_plan_build(load.data(), 4, 2, {});
  ASSERT_TRUE(p.active);
  EXPECT_EQ(p.cap, 5000);
  EXPECT_EQ(intervals_of(p, 0), (Iv{{0, 0, 3000}, {1, 3000, 6000}}));
  EXPECT_EQ(intervals_of(p, 1), (Iv{{0, 0, 2000}}));
  EXPECT_EQ(intervals_of(p, 2), (Iv{{1, 0, 1000}}));
  EXPECT_EQ(intervals_of(p, 3), (Iv{{1, 0, 1000}}));
  EXPECT_EQ(p.rank_load, (std::vector<int64_t>{5000, 5000}));
  EXPECT_EQ(p.guests(0), (std::vector<int32_t>{1}));
  EXPECT_TRUE(p.guests(1).empty());
  EXPECT_EQ(p.load_ratio(), 1.0);
  expect_plan_consistent(p, load);
}

TEST(LlepPlan, TiesByLowerExpertThenLowerRank) {
  // Two equal hot experts on rank 0, cap 1500. e0 (lower id) goes first: pending0 = 3000, nothing
  // kept; ranks 1, 2, 3 all have eff 0 and take in id order: 1 then 2. e1: keeps 1500 at home; rank 3
  // (eff 0) takes the rest before ranks 1 and 2 (eff 1500).
  std::vector<int64_t> load(8, 0);
  load[0] = load[1] = 3000;
  const LlepPlan p = llep_plan_build(load.data(), 8, 4, {});
  ASSERT_TRUE(p.active);
  EXPECT_EQ(p.cap, 1500);
  EXPECT_EQ(intervals_of(p, 0), (Iv{{1, 0, 1500}, {2, 1500, 3000}}));
  EXPECT_EQ(intervals_of(p, 1), (Iv{{0, 0, 1500}, {3, 1500, 3000}}));
  EXPECT_EQ(p.rank_load, (std::vector<int64_t>{1500, 1500, 1500, 1500}));
  EXPECT_EQ(p.guests(0), (std::vector<int32_t>{1, 2}));
  expect_plan_consistent(p, load);
}

TEST(LlepPlan, EmptyExpertsGetNoInterval) {
  // Experts 1, 3, 5 receive nothing: no interval, no guest, no share of any rank's load.
  const std::vector<int64_t> load = {5000, 0, 3000, 0, 100, 0};
  const LlepPlan p = llep_plan_build(load.data(), 6, 3, {});
  ASSERT_TRUE(p.active);
  for (int64_t e : {1, 3, 5}) {
    EXPECT_TRUE(intervals_of(p, e).empty()) << e;
    EXPECT_TRUE(p.guests(e).empty()) << e;
  }
  EXPECT_EQ(std::accumulate(p.rank_load.begin(), p.rank_load.end(), int64_t{0}), 8100);
  expect_plan_consistent(p, load);
}

TEST(LlepPlan, ForcedRemainderWhenPiecesAreBelowMinimum) {
  // One expert per rank, cap 2300. e0 keeps 2300; rank 2 (eff 1400) has room 900 and rank 1 (eff 1500)
  // room 800, both below m = 1024 and neither would finish e0: skipped, and the 1700 left are forced
  // onto the rank that had the smallest eff (2). e2 then keeps 600 and rank 1's room 800 finishes it.
  const std::vector<int64_t> load = {4000, 1500, 1400};
  const LlepPlan p = llep_plan_build(load.data(), 3, 3, {});
  ASSERT_TRUE(p.active);
  EXPECT_EQ(p.cap, 2300);
  EXPECT_EQ(intervals_of(p, 0), (Iv{{0, 0, 2300}, {2, 2300, 4000}}));
  EXPECT_EQ(intervals_of(p, 1), (Iv{{1, 0, 1500}}));
  EXPECT_EQ(intervals_of(p, 2), (Iv{{2, 0, 600}, {1, 600, 1400}}));
  EXPECT_EQ(p.rank_load, (std::vector<int64_t>{2300, 2300, 2300}));
  expect_plan_consistent(p, load);

  // With m = 1 the small pieces are taken: 900 to rank 2, 800 to rank 1.
  LlepParams m1;
  m1.min_tokens_per_gemm = 1;
  const LlepPlan q = llep_plan_build(load.data(), 3, 3, m1);
  EXPECT_EQ(intervals_of(q, 0), (Iv{{0, 0, 2300}, {2, 2300, 3200}, {1, 3200, 4000}}));
  expect_plan_consistent(q, load);
}

TEST(LlepPlan, ForcedRemainderWhenNoRankHasRoom) {
  // alpha < 1 lowers the cap below the mean: the ranks together cannot hold everything, so a
  // remainder lands on the least loaded other rank beyond the cap.
  const std::vector<int64_t> load = {9000, 1000, 1000, 1000};
  LlepParams p0;
  p0.alpha = 0.5;  // cap = floor(0.5 * 3000) = 1500
  const LlepPlan p = llep_plan_build(load.data(), 4, 4, p0);
  ASSERT_TRUE(p.active);
  EXPECT_EQ(p.cap, 1500);
  // e0 keeps 1500; ranks 1..3 (eff 1000) have room 500 each, below m and not finishing e0: all
  // skipped, and the 7500 left are forced onto rank 1 (smallest eff, lowest id). e1 then has no room
  // at home and nowhere a piece of m fits: forced onto rank 2. e2 keeps 500, rank 3 finishes it.
  EXPECT_EQ(intervals_of(p, 0), (Iv{{0, 0, 1500}, {1, 1500, 9000}}));
  EXPECT_EQ(intervals_of(p, 1), (Iv{{2, 0, 1000}}));
  EXPECT_EQ(intervals_of(p, 2), (Iv{{2, 0, 500}, {3, 500, 1000}}));
  EXPECT_EQ(intervals_of(p, 3), (Iv{{3, 0, 1000}}));
  EXPECT_EQ(p.rank_load, (std::vector<int64_t>{1500, 7500, 1500, 1500}));
  expect_plan_consistent(p, load);
}

TEST(LlepPlan, RandomLoadsConserveEveryCopyAndAreDeterministic) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t W = 1 + static_cast<int64_t>(rng() % 8);
    const int64_t E = W * (1 + static_cast<int64_t>(rng() % 6));
    const int64_t n = 1 + static_cast<int64_t>(rng() % 700), k = 1 + static_cast<int64_t>(rng() % std::min<int64_t>(E, 4));
    // counts (W, E) from random skewed routing: a few experts take most copies.
    std::vector<int64_t> counts(static_cast<size_t>(W * E), 0);
    std::vector<std::vector<int32_t>> topk(static_cast<size_t>(W));
    const int64_t hot = static_cast<int64_t>(rng() % E);
    for (int64_t s = 0; s < W; ++s) {
      topk[s].resize(static_cast<size_t>(n * k));
      for (int64_t i = 0; i < n * k; ++i) {
        const int32_t e = static_cast<int32_t>(rng() % 3 == 0 ? rng() % E : (hot + rng() % 2) % E);
        topk[s][i] = e;
        ++counts[s * E + e];
      }
    }
    const std::vector<int64_t> load = column_sums(counts, W, E);
    LlepParams prm;
    prm.lambda = 1.0 + static_cast<double>(rng() % 100) / 100.0;
    prm.alpha = 0.5 + static_cast<double>(rng() % 100) / 100.0;
    prm.min_tokens_per_gemm = 1 + static_cast<int64_t>(rng() % 300);
    const LlepPlan p = llep_plan_build(load.data(), E, W, prm);
    SCOPED_TRACE(testing::Message() << "trial " << trial << " W=" << W << " E=" << E << " active=" << p.active);
    expect_plan_consistent(p, load);
    EXPECT_EQ(p.active, W > 1 && p.imbalance >= prm.lambda);

    // Same loads, same plan (every rank builds its own).
    const LlepPlan q = llep_plan_build(load.data(), E, W, prm);
    ASSERT_EQ(p.interval_first, q.interval_first);
    ASSERT_EQ(p.intervals.size(), q.intervals.size());
    for (size_t i = 0; i < p.intervals.size(); ++i) {
      EXPECT_EQ(p.intervals[i].rank, q.intervals[i].rank);
      EXPECT_EQ(p.intervals[i].start, q.intervals[i].start);
      EXPECT_EQ(p.intervals[i].end, q.intervals[i].end);
    }

    // Every source's copies are planned once (its pieces, what the engine sends, add up to its n k
    // copies, expert by expert), and what the ranks receive is the plan's loads.
    std::vector<int64_t> recv(static_cast<size_t>(W), 0);
    std::vector<LlepPiece> pieces;
    for (int64_t s = 0; s < W; ++s) {
      llep_pieces(p, counts.data(), static_cast<int32_t>(s), pieces);
      int64_t row = 0;
      std::vector<int64_t> per_expert(static_cast<size_t>(E), 0);
      for (const LlepPiece& pc : pieces) {
        ASSERT_LT(pc.begin, pc.end);
        row += pc.end - pc.begin;
        per_expert[pc.expert] += pc.end - pc.begin;
        recv[pc.dest] += pc.end - pc.begin;
      }
      EXPECT_EQ(row, n * k);
      for (int64_t e = 0; e < E; ++e) EXPECT_EQ(per_expert[e], counts[s * E + e]) << "s=" << s << " e=" << e;
    }
    for (int64_t d = 0; d < W; ++d) EXPECT_EQ(recv[d], p.rank_load[d]) << "rank " << d;
  }
}

TEST(LlepPlan, RoutesFollowGlobalPosition) {
  // E = 2, W = 2; expert 0 has 3 copies on source 0 and 2 on source 1 (global order s0: 0..2, s1: 3..4).
  // Plan by hand through the loads: expert 0 load 5, expert 1 load 1 (home 1). native 5 / 1, cap 3:
  // e0 keeps [0, 3) at home (rank 0), spills [3, 5) to rank 1 (m = 1: the piece finishes e0).
  const int64_t counts[] = {3, 0,   // source 0
                            2, 1};  // source 1
  const std::vector<int64_t> load = {5, 1};
  LlepParams prm;
  prm.min_tokens_per_gemm = 1;
  const LlepPlan p = llep_plan_build(load.data(), 2, 2, prm);
  ASSERT_TRUE(p.active);
  EXPECT_EQ(intervals_of(p, 0), (Iv{{0, 0, 3}, {1, 3, 5}}));
  // Source 0's three copies are global 0..2: one piece to rank 0. Source 1's copies of expert 0 are
  // global 3, 4: rank 1, and its copy of expert 1 stays home (rank 1).
  std::vector<LlepPiece> zero;
  llep_pieces(p, counts, 0, zero);
  ASSERT_EQ(zero.size(), 1u);
  EXPECT_EQ(zero[0].dest, 0);
  EXPECT_EQ(zero[0].end - zero[0].begin, 3);
  std::vector<LlepPiece> pieces;
  llep_pieces(p, counts, 1, pieces);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].expert, 0);
  EXPECT_EQ(pieces[0].dest, 1);
  EXPECT_EQ(pieces[0].begin, 0);
  EXPECT_EQ(pieces[0].end, 2);
  EXPECT_EQ(pieces[1].expert, 1);
  EXPECT_EQ(pieces[1].dest, 1);
}

TEST(LlepPlan, HotProfileIsBalancedByThePlan) {
  // Paper-like shape, scaled down: 8 ranks, 128 experts, top-8, 4096 tokens per rank, hot:0.95:16.
  const int64_t W = 8, E = 128, k = 8, n = 4096;
  RoutingProfile hot = routing_profile_parse("hot:0.95:16");
  std::vector<int32_t> topk;
  const std::vector<int64_t> counts = profile_counts(hot, W, n, k, E, topk);
  const std::vector<int64_t> load = column_sums(counts, W, E);
  const LlepPlan p = llep_plan_build(load.data(), E, W, {});
  ASSERT_TRUE(p.active);
  EXPECT_GT(p.imbalance, 3.0);  // two ranks own the 16 hot experts
  EXPECT_LT(p.load_ratio(), 1.05);
  expect_plan_consistent(p, load);
}

TEST(ChunkPlan, ShapeAndMembership) {
  // K = min(ceil(n / c), K_max), c_eff = ceil(n / K).
  EXPECT_EQ(chunk_plan_build(100, 30, 128, ChunkMembership::ChunkMembership_strided).K, 4);
  EXPECT_EQ(chunk_plan_build(100, 30, 128, ChunkMembership::ChunkMembership_strided).c_eff, 25);
  EXPECT_EQ(chunk_plan_build(100, 30, 3, ChunkMembership::ChunkMembership_strided).K, 3);
  EXPECT_EQ(chunk_plan_build(100, 30, 3, ChunkMembership::ChunkMembership_strided).c_eff, 34);
  EXPECT_EQ(chunk_plan_build(65536, 6554, 10, ChunkMembership::ChunkMembership_strided).K, 10);
  EXPECT_EQ(chunk_plan_build(7, 100, 4, ChunkMembership::ChunkMembership_strided).K, 1);

  for (ChunkMembership mb : {ChunkMembership::ChunkMembership_strided, ChunkMembership::ChunkMembership_contiguous})
    for (int64_t n : {1, 5, 7, 64, 100, 1001})
      for (int64_t c : {1, 2, 3, 16, 1000})
        for (int64_t kmax : {1, 2, 4, 7, 128}) {
          const ChunkPlan p = chunk_plan_build(n, c, kmax, mb);
          SCOPED_TRACE(testing::Message() << "n=" << n << " c=" << c << " K_max=" << kmax);
          ASSERT_GE(p.K, 1);
          ASSERT_LE(p.K, kmax);
          std::vector<int64_t> per_chunk(static_cast<size_t>(p.K), 0);
          for (int64_t t = 0; t < n; ++t) {
            const int64_t i = p.chunk_of(t);
            ASSERT_GE(i, 0);
            ASSERT_LT(i, p.K);
            ASSERT_EQ(i, mb == ChunkMembership::ChunkMembership_strided ? t % p.K : t / p.c_eff);
            ++per_chunk[i];
          }
          for (int64_t c_i : per_chunk) ASSERT_LE(c_i, p.c_eff);
        }
  // Strided spreads, contiguous cuts: n = 10, K = 3, c_eff = 4.
  const ChunkPlan st = chunk_plan_build(10, 4, 3, ChunkMembership::ChunkMembership_strided);
  const ChunkPlan co = chunk_plan_build(10, 4, 3, ChunkMembership::ChunkMembership_contiguous);
  EXPECT_EQ(st.chunk_of(9), 0);
  EXPECT_EQ(st.chunk_of(7), 1);
  EXPECT_EQ(co.chunk_of(3), 0);
  EXPECT_EQ(co.chunk_of(4), 1);
  EXPECT_EQ(co.chunk_of(9), 2);
  EXPECT_EQ(chunk_dispatch_bound_bytes(8, 8, 6554, 7168, 2), 2ull * 8 * 8 * 6554 * 7168 * 2);
}

// Whatever the skew, a destination receives at most W k c_eff copies in one chunk: proved on the
// dispatch the engine runs. Every rank of a W-rank world runs a training step with pipelined_llep on
// meta (flatpeak plan's thread world); the dispatch asserts the bound on every chunk it builds (an
// InternalError otherwise), and every rank's dispatch peak stays within the chunk's buffers: the
// (m) ids, one chunk's sends and two received buffers at the bound. The standard dispatch under the
// same profiles exceeds that, so the test can fail.
TEST(ChunkPlan, ReceiveBoundHoldsOnTheEngine) {
  ModelConfig m;
  m.hidden_size = 32;
  m.num_hidden_layers = 1;
  m.num_attention_heads = 2;
  m.num_key_value_heads = 1;
  m.head_dim = 16;
  m.num_experts = 64;
  m.num_experts_per_tok = 4;
  m.moe_intermediate_size = 16;
  m.vocab_size = 64;
  const int64_t W = 8, n = 2048, k = 4, H = 32, a = 2;  // bf16 activations
  bool standard_exceeds = false;
  for (const char* prof : {"balanced", "hot:0.5:4", "hot:0.95:16", "hot:1:4"})
    for (const char* mb : {"strided", "contiguous"})
      for (int64_t c : {100, 256, 2048}) {
        SCOPED_TRACE(testing::Message() << prof << " c=" << c << " " << mb);
        plan::Input in;
        in.model = m;
        in.context = n * W;
        in.settings.layout.ranks = W;
        for (const std::string& it : {std::string("optim=device"), std::string("routing=") + prof,
                                      std::string("membership=") + mb, "chunk_cap=" + std::to_string(c),
                                      std::string("max_chunks=10")})
          plan::settings_apply(in.settings, it);
        std::vector<plan::RankPlan> ranks;
        plan::PlanOptions opt;
        opt.ranks = &ranks;
        plan::settings_apply(in.settings, "dispatch=pipelined_llep");
        plan::plan_step(in, opt);  // the bound is asserted inside, chunk by chunk
        const ChunkPlan cp = chunk_plan_build(n, c, 10, mb == std::string("strided")
                                                            ? ChunkMembership::ChunkMembership_strided
                                                            : ChunkMembership::ChunkMembership_contiguous);
        const uint64_t ids = 2 * static_cast<uint64_t>(n * k) * 4;
        const uint64_t bound = ids + static_cast<uint64_t>(k * cp.c_eff) * H * a +
                               chunk_dispatch_bound_bytes(W, k, cp.c_eff, H, a);
        for (const plan::RankPlan& r : ranks)
          EXPECT_LE(r.peak[static_cast<int>(Category::Category_dispatch)], bound);
        plan::settings_apply(in.settings, "dispatch=standard");
        plan::plan_step(in, opt);
        for (const plan::RankPlan& r : ranks)
          standard_exceeds = standard_exceeds || r.peak[static_cast<int>(Category::Category_dispatch)] > bound;
      }
  EXPECT_TRUE(standard_exceeds);
}

// ---- config keys: moe.dispatch, [llep], [pipelined] (train/run_config.cpp)

namespace {
std::string tiny_config_text() {
  std::ifstream in(std::string(FLATPEAK_SOURCE_DIR) + "/configs/tiny.toml");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
// config_parse must fail with a message containing every fragment.
void expect_config_error(const std::vector<std::string>& overrides, std::initializer_list<const char*> fragments) {
  try {
    config_parse(tiny_config_text(), "test.toml", overrides);
    ADD_FAILURE() << "accepted " << overrides[0];
  } catch (const Error& e) {
    for (const char* f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}
}  // namespace

TEST(DispatchConfig, DefaultsAndOverrides) {
  const RunConfig d = config_parse(tiny_config_text(), "tiny.toml");
  EXPECT_EQ(d.schedules.dispatch.kind, DispatchSchedule::Kind::Kind_standard);
  EXPECT_EQ(d.schedules.dispatch.lambda, 1.3);
  EXPECT_EQ(d.schedules.dispatch.alpha, 1.0);
  EXPECT_EQ(d.schedules.dispatch.min_tokens_per_gemm, 1024);
  EXPECT_TRUE(d.schedules.dispatch.strided);

  const RunConfig c = config_parse(tiny_config_text(), "tiny.toml",
                                   {"moe.dispatch=pipelined_llep", "llep.lambda=1.5", "llep.alpha=0.9",
                                    "llep.min_tokens_per_gemm=64", "pipelined.chunk_cap=100",
                                    "pipelined.max_chunks=10", "pipelined.membership=contiguous"});
  const DispatchSchedule& s = c.schedules.dispatch;
  EXPECT_EQ(s.kind, DispatchSchedule::Kind::Kind_pipelined_llep);
  EXPECT_EQ(s.lambda, 1.5);
  EXPECT_EQ(s.alpha, 0.9);
  EXPECT_EQ(s.min_tokens_per_gemm, 64);
  EXPECT_EQ(s.chunk_cap, 100);
  EXPECT_EQ(s.max_chunks, 10);
  EXPECT_FALSE(s.strided);
  EXPECT_EQ(config_parse(tiny_config_text(), "t", {"moe.dispatch=llep"}).schedules.dispatch.kind,
            DispatchSchedule::Kind::Kind_llep);
}

TEST(DispatchConfig, ErrorsNameTheKey) {
  expect_config_error({"moe.dispatch=fast"}, {"moe.dispatch", "pipelined_llep"});
  expect_config_error({"llep.lambda=0"}, {"llep.lambda"});
  expect_config_error({"llep.alpha=-1"}, {"llep.alpha"});
  expect_config_error({"llep.min_tokens_per_gemm=0"}, {"llep.min_tokens_per_gemm"});
  expect_config_error({"llep.min_tokens_per_gemm=1.5"}, {"llep.min_tokens_per_gemm", "integer"});
  expect_config_error({"pipelined.chunk_cap=0"}, {"pipelined.chunk_cap"});
  expect_config_error({"pipelined.max_chunks=0"}, {"pipelined.max_chunks"});
  expect_config_error({"pipelined.membership=random"}, {"pipelined.membership", "strided"});
  expect_config_error({"pipelined.chunks=3"}, {"pipelined.chunks"});
}

}  // namespace fp
