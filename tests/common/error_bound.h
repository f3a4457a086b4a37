// Tolerances derived from the computation, not from the error one machine showed. Header-only, test
// code only.
//
// Note [Tolerances from an error model]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Two float evaluations of the same sums (a schedule and its plain variant, or one BLAS kernel set and
// another) add their terms in different orders, so they differ by rounding. How much depends on the
// order the kernels chose: OpenBLAS's Haswell, Sandybridge, Prescott and SkylakeX kernels block and
// fuse differently, and a tolerance fitted to what one of them showed (a few ulps of the tensor's
// largest element) fails on another (issue 33: 1.6e-6 of the magnitude on SkylakeX against a fitted
// 1e-6). A bound that holds for every order comes from the terms themselves:
//
//   a sum s = sum_i t_i of K terms, each t_i computed with relative error e_i, evaluated in any order
//   and blocking in float, is within  gamma(K) sum_i |t_i| + sum_i e_i |t_i|  of the exact value
//   (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 3.1), with
//   gamma(K) = K u / (1 - K u), u = 2^-24.
//
// gamma(K) is the worst case over every order and every rounding, and is far from what rounding does
// on data like ours: each rounding error is as likely up as down, and they add like a random walk.
// Higham and Mary (SIAM J. Sci. Comput. 41(5), 2019, Theorem 3.1) bound the same sum by
// gamma_prob(K, lambda) = exp(lambda sqrt(K) u + K u^2 / (1 - u)) - 1 with probability at least
// 1 - 2K exp(-lambda^2 (1 - u)^2 / 2), assuming only that the rounding errors are independent with mean
// zero (true of round-to-nearest on random inputs; not of sums that stagnate, which tests avoid). With
// lambda = 10 that probability is 1 - 4e-18 per element at K = 16389: a check of a million elements
// fails spuriously less than once in 10^11 runs, on any kernel set. We take min(gamma, gamma_prob):
// both are bounds.
//
// A comparison of two float evaluations allows twice the bound (each is within it of the exact value).
// The magnitudes sum_i |t_i| are computed in double by the test, beside its own reference.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace fp::test_bound {

constexpr double kUnitF32 = 0x1p-24;  // unit roundoff of float, round to nearest
constexpr double kUnitBF16 = 0x1p-8;  // unit roundoff of bfloat16
constexpr double kLambda = 10.0;      // Note [Tolerances from an error model]

// Higham's gamma(K): the worst case of a K-term sum's relative error (to sum |t_i|), any order.
inline double gamma_worst(double K, double u = kUnitF32) { return K * u / (1.0 - K * u); }

// Higham and Mary's probabilistic gamma(K, lambda), never above the worst case.
inline double gamma(double K, double u = kUnitF32) {
  const double prob = std::expm1(kLambda * std::sqrt(K) * u + K * u * u / (1.0 - u));
  return std::min(gamma_worst(K, u), prob);
}

// got[i] against want[i], i < count: |got - want| <= bound[i] for every i (bound from the model).
// Records the largest |got - want| / bound seen in *worst (a ratio: 1 is the bound) and describes the
// first violation in *why. Non-finite values always fail.
template <class G, class W, class B>
bool within_bounds(const G* got, const W* want, const B* bound, int64_t count, double* worst, std::string* why) {
  for (int64_t i = 0; i < count; ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    const double b = static_cast<double>(bound[i]), d = std::abs(g - w);
    if (!std::isfinite(g) || !std::isfinite(w) || !(d <= b)) {
      char msg[200];
      std::snprintf(msg, sizeof msg, "at %lld: expected %.9g, got %.9g, |difference| %.3g > bound %.3g (error model)",
                    static_cast<long long>(i), w, g, d, b);
      *why = msg;
      return false;
    }
    if (b > 0) *worst = std::max(*worst, d / b);
  }
  return true;
}

}  // namespace fp::test_bound
