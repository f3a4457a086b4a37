// RMSNorm: forward (also in place) and backward against the scalar reference at widths around SIMD
// widths and row counts around the dw row block; the reference backward against finite differences;
// dx and dw bit for bit for 1 and 2 threads (Note [Deterministic rmsnorm dw]); bf16 operands (alone
// and with an f32 weight) against the f32 kernel on the widened values, rounded.
// Dimensions: rows independent rows of width d.
#include <gtest/gtest.h>
#include <omp.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/kernels/ops.h"
#include "core/buf.h"
#include "core/error.h"
#include "core/rng.h"
#include "op_test.h"
#include "ops/ref/rmsnorm.h"
#include "ops/rmsnorm.h"

namespace fp {

namespace {

const std::vector<int64_t> kWidths = {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129, 1000};
const std::vector<int64_t> kRows = {1, 3, 63, 64, 65, 130};

}  // namespace

// Forward: both take the sum of squares in double (orders differ by ~1e-16 relative), round rstd to
// float the same way, and then do the same two float multiplies. Allow 4 eps relative.
// Backward dx: the same float operations after a double dot product, so 4 eps of the two terms'
// magnitudes. dw: the kernel sums 64-row blocks in float (error <= 64 eps of the sum of |terms|),
// the reference sums all rows in double; allow (64 + 8) eps sum_rows |dy x rstd| + eps |dw|.
TEST(Rmsnorm, MatchesReference) {
  uint64_t seed = 1;
  const float eps = 1e-6f;
  for (const int64_t d : kWidths) {
    for (const int64_t rows : kRows) {
      Rng rng(seed++);
      // Rows with magnitudes spread over 10^-2..10^2, so rstd varies.
      std::vector<float> x = op_test::random_vector<float>(rows * d, rng);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < d; ++i) x[r * d + i] *= static_cast<float>(std::pow(10.0, -2.0 + 4.0 * r / rows));
      const std::vector<float> w = op_test::random_vector<float>(d, rng);
      const std::vector<float> dy = op_test::random_vector<float>(rows * d, rng);
      const std::vector<float> dw0 = op_test::random_vector<float>(d, rng);
      const std::string where = "rows=" + std::to_string(rows) + " d=" + std::to_string(d);

      std::vector<float> y(rows * d), y_ref(rows * d), rstd(rows), rstd_ref(rows);
      ops::cpu::rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), rows, d, eps);
      ops::ref::rmsnorm_forward<float>(x.data(), w.data(), y_ref.data(), rstd_ref.data(), rows, d, eps);
      std::vector<double> tol(rows * d);
      for (int64_t i = 0; i < rows * d; ++i) tol[i] = 4 * FLT_EPSILON * std::abs(y_ref[i]);
      EXPECT_TRUE(op_test::near("rmsnorm_forward y " + where, {rows, d}, y, y_ref, op_test::tol_each(tol)));
      std::vector<double> tol_rstd(rows);
      for (int64_t r = 0; r < rows; ++r) tol_rstd[r] = 2 * FLT_EPSILON * std::abs(rstd_ref[r]);
      EXPECT_TRUE(op_test::near("rmsnorm_forward rstd " + where, {rows}, rstd, rstd_ref, op_test::tol_each(tol_rstd)));

      // In place (y aliases x), without rstd.
      std::vector<float> inplace = x;
      ops::cpu::rmsnorm_forward(inplace.data(), w.data(), inplace.data(), nullptr, rows, d, eps);
      EXPECT_TRUE(
          op_test::near("rmsnorm_forward in place " + where, {rows, d}, inplace, y_ref, op_test::tol_each(tol)));

      std::vector<float> dx(rows * d), dx_ref(rows * d), dw = dw0, dw_ref = dw0;
      std::vector<float> ws(static_cast<size_t>(ops::cpu::rmsnorm_backward_workspace(rows, d)));
      ops::cpu::rmsnorm_backward(x.data(), w.data(), rstd_ref.data(), dy.data(), dx.data(), dw.data(), rows, d,
                                 ws.data());
      ops::ref::rmsnorm_backward<float>(x.data(), w.data(), rstd_ref.data(), dy.data(), dx_ref.data(), dw_ref.data(),
                                        rows, d);
      std::vector<double> tol_dx(rows * d), tol_dw(d);
      for (int64_t r = 0; r < rows; ++r) {
        const double rs = rstd_ref[r];
        double s = 0;
        for (int64_t i = 0; i < d; ++i) s += static_cast<double>(dy[r * d + i]) * w[i] * x[r * d + i];
        for (int64_t i = 0; i < d; ++i) {
          const double t1 = std::abs(rs * w[i] * dy[r * d + i]);
          const double t2 = std::abs(x[r * d + i] * rs * rs * rs * s / d);
          tol_dx[r * d + i] = 4 * FLT_EPSILON * (t1 + t2);
          tol_dw[i] += std::abs(static_cast<double>(dy[r * d + i]) * x[r * d + i] * rs);
        }
      }
      for (int64_t i = 0; i < d; ++i) tol_dw[i] = (64 + 8) * FLT_EPSILON * tol_dw[i] + FLT_EPSILON * std::abs(dw0[i]);
      EXPECT_TRUE(op_test::near("rmsnorm_backward dx " + where, {rows, d}, dx, dx_ref, op_test::tol_each(tol_dx)));
      EXPECT_TRUE(op_test::near("rmsnorm_backward dw " + where, {d}, dw, dw_ref, op_test::tol_each(tol_dw)));
    }
  }
}

TEST(Rmsnorm, BackwardBitwiseAcrossThreads) {
  const int saved = omp_get_max_threads();
  const int64_t rows = 1000, d = 129;  // 16 row blocks, the last one partial
  Rng rng(3);
  const std::vector<float> x = op_test::random_vector<float>(rows * d, rng), w = op_test::random_vector<float>(d, rng);
  const std::vector<float> dy = op_test::random_vector<float>(rows * d, rng),
                           dw0 = op_test::random_vector<float>(d, rng);
  std::vector<float> rstd(rows), y(rows * d);
  ops::cpu::rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), rows, d, 1e-6f);
  std::vector<float> dx[3], dw[3];
  const int threads[3] = {1, 2, 2};
  for (int t = 0; t < 3; ++t) {
    omp_set_num_threads(threads[t]);
    dx[t].resize(rows * d);
    dw[t] = dw0;
    std::vector<float> ws(static_cast<size_t>(ops::cpu::rmsnorm_backward_workspace(rows, d)));
    ops::cpu::rmsnorm_backward(x.data(), w.data(), rstd.data(), dy.data(), dx[t].data(), dw[t].data(), rows, d,
                               ws.data());
  }
  omp_set_num_threads(saved);
  for (int t = 1; t < 3; ++t) {
    EXPECT_EQ(std::memcmp(dx[0].data(), dx[t].data(), dx[0].size() * sizeof(float)), 0) << "dx, run " << t;
    EXPECT_EQ(std::memcmp(dw[0].data(), dw[t].data(), dw[0].size() * sizeof(float)), 0) << "dw, run " << t;
  }
}

// L = sum q . y(x, w) in double; dL/dx and dL/dw from the reference backward (dy = q, dw from 0)
// against central differences. Step 1e-5 on O(1) inputs: truncation ~1e-10, rounding ~1e-11.
TEST(Rmsnorm, ReferenceBackwardMatchesFiniteDifferences) {
  for (const int64_t d : {int64_t{1}, int64_t{5}, int64_t{16}}) {
    const int64_t rows = 3;
    const double eps = 1e-3;  // large enough to matter in the gradient
    Rng rng(11 + d);
    std::vector<double> x = op_test::random_vector<double>(rows * d, rng), w = op_test::random_vector<double>(d, rng);
    const std::vector<double> q = op_test::random_vector<double>(rows * d, rng);
    auto loss = [&] {
      std::vector<double> y(rows * d);
      ops::ref::rmsnorm_forward<double>(x.data(), w.data(), y.data(), nullptr, rows, d, eps);
      double L = 0;
      for (int64_t i = 0; i < rows * d; ++i) L += q[i] * y[i];
      return L;
    };
    std::vector<double> y(rows * d), rstd(rows), dx(rows * d), dw(d, 0.0);
    ops::ref::rmsnorm_forward<double>(x.data(), w.data(), y.data(), rstd.data(), rows, d, eps);
    ops::ref::rmsnorm_backward<double>(x.data(), w.data(), rstd.data(), q.data(), dx.data(), dw.data(), rows, d);
    auto fd = [&](double& v) { return op_test::central_difference(v, loss); };
    for (int64_t i = 0; i < rows * d; ++i) {
      const double g = fd(x[i]);
      EXPECT_NEAR(dx[i], g, 1e-7 * (1 + std::abs(g))) << "d=" << d << " dx[" << i / d << "," << i % d << "]";
    }
    for (int64_t i = 0; i < d; ++i) {
      const double g = fd(w[i]);
      EXPECT_NEAR(dw[i], g, 1e-7 * (1 + std::abs(g))) << "d=" << d << " dw[" << i << "]";
    }
  }
}

// The workspace is bounded (at most 256 row blocks, longer blocks past 16384 rows) and the result
// stays exact to the reference within the longer blocks' float sums.
TEST(Rmsnorm, WorkspaceBoundedAtManyRows) {
  EXPECT_EQ(ops::cpu::rmsnorm_backward_workspace(100, 7), 2 * 7);  // 64-row blocks below 16384 rows
  EXPECT_EQ(ops::cpu::rmsnorm_backward_workspace(16384, 7), 256 * 7);
  EXPECT_LE(ops::cpu::rmsnorm_backward_workspace(int64_t{1} << 20, 7168), 256 * 7168);
  EXPECT_LE(ops::cpu::rmsnorm_backward_workspace(int64_t{64} << 20, 128), 256 * 128);
  const int64_t rows = 40000, d = 8, br = (rows + 255) / 256;  // 157-row blocks, 255 of them
  Rng rng(11);
  const std::vector<float> x = op_test::random_vector<float>(rows * d, rng), w = op_test::random_vector<float>(d, rng);
  const std::vector<float> dy = op_test::random_vector<float>(rows * d, rng);
  std::vector<float> rstd(rows), y(rows * d), dx(rows * d), dw(d, 0.0f), dx_ref(rows * d), dw_ref(d, 0.0f);
  ops::cpu::rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), rows, d, 1e-6f);
  std::vector<float> ws(static_cast<size_t>(ops::cpu::rmsnorm_backward_workspace(rows, d)));
  EXPECT_EQ(static_cast<int64_t>(ws.size()), 255 * d);
  ops::cpu::rmsnorm_backward(x.data(), w.data(), rstd.data(), dy.data(), dx.data(), dw.data(), rows, d, ws.data());
  std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), rd(rstd.begin(), rstd.end());
  std::vector<double> dyd(dy.begin(), dy.end()), dxd(rows * d), dwd(d, 0.0);
  ops::ref::rmsnorm_backward<double>(xd.data(), wd.data(), rd.data(), dyd.data(), dxd.data(), dwd.data(), rows, d);
  for (int64_t i = 0; i < d; ++i) {
    double scale = 0;
    for (int64_t r = 0; r < rows; ++r) scale += std::abs(dyd[r * d + i] * xd[r * d + i] * rd[r]);
    EXPECT_NEAR(dw[i], dwd[i], (br + 8) * FLT_EPSILON * scale) << "dw " << i;
  }
}

namespace {

using op_test::kBF16;
using op_test::kF32;
using op_test::Operand;
using op_test::dt;
using op_test::same_bits;
using op_test::stored;

// Widths around SIMD widths and the 256-element staging chunk (Note [bf16 rmsnorm by f32 chunks]).
const std::vector<int64_t> kBf16Widths = {1, 7, 8, 9, 17, 255, 256, 257, 513, 1000};
const std::vector<int64_t> kBf16Rows = {1, 3, 65, 130};

// Activations (x, y; dy, dx) and weight (w, dw) dtypes: all bf16, a bf16 activation with an f32
// weight, and an f32 activation with a bf16 weight.
struct Dtypes {
  DType act, weight;
};
const std::vector<Dtypes> kDtypes = {{kBF16, kBF16}, {kBF16, kF32}, {kF32, kBF16}};

}  // namespace

// bf16 operands: the kernel widens them exactly, runs the f32 math with the f32 kernel's lane order
// (chunks start at multiples of 8) and rounds each output once, so y, rstd, dx and dw are the f32
// kernel's on the widened values, rounded to the output's dtype: equal bits. Also in place (y = x).
TEST(Rmsnorm, Bf16MatchesF32KernelOnWidenedValues) {
  uint64_t seed = 300;
  const float eps = 1e-6f;
  for (const int64_t d : kBf16Widths) {
    for (const int64_t rows : kBf16Rows) {
      for (const Dtypes& t : kDtypes) {
        Rng rng(seed++);
        std::vector<float> xs = op_test::random_vector<float>(rows * d, rng);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < d; ++i) xs[r * d + i] *= static_cast<float>(std::pow(10.0, -2.0 + 4.0 * r / rows));
        const Operand x(t.act, xs), w(t.weight, op_test::random_vector<float>(d, rng));
        const Operand dy(t.act, op_test::random_vector<float>(rows * d, rng));
        const Operand dw0(t.weight, op_test::random_vector<float>(d, rng));
        const std::string where =
            " rows=" + std::to_string(rows) + " d=" + std::to_string(d) + " act " + dt(t.act) + " w " + dt(t.weight);

        // The expected values: the f32 kernel on the widened operands.
        const std::vector<float> xw = x.values(), ww = w.values(), dyw = dy.values();
        std::vector<float> y_f(rows * d), rstd_f(rows), dx_f(rows * d), dw_f = dw0.values();
        std::vector<float> ws(static_cast<size_t>(ops::cpu::rmsnorm_backward_workspace(rows, d)));
        ops::cpu::rmsnorm_forward(xw.data(), ww.data(), y_f.data(), rstd_f.data(), rows, d, eps);
        ops::cpu::rmsnorm_backward(xw.data(), ww.data(), rstd_f.data(), dyw.data(), dx_f.data(), dw_f.data(), rows, d,
                                   ws.data());

        Operand y(t.act, std::vector<float>(rows * d, 0.0f));
        std::vector<float> rstd(rows);
        ops::cpu::rmsnorm_forward(x.cbuf(), w.cbuf(), y.buf(), rstd.data(), rows, d, eps);
        EXPECT_TRUE(same_bits("rmsnorm_forward y" + where, {rows, d}, y.values(), stored(t.act, y_f)));
        EXPECT_TRUE(same_bits("rmsnorm_forward rstd" + where, {rows}, rstd, rstd_f));
        Operand inplace = x;
        ops::cpu::rmsnorm_forward(inplace.cbuf(), w.cbuf(), inplace.buf(), nullptr, rows, d, eps);
        EXPECT_TRUE(same_bits("rmsnorm_forward in place" + where, {rows, d}, inplace.values(), stored(t.act, y_f)));

        Operand dx(t.act, std::vector<float>(rows * d, 0.0f)), dw = dw0;
        ops::cpu::rmsnorm_backward(x.cbuf(), w.cbuf(), rstd_f.data(), dy.cbuf(), dx.buf(), dw.buf(), rows, d,
                                   ws.data());
        EXPECT_TRUE(same_bits("rmsnorm_backward dx" + where, {rows, d}, dx.values(), stored(t.act, dx_f)));
        EXPECT_TRUE(same_bits("rmsnorm_backward dw" + where, {d}, dw.values(), stored(t.weight, dw_f)));
      }
    }
  }
}

// Note [Deterministic rmsnorm dw] with bf16 operands: dx and the bf16 dw have the same bits for 1 and
// 2 threads and run to run.
TEST(Rmsnorm, Bf16BackwardBitwiseAcrossThreads) {
  const int saved = omp_get_max_threads();
  const int64_t rows = 1000, d = 300;  // 16 row blocks, the last one partial; two chunks per row
  Rng rng(31);
  const Operand x(kBF16, op_test::random_vector<float>(rows * d, rng)), w(kBF16, op_test::random_vector<float>(d, rng));
  const Operand dy(kBF16, op_test::random_vector<float>(rows * d, rng)),
      dw0(kBF16, op_test::random_vector<float>(d, rng));
  Operand y(kBF16, std::vector<float>(rows * d));
  std::vector<float> rstd(rows);
  ops::cpu::rmsnorm_forward(x.cbuf(), w.cbuf(), y.buf(), rstd.data(), rows, d, 1e-6f);
  std::vector<float> dx[3], dw[3];
  const int threads[3] = {1, 2, 2};
  for (int t = 0; t < 3; ++t) {
    omp_set_num_threads(threads[t]);
    Operand dxt(kBF16, std::vector<float>(rows * d)), dwt = dw0;
    std::vector<float> ws(static_cast<size_t>(ops::cpu::rmsnorm_backward_workspace(rows, d)));
    ops::cpu::rmsnorm_backward(x.cbuf(), w.cbuf(), rstd.data(), dy.cbuf(), dxt.buf(), dwt.buf(), rows, d, ws.data());
    dx[t] = dxt.values();
    dw[t] = dwt.values();
  }
  omp_set_num_threads(saved);
  for (int t = 1; t < 3; ++t) {
    EXPECT_TRUE(op_test::bits_equal(dx[0], dx[t])) << "dx, run " << t;
    EXPECT_TRUE(op_test::bits_equal(dw[0], dw[t])) << "dw, run " << t;
  }
}

// Operands other than f32 and bf16 are an internal error naming the kernel.
TEST(Rmsnorm, OtherDtypesAssert) {
  std::vector<float> x(8, 1.0f), w(4, 1.0f), y(8), rstd(2), ws(8);
  const Buf f16(y.data(), DType::DType_F16);
  EXPECT_THROW(ops::cpu::rmsnorm_forward(x.data(), w.data(), f16, rstd.data(), 2, 4, 1e-6f), InternalError);
  EXPECT_THROW(ops::cpu::rmsnorm_backward(x.data(), CBuf(w.data(), DType::DType_F64), rstd.data(), x.data(), y.data(),
                                          w.data(), 2, 4, ws.data()),
               InternalError);
}

}  // namespace fp
