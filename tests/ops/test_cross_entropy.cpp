// The full-vocabulary loss: log-softmax, NLL and the gradient against the scalar reference, with
// ignored targets, vocabularies around SIMD widths (not multiples of 8), very large logits; the mean
// loss's reference gradient against finite differences. Dimensions: n tokens, V vocabulary.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "ops/cross_entropy.h"
#include "ops/ref/cross_entropy.h"

namespace fp {

namespace {

using ops::cpu::kIgnoreIndex;

// Row t's logits ~ N(0, scale_t^2) with scale_t cycling through 1, 10 and 1e4 (the last makes all but
// a few exponentials underflow: the max subtraction must hold), no zeros.
template <class T>
std::vector<T> random_logits(int64_t n, int64_t V, Rng& rng) {
  std::vector<T> v(n * V);
  const double scales[3] = {1.0, 10.0, 1e4};
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < V; ++i) {
      T& x = v[t * V + i];
      x = static_cast<T>(scales[t % 3] * rng.normal());
      if (x == T(0)) x = T(0.5);
    }
  }
  return v;
}

// Every third target ignored, the others uniform in [0, V).
std::vector<int32_t> random_targets(int64_t n, int64_t V, Rng& rng) {
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = i % 3 == 1 ? kIgnoreIndex : static_cast<int32_t>(rng.below(V));
  return t;
}

::testing::AssertionResult near_each(const std::vector<float>& got, const std::vector<float>& want,
                                     const std::vector<double>& tol, const std::string& what, int64_t V) {
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], w = want[i];
    if (!std::isfinite(g) || !std::isfinite(w) || !(std::abs(g - w) <= tol[i])) {
      return ::testing::AssertionFailure() << what << " at (" << i / V << ", " << i % V << "): expected " << w
                                           << ", got " << g << " (tolerance " << tol[i] << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

const std::vector<int64_t> kVocab = {1, 3, 7, 9, 15, 16, 17, 31, 33, 63, 65, 127, 129, 1000, 4099};

}  // namespace

// log-softmax: both sum expf in double (orders differ by ~1e-16), so lse agrees to ~2 eps absolute
// and each logp = x - lse is rounded once: tol = 2 eps |logp| + 4 eps.
// NLL and the gradient get the reference's logp as input in both: the same float operations, equal
// up to the same expf; tol = 2 eps |scale| (p + onehot).
TEST(CrossEntropy, MatchesReference) {
  uint64_t seed = 1;
  for (const int64_t V : kVocab) {
    const int64_t n = 7;
    Rng rng(seed++);
    const std::vector<float> logits = random_logits<float>(n, V, rng);
    const std::vector<int32_t> targets = random_targets(n, V, rng);
    const std::string where = "V=" + std::to_string(V);
    std::vector<float> logp(n * V), logp_ref(n * V);
    ops::cpu::log_softmax_forward(logits.data(), logp.data(), n, V);
    ops::ref::log_softmax_forward<float>(logits.data(), logp_ref.data(), n, V);
    std::vector<double> tol(n * V);
    for (int64_t i = 0; i < n * V; ++i) tol[i] = 2 * FLT_EPSILON * std::abs(logp_ref[i]) + 4 * FLT_EPSILON;
    EXPECT_TRUE(near_each(logp, logp_ref, tol, "log_softmax_forward " + where, V));

    std::vector<float> loss(n), loss_ref(n);
    ops::cpu::nll_forward(logp_ref.data(), targets.data(), loss.data(), n, V);
    ops::ref::nll_forward<float>(logp_ref.data(), targets.data(), loss_ref.data(), n, V);
    EXPECT_TRUE(near_each(loss, loss_ref, std::vector<double>(n, 0.0), "nll_forward " + where, 1));
    for (int64_t t = 0; t < n; ++t) {
      if (targets[t] == kIgnoreIndex) {
        EXPECT_EQ(loss[t], 0.0f) << "ignored row " << t;
      }
    }

    // The ignored rows' logp poisoned: the gradient must not read them.
    std::vector<float> logp_in = logp_ref;
    for (int64_t t = 0; t < n; ++t)
      if (targets[t] == kIgnoreIndex)
        for (int64_t i = 0; i < V; ++i) logp_in[t * V + i] = std::numeric_limits<float>::quiet_NaN();
    const float scale = 1.0f / 3.0f;
    std::vector<float> d(n * V, 7.0f), d_ref(n * V);
    ops::cpu::cross_entropy_backward(logp_in.data(), targets.data(), scale, d.data(), n, V);
    ops::ref::cross_entropy_backward<float>(logp_ref.data(), targets.data(), scale, d_ref.data(), n, V);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < V; ++i) {
        const double p = std::exp(static_cast<double>(logp_ref[t * V + i]));
        tol[t * V + i] = 2 * FLT_EPSILON * scale * (p + (i == targets[t] ? 1.0 : 0.0));
      }
    }
    EXPECT_TRUE(near_each(d, d_ref, tol, "cross_entropy_backward " + where, V));
    for (int64_t t = 0; t < n; ++t) {
      if (targets[t] != kIgnoreIndex) continue;
      for (int64_t i = 0; i < V; ++i) ASSERT_EQ(d[t * V + i], 0.0f) << "ignored row " << t << " column " << i;
    }
  }
}

// A row of equal logits: logp = -log V exactly to float precision; the probabilities sum to 1.
TEST(CrossEntropy, UniformRowAndNormalisation) {
  const int64_t V = 1001;
  std::vector<float> logits(V, 3.5f), logp(V);
  ops::cpu::log_softmax_forward(logits.data(), logp.data(), 1, V);
  for (int64_t i = 0; i < V; ++i) ASSERT_FLOAT_EQ(logp[i], static_cast<float>(-std::log(1001.0))) << i;
  Rng rng(4);
  const int64_t n = 3, V2 = 70001;
  const std::vector<float> x = random_logits<float>(n, V2, rng);
  std::vector<float> lp(n * V2);
  ops::cpu::log_softmax_forward(x.data(), lp.data(), n, V2);
  for (int64_t t = 0; t < n; ++t) {
    double s = 0;
    for (int64_t i = 0; i < V2; ++i) s += std::exp(static_cast<double>(lp[t * V2 + i]));
    EXPECT_NEAR(s, 1.0, 1e-5) << "row " << t;
  }
}

TEST(CrossEntropy, TargetOutOfRangeAsserts) {
  const std::vector<float> logp(6, -1.0f);
  std::vector<float> out(6);
  const std::vector<int32_t> bad = {0, 3};
  EXPECT_THROW(ops::cpu::nll_forward(logp.data(), bad.data(), out.data(), 2, 3), InternalError);
  EXPECT_THROW(ops::cpu::cross_entropy_backward(logp.data(), bad.data(), 1.0f, out.data(), 2, 3), InternalError);
}

// The mean loss L = (1 / count) sum over non-ignored t of -log_softmax(logits)[t, target_t] in double;
// dL/dlogits = cross_entropy_backward(logp, targets, 1 / count) against central differences.
TEST(CrossEntropy, ReferenceGradientMatchesFiniteDifferences) {
  for (const int64_t V : {int64_t{1}, int64_t{5}, int64_t{13}}) {
    const int64_t n = 6;
    Rng rng(30 + V);
    std::vector<double> logits(n * V);
    for (double& x : logits) x = 2.0 * rng.normal();
    const std::vector<int32_t> targets = random_targets(n, V, rng);
    int64_t count = 0;
    for (const int32_t t : targets) count += t != kIgnoreIndex;
    auto loss = [&] {
      std::vector<double> logp(n * V), l(n);
      ops::ref::log_softmax_forward<double>(logits.data(), logp.data(), n, V);
      ops::ref::nll_forward<double>(logp.data(), targets.data(), l.data(), n, V);
      double L = 0;
      for (const double v : l) L += v;
      return L / static_cast<double>(count);
    };
    std::vector<double> logp(n * V), grad(n * V);
    ops::ref::log_softmax_forward<double>(logits.data(), logp.data(), n, V);
    ops::ref::cross_entropy_backward<double>(logp.data(), targets.data(), 1.0 / static_cast<double>(count),
                                             grad.data(), n, V);
    for (int64_t i = 0; i < n * V; ++i) {
      const double h = 1e-5, saved = logits[i];
      logits[i] = saved + h;
      const double lp = loss();
      logits[i] = saved - h;
      const double lm = loss();
      logits[i] = saved;
      const double fd = (lp - lm) / (2 * h);
      EXPECT_NEAR(grad[i], fd, 1e-7 * (1 + std::abs(fd))) << "V=" << V << " dlogits[" << i / V << "," << i % V << "]";
    }
  }
}

}  // namespace fp
