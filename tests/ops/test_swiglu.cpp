// SwiGLU: forward and backward against the scalar reference at sizes around SIMD widths; finite and
// correct at |g| = 100 and beyond (Note [Stable sigmoid]); the reference backward against finite
// differences. Dimensions: n elements.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/ref/swiglu.h"
#include "ops/swiglu.h"

namespace fp {

namespace {

template <class T>
std::vector<T> random_vector(int64_t n, Rng& rng, double scale) {
  std::vector<T> v(n);
  for (T& x : v) {
    x = static_cast<T>(scale * rng.normal());
    if (x == T(0)) x = static_cast<T>(0.5 * scale);
  }
  return v;
}

// |got - want| <= k eps scale[i] (scale = |want| when empty).
::testing::AssertionResult near_rel(const std::vector<float>& got, const std::vector<float>& want, double k,
                                    const std::string& what, const std::vector<double>& scale = {}) {
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], w = want[i];
    const double tol = k * FLT_EPSILON * (scale.empty() ? std::abs(w) : scale[i]) + 1e-40;
    if (!std::isfinite(g) || !std::isfinite(w) || !(std::abs(g - w) <= tol)) {
      return ::testing::AssertionFailure() << what << " index " << i << ": expected " << w << ", got " << g
                                           << " (tolerance " << tol << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

const std::vector<int64_t> kSizes = {1,  3,  7,  8,  9,   15,  16,  17,   31,   33,   63,
                                     64, 65, 127, 129, 1000, 8191, 8192, 8193, 20001};

}  // namespace

// Same float formula in both, but the kernel's expf and the reference's std::exp<float> may come
// from different code paths; a 1-ulp difference in exp moves s by < 1 ulp, so results agree within a
// few eps relative: each output is a product, except 1 + g (1 - s) in dg, which cancels near
// g = -1.28 (where silu' = 0); its error is a few eps of 1 + |g (1 - s)|, so dg's tolerance is
// 8 eps |da u| s (1 + |g (1 - s)|).
TEST(Swiglu, MatchesReference) {
  uint64_t seed = 1;
  for (const int64_t n : kSizes) {
    Rng rng(seed++);
    const std::vector<float> g = random_vector<float>(n, rng, 3.0), u = random_vector<float>(n, rng, 1.0);
    const std::vector<float> da = random_vector<float>(n, rng, 1.0);
    std::vector<float> a(n), a_ref(n), dg(n), dg_ref(n), du(n), du_ref(n);
    ops::cpu::swiglu_forward(g.data(), u.data(), a.data(), n);
    ops::ref::swiglu_forward<float>(g.data(), u.data(), a_ref.data(), n);
    EXPECT_TRUE(near_rel(a, a_ref, 4, "swiglu_forward n=" + std::to_string(n)));
    ops::cpu::swiglu_backward(g.data(), u.data(), da.data(), dg.data(), du.data(), n);
    ops::ref::swiglu_backward<float>(g.data(), u.data(), da.data(), dg_ref.data(), du_ref.data(), n);
    EXPECT_TRUE(near_rel(du, du_ref, 4, "swiglu_backward du n=" + std::to_string(n)));
    std::vector<double> dg_scale(n);
    for (int64_t i = 0; i < n; ++i) {
      const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(g[i])));
      dg_scale[i] = std::abs(static_cast<double>(da[i]) * u[i]) * s * (1.0 + std::abs(g[i] * (1.0 - s)));
    }
    EXPECT_TRUE(near_rel(dg, dg_ref, 8, "swiglu_backward dg n=" + std::to_string(n), dg_scale));
  }
}

// Large |g|: no inf or NaN, and the values the limits give: silu(g) -> g for g -> +inf, -> -0 for
// g -> -inf, silu'(g) -> 1 and -> 0. Checked against the double reference.
TEST(Swiglu, LargeGatesStayFinite) {
  const std::vector<float> g = {100.0f, -100.0f, 88.0f, -88.0f, 89.0f, -89.0f, 1e4f, -1e4f, 1e30f, -1e30f, 20.0f,
                                -20.0f};
  const int64_t n = static_cast<int64_t>(g.size());
  const std::vector<float> u(n, 1.5f), da(n, 0.75f);
  std::vector<float> a(n), dg(n), du(n);
  ops::cpu::swiglu_forward(g.data(), u.data(), a.data(), n);
  ops::cpu::swiglu_backward(g.data(), u.data(), da.data(), dg.data(), du.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(std::isfinite(a[i]) && std::isfinite(dg[i]) && std::isfinite(du[i]))
        << "g=" << g[i] << ": a=" << a[i] << " dg=" << dg[i] << " du=" << du[i];
    double ad, dgd, dud;
    const double gd = g[i], ud = u[i], dad = da[i];
    ops::ref::swiglu_forward<double>(&gd, &ud, &ad, 1);
    ops::ref::swiglu_backward<double>(&gd, &ud, &dad, &dgd, &dud, 1);
    // Float results may underflow to 0 (or a subnormal) where the double ones are tiny.
    EXPECT_NEAR(a[i], ad, 4e-7 * std::abs(ad) + 1e-37) << "a at g=" << g[i];
    EXPECT_NEAR(du[i], dud, 4e-7 * std::abs(dud) + 1e-37) << "du at g=" << g[i];
    EXPECT_NEAR(dg[i], dgd, 4e-6 * std::abs(dgd) + 1e-37) << "dg at g=" << g[i];
  }
  EXPECT_EQ(a[0], 150.0f);
  EXPECT_EQ(dg[0], 0.75f * 1.5f);
}

// L = q . swiglu_forward(g, u) in double; dL/dg, dL/du from the reference backward (da = q) against
// central differences. Step 1e-5: truncation ~h^2 |silu'''| ~ 1e-10.
TEST(Swiglu, ReferenceBackwardMatchesFiniteDifferences) {
  const int64_t n = 41;
  Rng rng(5);
  std::vector<double> g = random_vector<double>(n, rng, 4.0), u = random_vector<double>(n, rng, 1.0);
  const std::vector<double> q = random_vector<double>(n, rng, 1.0);
  std::vector<double> dg(n), du(n);
  ops::ref::swiglu_backward<double>(g.data(), u.data(), q.data(), dg.data(), du.data(), n);
  auto loss = [&] {
    std::vector<double> a(n);
    ops::ref::swiglu_forward<double>(g.data(), u.data(), a.data(), n);
    double L = 0;
    for (int64_t i = 0; i < n; ++i) L += q[i] * a[i];
    return L;
  };
  auto fd = [&](double& v) {
    const double h = 1e-5, saved = v;
    v = saved + h;
    const double lp = loss();
    v = saved - h;
    const double lm = loss();
    v = saved;
    return (lp - lm) / (2 * h);
  };
  for (int64_t i = 0; i < n; ++i) {
    const double fg = fd(g[i]), fu = fd(u[i]);
    EXPECT_NEAR(dg[i], fg, 1e-7 * (1 + std::abs(fg))) << "dg[" << i << "] at g=" << g[i];
    EXPECT_NEAR(du[i], fu, 1e-7 * (1 + std::abs(fu))) << "du[" << i << "] at g=" << g[i];
  }
}

}  // namespace fp
