// moe_chunk_order (PipelinedLLEP's chunk order, ops/moe_chunk_order.h): the stable counting sort of routed
// copies by (chunk, destination), against an independent construction (std::stable_sort) and the scalar
// reference (ops/ref/moe_chunk_order.h), exactly (integer work): strided and contiguous chunks, empty
// chunks and empty pieces, repeated tokens, W = 1, m = 0, without the tokens output, and the assertions
// on pieces that do not tile the rows and on tokens outside the chunks.
// m routed copies, P pieces, K chunks, W ranks, B block counters.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "backend/cpu/kernels/ops.h"
#include "core/error.h"
#include "core/rng.h"
#include "op_test.h"
#include "ops/moe_chunk_order.h"
#include "ops/ref/moe_chunk_order.h"

namespace {

struct Case {
  std::vector<int32_t> rows;    // (m) token of each row
  std::vector<int64_t> pieces;  // (P, 5)
  int64_t K = 1, c_eff = 0, W = 1, B = 0;
  bool strided = true;
  int64_t m() const { return static_cast<int64_t>(rows.size()); }
  int64_t P() const { return static_cast<int64_t>(pieces.size()) / 5; }
  fp::ops::ChunkOrderSpec spec() const { return {m(), P(), K, c_eff, strided, W, B}; }
};

struct Out {
  std::vector<int32_t> order, tokens;
  std::vector<int64_t> offsets, blocks;
};

// Poisoned outputs: every entry must be written.
Out poisoned(const Case& c) {
  return {std::vector<int32_t>(c.m(), -7), std::vector<int32_t>(c.m(), -7), std::vector<int64_t>(c.K * c.W + 1, -7),
          std::vector<int64_t>(c.B, -7)};
}

Out run_cpu(const Case& c, bool with_tokens = true) {
  Out o = poisoned(c);
  fp::ops::cpu::moe_chunk_order(c.rows.data(), c.pieces.data(), c.spec(), o.order.data(),
                                with_tokens ? o.tokens.data() : nullptr, o.offsets.data(), o.blocks.data());
  return o;
}

Out run_ref(const Case& c) {
  Out o = poisoned(c);
  fp::ops::ref::moe_chunk_order(c.rows.data(), c.pieces.data(), c.spec(), o.order.data(), o.tokens.data(),
                                o.offsets.data(), o.blocks.data());
  return o;
}

// n tokens, k copies each, in a random expert-like order (each token repeated k times, shuffled), cut into
// pieces of random lengths (0 included) to random ranks, with pieces' counters laid out per destination
// as the dispatch does ((K, X) per rank, X counters each).
Case random_case(fp::Rng& rng, int64_t n, int64_t k, int64_t K, int64_t W, bool strided, int64_t max_piece) {
  Case c;
  c.K = K, c.W = W, c.strided = strided;
  c.c_eff = (n + K - 1) / K;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) c.rows.push_back(static_cast<int32_t>(t));
  for (int64_t i = c.m() - 1; i > 0; --i) std::swap(c.rows[i], c.rows[rng.below(i + 1)]);
  const int64_t X = 3;  // counters per destination and chunk
  c.B = W * K * X;
  for (int64_t b = 0; b < c.m() || c.P() == 0;) {
    const int64_t e = std::min<int64_t>(c.m(), b + static_cast<int64_t>(rng.below(max_piece + 1)));
    const int64_t d = static_cast<int64_t>(rng.below(W)), x = static_cast<int64_t>(rng.below(X));
    c.pieces.insert(c.pieces.end(), {b, e, d, K * X * d + x, X});
    b = e;
    if (c.m() == 0) break;
  }
  return c;
}

// Against an independent construction: rows stably sorted by (chunk, destination).
void expect_matches_stable_sort(const Case& c) {
  const Out o = run_cpu(c);
  const int64_t m = c.m();
  std::vector<int64_t> group(m), counter(m);
  for (int64_t p = 0; p < c.P(); ++p)
    for (int64_t r = c.pieces[5 * p]; r < c.pieces[5 * p + 1]; ++r) {
      const int64_t i = c.strided ? c.rows[r] % c.K : c.rows[r] / c.c_eff;
      group[r] = i * c.W + c.pieces[5 * p + 2];
      counter[r] = c.pieces[5 * p + 3] + i * c.pieces[5 * p + 4];
    }
  std::vector<int32_t> want(m);
  std::iota(want.begin(), want.end(), 0);
  std::stable_sort(want.begin(), want.end(), [&](int32_t a, int32_t b) { return group[a] < group[b]; });
  EXPECT_EQ(o.order, want);
  for (int64_t j = 0; j < m; ++j) EXPECT_EQ(o.tokens[j], c.rows[want[j]]) << "tokens[" << j << "]";
  ASSERT_EQ(o.offsets[0], 0);
  for (int64_t g = 0; g < c.K * c.W; ++g)
    EXPECT_EQ(o.offsets[g + 1] - o.offsets[g], std::count(group.begin(), group.end(), g)) << "group " << g;
  for (int64_t b = 0; b < c.B; ++b)
    EXPECT_EQ(o.blocks[b], std::count(counter.begin(), counter.end(), b)) << "counter " << b;
}

void expect_matches_ref(const Case& c) {
  const Out got = run_cpu(c), want = run_ref(c);
  EXPECT_EQ(got.order, want.order);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.offsets, want.offsets);
  EXPECT_EQ(got.blocks, want.blocks);
  // Without the tokens output, the rest is the same.
  const Out bare = run_cpu(c, false);
  EXPECT_EQ(bare.order, want.order);
  EXPECT_EQ(bare.offsets, want.offsets);
  EXPECT_EQ(bare.blocks, want.blocks);
}

TEST(MoeChunkOrder, MatchesStableSortAndRef) {
  fp::Rng rng(41);
  for (bool strided : {true, false})
    for (int64_t W : {1, 2, 5})
      for (int64_t K : {1, 3, 8})
        for (int64_t n : {1, 7, 33, 130})
          for (int64_t k : {1, 2, 4})
            for (int64_t max_piece : {0, 3, 50}) {
              SCOPED_TRACE(testing::Message() << "strided=" << strided << " W=" << W << " K=" << K << " n=" << n
                                              << " k=" << k << " max_piece=" << max_piece);
              const Case c = random_case(rng, n, k, K, W, strided, max_piece == 0 ? n * k : max_piece);
              expect_matches_stable_sort(c);
              expect_matches_ref(c);
            }
}

// More chunks than tokens (contiguous c_eff = 1 and strided alike): the last chunks are empty.
TEST(MoeChunkOrder, EmptyChunks) {
  fp::Rng rng(42);
  for (bool strided : {true, false}) {
    Case c = random_case(rng, 3, 2, 3, 2, strided, 2);
    c.K = 6;  // tokens 0..2: chunks 3..5 are empty
    c.c_eff = 1;
    c.B = 2 * 6 * 3;
    for (int64_t p = 0; p < c.P(); ++p) c.pieces[5 * p + 3] = 6 * 3 * c.pieces[5 * p + 2] + c.pieces[5 * p + 3] % 3;
    expect_matches_stable_sort(c);
    expect_matches_ref(c);
    const Out o = run_cpu(c);
    for (int64_t g = 3 * 2; g <= 6 * 2; ++g) EXPECT_EQ(o.offsets[g], 6) << "group " << g;
  }
}

// One token repeated everywhere (a profile's hot token): every row in one group, in row order.
TEST(MoeChunkOrder, RepeatedTokenKeepsRowOrder) {
  Case c;
  c.rows.assign(10, 5);
  c.K = 4, c.W = 2, c.B = 8, c.c_eff = 3, c.strided = false;
  c.pieces = {0, 4, 1, 0, 1, 4, 10, 1, 4, 1};  // rows 0..9 to rank 1, counters 0 + i and 4 + i
  const Out o = run_cpu(c);
  std::vector<int32_t> all(10);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(o.order, all);
  EXPECT_EQ(o.tokens, std::vector<int32_t>(10, 5));
  // token 5 / c_eff 3: chunk 1, group 1 * 2 + 1 = 3.
  EXPECT_EQ(o.offsets, (std::vector<int64_t>{0, 0, 0, 0, 10, 10, 10, 10, 10}));
  EXPECT_EQ(o.blocks, (std::vector<int64_t>{0, 4, 0, 0, 0, 6, 0, 0}));
  expect_matches_ref(c);
}

TEST(MoeChunkOrder, NoRows) {
  Case c;
  c.K = 3, c.W = 2, c.B = 4;
  const Out o = run_cpu(c);  // P = 0
  EXPECT_EQ(o.offsets, std::vector<int64_t>(7, 0));
  EXPECT_EQ(o.blocks, std::vector<int64_t>(4, 0));
  c.pieces = {0, 0, 1, 2, 0};  // one empty piece
  EXPECT_EQ(run_cpu(c).offsets, std::vector<int64_t>(7, 0));
}

TEST(MoeChunkOrder, BadInputsAssert) {
  Case good;
  good.rows = {0, 1, 2, 3};
  good.K = 2, good.W = 2, good.B = 4, good.c_eff = 2, good.strided = false;
  good.pieces = {0, 2, 0, 0, 1, 2, 4, 1, 2, 1};
  EXPECT_NO_THROW(run_cpu(good));
  for (auto [at, v] : {std::pair<int, int64_t>{0, 1}, {5, 3}, {6, 3}, {6, 5}, {2, 2}, {7, -1}, {8, 3}}) {
    Case c = good;
    c.pieces[at] = v;  // a gap, an overlap, a short or long cover, a rank or counter out of range
    EXPECT_THROW(run_cpu(c), fp::InternalError) << "pieces[" << at << "] = " << v;
  }
  for (int32_t token : {4, -1}) {  // chunk 4 / c_eff 2 = 2 of K = 2; a negative token
    Case c = good;
    c.rows[3] = token;
    EXPECT_THROW(run_cpu(c), fp::InternalError) << "token " << token;
  }
}

}  // namespace
