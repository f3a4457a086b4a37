// Token embedding: forward and backward against the scalar reference (bit for bit: both do the same
// float additions in the same order, Note [Deterministic embedding backward]), with many repeated
// tokens; the backward's bits for 1 and 2 threads; the reference backward against finite
// differences. Dimensions: n tokens, H hidden, V vocabulary.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "op_test.h"
#include "ops/embedding.h"
#include "ops/ref/embedding.h"

namespace fp {

namespace {

const std::vector<int64_t> kHidden = {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129, 257};

}  // namespace

TEST(Embedding, MatchesReferenceExactly) {
  uint64_t seed = 1;
  for (const int64_t H : kHidden) {
    for (const int64_t V : {int64_t{3}, int64_t{1000}}) {  // V = 3: nearly every token repeats
      Rng rng(seed++);
      const int64_t n = 37 + H % 11;
      const std::vector<int32_t> tokens = op_test::random_ids(n, V, rng);
      const std::vector<float> table = op_test::random_vector<float>(V * H, rng);    // (V, H)
      const std::vector<float> dout = op_test::random_vector<float>(n * H, rng);     // (n, H)
      const std::vector<float> dtable0 = op_test::random_vector<float>(V * H, rng);  // (V, H) accumulated into
      std::vector<float> got(n * H), want(n * H);
      ops::cpu::embedding_forward(tokens.data(), table.data(), got.data(), n, H);
      ops::ref::embedding_forward<float>(tokens.data(), table.data(), want.data(), n, H);
      EXPECT_TRUE(op_test::near("embedding_forward", {n, H}, got, want, op_test::tol_exact()));
      std::vector<float> dgot = dtable0, dwant = dtable0;
      ops::cpu::embedding_backward(tokens.data(), dout.data(), dgot.data(), n, H);
      ops::ref::embedding_backward<float>(tokens.data(), dout.data(), dwant.data(), n, H);
      EXPECT_TRUE(op_test::near("embedding_backward", {V, H}, dgot, dwant, op_test::tol_exact()));
    }
  }
}

TEST(Embedding, NegativeIdAsserts) {
  const std::vector<int32_t> tokens = {0, -1};
  std::vector<float> table(8, 1.0f), out(8);
  EXPECT_THROW(ops::cpu::embedding_forward(tokens.data(), table.data(), out.data(), 2, 4), InternalError);
  EXPECT_THROW(ops::cpu::embedding_backward(tokens.data(), out.data(), table.data(), 2, 4), InternalError);
}

TEST(Embedding, BackwardBitwiseAcrossThreads) {
  const int saved = omp_get_max_threads();
  const int64_t n = 1031, H = 333, V = 17;
  Rng rng(5);
  const std::vector<int32_t> tokens = op_test::random_ids(n, V, rng);
  const std::vector<float> dout = op_test::random_vector<float>(n * H, rng);
  const std::vector<float> dtable0 = op_test::random_vector<float>(V * H, rng);
  std::vector<float> r[3] = {dtable0, dtable0, dtable0};
  const int threads[3] = {1, 2, 2};
  for (int t = 0; t < 3; ++t) {
    omp_set_num_threads(threads[t]);
    ops::cpu::embedding_backward(tokens.data(), dout.data(), r[t].data(), n, H);
  }
  omp_set_num_threads(saved);
  // Past the parallel threshold, still the reference's bits.
  std::vector<float> want = dtable0;
  ops::ref::embedding_backward<float>(tokens.data(), dout.data(), want.data(), n, H);
  EXPECT_TRUE(op_test::near("embedding_backward (2 threads)", {V, H}, r[2], want, op_test::tol_exact()));
  EXPECT_EQ(std::memcmp(r[0].data(), r[1].data(), r[0].size() * sizeof(float)), 0) << "1 vs 2 threads differ";
  EXPECT_EQ(std::memcmp(r[1].data(), r[2].data(), r[0].size() * sizeof(float)), 0) << "two runs differ";
}

// L = sum r . embedding_forward(table); dL/dtable from the reference backward (with dout = r) against
// central differences of L in double. L is linear in the table, so the differences are exact up to
// rounding: relative 1e-7 holds with a wide margin.
TEST(Embedding, ReferenceBackwardMatchesFiniteDifferences) {
  const int64_t n = 13, H = 5, V = 4;
  Rng rng(9);
  const std::vector<int32_t> tokens = op_test::random_ids(n, V, rng);
  std::vector<double> table = op_test::random_vector<double>(V * H, rng);
  const std::vector<double> r = op_test::random_vector<double>(n * H, rng);
  auto loss = [&] {
    std::vector<double> out(n * H);
    ops::ref::embedding_forward<double>(tokens.data(), table.data(), out.data(), n, H);
    double L = 0;
    for (int64_t i = 0; i < n * H; ++i) L += r[i] * out[i];
    return L;
  };
  std::vector<double> grad(V * H, 0.0);
  ops::ref::embedding_backward<double>(tokens.data(), r.data(), grad.data(), n, H);
  const double step = 1e-4;
  for (int64_t i = 0; i < V * H; ++i) {
    const double fd = op_test::central_difference(table[i], loss, step);
    EXPECT_NEAR(grad[i], fd, 1e-7 * (1 + std::abs(fd))) << "dtable[" << i / H << "," << i % H << "]";
  }
}

}  // namespace fp
