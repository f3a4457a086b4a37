// Packed documents in the attention kernels (Note [Documents in attention], ops/attention.h):
//   - a window of packed documents against each document run alone through the double reference
//     (ops/ref/attention.h, which knows nothing of documents): o, lse, dq, dk, dv of every position, with
//     and without a sliding window, documents of 1 token, of exactly a tile and across tiles, several
//     per tile, different layouts in the two sequences of a batch;
//   - the same against the cpu kernel run on each document alone;
//   - the block kernels against their scalar reference with document starts;
//   - the ring (zig-zag pieces of W = 2 and 4, every rank folding every block) against the whole
//     sequence, both with documents;
//   - the tile pairs across documents are skipped (counted, not timed);
//   - a boundary moved by one token is caught (the test fails without the right starts);
//   - bf16 storage: the bf16 call gives the f32 call on the widened inputs, rounded once.
// Dimensions: B sequences of T tokens, nh query heads, nkv kv heads, hd the head width (hdv = hd).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "backend/cpu/kernels/attention_tile.h"
#include "backend/cpu/kernels/ops.h"
#include "core/buf.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "data/context_split.h"
#include "op_test.h"
#include "ops/attention.h"
#include "ops/attention_block.h"
#include "ops/ref/attention.h"
#include "ops/ref/attention_block.h"

namespace fp {

namespace {

struct Case {
  int64_t nh = 4, nkv = 2, hd = 16;
  std::vector<std::vector<int64_t>> docs;  // per sequence, the document lengths (summing to T)
  int64_t window = 0;
  int64_t B() const { return static_cast<int64_t>(docs.size()); }
  int64_t T() const { return std::accumulate(docs[0].begin(), docs[0].end(), int64_t{0}); }
  // (B, T) where each token's document begins.
  std::vector<int32_t> doc_start() const {
    std::vector<int32_t> d;
    for (const auto& lens : docs) {
      int64_t start = 0;
      for (const int64_t len : lens) {
        for (int64_t t = 0; t < len; ++t) d.push_back(static_cast<int32_t>(start));
        start += len;
      }
    }
    return d;
  }
  std::string name() const {
    std::string s = "window=" + std::to_string(window) + " docs=";
    for (const auto& lens : docs) {
      s += "[";
      for (const int64_t l : lens) s += std::to_string(l) + " ";
      s += "]";
    }
    return s;
  }
};

struct Tensors {
  std::vector<float> q, k, v, dout;  // (B, T, nh | nkv, hd)
};

struct Outputs {
  std::vector<float> o, lse, dq, dk, dv;
};

Tensors random_inputs(const Case& c, uint64_t seed) {
  Rng rng(seed);
  const int64_t n = c.B() * c.T();
  return {op_test::random_vector<float>(n * c.nh * c.hd, rng, 2.0), op_test::random_vector<float>(n * c.nkv * c.hd, rng),
          op_test::random_vector<float>(n * c.nkv * c.hd, rng), op_test::random_vector<float>(n * c.nh * c.hd, rng)};
}

float scale_of(const Case& c) { return 1.0f / std::sqrt(static_cast<float>(c.hd)); }

// The cpu kernels on (B, T) with the given document starts (null: none), forward then backward.
Outputs packed_run(const Case& c, const Tensors& in, const int32_t* doc_start) {
  const int64_t B = c.B(), T = c.T();
  Outputs r{std::vector<float>(in.dout.size()), std::vector<float>(B * c.nh * T), std::vector<float>(in.q.size()),
            std::vector<float>(in.k.size()), std::vector<float>(in.v.size())};
  const ops::AttentionSpec a = ops::attention_spec(B, T, c.nh, c.nkv, c.hd, c.hd, scale_of(c), c.window, doc_start);
  ops::cpu::attention_forward(in.q.data(), in.k.data(), in.v.data(), r.o.data(), r.lse.data(), a);
  ops::cpu::attention_backward(in.q.data(), in.k.data(), in.v.data(), r.o.data(), r.lse.data(), in.dout.data(),
                               r.dq.data(), r.dk.data(), r.dv.data(), a);
  return r;
}

// Rows [t0, t0 + len) of sequence b of x (B, T, heads, hd): (1, len, heads, hd).
template <class W>
std::vector<W> rows(const std::vector<float>& x, int64_t T, int64_t heads, int64_t hd, int64_t b, int64_t t0,
                    int64_t len) {
  const int64_t w = heads * hd;
  return std::vector<W>(x.begin() + (b * T + t0) * w, x.begin() + (b * T + t0 + len) * w);
}

// Each document alone: the double reference (Double = true) or the cpu kernel on its rows, written back
// into packed (B, T) layouts (lse as (B, nh, T)).
template <bool Double>
Outputs alone_run(const Case& c, const Tensors& in) {
  const int64_t B = c.B(), T = c.T(), nh = c.nh, nkv = c.nkv, hd = c.hd;
  Outputs r{std::vector<float>(in.dout.size()), std::vector<float>(B * nh * T), std::vector<float>(in.q.size()),
            std::vector<float>(in.k.size()), std::vector<float>(in.v.size())};
  using W = std::conditional_t<Double, double, float>;
  for (int64_t b = 0; b < B; ++b) {
    int64_t t0 = 0;
    for (const int64_t len : c.docs[b]) {
      const std::vector<W> q = rows<W>(in.q, T, nh, hd, b, t0, len), k = rows<W>(in.k, T, nkv, hd, b, t0, len),
                           v = rows<W>(in.v, T, nkv, hd, b, t0, len), dout = rows<W>(in.dout, T, nh, hd, b, t0, len);
      std::vector<W> o(q.size()), lse(nh * len), dq(q.size()), dk(k.size()), dv(v.size());
      const int64_t w = c.window >= len ? 0 : c.window;  // a window of the document or more masks nothing
      if constexpr (Double) {
        ops::ref::attention_forward<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), 1, len, nh, nkv, hd, hd,
                                            static_cast<double>(scale_of(c)), w);
        ops::ref::attention_backward<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(),
                                             dq.data(), dk.data(), dv.data(), 1, len, nh, nkv, hd, hd,
                                             static_cast<double>(scale_of(c)), w);
      } else {
        const ops::AttentionSpec a = ops::attention_spec(1, len, nh, nkv, hd, hd, scale_of(c), w);
        ops::cpu::attention_forward(q.data(), k.data(), v.data(), o.data(), lse.data(), a);
        ops::cpu::attention_backward(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(),
                                     dk.data(), dv.data(), a);
      }
      auto put = [&](std::vector<float>& dst, const std::vector<W>& src, int64_t heads) {
        std::transform(src.begin(), src.end(), dst.begin() + (b * T + t0) * heads * hd,
                       [](W x) { return static_cast<float>(x); });
      };
      put(r.o, o, nh);
      put(r.dq, dq, nh);
      put(r.dk, dk, nkv);
      put(r.dv, dv, nkv);
      for (int64_t h = 0; h < nh; ++h)
        for (int64_t t = 0; t < len; ++t) r.lse[(b * nh + h) * T + t0 + t] = static_cast<float>(lse[h * len + t]);
      t0 += len;
    }
  }
  return r;
}

// 1e-5 of the magnitude: Attention.ForwardMatchesDoubleReference's bound (the float kernel against the
// exact answer, whatever its tile order did to the rounding). A key of another document in a query's
// softmax moves that query's o by the key's probability, 1e-2 and more here.
::testing::AssertionResult all_near(const std::string& l, const Outputs& got, const Outputs& want) {
  for (const auto& [name, g, w] :
       {std::tuple{"o", &got.o, &want.o}, std::tuple{"lse", &got.lse, &want.lse}, std::tuple{"dq", &got.dq, &want.dq},
        std::tuple{"dk", &got.dk, &want.dk}, std::tuple{"dv", &got.dv, &want.dv}}) {
    ::testing::AssertionResult r = op_test::near(std::string(name) + " " + l, *g, *w, op_test::tol_near_rms(1e-5, *w));
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

std::vector<Case> cases() {
  std::vector<Case> cs;
  for (const int64_t window : {0, 48}) {
    // Documents of 1 token, of exactly one tile, across tiles, several in one tile; the other sequence
    // of the batch one document (a different layout per sequence).
    cs.push_back({4, 2, 16, {{37, 64, 1, 130, 68}, {300}}, window});
    cs.push_back({4, 1, 8, {{1, 1, 63, 65, 70}, {100, 100}}, window});
    cs.push_back({6, 3, 24, {{200}, {5, 5, 5, 185}}, window});
  }
  return cs;
}

}  // namespace

TEST(AttentionDocuments, PackedEqualsEachDocumentAloneInDouble) {
  uint64_t seed = 1;
  for (const Case& c : cases()) {
    const Tensors in = random_inputs(c, seed++);
    const std::vector<int32_t> starts = c.doc_start();
    EXPECT_TRUE(all_near(c.name(), packed_run(c, in, starts.data()), alone_run<true>(c, in)));
  }
}

TEST(AttentionDocuments, PackedEqualsTheKernelOnEachDocumentAlone) {
  uint64_t seed = 11;
  for (const Case& c : cases()) {
    const Tensors in = random_inputs(c, seed++);
    const std::vector<int32_t> starts = c.doc_start();
    EXPECT_TRUE(all_near(c.name(), packed_run(c, in, starts.data()), alone_run<false>(c, in)));
  }
}

// The test above fails when one boundary is off by one token: the starts are what it checks.
TEST(AttentionDocuments, AMovedBoundaryIsCaught) {
  const Case c{4, 2, 16, {{37, 64, 1, 130, 68}, {300}}, 0};
  const Tensors in = random_inputs(c, 21);
  const Outputs want = alone_run<true>(c, in);
  std::vector<int32_t> starts = c.doc_start();
  ASSERT_TRUE(all_near(c.name(), packed_run(c, in, starts.data()), want));
  // The third document (1 token at position 101) now starts one token early: it sees the last token of
  // the second.
  starts[101] = 100;
  EXPECT_FALSE(all_near(c.name(), packed_run(c, in, starts.data()), want));
  // No documents at all: every query sees the earlier documents.
  EXPECT_FALSE(all_near(c.name(), packed_run(c, in, nullptr), want));
}

// The block kernels (one block pair, then merged with a second) against the scalar reference, with
// document starts at global positions and a window.
TEST(AttentionDocuments, BlockPairsMatchReference) {
  const int64_t B = 2, nh = 4, nkv = 2, hd = 16, T = 256;
  for (const int64_t window : {0, 40}) {
    // Queries: global positions 64..191 (two chunks of a zig-zag); keys: 0..127 then 128..255.
    std::vector<int32_t> q_pos(128), k0(128), k1(128);
    std::iota(q_pos.begin(), q_pos.end(), 64);
    std::iota(k0.begin(), k0.end(), 0);
    std::iota(k1.begin(), k1.end(), 128);
    // Sequence 0: documents starting at 0, 70, 71, 150; sequence 1: at 0 and 100.
    std::vector<int32_t> starts(B * 128);
    for (int64_t i = 0; i < 128; ++i) {
      const int32_t p = q_pos[i];
      starts[i] = p >= 150 ? 150 : p >= 71 ? 71 : p >= 70 ? 70 : 0;
      starts[128 + i] = p >= 100 ? 100 : 0;
    }
    Rng rng(31 + window);
    const std::vector<float> q = op_test::random_vector<float>(B * 128 * nh * hd, rng, 2.0);
    const std::vector<float> k = op_test::random_vector<float>(B * 128 * nkv * hd, rng),
                             v = op_test::random_vector<float>(B * 128 * nkv * hd, rng),
                             k2 = op_test::random_vector<float>(B * 128 * nkv * hd, rng),
                             v2 = op_test::random_vector<float>(B * 128 * nkv * hd, rng);
    const float scale = 0.3f;
    std::vector<float> o(q.size()), lse(B * nh * 128), o_ref(q.size()), lse_ref(lse.size());
    ops::cpu::attention_block_forward(
        q.data(), k.data(), v.data(), o.data(), lse.data(), true,
        ops::attention_block_spec(q_pos.data(), k0.data(), B, 128, 128, nh, nkv, hd, hd, scale, window, starts.data()));
    ops::cpu::attention_block_forward(
        q.data(), k2.data(), v2.data(), o.data(), lse.data(), false,
        ops::attention_block_spec(q_pos.data(), k1.data(), B, 128, 128, nh, nkv, hd, hd, scale, window, starts.data()));
    ops::ref::attention_block_forward<float>(q.data(), k.data(), v.data(), q_pos.data(), k0.data(), o_ref.data(),
                                             lse_ref.data(), true, B, 128, 128, nh, nkv, hd, hd, scale, window,
                                             starts.data());
    ops::ref::attention_block_forward<float>(q.data(), k2.data(), v2.data(), q_pos.data(), k1.data(), o_ref.data(),
                                             lse_ref.data(), false, B, 128, 128, nh, nkv, hd, hd, scale, window,
                                             starts.data());
    const std::string l = "window=" + std::to_string(window) + " T=" + std::to_string(T);
    EXPECT_TRUE(op_test::near("o " + l, o, o_ref, op_test::tol_near_rms(2e-5, o_ref)));
    EXPECT_TRUE(op_test::near("lse " + l, lse, lse_ref, op_test::tol_near_rms(2e-5, lse_ref)));
    // Backward of the first block pair from the final state, added to zeros.
    const std::vector<float> dout = op_test::random_vector<float>(q.size(), rng);
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size()), dq_ref(q.size()), dk_ref(k.size()), dv_ref(v.size());
    ops::cpu::attention_block_backward(
        q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(), dv.data(),
        ops::attention_block_spec(q_pos.data(), k0.data(), B, 128, 128, nh, nkv, hd, hd, scale, window, starts.data()));
    ops::ref::attention_block_backward<float>(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(),
                                              q_pos.data(), k0.data(), dq_ref.data(), dk_ref.data(), dv_ref.data(), B,
                                              128, 128, nh, nkv, hd, hd, scale, window, starts.data());
    EXPECT_TRUE(op_test::near("dq " + l, dq, dq_ref, op_test::tol_near_rms(2e-5, dq_ref)));
    EXPECT_TRUE(op_test::near("dk " + l, dk, dk_ref, op_test::tol_near_rms(2e-5, dk_ref)));
    EXPECT_TRUE(op_test::near("dv " + l, dv, dv_ref, op_test::tol_near_rms(2e-5, dv_ref)));
  }
}

namespace {

// x (B, T, width) rows pos: (B, n, width).
std::vector<float> gather(const std::vector<float>& x, const std::vector<int32_t>& pos, int64_t B, int64_t T,
                          int64_t width) {
  std::vector<float> out;
  for (int64_t b = 0; b < B; ++b)
    for (const int32_t p : pos) out.insert(out.end(), x.begin() + (b * T + p) * width, x.begin() + (b * T + p + 1) * width);
  return out;
}

}  // namespace

// Ring attention's block calls, each rank's queries folding every rank's keys in ring order, with the
// document starts of the rank's queries, reassembled: the whole sequence with documents.
TEST(AttentionDocuments, RingEqualsWholeSequence) {
  const Case c{4, 2, 16, {{37, 64, 1, 130, 88}, {320}}, 0};
  const int64_t B = c.B(), T = c.T(), nh = c.nh, nkv = c.nkv, hd = c.hd;
  const Tensors in = random_inputs(c, 41);
  const std::vector<int32_t> starts = c.doc_start();
  const Outputs whole = packed_run(c, in, starts.data());
  for (const int W : {2, 4}) {
    Outputs ring{std::vector<float>(in.dout.size()), std::vector<float>(B * nh * T), std::vector<float>(in.q.size()),
                 std::vector<float>(in.k.size()), std::vector<float>(in.v.size())};
    std::vector<std::vector<int32_t>> pos(W);
    for (int r = 0; r < W; ++r) pos[r] = context_positions(T, r, W);
    const int64_t N = T / W;
    std::vector<std::vector<float>> dk(W, std::vector<float>(B * N * nkv * hd)), dv = dk;
    for (int r = 0; r < W; ++r) {
      const std::vector<float> q = gather(in.q, pos[r], B, T, nh * hd), dout = gather(in.dout, pos[r], B, T, nh * hd);
      std::vector<int32_t> st;  // (B, N) the document starts of this rank's queries
      for (int64_t b = 0; b < B; ++b)
        for (const int32_t p : pos[r]) st.push_back(starts[b * T + p]);
      std::vector<float> o(q.size()), lse(B * nh * N), dq(q.size());
      for (int step = 0; step < W; ++step) {
        const int s = ((r - step) % W + W) % W;
        const std::vector<float> k = gather(in.k, pos[s], B, T, nkv * hd), v = gather(in.v, pos[s], B, T, nkv * hd);
        ops::cpu::attention_block_forward(
            q.data(), k.data(), v.data(), o.data(), lse.data(), step == 0,
            ops::attention_block_spec(pos[r].data(), pos[s].data(), B, N, N, nh, nkv, hd, hd, scale_of(c), 0, st.data()));
      }
      for (int step = 0; step < W; ++step) {
        const int s = ((r - step) % W + W) % W;
        const std::vector<float> k = gather(in.k, pos[s], B, T, nkv * hd), v = gather(in.v, pos[s], B, T, nkv * hd);
        ops::cpu::attention_block_backward(
            q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk[s].data(), dv[s].data(),
            ops::attention_block_spec(pos[r].data(), pos[s].data(), B, N, N, nh, nkv, hd, hd, scale_of(c), 0, st.data()));
      }
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < N; ++t) {
          const int64_t g = b * T + pos[r][t], l = b * N + t;
          std::copy_n(o.begin() + l * nh * hd, nh * hd, ring.o.begin() + g * nh * hd);
          std::copy_n(dq.begin() + l * nh * hd, nh * hd, ring.dq.begin() + g * nh * hd);
          for (int64_t h = 0; h < nh; ++h) ring.lse[(b * nh + h) * T + pos[r][t]] = lse[(b * nh + h) * N + t];
        }
    }
    for (int s = 0; s < W; ++s)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < N; ++t) {
          const int64_t g = b * T + pos[s][t], l = b * N + t;
          std::copy_n(dk[s].begin() + l * nkv * hd, nkv * hd, ring.dk.begin() + g * nkv * hd);
          std::copy_n(dv[s].begin() + l * nkv * hd, nkv * hd, ring.dv.begin() + g * nkv * hd);
        }
    EXPECT_TRUE(all_near("ring W=" + std::to_string(W) + " " + c.name(), ring, whole));
  }
}

// Documents of one tile each (T = 512, 8 documents of 64): the forward computes the 8 diagonal tile pairs
// per (b, h) instead of the 36 of causal attention, and the backward the same pairs.
TEST(AttentionDocuments, TilePairsAcrossDocumentsAreSkipped) {
  static_assert(ops::cpu::kAttentionTileQ == 64 && ops::cpu::kAttentionTileK == 64, "documents of one tile");
  Case c{2, 2, 16, {std::vector<int64_t>(8, 64)}, 0};
  const Tensors in = random_inputs(c, 51);
  const std::vector<int32_t> starts = c.doc_start();
  namespace at = ops::cpu::attention_tile;
  int64_t before = at::tile_pairs_computed.load();
  packed_run(c, in, nullptr);
  const int64_t causal = at::tile_pairs_computed.load() - before;
  before = at::tile_pairs_computed.load();
  packed_run(c, in, starts.data());
  const int64_t packed = at::tile_pairs_computed.load() - before;
  // forward + backward (one sweep or two passes: the pairs of each pass) per head.
  EXPECT_EQ(causal * 8, packed * 36) << "causal " << causal << ", packed " << packed;
  // The host count (attention_block_tile_pairs) is the forward's, per (sequence, head).
  std::vector<int32_t> pos(512);
  std::iota(pos.begin(), pos.end(), 0);
  const ops::AttentionSpec a =
      ops::attention_block_spec(pos.data(), pos.data(), 1, 512, 512, c.nh, c.nkv, c.hd, c.hd, 1.0f, 0, starts.data());
  EXPECT_EQ(ops::cpu::attention_block_tile_pairs(a), 8);
  before = at::tile_pairs_computed.load();
  std::vector<float> o(in.q.size()), lse(c.nh * 512);
  ops::cpu::attention_block_forward(in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data(), true, a);
  EXPECT_EQ(at::tile_pairs_computed.load() - before, c.nh * ops::cpu::attention_block_tile_pairs(a));
}

// bf16 storage with documents: the bf16 calls equal the f32 calls on the widened inputs, each output
// rounded once (ops/attention_block.h's storage rule).
TEST(AttentionDocuments, Bf16IsTheWidenedF32RoundedOnce) {
  const Case c{4, 2, 16, {{37, 64, 1, 130, 68}, {300}}, 48};
  const Tensors in = random_inputs(c, 61);
  const auto qh = op_test::rounded_bf16(in.q), kh = op_test::rounded_bf16(in.k), vh = op_test::rounded_bf16(in.v),
             douth = op_test::rounded_bf16(in.dout);
  const std::vector<int32_t> starts = c.doc_start();
  const ops::AttentionSpec a =
      ops::attention_spec(c.B(), c.T(), c.nh, c.nkv, c.hd, c.hd, scale_of(c), c.window, starts.data());
  std::vector<bf16> oh(qh.size()), dqh(qh.size()), dkh(kh.size()), dvh(vh.size());
  std::vector<float> lse_h(c.B() * c.nh * c.T());
  ops::cpu::attention_forward(qh.data(), kh.data(), vh.data(), oh.data(), lse_h.data(), a);
  ops::cpu::attention_backward(qh.data(), kh.data(), vh.data(), oh.data(), lse_h.data(), douth.data(), dqh.data(),
                               dkh.data(), dvh.data(), a);
  const std::vector<float> q = op_test::widened(qh), k = op_test::widened(kh), v = op_test::widened(vh),
                           dout = op_test::widened(douth);
  std::vector<float> o(q.size()), lse(lse_h.size()), dq(q.size()), dk(k.size()), dv(v.size());
  ops::cpu::attention_forward(q.data(), k.data(), v.data(), o.data(), lse.data(), a);
  for (size_t i = 0; i < o.size(); ++i) ASSERT_EQ(oh[i].bits, bf16_from_float(o[i])) << "o at " << i;
  ASSERT_TRUE(op_test::bits_equal(lse_h, lse));
  const std::vector<float> o_w = op_test::widened(oh);  // the backward reads the stored (rounded) o
  ops::cpu::attention_backward(q.data(), k.data(), v.data(), o_w.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                               dv.data(), a);
  for (size_t i = 0; i < dq.size(); ++i) ASSERT_EQ(dqh[i].bits, bf16_from_float(dq[i])) << "dq at " << i;
  for (size_t i = 0; i < dk.size(); ++i) ASSERT_EQ(dkh[i].bits, bf16_from_float(dk[i])) << "dk at " << i;
  for (size_t i = 0; i < dv.size(); ++i) ASSERT_EQ(dvh[i].bits, bf16_from_float(dv[i])) << "dv at " << i;
}

// Benchmark (disabled): attention forward + backward over T = 8192 tokens (B = 1, nh = 4, nkv = 2, hd = 64)
// as one document and packed with documents of 2048, 512 and 128 tokens, each repeat timing every layout
// in turn; medians of FP_BENCH_REPEATS (default 5), the ratio to one document and the tile pairs per head
// (forward; the backward visits the same). Run: build/tests/ops_test_attention_documents
// --gtest_also_run_disabled_tests
//   --gtest_filter='*BenchDocumentLengths*'
TEST(AttentionDocuments, DISABLED_BenchDocumentLengths) {
  namespace at = ops::cpu::attention_tile;
  const std::vector<int64_t> lengths = {8192, 2048, 512, 128};
  const char* env = std::getenv("FP_BENCH_REPEATS");
  const int repeats = env ? std::max(1, std::atoi(env)) : 5;
  std::vector<Case> cases;
  for (const int64_t len : lengths) cases.push_back({4, 2, 64, {std::vector<int64_t>(8192 / len, len)}, 0});
  const Tensors in = random_inputs(cases[0], 5);
  std::vector<std::vector<double>> both(lengths.size());
  std::vector<int64_t> pairs(lengths.size());
  using Clock = std::chrono::steady_clock;
  for (int rep = 0; rep < repeats; ++rep)
    for (size_t l = 0; l < lengths.size(); ++l) {
      const std::vector<int32_t> starts = cases[l].doc_start();
      const auto t0 = Clock::now();
      packed_run(cases[l], in, l == 0 ? nullptr : starts.data());
      both[l].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      std::vector<int32_t> pos(8192);
      std::iota(pos.begin(), pos.end(), 0);
      pairs[l] = ops::cpu::attention_block_tile_pairs(
          ops::attention_block_spec(pos.data(), pos.data(), 1, 8192, 8192, 4, 2, 64, 64, 1.0f, 0, starts.data()));
    }
  auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  std::printf("attention fwd+bwd, T = 8192 packed with documents of one length, %d threads, %s tiles, medians of %d\n",
              omp_get_max_threads(), ops::cpu::simd_level_name(at::tile_simd), repeats);
  std::printf("%9s %11s %10s %7s\n", "document", "tile pairs", "fwd+bwd s", "ratio");
  for (size_t l = 0; l < lengths.size(); ++l)
    std::printf("%9lld %11lld %10.4f %7.3f\n", static_cast<long long>(lengths[l]), static_cast<long long>(pairs[l]),
                median(both[l]), median(both[l]) / median(both[0]));
}

}  // namespace fp
