// SwiGLU: forward and backward against the scalar reference at sizes around SIMD widths; finite and
// correct at |g| = 100 and beyond (Note [Stable sigmoid]); the same bits for any sub-range and thread
// count; the reference backward against finite differences; bf16 operands (alone and mixed with
// f32) against the f32 kernel on the widened values, rounded. Dimensions: n elements.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/kernels/ops.h"
#include "core/buf.h"
#include "core/error.h"
#include "core/rng.h"
#include "op_test.h"
#include "ops/ref/swiglu.h"
#include "ops/swiglu.h"

namespace fp {

namespace {

const std::vector<int64_t> kSizes = {1,  3,  7,  8,   9,   15,   16,   17,   31,   33,
                                     63, 64, 65, 127, 129, 1000, 8191, 8192, 8193, 20001};

}  // namespace

// Same float formula in both, but the kernel's polynomial exp is within 1 ulp of the reference's
// std::exp<float>; a 1-ulp difference in exp moves s by < 1 ulp, so results agree within a
// few eps relative: each output is a product, except 1 + g (1 - s) in dg, which cancels near
// g = -1.28 (where silu' = 0); its error is a few eps of 1 + |g (1 - s)|, so dg's tolerance is
// 8 eps |da u| s (1 + |g (1 - s)|).
TEST(Swiglu, MatchesReference) {
  uint64_t seed = 1;
  for (const int64_t n : kSizes) {
    Rng rng(seed++);
    const std::vector<float> g = op_test::random_vector<float>(n, rng, 3.0),
                             u = op_test::random_vector<float>(n, rng, 1.0);
    const std::vector<float> da = op_test::random_vector<float>(n, rng, 1.0);
    std::vector<float> a(n), a_ref(n), dg(n), dg_ref(n), du(n), du_ref(n);
    ops::cpu::swiglu_forward(g.data(), u.data(), a.data(), n);
    ops::ref::swiglu_forward<float>(g.data(), u.data(), a_ref.data(), n);
    EXPECT_TRUE(op_test::near("swiglu_forward", {n}, a, a_ref, op_test::tol_ulps(4, 1e-40)));
    ops::cpu::swiglu_backward(g.data(), u.data(), da.data(), dg.data(), du.data(), n);
    ops::ref::swiglu_backward<float>(g.data(), u.data(), da.data(), dg_ref.data(), du_ref.data(), n);
    EXPECT_TRUE(op_test::near("swiglu_backward du", {n}, du, du_ref, op_test::tol_ulps(4, 1e-40)));
    std::vector<double> dg_tol(n);
    for (int64_t i = 0; i < n; ++i) {
      const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(g[i])));
      dg_tol[i] = std::abs(static_cast<double>(da[i]) * u[i]) * s * (1.0 + std::abs(g[i] * (1.0 - s)));
      dg_tol[i] = 8 * FLT_EPSILON * dg_tol[i] + 1e-40;
    }
    EXPECT_TRUE(op_test::near("swiglu_backward dg", {n}, dg, dg_ref, op_test::tol_each(dg_tol)));
  }
}

// Large |g|: no inf or NaN, and the values the limits give: silu(g) -> g for g -> +inf, -> -0 for
// g -> -inf, silu'(g) -> 1 and -> 0. Checked against the double reference.
TEST(Swiglu, LargeGatesStayFinite) {
  const std::vector<float> g = {100.0f, -100.0f, 88.0f, -88.0f, 89.0f, -89.0f,
                                1e4f,   -1e4f,   1e30f, -1e30f, 20.0f, -20.0f};
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
    // Below g = -87 the kernel's exp is 0 (Note [Why SwiGLU has its own exp]) where the double one is
    // below 1.7e-38: an absolute error under |g u da| 1.7e-38 < 1e-34 here.
    EXPECT_NEAR(a[i], ad, 4e-7 * std::abs(ad) + 1e-34) << "a at g=" << g[i];
    EXPECT_NEAR(du[i], dud, 4e-7 * std::abs(dud) + 1e-34) << "du at g=" << g[i];
    EXPECT_NEAR(dg[i], dgd, 4e-6 * std::abs(dgd) + 1e-34) << "dg at g=" << g[i];
  }
  EXPECT_EQ(a[0], 150.0f);
  EXPECT_EQ(dg[0], 0.75f * 1.5f);
}

// A dense sweep of g over [-87, 30] with u = da = 1 against the double reference: the kernel's own exp
// (Note [Why SwiGLU has its own exp], within 1 ulp) plus the roundings of 1 + e, the division and
// two or three products keep a and du within 4 eps relative. dg also rounds 1 + g (1 - s), which
// cancels near g = -1.28, so it is held to 8 eps of s (1 + |g (1 - s)|).
TEST(Swiglu, DenseSweepAgainstDouble) {
  const int64_t n = 117001;
  std::vector<float> g(n), one(n, 1.0f), a(n), dg(n), du(n);
  for (int64_t i = 0; i < n; ++i) g[i] = static_cast<float>(-87.0 + 117.0 * static_cast<double>(i) / (n - 1));
  ops::cpu::swiglu_forward(g.data(), one.data(), a.data(), n);
  ops::cpu::swiglu_backward(g.data(), one.data(), one.data(), dg.data(), du.data(), n);
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double gd = g[i], s = 1.0 / (1.0 + std::exp(-gd)), silu = gd * s, dsilu = s * (1.0 + gd * (1.0 - s));
    const double tol = 4 * FLT_EPSILON * std::abs(silu);
    worst = std::max(worst, std::abs(a[i] - silu) / (FLT_EPSILON * std::abs(silu)));
    ASSERT_TRUE(std::abs(a[i] - silu) <= tol) << "a at g=" << g[i] << ": expected " << silu << ", got " << a[i];
    ASSERT_TRUE(std::abs(du[i] - silu) <= tol) << "du at g=" << g[i] << ": expected " << silu << ", got " << du[i];
    const double tol_dg = 8 * FLT_EPSILON * s * (1.0 + std::abs(gd * (1.0 - s)));
    ASSERT_TRUE(std::abs(dg[i] - dsilu) <= tol_dg) << "dg at g=" << g[i] << ": expected " << dsilu << ", got " << dg[i];
  }
  std::printf("swiglu a: worst relative error %.2f eps\n", worst);
}

// Element-wise with a padded 4-wide tail (Note [Why SwiGLU has its own exp]): an element gets the
// same bits whether it is computed in a long range, at an odd offset, or in a tail, and for 1 or 2
// threads.
TEST(Swiglu, SameBitsForAnyRangeAndThreads) {
  const int64_t n = 40003;
  Rng rng(8);
  const std::vector<float> g = op_test::random_vector<float>(n, rng, 5.0),
                           u = op_test::random_vector<float>(n, rng, 1.0);
  const std::vector<float> da = op_test::random_vector<float>(n, rng, 1.0);
  std::vector<float> a(n), dg(n), du(n);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  ops::cpu::swiglu_forward(g.data(), u.data(), a.data(), n);
  ops::cpu::swiglu_backward(g.data(), u.data(), da.data(), dg.data(), du.data(), n);
  omp_set_num_threads(1);
  for (const int64_t off : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{4097}}) {
    for (const int64_t len : {int64_t{1}, int64_t{3}, int64_t{5}, int64_t{8191}, n - off}) {
      std::vector<float> a2(len), dg2(len), du2(len);
      ops::cpu::swiglu_forward(g.data() + off, u.data() + off, a2.data(), len);
      ops::cpu::swiglu_backward(g.data() + off, u.data() + off, da.data() + off, dg2.data(), du2.data(), len);
      EXPECT_EQ(std::memcmp(a2.data(), a.data() + off, len * sizeof(float)), 0) << "a off=" << off << " len=" << len;
      EXPECT_EQ(std::memcmp(dg2.data(), dg.data() + off, len * sizeof(float)), 0) << "dg off=" << off << " len=" << len;
      EXPECT_EQ(std::memcmp(du2.data(), du.data() + off, len * sizeof(float)), 0) << "du off=" << off << " len=" << len;
    }
  }
  omp_set_num_threads(saved);
}

// L = q . swiglu_forward(g, u) in double; dL/dg, dL/du from the reference backward (da = q) against
// central differences. Step 1e-5: truncation ~h^2 |silu'''| ~ 1e-10.
TEST(Swiglu, ReferenceBackwardMatchesFiniteDifferences) {
  const int64_t n = 41;
  Rng rng(5);
  std::vector<double> g = op_test::random_vector<double>(n, rng, 4.0), u = op_test::random_vector<double>(n, rng, 1.0);
  const std::vector<double> q = op_test::random_vector<double>(n, rng, 1.0);
  std::vector<double> dg(n), du(n);
  ops::ref::swiglu_backward<double>(g.data(), u.data(), q.data(), dg.data(), du.data(), n);
  auto loss = [&] {
    std::vector<double> a(n);
    ops::ref::swiglu_forward<double>(g.data(), u.data(), a.data(), n);
    double L = 0;
    for (int64_t i = 0; i < n; ++i) L += q[i] * a[i];
    return L;
  };
  auto fd = [&](double& v) { return op_test::central_difference(v, loss); };
  for (int64_t i = 0; i < n; ++i) {
    const double fg = fd(g[i]), fu = fd(u[i]);
    EXPECT_NEAR(dg[i], fg, 1e-7 * (1 + std::abs(fg))) << "dg[" << i << "] at g=" << g[i];
    EXPECT_NEAR(du[i], fu, 1e-7 * (1 + std::abs(fu))) << "du[" << i << "] at g=" << g[i];
  }
}

namespace {

using op_test::kBF16;
using op_test::kF32;
using op_test::Operand;
using op_test::dt;
using op_test::same_bits;
using op_test::stored;

}  // namespace

// bf16 operands: every element is the f32 kernel's on the exactly widened inputs (its bits do not
// depend on where its range or chunk starts), rounded once: equal bits. The dtypes of (g, u, da) and
// (a, dg, du): all bf16, bf16 inputs with f32 outputs, and mixed; sizes around the 4-wide tail, the
// 256-element staging chunk, the 4096 work block and the 8192 parallel threshold (1 and 2 threads).
TEST(Swiglu, Bf16MatchesF32KernelOnWidenedValues) {
  const int saved = omp_get_max_threads();
  struct Case {
    DType g, u, da, out_a, dg, du;
  };
  const std::vector<Case> cases = {{kBF16, kBF16, kBF16, kBF16, kBF16, kBF16},
                                   {kBF16, kBF16, kBF16, kF32, kF32, kF32},
                                   {kF32, kBF16, kF32, kBF16, kF32, kBF16}};
  uint64_t seed = 400;
  for (const int64_t n : {1, 3, 5, 255, 256, 257, 259, 4095, 4097, 8191, 8193, 20001}) {
    for (const Case& c : cases) {
      Rng rng(seed++);
      const Operand g(c.g, op_test::random_vector<float>(n, rng, 3.0)), u(c.u, op_test::random_vector<float>(n, rng));
      const Operand da(c.da, op_test::random_vector<float>(n, rng));
      const std::vector<float> gw = g.values(), uw = u.values(), daw = da.values();
      std::vector<float> a_f(n), dg_f(n), du_f(n);
      ops::cpu::swiglu_forward(gw.data(), uw.data(), a_f.data(), n);
      ops::cpu::swiglu_backward(gw.data(), uw.data(), daw.data(), dg_f.data(), du_f.data(), n);
      for (const int t : {1, 2}) {
        omp_set_num_threads(t);
        const std::string where = " n=" + std::to_string(n) + " g " + dt(c.g) + " u " + dt(c.u) + " da " + dt(c.da) +
                                  " -> " + dt(c.out_a) + ", " + std::to_string(t) + " threads";
        Operand a(c.out_a, std::vector<float>(n)), dg(c.dg, std::vector<float>(n)), du(c.du, std::vector<float>(n));
        ops::cpu::swiglu_forward(g.cbuf(), u.cbuf(), a.buf(), n);
        ops::cpu::swiglu_backward(g.cbuf(), u.cbuf(), da.cbuf(), dg.buf(), du.buf(), n);
        EXPECT_TRUE(same_bits("swiglu_forward a" + where, a.values(), stored(c.out_a, a_f)));
        EXPECT_TRUE(same_bits("swiglu_backward dg" + where, dg.values(), stored(c.dg, dg_f)));
        EXPECT_TRUE(same_bits("swiglu_backward du" + where, du.values(), stored(c.du, du_f)));
      }
    }
  }
  omp_set_num_threads(saved);
}

// Operands other than f32 and bf16 are an internal error naming the kernel.
TEST(Swiglu, OtherDtypesAssert) {
  std::vector<float> g(8, 1.0f), a(8);
  EXPECT_THROW(ops::cpu::swiglu_forward(g.data(), g.data(), Buf(a.data(), DType::DType_F16), 8), InternalError);
  EXPECT_THROW(ops::cpu::swiglu_backward(CBuf(g.data(), DType::DType_I32), g.data(), g.data(), a.data(), a.data(), 8),
               InternalError);
}

}  // namespace fp
