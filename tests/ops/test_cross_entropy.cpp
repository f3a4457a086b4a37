// The full-vocabulary loss: log-softmax, NLL and the gradient against the scalar reference, with
// ignored targets, vocabularies around SIMD widths (not multiples of 8), very large logits; the mean
// loss's reference gradient against finite differences. Dimensions: n tokens, V vocabulary.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/kernels/ops.h"
#include "core/error.h"
#include "core/rng.h"
#include "op_test.h"
#include "ops/cross_entropy.h"
#include "ops/ref/cross_entropy.h"

namespace fp {

namespace {

using ops::kIgnoreIndex;

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
    const std::vector<float> logits = op_test::random_logits(n, V, rng);
    const std::vector<int32_t> targets = op_test::random_targets(n, V, rng, kIgnoreIndex);
    const std::string where = "V=" + std::to_string(V);
    std::vector<float> logp(n * V), logp_ref(n * V);
    ops::cpu::log_softmax_forward(logits.data(), logp.data(), n, V);
    ops::ref::log_softmax_forward<float>(logits.data(), logp_ref.data(), n, V);
    std::vector<double> tol(n * V);
    for (int64_t i = 0; i < n * V; ++i) tol[i] = 2 * FLT_EPSILON * std::abs(logp_ref[i]) + 4 * FLT_EPSILON;
    EXPECT_TRUE(op_test::near("log_softmax_forward " + where, {n, V}, logp, logp_ref, op_test::tol_each(tol)));

    std::vector<float> loss(n), loss_ref(n);
    ops::cpu::nll_forward(logp_ref.data(), targets.data(), loss.data(), n, V);
    ops::ref::nll_forward<float>(logp_ref.data(), targets.data(), loss_ref.data(), n, V);
    EXPECT_TRUE(op_test::near("nll_forward " + where, {n}, loss, loss_ref, op_test::tol_exact()));
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
    EXPECT_TRUE(op_test::near("cross_entropy_backward " + where, {n, V}, d, d_ref, op_test::tol_each(tol)));
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
  const std::vector<float> x = op_test::random_logits(n, V2, rng);
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
    const std::vector<int32_t> targets = op_test::random_targets(n, V, rng, kIgnoreIndex);
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
    ops::ref::cross_entropy_backward<double>(logp.data(), targets.data(), 1.0 / static_cast<double>(count), grad.data(),
                                             n, V);
    for (int64_t i = 0; i < n * V; ++i) {
      const double fd = op_test::central_difference(logits[i], loss);
      EXPECT_NEAR(grad[i], fd, 1e-7 * (1 + std::abs(fd))) << "V=" << V << " dlogits[" << i / V << "," << i % V << "]";
    }
  }
}

}  // namespace fp
