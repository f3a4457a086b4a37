// Block attention by global positions (ops/attention_block.h), forward with a log-sum-exp merge and
// backward, tile by tile: the kernels of ring attention, and of whole-sequence attention
// (backend/cpu/kernels/attention.cpp runs them with q_pos = k_pos = 0 .. T-1, Note [Whole sequences as one block pair]
// there). Dimensions: B sequences, Tq queries and Tk keys each, nh query heads, nkv kv heads, group = nh / nkv query
// heads per kv head, hd / hdv the query-key / value-output head widths (Note [Value heads of their own width],
// ops/attention.h), hdp / hdvp = hd / hdv rounded up to kNr (the padded row lengths of the scratch tiles of q, k, dq,
// dk / of v, o, dO, dV), TQ x TK = kAttentionTileQ x kAttentionTileK the (query, key) tile, nqt / nkt the number of
// query / key tiles. No buffer grows with Tq or Tk: each thread owns a fixed scratch of a few (64, hdp), (64, hdvp) and
// (64, 64) tiles, allocated once per parallel region.
//
// Forward (FlashAttention-2): threads take (b, h, query tile) items; each walks the key tiles that hold
// a key some query of the tile sees, keeping a running max m and sum l per query (online softmax) and
// rescaling its (TQ, hdvp) output accumulator when the max grows; inside a tile the keys outside each
// query's run are masked. The tile products are register-blocked loops (Note [Tile products as
// register-blocked loops] in backend/cpu/kernels/attention_tile.h, with the tile helpers).
//
// Note [Deterministic attention backward]: dK and dV of one key tile sum over every query of every
// query head of its group; dQ of one query tile sums over every key tile. FlashAttention-2 makes both in
// one sweep over key tiles with atomic adds into dQ, whose order (and so bits) depends on the thread
// schedule. Here each sum is owned by one work item that adds its terms in a fixed order:
//   pass 1, items (b, kv head, key tile): for each head of the group, then each query tile in order,
//     recompute P and dS and add P^T dO into dV and dS^T Q into dK;
//   pass 2, items (b, head, query tile): for each key tile in order, recompute P and dS and add dS K
//     into dQ.
// Both passes recompute the scores, the probabilities P = exp(scale q.k - lse) and dP = dO V^T: 14
// tile products instead of FA2's 10, bought for results that are the same bits for any thread count
// and any schedule (dynamic scheduling only changes which thread computes an item, never its sums).
//
// Note [One backward sweep where the dQ sums fit]: pass 2 exists only because the dQ sums of one query
// tile must not be shared between items. An item (b, kv head) that walks every key tile in order owns
// all of them: for each key tile, each head of its group, each query tile (pass 1's loops), it adds
// dS K into that query tile's dQ accumulator as well, so each dQ sum takes its key tiles in ascending
// order exactly as pass 2 does, from the same P and dS (tile_probs_and_score_grads) with the same
// product, and dK, dV sum exactly as in pass 1: the same bits, with 2 of the backward's 7 tile
// products per pair (pass 2's second S and dP, and its exponentials) gone: 1.2-1.3x on attention's
// forward + backward (docs/benchmarks.md). It costs a dQ accumulator per thread for the whole block,
// group x Tq x hdp floats, and parallelism of only B x nkv items, so block_backward runs it where both
// hold (at most kOneSweepScratch bytes, and the items fill the threads evenly; the items are equal:
// every (b, kv head) has the same mask, or with documents about the same work), and the two passes otherwise. The
// choice never changes a bit (tests: AttentionBlock.OneSweepEqualsTwoPassBitwise), so results stay independent of the
// thread count.
//
// Note [Masks from sorted positions]: with q_pos and k_pos ascending, the keys query i sees are a run
// of the block, [lo_i, hi_i) with hi_i = #{j : k_pos[j] <= q_pos[i]} and, with a window w > 0,
// lo_i = #{j : k_pos[j] <= q_pos[i] - w} (0 without one; with documents also at least
// #{j : k_pos[j] < doc_start_i}, Note [Documents in attention] in ops/attention.h), and both ends ascend with i.
// Without a window the mask is a staircase like the causal diagonal (contiguous positions give hi_i = i + 1, the causal
// mask itself); a window adds a second staircase below it, a band (Note [Sliding-window bands] in
// backend/cpu/kernels/attention_tile.h). Row r of the tile pair (i0, j0) sees the keys [lo - j0, hi - j0) of the
// tile, clamped to [0, nk). The runs of the tile's rows need not join up (a query tile straddling two
// zig-zag chunks sees two separate stretches of keys), so a tile pair is computed iff some row's run
// meets the key tile; because both ends ascend, the key tiles worth testing lie between the one holding
// lo of the first row and the one holding hi - 1 of the last. The forward and pass 2 test those; pass 1
// tests the query tiles from the one holding the first query that sees key j0 (q_pos >= k_pos[j0]) to
// the one holding the last that sees key j0 + nk - 1 (q_pos < k_pos[j0 + nk - 1] + w). Without a window
// every tested pair passes; over contiguous positions every tested pair passes with a window too, so
// whole-sequence attention visits exactly the tiles of the causal band. Each work
// item finds its tile's runs by binary search (2 TQ searches of log2 Tk steps against a tile product's
// TQ * TK * hd multiply-adds). In a zig-zag ring every chunk pair is fully visible, fully masked or
// diagonal, so when C is a multiple of the tile the ring visits exactly the tile pairs of the whole
// causal sequence (528 of 528 at T = 2048, docs/benchmarks.md); otherwise the tiles straddling chunk
// edges add a few. With a window, a key block that lies entirely before every local query's window
// (the far chunks of a long ring) computes nothing: every test fails.
//
// Note [Merging partial attention]: a block leaves each query row an online-softmax state (m, l, acc):
// max, sum of exp(s - m), unnormalised output, so o_b = acc / l and lse_b = m + log l. Merging into
// (o, lse): lse' = max(lse, lse_b) + log1p(exp(-|lse - lse_b|)) and
//   o' = o exp(lse - lse') + acc exp(m - lse')      (= o_b exp(lse_b - lse'), without rounding acc / l),
// every exponent <= 0, so nothing overflows. An empty side (no visible key: l = 0, lse_b = -inf; or a
// state still at lse = -inf) is branched on, never put into an exp: -inf - -inf would be NaN. first = true
// writes (acc / l, m + log l): a single block over contiguous positions is attention_forward.
#include "ops/attention_block.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <string_view>
#include <vector>

#include "backend/cpu/kernels/attention_tile.h"
#include "backend/cpu/kernels/ops.h"
#include "core/error.h"

namespace fp::ops::cpu {

namespace {

using namespace attention_tile;  // TQ, TK, tile_gemm, rows_load, ... (backend/cpu/kernels/attention_tile.h)

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int64_t tiles(int64_t n, int64_t t) { return (n + t - 1) / t; }

void block_shapes_check(const AttentionSpec& a) {
  FP_ASSERT(a.B >= 0 && a.Tq >= 0 && a.Tk >= 0 && a.nh > 0 && a.nkv > 0 && a.hd > 0 && a.hdv > 0 && a.nh % a.nkv == 0 &&
                a.window >= 0,
            "attention block shapes B={} Tq={} Tk={} nh={} nkv={} hd={} hdv={} window={} (nh must be a multiple of "
            "nkv, window >= 0)",
            a.B, a.Tq, a.Tk, a.nh, a.nkv, a.hd, a.hdv, a.window);
  FP_ASSERT(a.q_pos != nullptr && a.k_pos != nullptr, "attention block kernels: q_pos and k_pos are required");
}

// Ascending positions; document starts ascending along each sequence and never past their query (Note
// [Documents in attention] in ops/attention.h).
void positions_check(const AttentionSpec& a) {
  for (int64_t i = 1; i < a.Tq; ++i) FP_ASSERT(a.q_pos[i - 1] <= a.q_pos[i], "q_pos not ascending at {}", i);
  for (int64_t j = 1; j < a.Tk; ++j) FP_ASSERT(a.k_pos[j - 1] <= a.k_pos[j], "k_pos not ascending at {}", j);
  if (a.doc_start == nullptr) return;
  for (int64_t b = 0; b < a.B; ++b) {
    const int32_t* d = a.doc_start + b * a.Tq;  // (Tq)
    for (int64_t i = 0; i < a.Tq; ++i)
      FP_ASSERT(d[i] <= a.q_pos[i] && (i == 0 || d[i - 1] <= d[i]),
                "doc_start of sequence {} at {}: {} (query position {}; starts must ascend and not pass the query)", b,
                i, d[i], a.q_pos[i]);
  }
}

// Positions are int32, so q_pos - k_pos < 2^32: a window of 2^32 or more masks nothing and is run as
// none (which also keeps q_pos - w and k_pos + w far from overflowing).
constexpr int64_t kWindowMasksNothing = int64_t{1} << 32;

// The visible runs of the nq queries from i0 (Note [Masks from sorted positions]): query i0 + r sees the
// keys [lo[r], hi[r]) of the block, hi = #{j : k_pos[j] <= q_pos[i]}, lo = #{j : k_pos[j] < first_i}, the
// first visible position first_i = max(q_pos[i] - w + 1 with a window w > 0, doc[i] with documents), else
// lo = 0; both 0 (an empty run) in the padded rows. doc: the sequence's (Tq) document starts or null.
// Both ends ascend over the nq rows: each search starts at the last.
void tile_visible_runs(int64_t* __restrict lo, int64_t* __restrict hi, const int32_t* q_pos, const int32_t* k_pos,
                       const int32_t* doc, int64_t i0, int64_t nq, int64_t Tk, int64_t w) {
  int64_t a = 0, j = 0;
  for (int64_t r = 0; r < TQ; ++r) {
    if (r < nq) {
      const int64_t qp = q_pos[i0 + r];
      j = std::upper_bound(k_pos + j, k_pos + Tk, qp) - k_pos;
      if (w > 0 || doc != nullptr) {
        const int64_t first = std::max<int64_t>(w > 0 ? qp - w + 1 : int64_t{INT32_MIN}, doc != nullptr ? doc[i0 + r] : 0);
        a = std::lower_bound(k_pos + a, k_pos + Tk, first) - k_pos;
      }
    }
    lo[r] = r < nq ? a : 0;
    hi[r] = r < nq ? j : 0;
  }
}

// Sequence b's (Tq) document starts, or null.
inline const int32_t* sequence_doc(const AttentionSpec& a, int64_t b) {
  return a.doc_start != nullptr ? a.doc_start + b * a.Tq : nullptr;
}

// Whether some row of the query tile (nq rows, runs lo/hi) sees a key of the key tile [j0, j0 + nk).
inline bool tile_pair_visible(const int64_t* lo, const int64_t* hi, int64_t nq, int64_t j0, int64_t nk) {
  for (int64_t r = 0; r < nq; ++r)
    if (std::max(lo[r], j0) < std::min(hi[r], j0 + nk)) return true;
  return false;
}

// Backward tile core, shared by both passes so they form the same P and dS: s (TQ, TK) := P =
// exp(scale q.k - lse) and dp (TQ, TK) := dS = P (dO.v - D) of the query tile qs (TQ, hdp) with output
// gradients dos (TQ, hdvp) against the key tile kt (hdp, TK) and value tile vt (hdvp, TK) (both
// transposed) of nk keys from j0, both zero where masked or padded. lo, hi, lse, D (TQ): the rows'
// visible runs (Note [Masks from sorted positions]; empty in padded rows), log-sum-exps and
// rowsum(dO * O).
void tile_probs_and_score_grads(float* __restrict s, float* __restrict dp, const float* __restrict qs,
                                const float* __restrict dos, const float* __restrict kt, const float* __restrict vt,
                                int64_t hdp, int64_t hdvp, const int64_t* __restrict lo, const int64_t* __restrict hi,
                                const float* __restrict lse, const float* __restrict D, int64_t nk, int64_t j0,
                                float scale) {
  std::fill(s, s + TQ * TK, 0.0f);
  std::fill(dp, dp + TQ * TK, 0.0f);
  tile_gemm(qs, hdp, kt, TK, s, TK, TQ, TK, hdp);
  tile_gemm(dos, hdvp, vt, TK, dp, TK, TQ, TK, hdvp);
  for (int64_t r = 0; r < TQ; ++r) {
    float* sr = s + r * TK;    // (TK)
    float* dpr = dp + r * TK;  // (TK)
    const int64_t jbeg = std::clamp<int64_t>(lo[r] - j0, 0, nk), jend = std::clamp<int64_t>(hi[r] - j0, 0, nk);
    row_probs_and_score_grads(sr, dpr, jbeg, jend, scale, lse[r], D[r]);
  }
}

// One thread's scratch in a backward pass: the tiles both passes use, then `rest` floats of the pass's
// own (pass 1: the dK and dV accumulators and a transposed tile; pass 2: the keys and the dQ
// accumulator). Allocated once per parallel region; no size grows with Tq or Tk.
class BackwardScratch {
 public:
  struct Tiles {
    float* qs;     // (TQ, hdp) queries
    float* dos;    // (TQ, hdvp) output gradients
    float* kt;     // (hdp, TK) keys, transposed
    float* vt;     // (hdvp, TK) values, transposed
    float* s;      // (TQ, TK) scores, then P
    float* dp;     // (TQ, TK) dP, then dS
    float* lse_t;  // (TQ) the query rows' log-sum-exps
    float* D;      // (TQ) rowsum(dO * O)
    float* rest;   // (rest) the pass's own
  };
  BackwardScratch(int64_t hdp, int64_t hdvp, int64_t rest)
      : hdp_(hdp), hdvp_(hdvp), buf_(TQ * (hdp + hdvp) + TK * (hdp + hdvp) + 2 * TQ * TK + 2 * TQ + rest) {}
  Tiles tiles() {
    Tiles t;
    t.qs = buf_.data();
    t.dos = t.qs + TQ * hdp_;
    t.kt = t.dos + TQ * hdvp_;
    t.vt = t.kt + hdp_ * TK;
    t.s = t.vt + hdvp_ * TK;
    t.dp = t.s + TQ * TK;
    t.lse_t = t.dp + TQ * TK;
    t.D = t.lse_t + TQ;
    t.rest = t.D + TQ;
    return t;
  }

 private:
  int64_t hdp_, hdvp_;
  std::vector<float> buf_;
};

// The forward in storage type E (float or bf16) for q, k, v and O for o (E, or f32: ring attention's
// accumulator); lse is f32.
template <class E, class O>
void block_forward(const E* q, const E* k, const E* v, O* o, float* lse, bool first, const AttentionSpec& a) {
  block_shapes_check(a);
  const int64_t B = a.B, Tq = a.Tq, Tk = a.Tk, nh = a.nh, nkv = a.nkv, hd = a.hd, hdv = a.hdv;
  const float scale = a.scale;
  const int32_t *q_pos = a.q_pos, *k_pos = a.k_pos;
  if (B == 0 || Tq == 0) return;
  positions_check(a);
  const int64_t w = a.window >= kWindowMasksNothing ? 0 : a.window;
  const int64_t group = nh / nkv, hdp = hd_padded(hd), hdvp = hd_padded(hdv), nqt = tiles(Tq, TQ);
  const int64_t items = B * nh * nqt;
  // Note [Attention sinks]: a first call starts each row at (m, l) = (sink, 1).
  std::vector<float> sink(first && !a.sinks.null() ? static_cast<size_t>(nh) : 0);
  if (!sink.empty())
    visit_float(a.sinks.dtype, "attention sinks", [&]<class S>() {
      for (int64_t h = 0; h < nh; ++h) sink[h] = to_f32(a.sinks.as<S>()[h]);
    });
#pragma omp parallel if (items > 1)
  {
    std::vector<float> scratch(TQ * hdp + TQ * hdvp + hdp * TK + TK * hdvp + TQ * TK + 2 * TQ);
    float* qs = scratch.data();   // (TQ, hdp) query tile
    float* acc = qs + TQ * hdp;   // (TQ, hdvp) unnormalised output
    float* kt = acc + TQ * hdvp;  // (hdp, TK) key tile, transposed
    float* vs = kt + hdp * TK;    // (TK, hdvp) value tile
    float* s = vs + TK * hdvp;    // (TQ, TK) scores, then probabilities
    float* m = s + TQ * TK;       // (TQ) running max of the scaled scores
    float* l = m + TQ;            // (TQ) running sum of exp(score - m)
    int64_t lo[TQ], hi[TQ];       // (TQ) each query's visible run of the block's keys
    // Later query tiles see at least as many keys (without a window): hand them out first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t qt = nqt - 1 - it % nqt, bh = it / nqt, b = bh / nh, h = bh % nh, g = h / group;
      const int64_t i0 = qt * TQ, nq = std::min(TQ, Tq - i0);
      const int64_t qrow = (b * Tq + i0) * nh + h;  // the tile's first row of the (B, Tq, nh) rows
      // Key tiles that may hold a key some query of the tile sees (Note [Masks from sorted positions]).
      tile_visible_runs(lo, hi, q_pos, k_pos, sequence_doc(a, b), i0, nq, Tk, w);
      const int64_t kt_lo = lo[0] / TK, kt_hi = tiles(hi[nq - 1], TK);
      if (!first && kt_lo >= kt_hi) continue;  // the whole tile is masked: the state stays as it is
      rows_load(qs, q + qrow * hd, nh * hd, nq, TQ, hd, hdp);
      std::fill(acc, acc + TQ * hdvp, 0.0f);
      std::fill(m, m + TQ, sink.empty() ? kNegInf : sink[h]);
      std::fill(l, l + TQ, sink.empty() ? 0.0f : 1.0f);
      int64_t visited = 0;
      for (int64_t kt_i = kt_lo; kt_i < kt_hi; ++kt_i) {
        const int64_t j0 = kt_i * TK, nk = std::min(TK, Tk - j0);
        if (!tile_pair_visible(lo, hi, nq, j0, nk)) continue;
        ++visited;
        const int64_t krow = (b * Tk + j0) * nkv + g;  // the tile's first row of the (B, Tk, nkv) rows
        rows_load_transposed(kt, k + krow * hd, nkv * hd, nk, hd, hdp);
        rows_load(vs, v + krow * hdv, nkv * hdv, nk, TK, hdv, hdvp);
        std::fill(s, s + TQ * TK, 0.0f);
        tile_gemm(qs, hdp, kt, TK, s, TK, TQ, TK, hdp);
        for (int64_t r = 0; r < TQ; ++r) {
          const int64_t jbeg = std::clamp<int64_t>(lo[r] - j0, 0, nk), jend = std::clamp<int64_t>(hi[r] - j0, 0, nk);
          row_online_softmax(s + r * TK, jbeg, jend, scale, m[r], l[r], acc + r * hdvp, hdvp);
        }
        tile_gemm(s, TK, vs, hdvp, acc, hdvp, TQ, hdvp, TK);
      }
      tile_pairs_computed.fetch_add(visited, std::memory_order_relaxed);
      // Note [Merging partial attention].
      for (int64_t r = 0; r < nq; ++r) {
        O* orow = o + (qrow + r * nh) * hdv;         // (hdv)
        float& L = lse[(b * nh + h) * Tq + i0 + r];  // the row's running log-sum-exp
        const float* arow = acc + r * hdvp;          // (hdvp)
        if (l[r] == 0.0f) {  // no visible key in this block (l >= 1 as soon as one is, or a sink joined)
          if (first) {
            std::fill(orow, orow + hdv, from_f32<O>(0.0f));
            L = kNegInf;
          }
          continue;
        }
        if (first || L == kNegInf) {
          for (int64_t c = 0; c < hdv; ++c) orow[c] = from_f32<O>(arow[c] / l[r]);
          L = m[r] + std::log(l[r]);
          continue;
        }
        const float lse_b = m[r] + std::log(l[r]);
        const float merged = std::max(L, lse_b) + std::log1p(std::exp(-std::abs(L - lse_b)));
        const float w_old = std::exp(L - merged), w_acc = std::exp(m[r] - merged);
        for (int64_t c = 0; c < hdv; ++c) orow[c] = from_f32<O>(to_f32(orow[c]) * w_old + arow[c] * w_acc);
        L = merged;
      }
    }
  }
}

// What block_backward's passes read and write (its arguments), and the shapes derived from them.
template <class E, class A>
struct BackwardProblem {
  const E *q, *k, *v, *o;
  const float* lse;
  const E* dout;
  const int32_t *q_pos, *k_pos;
  A *dq, *dk, *dv;
  const AttentionSpec& spec;
  int64_t B, Tq, Tk, nh, nkv, hd, hdv;
  float scale;
  int64_t w;  // the window, 0: none
  int64_t group, hdp, hdvp, nqt, nkt;
  // The one sweep's dQ accumulator floats per thread: every query tile of a group (Note [One backward
  // sweep where the dQ sums fit]).
  int64_t one_sweep_dq_floats() const { return group * nqt * TQ * hdp; }
};

// dQ of the nq rows of the query tile at i0, head h, sequence b, plus scale times the tile's unscaled
// accumulator acc (TQ, hdp): pass 2's last step, and the one sweep's.
template <class E, class A>
void dq_tile_add(const BackwardProblem<E, A>& p, const float* acc, int64_t b, int64_t h, int64_t i0, int64_t nq) {
  for (int64_t r = 0; r < nq; ++r) {
    A* dqr = p.dq + ((b * p.Tq + i0 + r) * p.nh + h) * p.hd;  // (hd)
    for (int64_t c = 0; c < p.hd; ++c) dqr[c] = from_f32<A>(to_f32(dqr[c]) + p.scale * acc[r * p.hdp + c]);
  }
}

// Note [One backward sweep where the dQ sums fit]: the one sweep's dQ accumulators per thread, at most
// (kernel scratch, outside the device ledger like every tile of these kernels).
constexpr int64_t kOneSweepScratch = int64_t{4} << 20;  // bytes

// Whether block_backward runs its one sweep: B x nkv items of one_sweep_dq_floats() accumulator floats
// each (Note [One backward sweep where the dQ sums fit]).
template <class E, class A>
bool one_sweep_chosen(const BackwardProblem<E, A>& p) {
  switch (attention_tile::backward_sweep) {
    case BackwardSweep::one:
      return true;
    case BackwardSweep::two_pass:
      return false;
    case BackwardSweep::automatic:
      break;
  }
  const int64_t threads = omp_get_max_threads(), items = p.B * p.nkv;
  const bool fills = items >= threads && (items % threads == 0 || items >= 4 * threads);
  return fills && p.one_sweep_dq_floats() * static_cast<int64_t>(sizeof(float)) <= kOneSweepScratch;
}

// Key tile kt_i of (sequence b, kv head g), pass 1's item: P and dS of every visible pair, head by head
// of the group and query tile by query tile in order, dV += P^T dO and dK += dS^T Q added into dv, dk.
// With dq_acc (the one sweep, Note [One backward sweep where the dQ sums fit]) also dS K into the query
// tile's accumulator (group, nqt, TQ, hdp), marking it in dq_seen; ks (TK, hdp): scratch for the keys.
// Returns the tile pairs computed.
template <class E, class A>
int64_t key_tile_backward(const BackwardProblem<E, A>& p, const BackwardScratch::Tiles& t, float* dk_acc, float* dv_acc,
                          float* ks, float* dq_acc, char* dq_seen, int64_t b, int64_t g, int64_t kt_i) {
  const int64_t Tq = p.Tq, hd = p.hd, hdv = p.hdv, hdp = p.hdp, hdvp = p.hdvp, nkv = p.nkv, w = p.w;
  const int64_t j0 = kt_i * TK, nk = std::min(TK, p.Tk - j0);
  // The queries that may see a key of the tile: from the first that sees key j0 to the last that sees
  // key j0 + nk - 1 (Note [Masks from sorted positions]); none: the key tile gets nothing.
  const int64_t i_first = std::lower_bound(p.q_pos, p.q_pos + Tq, p.k_pos[j0]) - p.q_pos;
  const int32_t* doc = sequence_doc(p.spec, b);
  int64_t i_end = w > 0 ? std::lower_bound(p.q_pos, p.q_pos + Tq, int64_t{p.k_pos[j0 + nk - 1]} + w) - p.q_pos : Tq;
  // With documents, only the queries whose document starts at or before the tile's last key.
  if (doc != nullptr) i_end = std::min<int64_t>(i_end, std::upper_bound(doc, doc + Tq, p.k_pos[j0 + nk - 1]) - doc);
  if (i_first >= i_end) return 0;
  const int64_t qt_lo = i_first / TQ, qt_hi = tiles(i_end, TQ);
  const int64_t krow = (b * p.Tk + j0) * nkv + g;  // the tile's first row of the (B, Tk, nkv) rows
  rows_load_transposed(t.kt, p.k + krow * hd, nkv * hd, nk, hd, hdp);
  rows_load_transposed(t.vt, p.v + krow * hdv, nkv * hdv, nk, hdv, hdvp);
  if (dq_acc != nullptr) rows_load(ks, p.k + krow * hd, nkv * hd, nk, TK, hd, hdp);
  std::fill(dk_acc, dk_acc + TK * hdp, 0.0f);
  std::fill(dv_acc, dv_acc + TK * hdvp, 0.0f);
  int64_t lo[TQ], hi[TQ];  // (TQ) each query's visible run of the block's keys
  int64_t visited = 0;
  for (int64_t h = g * p.group; h < (g + 1) * p.group; ++h) {
    for (int64_t qt = qt_lo; qt < qt_hi; ++qt) {
      const int64_t i0 = qt * TQ, nq = std::min(TQ, Tq - i0);
      tile_visible_runs(lo, hi, p.q_pos, p.k_pos, doc, i0, nq, p.Tk, w);
      if (!tile_pair_visible(lo, hi, nq, j0, nk)) continue;
      ++visited;
      query_tile_load(p.q, p.o, p.lse, p.dout, t.qs, t.dos, t.lse_t, t.D, b, h, i0, nq, Tq, p.nh, hd, hdp, hdv, hdvp);
      tile_probs_and_score_grads(t.s, t.dp, t.qs, t.dos, t.kt, t.vt, hdp, hdvp, lo, hi, t.lse_t, t.D, nk, j0, p.scale);
      tile_gemm_at(t.s, TK, t.dos, hdvp, dv_acc, hdvp, TK, hdvp, TQ);  // dV += P^T dO
      tile_gemm_at(t.dp, TK, t.qs, hdp, dk_acc, hdp, TK, hdp, TQ);     // dK += dS^T Q
      if (dq_acc == nullptr) continue;
      const int64_t slot = (h - g * p.group) * p.nqt + qt;
      tile_gemm(t.dp, TK, ks, hdp, dq_acc + slot * TQ * hdp, hdp, TQ, hdp, TK);  // dQ += dS K
      dq_seen[slot] = 1;
    }
  }
  if (visited == 0) return 0;  // every query fell between the keys: nothing to add
  for (int64_t j = 0; j < nk; ++j) {
    A* dkr = p.dk + (krow + j * nkv) * hd;   // (hd)
    A* dvr = p.dv + (krow + j * nkv) * hdv;  // (hdv)
    for (int64_t c = 0; c < hd; ++c) dkr[c] = from_f32<A>(to_f32(dkr[c]) + p.scale * dk_acc[j * hdp + c]);
    for (int64_t c = 0; c < hdv; ++c) dvr[c] = from_f32<A>(to_f32(dvr[c]) + dv_acc[j * hdvp + c]);
  }
  return visited;
}

// The backward as one sweep per (b, kv head) (Note [One backward sweep where the dQ sums fit]).
template <class E, class A>
void block_backward_one_sweep(const BackwardProblem<E, A>& p) {
  const int64_t hdp = p.hdp, hdvp = p.hdvp, nqt = p.nqt, group = p.group;
  const int64_t items = p.B * p.nkv, dq_floats = p.one_sweep_dq_floats();
#pragma omp parallel if (items > 1)
  {
    BackwardScratch sc(hdp, hdvp, TK * (hdp + hdvp) + TK * hdp + dq_floats);
    const BackwardScratch::Tiles t = sc.tiles();
    float* dk_acc = t.rest;             // (TK, hdp) unscaled dK of the key tile
    float* dv_acc = dk_acc + TK * hdp;  // (TK, hdvp) dV of the key tile
    float* ks = dv_acc + TK * hdvp;     // (TK, hdp) keys
    float* dq_acc = ks + TK * hdp;      // (group, nqt, TQ, hdp) unscaled dQ of every query tile of the group
    std::vector<char> dq_seen(static_cast<size_t>(group * nqt));  // whether a tile pair added to it
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t b = it / p.nkv, g = it % p.nkv;
      std::fill(dq_acc, dq_acc + dq_floats, 0.0f);
      std::fill(dq_seen.begin(), dq_seen.end(), char{0});
      int64_t visited = 0;
      for (int64_t kt_i = 0; kt_i < p.nkt; ++kt_i)
        visited += key_tile_backward(p, t, dk_acc, dv_acc, ks, dq_acc, dq_seen.data(), b, g, kt_i);
      tile_pairs_computed.fetch_add(visited, std::memory_order_relaxed);
      for (int64_t h = g * group; h < (g + 1) * group; ++h)
        for (int64_t qt = 0; qt < nqt; ++qt) {
          const int64_t slot = (h - g * group) * nqt + qt;
          if (!dq_seen[static_cast<size_t>(slot)]) continue;  // as pass 2: no visible pair, nothing added
          const int64_t i0 = qt * TQ, nq = std::min(TQ, p.Tq - i0);
          dq_tile_add(p, dq_acc + slot * TQ * hdp, b, h, i0, nq);
        }
    }
  }
}

// The backward in storage type E for q, k, v, o, dout and A for dq, dk, dv (E, or f32: ring
// attention's accumulators); lse is f32.
template <class E, class A>
void block_backward(const E* q, const E* k, const E* v, const E* o, const float* lse, const E* dout, A* dq, A* dk,
                    A* dv, const AttentionSpec& a) {
  block_shapes_check(a);
  const int64_t B = a.B, Tq = a.Tq, Tk = a.Tk, nh = a.nh, nkv = a.nkv, hd = a.hd, hdv = a.hdv;
  const float scale = a.scale;
  const int32_t *q_pos = a.q_pos, *k_pos = a.k_pos;
  if (B == 0 || Tq == 0 || Tk == 0) return;
  positions_check(a);
  const int64_t w = a.window >= kWindowMasksNothing ? 0 : a.window;
  const int64_t group = nh / nkv, hdp = hd_padded(hd), hdvp = hd_padded(hdv), nqt = tiles(Tq, TQ), nkt = tiles(Tk, TK);
  const BackwardProblem<E, A> p{q,  k,  v,  o,   lse, dout, q_pos, k_pos, dq,    dk,  dv,   a,   B,
                                Tq, Tk, nh, nkv, hd,  hdv,  scale, w,     group, hdp, hdvp, nqt, nkt};
  if (one_sweep_chosen(p)) return block_backward_one_sweep(p);
  // Pass 1: dK, dV of each key tile, one item per (b, kv head, key tile) summing over the heads of the
  // group, then the query tiles in order (Note [Deterministic attention backward]).
  const int64_t items1 = B * nkv * nkt;
#pragma omp parallel if (items1 > 1)
  {
    BackwardScratch sc(hdp, hdvp, TK * (hdp + hdvp));
    const BackwardScratch::Tiles t = sc.tiles();
    float* dk_acc = t.rest;             // (TK, hdp) unscaled dK of the key tile
    float* dv_acc = dk_acc + TK * hdp;  // (TK, hdvp) dV of the key tile
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items1; ++it) {
      const int64_t kt_i = it % nkt, bg = it / nkt;
      const int64_t visited =
          key_tile_backward(p, t, dk_acc, dv_acc, nullptr, nullptr, nullptr, bg / nkv, bg % nkv, kt_i);
      tile_pairs_computed.fetch_add(visited, std::memory_order_relaxed);
    }
  }
  // Pass 2: dQ of each query tile, one item per (b, head, query tile), key tiles in order. Later query
  // tiles see at least as many keys: hand them out first.
  const int64_t items2 = B * nh * nqt;
#pragma omp parallel if (items2 > 1)
  {
    BackwardScratch sc(hdp, hdvp, TK * hdp + TQ * hdp);
    auto [qs, dos, kt, vt, s, dp, lse_t, D, rest] = sc.tiles();
    float* ks = rest;               // (TK, hdp) keys
    float* dq_acc = ks + TK * hdp;  // (TQ, hdp) unscaled dQ of the query tile
    int64_t lo[TQ], hi[TQ];         // (TQ) each query's visible run of the block's keys
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items2; ++it) {
      const int64_t qt = nqt - 1 - it % nqt, bh = it / nqt, b = bh / nh, h = bh % nh, g = h / group;
      const int64_t i0 = qt * TQ, nq = std::min(TQ, Tq - i0);
      // Key tiles that may hold a key some query of the tile sees, as in the forward.
      tile_visible_runs(lo, hi, q_pos, k_pos, sequence_doc(a, b), i0, nq, Tk, w);
      const int64_t kt_lo = lo[0] / TK, kt_hi = tiles(hi[nq - 1], TK);
      if (kt_lo >= kt_hi) continue;
      query_tile_load(q, o, lse, dout, qs, dos, lse_t, D, b, h, i0, nq, Tq, nh, hd, hdp, hdv, hdvp);
      std::fill(dq_acc, dq_acc + TQ * hdp, 0.0f);
      int64_t visited = 0;
      for (int64_t kt_i = kt_lo; kt_i < kt_hi; ++kt_i) {
        const int64_t j0 = kt_i * TK, nk = std::min(TK, Tk - j0);
        if (!tile_pair_visible(lo, hi, nq, j0, nk)) continue;
        ++visited;
        const int64_t krow = (b * Tk + j0) * nkv + g;  // the tile's first row of the (B, Tk, nkv) rows
        rows_load_transposed(kt, k + krow * hd, nkv * hd, nk, hd, hdp);
        rows_load_transposed(vt, v + krow * hdv, nkv * hdv, nk, hdv, hdvp);
        rows_load(ks, k + krow * hd, nkv * hd, nk, TK, hd, hdp);
        tile_probs_and_score_grads(s, dp, qs, dos, kt, vt, hdp, hdvp, lo, hi, lse_t, D, nk, j0, scale);
        tile_gemm(dp, TK, ks, hdp, dq_acc, hdp, TQ, hdp, TK);
      }
      tile_pairs_computed.fetch_add(visited, std::memory_order_relaxed);
      if (visited == 0) continue;  // every query fell between the keys: nothing to add
      dq_tile_add(p, dq_acc, b, h, i0, nq);
    }
  }
}

// Every token operand of one call in one storage dtype (the recipe's activations).
void same_dtype_check(const char* kernel, std::initializer_list<DType> dtypes) {
  for (const DType t : dtypes)
    FP_ASSERT(t == *dtypes.begin(), "{}: token operands in {} and {} (one dtype per call)", kernel,
              dtype_name(*dtypes.begin()), dtype_name(t));
}

}  // namespace

void attention_block_forward(CBuf q, CBuf k, CBuf v, Buf o, float* lse, bool first, AttentionSpec a) {
  same_dtype_check("attention_block_forward", {q.dtype, k.dtype, v.dtype});
  FP_ASSERT(o.dtype == q.dtype || o.dtype == DType::DType_F32,
            "attention_block_forward: o in {} takes token operands in {} or f32, not {}", dtype_name(o.dtype),
            dtype_name(o.dtype), dtype_name(q.dtype));
  visit_float(q.dtype, "attention_block_forward", [&]<class E>() {
    if (o.dtype == q.dtype) {
      block_forward<E, E>(q.as<E>(), k.as<E>(), v.as<E>(), o.as<E>(), lse, first, a);
    } else {
      block_forward<E, float>(q.as<E>(), k.as<E>(), v.as<E>(), o.f32(), lse, first, a);
    }
  });
}

void attention_block_backward(CBuf q, CBuf k, CBuf v, CBuf o, const float* lse, CBuf dout, Buf dq, Buf dk, Buf dv,
                              AttentionSpec a) {
  same_dtype_check("attention_block_backward", {q.dtype, k.dtype, v.dtype, o.dtype, dout.dtype});
  same_dtype_check("attention_block_backward (dq, dk, dv)", {dq.dtype, dk.dtype, dv.dtype});
  FP_ASSERT(dk.dtype == q.dtype || dk.dtype == DType::DType_F32,
            "attention_block_backward: dq, dk, dv in {} take token operands in {} or f32, not {}", dtype_name(dk.dtype),
            dtype_name(dk.dtype), dtype_name(q.dtype));
  visit_float(q.dtype, "attention_block_backward", [&]<class E>() {
    if (dk.dtype == q.dtype) {
      block_backward<E, E>(q.as<E>(), k.as<E>(), v.as<E>(), o.as<E>(), lse, dout.as<E>(), dq.as<E>(), dk.as<E>(),
                           dv.as<E>(), a);
    } else {
      block_backward<E, float>(q.as<E>(), k.as<E>(), v.as<E>(), o.as<E>(), lse, dout.as<E>(), dq.f32(), dk.f32(),
                               dv.f32(), a);
    }
  });
}

int64_t attention_block_tile_pairs(const AttentionSpec& a) {
  block_shapes_check(a);
  positions_check(a);
  const int64_t w = a.window >= kWindowMasksNothing ? 0 : a.window, nqt = tiles(a.Tq, TQ);
  int64_t pairs = 0;
  int64_t lo[TQ], hi[TQ];
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t qt = 0; qt < nqt; ++qt) {
      const int64_t i0 = qt * TQ, nq = std::min(TQ, a.Tq - i0);
      tile_visible_runs(lo, hi, a.q_pos, a.k_pos, sequence_doc(a, b), i0, nq, a.Tk, w);
      for (int64_t kt_i = lo[0] / TK, kt_hi = tiles(hi[nq - 1], TK); kt_i < kt_hi; ++kt_i) {
        const int64_t j0 = kt_i * TK;
        pairs += tile_pair_visible(lo, hi, nq, j0, std::min(TK, a.Tk - j0));
      }
    }
  return pairs;
}

SimdLevel attention_tile::tile_simd_detect() {
#if FP_ATTENTION_TILE_AVX2
  return simd_level();
#else
  return SimdLevel::sse2;
#endif
}

attention_tile::BackwardSweep attention_tile::backward_sweep_detect() {
  const char* force = std::getenv("FLATPEAK_ATTENTION_BACKWARD");
  const std::string_view f = force != nullptr ? force : "";
  if (f == "two_pass") return BackwardSweep::two_pass;
  if (f == "one") return BackwardSweep::one;
  if (!f.empty())  // at static initialisation: say it, do not throw
    std::fprintf(stderr, "[flatpeak] FLATPEAK_ATTENTION_BACKWARD=%s is not one of two_pass, one: choosing by shape\n",
                 force);
  return BackwardSweep::automatic;
}

const char* attention_kernels() { return simd_level_name(attention_tile::tile_simd); }

const char* attention_backward_sweep() {
  switch (attention_tile::backward_sweep) {
    case BackwardSweep::two_pass:
      return "two passes (FLATPEAK_ATTENTION_BACKWARD)";
    case BackwardSweep::one:
      return "one sweep (FLATPEAK_ATTENTION_BACKWARD)";
    case BackwardSweep::automatic:
      break;
  }
  return "one sweep where the dQ sums fit, else two passes";
}

}  // namespace fp::ops::cpu
