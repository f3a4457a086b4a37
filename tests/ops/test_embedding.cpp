// Token embedding: forward and backward against the scalar reference (bit for bit: both do the same
// float additions in the same order, Note [Deterministic embedding backward]), with many repeated
// tokens; the backward's bits for 1 and 2 threads; the reference backward against finite
// differences; bf16 tables and gradients (alone and mixed with f32) against the reference on the
// widened values, a bf16 dtable rounded once per call. Dimensions: n tokens, H hidden, V vocabulary.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/kernels/ops.h"
#include "core/buf.h"
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

namespace {

using op_test::kBF16;
using op_test::kF32;
using op_test::Operand;
using op_test::dt;
using op_test::same_bits;
using op_test::stored;

// (table or dtable, out or dout) dtypes: both bf16, and each with the other f32.
const std::vector<std::pair<DType, DType>> kMixed = {{kBF16, kBF16}, {kBF16, kF32}, {kF32, kBF16}};

}  // namespace

// bf16: forward copies (or converts) rows; backward adds each row's gradients in token order in f32,
// starting from the widened dtable row, and rounds a bf16 dtable once: the reference's float
// additions on the widened values, rounded, so equal bits. Widths around SIMD widths and the
// 256-column staging chunk; V = 3 repeats nearly every token.
TEST(Embedding, Bf16MatchesReferenceOnWidenedValues) {
  uint64_t seed = 200;
  for (const int64_t H :
       {int64_t{1}, int64_t{9}, int64_t{17}, int64_t{255}, int64_t{256}, int64_t{257}, int64_t{513}}) {
    for (const int64_t V : {int64_t{3}, int64_t{1000}}) {
      for (const auto& [tt, to] : kMixed) {
        Rng rng(seed++);
        const int64_t n = 37 + H % 11;
        const std::string where =
            " H=" + std::to_string(H) + " V=" + std::to_string(V) + " table " + dt(tt) + " out " + dt(to);
        const std::vector<int32_t> tokens = op_test::random_ids(n, V, rng);
        const Operand table(tt, op_test::random_vector<float>(V * H, rng));    // (V, H)
        const Operand dout(to, op_test::random_vector<float>(n * H, rng));     // (n, H)
        const Operand dtable0(tt, op_test::random_vector<float>(V * H, rng));  // (V, H) accumulated into
        std::vector<float> want(n * H), dwant = dtable0.values();
        ops::ref::embedding_forward<float>(tokens.data(), table.values().data(), want.data(), n, H);
        ops::ref::embedding_backward<float>(tokens.data(), dout.values().data(), dwant.data(), n, H);
        Operand got(to, std::vector<float>(n * H)), dgot = dtable0;
        ops::cpu::embedding_forward(tokens.data(), table.cbuf(), got.buf(), n, H);
        EXPECT_TRUE(same_bits("embedding_forward" + where, {n, H}, got.values(), stored(to, want)));
        ops::cpu::embedding_backward(tokens.data(), dout.cbuf(), dgot.buf(), n, H);
        EXPECT_TRUE(same_bits("embedding_backward" + where, {V, H}, dgot.values(), stored(tt, dwant)));
      }
    }
  }
}

// A bf16 dtable is rounded once per call, not once per token: a row at 1 gets 2^-9 from each of four
// tokens. Each 1 + 2^-9 alone rounds back to 1 in bf16 (8 significant bits), so rounding per token
// would leave 1; the sum 1 + 2^-7 is a bf16.
TEST(Embedding, Bf16BackwardRoundsOncePerCall) {
  const int64_t n = 5, H = 3;
  const std::vector<int32_t> tokens = {1, 0, 1, 1, 1};
  std::vector<bf16> dout(n * H, bf16{bf16_from_float(0x1p-9f)}), dtable(2 * H, bf16{bf16_from_float(1.0f)});
  ops::cpu::embedding_backward(tokens.data(), dout.data(), dtable.data(), n, H);
  for (int64_t h = 0; h < H; ++h) {
    EXPECT_EQ(bf16_to_float(dtable[H + h].bits), 1.0f + 0x1p-7f) << "row 1, column " << h;
    EXPECT_EQ(bf16_to_float(dtable[h].bits), 1.0f) << "row 0, column " << h;  // one 2^-9 rounds away
  }
}

// Note [bf16 embedding backward]: the same bits for 1 and 2 threads and run to run, into a bf16 dtable
// from bf16 and from f32 gradients, and into an f32 dtable from bf16 gradients; past the parallel
// threshold, still the reference's bits on the widened values.
TEST(Embedding, Bf16BackwardBitwiseAcrossThreads) {
  const int saved = omp_get_max_threads();
  const int64_t n = 1031, H = 333, V = 17;
  for (const auto& [tt, to] : kMixed) {
    Rng rng(5);
    const std::vector<int32_t> tokens = op_test::random_ids(n, V, rng);
    const Operand dout(to, op_test::random_vector<float>(n * H, rng));
    const Operand dtable0(tt, op_test::random_vector<float>(V * H, rng));
    std::vector<float> r[3];
    const int threads[3] = {1, 2, 2};
    for (int t = 0; t < 3; ++t) {
      omp_set_num_threads(threads[t]);
      Operand d = dtable0;
      ops::cpu::embedding_backward(tokens.data(), dout.cbuf(), d.buf(), n, H);
      r[t] = d.values();
    }
    omp_set_num_threads(saved);
    std::vector<float> want = dtable0.values();
    ops::ref::embedding_backward<float>(tokens.data(), dout.values().data(), want.data(), n, H);
    const std::string where = " dtable " + dt(tt) + " dout " + dt(to);
    EXPECT_TRUE(same_bits("embedding_backward (2 threads)" + where, {V, H}, r[2], stored(tt, want)));
    EXPECT_TRUE(op_test::bits_equal(r[0], r[1])) << "1 vs 2 threads differ" << where;
    EXPECT_TRUE(op_test::bits_equal(r[1], r[2])) << "two runs differ" << where;
  }
}

TEST(Embedding, OtherDtypesAssert) {
  const std::vector<int32_t> tokens = {0, 1};
  std::vector<float> table(8, 1.0f), out(8);
  EXPECT_THROW(ops::cpu::embedding_forward(tokens.data(), CBuf(table.data(), DType::DType_F16), out.data(), 2, 4),
               InternalError);
  EXPECT_THROW(ops::cpu::embedding_backward(tokens.data(), out.data(), Buf(table.data(), DType::DType_F64), 2, 4),
               InternalError);
}

}  // namespace fp
