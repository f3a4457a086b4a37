// GEMM: cblas_sgemm through ops::cpu::gemm against the scalar reference for every transpose pair,
// odd sizes around SIMD and BLAS tile widths, alpha/beta, padded leading dimensions; the empty
// cases; FP_BLAS_CALL's argument checks; and the single-thread sgemm rate.
// Dimensions: M rows of C, N columns of C, K the reduction.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/kernels/blas_check.h"
#include "backend/cpu/kernels/blas_setup.h"
#include "backend/cpu/kernels/cpu_features.h"
#include "backend/cpu/kernels/gemm_onednn.h"
#include "backend/cpu/kernels/ops.h"
#include "core/buf.h"
#include "core/error.h"
#include "core/rng.h"
#include "op_test.h"
#include "ops/gemm.h"
#include "ops/ref/gemm.h"

namespace fp {

namespace {

struct Case {
  bool ta, tb;
  int64_t M, N, K;
  int64_t pad;  // extra elements at the end of each stored row
  float alpha, beta;
};

// Runs one case through the kernel and ref<float>, compares element by element.
// Tolerance: the standard bound for a K-term dot product, |fl(c) - c| <= gamma_K sum |alpha a b|
// (+ a few ulps of the beta term), applies to both the reference and OpenBLAS (which may block K and
// use FMA), so their difference is below twice that, taken as (2K + 8) eps (|alpha| sum_k |a b| +
// |beta c0|). An indexing or transpose bug gives an error of order sqrt(K) |a b|, far above it.
// The padding columns of C must be left untouched.
::testing::AssertionResult case_check(const Case& c, uint64_t seed) {
  Rng rng(seed);
  const int64_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int64_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  const int64_t lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.N + c.pad;
  const std::vector<float> A = op_test::random_vector(a_rows * lda, rng);  // (a_rows, lda)
  const std::vector<float> B = op_test::random_vector(b_rows * ldb, rng);  // (b_rows, ldb)
  std::vector<float> C0 = op_test::random_vector(c.M * ldc, rng);          // (M, ldc)
  if (c.beta == 0.0f) {
    // beta == 0 must not read C: poison it (the padding too, which must stay as it was).
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) C0[i * ldc + j] = std::numeric_limits<float>::quiet_NaN();
  }
  std::vector<float> got = C0, want = C0;
  ops::cpu::gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, got.data(), ldc);
  ops::ref::gemm<float>(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, want.data(), ldc);
  const std::string where = "ta=" + std::to_string(c.ta) + " tb=" + std::to_string(c.tb) + " M=" + std::to_string(c.M) +
                            " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) + " pad=" + std::to_string(c.pad);
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const int64_t idx = i * ldc + j;
      if (j >= c.N) {
        if (!(got[idx] == C0[idx]))
          return ::testing::AssertionFailure() << where << ": padding C[" << i << "," << j << "] written";
        continue;
      }
      double absum = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double a = c.ta ? A[k * lda + i] : A[i * lda + k];
        const double b = c.tb ? B[j * ldb + k] : B[k * ldb + j];
        absum += std::abs(a * b);
      }
      absum = std::abs(c.alpha) * absum + (c.beta == 0.0f ? 0.0 : std::abs(c.beta * C0[idx]));
      const double tol = (2.0 * c.K + 8.0) * FLT_EPSILON * absum;
      const double g = got[idx], w = want[idx];
      if (!std::isfinite(g) || !std::isfinite(w) || !(std::abs(g - w) <= tol)) {
        return ::testing::AssertionFailure() << where << ": C[" << i << "," << j << "] expected " << w << ", got " << g
                                             << " (tolerance " << tol << ")";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

const std::vector<int64_t> kSizes = {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129};

}  // namespace

TEST(Gemm, MatchesReferenceAllTransposes) {
  const int64_t ns = static_cast<int64_t>(kSizes.size());
  const float alphas[] = {1.0f, 0.5f, -1.75f};
  const float betas[] = {0.0f, 1.0f, -0.625f};
  uint64_t seed = 1;
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    for (int64_t i = 0; i < ns; ++i) {
      // Every size appears as M, N and K, paired with sizes from other parts of the list.
      const Case c{
          ta, tb, kSizes[i], kSizes[(i + 5) % ns], kSizes[(i + 11) % ns], i % 3, alphas[i % 3], betas[(i / 3) % 3]};
      EXPECT_TRUE(case_check(c, seed++));
    }
  }
}

TEST(Gemm, MatchesReferenceLargerOddShapes) {
  // Past OpenBLAS's blocking (its kernels tile M and N by a few to a few dozen and K by a few hundred).
  const Case cases[] = {
      {false, false, 257, 130, 515, 3, 1.0f, 0.0f},  {false, true, 200, 301, 257, 0, 0.5f, 1.0f},
      {true, false, 129, 513, 300, 1, -1.0f, 0.25f}, {true, true, 333, 97, 401, 7, 2.0f, -1.0f},
      {false, true, 1, 700, 513, 0, 1.0f, 0.0f},     {true, false, 600, 1, 129, 2, 1.0f, 1.0f},
  };
  uint64_t seed = 100;
  for (const Case& c : cases) EXPECT_TRUE(case_check(c, seed++));
}

TEST(Gemm, EmptyDimensions) {
  Rng rng(7);
  const int64_t M = 5, N = 9, ldc = 11;
  const std::vector<float> C0 = op_test::random_vector(M * ldc, rng);  // (M, ldc)
  // M == 0 or N == 0: nothing is touched, null pointers allowed.
  ops::cpu::gemm(false, false, 0, N, 4, 1.0f, nullptr, 4, nullptr, N, 0.0f, nullptr, N);
  ops::cpu::gemm(true, true, M, 0, 4, 1.0f, nullptr, M, nullptr, 4, 0.0f, nullptr, 1);
  // K == 0: C = beta C, with A and B null.
  std::vector<float> C = C0;
  ops::cpu::gemm(false, true, M, N, 0, 1.0f, nullptr, 1, nullptr, 1, -0.5f, C.data(), ldc);
  for (int64_t i = 0; i < M * ldc; ++i) {
    const float want = (i % ldc) < N ? -0.5f * C0[i] : C0[i];
    ASSERT_EQ(C[i], want) << "index " << i;
  }
  // K == 0, beta == 0: C = 0 without reading C.
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = std::numeric_limits<float>::quiet_NaN();
  ops::cpu::gemm(true, false, M, N, 0, 1.0f, nullptr, 1, nullptr, 1, 0.0f, C.data(), ldc);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) ASSERT_EQ(C[i * ldc + j], 0.0f) << "C[" << i << "," << j << "]";
}

TEST(Gemm, BadArgumentsAssert) {
  std::vector<float> A(64, 1.0f), B(64, 1.0f), C(64, 1.0f);
  // lda below K for a row-major (M, K) A.
  try {
    ops::cpu::gemm(false, false, 4, 4, 4, 1.0f, A.data(), 3, B.data(), 4, 0.0f, C.data(), 4);
    FAIL() << "lda = 3 < K = 4 accepted";
  } catch (const InternalError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cblas_sgemm"), std::string::npos) << what;
    EXPECT_NE(what.find("leading dimension of A"), std::string::npos) << what;
    EXPECT_NE(what.find("gemm.cpp"), std::string::npos) << what;
  }
  // Transposed A is stored (K, M): lda must cover M.
  EXPECT_THROW(ops::cpu::gemm(true, false, 6, 4, 4, 1.0f, A.data(), 4, B.data(), 4, 0.0f, C.data(), 4), InternalError);
  // Transposed B is stored (N, K): ldb must cover K.
  EXPECT_THROW(ops::cpu::gemm(false, true, 4, 4, 6, 1.0f, A.data(), 6, B.data(), 4, 0.0f, C.data(), 4), InternalError);
  EXPECT_THROW(ops::cpu::gemm(false, false, 4, 5, 4, 1.0f, A.data(), 4, B.data(), 5, 0.0f, C.data(), 4), InternalError);
  EXPECT_THROW(ops::cpu::gemm(false, false, 4, 4, 4, 1.0f, nullptr, 4, B.data(), 4, 0.0f, C.data(), 4), InternalError);
  EXPECT_THROW(ops::cpu::gemm(false, false, -1, 4, 4, 1.0f, A.data(), 4, B.data(), 4, 0.0f, C.data(), 4),
               InternalError);
  // Dimensions that do not fit in a 32-bit blasint.
  EXPECT_THROW(ops::cpu::gemm(false, false, 1, int64_t{1} << 32, 1, 1.0f, A.data(), 1, B.data(), int64_t{1} << 32, 0.0f,
                              C.data(), int64_t{1} << 32),
               InternalError);
  // The last call site is recorded for diagnostics.
  ops::cpu::gemm(false, false, 4, 4, 4, 1.0f, A.data(), 4, B.data(), 4, 0.0f, C.data(), 4);
  const ops::cpu::BlasCallSite& site = ops::cpu::blas_last_call();
  ASSERT_NE(site.call, nullptr);
  EXPECT_NE(std::string(site.call).find("cblas_sgemm"), std::string::npos);
  EXPECT_NE(std::string(site.file).find("gemm.cpp"), std::string::npos);
  EXPECT_GT(site.line, 0);
}

// A benchmark, not a test (it reports and cannot fail, so it does not run with the tests): the
// single-thread sgemm rate at two shapes, median of repeats, and the kernels that ran.
//   build/tests/ops_test_gemm --gtest_also_run_disabled_tests --gtest_filter='*BenchSingleThreadRate'
TEST(Gemm, DISABLED_BenchSingleThreadRate) {
  std::printf("%s\n", ops::cpu::blas_setup().str().c_str());
  const int saved_threads = openblas_get_num_threads();
  openblas_set_num_threads(1);
  struct Shape {
    int64_t M, N, K;
  };
  for (const Shape s : {Shape{512, 512, 512}, Shape{2048, 1024, 1024}}) {
    Rng rng(3);
    const std::vector<float> A = op_test::random_vector(s.M * s.K, rng);                                   // (M, K)
    const std::vector<float> B = op_test::random_vector(s.K * s.N, rng);                                   // (K, N)
    std::vector<float> C(s.M * s.N);                                                                       // (M, N)
    ops::cpu::gemm(false, false, s.M, s.N, s.K, 1.0f, A.data(), s.K, B.data(), s.N, 0.0f, C.data(), s.N);  // warm
    std::vector<double> secs;
    for (int r = 0; r < 7; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      ops::cpu::gemm(false, false, s.M, s.N, s.K, 1.0f, A.data(), s.K, B.data(), s.N, 0.0f, C.data(), s.N);
      secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(secs.begin(), secs.end());
    const double gflops = 2.0 * s.M * s.N * s.K / secs[secs.size() / 2] * 1e-9;
    std::printf("sgemm %ldx%ldx%ld, 1 thread: %.1f GFLOP/s (median of %zu)\n", static_cast<long>(s.M),
                static_cast<long>(s.N), static_cast<long>(s.K), gflops, secs.size());
  }
  openblas_set_num_threads(saved_threads);
}

}  // namespace fp

// Note [OpenBLAS's kernels are ours to choose]: after the first GEMM the kernels OpenBLAS runs are the
// core type flatpeak chose, and that choice follows the CPU as GCC's own detector (libgcc's
// __builtin_cpu_supports, independent of cpu_features.cpp) reads it.
TEST(BlasSetup, KernelsArePinnedFromTheCpu) {
  std::vector<float> a(64 * 64, 1.0f), b(64 * 64, 1.0f), c(64 * 64, 0.0f);
  fp::ops::cpu::gemm(false, false, 64, 64, 64, 1.0f, a.data(), 64, b.data(), 64, 0.0f, c.data(), 64);
  EXPECT_EQ(c[0], 64.0f);
  const fp::ops::cpu::BlasKernels& k = fp::ops::cpu::blas_setup();
  EXPECT_TRUE(k.pinned) << k.str();
  EXPECT_EQ(k.active, openblas_get_corename()) << k.str();
  if (k.why.rfind("ours", 0) != 0) GTEST_SKIP() << "OPENBLAS_CORETYPE set outside: " << k.str();
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const char* want = avx512                          ? "SkylakeX"
                     : avx2                          ? "Haswell"
                     : __builtin_cpu_supports("avx") ? "Sandybridge"
                                                     : "Prescott";
  EXPECT_EQ(k.chosen, want) << k.str();
  std::printf("%s\ncpu: %s\n", k.str().c_str(), fp::ops::cpu::cpu_features().str().c_str());
}

TEST(CpuFeatures, AgreeWithLibgcc) {
  __builtin_cpu_init();
  const fp::ops::cpu::CpuFeatures& f = fp::ops::cpu::cpu_features();
  EXPECT_EQ(f.avx2, static_cast<bool>(__builtin_cpu_supports("avx2")));
  EXPECT_EQ(f.fma, static_cast<bool>(__builtin_cpu_supports("fma")));
  EXPECT_EQ(f.avx512f, static_cast<bool>(__builtin_cpu_supports("avx512f")));
  EXPECT_EQ(f.avx512bw, static_cast<bool>(__builtin_cpu_supports("avx512bw")));
  EXPECT_FALSE(f.vendor.empty());
}

namespace fp {

// bf16 operands (Note [bf16 GEMM on a CPU without bf16 units] in backend/cpu/kernels/gemm.cpp): each of A, B, C
// f32 or bf16 on its own (the 7 combinations with at least one bf16), every transpose pair, shapes
// that fit one panel and shapes that cross panels in M and N (under a lowered panel bound). Against the scalar
// reference on the widened operands, with case_check's bound plus, for a bf16 C, the one rounding to bf16 (half an ulp,
// 2^-9 relative, taken as 2^-8 |want|); beta == 0 must not read C and the padding of C must stay. One-panel shapes must
// also give exactly the bits of the f32 GEMM of the widened operands, rounded once.
namespace {

using op_test::rounded_bf16;
using op_test::widened;

// One operand in the dtype asked for; `values` is what the kernel will read (widened when bf16).
struct Stored {
  std::vector<float> f;
  std::vector<bf16> h;
  DType dtype;
  Stored(const std::vector<float>& x, DType t) : dtype(t) {
    if (t == DType::DType_BF16) {
      h = rounded_bf16(x);
      f = widened(h);
    } else {
      f = x;
    }
  }
  CBuf cbuf() const { return dtype == DType::DType_BF16 ? CBuf(h.data()) : CBuf(f.data()); }
  Buf buf() { return dtype == DType::DType_BF16 ? Buf(h.data()) : Buf(f.data()); }
  std::vector<float> values() const { return dtype == DType::DType_BF16 ? widened(h) : f; }
};

::testing::AssertionResult mixed_check(const Case& c, DType da, DType db, DType dc, uint64_t seed, bool bitwise) {
  Rng rng(seed);
  const int64_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int64_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  const int64_t lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.N + c.pad;
  const Stored A(op_test::random_vector(a_rows * lda, rng), da), B(op_test::random_vector(b_rows * ldb, rng), db);
  std::vector<float> c0 = op_test::random_vector(c.M * ldc, rng);
  if (c.beta == 0.0f)
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) c0[i * ldc + j] = std::numeric_limits<float>::quiet_NaN();
  Stored C(c0, dc);
  const std::vector<float> C0 = C.values();
  ops::cpu::gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.cbuf(), lda, B.cbuf(), ldb, c.beta, C.buf(), ldc);
  const std::vector<float> got = C.values();
  std::vector<float> want = C0, exact = C0;
  ops::ref::gemm<float>(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.f.data(), lda, B.f.data(), ldb, c.beta, want.data(), ldc);
  ops::cpu::gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.f.data(), lda, B.f.data(), ldb, c.beta, exact.data(), ldc);
  const std::string where = fmt::format("{}x{}->{} ta={} tb={} M={} N={} K={} pad={}", dtype_name(da), dtype_name(db),
                                        dtype_name(dc), c.ta, c.tb, c.M, c.N, c.K, c.pad);
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const int64_t idx = i * ldc + j;
      const double g = got[idx];
      if (j >= c.N) {
        if (std::memcmp(&got[idx], &C0[idx], sizeof(float)) != 0)
          return ::testing::AssertionFailure() << where << ": padding C[" << i << "," << j << "] written";
        continue;
      }
      if (bitwise) {
        const float e = dc == DType::DType_BF16 ? to_f32(from_f32<bf16>(exact[idx])) : exact[idx];
        if (std::memcmp(&got[idx], &e, sizeof(float)) != 0)
          return ::testing::AssertionFailure() << where << ": C[" << i << "," << j << "] = " << g
                                               << ", the f32 GEMM of the widened operands gives " << e;
      }
      double absum = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double a = c.ta ? A.f[k * lda + i] : A.f[i * lda + k];
        const double b = c.tb ? B.f[j * ldb + k] : B.f[k * ldb + j];
        absum += std::abs(a * b);
      }
      absum = std::abs(c.alpha) * absum + (c.beta == 0.0f ? 0.0 : std::abs(c.beta * C0[idx]));
      const double w = want[idx];
      const double tol =
          (2.0 * c.K + 8.0) * FLT_EPSILON * absum + (dc == DType::DType_BF16 ? std::ldexp(std::abs(w), -8) : 0.0);
      if (!std::isfinite(g) || !std::isfinite(w) || !(std::abs(g - w) <= tol))
        return ::testing::AssertionFailure() << where << ": C[" << i << "," << j << "] expected " << w << ", got " << g
                                             << " (tolerance " << tol << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

const DType kMixed[7][3] = {
    {DType::DType_BF16, DType::DType_F32, DType::DType_F32},  {DType::DType_F32, DType::DType_BF16, DType::DType_F32},
    {DType::DType_F32, DType::DType_F32, DType::DType_BF16},  {DType::DType_BF16, DType::DType_BF16, DType::DType_F32},
    {DType::DType_BF16, DType::DType_F32, DType::DType_BF16}, {DType::DType_F32, DType::DType_BF16, DType::DType_BF16},
    {DType::DType_BF16, DType::DType_BF16, DType::DType_BF16}};

}  // namespace

TEST(Gemm, Bf16OperandsOnePanel) {
  uint64_t seed = 500;
  for (const auto& d : kMixed) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      for (const Case& c : {Case{ta, tb, 17, 33, 65, 3, 1.0f, 0.0f}, Case{ta, tb, 64, 9, 129, 0, -0.5f, 1.0f},
                            Case{ta, tb, 1, 127, 16, 2, 2.0f, -0.625f}, Case{ta, tb, 5, 7, 0, 1, 1.0f, 0.5f}})
        // Bitwise the widened f32 GEMM, unless oneDNN runs it (both inputs bf16 on bf16 units): then
        // the same products summed in another order, within the bound.
        EXPECT_TRUE(mixed_check(c, d[0], d[1], d[2], seed++,
                                !(ops::cpu::gemm_bf16_onednn_active() && d[0] == DType::DType_BF16 &&
                                  d[1] == DType::DType_BF16)));
    }
  }
}

TEST(Gemm, Bf16OperandsAcrossPanels) {
  // Panels bounded to 4096 floats: K = 100 gives panels of 64 columns of op(B) and 64 rows of op(A), so
  // M = 70 and N = 150 cut into 2 x 3 blocks with ragged edges.
  const int64_t saved = ops::cpu::gemm_panel_floats_set(4096);
  uint64_t seed = 600;
  for (const auto& d : kMixed) {
    for (int t = 0; t < 4; ++t) {
      EXPECT_TRUE(mixed_check(Case{(t & 1) != 0, (t & 2) != 0, 70, 150, 100, t % 3, 1.0f, t % 2 ? 0.0f : 0.75f}, d[0],
                              d[1], d[2], seed++, false));
    }
  }
  ops::cpu::gemm_panel_floats_set(saved);
}

// Note [bf16 GEMMs on the matrix units]: a CPU with AVX512_BF16 or AMX-BF16 runs bf16 GEMMs on oneDNN
// (scripts/deps installs it; a build or a machine that silently fell back to widening fails here), and
// one primitive per (N, K, layout) serves every M, as the experts' GEMMs use it: rows 1 to 300 with
// alpha and an accumulating beta, within the error bound, the same bits on a repeated call.
TEST(Gemm, Bf16OnBf16UnitsRunsOneDnnForEveryM) {
  const ops::cpu::CpuFeatures& f = ops::cpu::cpu_features();
  const char* env = std::getenv("FLATPEAK_BF16_GEMM");
  if (!(f.avx512_bf16 || f.amx_bf16) || (env != nullptr && *env != '\0'))
    GTEST_SKIP() << "no bf16 units, or FLATPEAK_BF16_GEMM set: " << ops::cpu::gemm_bf16_library();
  EXPECT_TRUE(ops::cpu::gemm_bf16_onednn_active()) << ops::cpu::gemm_bf16_library();
  uint64_t seed = 700;
  for (const DType dc : {DType::DType_F32, DType::DType_BF16})
    for (const int64_t M : {1, 3, 64, 300})
      for (int t = 0; t < 4; ++t)
        EXPECT_TRUE(mixed_check(Case{(t & 1) != 0, (t & 2) != 0, M, 96, 200, 2, t == 3 ? 0.5f : 1.0f, t % 2 ? 1.0f : 0.0f},
                                DType::DType_BF16, DType::DType_BF16, dc, seed++, false));
  const std::string lib = ops::cpu::gemm_bf16_library();
  EXPECT_NE(lib.find("oneDNN"), std::string::npos) << lib;
  std::printf("bf16 GEMMs: %s\n", lib.c_str());
  // Deterministic: the same call twice, the same bits.
  Rng rng(9);
  std::vector<bf16> a = op_test::rounded_bf16(op_test::random_vector(37 * 200, rng)),
                    b = op_test::rounded_bf16(op_test::random_vector(96 * 200, rng));
  std::vector<float> c1(37 * 96), c2(37 * 96);
  ops::cpu::gemm(false, true, 37, 96, 200, 1.0f, CBuf(a.data()), 200, CBuf(b.data()), 200, 0.0f, Buf(c1.data()), 96);
  ops::cpu::gemm(false, true, 37, 96, 200, 1.0f, CBuf(a.data()), 200, CBuf(b.data()), 200, 0.0f, Buf(c2.data()), 96);
  EXPECT_EQ(0, std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)));
}

}  // namespace fp
