// Causal grouped-query flash attention: the tiled cpu kernel against the scalar reference (forward o and
// lse, backward dq, dk, dv) at T around and across the 64-token tiles, several head groupings and head
// dims; the fast forward against the double reference; the double reference backward against central
// finite differences of its forward; bitwise determinism across thread counts and runs; value heads of
// another width than the query/key heads (hdv != hd, Note [Value heads of their own width]).
// Dimensions: B sequences, T tokens, nh query heads, nkv kv heads, hd the query/key head width, hdv the
// value/output head width.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/kernels/attention_tile.h"
#include "backend/cpu/kernels/ops.h"
#include "core/buf.h"
#include "core/error.h"
#include "core/rng.h"
#include "op_test.h"
#include "ops/attention.h"
#include "ops/gemm.h"
#include "ops/ref/attention.h"

namespace fp {

namespace {

struct Case {
  int64_t B, T, nh, nkv, hd;
  int64_t hdv = 0;  // the value/output head width; 0: hd
  int64_t vd() const { return hdv > 0 ? hdv : hd; }
  std::string name() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " nh=" + std::to_string(nh) +
           " nkv=" + std::to_string(nkv) + " hd=" + std::to_string(hd) +
           (vd() != hd ? " hdv=" + std::to_string(vd()) : "");
  }
};

// Random inputs of one case: q is drawn wider than k so that the softmax is peaked and the running max
// of the online softmax moves between key tiles.
struct Inputs {
  std::vector<float> q, k, v, dout;
  float scale;
  Inputs(const Case& c, uint64_t seed) {
    Rng rng(seed);
    q = op_test::random_vector<float>(c.B * c.T * c.nh * c.hd, rng, 2.0);
    k = op_test::random_vector<float>(c.B * c.T * c.nkv * c.hd, rng);
    v = op_test::random_vector<float>(c.B * c.T * c.nkv * c.vd(), rng);
    dout = op_test::random_vector<float>(c.B * c.T * c.nh * c.vd(), rng);
    scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  }
};

struct Outputs {
  std::vector<float> o, lse, dq, dk, dv;
};

// The cpu kernels, forward then backward, with a sliding window (0: causal).
Outputs fast_run(const Case& c, const Inputs& in, int64_t window = 0) {
  Outputs r{std::vector<float>(in.dout.size()), std::vector<float>(c.B * c.nh * c.T), std::vector<float>(in.q.size()),
            std::vector<float>(in.k.size()), std::vector<float>(in.v.size())};
  ops::cpu::attention_forward(in.q.data(), in.k.data(), in.v.data(), r.o.data(), r.lse.data(),
                              ops::attention_spec(c.B, c.T, c.nh, c.nkv, c.hd, c.vd(), in.scale, window));
  ops::cpu::attention_backward(in.q.data(), in.k.data(), in.v.data(), r.o.data(), r.lse.data(), in.dout.data(),
                               r.dq.data(), r.dk.data(), r.dv.data(),
                               ops::attention_spec(c.B, c.T, c.nh, c.nkv, c.hd, c.vd(), in.scale, window));
  return r;
}

// Both float: the cpu kernels (forward o, lse; backward dq, dk, dv) against the float reference, the
// reference backward from the kernel's forward outputs so that only the backward kernels are compared.
// Tolerance: Attention.MatchesReference.
void expect_matches_reference(const Case& c, const Inputs& in, int64_t window) {
  const Outputs got = fast_run(c, in, window);
  std::vector<float> o(in.dout.size()), lse(c.B * c.nh * c.T), dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
  ops::ref::attention_forward<float>(in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data(), c.B, c.T, c.nh, c.nkv,
                                     c.hd, c.vd(), in.scale, window);
  ops::ref::attention_backward<float>(in.q.data(), in.k.data(), in.v.data(), got.o.data(), got.lse.data(),
                                      in.dout.data(), dq.data(), dk.data(), dv.data(), c.B, c.T, c.nh, c.nkv, c.hd,
                                      c.vd(), in.scale, window);
  const std::string l = c.name() + " window=" + std::to_string(window);
  const double rel = 2e-5;
  EXPECT_TRUE(op_test::near("o " + l, got.o, o, op_test::tol_near_rms(rel, o)));
  EXPECT_TRUE(op_test::near("lse " + l, got.lse, lse, op_test::tol_near_rms(rel, lse)));
  EXPECT_TRUE(op_test::near("dq " + l, got.dq, dq, op_test::tol_near_rms(rel, dq)));
  EXPECT_TRUE(op_test::near("dk " + l, got.dk, dk, op_test::tol_near_rms(rel, dk)));
  EXPECT_TRUE(op_test::near("dv " + l, got.dv, dv, op_test::tol_near_rms(rel, dv)));
}

// The cpu kernels (float) against the double reference on the same float inputs, forward and backward:
// within 1e-5 of the magnitude (the bound of ForwardMatchesDoubleReference and
// SlidingWindowMatchesDoubleReference).
void expect_matches_double_reference(const Case& c, const Inputs& in, int64_t window) {
  const Outputs got = fast_run(c, in, window);
  const std::vector<double> q = op_test::converted<double>(in.q), k = op_test::converted<double>(in.k),
                            v = op_test::converted<double>(in.v);
  const std::vector<double> dout = op_test::converted<double>(in.dout);
  std::vector<double> o(dout.size()), lse(c.B * c.nh * c.T), dq(q.size()), dk(k.size()), dv(v.size());
  const double scale = in.scale;
  ops::ref::attention_forward<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), c.B, c.T, c.nh, c.nkv, c.hd,
                                      c.vd(), scale, window);
  ops::ref::attention_backward<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(),
                                       dk.data(), dv.data(), c.B, c.T, c.nh, c.nkv, c.hd, c.vd(), scale, window);
  const std::string l = c.name() + " window=" + std::to_string(window);
  EXPECT_TRUE(op_test::near("o vs double " + l, got.o, o, op_test::tol_near_rms(1e-5, o)));
  EXPECT_TRUE(op_test::near("lse vs double " + l, got.lse, lse, op_test::tol_near_rms(1e-5, lse)));
  EXPECT_TRUE(op_test::near("dq vs double " + l, got.dq, dq, op_test::tol_near_rms(1e-5, dq)));
  EXPECT_TRUE(op_test::near("dk vs double " + l, got.dk, dk, op_test::tol_near_rms(1e-5, dk)));
  EXPECT_TRUE(op_test::near("dv vs double " + l, got.dv, dv, op_test::tol_near_rms(1e-5, dv)));
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
                                       c.nkv, c.hd, c.hd, in.scale, 0);
    // Both backwards from the same forward outputs, so that only the backward kernels are compared.
    ops::ref::attention_backward<float>(in.q.data(), in.k.data(), in.v.data(), got.o.data(), got.lse.data(),
                                        in.dout.data(), dq.data(), dk.data(), dv.data(), c.B, c.T, c.nh, c.nkv, c.hd,
                                        c.hd, in.scale, 0);
    const double rel = 2e-5;
    EXPECT_TRUE(op_test::near("o " + c.name(), got.o, o, op_test::tol_near_rms(rel, o)));
    EXPECT_TRUE(op_test::near("lse " + c.name(), got.lse, lse, op_test::tol_near_rms(rel, lse)));
    EXPECT_TRUE(op_test::near("dq " + c.name(), got.dq, dq, op_test::tol_near_rms(rel, dq)));
    EXPECT_TRUE(op_test::near("dk " + c.name(), got.dk, dk, op_test::tol_near_rms(rel, dk)));
    EXPECT_TRUE(op_test::near("dv " + c.name(), got.dv, dv, op_test::tol_near_rms(rel, dv)));
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
    ops::cpu::attention_forward(in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data(),
                                ops::attention_spec(c.B, c.T, c.nh, c.nkv, c.hd, c.hd, in.scale, 0));
    const std::vector<double> q = op_test::converted<double>(in.q), k = op_test::converted<double>(in.k),
                              v = op_test::converted<double>(in.v);
    std::vector<double> od(o.size()), lsed(lse.size());
    ops::ref::attention_forward<double>(q.data(), k.data(), v.data(), od.data(), lsed.data(), c.B, c.T, c.nh, c.nkv,
                                        c.hd, c.hd, static_cast<double>(in.scale), 0);
    EXPECT_TRUE(op_test::near("o vs double " + c.name(), o, od, op_test::tol_near_rms(1e-5, od)));
    EXPECT_TRUE(op_test::near("lse vs double " + c.name(), lse, lsed, op_test::tol_near_rms(1e-5, lsed)));
  }
}

namespace {

// L = sum w * o for a random w; the double reference backward with dout = w against central differences
// of the double reference forward, with the sliding window `window` (0: causal). h = 1e-5: truncation
// ~h^2 * O(1) third derivatives and rounding ~1e-16 / h, both far under 1e-7.
void expect_reference_backward_matches_finite_differences(const Case& c, uint64_t seed, int64_t window) {
  Rng rng(seed);
  std::vector<double> q = op_test::random_vector<double>(c.B * c.T * c.nh * c.hd, rng, 1.5);
  std::vector<double> k = op_test::random_vector<double>(c.B * c.T * c.nkv * c.hd, rng);
  std::vector<double> v = op_test::random_vector<double>(c.B * c.T * c.nkv * c.vd(), rng);
  const std::vector<double> w = op_test::random_vector<double>(c.B * c.T * c.nh * c.vd(), rng);
  const double scale = 0.6;
  std::vector<double> o(w.size()), lse(c.B * c.nh * c.T);
  auto loss = [&] {
    ops::ref::attention_forward<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), c.B, c.T, c.nh, c.nkv, c.hd,
                                        c.vd(), scale, window);
    double L = 0;
    for (size_t i = 0; i < o.size(); ++i) L += w[i] * o[i];
    return L;
  };
  loss();
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
  ops::ref::attention_backward<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), w.data(), dq.data(),
                                       dk.data(), dv.data(), c.B, c.T, c.nh, c.nkv, c.hd, c.vd(), scale, window);
  auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
    for (size_t i = 0; i < x.size(); ++i) {
      const double fd = op_test::central_difference(x[i], loss);
      ASSERT_TRUE(std::isfinite(grad[i])) << name << "[" << i << "] " << c.name();
      ASSERT_NEAR(grad[i], fd, 1e-7 * (1 + std::abs(fd))) << name << "[" << i << "] " << c.name();
    }
  };
  check(q, dq, "dq");
  check(k, dk, "dk");
  check(v, dv, "dv");
}

}  // namespace

TEST(Attention, ReferenceBackwardMatchesFiniteDifferences) {
  expect_reference_backward_matches_finite_differences(Case{2, 7, 4, 2, 5}, 7, 0);
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
  for (const auto& [M, N, K] : std::vector<std::array<int64_t, 3>>{
           {at::TQ, at::TK, 8}, {at::TQ, 24, at::TK}, {at::TK, 64, at::TQ}, {4, 8, 1}, {at::TQ, at::TK, 136}}) {
    std::vector<float> A(M * K), B(K * N), C0(M * N), C1;
    for (float& x : A) x = static_cast<float>(rng.normal());
    for (float& x : B) x = static_cast<float>(rng.normal());
    for (float& x : C0) x = static_cast<float>(rng.normal());
    C1 = C0;
    at::tile_gemm_baseline(A.data(), K, B.data(), N, C0.data(), N, M, N, K);
    at::tile_gemm_avx2(A.data(), K, B.data(), N, C1.data(), N, M, N, K);
    EXPECT_EQ(std::memcmp(C0.data(), C1.data(), C0.size() * sizeof(float)), 0) << M << "x" << N << "x" << K;
    // The transposed-A products on the same numbers (A read as stored (K, M)).
    std::vector<float> D0 = C1, D1 = C1;
    at::tile_gemm_at_baseline(A.data(), M, B.data(), N, D0.data(), N, M, N, K);
    at::tile_gemm_at_avx2(A.data(), M, B.data(), N, D1.data(), N, M, N, K);
    EXPECT_EQ(std::memcmp(D0.data(), D1.data(), D0.size() * sizeof(float)), 0) << "A^T " << M << "x" << N << "x" << K;
  }
#endif
}

// Note [Transposed tile loads in 8 x 8 blocks]: the AVX2 loader fills the transposed tile exactly as
// the scalar loop does (zero padding included), f32 and bf16 storage, full and ragged row and column
// counts, rows wider than the head.
TEST(Attention, TransposedTileLoadEqualsScalarLoop) {
#if !FP_ATTENTION_TILE_AVX2
  GTEST_SKIP() << "not an x86 build";
#else
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "this CPU has no AVX2";
  namespace at = ops::cpu::attention_tile;
  Rng rng(29);
  for (const auto& [n, w] : std::vector<std::array<int64_t, 2>>{
           {at::TK, 64}, {at::TK, 40}, {63, 64}, {8, 8}, {5, 13}, {17, 7}, {0, 16}, {at::TK, 130}}) {
    const int64_t stride = w + 3, wp = at::hd_padded(w);
    const std::vector<float> f = op_test::random_vector(std::max<int64_t>(n, 1) * stride, rng);
    const std::vector<bf16> h = op_test::rounded_bf16(f);
    std::vector<float> a(wp * at::TK, 7.0f), b(wp * at::TK, -3.0f);
    at::rows_load_transposed_scalar(a.data(), f.data(), stride, n, w, wp);
    at::rows_load_transposed_avx2(b.data(), f.data(), stride, n, w, wp);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "f32 n=" << n << " w=" << w;
    at::rows_load_transposed_scalar(a.data(), h.data(), stride, n, w, wp);
    at::rows_load_transposed_avx2(b.data(), h.data(), stride, n, w, wp);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "bf16 n=" << n << " w=" << w;
  }
#endif
}

// Note [Tile products with FMA]: the FMA copy equals, bit for bit, the scalar loop c = fma(a, b, c) over
// k in order, on the tile shapes the kernels use (N a multiple of 16, and N % 16 == 8 for the last
// block), with accumulation into C and leading dimensions wider than the block; and it differs from the
// unfused copy (else the test would not tell them apart) by no more than the unfused rounding allows.
TEST(Attention, FmaTileProductEqualsScalarFmaLoopBitwise) {
#if !FP_ATTENTION_TILE_AVX2
  GTEST_SKIP() << "not an x86 build";
#else
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) GTEST_SKIP() << "this CPU has no AVX2 + FMA";
  namespace at = ops::cpu::attention_tile;
  Rng rng(23);
  int64_t differ = 0, avx512_shapes = 0;
  const bool avx512 = ops::cpu::cpu_features().simd_class() == "avx512";
  for (const auto& [M, N, K, pad] : std::vector<std::array<int64_t, 4>>{{at::TQ, at::TK, 8, 0},
                                                                        {at::TQ, 24, at::TK, 0},
                                                                        {at::TK, 64, at::TQ, 8},
                                                                        {4, 8, 1, 0},
                                                                        {8, 40, 72, 16},
                                                                        {at::TQ, at::TK, 136, 0},
                                                                        {8, 56, 24, 8},
                                                                        {12, 48, 9, 0}}) {
    const int64_t lda = K + pad, ldb = N + pad, ldc = N + pad;
    std::vector<float> A(M * lda), B(K * ldb), C0(M * ldc), C1, C2, C3;
    for (float& x : A) x = static_cast<float>(rng.normal());
    for (float& x : B) x = static_cast<float>(rng.normal());
    for (float& x : C0) x = static_cast<float>(rng.normal());
    C1 = C0, C2 = C0, C3 = C0;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j)
        for (int64_t k = 0; k < K; ++k) C0[i * ldc + j] = std::fma(A[i * lda + k], B[k * ldb + j], C0[i * ldc + j]);
    at::tile_gemm_fma(A.data(), lda, B.data(), ldb, C1.data(), ldc, M, N, K);
    at::tile_gemm_baseline(A.data(), lda, B.data(), ldb, C2.data(), ldc, M, N, K);
    EXPECT_EQ(std::memcmp(C0.data(), C1.data(), C0.size() * sizeof(float)), 0) << M << "x" << N << "x" << K;
    // The transposed-A copy: A stored (K, M) with leading dimension M + pad, on the same numbers.
    std::vector<float> At(K * (M + pad)), T0 = C2, T1 = C2;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t k = 0; k < K; ++k) At[k * (M + pad) + i] = A[i * lda + k];
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j)
        for (int64_t k = 0; k < K; ++k) T0[i * ldc + j] = std::fma(A[i * lda + k], B[k * ldb + j], T0[i * ldc + j]);
    at::tile_gemm_fma<true>(At.data(), M + pad, B.data(), ldb, T1.data(), ldc, M, N, K);
    EXPECT_EQ(std::memcmp(T0.data(), T1.data(), T0.size() * sizeof(float)), 0) << "A^T " << M << "x" << N << "x" << K;
    // Note [Tile products with AVX-512]: the same chains in zmm registers, the same bits.
    if (avx512) {
      std::vector<float> T3 = C2;
      at::tile_gemm_avx512(A.data(), lda, B.data(), ldb, C3.data(), ldc, M, N, K);
      at::tile_gemm_avx512<true>(At.data(), M + pad, B.data(), ldb, T3.data(), ldc, M, N, K);
      EXPECT_EQ(std::memcmp(C0.data(), C3.data(), C0.size() * sizeof(float)), 0)
          << "avx512 " << M << "x" << N << "x" << K;
      EXPECT_EQ(std::memcmp(T0.data(), T3.data(), T0.size() * sizeof(float)), 0)
          << "avx512 A^T " << M << "x" << N << "x" << K;
      ++avx512_shapes;
    }
    for (size_t i = 0; i < C1.size(); ++i) {
      differ += C1[i] != C2[i];
      EXPECT_NEAR(C1[i], C2[i], 1e-5 * (K + 1)) << M << "x" << N << "x" << K << " at " << i;
    }
  }
  EXPECT_GT(differ, 0) << "the fused and unfused copies gave the same bits everywhere";
  std::printf("avx512 copy checked on %lld shapes%s\n", static_cast<long long>(avx512_shapes),
              avx512 ? "" : " (this CPU has no AVX-512)");
#endif
}

// Note [Tile products with AVX-512]: the attention kernels, forward and backward, give the same bits under
// the avx512 and the fma copies (head widths whose padded rows end in a 32-, 16- and 8-column block, with
// and without a window), and each is deterministic: the level changes speed only.
TEST(Attention, Avx512KernelsEqualFmaKernelsBitwise) {
  namespace at = ops::cpu::attention_tile;
  if (at::tile_simd != ops::cpu::SimdLevel::avx512) GTEST_SKIP() << "the avx512 tiles do not run here";
  for (const auto& [c, window] : std::vector<std::pair<Case, int64_t>>{
           {Case{1, 200, 4, 2, 64}, 0}, {Case{2, 130, 6, 3, 24}, 0}, {Case{1, 150, 4, 1, 40}, 70}}) {
    const Inputs in(c, 31);
    at::tile_simd = ops::cpu::SimdLevel::fma;
    const Outputs f = fast_run(c, in, window);
    at::tile_simd = ops::cpu::SimdLevel::avx512;
    const Outputs z = fast_run(c, in, window);
    const std::string l = c.name() + " window=" + std::to_string(window);
    EXPECT_EQ(0, std::memcmp(f.o.data(), z.o.data(), f.o.size() * sizeof(float))) << l;
    EXPECT_EQ(0, std::memcmp(f.lse.data(), z.lse.data(), f.lse.size() * sizeof(float))) << l;
    EXPECT_EQ(0, std::memcmp(f.dq.data(), z.dq.data(), f.dq.size() * sizeof(float))) << l;
    EXPECT_EQ(0, std::memcmp(f.dk.data(), z.dk.data(), f.dk.size() * sizeof(float))) << l;
    EXPECT_EQ(0, std::memcmp(f.dv.data(), z.dv.data(), f.dv.size() * sizeof(float))) << l;
  }
}

// Note [Exponentials in vector registers]: exp_inplace against exp in double, over every float in
// [-87.3, 88] at a stride and on the cut-offs: relative error below 1.2e-7 (one ulp; 8e-8 measured); 0 below the
// subnormal range, +inf above 88, NaN kept, exp(0) = 1 exactly. The SSE2 and AVX2 copies agree bit for bit;
// the FMA copy is held to the same bound and cut-offs.
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
  // The fused copy (Note [Tile products with FMA]): its own bits, held to the same bound and cut-offs.
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    std::vector<float> y3 = xs;
    at::exp_inplace_fma(y3.data(), static_cast<int64_t>(y3.size()));
    double worst3 = 0;
    size_t differ = 0;
    for (size_t i = 0; i < n_regular; ++i) {
      worst3 = std::max(worst3, std::abs(y3[i] - std::exp(static_cast<double>(xs[i]))) / std::exp(double{xs[i]}));
      differ += y3[i] != y[i];
    }
    EXPECT_LT(worst3, 1.2e-7);
    std::printf("exp_inplace (fma): max relative error %.3g; %zu of %zu differ from the unfused copy\n", worst3, differ,
                n_regular);
    for (size_t i = n_regular; i < y.size(); ++i)
      EXPECT_TRUE(y3[i] == y[i] || (std::isnan(y3[i]) && std::isnan(y[i]))) << xs[i];
    std::vector<float> z3{zero};
    at::exp_inplace_fma(z3.data(), 1);
    EXPECT_EQ(z3[0], one);
    // Note [Tile products with AVX-512]: the FMA copy's loop in 16 lanes, the same bits (cut-offs included).
    if (ops::cpu::cpu_features().simd_class() == "avx512") {
      std::vector<float> y4 = xs;
      at::exp_inplace_avx512(y4.data(), static_cast<int64_t>(y4.size()));
      for (size_t i = 0; i < y.size(); ++i)
        EXPECT_TRUE(std::memcmp(&y4[i], &y3[i], sizeof(float)) == 0 || (std::isnan(y4[i]) && std::isnan(y3[i])))
            << xs[i];
    }
  }
#endif
}

// Sliding window (ops/attention.h): query i sees keys (i - w, i]. The float kernels against the double
// reference on the same float inputs, forward and backward, within the bound the causal kernels are held
// to (ForwardMatchesDoubleReference; AttentionBlock.RingMatchesDoubleReference for the gradients):
// 1e-5 of the magnitude. Windows: 1 (each query sees only itself: o = v), under a tile, exactly a tile,
// not a multiple of the tile, spanning several tiles, T - 1, and T or more (nothing masked); T across
// several 64-token tiles, with and without GQA.
TEST(Attention, SlidingWindowMatchesDoubleReference) {
  uint64_t seed = 600;
  for (const Case& c :
       {Case{1, 300, 4, 2, 64}, Case{2, 200, 6, 3, 24}, Case{1, 257, 4, 1, 16}, Case{1, 130, 2, 2, 8}}) {
    const Inputs in(c, seed++);
    const std::vector<double> q = op_test::converted<double>(in.q), k = op_test::converted<double>(in.k),
                              v = op_test::converted<double>(in.v);
    const std::vector<double> dout = op_test::converted<double>(in.dout);
    for (const int64_t window :
         {int64_t{1}, int64_t{17}, int64_t{64}, int64_t{100}, int64_t{150}, c.T - 1, c.T, c.T + 40}) {
      const Outputs got = fast_run(c, in, window);
      std::vector<double> o(q.size()), lse(c.B * c.nh * c.T), dq(q.size()), dk(k.size()), dv(k.size());
      const double scale = in.scale;
      ops::ref::attention_forward<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), c.B, c.T, c.nh, c.nkv,
                                          c.hd, c.hd, scale, window);
      ops::ref::attention_backward<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(),
                                           dk.data(), dv.data(), c.B, c.T, c.nh, c.nkv, c.hd, c.hd, scale, window);
      const std::string l = c.name() + " window=" + std::to_string(window);
      EXPECT_TRUE(op_test::near("o vs double " + l, got.o, o, op_test::tol_near_rms(1e-5, o)));
      EXPECT_TRUE(op_test::near("lse vs double " + l, got.lse, lse, op_test::tol_near_rms(1e-5, lse)));
      EXPECT_TRUE(op_test::near("dq vs double " + l, got.dq, dq, op_test::tol_near_rms(1e-5, dq)));
      EXPECT_TRUE(op_test::near("dk vs double " + l, got.dk, dk, op_test::tol_near_rms(1e-5, dk)));
      EXPECT_TRUE(op_test::near("dv vs double " + l, got.dv, dv, op_test::tol_near_rms(1e-5, dv)));
      if (window == 1) {  // each query attends to itself alone: o is its own value row
        for (int64_t b = 0; b < c.B; ++b)
          for (int64_t t = 0; t < c.T; ++t)
            for (int64_t h = 0; h < c.nh; ++h)
              for (int64_t d = 0; d < c.hd; ++d)
                ASSERT_NEAR(got.o[((b * c.T + t) * c.nh + h) * c.hd + d],
                            in.v[((b * c.T + t) * c.nkv + h / (c.nh / c.nkv)) * c.hd + d], 1e-6)
                    << l;
      }
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// A window of T or more masks nothing: the same tiles, the same loops, the same bits as window = 0
// (Note [Sliding-window bands], backend/cpu/kernels/attention_tile.h); T - 1 does mask (the first key of the last
// query), so it must differ.
TEST(Attention, WindowOfTOrMoreIsCausalBitwise) {
  for (const Case& c : {Case{2, 200, 4, 2, 24}, Case{1, 130, 6, 3, 64}, Case{1, 64, 1, 1, 8}, Case{1, 1, 2, 1, 16}}) {
    const Inputs in(c, 77);
    const Outputs causal = fast_run(c, in, 0);
    for (const int64_t window : {c.T, c.T + 1, int64_t{1} << 40}) {
      const Outputs got = fast_run(c, in, window);
      const std::string l = c.name() + " window=" + std::to_string(window);
      EXPECT_EQ(0, std::memcmp(got.o.data(), causal.o.data(), got.o.size() * sizeof(float))) << "o " << l;
      EXPECT_EQ(0, std::memcmp(got.lse.data(), causal.lse.data(), got.lse.size() * sizeof(float))) << "lse " << l;
      EXPECT_EQ(0, std::memcmp(got.dq.data(), causal.dq.data(), got.dq.size() * sizeof(float))) << "dq " << l;
      EXPECT_EQ(0, std::memcmp(got.dk.data(), causal.dk.data(), got.dk.size() * sizeof(float))) << "dk " << l;
      EXPECT_EQ(0, std::memcmp(got.dv.data(), causal.dv.data(), got.dv.size() * sizeof(float))) << "dv " << l;
    }
    if (c.T > 1) {
      const Outputs narrower = fast_run(c, in, c.T - 1);
      EXPECT_NE(0, std::memcmp(narrower.o.data(), causal.o.data(), causal.o.size() * sizeof(float))) << c.name();
    }
  }
}

// Value heads of another width than the query/key heads (Note [Value heads of their own width],
// ops/attention.h): q, k of hd columns, v, o, dO, dV of hdv. The kernels against the float reference as in
// MatchesReference (same 2e-5), causal and with a window, at T around and across the tiles: hdv < hd (24 /
// 16, DeepSeek-V3's 192 / 128 with nh = nkv), hdv > hd with GQA (16 / 40, 8 / 64), widths that are not
// multiples of the 8-column register block (5 / 3, 5 / 13), one token.
TEST(Attention, ValueWidthMatchesReference) {
  uint64_t seed = 1000;
  for (const Case& c : {Case{1, 130, 4, 2, 24, 16}, Case{2, 65, 4, 1, 24, 16}, Case{1, 200, 2, 2, 192, 128},
                        Case{2, 63, 6, 3, 16, 40}, Case{1, 257, 4, 2, 8, 64}, Case{2, 64, 1, 1, 64, 8},
                        Case{1, 130, 4, 2, 5, 3}, Case{1, 70, 2, 1, 5, 13}, Case{1, 1, 2, 1, 24, 16}}) {
    const Inputs in(c, seed++);
    for (const int64_t window : {int64_t{0}, int64_t{50}}) {
      expect_matches_reference(c, in, window);
      if (::testing::Test::HasFailure()) return;  // one case's dump is enough
    }
  }
}

// The same kernels against the double reference, forward and backward, within the 1e-5 every other width
// is held to (SlidingWindowMatchesDoubleReference), causal and with windows under, at and across tiles.
TEST(Attention, ValueWidthMatchesDoubleReference) {
  uint64_t seed = 1100;
  for (const Case& c : {Case{1, 200, 2, 2, 192, 128}, Case{2, 130, 4, 2, 24, 16}, Case{1, 257, 6, 3, 16, 40}}) {
    const Inputs in(c, seed++);
    for (const int64_t window : {int64_t{0}, int64_t{1}, int64_t{64}, int64_t{100}}) {
      expect_matches_double_reference(c, in, window);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// Nothing but P depends on q and k, and every column of o = P V and of dV = P^T dO is computed on its own
// (the tile products and the online softmax's rescaling are column by column, Note [Tile products as
// register-blocked loops]): so with v = [v1 | v2] and dout = [d1 | d2] split by columns, o, lse and dv of
// the width hdv1 + hdv2 are those of (v1, d1) and (v2, d2) side by side, bit for bit. With v1 of width hd
// this ties the other widths to the single-width path (hdv = hd), whose bits are those of the kernels
// before hdv existed. dq and dk are not split: D and dP sum over all hdv columns.
TEST(Attention, ValueWidthSplitsByColumnsBitwise) {
  for (const auto& [c, hdv1] : std::vector<std::pair<Case, int64_t>>{
           {Case{1, 200, 4, 2, 64, 128}, 64}, {Case{2, 130, 6, 3, 24, 40}, 24}, {Case{1, 70, 2, 2, 16, 21}, 13}}) {
    const int64_t hdv = c.vd(), hdv2 = hdv - hdv1, rows = c.B * c.T;
    const Inputs in(c, 1200);
    // The columns [c0, c0 + w) of each head of x (rows, heads, hdv): (rows, heads, w).
    auto columns = [&](const std::vector<float>& x, int64_t heads, int64_t c0, int64_t w) {
      std::vector<float> out(rows * heads * w);
      for (int64_t r = 0; r < rows * heads; ++r) std::copy_n(x.data() + r * hdv + c0, w, out.data() + r * w);
      return out;
    };
    for (const int64_t window : {int64_t{0}, int64_t{50}}) {
      const std::string l = c.name() + " split " + std::to_string(hdv1) + "+" + std::to_string(hdv2) +
                            " window=" + std::to_string(window);
      const Outputs whole = fast_run(c, in, window);
      for (const auto& [c0, w] : {std::pair{int64_t{0}, hdv1}, std::pair{hdv1, hdv2}}) {
        Case part = c;
        part.hdv = w;
        Inputs pin = in;
        pin.v = columns(in.v, c.nkv, c0, w);
        pin.dout = columns(in.dout, c.nh, c0, w);
        const Outputs got = fast_run(part, pin, window);
        const std::string lp = l + " columns " + std::to_string(c0) + ".." + std::to_string(c0 + w);
        EXPECT_EQ(0, std::memcmp(got.o.data(), columns(whole.o, c.nh, c0, w).data(), got.o.size() * sizeof(float)))
            << "o " << lp;
        EXPECT_EQ(0, std::memcmp(got.lse.data(), whole.lse.data(), got.lse.size() * sizeof(float))) << "lse " << lp;
        EXPECT_EQ(0, std::memcmp(got.dv.data(), columns(whole.dv, c.nkv, c0, w).data(), got.dv.size() * sizeof(float)))
            << "dv " << lp;
      }
    }
  }
}

// The double reference with hdv != hd against central differences of its forward (the pattern of
// ReferenceBackwardMatchesFiniteDifferences): hdv under and over hd, GQA, causal and with a window.
TEST(Attention, ValueWidthReferenceBackwardMatchesFiniteDifferences) {
  expect_reference_backward_matches_finite_differences(Case{2, 7, 4, 2, 5, 3}, 8, 0);
  expect_reference_backward_matches_finite_differences(Case{1, 9, 2, 1, 3, 6}, 9, 4);
}

// The same bits for any thread count and run with hdv != hd (Note [Deterministic attention backward]).
TEST(Attention, ValueWidthBitwiseDeterministicAcrossThreadsAndRuns) {
  const int saved = omp_get_max_threads();
  for (const auto& [c, window] : std::vector<std::pair<Case, int64_t>>{
           {Case{2, 200, 4, 2, 24, 16}, 0}, {Case{1, 130, 2, 2, 192, 128}, 0}, {Case{1, 300, 4, 2, 16, 40}, 70}}) {
    const Inputs in(c, 44);
    omp_set_num_threads(1);
    const Outputs one = fast_run(c, in, window);
    omp_set_num_threads(2);
    const Outputs two = fast_run(c, in, window);
    const Outputs again = fast_run(c, in, window);
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

namespace {

// The (query tile, key tile) pairs holding at least one (query, key) pair the mask lets through, counted
// query by query: what the kernels must compute, per (b, head) and pass.
int64_t visible_tile_pairs(int64_t T, int64_t window) {
  const int64_t TQ = ops::cpu::kAttentionTileQ, TK = ops::cpu::kAttentionTileK;
  int64_t pairs = 0;
  for (int64_t i0 = 0; i0 < T; i0 += TQ)
    for (int64_t j0 = 0; j0 < T; j0 += TK) {
      bool any = false;
      for (int64_t i = i0; i < std::min(T, i0 + TQ) && !any; ++i) {
        const int64_t first = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;  // keys [first, i]
        any = std::max(first, j0) <= std::min(i, std::min(T, j0 + TK) - 1);
      }
      pairs += any;
    }
  return pairs;
}

}  // namespace

// Tiles outside the band are skipped, counted (not timed): the kernels' own count of tile products
// (attention_tile::tile_pairs_computed) equals B * nh * (the tile pairs holding a visible pair) in the
// forward and twice that in the two-pass backward (dK/dV pass and dQ pass), once in the one sweep. Causal at T = 2048:
// 528 of the 1024 pairs; a window of 128 keeps 93 (a query tile meets at most 3 key tiles), so the work falls with w.
TEST(Attention, SlidingWindowSkipsTilesOutsideTheBand) {
  namespace at = ops::cpu::attention_tile;
  EXPECT_EQ(visible_tile_pairs(2048, 0), 528);
  EXPECT_EQ(visible_tile_pairs(2048, 128), 93);
  EXPECT_EQ(visible_tile_pairs(2048, 1), 32);
  for (const auto& [c, window] : std::vector<std::pair<Case, int64_t>>{{Case{1, 2048, 2, 1, 8}, 128},
                                                                       {Case{1, 2048, 2, 1, 8}, 0},
                                                                       {Case{1, 2048, 2, 1, 8}, 1},
                                                                       {Case{2, 1000, 4, 2, 8}, 100},
                                                                       {Case{2, 1000, 4, 2, 8}, 64},
                                                                       {Case{1, 700, 6, 3, 8}, 300},
                                                                       {Case{1, 700, 6, 3, 8}, 699}}) {
    const Inputs in(c, 5);
    std::vector<float> o(in.q.size()), lse(c.B * c.nh * c.T), dq(in.q.size()), dk(in.k.size()), dv(in.k.size());
    const int64_t want = c.B * c.nh * visible_tile_pairs(c.T, window);
    const std::string l = c.name() + " window=" + std::to_string(window);
    const int64_t before = at::tile_pairs_computed.load();
    ops::cpu::attention_forward(in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data(),
                                ops::attention_spec(c.B, c.T, c.nh, c.nkv, c.hd, c.hd, in.scale, window));
    const int64_t forward = at::tile_pairs_computed.load() - before;
    EXPECT_EQ(forward, want) << l;
    // Each pair once per pass; once in all with the one sweep (Note [One backward sweep where the dQ sums
    // fit] in backend/cpu/kernels/attention_block.cpp).
    for (const auto& [sweep, passes] :
         {std::pair{at::BackwardSweep::two_pass, 2}, std::pair{at::BackwardSweep::one, 1}}) {
      at::backward_sweep = sweep;
      const int64_t start = at::tile_pairs_computed.load();
      ops::cpu::attention_backward(in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data(), in.dout.data(),
                                   dq.data(), dk.data(), dv.data(),
                                   ops::attention_spec(c.B, c.T, c.nh, c.nkv, c.hd, c.hd, in.scale, window));
      EXPECT_EQ(at::tile_pairs_computed.load() - start, passes * want) << l << " passes " << passes;
    }
    at::backward_sweep = at::BackwardSweep::automatic;
    std::printf("%s: %lld tile pairs per (b, head) and pass\n", l.c_str(),
                static_cast<long long>(visible_tile_pairs(c.T, window)));
  }
}

// The same bits for any thread count with a window too (Note [Deterministic attention backward]).
TEST(Attention, SlidingWindowBitwiseDeterministicAcrossThreads) {
  const int saved = omp_get_max_threads();
  const Case c{2, 300, 4, 2, 24};
  const Inputs in(c, 43);
  for (const int64_t window : {1, 50, 130}) {
    omp_set_num_threads(1);
    const Outputs one = fast_run(c, in, window);
    omp_set_num_threads(2);
    const Outputs two = fast_run(c, in, window);
    EXPECT_EQ(0, std::memcmp(one.o.data(), two.o.data(), one.o.size() * sizeof(float))) << window;
    EXPECT_EQ(0, std::memcmp(one.lse.data(), two.lse.data(), one.lse.size() * sizeof(float))) << window;
    EXPECT_EQ(0, std::memcmp(one.dq.data(), two.dq.data(), one.dq.size() * sizeof(float))) << window;
    EXPECT_EQ(0, std::memcmp(one.dk.data(), two.dk.data(), one.dk.size() * sizeof(float))) << window;
    EXPECT_EQ(0, std::memcmp(one.dv.data(), two.dv.data(), one.dv.size() * sizeof(float))) << window;
  }
  omp_set_num_threads(saved);
}

// The attention kernels (forward and backward, whole causal sequence) with the SSE2, the AVX2 and (where
// the CPU has it) the FMA tile products, interleaved in one process: median seconds of 7 and the ratio to
// SSE2. SSE2 and AVX2 results are bit-identical (Avx2TileProductEqualsBaselineBitwise). Run:
//   build/tests/ops_test_attention --gtest_also_run_disabled_tests --gtest_filter='*BenchAvx2*'
TEST(Attention, DISABLED_BenchAvx2VsBaseline) {
  namespace at = ops::cpu::attention_tile;
  const ops::cpu::SimdLevel best = at::tile_simd;
  if (best == ops::cpu::SimdLevel::sse2) GTEST_SKIP() << "no AVX2 (or FLATPEAK_SIMD=baseline)";
  std::vector<ops::cpu::SimdLevel> copies{ops::cpu::SimdLevel::sse2, ops::cpu::SimdLevel::avx2};
  if (best >= ops::cpu::SimdLevel::fma) copies.push_back(ops::cpu::SimdLevel::fma);
  if (best == ops::cpu::SimdLevel::avx512) copies.push_back(ops::cpu::SimdLevel::avx512);
  for (const Case& c : {Case{1, 2048, 8, 2, 64}, Case{1, 2048, 8, 2, 128}}) {
    const Inputs in(c, 3);
    std::vector<std::vector<double>> t(copies.size());
    std::vector<Outputs> out(copies.size());
    for (int rep = 0; rep < 7; ++rep)
      for (size_t v = 0; v < copies.size(); ++v) {
        at::tile_simd = copies[v];
        const auto t0 = std::chrono::steady_clock::now();
        out[v] = fast_run(c, in);
        t[v].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    at::tile_simd = best;
    for (auto& x : t) std::sort(x.begin(), x.end());
    EXPECT_EQ(std::memcmp(out[0].dq.data(), out[1].dq.data(), out[0].dq.size() * sizeof(float)), 0);
    std::printf("attention fwd+bwd %s, %d threads, median of 7:", c.name().c_str(), omp_get_max_threads());
    for (size_t v = 0; v < copies.size(); ++v)
      std::printf(" %s %.4f s (%.2fx)", ops::cpu::simd_level_name(copies[v]), t[v][3], t[0][3] / t[v][3]);
    std::printf("\n");
  }
}

// Sliding-window cost: forward + backward of the whole sequence at B = 1, T = 4096, nh = 4, nkv = 2,
// hd = 64 for windows 0 (causal), 2048, 512 and 128, the windows interleaved in each repeat; medians of
// FP_BENCH_REPEATS (default 5) repeats and the ratio to window 0, with the tile pairs computed per
// (b, head) and pass. Run: build/tests/ops_test_attention --gtest_also_run_disabled_tests
//   --gtest_filter='*BenchSlidingWindow*'
TEST(Attention, DISABLED_BenchSlidingWindow) {
  namespace at = ops::cpu::attention_tile;
  const Case c{1, 4096, 4, 2, 64};
  const std::vector<int64_t> windows = {0, 2048, 512, 128};
  const char* env = std::getenv("FP_BENCH_REPEATS");
  const int repeats = env ? std::max(1, std::atoi(env)) : 5;
  const Inputs in(c, 4);
  std::vector<std::vector<double>> fwd(windows.size()), bwd(windows.size()), both(windows.size());
  std::vector<int64_t> pairs(windows.size());
  Outputs r{std::vector<float>(in.q.size()), std::vector<float>(c.B * c.nh * c.T), std::vector<float>(in.q.size()),
            std::vector<float>(in.k.size()), std::vector<float>(in.k.size())};
  using Clock = std::chrono::steady_clock;
  for (int rep = 0; rep < repeats; ++rep)
    for (size_t w = 0; w < windows.size(); ++w) {
      const int64_t before = at::tile_pairs_computed.load();
      const auto t0 = Clock::now();
      ops::cpu::attention_forward(in.q.data(), in.k.data(), in.v.data(), r.o.data(), r.lse.data(),
                                  ops::attention_spec(c.B, c.T, c.nh, c.nkv, c.hd, c.hd, in.scale, windows[w]));
      const auto t1 = Clock::now();
      ops::cpu::attention_backward(in.q.data(), in.k.data(), in.v.data(), r.o.data(), r.lse.data(), in.dout.data(),
                                   r.dq.data(), r.dk.data(), r.dv.data(),
                                   ops::attention_spec(c.B, c.T, c.nh, c.nkv, c.hd, c.hd, in.scale, windows[w]));
      const auto t2 = Clock::now();
      pairs[w] = (at::tile_pairs_computed.load() - before) / (3 * c.B * c.nh);
      fwd[w].push_back(std::chrono::duration<double>(t1 - t0).count());
      bwd[w].push_back(std::chrono::duration<double>(t2 - t1).count());
      both[w].push_back(std::chrono::duration<double>(t2 - t0).count());
    }
  auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  std::printf("sliding-window attention fwd+bwd %s, %d threads, %s tiles, medians of %d\n", c.name().c_str(),
              omp_get_max_threads(), ops::cpu::simd_level_name(at::tile_simd), repeats);
  std::printf("%7s %11s %9s %9s %9s %7s\n", "window", "tile pairs", "fwd s", "bwd s", "fwd+bwd s", "ratio");
  const double base = median(both[0]);
  for (size_t w = 0; w < windows.size(); ++w)
    std::printf("%7lld %11lld %9.4f %9.4f %9.4f %7.3f\n", static_cast<long long>(windows[w]),
                static_cast<long long>(pairs[w]), median(fwd[w]), median(bwd[w]), median(both[w]),
                median(both[w]) / base);
}

// bf16 storage (ops/attention_block.h's storage rule): q, k, v, dout rounded to bf16; the bf16 kernels
// must give, bit for bit, the f32 kernels' results on the widened inputs rounded once (o, dq, dk, dv)
// and the same lse, with a window and without, across tiles, GQA groups and a value width of its own.
// The backward is fed the bf16 o, as a bf16 model would: the f32 side gets the same values widened.
TEST(Attention, Bf16StorageIsTheWidenedF32ComputationRoundedOnce) {
  const auto rounded = op_test::rounded_bf16;
  const auto widened = op_test::widened;
  auto expect_rounded_equal = [&](const char* what, const Case& c, const std::vector<bf16>& got,
                                  const std::vector<float>& f32) {
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i].bits, bf16_from_float(f32[i])) << what << " " << c.name() << " at " << i;
  };
  uint64_t seed = 900;
  for (const Case& c : {Case{1, 65, 4, 2, 16}, Case{2, 130, 6, 3, 24}, Case{1, 200, 4, 1, 64, 32}}) {
    for (const int64_t window : {int64_t{0}, int64_t{37}}) {
      const Inputs in(c, seed++);
      const std::vector<bf16> qh = rounded(in.q), kh = rounded(in.k), vh = rounded(in.v), douth = rounded(in.dout);
      const std::vector<float> q = widened(qh), k = widened(kh), v = widened(vh), dout = widened(douth);
      // bf16.
      std::vector<bf16> oh(in.dout.size()), dqh(in.q.size()), dkh(in.k.size()), dvh(in.v.size());
      std::vector<float> lse_h(c.B * c.nh * c.T);
      ops::cpu::attention_forward(qh.data(), kh.data(), vh.data(), oh.data(), lse_h.data(),
                                  ops::attention_spec(c.B, c.T, c.nh, c.nkv, c.hd, c.vd(), in.scale, window));
      ops::cpu::attention_backward(qh.data(), kh.data(), vh.data(), oh.data(), lse_h.data(), douth.data(), dqh.data(),
                                   dkh.data(), dvh.data(),
                                   ops::attention_spec(c.B, c.T, c.nh, c.nkv, c.hd, c.vd(), in.scale, window));
      // f32 on the widened values.
      std::vector<float> o(in.dout.size()), lse(c.B * c.nh * c.T), dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
      ops::cpu::attention_forward(q.data(), k.data(), v.data(), o.data(), lse.data(),
                                  ops::attention_spec(c.B, c.T, c.nh, c.nkv, c.hd, c.vd(), in.scale, window));
      expect_rounded_equal("o", c, oh, o);
      ASSERT_TRUE(op_test::bits_equal(lse_h, lse)) << "lse " << c.name();
      const std::vector<float> o_w = widened(oh);
      ops::cpu::attention_backward(q.data(), k.data(), v.data(), o_w.data(), lse.data(), dout.data(), dq.data(),
                                   dk.data(), dv.data(),
                                   ops::attention_spec(c.B, c.T, c.nh, c.nkv, c.hd, c.vd(), in.scale, window));
      expect_rounded_equal("dq", c, dqh, dq);
      expect_rounded_equal("dk", c, dkh, dk);
      expect_rounded_equal("dv", c, dvh, dv);
    }
  }
  // Mixed dtypes in one call are refused by name.
  std::vector<float> f(64 * 8), lse(64);
  std::vector<bf16> h(64 * 8);
  EXPECT_THROW(ops::cpu::attention_forward(f.data(), h.data(), f.data(), f.data(), lse.data(),
                                           ops::attention_spec(1, 64, 1, 1, 8, 8, 1.0f, 0)),
               InternalError);
}

// Attention against its matmul-equivalent rate (issue 14: fwd + bwd at >= 50% of it). The kernels'
// useful FLOPs (causal: the T(T+1)/2 visible score pairs; forward 2 products, QK^T and PV, backward 5,
// the recomputed QK^T, dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q: 7 x 2 x pairs x hd x nh x B)
// over the time of forward + backward, against the rate of the cpu GEMM (OpenBLAS) on the same
// products unmasked, one (b, head) at a time: (T, hd) x (hd, T) and (T, T) x (T, hd), measured in the
// same process, interleaved with the attention repeats. f32 and bf16 operands (bf16 against the bf16
// GEMM: widened panels and the same sgemm). Medians of FP_BENCH_REPEATS (default 5). Run:
//   build/tests/ops_test_attention --gtest_also_run_disabled_tests --gtest_filter='*BenchMatmulEquivalent*'
TEST(Attention, DISABLED_BenchMatmulEquivalent) {
  namespace at = ops::cpu::attention_tile;
  const char* env = std::getenv("FP_BENCH_REPEATS");
  const int repeats = env ? std::max(1, std::atoi(env)) : 5;
  using Clock = std::chrono::steady_clock;
  auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  std::printf("attention fwd+bwd vs its matmul-equivalent rate, %d threads, %s tiles, backward %s, medians of %d\n",
              omp_get_max_threads(), ops::cpu::simd_level_name(at::tile_simd), ops::cpu::attention_backward_sweep(),
              repeats);
  std::printf("| shape | operands | attention s | attention GFLOP/s | GEMM GFLOP/s (same products) | ratio |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const Case& c : {Case{4, 1024, 4, 2, 64}, Case{1, 2048, 8, 2, 64}, Case{1, 2048, 8, 2, 128}}) {
    const Inputs in(c, 5);
    for (const bool half : {false, true}) {
      const auto qh = op_test::rounded_bf16(in.q), kh = op_test::rounded_bf16(in.k), vh = op_test::rounded_bf16(in.v),
                 doh = op_test::rounded_bf16(in.dout);
      std::vector<bf16> oh(in.dout.size()), dqh(in.q.size()), dkh(in.k.size()), dvh(in.v.size());
      Outputs r{std::vector<float>(in.dout.size()), std::vector<float>(c.B * c.nh * c.T),
                std::vector<float>(in.q.size()), std::vector<float>(in.k.size()), std::vector<float>(in.v.size())};
      const CBuf q = half ? CBuf(qh.data()) : CBuf(in.q.data()), k = half ? CBuf(kh.data()) : CBuf(in.k.data()),
                 v = half ? CBuf(vh.data()) : CBuf(in.v.data()), dout = half ? CBuf(doh.data()) : CBuf(in.dout.data());
      const Buf o = half ? Buf(oh.data()) : Buf(r.o.data()), dq = half ? Buf(dqh.data()) : Buf(r.dq.data()),
                dk = half ? Buf(dkh.data()) : Buf(r.dk.data()), dv = half ? Buf(dvh.data()) : Buf(r.dv.data());
      // One (b, head)'s products, unmasked: S (T, T) = Q K^T, O (T, hd) = S V, in the operands' dtype.
      std::vector<float> sf(static_cast<size_t>(c.T * c.T)), of(static_cast<size_t>(c.T * c.hd));
      std::vector<bf16> sh(sf.size()), ohh(of.size());
      const Buf S = half ? Buf(sh.data()) : Buf(sf.data()), O = half ? Buf(ohh.data()) : Buf(of.data());
      std::vector<double> t_att, t_gemm;
      for (int rep = 0; rep <= repeats; ++rep) {
        const auto t0 = Clock::now();
        ops::cpu::attention_forward(q, k, v, o, r.lse.data(),
                                    ops::attention_spec(c.B, c.T, c.nh, c.nkv, c.hd, c.hd, in.scale, 0));
        ops::cpu::attention_backward(q, k, v, o, r.lse.data(), dout, dq, dk, dv,
                                     ops::attention_spec(c.B, c.T, c.nh, c.nkv, c.hd, c.hd, in.scale, 0));
        const auto t1 = Clock::now();
        // The same 7 products per (b, head) through the GEMM, unmasked: 4 of the S shape, 3 of the O shape.
        for (int64_t bh = 0; bh < c.B * c.nh; ++bh) {
          for (int i = 0; i < 4; ++i)
            ops::cpu::gemm(false, true, c.T, c.T, c.hd, 1.0f, q, c.nh * c.hd, k, c.nkv * c.hd, 0.0f, S, c.T);
          for (int i = 0; i < 3; ++i)
            ops::cpu::gemm(false, false, c.T, c.hd, c.T, 1.0f, S, c.T, v, c.nkv * c.hd, 0.0f, O, c.hd);
        }
        const auto t2 = Clock::now();
        if (rep == 0) continue;  // warm-up
        t_att.push_back(std::chrono::duration<double>(t1 - t0).count());
        t_gemm.push_back(std::chrono::duration<double>(t2 - t1).count());
      }
      const double pairs = static_cast<double>(c.T) * static_cast<double>(c.T + 1) / 2.0;
      const double bhd = static_cast<double>(c.B * c.nh * c.hd);
      const double att_flops = 7.0 * 2.0 * pairs * bhd, gemm_flops = 7.0 * 2.0 * static_cast<double>(c.T * c.T) * bhd;
      const double ta = median(t_att), tg = median(t_gemm);
      std::printf("| %s | %s | %.4f | %.1f | %.1f | %.0f%% |\n", c.name().c_str(), half ? "bf16" : "f32", ta,
                  att_flops / ta / 1e9, gemm_flops / tg / 1e9, 100.0 * (att_flops / ta) / (gemm_flops / tg));
    }
  }
}

}  // namespace fp
