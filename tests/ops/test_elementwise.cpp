// Element-wise kernels and reductions against the scalar reference, at sizes around SIMD widths and
// the reduction block; the reductions' bits for 1 and 2 threads. bf16 operands (alone and mixed with
// f32) against the f32 kernel or the reference on the widened values, rounded; the converting copy both
// ways. Dimensions: n elements.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/kernels/ops.h"
#include "core/buf.h"
#include "core/error.h"
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

namespace {

using op_test::kBF16;
using op_test::kF32;
using op_test::Operand;
using op_test::dt;
using op_test::same_bits;
using op_test::stored;

// The sizes of the bf16 cases: SIMD widths, the 256-element staging chunk and the 4096 reduction
// block, each +-1, and the 32768 parallel threshold.
const std::vector<int64_t> kBf16Sizes = {0,   1,   7,   8,    9,    15,    16,    17,    255,   256,
                                         257, 511, 513, 4095, 4097, 32767, 32768, 32769, 100003};

// (y, x) dtypes of the mixed cases: both bf16, and each with the other f32.
const std::vector<std::pair<DType, DType>> kMixed = {{kBF16, kBF16}, {kF32, kBF16}, {kBF16, kF32}};

}  // namespace

// bf16 element-wise: each element is one f32 operation on the widened operands, rounded once into a
// bf16 result, so the result is the reference's on the widened values, rounded: equal bits.
TEST(Elementwise, Bf16MatchesReferenceOnWidenedValues) {
  uint64_t seed = 500;
  for (const int64_t n : kBf16Sizes) {
    for (const auto& [ty, tx] : kMixed) {
      Rng rng(seed++);
      const std::string where = " n=" + std::to_string(n) + " y " + dt(ty) + " x " + dt(tx);
      const Operand x(tx, op_test::random_vector(n, rng));
      Operand y(ty, op_test::random_vector(n, rng));
      std::vector<float> want = y.values();
      ops::cpu::add_inplace(y.buf(), x.cbuf(), n);
      ops::ref::add_inplace<float>(want.data(), x.values().data(), n);
      want = stored(ty, want);
      EXPECT_TRUE(same_bits("add_inplace" + where, y.values(), want));
      ops::cpu::scale_inplace(y.buf(), -0.3f, n);
      ops::ref::scale_inplace<float>(want.data(), -0.3f, n);
      want = stored(ty, want);
      EXPECT_TRUE(same_bits("scale_inplace" + where, y.values(), want));
      ops::cpu::fill(y.buf(), 1.1f, n);  // 1.1 is no bf16: rounded to 1.1015625
      ops::ref::fill<float>(want.data(), 1.1f, n);
      EXPECT_TRUE(same_bits("fill" + where, y.values(), stored(ty, want)));
      ops::cpu::copy(y.buf(), x.cbuf(), n);
      EXPECT_TRUE(same_bits("copy" + where, y.values(), stored(ty, x.values())));
    }
  }
}

// The converting copy against core/dtype.h's scalar conversions, bit for bit: f32 -> bf16 on random
// values and on every special case (NaNs of both signs with payloads in the dropped half, infinities,
// zeros, subnormals, the largest floats that round to infinity, and ties to even both ways); bf16 ->
// f32 on all 65536 patterns; bf16 -> bf16 unchanged. Sizes around the 16-wide AVX2 body and across
// the parallel blocks.
TEST(Elementwise, CopyConvertsBothWays) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> special = {0.0f,
                                -0.0f,
                                inf,
                                -inf,
                                std::numeric_limits<float>::quiet_NaN(),
                                std::bit_cast<float>(0x7f800001u),
                                std::bit_cast<float>(0xff800001u),
                                std::bit_cast<float>(0x7fc0ffffu),
                                std::bit_cast<float>(0xffbf0000u),
                                std::numeric_limits<float>::max(),
                                -std::numeric_limits<float>::max(),
                                std::bit_cast<float>(0x7f7f7fffu),
                                std::bit_cast<float>(0x7f7f8000u),
                                std::numeric_limits<float>::denorm_min(),
                                std::bit_cast<float>(0x00018000u),
                                std::bit_cast<float>(0x80008000u),
                                std::numeric_limits<float>::min(),
                                1.0f + 0x1p-8f,  // tie: rounds down to the even 1
                                1.0f + 0x3p-8f,  // tie: rounds up to the even 1 + 2^-6
                                -1.0f - 0x1p-8f,
                                -(1.0f + 0x3p-8f),
                                1.0f + 0x1p-8f + 0x1p-23f,
                                3.0f};
  Rng rng(41);
  for (const int64_t n :
       {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{23}, int64_t{33}, int64_t{70001}}) {
    std::vector<float> src = op_test::random_vector(n, rng, 100.0);
    for (int64_t i = 0; i < n; ++i) src[i] = i % 3 == 0 ? special[(i / 3) % special.size()] : src[i];
    std::vector<bf16> got(n, bf16{0x1234}), want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = {bf16_from_float(src[i])};
    ops::cpu::copy(got.data(), src.data(), n);
    ASSERT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(bf16)), 0) << "f32 -> bf16, n=" << n;
    std::vector<bf16> again(n, bf16{0x1234});
    ops::cpu::copy(again.data(), got.data(), n);
    EXPECT_EQ(std::memcmp(again.data(), want.data(), n * sizeof(bf16)), 0) << "bf16 -> bf16, n=" << n;
  }
  // Every bf16 pattern, widened: the upper half of the float, NaN payloads included.
  const int64_t n = 65536 + 13;
  std::vector<bf16> all(n);
  for (int64_t i = 0; i < n; ++i) all[i] = {static_cast<uint16_t>(i & 0xffff)};
  std::vector<float> wide(n, 7.0f);
  ops::cpu::copy(wide.data(), all.data(), n);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(wide[i]), static_cast<uint32_t>(all[i].bits) << 16) << "bf16 -> f32 at " << i;
  // The round trip f32 -> bf16 of a widened bf16 is exact (NaNs stay quiet NaNs: a signalling
  // pattern comes back quieted, as bf16_from_float does).
  std::vector<bf16> back(n);
  ops::cpu::copy(back.data(), wide.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(back[i].bits, bf16_from_float(wide[i])) << "f32 -> bf16 at " << i;
}

// bf16 reductions read the widened values in the f32 kernel's lane and block order: the f32 kernel's
// bits on the widened x.
TEST(Elementwise, Bf16ReductionsMatchF32KernelOnWidenedValues) {
  uint64_t seed = 600;
  for (const int64_t n : kBf16Sizes) {
    Rng rng(seed++);
    const Operand x(kBF16, op_test::random_vector(n, rng));
    const std::vector<float> xw = x.values();
    float got[2] = {NAN, NAN}, want[2] = {NAN, NAN};
    ops::cpu::reduce_sum(x.cbuf(), n, &got[0]);
    ops::cpu::reduce_sumsq(x.cbuf(), n, &got[1]);
    ops::cpu::reduce_sum(xw.data(), n, &want[0]);
    ops::cpu::reduce_sumsq(xw.data(), n, &want[1]);
    EXPECT_EQ(std::memcmp(got, want, sizeof(got)), 0)
        << "n=" << n << ": sum " << got[0] << " vs " << want[0] << ", sumsq " << got[1] << " vs " << want[1];
  }
}

// Note [Deterministic reductions] for bf16 inputs: the same bits for 1 and 2 threads, and run to run,
// on the cancelling input of ReductionsBitwiseAcrossThreads rounded to bf16 (a value and its negation
// round alike); also the column sums and the bias gradient into f32 and bf16.
TEST(Elementwise, Bf16ReductionsBitwiseAcrossThreads) {
  const int saved = omp_get_max_threads();
  const int64_t n = 1000003, rows = 1000, d = 1000;
  Rng rng(n);
  std::vector<float> xs(n);
  const int64_t half = n / 2;
  for (int64_t i = 0; i < half; ++i) {
    xs[i] = static_cast<float>(rng.normal() * std::pow(10.0, -12.0 + 24.0 * rng.uniform()));
    if (xs[i] == 0.0f) xs[i] = 1.0f;
    xs[n - 1 - i] = -xs[i];
  }
  xs[half] = 0.125f;
  const Operand x(kBF16, xs);
  const Operand db0(kBF16, op_test::random_vector(d, rng));
  float r[3][2];
  std::vector<double> sums[3];
  std::vector<float> db_f32[3], db_bf16[3];
  const int threads[3] = {1, 2, 2};
  for (int t = 0; t < 3; ++t) {
    omp_set_num_threads(threads[t]);
    ops::cpu::reduce_sum(x.cbuf(), n, &r[t][0]);
    ops::cpu::reduce_sumsq(x.cbuf(), n, &r[t][1]);
    sums[t].resize(d);
    ops::cpu::column_sums_f64(x.cbuf(), rows, d, sums[t].data());
    db_f32[t] = db0.values();
    ops::cpu::bias_backward(x.cbuf(), db_f32[t].data(), rows, d);
    Operand db = db0;
    ops::cpu::bias_backward(x.cbuf(), db.buf(), rows, d);
    db_bf16[t] = db.values();
  }
  omp_set_num_threads(saved);
  for (int t = 1; t < 3; ++t) {
    EXPECT_EQ(std::memcmp(r[0], r[t], sizeof(r[0])), 0) << "reduce_sum/sumsq, run " << t;
    EXPECT_EQ(std::memcmp(sums[0].data(), sums[t].data(), d * sizeof(double)), 0) << "column_sums_f64, run " << t;
    EXPECT_TRUE(op_test::bits_equal(db_f32[0], db_f32[t])) << "bias_backward into f32, run " << t;
    EXPECT_TRUE(op_test::bits_equal(db_bf16[0], db_bf16[t])) << "bias_backward into bf16, run " << t;
  }
}

// bf16 bias add, its gradient and the column sums against the reference on the widened values, the
// results rounded to the output's dtype: the add is one f32 operation per element and each column one
// double sum in row order (then one f32 addition to db) in both, so the bits are equal; 1 and 2
// threads, widths around the 64-column block and the 256 staging chunk.
TEST(Elementwise, Bf16BiasMatchesReferenceOnWidenedValues) {
  const int saved = omp_get_max_threads();
  uint64_t seed = 700;
  for (const auto& [rows, d] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 63}, {7, 65}, {5, 255}, {9, 256}, {300, 257}, {130, 513}}) {
    for (const auto& [ty, tb] : kMixed) {
      Rng rng(seed++);
      const std::string where =
          " " + std::to_string(rows) + " x " + std::to_string(d) + " y/dy " + dt(ty) + " b/db " + dt(tb);
      const Operand y0(ty, op_test::random_vector(rows * d, rng));
      const Operand b(tb, op_test::random_vector(d, rng)), db0(tb, op_test::random_vector(d, rng));
      std::vector<float> want = y0.values(), want_db = db0.values();
      ops::ref::bias_add<float>(want.data(), b.values().data(), rows, d);
      want = stored(ty, want);
      ops::ref::bias_backward<float>(y0.values().data(), want_db.data(), rows, d);
      want_db = stored(tb, want_db);
      std::vector<double> want_sums(static_cast<size_t>(d));
      ops::ref::column_sums_f64<float>(y0.values().data(), rows, d, want_sums.data());
      for (const int t : {1, 2}) {
        omp_set_num_threads(t);
        Operand y = y0, db = db0;
        ops::cpu::bias_add(y.buf(), b.cbuf(), rows, d);
        EXPECT_TRUE(same_bits("bias_add" + where, y.values(), want)) << t << " threads";
        ops::cpu::bias_backward(y0.cbuf(), db.buf(), rows, d);
        EXPECT_TRUE(same_bits("bias_backward" + where, db.values(), want_db)) << t << " threads";
        std::vector<double> sums(static_cast<size_t>(d));
        ops::cpu::column_sums_f64(y0.cbuf(), rows, d, sums.data());
        EXPECT_EQ(sums, want_sums) << "column_sums_f64" << where << ", " << t << " threads";
      }
    }
  }
  omp_set_num_threads(saved);
}

// Strided blocks with bf16 on either side: copy_2d converts, add_2d adds in f32 and rounds once;
// every element of the block, nothing outside it (bit for bit). Widths below and across the chunk.
TEST(Elementwise, Bf16StridedBlocksCopyAndAdd) {
  Rng rng(800);
  for (const int64_t cols : {int64_t{7}, int64_t{300}}) {
    const int64_t rows = 150, lds = cols + 4, ldd = cols + 6;
    for (const auto& [td, ts] :
         std::vector<std::pair<DType, DType>>{{kBF16, kBF16}, {kF32, kBF16}, {kBF16, kF32}, {kF32, kF32}}) {
      const std::string where = " cols=" + std::to_string(cols) + " dst " + dt(td) + " src " + dt(ts);
      const Operand src(ts, op_test::random_vector(rows * lds, rng));
      Operand dst(td, op_test::random_vector(rows * ldd, rng));
      const std::vector<float> s = src.values();
      std::vector<float> want = dst.values();
      ops::cpu::add_2d(dst.buf(), ldd, src.cbuf(), lds, rows, cols);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) want[r * ldd + c] += s[r * lds + c];
      want = stored(td, want);
      EXPECT_TRUE(same_bits("add_2d" + where, dst.values(), want));
      ops::cpu::copy_2d(dst.buf(), ldd, src.cbuf(), lds, rows, cols);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) want[r * ldd + c] = s[r * lds + c];
      EXPECT_TRUE(same_bits("copy_2d" + where, dst.values(), stored(td, want)));
    }
  }
}

// Operands other than f32 and bf16 are an internal error naming the kernel, raised before any work.
TEST(Elementwise, OtherDtypesAssert) {
  std::vector<float> a(8, 1.0f), b(8, 2.0f);
  const Buf f16(a.data(), DType::DType_F16);
  const CBuf f64(b.data(), DType::DType_F64);
  EXPECT_THROW(ops::cpu::add_inplace(f16, b.data(), 4), InternalError);
  EXPECT_THROW(ops::cpu::add_inplace(a.data(), f64, 4), InternalError);
  EXPECT_THROW(ops::cpu::scale_inplace(f16, 2.0f, 4), InternalError);
  EXPECT_THROW(ops::cpu::fill(f16, 2.0f, 4), InternalError);
  EXPECT_THROW(ops::cpu::copy(f16, b.data(), 4), InternalError);
  EXPECT_THROW(ops::cpu::copy(f16, CBuf(f16), 4), InternalError);
  float out = 0;
  EXPECT_THROW(ops::cpu::reduce_sum(f64, 4, &out), InternalError);
  EXPECT_THROW(ops::cpu::bias_backward(b.data(), f16, 2, 2), InternalError);
  EXPECT_THROW(ops::cpu::copy_2d(a.data(), 4, f64, 4, 2, 2), InternalError);
  try {
    ops::cpu::add_inplace(f16, b.data(), 4);
  } catch (const InternalError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("add_inplace"), std::string::npos) << what;
    EXPECT_NE(what.find("f16"), std::string::npos) << what;
  }
  EXPECT_EQ(a, std::vector<float>(8, 1.0f));  // nothing written
}

}  // namespace fp
