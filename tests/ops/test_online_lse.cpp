// The online log-sum-exp cross-entropy (ops/online_lse.h): fold, loss and backward against the scalar
// reference on vocabularies split into ranges of odd widths folded in scrambled orders; one range
// against the full loss (ops/cross_entropy.h) bit for bit; the reference gradient against finite
// differences in double; ignored targets; bitwise equal across thread counts.
// Dimensions: n tokens, V vocabulary, [v0, v1) a range of it, w = v1 - v0.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/kernels/ops.h"
#include "core/error.h"
#include "core/rng.h"
#include "op_test.h"
#include "ops/cross_entropy.h"
#include "ops/online_lse.h"
#include "ops/ref/cross_entropy.h"
#include "ops/ref/online_lse.h"

namespace fp {

namespace {

using ops::kIgnoreIndex;
using Range = std::pair<int64_t, int64_t>;  // [v0, v1)

// [0, V) cut at random points into at most `parts` ranges, returned in a scrambled order (a ring
// visits the shards starting from its own).
std::vector<Range> random_ranges(int64_t V, int parts, Rng& rng) {
  std::vector<int64_t> cuts = {0, V};
  for (int i = 1; i < parts; ++i) cuts.push_back(1 + static_cast<int64_t>(rng.below(std::max<int64_t>(V - 1, 1))));
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<Range> r;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) r.emplace_back(cuts[i], cuts[i + 1]);
  for (size_t i = r.size(); i > 1; --i) std::swap(r[i - 1], r[rng.below(i)]);
  return r;
}

struct State {
  std::vector<float> m, y;
  std::vector<double> z;
  explicit State(int64_t n) : m(n), y(n), z(n) {}
};

// Folds every range of the (n, V) logits into a fresh state, cpu kernel or reference.
State fold_all(const std::vector<float>& x, const std::vector<int32_t>& targets, int64_t n, int64_t V,
               const std::vector<Range>& ranges, bool ref) {
  State s(n);
  if (ref) {
    ops::ref::online_lse_init<float>(s.m.data(), s.z.data(), s.y.data(), n);
  } else {
    ops::cpu::online_lse_init(s.m.data(), s.z.data(), s.y.data(), n);
  }
  for (const auto& [v0, v1] : ranges) {
    if (ref) {
      ops::ref::online_lse_fold<float>(x.data() + v0, V, targets.data(), n, v0, v1, s.m.data(), s.z.data(), s.y.data());
    } else {
      ops::cpu::online_lse_fold(x.data() + v0, V, targets.data(), n, v0, v1, s.m.data(), s.z.data(), s.y.data());
    }
  }
  return s;
}

const std::vector<int64_t> kVocab = {1, 3, 7, 9, 16, 17, 31, 33, 65, 129, 1000, 4099};

}  // namespace

// The fold's m is a max (exact); z sums the same float exponentials in double in another order
// (~1e-16 relative); y is a copy. The loss is within 1e-12 relative plus |lse| ulps of double. The
// backward gets the same state in both, so it differs only where the ref's z does: tol 2 eps (p + 1).
TEST(OnlineLse, MatchesReference) {
  uint64_t seed = 1;
  for (const int64_t V : kVocab) {
    for (const int parts : {1, 2, 5}) {
      const int64_t n = 7;
      Rng rng(seed++);
      const std::vector<float> x = op_test::random_logits(n, V, rng);
      const std::vector<int32_t> targets = op_test::random_targets(n, V, rng, kIgnoreIndex);
      const std::vector<Range> ranges = random_ranges(V, parts, rng);
      const std::string where = "V=" + std::to_string(V) + " ranges=" + std::to_string(ranges.size());

      const State got = fold_all(x, targets, n, V, ranges, false);
      const State want = fold_all(x, targets, n, V, ranges, true);
      for (int64_t t = 0; t < n; ++t) {
        ASSERT_EQ(got.m[t], want.m[t]) << where << " m row " << t;
        ASSERT_EQ(got.y[t], want.y[t]) << where << " y row " << t;
        ASSERT_TRUE(std::isfinite(got.z[t]) && got.z[t] >= 1.0) << where << " z row " << t << " " << got.z[t];
        ASSERT_NEAR(got.z[t], want.z[t], 1e-13 * want.z[t]) << where << " z row " << t;
      }
      double loss = 0, loss_ref = 0;
      ops::cpu::online_lse_loss(got.m.data(), got.z.data(), got.y.data(), targets.data(), n, &loss);
      ops::ref::online_lse_loss<float>(want.m.data(), want.z.data(), want.y.data(), targets.data(), n, &loss_ref);
      ASSERT_TRUE(std::isfinite(loss)) << where;
      EXPECT_NEAR(loss, loss_ref, 1e-12 * (1 + std::abs(loss_ref)) + 1e-9) << where;

      // Backward range by range on a copy; ignored rows poisoned (must not be read).
      std::vector<float> d = x, d_ref = x;
      for (int64_t t = 0; t < n; ++t)
        if (targets[t] == kIgnoreIndex)
          for (int64_t i = 0; i < V; ++i) d[t * V + i] = std::numeric_limits<float>::quiet_NaN();
      const float scale = 1.0f / 3.0f;
      for (const auto& [v0, v1] : ranges) {
        ops::cpu::online_lse_backward(d.data() + v0, V, targets.data(), n, v0, v1, got.m.data(), got.z.data(), scale);
        ops::ref::online_lse_backward<float>(d_ref.data() + v0, V, targets.data(), n, v0, v1, want.m.data(),
                                             want.z.data(), scale);
      }
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t i = 0; i < V; ++i) {
          const double g = d[t * V + i], w = d_ref[t * V + i];
          const double tol = 2 * FLT_EPSILON * scale * (std::abs(w / scale) + 2.0);
          ASSERT_TRUE(std::isfinite(g) && std::abs(g - w) <= tol)
              << where << " backward at (" << t << ", " << i << "): expected " << w << ", got " << g;
          if (targets[t] == kIgnoreIndex) {
            ASSERT_EQ(g, 0.0f) << where << " ignored row " << t;
          }
        }
      }
    }
  }
}

// One range over [0, V) is the full loss's arithmetic: the gradient equals cross_entropy_backward of
// log_softmax_forward bit for bit, and the loss its NLL sum within float rounding of each logp.
// Several ranges in any order agree with it to ~1 ulp.
TEST(OnlineLse, AgreesWithTheFullLoss) {
  uint64_t seed = 100;
  for (const int64_t V : {int64_t{17}, int64_t{1000}, int64_t{4099}}) {
    const int64_t n = 9;
    Rng rng(seed++);
    const std::vector<float> x = op_test::random_logits(n, V, rng);
    const std::vector<int32_t> targets = op_test::random_targets(n, V, rng, kIgnoreIndex);
    std::vector<float> logp(n * V), nll(n), d_full(n * V);
    ops::cpu::log_softmax_forward(x.data(), logp.data(), n, V);
    ops::cpu::nll_forward(logp.data(), targets.data(), nll.data(), n, V);
    const float scale = 0.125f;
    ops::cpu::cross_entropy_backward(logp.data(), targets.data(), scale, d_full.data(), n, V);
    double nll_sum = 0;
    for (const float l : nll) nll_sum += l;

    for (const int parts : {1, 4}) {
      const std::vector<Range> ranges = parts == 1 ? std::vector<Range>{{0, V}} : random_ranges(V, parts, rng);
      const State s = fold_all(x, targets, n, V, ranges, false);
      double loss = 0;
      ops::cpu::online_lse_loss(s.m.data(), s.z.data(), s.y.data(), targets.data(), n, &loss);
      double tol = 0;
      for (const float l : nll) tol += FLT_EPSILON * (std::abs(l) + 1.0);
      EXPECT_NEAR(loss, nll_sum, tol) << "V=" << V << " parts=" << parts;
      std::vector<float> d = x;
      for (const auto& [v0, v1] : ranges)
        ops::cpu::online_lse_backward(d.data() + v0, V, targets.data(), n, v0, v1, s.m.data(), s.z.data(), scale);
      for (int64_t i = 0; i < n * V; ++i) {
        if (parts == 1) {
          ASSERT_EQ(d[i], d_full[i]) << "V=" << V << " one range, at (" << i / V << ", " << i % V << ")";
        } else {
          ASSERT_NEAR(d[i], d_full[i], 4 * FLT_EPSILON * (std::abs(d_full[i]) + scale))
              << "V=" << V << " parts=" << parts << " at (" << i / V << ", " << i % V << ")";
        }
      }
    }
  }
}

// A backward over a range writes only that range's columns of a wider strip.
TEST(OnlineLse, BackwardStaysInItsRange) {
  const int64_t n = 5, V = 40, v0 = 11, v1 = 29;
  Rng rng(7);
  const std::vector<float> x = op_test::random_logits(n, V, rng);
  const std::vector<int32_t> targets = op_test::random_targets(n, V, rng, kIgnoreIndex);
  const State s = fold_all(x, targets, n, V, {{0, V}}, false);
  std::vector<float> d = x;
  ops::cpu::online_lse_backward(d.data() + v0, V, targets.data(), n, v0, v1, s.m.data(), s.z.data(), 1.0f);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < V; ++i)
      if (i < v0 || i >= v1) {
        ASSERT_EQ(d[t * V + i], x[t * V + i]) << "(" << t << ", " << i << ")";
      }
}

// L = (1 / count) sum over non-ignored t of (lse_t - x[t, target_t]) from the reference fold over
// three ranges in double; the reference backward with scale 1 / count against central differences.
TEST(OnlineLse, ReferenceGradientMatchesFiniteDifferences) {
  for (const int64_t V : {int64_t{1}, int64_t{5}, int64_t{13}}) {
    const int64_t n = 6;
    Rng rng(30 + V);
    std::vector<double> x(n * V);
    for (double& v : x) v = 2.0 * rng.normal();
    const std::vector<int32_t> targets = op_test::random_targets(n, V, rng, kIgnoreIndex);
    const std::vector<Range> ranges = random_ranges(V, 3, rng);
    int64_t count = 0;
    for (const int32_t t : targets) count += t != kIgnoreIndex;
    auto fold = [&](std::vector<double>& m, std::vector<double>& z, std::vector<double>& y) {
      m.assign(n, 0);
      z.assign(n, 0);
      y.assign(n, 0);
      ops::ref::online_lse_init<double>(m.data(), z.data(), y.data(), n);
      for (const auto& [v0, v1] : ranges)
        ops::ref::online_lse_fold<double>(x.data() + v0, V, targets.data(), n, v0, v1, m.data(), z.data(), y.data());
    };
    auto loss = [&] {
      std::vector<double> m, z, y;
      fold(m, z, y);
      double L = 0;
      ops::ref::online_lse_loss<double>(m.data(), z.data(), y.data(), targets.data(), n, &L);
      return L / static_cast<double>(count);
    };
    std::vector<double> m, z, y;
    fold(m, z, y);
    std::vector<double> grad = x;
    for (const auto& [v0, v1] : ranges)
      ops::ref::online_lse_backward<double>(grad.data() + v0, V, targets.data(), n, v0, v1, m.data(), z.data(),
                                            1.0 / static_cast<double>(count));
    for (int64_t i = 0; i < n * V; ++i) {
      const double fd = op_test::central_difference(x[i], loss);
      EXPECT_NEAR(grad[i], fd, 1e-7 * (1 + std::abs(fd))) << "V=" << V << " d x[" << i / V << "," << i % V << "]";
    }
  }
}

// Rows split across threads, each reduced in one order: 1 and 2 threads give the same bits.
TEST(OnlineLse, BitwiseAcrossThreadCounts) {
  const int64_t n = 67, V = 3001;
  Rng rng(9);
  const std::vector<float> x = op_test::random_logits(n, V, rng);
  const std::vector<int32_t> targets = op_test::random_targets(n, V, rng, kIgnoreIndex);
  const std::vector<Range> ranges = random_ranges(V, 3, rng);
  const int saved = omp_get_max_threads();
  std::vector<float> d[2];
  State st[2] = {State(n), State(n)};
  for (int k = 0; k < 2; ++k) {
    omp_set_num_threads(k + 1);
    st[k] = fold_all(x, targets, n, V, ranges, false);
    d[k] = x;
    for (const auto& [v0, v1] : ranges)
      ops::cpu::online_lse_backward(d[k].data() + v0, V, targets.data(), n, v0, v1, st[k].m.data(), st[k].z.data(),
                                    0.5f);
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(0, std::memcmp(st[0].z.data(), st[1].z.data(), n * sizeof(double)));
  EXPECT_EQ(0, std::memcmp(st[0].m.data(), st[1].m.data(), n * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(d[0].data(), d[1].data(), n * V * sizeof(float)));
}

TEST(OnlineLse, BadTargetOrRangeAsserts) {
  std::vector<float> x(6, 1.0f), m(2), y(2);
  std::vector<double> z(2);
  ops::cpu::online_lse_init(m.data(), z.data(), y.data(), 2);
  const std::vector<int32_t> bad = {0, -3};
  EXPECT_THROW(ops::cpu::online_lse_fold(x.data(), 3, bad.data(), 2, 0, 3, m.data(), z.data(), y.data()),
               InternalError);
  const std::vector<int32_t> ok = {0, 1};
  EXPECT_THROW(ops::cpu::online_lse_fold(x.data(), 2, ok.data(), 2, 0, 3, m.data(), z.data(), y.data()), InternalError);
  EXPECT_THROW(ops::cpu::online_lse_backward(x.data(), 3, ok.data(), 2, 2, 2, m.data(), z.data(), 1.0f), InternalError);
}

}  // namespace fp
