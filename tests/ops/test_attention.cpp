// Causal grouped-query flash attention: the tiled cpu kernel against the scalar reference (forward o and
// lse, backward dq, dk, dv) at T around and across the 64-token tiles, several head groupings and head
// dims; the fast forward against the double reference; the double reference backward against central
// finite differences of its forward; bitwise determinism across thread counts and runs.
// Dimensions: B sequences, T tokens, nh query heads, nkv kv heads, hd head_dim.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/attention.h"
#include "ops/cpu/attention_tile.h"
#include "ops/ref/attention.h"

namespace fp {

namespace {

template <class T>
std::vector<T> random_vector(int64_t n, Rng& rng, double stddev = 1.0) {
  std::vector<T> v(n);
  for (T& x : v) {
    x = static_cast<T>(stddev * rng.normal());
    if (x == T(0)) x = T(0.5);
  }
  return v;
}

template <class T>
std::vector<T> converted(const std::vector<float>& x) {
  return std::vector<T>(x.begin(), x.end());
}

double rms(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s / static_cast<double>(x.size()));
}

// |got - want| <= rel * (|want| + rms(want)) element by element. The rms term is the magnitude of the
// tensor: an element that is small only through cancellation (a gradient summing terms of both signs)
// is judged by the size of the terms around it, not by its own near-zero value.
template <class W>
::testing::AssertionResult all_near(const std::vector<float>& got, const std::vector<W>& want, double rel,
                                    const std::string& what) {
  const std::vector<double> wd(want.begin(), want.end());
  const double mag = rms(wd);
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], w = wd[i];
    const double tol = rel * (std::abs(w) + mag);
    if (!std::isfinite(g) || !std::isfinite(w) || !(std::abs(g - w) <= tol)) {
      return ::testing::AssertionFailure() << what << " at element " << i << ": expected " << w << ", got " << g
                                           << " (tolerance " << tol << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

struct Case {
  int64_t B, T, nh, nkv, hd;
  std::string name() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " nh=" + std::to_string(nh) +
           " nkv=" + std::to_string(nkv) + " hd=" + std::to_string(hd);
  }
};

// Random inputs of one case: q is drawn wider than k so that the softmax is peaked and the running max
// of the online softmax moves between key tiles.
struct Inputs {
  std::vector<float> q, k, v, dout;
  float scale;
  Inputs(const Case& c, uint64_t seed) {
    Rng rng(seed);
    q = random_vector<float>(c.B * c.T * c.nh * c.hd, rng, 2.0);
    k = random_vector<float>(c.B * c.T * c.nkv * c.hd, rng);
    v = random_vector<float>(c.B * c.T * c.nkv * c.hd, rng);
    dout = random_vector<float>(c.B * c.T * c.nh * c.hd, rng);
    scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  }
};

struct Outputs {
  std::vector<float> o, lse, dq, dk, dv;
};

Outputs fast_run(const Case& c, const Inputs& in) {
  Outputs r{std::vector<float>(in.q.size()), std::vector<float>(c.B * c.nh * c.T), std::vector<float>(in.q.size()),
            std::vector<float>(in.k.size()), std::vector<float>(in.k.size())};
  ops::cpu::attention_forward(in.q.data(), in.k.data(), in.v.data(), r.o.data(), r.lse.data(), c.B, c.T, c.nh, c.nkv,
                              c.hd, in.scale);
  ops::cpu::attention_backward(in.q.data(), in.k.data(), in.v.data(), r.o.data(), r.lse.data(), in.dout.data(),
                               r.dq.data(), r.dk.data(), r.dv.data(), c.B, c.T, c.nh, c.nkv, c.hd, in.scale);
  return r;
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const int64_t B : {1, 2})
    for (const int64_t T : {1, 5, 63, 64, 65, 130, 200})
      for (const auto& [nh, nkv] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {4, 2}, {4, 1}, {6, 3}})
        for (const int64_t hd : {8, 16, 64, 24}) cases.push_back({B, T, nh, nkv, hd});
  return cases;
}

}  // namespace

static_assert(ops::cpu::kAttentionTileQ == 64 && ops::cpu::kAttentionTileK == 64,
              "the T values below straddle 64-token tiles; revisit them if the tiles change");

// Both sides are float. The kernel sums the scores in register blocks and the softmax over key tiles
// with rescaling, the reference in plain order: each score differs by a few eps * sum_d |q_d k_d| * scale
// (~1e-6 here, |scores| up to ~10), which moves every p by about that relative amount; o, and the
// gradients built from p, inherit it. 2e-5 of the magnitude leaves a margin of ~5x over the largest
// difference seen across these cases, while a wrong mask, a missing rescale or a dropped tile shows up
// at 1e-2 and above.
TEST(Attention, MatchesReference) {
  uint64_t seed = 1;
  for (const Case& c : all_cases()) {
    const Inputs in(c, seed++);
    const Outputs got = fast_run(c, in);
    std::vector<float> o(in.q.size()), lse(c.B * c.nh * c.T), dq(in.q.size()), dk(in.k.size()), dv(in.k.size());
    ops::ref::attention_forward<float>(in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data(), c.B, c.T, c.nh,
                                       c.nkv, c.hd, in.scale);
    // Both backwards from the same forward outputs, so that only the backward kernels are compared.
    ops::ref::attention_backward<float>(in.q.data(), in.k.data(), in.v.data(), got.o.data(), got.lse.data(),
                                        in.dout.data(), dq.data(), dk.data(), dv.data(), c.B, c.T, c.nh, c.nkv, c.hd,
                                        in.scale);
    const double rel = 2e-5;
    EXPECT_TRUE(all_near(got.o, o, rel, "o " + c.name()));
    EXPECT_TRUE(all_near(got.lse, lse, rel, "lse " + c.name()));
    EXPECT_TRUE(all_near(got.dq, dq, rel, "dq " + c.name()));
    EXPECT_TRUE(all_near(got.dk, dk, rel, "dk " + c.name()));
    EXPECT_TRUE(all_near(got.dv, dv, rel, "dv " + c.name()));
    if (::testing::Test::HasFailure()) return;  // one case's dump is enough
  }
}

// The float kernel against the exact (double) answer on float inputs: within 1e-5 of the magnitude, a few
// hundred eps, whatever the tile order did to the rounding.
TEST(Attention, ForwardMatchesDoubleReference) {
  uint64_t seed = 100;
  for (const Case& c : {Case{1, 200, 4, 2, 64}, Case{2, 130, 6, 3, 24}, Case{1, 65, 4, 1, 16}, Case{1, 257, 1, 1, 8}}) {
    const Inputs in(c, seed++);
    std::vector<float> o(in.q.size()), lse(c.B * c.nh * c.T);
    ops::cpu::attention_forward(in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data(), c.B, c.T, c.nh, c.nkv,
                                c.hd, in.scale);
    const std::vector<double> q = converted<double>(in.q), k = converted<double>(in.k), v = converted<double>(in.v);
    std::vector<double> od(o.size()), lsed(lse.size());
    ops::ref::attention_forward<double>(q.data(), k.data(), v.data(), od.data(), lsed.data(), c.B, c.T, c.nh, c.nkv,
                                        c.hd, static_cast<double>(in.scale));
    EXPECT_TRUE(all_near(o, od, 1e-5, "o vs double " + c.name()));
    EXPECT_TRUE(all_near(lse, lsed, 1e-5, "lse vs double " + c.name()));
  }
}

// L = sum w * o for a random w; the double reference backward with dout = w against central differences
// of the double reference forward. h = 1e-5: truncation ~h^2 * O(1) third derivatives and rounding
// ~1e-16 / h, both far under 1e-7.
TEST(Attention, ReferenceBackwardMatchesFiniteDifferences) {
  const Case c{2, 7, 4, 2, 5};
  Rng rng(7);
  std::vector<double> q = random_vector<double>(c.B * c.T * c.nh * c.hd, rng, 1.5);
  std::vector<double> k = random_vector<double>(c.B * c.T * c.nkv * c.hd, rng);
  std::vector<double> v = random_vector<double>(c.B * c.T * c.nkv * c.hd, rng);
  const std::vector<double> w = random_vector<double>(q.size(), rng);
  const double scale = 0.6;
  std::vector<double> o(q.size()), lse(c.B * c.nh * c.T);
  auto loss = [&] {
    ops::ref::attention_forward<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), c.B, c.T, c.nh, c.nkv,
                                        c.hd, scale);
    double L = 0;
    for (size_t i = 0; i < o.size(); ++i) L += w[i] * o[i];
    return L;
  };
  loss();
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
  ops::ref::attention_backward<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), w.data(), dq.data(),
                                       dk.data(), dv.data(), c.B, c.T, c.nh, c.nkv, c.hd, scale);
  auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
    for (size_t i = 0; i < x.size(); ++i) {
      const double h = 1e-5, saved = x[i];
      x[i] = saved + h;
      const double lp = loss();
      x[i] = saved - h;
      const double lm = loss();
      x[i] = saved;
      const double fd = (lp - lm) / (2 * h);
      ASSERT_TRUE(std::isfinite(grad[i]));
      ASSERT_NEAR(grad[i], fd, 1e-7 * (1 + std::abs(fd))) << name << "[" << i << "]";
    }
  };
  check(q, dq, "dq");
  check(k, dk, "dk");
  check(v, dv, "dv");
}

// The contract promises the same bits for any thread count (Note [Deterministic attention backward]).
TEST(Attention, BitwiseDeterministicAcrossThreadsAndRuns) {
  const int saved = omp_get_max_threads();
  for (const Case& c : {Case{2, 200, 4, 2, 24}, Case{1, 130, 6, 3, 64}}) {
    const Inputs in(c, 42);
    omp_set_num_threads(1);
    const Outputs one = fast_run(c, in);
    omp_set_num_threads(2);
    const Outputs two = fast_run(c, in);
    const Outputs again = fast_run(c, in);
    for (const Outputs* other : {&two, &again}) {
      EXPECT_EQ(0, std::memcmp(one.o.data(), other->o.data(), one.o.size() * sizeof(float))) << "o " << c.name();
      EXPECT_EQ(0, std::memcmp(one.lse.data(), other->lse.data(), one.lse.size() * sizeof(float))) << c.name();
      EXPECT_EQ(0, std::memcmp(one.dq.data(), other->dq.data(), one.dq.size() * sizeof(float))) << "dq " << c.name();
      EXPECT_EQ(0, std::memcmp(one.dk.data(), other->dk.data(), one.dk.size() * sizeof(float))) << "dk " << c.name();
      EXPECT_EQ(0, std::memcmp(one.dv.data(), other->dv.data(), one.dv.size() * sizeof(float))) << "dv " << c.name();
    }
  }
  omp_set_num_threads(saved);
}

// Note [Attention tiles with AVX2]: the AVX2 copy of the tile product equals the SSE2 one bit for bit
// (no fused multiply-add), on the tile shapes the kernels use and with accumulation into C.
TEST(Attention, Avx2TileProductEqualsBaselineBitwise) {
#if !FP_ATTENTION_TILE_AVX2
  GTEST_SKIP() << "not an x86 build";
#else
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "this CPU has no AVX2";
  namespace at = ops::cpu::attention_tile;
  Rng rng(17);
  for (const auto& [M, N, K] : std::vector<std::array<int64_t, 3>>{{at::TQ, at::TK, 8}, {at::TQ, 24, at::TK},
                                                                 {at::TK, 64, at::TQ}, {4, 8, 1}, {at::TQ, at::TK, 136}}) {
    std::vector<float> A(M * K), B(K * N), C0(M * N), C1;
    for (float& x : A) x = static_cast<float>(rng.normal());
    for (float& x : B) x = static_cast<float>(rng.normal());
    for (float& x : C0) x = static_cast<float>(rng.normal());
    C1 = C0;
    at::tile_gemm_baseline(A.data(), K, B.data(), N, C0.data(), N, M, N, K);
    at::tile_gemm_avx2(A.data(), K, B.data(), N, C1.data(), N, M, N, K);
    EXPECT_EQ(std::memcmp(C0.data(), C1.data(), C0.size() * sizeof(float)), 0) << M << "x" << N << "x" << K;
  }
#endif
}

// Note [Exponentials in vector registers]: exp_inplace against exp in double, over every float in
// [-87.3, 88] at a stride and on the cut-offs: relative error below 1.2e-7 (one ulp; 8e-8 measured); 0 below the
// subnormal range, +inf above 88, NaN kept, exp(0) = 1 exactly. Both copies (SSE2, AVX2) agree bit for bit.
TEST(Attention, VectorExpMatchesExpWithinOneUlp) {
  namespace at = ops::cpu::attention_tile;
  std::vector<float> xs;
  for (double v = -87.3; v <= 88.0; v += 0.0137) xs.push_back(static_cast<float>(v));
  for (float v = -1.0f; v <= 1.0f; v += 1.0f / 1024) xs.push_back(v);  // around r = 0 and the rounding edges
  const size_t n_regular = xs.size();
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {-88.0f, -100.0f, -inf, 88.5f, inf, std::nanf("")}) xs.push_back(v);
  std::vector<float> y = xs;
  at::exp_inplace_baseline(y.data(), static_cast<int64_t>(y.size()));
  double worst = 0;
  for (size_t i = 0; i < n_regular; ++i) {
    const double ref = std::exp(static_cast<double>(xs[i]));
    worst = std::max(worst, std::abs(y[i] - ref) / ref);
  }
  EXPECT_LT(worst, 1.2e-7);
  std::printf("exp_inplace: max relative error %.3g over %zu points\n", worst, n_regular);
  const float zero = 0.0f, one = 1.0f;
  std::vector<float> z{zero};
  at::exp_inplace_baseline(z.data(), 1);
  EXPECT_EQ(z[0], one);
  EXPECT_EQ(y[n_regular + 0], 0.0f);  // -88: below the normal range
  EXPECT_EQ(y[n_regular + 1], 0.0f);
  EXPECT_EQ(y[n_regular + 2], 0.0f);
  EXPECT_EQ(y[n_regular + 3], inf);
  EXPECT_EQ(y[n_regular + 4], inf);
  EXPECT_TRUE(std::isnan(y[n_regular + 5]));
#if FP_ATTENTION_TILE_AVX2
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) {
    std::vector<float> y2 = xs;
    at::exp_inplace_avx2(y2.data(), static_cast<int64_t>(y2.size()));
    EXPECT_EQ(std::memcmp(y.data(), y2.data(), y.size() * sizeof(float)), 0);
  }
#endif
}

// The attention kernels (forward and backward, whole causal sequence) with the SSE2 and the AVX2 tile
// products, interleaved in one process: median seconds of 7 and the ratio. Results are bit-identical
// (Avx2TileProductEqualsBaselineBitwise). Run: build/tests/ops_test_attention --gtest_also_run_disabled_tests
//   --gtest_filter='*BenchAvx2*'
TEST(Attention, DISABLED_BenchAvx2VsBaseline) {
  namespace at = ops::cpu::attention_tile;
  if (!at::uses_avx2()) GTEST_SKIP() << "no AVX2 (or FLATPEAK_SIMD=baseline)";
  for (const Case& c : {Case{1, 2048, 8, 2, 64}, Case{1, 2048, 8, 2, 128}}) {
    const Inputs in(c, 3);
    std::vector<double> t[2];
    Outputs out[2];
    for (int rep = 0; rep < 7; ++rep)
      for (int v = 0; v < 2; ++v) {
        at::avx2_enabled = v == 1;
        const auto t0 = std::chrono::steady_clock::now();
        out[v] = fast_run(c, in);
        t[v].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    at::avx2_enabled = at::uses_avx2();
    for (auto& x : t) std::sort(x.begin(), x.end());
    EXPECT_EQ(std::memcmp(out[0].dq.data(), out[1].dq.data(), out[0].dq.size() * sizeof(float)), 0);
    std::printf("attention fwd+bwd %s, %d threads: sse2 %.4f s, avx2 %.4f s, ratio %.2fx\n", c.name().c_str(),
                omp_get_max_threads(), t[0][3], t[1][3], t[0][3] / t[1][3]);
  }
}

}  // namespace fp
