// Block attention by global positions (ops/attention_block.h), the kernels of ring attention:
//   - the tiled cpu kernel against the scalar reference (first block, merge into a running state, and
//     backward with += accumulation) on contiguous, offset, zig-zag, fully visible, fully masked, tied
//     and random sorted positions, at sizes around and across the 64-token tiles, several head groupings;
//   - the ring: the zig-zag pieces of W ranks, every rank folding every rank's key block in ring order,
//     reassembled, against attention_forward / attention_backward of the whole sequence (ops/attention.h);
//   - the double reference backward of two merged blocks against central finite differences;
//   - bitwise determinism across thread counts and runs; no NaN from queries that see no key;
//   - value heads of another width than the query/key heads (hdv != hd): block pairs against the reference,
//     the ring against the whole sequence and the double reference, finite differences;
//   - a benchmark (disabled; see docs/benchmarks.md): the ring's block calls against the whole sequence.
// Dimensions: B sequences, T tokens of the whole sequence, W ranks, C = T / (2W) tokens per zig-zag
// chunk, Tq / Tk queries / keys of a block pair, nh query heads, nkv kv heads, hd the query/key head
// width, hdv the value/output head width (Note [Value heads of their own width], ops/attention.h).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/kernels/attention_tile.h"
#include "backend/cpu/kernels/ops.h"
#include "core/buf.h"
#include "core/error.h"
#include "core/rng.h"
#include "op_test.h"
#include "ops/attention.h"
#include "ops/attention_block.h"
#include "ops/ref/attention.h"
#include "ops/ref/attention_block.h"

namespace fp {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A -inf expected (a log-sum-exp of no key) must be -inf exactly; any other non-finite value fails.
constexpr op_test::Options kNegInfExact{.neg_inf_exact = true};

::testing::AssertionResult all_finite_or_neg_inf(const std::vector<float>& x, const std::string& what) {
  for (size_t i = 0; i < x.size(); ++i)
    if (std::isnan(x[i]) || x[i] == std::numeric_limits<float>::infinity())
      return ::testing::AssertionFailure() << what << " at element " << i << " is " << x[i];
  return ::testing::AssertionSuccess();
}

// The global positions rank r of W holds: zig-zag chunks r and 2W-1-r of C = T / (2W) tokens each.
std::vector<int32_t> zigzag_positions(int64_t T, int W, int r) {
  const int64_t C = T / (2 * W);
  std::vector<int32_t> pos;
  for (const int64_t chunk : {int64_t{r}, int64_t{2 * W - 1 - r}})
    for (int64_t t = 0; t < C; ++t) pos.push_back(static_cast<int32_t>(chunk * C + t));
  return pos;
}

// The rows of the tokens pos (n) of x (B, T, heads, width): (B, n, heads, width) (width: heads * head width).
std::vector<float> rows_gather(const std::vector<float>& x, const std::vector<int32_t>& pos, int64_t B, int64_t T,
                               int64_t width) {
  const int64_t n = static_cast<int64_t>(pos.size());
  std::vector<float> out(B * n * width);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < n; ++t)
      std::copy_n(x.data() + (b * T + pos[t]) * width, width, out.data() + (b * n + t) * width);
  return out;
}

// x (B, T, heads, width) rows pos := piece (B, n, heads, width).
void rows_scatter(std::vector<float>& x, const std::vector<float>& piece, const std::vector<int32_t>& pos, int64_t B,
                  int64_t T, int64_t width) {
  const int64_t n = static_cast<int64_t>(pos.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < n; ++t)
      std::copy_n(piece.data() + (b * n + t) * width, width, x.data() + (b * T + pos[t]) * width);
}

// lse (B, nh, T) columns pos := piece (B, nh, n).
void lse_scatter(std::vector<float>& lse, const std::vector<float>& piece, const std::vector<int32_t>& pos, int64_t B,
                 int64_t nh, int64_t T) {
  const int64_t n = static_cast<int64_t>(pos.size());
  for (int64_t bh = 0; bh < B * nh; ++bh)
    for (int64_t t = 0; t < n; ++t) lse[bh * T + pos[t]] = piece[bh * n + t];
}

// One block pair: shapes, positions and random inputs. q is drawn wider than k so that the softmax is
// peaked and the running max moves between key tiles.
struct BlockCase {
  std::string name;
  int64_t B, nh, nkv, hd;
  std::vector<int32_t> q_pos, k_pos;
  int64_t hdv = 0;  // the value/output head width; 0: hd
  int64_t vd() const { return hdv > 0 ? hdv : hd; }
  int64_t Tq() const { return static_cast<int64_t>(q_pos.size()); }
  int64_t Tk() const { return static_cast<int64_t>(k_pos.size()); }
  std::string label() const {
    return name + " B=" + std::to_string(B) + " Tq=" + std::to_string(Tq()) + " Tk=" + std::to_string(Tk()) +
           " nh=" + std::to_string(nh) + " nkv=" + std::to_string(nkv) + " hd=" + std::to_string(hd) +
           (vd() != hd ? " hdv=" + std::to_string(vd()) : "");
  }
};

struct BlockInputs {
  std::vector<float> q, k, v, dout;
  std::vector<float> o0, lse0;       // a previous running state: (B, Tq, nh, hdv), (B, nh, Tq)
  std::vector<float> dq0, dk0, dv0;  // gradients already accumulated by other blocks
  float scale;
  BlockInputs(const BlockCase& c, uint64_t seed) {
    Rng rng(seed);
    const int64_t nq = c.B * c.Tq() * c.nh * c.hd, nk = c.B * c.Tk() * c.nkv * c.hd;
    const int64_t no = c.B * c.Tq() * c.nh * c.vd(), nv = c.B * c.Tk() * c.nkv * c.vd();
    // With hdv == hd the draws are those before hdv existed (no = nq, nv = nk): the same inputs.
    q = op_test::random_vector<float>(nq, rng, 2.0);
    k = op_test::random_vector<float>(nk, rng);
    v = op_test::random_vector<float>(nv, rng);
    dout = op_test::random_vector<float>(no, rng);
    o0 = op_test::random_vector<float>(no, rng);
    lse0 = op_test::random_vector<float>(c.B * c.nh * c.Tq(), rng, 2.0);
    // A quarter of the rows still empty (0, -inf), as left by blocks none of whose keys they saw.
    for (int64_t bh = 0; bh < c.B * c.nh; ++bh)
      for (int64_t i = 0; i < c.Tq(); ++i) {
        if (rng.below(4) != 0) continue;
        lse0[bh * c.Tq() + i] = kNegInf;
        const int64_t b = bh / c.nh, h = bh % c.nh;
        std::fill_n(o0.data() + ((b * c.Tq() + i) * c.nh + h) * c.vd(), c.vd(), 0.0f);
      }
    dq0 = op_test::random_vector<float>(nq, rng);
    dk0 = op_test::random_vector<float>(nk, rng);
    dv0 = op_test::random_vector<float>(nv, rng);
    scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  }
};

enum class Layout { kContiguous, kOffset, kBefore, kAfter, kTies, kRandom };
const char* layout_name(Layout l) {
  static const char* const names[] = {"contiguous", "offset", "keys-before", "keys-after", "ties", "random"};
  return names[static_cast<int>(l)];
}

// Ascending positions of Tq queries and Tk keys laid out as l.
// clang-format off
void positions_make(Layout l, int64_t Tq, int64_t Tk, Rng& rng, std::vector<int32_t>& qp, std::vector<int32_t>& kp) {
  qp.resize(Tq);
  kp.resize(Tk);
  for (int64_t i = 0; i < Tq; ++i) {
    switch (l) {
      case Layout::kContiguous: qp[i] = static_cast<int32_t>(10 + i); break;  // keys from 10 too: a staircase
      case Layout::kOffset: qp[i] = static_cast<int32_t>(10 + Tk / 2 + i); break;  // a staircase shifted right
      case Layout::kBefore: qp[i] = static_cast<int32_t>(Tk + 3 + i); break;       // sees every key
      case Layout::kAfter: qp[i] = static_cast<int32_t>(i); break;                 // sees no key
      case Layout::kTies: qp[i] = static_cast<int32_t>(i / 3); break;
      case Layout::kRandom: qp[i] = static_cast<int32_t>((i ? qp[i - 1] : rng.below(20)) + rng.below(4)); break;
    }
  }
  for (int64_t j = 0; j < Tk; ++j) {
    switch (l) {
      case Layout::kContiguous:
      case Layout::kOffset: kp[j] = static_cast<int32_t>(10 + j); break;
      case Layout::kBefore: kp[j] = static_cast<int32_t>(j); break;
      case Layout::kAfter: kp[j] = static_cast<int32_t>(Tq + j); break;
      case Layout::kTies: kp[j] = static_cast<int32_t>(j / 2); break;
      case Layout::kRandom: kp[j] = static_cast<int32_t>((j ? kp[j - 1] : rng.below(20)) + rng.below(4)); break;
    }
  }
}
// clang-format on

std::vector<BlockCase> block_cases() {
  const std::vector<std::pair<int64_t, int64_t>> heads = {{1, 1}, {4, 2}, {6, 3}, {4, 1}};
  const std::vector<int64_t> hds = {24, 8, 64, 5};
  std::vector<BlockCase> cases;
  Rng rng(2024);
  int64_t n = 0;
  auto add = [&](std::string name, std::vector<int32_t> qp, std::vector<int32_t> kp) {
    const auto [nh, nkv] = heads[n % heads.size()];
    cases.push_back({std::move(name), 1 + n % 2, nh, nkv, hds[(n / 2) % hds.size()], std::move(qp), std::move(kp)});
    ++n;
  };
  for (const Layout l :
       {Layout::kContiguous, Layout::kOffset, Layout::kBefore, Layout::kAfter, Layout::kTies, Layout::kRandom})
    for (const auto& [Tq, Tk] : std::vector<std::pair<int64_t, int64_t>>{
             {1, 1}, {5, 70}, {63, 64}, {64, 64}, {65, 130}, {130, 65}, {200, 129}}) {
      std::vector<int32_t> qp, kp;
      positions_make(l, Tq, Tk, rng, qp, kp);
      add(layout_name(l), qp, kp);
    }
  // The block pairs of a zig-zag ring of 3 ranks: diagonal, fully visible and fully masked chunk pairs.
  for (const int64_t C : {1, 33, 70})
    for (int r = 0; r < 3; ++r)
      for (int s = 0; s < 3; ++s)
        add("zigzag W=3 C=" + std::to_string(C) + " r=" + std::to_string(r) + " s=" + std::to_string(s),
            zigzag_positions(6 * C, 3, r), zigzag_positions(6 * C, 3, s));
  return cases;
}

static_assert(ops::cpu::kAttentionTileQ == 64 && ops::cpu::kAttentionTileK == 64,
              "the sizes below straddle 64-token tiles; revisit them if the tiles change");

// One block pair against the float reference with the sliding window `window` (0: causal): the first
// block, a merge into a previous state, the backward from that state, and the += contract.
void expect_block_matches_reference(const BlockCase& c, const BlockInputs& in, int64_t window) {
  const std::string label = c.label() + (window > 0 ? " window=" + std::to_string(window) : "");
  const int64_t B = c.B, Tq = c.Tq(), Tk = c.Tk(), nh = c.nh, nkv = c.nkv, hd = c.hd, hdv = c.vd();
  // Both sides are float, rounding in their own orders (the kernel with fused multiply-adds where the CPU
  // has them, Note [Tile products with FMA]; the reference unfused): 2.6e-5 of (|want| + rms) at worst seen.
  const double rel = 3e-5;
  std::vector<float> o(in.o0.size(), NAN), lse(B * nh * Tq, NAN), o_ref(in.o0.size(), NAN), lse_ref(lse.size(), NAN);
  auto forward_both = [&](bool first) {  // the kernel into (o, lse), the reference into (o_ref, lse_ref)
    ops::cpu::attention_block_forward(
        in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data(), first,
        ops::attention_block_spec(c.q_pos.data(), c.k_pos.data(), B, Tq, Tk, nh, nkv, hd, hdv, in.scale, window));
    ops::ref::attention_block_forward<float>(in.q.data(), in.k.data(), in.v.data(), c.q_pos.data(), c.k_pos.data(),
                                             o_ref.data(), lse_ref.data(), first, B, Tq, Tk, nh, nkv, hd, hdv, in.scale,
                                             window);
  };
  // first = true: the previous contents (NaN here) are never read.
  forward_both(true);
  EXPECT_TRUE(op_test::near("first o " + label, o, o_ref, op_test::tol_near_rms(rel, o_ref), kNegInfExact));
  EXPECT_TRUE(op_test::near("first lse " + label, lse, lse_ref, op_test::tol_near_rms(rel, lse_ref), kNegInfExact));
  // first = false: merged into a previous state with some empty rows.
  o = o_ref = in.o0;
  lse = lse_ref = in.lse0;
  forward_both(false);
  EXPECT_TRUE(op_test::near("merged o " + label, o, o_ref, op_test::tol_near_rms(rel, o_ref), kNegInfExact));
  EXPECT_TRUE(op_test::near("merged lse " + label, lse, lse_ref, op_test::tol_near_rms(rel, lse_ref), kNegInfExact));
  // Backward from the merged state (a final state whose lse covers more than this block); both sides
  // from zero gradients (a float reference accumulating onto nonzero values would round each of its Tk
  // terms against them), then the += contract on its own: from gradients already holding other blocks'
  // terms the kernel adds exactly the same increments, dq0 + increment rounded once, bit for bit.
  const std::vector<float> zq(in.q.size(), 0.0f), zk(in.k.size(), 0.0f), zv(in.v.size(), 0.0f);
  std::vector<float> dq = zq, dk = zk, dv = zv, dq_ref = zq, dk_ref = zk, dv_ref = zv;
  ops::cpu::attention_block_backward(
      in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data(), in.dout.data(), dq.data(), dk.data(), dv.data(),
      ops::attention_block_spec(c.q_pos.data(), c.k_pos.data(), B, Tq, Tk, nh, nkv, hd, hdv, in.scale, window));
  ops::ref::attention_block_backward<float>(in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data(), in.dout.data(),
                                            c.q_pos.data(), c.k_pos.data(), dq_ref.data(), dk_ref.data(), dv_ref.data(),
                                            B, Tq, Tk, nh, nkv, hd, hdv, in.scale, window);
  EXPECT_TRUE(op_test::near("dq " + label, dq, dq_ref, op_test::tol_near_rms(rel, dq_ref), kNegInfExact));
  EXPECT_TRUE(op_test::near("dk " + label, dk, dk_ref, op_test::tol_near_rms(rel, dk_ref), kNegInfExact));
  EXPECT_TRUE(op_test::near("dv " + label, dv, dv_ref, op_test::tol_near_rms(rel, dv_ref), kNegInfExact));
  std::vector<float> dq_acc = in.dq0, dk_acc = in.dk0, dv_acc = in.dv0;
  ops::cpu::attention_block_backward(
      in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data(), in.dout.data(), dq_acc.data(), dk_acc.data(),
      dv_acc.data(),
      ops::attention_block_spec(c.q_pos.data(), c.k_pos.data(), B, Tq, Tk, nh, nkv, hd, hdv, in.scale, window));
  auto plus = [](std::vector<float> x, const std::vector<float>& y) {
    for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
    return x;
  };
  EXPECT_TRUE(op_test::bits_equal(dq_acc, plus(in.dq0, dq))) << "dq += " << label;
  EXPECT_TRUE(op_test::bits_equal(dk_acc, plus(in.dk0, dk))) << "dk += " << label;
  EXPECT_TRUE(op_test::bits_equal(dv_acc, plus(in.dv0, dv))) << "dv += " << label;
}

// Both sides float, as in test_attention.cpp (Attention.MatchesReference): the kernel sums scores in
// register blocks and the softmax over key tiles with rescaling, the reference in plain order; 2e-5 of
// the magnitude is ~5x the largest difference seen, while a wrong mask, merge or skipped tile shows up
// at 1e-2 and above.
TEST(AttentionBlock, MatchesReference) {
  uint64_t seed = 1;
  for (const BlockCase& c : block_cases()) {
    const BlockInputs in(c, seed++);
    expect_block_matches_reference(c, in, 0);
    if (::testing::Test::HasFailure()) return;  // one case's dump is enough
  }
}

// The same with sliding windows (ops/attention_block.h): every layout of block_cases, each with two
// windows from a list that runs from 1 (a query sees only keys at its own position) through windows under,
// at and across the 64-token tiles to one wider than any position gap (nothing masked). Runs of visible
// keys that start inside a tile, rows that see no key of the block (first: (0, -inf); merge: kept),
// zig-zag query tiles whose two chunks see separate stretches of keys.
TEST(AttentionBlock, SlidingWindowMatchesReference) {
  const std::vector<int64_t> windows = {1, 3, 20, 64, 100, 1000};
  uint64_t seed = 900;
  int64_t n = 0;
  for (const BlockCase& c : block_cases()) {
    const BlockInputs in(c, seed++);
    for (const int64_t window : {windows[n % windows.size()], windows[(n + 3) % windows.size()]}) {
      expect_block_matches_reference(c, in, window);
      if (::testing::Test::HasFailure()) return;  // one case's dump is enough
    }
    ++n;
  }
}

// The ring of W ranks in one process: rank r holds the zig-zag pieces pos[r] of the sequence; at step s
// it receives the keys/values of rank (r - s) mod W and folds them (first at s = 0, its own block).
// Backward: the same ring order, dq accumulating at home, dk/dv into the travelling block's owner.
struct RingResult {
  std::vector<float> o, lse, dq, dk, dv;  // reassembled in the whole-sequence layouts
};

struct RingProblem {
  int64_t B, T, nh, nkv, hd, hdv;
  std::vector<float> q, k, v, dout;  // (B, T, nh, hd), (B, T, nkv, hd), (B, T, nkv, hdv), (B, T, nh, hdv)
  float scale;
  // hdv_ = 0: hdv = hd.
  RingProblem(int64_t B_, int64_t T_, int64_t nh_, int64_t nkv_, int64_t hd_, uint64_t seed, int64_t hdv_ = 0)
      : B(B_), T(T_), nh(nh_), nkv(nkv_), hd(hd_), hdv(hdv_ > 0 ? hdv_ : hd_) {
    Rng rng(seed);
    q = op_test::random_vector<float>(B * T * nh * hd, rng, 2.0);
    k = op_test::random_vector<float>(B * T * nkv * hd, rng);
    v = op_test::random_vector<float>(B * T * nkv * hdv, rng);
    dout = op_test::random_vector<float>(B * T * nh * hdv, rng);
    scale = 1.0f / std::sqrt(static_cast<float>(hd));
  }
  std::string label(int W) const {
    return "W=" + std::to_string(W) + " B=" + std::to_string(B) + " T=" + std::to_string(T) +
           " nh=" + std::to_string(nh) + " nkv=" + std::to_string(nkv) + " hd=" + std::to_string(hd) +
           (hdv != hd ? " hdv=" + std::to_string(hdv) : "");
  }
};

// Each rank's inputs, gathered once (the ring's data movement is not the kernels' business).
struct RingPieces {
  std::vector<std::vector<int32_t>> pos;               // [r] (N) global positions, N = T / W
  std::vector<std::vector<float>> q, k, v, dout;       // [r] (B, N, heads, hd or hdv)
  std::vector<std::vector<float>> o, lse, dq, dk, dv;  // [r] running state and gradients
  RingPieces(const RingProblem& p, int W) {
    for (int r = 0; r < W; ++r) {
      pos.push_back(zigzag_positions(p.T, W, r));
      q.push_back(rows_gather(p.q, pos[r], p.B, p.T, p.nh * p.hd));
      k.push_back(rows_gather(p.k, pos[r], p.B, p.T, p.nkv * p.hd));
      v.push_back(rows_gather(p.v, pos[r], p.B, p.T, p.nkv * p.hdv));
      dout.push_back(rows_gather(p.dout, pos[r], p.B, p.T, p.nh * p.hdv));
      o.emplace_back(dout[r].size());
      lse.emplace_back(p.B * p.nh * static_cast<int64_t>(pos[r].size()));
      dq.emplace_back(q[r].size());
      dk.emplace_back(k[r].size());
      dv.emplace_back(v[r].size());
    }
  }
};

// window: the sliding window of every block call (0: causal).
void ring_forward(const RingProblem& p, RingPieces& x, int W, int64_t window = 0) {
  const int64_t N = p.T / W;
  for (int r = 0; r < W; ++r)
    for (int s = 0; s < W; ++s) {
      const int src = (r - s + W) % W;
      ops::cpu::attention_block_forward(x.q[r].data(), x.k[src].data(), x.v[src].data(), x.o[r].data(), x.lse[r].data(),
                                        s == 0,
                                        ops::attention_block_spec(x.pos[r].data(), x.pos[src].data(), p.B, N, N, p.nh,
                                                                  p.nkv, p.hd, p.hdv, p.scale, window));
    }
}

void ring_backward(const RingProblem& p, RingPieces& x, int W, int64_t window = 0) {
  const int64_t N = p.T / W;
  for (int r = 0; r < W; ++r) {
    std::fill(x.dq[r].begin(), x.dq[r].end(), 0.0f);
    std::fill(x.dk[r].begin(), x.dk[r].end(), 0.0f);
    std::fill(x.dv[r].begin(), x.dv[r].end(), 0.0f);
  }
  for (int r = 0; r < W; ++r)
    for (int s = 0; s < W; ++s) {
      const int src = (r - s + W) % W;
      ops::cpu::attention_block_backward(x.q[r].data(), x.k[src].data(), x.v[src].data(), x.o[r].data(),
                                         x.lse[r].data(), x.dout[r].data(), x.dq[r].data(), x.dk[src].data(),
                                         x.dv[src].data(),
                                         ops::attention_block_spec(x.pos[r].data(), x.pos[src].data(), p.B, N, N, p.nh,
                                                                   p.nkv, p.hd, p.hdv, p.scale, window));
    }
}

RingResult ring_run(const RingProblem& p, int W, int64_t window = 0) {
  RingPieces x(p, W);
  ring_forward(p, x, W, window);
  ring_backward(p, x, W, window);
  RingResult out{std::vector<float>(p.dout.size()), std::vector<float>(p.B * p.nh * p.T),
                 std::vector<float>(p.q.size()), std::vector<float>(p.k.size()), std::vector<float>(p.v.size())};
  for (int r = 0; r < W; ++r) {
    rows_scatter(out.o, x.o[r], x.pos[r], p.B, p.T, p.nh * p.hdv);
    lse_scatter(out.lse, x.lse[r], x.pos[r], p.B, p.nh, p.T);
    rows_scatter(out.dq, x.dq[r], x.pos[r], p.B, p.T, p.nh * p.hd);
    rows_scatter(out.dk, x.dk[r], x.pos[r], p.B, p.T, p.nkv * p.hd);
    rows_scatter(out.dv, x.dv[r], x.pos[r], p.B, p.T, p.nkv * p.hdv);
  }
  return out;
}

RingResult whole_run(const RingProblem& p, int64_t window = 0) {
  RingResult out{std::vector<float>(p.dout.size()), std::vector<float>(p.B * p.nh * p.T),
                 std::vector<float>(p.q.size()), std::vector<float>(p.k.size()), std::vector<float>(p.v.size())};
  ops::cpu::attention_forward(p.q.data(), p.k.data(), p.v.data(), out.o.data(), out.lse.data(),
                              ops::attention_spec(p.B, p.T, p.nh, p.nkv, p.hd, p.hdv, p.scale, window));
  ops::cpu::attention_backward(p.q.data(), p.k.data(), p.v.data(), out.o.data(), out.lse.data(), p.dout.data(),
                               out.dq.data(), out.dk.data(), out.dv.data(),
                               ops::attention_spec(p.B, p.T, p.nh, p.nkv, p.hd, p.hdv, p.scale, window));
  return out;
}

}  // namespace

// The (nh, nkv) and head_dim the ring tests cycle through.
const std::vector<std::pair<int64_t, int64_t>> kRingHeads = {{4, 2}, {3, 1}, {2, 2}};
const std::vector<int64_t> kRingHeadDims = {24, 64, 8};

// The ring's result against the whole-sequence kernels' on the same problem: bit for bit when `bitwise`
// (W = 1: one rank holds the whole sequence in order, the same tiles, the same sums, the same bits; Note
// [Merging partial attention], backend/cpu/kernels/attention_block.cpp), and within RingMatchesWholeSequence's
// tolerances: 3e-6 for o and lse, 1.5e-5 for the gradients.
void expect_ring_matches_whole(const RingResult& ring, const RingResult& whole, const std::string& l, bool bitwise) {
  if (bitwise) {
    EXPECT_TRUE(op_test::bits_equal(ring.o, whole.o)) << "o " << l;
    EXPECT_TRUE(op_test::bits_equal(ring.lse, whole.lse)) << "lse " << l;
    EXPECT_TRUE(op_test::bits_equal(ring.dq, whole.dq)) << "dq " << l;
    EXPECT_TRUE(op_test::bits_equal(ring.dk, whole.dk)) << "dk " << l;
    EXPECT_TRUE(op_test::bits_equal(ring.dv, whole.dv)) << "dv " << l;
  }
  EXPECT_TRUE(op_test::near("o " + l, ring.o, whole.o, op_test::tol_near_rms(3e-6, whole.o), kNegInfExact));
  EXPECT_TRUE(op_test::near("lse " + l, ring.lse, whole.lse, op_test::tol_near_rms(3e-6, whole.lse), kNegInfExact));
  EXPECT_TRUE(op_test::near("dq " + l, ring.dq, whole.dq, op_test::tol_near_rms(1.5e-5, whole.dq), kNegInfExact));
  EXPECT_TRUE(op_test::near("dk " + l, ring.dk, whole.dk, op_test::tol_near_rms(1.5e-5, whole.dk), kNegInfExact));
  EXPECT_TRUE(op_test::near("dv " + l, ring.dv, whole.dv, op_test::tol_near_rms(1.5e-5, whole.dv), kNegInfExact));
}

// The ring on W ranks and the whole-sequence kernel, both within 1e-5 of the double reference (o, lse and
// the three gradients), with the given window.
void ring_and_whole_near_double(const RingProblem& p, int W, int64_t window) {
  const RingResult ring = ring_run(p, W, window), whole = whole_run(p, window);
  const std::vector<double> q(p.q.begin(), p.q.end()), k(p.k.begin(), p.k.end()), v(p.v.begin(), p.v.end());
  const std::vector<double> dout(p.dout.begin(), p.dout.end());
  std::vector<double> o(dout.size()), lse(p.B * p.nh * p.T), dq(q.size()), dk(k.size()), dv(v.size());
  ops::ref::attention_forward<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), p.B, p.T, p.nh, p.nkv, p.hd,
                                      p.hdv, p.scale, window);
  ops::ref::attention_backward<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(),
                                       dk.data(), dv.data(), p.B, p.T, p.nh, p.nkv, p.hd, p.hdv, p.scale, window);
  for (const auto& [got, who] : {std::pair{&ring, "ring"}, std::pair{&whole, "whole"}}) {
    const std::string l = std::string(who) + " " + p.label(W) + " window=" + std::to_string(window);
    EXPECT_TRUE(op_test::near("o vs double " + l, got->o, o, op_test::tol_near_rms(1e-5, o), kNegInfExact));
    EXPECT_TRUE(op_test::near("lse vs double " + l, got->lse, lse, op_test::tol_near_rms(1e-5, lse), kNegInfExact));
    EXPECT_TRUE(op_test::near("dq vs double " + l, got->dq, dq, op_test::tol_near_rms(1e-5, dq), kNegInfExact));
    EXPECT_TRUE(op_test::near("dk vs double " + l, got->dk, dk, op_test::tol_near_rms(1e-5, dk), kNegInfExact));
    EXPECT_TRUE(op_test::near("dv vs double " + l, got->dv, dv, op_test::tol_near_rms(1e-5, dv), kNegInfExact));
  }
}

// The ring reproduces the whole sequence. Both sides are the same float kernels; what differs is the
// order of the sums: the ring merges W partial softmaxes by the log-sum-exp rule and adds W partial
// gradients per element, so each side carries its own rounding, and the two are about equally far from
// the exact answer (RingMatchesDoubleReference). Measured over these cases with the tol_near_rms metric (op_test.h):
// o, lse within 1.7e-6 of each other (tolerance 3e-6, ~25 eps), dq, dk, dv within 7.9e-6 (tolerance
// 1.5e-5: each gradient sums up to T terms of both signs). A key block dropped or folded twice, a wrong
// position or a wrong merge is off by 1e-2 or more.
TEST(AttentionBlock, RingMatchesWholeSequence) {
  const auto& heads = kRingHeads;
  const auto& hds = kRingHeadDims;
  uint64_t seed = 300;
  int64_t n = 0;
  for (const int W : {1, 2, 3, 4})
    for (const int64_t C : {1, 7, 33, 64, 70}) {
      const auto [nh, nkv] = heads[n % heads.size()];
      const RingProblem p(1 + n % 2, 2 * W * C, nh, nkv, hds[n % hds.size()], seed++);
      ++n;
      const RingResult ring = ring_run(p, W), whole = whole_run(p);
      expect_ring_matches_whole(ring, whole, p.label(W), W == 1);
      if (::testing::Test::HasFailure()) return;
    }
}

// The ring is as exact as the whole-sequence kernel: both against the double reference of the whole
// sequence on the same float inputs, within the bounds test_attention.cpp holds attention_forward to
// (1e-5 of the magnitude; measured worst: ring 5.2e-6, whole 5.0e-6).
TEST(AttentionBlock, RingMatchesDoubleReference) {
  for (const auto& [W, C] : std::vector<std::pair<int, int64_t>>{{4, 33}, {3, 70}})
    ring_and_whole_near_double(RingProblem(1, 2 * W * C, 4, 2, 24, 500 + W), W, 0);
}

// The ring with a sliding window: every block call given the same window reproduces attention_forward /
// attention_backward of the whole sequence with that window. Windows of 1, under a chunk, over a
// chunk (reaching into the previous chunk, on the same rank or another), across several chunks and of T
// (nothing masked), two per problem in turn; chunk sizes under, at and over the 64-token tile. Same tolerances as the
// causal ring (RingMatchesWholeSequence), bit for bit at W = 1 (one block over contiguous positions runs the same tiles
// and masks as the whole-sequence kernel), and a window of T is the causal ring bit for bit.
TEST(AttentionBlock, SlidingWindowRingMatchesWholeSequence) {
  const auto& heads = kRingHeads;
  const auto& hds = kRingHeadDims;
  uint64_t seed = 700;
  int64_t n = 0;
  for (const int W : {1, 2, 3, 4})
    for (const int64_t C : {7, 33, 64, 70}) {
      const auto [nh, nkv] = heads[n % heads.size()];
      const RingProblem p(1 + n % 2, 2 * W * C, nh, nkv, hds[n % hds.size()], seed++);
      const std::vector<int64_t> windows = {1, C / 2 + 1, C + 5, 2 * C + 50, p.T};
      for (const int64_t window : {windows[n % windows.size()], windows[(n + 2) % windows.size()]}) {
        const RingResult ring = ring_run(p, W, window), whole = whole_run(p, window);
        const std::string l = p.label(W) + " window=" + std::to_string(window);
        if (window == p.T) {
          const RingResult causal = ring_run(p, W, 0);
          EXPECT_TRUE(op_test::bits_equal(ring.o, causal.o) && op_test::bits_equal(ring.lse, causal.lse))
              << "o, lse " << l;
          EXPECT_TRUE(op_test::bits_equal(ring.dq, causal.dq) && op_test::bits_equal(ring.dk, causal.dk) &&
                      op_test::bits_equal(ring.dv, causal.dv))
              << "dq, dk, dv " << l;
        }
        expect_ring_matches_whole(ring, whole, l, W == 1);
        if (::testing::Test::HasFailure()) return;
      }
      ++n;
    }
}

// The windowed ring and the windowed whole-sequence kernel are both within 1e-5 of the double reference
// with the window (the causal bound, RingMatchesDoubleReference).
TEST(AttentionBlock, SlidingWindowRingMatchesDoubleReference) {
  const std::vector<std::tuple<int, int64_t, int64_t>> cases = {{4, 33, 50}, {3, 70, 100}, {2, 64, 1}};  // W, C, w
  for (const auto& [W, C, window] : cases) {
    ring_and_whole_near_double(RingProblem(1, 2 * W * C, 4, 2, 24, 800 + W), W, window);
  }
}

// Value heads of another width than the query/key heads (Note [Value heads of their own width],
// ops/attention.h): every block pair of block_cases (contiguous, offset, fully visible, fully masked,
// ties, random, zig-zag) with hdv != hd, against the float reference as in MatchesReference (first block,
// merge, backward, +=), causal and with a window; hdv under and over hd and not a multiple of the 8-column
// register block; and DeepSeek-V3's 192 / 128 with nh = nkv on the block pairs of a zig-zag ring.
TEST(AttentionBlock, ValueWidthMatchesReference) {
  const std::vector<int64_t> hdvs = {16, 40, 13, 8, 24, 3};
  const std::vector<int64_t> windows = {0, 3, 20, 100};
  std::vector<BlockCase> cases;
  int64_t n = 0;
  for (BlockCase c : block_cases()) {
    c.hdv = hdvs[n++ % hdvs.size()];
    if (c.hdv == c.hd) c.hdv = c.hd + 7;
    cases.push_back(std::move(c));
  }
  for (int r = 0; r < 2; ++r)
    for (int s = 0; s < 2; ++s)
      cases.push_back({"zigzag W=2 C=70 r=" + std::to_string(r) + " s=" + std::to_string(s), 1, 2, 2, 192,
                       zigzag_positions(280, 2, r), zigzag_positions(280, 2, s), 128});
  uint64_t seed = 1300;
  n = 0;
  for (const BlockCase& c : cases) {
    const BlockInputs in(c, seed++);
    for (const int64_t window : {int64_t{0}, windows[1 + n % (windows.size() - 1)]}) {
      expect_block_matches_reference(c, in, window);
      if (::testing::Test::HasFailure()) return;  // one case's dump is enough
    }
    ++n;
  }
}

// The (nh, nkv, hd, hdv) the value-width ring tests cycle through: hdv < hd, DeepSeek-V3's 192 / 128 with
// nh = nkv, hdv > hd with GQA (two query heads a kv head, three), hdv not a multiple of 8.
const std::vector<std::array<int64_t, 4>> kRingValueWidths = {
    {4, 2, 24, 16}, {2, 2, 192, 128}, {4, 2, 16, 40}, {3, 1, 8, 64}, {2, 1, 5, 13}};

// The ring with hdv != hd, its K block (B, N, nkv, hd) and V block (B, N, nkv, hdv) of different sizes,
// against the whole-sequence kernels with the same widths: bit for bit at W = 1, and within the causal
// ring's tolerances (RingMatchesWholeSequence) otherwise; causal and with a window, in turn.
TEST(AttentionBlock, ValueWidthRingMatchesWholeSequence) {
  uint64_t seed = 1400;
  int64_t n = 0;
  for (const int W : {1, 2, 3, 4})
    for (const int64_t C : {7, 33, 70}) {
      const auto [nh, nkv, hd, hdv] = kRingValueWidths[n % kRingValueWidths.size()];
      const RingProblem p(1 + n % 2, 2 * W * C, nh, nkv, hd, seed++, hdv);
      const int64_t window = n % 2 == 0 ? 0 : C + 5;
      ++n;
      const RingResult ring = ring_run(p, W, window), whole = whole_run(p, window);
      const std::string l = p.label(W) + " window=" + std::to_string(window);
      expect_ring_matches_whole(ring, whole, l, W == 1);
      if (::testing::Test::HasFailure()) return;
    }
}

// The ring and the whole-sequence kernel with hdv != hd, both against the double reference of the whole
// sequence within 1e-5 (the bound of RingMatchesDoubleReference).
TEST(AttentionBlock, ValueWidthRingMatchesDoubleReference) {
  // W, C, window, and (nh, nkv, hd, hdv)
  const std::vector<std::tuple<int, int64_t, int64_t, std::array<int64_t, 4>>> cases = {
      {4, 33, 0, {4, 2, 24, 16}}, {3, 70, 100, {2, 2, 192, 128}}, {2, 64, 0, {4, 2, 16, 40}}};
  for (const auto& [W, C, window, widths] : cases) {
    const auto [nh, nkv, hd, hdv] = widths;
    ring_and_whole_near_double(RingProblem(1, 2 * W * C, nh, nkv, hd, 1500 + W, hdv), W, window);
  }
}

// The same bits for any thread count with hdv != hd: a ring of 3 ranks, 1 thread vs 2, and a second run.
TEST(AttentionBlock, ValueWidthBitwiseDeterministicAcrossThreadsAndRuns) {
  const int saved = omp_get_max_threads();
  const int W = 3;
  const RingProblem p(2, 2 * W * 70, 4, 2, 24, 78, 40);
  omp_set_num_threads(1);
  const RingResult one = ring_run(p, W, 90);
  omp_set_num_threads(2);
  const RingResult two = ring_run(p, W, 90);
  const RingResult again = ring_run(p, W, 90);
  omp_set_num_threads(saved);
  for (const RingResult* other : {&two, &again}) {
    EXPECT_TRUE(op_test::bits_equal(one.o, other->o)) << "o";
    EXPECT_TRUE(op_test::bits_equal(one.lse, other->lse)) << "lse";
    EXPECT_TRUE(op_test::bits_equal(one.dq, other->dq)) << "dq";
    EXPECT_TRUE(op_test::bits_equal(one.dk, other->dk)) << "dk";
    EXPECT_TRUE(op_test::bits_equal(one.dv, other->dv)) << "dv";
  }
}

namespace {

// The (query tile, key tile) pairs of one block pair holding at least one visible (query, key) pair,
// found pair by pair from the positions: what the kernels must compute, per (b, head) and pass.
int64_t visible_tile_pairs(const std::vector<int32_t>& qp, const std::vector<int32_t>& kp, int64_t window) {
  const int64_t TQ = ops::cpu::kAttentionTileQ, TK = ops::cpu::kAttentionTileK;
  const int64_t Tq = static_cast<int64_t>(qp.size()), Tk = static_cast<int64_t>(kp.size());
  int64_t pairs = 0;
  for (int64_t i0 = 0; i0 < Tq; i0 += TQ)
    for (int64_t j0 = 0; j0 < Tk; j0 += TK) {
      bool any = false;
      for (int64_t i = i0; i < std::min(Tq, i0 + TQ) && !any; ++i)
        for (int64_t j = j0; j < std::min(Tk, j0 + TK) && !any; ++j)
          any = kp[j] <= qp[i] && (window == 0 || qp[i] - window < kp[j]);
      pairs += any;
    }
  return pairs;
}

}  // namespace

// Tile pairs outside the band are never computed, counted by the kernels themselves
// (attention_tile::tile_pairs_computed), not timed. A zig-zag ring of W = 4 over T = 2048 (chunks of
// 256, a multiple of the tile): for each window the ring's block calls compute exactly the tile pairs
// holding a visible pair, in the forward and in each backward pass, which is exactly what the
// whole-sequence kernel computes (528 per head and pass causal, 93 with a window of 128). A key block
// entirely outside every local query's window (rank 0's chunks 0 and 7 against rank 2's chunks 2 and 5
// at window 128) computes nothing: the merge keeps the state bit for bit, first = true gives (0, -inf),
// and the backward leaves the gradients untouched.
TEST(AttentionBlock, SlidingWindowSkipsMaskedTilePairs) {
  namespace at = ops::cpu::attention_tile;
  // The two-pass backward computes each pair once per pass; the one sweep once (checked below).
  at::backward_sweep = at::BackwardSweep::two_pass;
  const int W = 4;
  const RingProblem p(1, 2048, 2, 1, 8, 31);
  std::vector<int32_t> all(p.T);
  for (int64_t t = 0; t < p.T; ++t) all[t] = static_cast<int32_t>(t);
  EXPECT_EQ(visible_tile_pairs(all, all, 0), 528);
  EXPECT_EQ(visible_tile_pairs(all, all, 128), 93);
  for (const int64_t window : {int64_t{0}, int64_t{128}, int64_t{300}, int64_t{1}}) {
    const std::string l = p.label(W) + " window=" + std::to_string(window);
    RingPieces x(p, W);
    int64_t want = 0;  // per head and pass
    for (int r = 0; r < W; ++r)
      for (int s = 0; s < W; ++s) want += visible_tile_pairs(x.pos[r], x.pos[s], window);
    EXPECT_EQ(want, visible_tile_pairs(all, all, window)) << l;
    int64_t before = at::tile_pairs_computed.load();
    ring_forward(p, x, W, window);
    EXPECT_EQ(at::tile_pairs_computed.load() - before, p.B * p.nh * want) << "ring forward " << l;
    before = at::tile_pairs_computed.load();
    ring_backward(p, x, W, window);
    EXPECT_EQ(at::tile_pairs_computed.load() - before, 2 * p.B * p.nh * want) << "ring backward " << l;
    before = at::tile_pairs_computed.load();
    whole_run(p, window);
    EXPECT_EQ(at::tile_pairs_computed.load() - before, 3 * p.B * p.nh * want) << "whole " << l;
    // Note [One backward sweep where the dQ sums fit]: each visible pair once, for all three sums.
    at::backward_sweep = at::BackwardSweep::one;
    before = at::tile_pairs_computed.load();
    ring_backward(p, x, W, window);
    EXPECT_EQ(at::tile_pairs_computed.load() - before, p.B * p.nh * want) << "ring backward, one sweep " << l;
    at::backward_sweep = at::BackwardSweep::two_pass;
  }
  at::backward_sweep = at::BackwardSweep::automatic;
  // A fully masked block: rank 0's queries (positions 0..255, 1792..2047) against rank 2's keys
  // (512..767, 1280..1535) with a window of 128.
  const int64_t window = 128, N = p.T / W;
  RingPieces x(p, W);
  ring_forward(p, x, W, window);
  ASSERT_EQ(visible_tile_pairs(x.pos[0], x.pos[2], window), 0);
  const std::vector<float> o = x.o[0], lse = x.lse[0];
  int64_t before = at::tile_pairs_computed.load();
  ops::cpu::attention_block_forward(
      x.q[0].data(), x.k[2].data(), x.v[2].data(), x.o[0].data(), x.lse[0].data(), false,
      ops::attention_block_spec(x.pos[0].data(), x.pos[2].data(), p.B, N, N, p.nh, p.nkv, p.hd, p.hd, p.scale, window));
  EXPECT_EQ(at::tile_pairs_computed.load(), before);
  EXPECT_TRUE(op_test::bits_equal(x.o[0], o) && op_test::bits_equal(x.lse[0], lse));
  std::vector<float> o_first(o.size(), NAN), lse_first(lse.size(), NAN);
  ops::cpu::attention_block_forward(
      x.q[0].data(), x.k[2].data(), x.v[2].data(), o_first.data(), lse_first.data(), true,
      ops::attention_block_spec(x.pos[0].data(), x.pos[2].data(), p.B, N, N, p.nh, p.nkv, p.hd, p.hd, p.scale, window));
  EXPECT_EQ(at::tile_pairs_computed.load(), before);
  EXPECT_TRUE(std::all_of(o_first.begin(), o_first.end(), [](float v) { return v == 0.0f && !std::signbit(v); }));
  EXPECT_TRUE(std::all_of(lse_first.begin(), lse_first.end(), [](float v) { return v == kNegInf; }));
  std::vector<float> dq(x.q[0].size(), -0.0f), dk(x.k[2].size(), -0.0f), dv(x.k[2].size(), -0.0f);
  const std::vector<float> dq0 = dq, dk0 = dk, dv0 = dv;  // -0 would turn into +0 if anything were added
  ops::cpu::attention_block_backward(
      x.q[0].data(), x.k[2].data(), x.v[2].data(), x.o[0].data(), x.lse[0].data(), x.dout[0].data(), dq.data(),
      dk.data(), dv.data(),
      ops::attention_block_spec(x.pos[0].data(), x.pos[2].data(), p.B, N, N, p.nh, p.nkv, p.hd, p.hd, p.scale, window));
  EXPECT_EQ(at::tile_pairs_computed.load(), before);
  EXPECT_TRUE(op_test::bits_equal(dq, dq0) && op_test::bits_equal(dk, dk0) && op_test::bits_equal(dv, dv0));
}

// Two blocks merged into one state, in double: L = sum w * o_final for a random w. The gradient is the
// sum of the two block backwards from the final (o, lse): dq from both, dk/dv of each block from its
// own call. Against central differences of the forward (h = 1e-5: truncation ~h^2, rounding ~1e-16 / h,
// both far under 1e-7). The positions make query 0 see no key at all (o = 0, lse = -inf: gradient 0),
// queries 1-3 see no key of the block folded first (the merge's empty-state branch), and ties.
// hd / hdv: the query-key / value-output head widths; window: every call's (0: causal).
void expect_merged_reference_backward_matches_finite_differences(int64_t hd, int64_t hdv, uint64_t seed,
                                                                 int64_t window) {
  const int64_t B = 2, nh = 4, nkv = 2;
  const std::vector<int32_t> q_pos = {0, 2, 3, 3, 7, 9};  // (Tq)
  const std::vector<int32_t> k1_pos = {1, 2, 3, 4};       // (Tk1) folded second
  const std::vector<int32_t> k2_pos = {5, 6, 7, 8, 9};    // (Tk2) folded first
  const int64_t Tq = 6, Tk1 = 4, Tk2 = 5;
  Rng rng(seed);
  std::vector<double> q = op_test::random_vector<double>(B * Tq * nh * hd, rng, 1.5);
  std::vector<double> k1 = op_test::random_vector<double>(B * Tk1 * nkv * hd, rng);
  std::vector<double> v1 = op_test::random_vector<double>(B * Tk1 * nkv * hdv, rng);
  std::vector<double> k2 = op_test::random_vector<double>(B * Tk2 * nkv * hd, rng);
  std::vector<double> v2 = op_test::random_vector<double>(B * Tk2 * nkv * hdv, rng);
  const std::vector<double> w = op_test::random_vector<double>(B * Tq * nh * hdv, rng);
  const double scale = 0.6;
  std::vector<double> o(w.size()), lse(B * nh * Tq);
  auto loss = [&] {
    ops::ref::attention_block_forward<double>(q.data(), k2.data(), v2.data(), q_pos.data(), k2_pos.data(), o.data(),
                                              lse.data(), true, B, Tq, Tk2, nh, nkv, hd, hdv, scale, window);
    ops::ref::attention_block_forward<double>(q.data(), k1.data(), v1.data(), q_pos.data(), k1_pos.data(), o.data(),
                                              lse.data(), false, B, Tq, Tk1, nh, nkv, hd, hdv, scale, window);
    double L = 0;
    for (size_t i = 0; i < o.size(); ++i) L += w[i] * o[i];
    return L;
  };
  loss();
  ASSERT_EQ(lse[0], -std::numeric_limits<double>::infinity());  // query 0 of (b 0, h 0) saw nothing
  std::vector<double> dq(q.size()), dk1(k1.size()), dv1(v1.size()), dk2(k2.size()), dv2(v2.size());
  ops::ref::attention_block_backward<double>(q.data(), k1.data(), v1.data(), o.data(), lse.data(), w.data(),
                                             q_pos.data(), k1_pos.data(), dq.data(), dk1.data(), dv1.data(), B, Tq, Tk1,
                                             nh, nkv, hd, hdv, scale, window);
  ops::ref::attention_block_backward<double>(q.data(), k2.data(), v2.data(), o.data(), lse.data(), w.data(),
                                             q_pos.data(), k2_pos.data(), dq.data(), dk2.data(), dv2.data(), B, Tq, Tk2,
                                             nh, nkv, hd, hdv, scale, window);
  auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
    for (size_t i = 0; i < x.size(); ++i) {
      const double fd = op_test::central_difference(x[i], loss);
      ASSERT_TRUE(std::isfinite(grad[i])) << name << "[" << i << "] hd=" << hd << " hdv=" << hdv;
      ASSERT_NEAR(grad[i], fd, 1e-7 * (1 + std::abs(fd))) << name << "[" << i << "] hd=" << hd << " hdv=" << hdv;
    }
  };
  check(q, dq, "dq");
  check(k1, dk1, "dk1");
  check(v1, dv1, "dv1");
  check(k2, dk2, "dk2");
  check(v2, dv2, "dv2");
}

TEST(AttentionBlock, ReferenceBackwardMatchesFiniteDifferences) {
  expect_merged_reference_backward_matches_finite_differences(5, 5, 11, 0);
}

// The same with value heads narrower and wider than the query/key heads, causal and with a window of 3
// (Note [Value heads of their own width], ops/attention.h).
TEST(AttentionBlock, ValueWidthReferenceBackwardMatchesFiniteDifferences) {
  expect_merged_reference_backward_matches_finite_differences(5, 3, 12, 0);
  expect_merged_reference_backward_matches_finite_differences(3, 7, 13, 3);
}

// The contract promises the same bits for any thread count: a ring of 3 ranks (diagonal, visible and
// masked block pairs, chunks straddling tiles), forward and backward, 1 thread vs 2, and a second run.
TEST(AttentionBlock, BitwiseDeterministicAcrossThreadsAndRuns) {
  const int saved = omp_get_max_threads();
  const int W = 3;
  const RingProblem p(2, 2 * W * 70, 4, 2, 24, 77);
  omp_set_num_threads(1);
  const RingResult one = ring_run(p, W);
  omp_set_num_threads(2);
  const RingResult two = ring_run(p, W);
  const RingResult again = ring_run(p, W);
  omp_set_num_threads(saved);
  for (const RingResult* other : {&two, &again}) {
    EXPECT_TRUE(op_test::bits_equal(one.o, other->o)) << "o";
    EXPECT_TRUE(op_test::bits_equal(one.lse, other->lse)) << "lse";
    EXPECT_TRUE(op_test::bits_equal(one.dq, other->dq)) << "dq";
    EXPECT_TRUE(op_test::bits_equal(one.dk, other->dk)) << "dk";
    EXPECT_TRUE(op_test::bits_equal(one.dv, other->dv)) << "dv";
  }
}

// Note [One backward sweep where the dQ sums fit]: the one sweep gives the two passes' bits, dQ, dK and
// dV, on rings (diagonal, visible and masked block pairs, chunks straddling tiles) and whole sequences,
// causal and windowed, GQA groups of 1, 2 and 4, value heads of their own width, 1 and 2 threads; and
// the automatic choice, whichever it makes, gives them too.
TEST(AttentionBlock, OneSweepEqualsTwoPassBitwise) {
  namespace at = ops::cpu::attention_tile;
  const int saved = omp_get_max_threads();
  const RingProblem problems[] = {RingProblem(2, 2 * 3 * 70, 4, 2, 24, 77), RingProblem(1, 2 * 3 * 50, 2, 2, 16, 78),
                                  RingProblem(2, 2 * 3 * 45, 8, 2, 24, 79, 40), RingProblem(1, 200, 4, 1, 10, 80, 7)};
  int compared = 0;
  for (const RingProblem& p : problems)
    for (const int64_t window : {int64_t{0}, int64_t{90}})
      for (const int threads : {1, 2}) {
        omp_set_num_threads(threads);
        const std::string l = p.label(3) + " window=" + std::to_string(window) + " threads=" + std::to_string(threads);
        RingResult r[3], wr[3];
        const at::BackwardSweep sweeps[3] = {at::BackwardSweep::two_pass, at::BackwardSweep::one,
                                             at::BackwardSweep::automatic};
        for (int i = 0; i < 3; ++i) {
          at::backward_sweep = sweeps[i];
          r[i] = ring_run(p, 3, window);
          wr[i] = whole_run(p, window);
        }
        at::backward_sweep = at::BackwardSweep::automatic;
        for (int i = 1; i < 3; ++i)
          for (const auto* pair : {&r, &wr}) {
            const RingResult &a = (*pair)[0], &b = (*pair)[i];
            const std::string what = l + (pair == &r ? " ring" : " whole") + (i == 1 ? " one sweep" : " automatic");
            EXPECT_TRUE(op_test::bits_equal(a.dq, b.dq)) << "dq " << what;
            EXPECT_TRUE(op_test::bits_equal(a.dk, b.dk)) << "dk " << what;
            EXPECT_TRUE(op_test::bits_equal(a.dv, b.dv)) << "dv " << what;
            ++compared;
          }
      }
  omp_set_num_threads(saved);
  EXPECT_EQ(compared, 4 * 2 * 2 * 2 * 2);
}

// Queries that see no key of a block: first = true leaves exactly (0, -inf); merging a fully masked
// block keeps the state bit for bit (also a still-empty one); merging a visible block into an empty
// state gives that block's result; the backward of a fully masked block adds exactly nothing. No NaN.
TEST(AttentionBlock, QueriesWithoutKeysGiveNoNaN) {
  const int64_t B = 2, Tq = 70, Tk = 65, nh = 4, nkv = 2, hd = 24;
  std::vector<int32_t> q_pos(Tq), k_late(Tk), k_early(Tk);
  for (int64_t i = 0; i < Tq; ++i) q_pos[i] = static_cast<int32_t>(100 + i);
  for (int64_t j = 0; j < Tk; ++j) k_late[j] = static_cast<int32_t>(500 + j);   // after every query
  for (int64_t j = 0; j < Tk; ++j) k_early[j] = static_cast<int32_t>(130 + j);  // queries 0..29 see none
  Rng rng(5);
  const std::vector<float> q = op_test::random_vector<float>(B * Tq * nh * hd, rng, 2.0);
  const std::vector<float> k = op_test::random_vector<float>(B * Tk * nkv * hd, rng);
  const std::vector<float> v = op_test::random_vector<float>(B * Tk * nkv * hd, rng);
  const std::vector<float> dout = op_test::random_vector<float>(q.size(), rng);
  const float scale = 0.2f;
  auto fwd = [&](const std::vector<int32_t>& kp, std::vector<float>& o, std::vector<float>& lse, bool first) {
    ops::cpu::attention_block_forward(
        q.data(), k.data(), v.data(), o.data(), lse.data(), first,
        ops::attention_block_spec(q_pos.data(), kp.data(), B, Tq, Tk, nh, nkv, hd, hd, scale, 0));
  };
  std::vector<float> o(q.size(), NAN), lse(B * nh * Tq, NAN);
  fwd(k_late, o, lse, true);
  EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](float x) { return x == 0.0f && !std::signbit(x); }));
  EXPECT_TRUE(std::all_of(lse.begin(), lse.end(), [](float x) { return x == kNegInf; }));
  const std::vector<float> o_empty = o, lse_empty = lse;
  fwd(k_late, o, lse, false);  // empty into empty
  EXPECT_TRUE(op_test::bits_equal(o, o_empty) && op_test::bits_equal(lse, lse_empty));
  fwd(k_early, o, lse, false);  // a partly visible block into the empty state = that block alone
  std::vector<float> o_first(q.size()), lse_first(lse.size());
  fwd(k_early, o_first, lse_first, true);
  EXPECT_TRUE(op_test::bits_equal(o, o_first) && op_test::bits_equal(lse, lse_first));
  EXPECT_TRUE(all_finite_or_neg_inf(o, "o"));
  EXPECT_TRUE(all_finite_or_neg_inf(lse, "lse"));
  EXPECT_EQ(lse[0], kNegInf);               // query 0 sees nothing yet
  EXPECT_TRUE(std::isfinite(lse[Tq - 1]));  // the last query sees keys
  const std::vector<float> o_state = o, lse_state = lse;
  fwd(k_late, o, lse, false);  // a masked block into a partly empty state
  EXPECT_TRUE(op_test::bits_equal(o, o_state) && op_test::bits_equal(lse, lse_state));
  // Backward with this (partly empty) final state: the masked block adds 0, the visible one finite terms.
  std::vector<float> dq(q.size(), 1.0f), dk(k.size(), 1.0f), dv(k.size(), 1.0f);
  ops::cpu::attention_block_backward(
      q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(), dv.data(),
      ops::attention_block_spec(q_pos.data(), k_late.data(), B, Tq, Tk, nh, nkv, hd, hd, scale, 0));
  EXPECT_TRUE(std::all_of(dq.begin(), dq.end(), [](float x) { return x == 1.0f; }));
  EXPECT_TRUE(std::all_of(dk.begin(), dk.end(), [](float x) { return x == 1.0f; }));
  EXPECT_TRUE(std::all_of(dv.begin(), dv.end(), [](float x) { return x == 1.0f; }));
  ops::cpu::attention_block_backward(
      q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(), dv.data(),
      ops::attention_block_spec(q_pos.data(), k_early.data(), B, Tq, Tk, nh, nkv, hd, hd, scale, 0));
  EXPECT_TRUE(all_finite_or_neg_inf(dq, "dq") && all_finite_or_neg_inf(dk, "dk") && all_finite_or_neg_inf(dv, "dv"));
  // Query 0 of (b 0, h 0) saw no key anywhere: its dq is untouched.
  EXPECT_TRUE(std::all_of(dq.begin(), dq.begin() + hd, [](float x) { return x == 1.0f; }));
}

// Positions out of order break the staircase the kernels rely on (Note [Masks from sorted positions]):
// an internal error, not a silently wrong mask.
TEST(AttentionBlock, UnsortedPositionsAreRejected) {
  const std::vector<int32_t> sorted = {0, 1, 2}, unsorted = {0, 2, 1};
  const std::vector<float> x(3 * 8, 0.5f);
  std::vector<float> o(x.size()), lse(3), dq(x.size()), dk(x.size()), dv(x.size());
  EXPECT_THROW(ops::cpu::attention_block_forward(
                   x.data(), x.data(), x.data(), o.data(), lse.data(), true,
                   ops::attention_block_spec(unsorted.data(), sorted.data(), 1, 3, 3, 1, 1, 8, 8, 1.0f, 0)),
               InternalError);
  EXPECT_THROW(ops::cpu::attention_block_backward(
                   x.data(), x.data(), x.data(), o.data(), lse.data(), x.data(), dq.data(), dk.data(), dv.data(),
                   ops::attention_block_spec(sorted.data(), unsorted.data(), 1, 3, 3, 1, 1, 8, 8, 1.0f, 0)),
               InternalError);
}

// Benchmark (disabled in the suite; docs/benchmarks.md has the command and the table): the W * W block
// calls of a zig-zag ring against attention_forward / attention_backward on the whole sequence, the
// same causal work, in the same run; each repeat times all four, medians of the repeats. Wall seconds,
// and process cpu seconds (all threads): on a shared machine the second shows the work when other
// processes steal the cores (OpenMP's spin-waiting at barriers counts as cpu too).
// FP_BENCH_JSON=path also writes the JSON there.
TEST(AttentionBlock, DISABLED_BenchRingVsWholeSequence) {
  const int64_t B = 1, T = 2048, nh = 8, nkv = 2, hd = 64;
  const int repeats = 7;
  const RingProblem p(B, T, nh, nkv, hd, 9);
  using Clock = std::chrono::steady_clock;
  auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  // Tile pairs (per head) each side visits: whole, the causal triangle; ring, per block pair the key
  // tiles below the last query's visible count (Note [Masks from sorted positions]).
  auto tile_pairs = [](const std::vector<int32_t>& qp, const std::vector<int32_t>& kp) {
    const int64_t TQ = ops::cpu::kAttentionTileQ, TK = ops::cpu::kAttentionTileK, n = qp.size();
    int64_t pairs = 0;
    for (int64_t i0 = 0; i0 < n; i0 += TQ) {
      const int32_t last = qp[std::min(n, i0 + TQ) - 1];
      const int64_t nvis = std::upper_bound(kp.begin(), kp.end(), last) - kp.begin();
      pairs += (nvis + TK - 1) / TK;
    }
    return pairs;
  };
  std::vector<int32_t> all(T);
  for (int64_t t = 0; t < T; ++t) all[t] = static_cast<int32_t>(t);
  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
  std::string json =
      "{\"bench\": \"attention_block\", \"B\": 1, \"T\": 2048, \"nh\": 8, \"nkv\": 2, \"hd\": 64, "
      "\"threads\": " +
      std::to_string(omp_get_max_threads()) + ", \"omp_wait_policy\": \"" + (wait_policy ? wait_policy : "default") +
      "\", \"repeats\": " + std::to_string(repeats) + ", \"rows\": [";
  std::printf(
      "ring of attention_block calls vs attention on the whole sequence: B=%lld T=%lld nh=%lld nkv=%lld "
      "hd=%lld, %d threads, medians of %d\n",
      static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(nh), static_cast<long long>(nkv),
      static_cast<long long>(hd), omp_get_max_threads(), repeats);
  std::printf("%2s %11s | %-8s %8s %8s %6s | %8s %8s %6s\n", "W", "tile pairs", "", "whole s", "ring s", "ratio",
              "whole cpu", "ring cpu", "ratio");
  for (const int W : {2, 4}) {
    RingPieces x(p, W);
    int64_t ring_pairs = 0;
    for (int r = 0; r < W; ++r)
      for (int s = 0; s < W; ++s) ring_pairs += tile_pairs(x.pos[r], x.pos[s]);
    const int64_t whole_pairs = tile_pairs(all, all);
    RingResult whole{std::vector<float>(p.q.size()), std::vector<float>(B * nh * T), std::vector<float>(p.q.size()),
                     std::vector<float>(p.k.size()), std::vector<float>(p.k.size())};
    // [phase][wall, cpu]: whole fwd, ring fwd, whole bwd, ring bwd
    std::vector<double> t[4][2];
    auto timed = [&](int phase, auto&& fn) {
      const auto w0 = Clock::now();
      const double c0 = cpu_now();
      fn();
      t[phase][1].push_back(cpu_now() - c0);
      t[phase][0].push_back(std::chrono::duration<double>(Clock::now() - w0).count());
    };
    for (int rep = 0; rep < repeats; ++rep) {
      timed(0, [&] {
        ops::cpu::attention_forward(p.q.data(), p.k.data(), p.v.data(), whole.o.data(), whole.lse.data(),
                                    ops::attention_spec(B, T, nh, nkv, hd, hd, p.scale, 0));
      });
      timed(1, [&] { ring_forward(p, x, W); });
      timed(2, [&] {
        ops::cpu::attention_backward(p.q.data(), p.k.data(), p.v.data(), whole.o.data(), whole.lse.data(),
                                     p.dout.data(), whole.dq.data(), whole.dk.data(), whole.dv.data(),
                                     ops::attention_spec(B, T, nh, nkv, hd, hd, p.scale, 0));
      });
      timed(3, [&] { ring_backward(p, x, W); });  // includes zeroing the ranks' gradients: negligible
    }
    // Check before trusting the times: the ring computes the whole sequence's attention (T = 2048 sums
    // more terms than RingMatchesWholeSequence, hence its wider tolerance).
    std::vector<float> o(p.q.size()), dq(p.q.size());
    for (int r = 0; r < W; ++r) {
      rows_scatter(o, x.o[r], x.pos[r], B, T, nh * hd);
      rows_scatter(dq, x.dq[r], x.pos[r], B, T, nh * hd);
    }
    EXPECT_TRUE(op_test::near("bench o", o, whole.o, op_test::tol_near_rms(1e-5, whole.o), kNegInfExact));
    EXPECT_TRUE(op_test::near("bench dq", dq, whole.dq, op_test::tol_near_rms(3e-5, whole.dq), kNegInfExact));
    double m[4][2];
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 2; ++j) m[i][j] = median(t[i][j]);
    for (const int dir : {0, 1}) {
      const double* w = m[2 * dir];
      const double* r = m[2 * dir + 1];
      std::printf("%2d %5lld/%-5lld | %-8s %8.4f %8.4f %6.3f | %8.4f %8.4f %6.3f\n", W,
                  static_cast<long long>(ring_pairs), static_cast<long long>(whole_pairs), dir ? "backward" : "forward",
                  w[0], r[0], r[0] / w[0], w[1], r[1], r[1] / w[1]);
    }
    char row[768];
    std::snprintf(row, sizeof row,
                  "%s{\"W\": %d, \"ring_tile_pairs\": %lld, \"whole_tile_pairs\": %lld, "
                  "\"whole_fwd_s\": %.5f, \"ring_fwd_s\": %.5f, \"fwd_ratio\": %.4f, "
                  "\"whole_bwd_s\": %.5f, \"ring_bwd_s\": %.5f, \"bwd_ratio\": %.4f, "
                  "\"whole_fwd_cpu_s\": %.5f, \"ring_fwd_cpu_s\": %.5f, \"whole_bwd_cpu_s\": %.5f, "
                  "\"ring_bwd_cpu_s\": %.5f}",
                  W == 2 ? "" : ", ", W, static_cast<long long>(ring_pairs), static_cast<long long>(whole_pairs),
                  m[0][0], m[1][0], m[1][0] / m[0][0], m[2][0], m[3][0], m[3][0] / m[2][0], m[0][1], m[1][1], m[2][1],
                  m[3][1]);
    json += row;
  }
  json += "]}";
  std::printf("%s\n", json.c_str());
  if (const char* path = std::getenv("FP_BENCH_JSON")) {
    if (FILE* f = std::fopen(path, "w")) {
      std::fprintf(f, "%s\n", json.c_str());
      std::fclose(f);
    }
  }
}

// bf16 storage with a previous state (first = false: the merge reads o) and gradients already there
// (the backward adds): every input rounded to bf16, the bf16 kernels must give bit for bit the f32
// kernels on the widened values, each output rounded once (ops/attention_block.h's storage rule).
TEST(AttentionBlock, Bf16MergeAndAccumulateAreTheWidenedF32RoundedOnce) {
  const auto rounded = op_test::rounded_bf16;
  const auto widened = op_test::widened;
  std::vector<int32_t> q_pos(70), k_pos(90);
  for (int32_t i = 0; i < 70; ++i) q_pos[i] = 40 + 2 * i;  // queries interleaved with and after the keys
  for (int32_t j = 0; j < 90; ++j) k_pos[j] = j + j / 3;
  BlockCase c{"bf16", 2, 4, 2, 16, q_pos, k_pos, 24};
  const BlockInputs in(c, 77);
  const auto qh = rounded(in.q), kh = rounded(in.k), vh = rounded(in.v), douth = rounded(in.dout), o0h = rounded(in.o0);
  const auto q = widened(qh), k = widened(kh), v = widened(vh), dout = widened(douth);
  for (const int64_t window : {int64_t{0}, int64_t{29}}) {
    std::vector<bf16> oh = o0h;
    std::vector<float> lse_h = in.lse0, o = widened(o0h), lse = in.lse0;
    ops::cpu::attention_block_forward(qh.data(), kh.data(), vh.data(), oh.data(), lse_h.data(), false,
                                      ops::attention_block_spec(c.q_pos.data(), c.k_pos.data(), c.B, c.Tq(), c.Tk(),
                                                                c.nh, c.nkv, c.hd, c.vd(), in.scale, window));
    ops::cpu::attention_block_forward(q.data(), k.data(), v.data(), o.data(), lse.data(), false,
                                      ops::attention_block_spec(c.q_pos.data(), c.k_pos.data(), c.B, c.Tq(), c.Tk(),
                                                                c.nh, c.nkv, c.hd, c.vd(), in.scale, window));
    for (size_t i = 0; i < o.size(); ++i) ASSERT_EQ(oh[i].bits, bf16_from_float(o[i])) << "o at " << i;
    ASSERT_TRUE(op_test::bits_equal(lse_h, lse));
    std::vector<bf16> dqh = rounded(in.dq0), dkh = rounded(in.dk0), dvh = rounded(in.dv0);
    std::vector<float> dq = widened(dqh), dk = widened(dkh), dv = widened(dvh);
    const std::vector<float> o_w = widened(oh);
    ops::cpu::attention_block_backward(qh.data(), kh.data(), vh.data(), oh.data(), lse.data(), douth.data(), dqh.data(),
                                       dkh.data(), dvh.data(),
                                       ops::attention_block_spec(c.q_pos.data(), c.k_pos.data(), c.B, c.Tq(), c.Tk(),
                                                                 c.nh, c.nkv, c.hd, c.vd(), in.scale, window));
    ops::cpu::attention_block_backward(q.data(), k.data(), v.data(), o_w.data(), lse.data(), dout.data(), dq.data(),
                                       dk.data(), dv.data(),
                                       ops::attention_block_spec(c.q_pos.data(), c.k_pos.data(), c.B, c.Tq(), c.Tk(),
                                                                 c.nh, c.nkv, c.hd, c.vd(), in.scale, window));
    for (size_t i = 0; i < dq.size(); ++i) ASSERT_EQ(dqh[i].bits, bf16_from_float(dq[i])) << "dq at " << i;
    for (size_t i = 0; i < dk.size(); ++i) ASSERT_EQ(dkh[i].bits, bf16_from_float(dk[i])) << "dk at " << i;
    for (size_t i = 0; i < dv.size(); ++i) ASSERT_EQ(dvh[i].bits, bf16_from_float(dv[i])) << "dv at " << i;
    // Ring attention's mix (Note [Ring attention accumulates in f32]): bf16 tokens, f32 accumulators.
    // The outputs are then exactly the f32 kernel's, with no rounding at all.
    std::vector<float> om = widened(o0h), lse_m = in.lse0;
    ops::cpu::attention_block_forward(qh.data(), kh.data(), vh.data(), om.data(), lse_m.data(), false,
                                      ops::attention_block_spec(c.q_pos.data(), c.k_pos.data(), c.B, c.Tq(), c.Tk(),
                                                                c.nh, c.nkv, c.hd, c.vd(), in.scale, window));
    ASSERT_TRUE(op_test::bits_equal(om, o));
    ASSERT_TRUE(op_test::bits_equal(lse_m, lse));
    std::vector<float> dqm = widened(rounded(in.dq0)), dkm = widened(rounded(in.dk0)), dvm = widened(rounded(in.dv0));
    ops::cpu::attention_block_backward(qh.data(), kh.data(), vh.data(), oh.data(), lse.data(), douth.data(), dqm.data(),
                                       dkm.data(), dvm.data(),
                                       ops::attention_block_spec(c.q_pos.data(), c.k_pos.data(), c.B, c.Tq(), c.Tk(),
                                                                 c.nh, c.nkv, c.hd, c.vd(), in.scale, window));
    ASSERT_TRUE(op_test::bits_equal(dqm, dq));
    ASSERT_TRUE(op_test::bits_equal(dkm, dk));
    ASSERT_TRUE(op_test::bits_equal(dvm, dv));
  }
}

}  // namespace fp
