// Element-wise kernels and reductions against the scalar reference, at sizes around SIMD widths and
// the reduction block; the reductions' bits for 1 and 2 threads. Dimensions: n elements.
#include <gtest/gtest.h>
#include <omp.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/rng.h"
#include "op_test.h"
#include "ops/elementwise.h"
#include "ops/ref/elementwise.h"

namespace fp {

namespace {

// SIMD widths, the 4096 reduction block and the 32768 parallel threshold, each +-1.
const std::vector<int64_t> kSizes = {0,  1,   3,   7,    8,    9,    15,   16,   17,    31,    33,    63,    64,
                                     65, 127, 129, 4095, 4096, 4097, 8191, 8193, 32767, 32768, 32769, 100003};

}  // namespace

// One float operation per element, in both: the results are equal bit for bit.
TEST(Elementwise, MatchesReferenceExactly) {
  uint64_t seed = 1;
  for (const int64_t n : kSizes) {
    Rng rng(seed++);
    const std::vector<float> x = op_test::random_vector(n, rng), y0 = op_test::random_vector(n, rng);
    std::vector<float> got = y0, want = y0;
    ops::cpu::add_inplace(got.data(), x.data(), n);
    ops::ref::add_inplace<float>(want.data(), x.data(), n);
    EXPECT_TRUE(op_test::near("add_inplace", {n}, got, want, op_test::tol_exact()));
    ops::cpu::scale_inplace(got.data(), -0.3f, n);
    ops::ref::scale_inplace<float>(want.data(), -0.3f, n);
    EXPECT_TRUE(op_test::near("scale_inplace", {n}, got, want, op_test::tol_exact()));
    ops::cpu::copy(got.data(), x.data(), n);
    ops::ref::copy<float>(want.data(), x.data(), n);
    EXPECT_TRUE(op_test::near("copy", {n}, got, want, op_test::tol_exact()));
    ops::cpu::fill(got.data(), 1.25f, n);
    ops::ref::fill<float>(want.data(), 1.25f, n);
    EXPECT_TRUE(op_test::near("fill", {n}, got, want, op_test::tol_exact()));
  }
}

// Both sum in double, in different orders: they differ by at most n eps_double sum|x| before the
// final rounding to float, which adds one half ulp to each. So |got - want| <= eps_float |want| +
// 2 n eps_double sum|x| (the second term is ~1e-11 of sum|x| here, the first catches any lost or
// doubled element, whose size is ~1 against a sum of ~sqrt(n)).
TEST(Elementwise, ReductionsMatchReference) {
  uint64_t seed = 100;
  for (const int64_t n : kSizes) {
    Rng rng(seed++);
    const std::vector<float> x = op_test::random_vector(n, rng);
    double abs_sum = 0, sq_sum = 0;
    for (const float v : x) {
      abs_sum += std::abs(v);
      sq_sum += static_cast<double>(v) * v;
    }
    float got = NAN, want = NAN;
    ops::cpu::reduce_sum(x.data(), n, &got);
    ops::ref::reduce_sum<float>(x.data(), n, &want);
    double tol = FLT_EPSILON * std::abs(want) + 2.0 * n * DBL_EPSILON * abs_sum;
    EXPECT_TRUE(std::isfinite(got) && std::abs(got - want) <= tol)
        << "reduce_sum n=" << n << ": expected " << want << ", got " << got << " (tolerance " << tol << ")";
    ops::cpu::reduce_sumsq(x.data(), n, &got);
    ops::ref::reduce_sumsq<float>(x.data(), n, &want);
    tol = FLT_EPSILON * std::abs(want) + 2.0 * n * DBL_EPSILON * sq_sum;
    EXPECT_TRUE(std::isfinite(got) && std::abs(got - want) <= tol)
        << "reduce_sumsq n=" << n << ": expected " << want << ", got " << got << " (tolerance " << tol << ")";
  }
}

// A sum with heavy cancellation, where a float accumulator would lose everything: 1e8 then many
// small values then -1e8.
TEST(Elementwise, ReduceSumAccumulatesInDouble) {
  const int64_t n = 50001;
  std::vector<float> x(n, 0.25f);
  x[0] = 1e8f;
  x[n - 1] = -1e8f;
  float got = 0;
  ops::cpu::reduce_sum(x.data(), n, &got);
  EXPECT_EQ(got, 0.25f * (n - 2));
}

// Note [Deterministic reductions]: the same bits for 1 and 2 threads, and run to run. The input is
// built so that the double sum's rounding shows in the float result: magnitudes spread over 10^+-12,
// each value followed later by its negation, so the exact sum is tiny next to the rounding errors of
// the partial sums, and any change of summation order (block size, thread split) changes the bits.
TEST(Elementwise, ReductionsBitwiseAcrossThreads) {
  const int saved = omp_get_max_threads();
  for (const int64_t n : {int64_t{32769}, int64_t{1000003}}) {
    Rng rng(n);
    std::vector<float> x(n);
    const int64_t half = n / 2;
    for (int64_t i = 0; i < half; ++i) {
      x[i] = static_cast<float>(rng.normal() * std::pow(10.0, -12.0 + 24.0 * rng.uniform()));
      if (x[i] == 0.0f) x[i] = 1.0f;
      x[n - 1 - i] = -x[i];
    }
    x[half] = 0.125f;
    float r[3][2];
    const int threads[3] = {1, 2, 2};
    for (int t = 0; t < 3; ++t) {
      omp_set_num_threads(threads[t]);
      ops::cpu::reduce_sum(x.data(), n, &r[t][0]);
      ops::cpu::reduce_sumsq(x.data(), n, &r[t][1]);
    }
    EXPECT_EQ(std::memcmp(r[0], r[1], sizeof(r[0])), 0) << "n=" << n << ": 1 vs 2 threads differ";
    EXPECT_EQ(std::memcmp(r[1], r[2], sizeof(r[0])), 0) << "n=" << n << ": two runs differ";
  }
  omp_set_num_threads(saved);
}

// Bias add, its gradient and the column sums against the reference: the add is one float operation
// per element (equal bits); each column sum is one double sum in row order in both (equal bits), for
// 1 and 2 threads, at shapes around the 64-column block and the parallel threshold.
TEST(Elementwise, BiasMatchesReferenceExactly) {
  const int saved = omp_get_max_threads();
  uint64_t seed = 7;
  for (const auto& [rows, d] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 63}, {5, 64}, {7, 65}, {300, 129}, {1000, 257}}) {
    Rng rng(seed++);
    const std::vector<float> y0 = op_test::random_vector(rows * d, rng), b = op_test::random_vector(d, rng),
                             db0 = op_test::random_vector(d, rng);
    std::vector<float> want = y0;
    ops::ref::bias_add<float>(want.data(), b.data(), rows, d);
    std::vector<float> want_db = db0;
    ops::ref::bias_backward<float>(y0.data(), want_db.data(), rows, d);
    for (const int t : {1, 2}) {
      omp_set_num_threads(t);
      std::vector<float> got = y0;
      ops::cpu::bias_add(got.data(), b.data(), rows, d);
      EXPECT_TRUE(op_test::near("bias_add", {rows, d}, got, want, op_test::tol_exact()))
          << rows << " x " << d << ", " << t << " threads";
      std::vector<float> got_db = db0;
      ops::cpu::bias_backward(y0.data(), got_db.data(), rows, d);
      EXPECT_TRUE(op_test::near("bias_backward db", {d}, got_db, want_db, op_test::tol_exact()))
          << rows << " x " << d << ", " << t << " threads";
      std::vector<double> sums(static_cast<size_t>(d)), want_sums(static_cast<size_t>(d));
      ops::cpu::column_sums_f64(y0.data(), rows, d, sums.data());
      ops::ref::column_sums_f64<float>(y0.data(), rows, d, want_sums.data());
      EXPECT_EQ(sums, want_sums) << "column_sums_f64 " << rows << " x " << d << ", " << t << " threads";
    }
  }
  omp_set_num_threads(saved);
}

// Strided block copies and sums (MLA's head splits): every element of the block, nothing outside it.
TEST(Elementwise, StridedBlocksCopyAndAdd) {
  const int64_t rows = 300, cols = 7, lds = 11, ldd = 13;
  std::vector<float> src(rows * lds), dst(rows * ldd), want(rows * ldd);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) * 0.5f;
  for (size_t i = 0; i < dst.size(); ++i) dst[i] = want[i] = -static_cast<float>(i);
  fp::ops::cpu::add_2d(dst.data(), ldd, src.data(), lds, rows, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) want[r * ldd + c] += src[r * lds + c];
  EXPECT_EQ(dst, want);
  fp::ops::cpu::copy_2d(dst.data(), ldd, src.data(), lds, rows, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) want[r * ldd + c] = src[r * lds + c];
  EXPECT_EQ(dst, want);
}

}  // namespace fp
