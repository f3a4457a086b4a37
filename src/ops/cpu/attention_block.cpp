// Block attention by global positions (ops/attention_block.h), forward with a log-sum-exp merge and
// backward, tile by tile: the kernels of ring attention.
// Dimensions: B sequences, Tq queries and Tk keys each, nh query heads, nkv kv heads, group = nh / nkv
// query heads per kv head, hd / hdv the query-key / value-output head widths (Note [Value heads of their
// own width], ops/attention.h), hdp / hdvp = hd / hdv rounded up to kNr, TQ x TK the (query, key) tile,
// nqt / nkt the number of query / key tiles. As in ops/cpu/attention.cpp, no buffer grows with Tq or Tk: each
// thread owns a fixed scratch of a few tiles.
//
// The tiling, the register-blocked tile products and the two-pass deterministic backward are those of
// ops/cpu/attention.cpp (Note [Deterministic attention backward] there; Note [Tile products as
// register-blocked loops] in ops/cpu/attention_tile.h); what differs is the mask and the merge.
//
// Note [Masks from sorted positions]: with q_pos and k_pos ascending, the keys query i sees are a run
// of the block, [lo_i, hi_i) with hi_i = #{j : k_pos[j] <= q_pos[i]} and, with a window w > 0,
// lo_i = #{j : k_pos[j] <= q_pos[i] - w} (0 without one), and both ends ascend with i. Without a window
// the mask is a staircase like the causal diagonal (contiguous positions give hi_i = i + 1, exactly
// attention.cpp's mask); a window adds a second staircase below it, a band (Note [Sliding-window bands]
// in ops/cpu/attention_tile.h). Row r of the tile pair (i0, j0) sees the keys [lo - j0, hi - j0) of the
// tile, clamped to [0, nk). The runs of the tile's rows need not join up (a query tile straddling two
// zig-zag chunks sees two separate stretches of keys), so a tile pair is computed iff some row's run
// meets the key tile; because both ends ascend, the key tiles worth testing lie between the one holding
// lo of the first row and the one holding hi - 1 of the last. The forward and pass 2 test those; pass 1
// tests the query tiles from the one holding the first query that sees key j0 (q_pos >= k_pos[j0]) to
// the one holding the last that sees key j0 + nk - 1 (q_pos < k_pos[j0 + nk - 1] + w). Without a window
// every tested pair passes, and the tiles visited (and so the bits) are the causal kernel's. Each work
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
// writes (acc / l, m + log l) exactly as attention_forward does, so a single block over contiguous
// positions reproduces it bit for bit.
#include "ops/attention_block.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "ops/cpu/attention_tile.h"

namespace fp::ops::cpu {

namespace {

using namespace attention_tile;  // TQ, TK, tile_gemm, rows_load, ... (ops/cpu/attention_tile.h)

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int64_t tiles(int64_t n, int64_t t) { return (n + t - 1) / t; }

void block_shapes_check(int64_t B, int64_t Tq, int64_t Tk, int64_t nh, int64_t nkv, int64_t hd, int64_t hdv,
                        int64_t window) {
  FP_ASSERT(B >= 0 && Tq >= 0 && Tk >= 0 && nh > 0 && nkv > 0 && hd > 0 && hdv > 0 && nh % nkv == 0 && window >= 0,
            "attention block shapes B={} Tq={} Tk={} nh={} nkv={} hd={} hdv={} window={} (nh must be a multiple of "
            "nkv, window >= 0)",
            B, Tq, Tk, nh, nkv, hd, hdv, window);
}

void positions_check(const int32_t* q_pos, const int32_t* k_pos, int64_t Tq, int64_t Tk) {
  for (int64_t i = 1; i < Tq; ++i) FP_ASSERT(q_pos[i - 1] <= q_pos[i], "q_pos not ascending at {}", i);
  for (int64_t j = 1; j < Tk; ++j) FP_ASSERT(k_pos[j - 1] <= k_pos[j], "k_pos not ascending at {}", j);
}

// Positions are int32, so q_pos - k_pos < 2^32: a window of 2^32 or more masks nothing and is run as
// none (which also keeps q_pos - w and k_pos + w far from overflowing).
constexpr int64_t kWindowMasksNothing = int64_t{1} << 32;

// The visible runs of the nq queries from i0 (Note [Masks from sorted positions]): query i0 + r sees the
// keys [lo[r], hi[r]) of the block, hi = #{j : k_pos[j] <= q_pos[i]}, lo = #{j : k_pos[j] <= q_pos[i] - w}
// with a window w > 0, else 0; both 0 (an empty run) in the padded rows. Both ascend over the nq rows:
// each search starts at the last.
void tile_visible_runs(int64_t* __restrict lo, int64_t* __restrict hi, const int32_t* q_pos, const int32_t* k_pos,
                       int64_t i0, int64_t nq, int64_t Tk, int64_t w) {
  int64_t a = 0, j = 0;
  for (int64_t r = 0; r < TQ; ++r) {
    if (r < nq) {
      j = std::upper_bound(k_pos + j, k_pos + Tk, q_pos[i0 + r]) - k_pos;
      if (w > 0) a = std::upper_bound(k_pos + a, k_pos + Tk, int64_t{q_pos[i0 + r]} - w) - k_pos;
    }
    lo[r] = r < nq ? a : 0;
    hi[r] = r < nq ? j : 0;
  }
}

// Whether some row of the query tile (nq rows, runs lo/hi) sees a key of the key tile [j0, j0 + nk).
inline bool tile_pair_visible(const int64_t* lo, const int64_t* hi, int64_t nq, int64_t j0, int64_t nk) {
  for (int64_t r = 0; r < nq; ++r)
    if (std::max(lo[r], j0) < std::min(hi[r], j0 + nk)) return true;
  return false;
}

// Backward tile core (as in attention.cpp, with the positional mask): on entry s (TQ, TK) holds q.k and
// dp (TQ, TK) holds dO.v of a query tile against nk keys from j0; on exit s holds P = exp(scale q.k -
// lse) and dp holds dS = P (dP - D), both zero where masked or padded. lo, hi, lse, D (TQ): the rows'
// visible runs (Note [Masks from sorted positions]; empty in padded rows), log-sum-exps and
// rowsum(dO * O).
void tile_probs_and_score_grads(float* __restrict s, float* __restrict dp, const int64_t* __restrict lo,
                                const int64_t* __restrict hi, const float* __restrict lse, const float* __restrict D,
                                int64_t nk, int64_t j0, float scale) {
  for (int64_t r = 0; r < TQ; ++r) {
    float* sr = s + r * TK;    // (TK)
    float* dpr = dp + r * TK;  // (TK)
    const int64_t jbeg = std::clamp<int64_t>(lo[r] - j0, 0, nk), jend = std::clamp<int64_t>(hi[r] - j0, 0, nk);
    row_probs_and_score_grads(sr, dpr, jbeg, jend, scale, lse[r], D[r]);
  }
}

}  // namespace

void attention_block_forward(const float* q, const float* k, const float* v, const int32_t* q_pos, const int32_t* k_pos,
                             float* o, float* lse, bool first, int64_t B, int64_t Tq, int64_t Tk, int64_t nh,
                             int64_t nkv, int64_t hd, int64_t hdv, float scale, int64_t window) {
  block_shapes_check(B, Tq, Tk, nh, nkv, hd, hdv, window);
  if (B == 0 || Tq == 0) return;
  positions_check(q_pos, k_pos, Tq, Tk);
  const int64_t w = window >= kWindowMasksNothing ? 0 : window;
  const int64_t group = nh / nkv, hdp = hd_padded(hd), hdvp = hd_padded(hdv), nqt = tiles(Tq, TQ);
  const int64_t items = B * nh * nqt;
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
      tile_visible_runs(lo, hi, q_pos, k_pos, i0, nq, Tk, w);
      const int64_t kt_lo = lo[0] / TK, kt_hi = tiles(hi[nq - 1], TK);
      if (!first && kt_lo >= kt_hi) continue;  // the whole tile is masked: the state stays as it is
      rows_load(qs, q + qrow * hd, nh * hd, nq, TQ, hd, hdp);
      std::fill(acc, acc + TQ * hdvp, 0.0f);
      std::fill(m, m + TQ, kNegInf);
      std::fill(l, l + TQ, 0.0f);
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
        float* orow = o + (qrow + r * nh) * hdv;     // (hdv)
        float& L = lse[(b * nh + h) * Tq + i0 + r];  // the row's running log-sum-exp
        const float* arow = acc + r * hdvp;          // (hdvp)
        if (l[r] == 0.0f) {  // no visible key in this block (l >= 1 as soon as one is)
          if (first) {
            std::fill(orow, orow + hdv, 0.0f);
            L = kNegInf;
          }
          continue;
        }
        if (first || L == kNegInf) {
          for (int64_t c = 0; c < hdv; ++c) orow[c] = arow[c] / l[r];
          L = m[r] + std::log(l[r]);
          continue;
        }
        const float lse_b = m[r] + std::log(l[r]);
        const float merged = std::max(L, lse_b) + std::log1p(std::exp(-std::abs(L - lse_b)));
        const float w_old = std::exp(L - merged), w_acc = std::exp(m[r] - merged);
        for (int64_t c = 0; c < hdv; ++c) orow[c] = orow[c] * w_old + arow[c] * w_acc;
        L = merged;
      }
    }
  }
}

void attention_block_backward(const float* q, const float* k, const float* v, const float* o, const float* lse,
                              const float* dout, const int32_t* q_pos, const int32_t* k_pos, float* dq, float* dk,
                              float* dv, int64_t B, int64_t Tq, int64_t Tk, int64_t nh, int64_t nkv, int64_t hd,
                              int64_t hdv, float scale, int64_t window) {
  block_shapes_check(B, Tq, Tk, nh, nkv, hd, hdv, window);
  if (B == 0 || Tq == 0 || Tk == 0) return;
  positions_check(q_pos, k_pos, Tq, Tk);
  const int64_t w = window >= kWindowMasksNothing ? 0 : window;
  const int64_t group = nh / nkv, hdp = hd_padded(hd), hdvp = hd_padded(hdv), nqt = tiles(Tq, TQ), nkt = tiles(Tk, TK);
  // Per thread, as attention_backward: qs (TQ, hdp), dos (TQ, hdvp); kt (hdp, TK), vt (hdvp, TK); ks
  // (TK, hdp); two accumulators of up to max(TQ, TK) rows, of hdp and of hdvp columns; s, dp (TQ, TK);
  // tr (TK, TQ); lse_t, D (TQ); and lo, hi (TQ) on the stack.
  const int64_t tmax = std::max(TQ, TK);
  const int64_t scratch_size = TQ * (hdp + hdvp) + TK * (2 * hdp + hdvp) + tmax * (hdp + hdvp) + 3 * TQ * TK + 2 * TQ;
  // Pass 1: dK, dV of each key tile, one item per (b, kv head, key tile) summing over the heads of the
  // group, then the query tiles in order (Note [Deterministic attention backward], attention.cpp).
  const int64_t items1 = B * nkv * nkt;
#pragma omp parallel if (items1 > 1)
  {
    std::vector<float> scratch(scratch_size);
    float* qs = scratch.data();         // (TQ, hdp) queries
    float* dos = qs + TQ * hdp;         // (TQ, hdvp) output gradients
    float* kt = dos + TQ * hdvp;        // (hdp, TK) keys, transposed
    float* vt = kt + hdp * TK;          // (hdvp, TK) values, transposed
    float* dk_acc = vt + hdvp * TK;     // (TK, hdp) unscaled dK of the key tile
    float* dv_acc = dk_acc + TK * hdp;  // (TK, hdvp) dV of the key tile
    float* s = dv_acc + TK * hdvp;      // (TQ, TK) scores, then P
    float* dp = s + TQ * TK;            // (TQ, TK) dP, then dS
    float* tr = dp + TQ * TK;           // (TK, TQ) P^T or dS^T
    float* lse_t = tr + TK * TQ;        // (TQ)
    float* D = lse_t + TQ;              // (TQ)
    int64_t lo[TQ], hi[TQ];             // (TQ) each query's visible run of the block's keys
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items1; ++it) {
      const int64_t kt_i = it % nkt, bg = it / nkt, b = bg / nkv, g = bg % nkv;
      const int64_t j0 = kt_i * TK, nk = std::min(TK, Tk - j0);
      // The queries that may see a key of the tile: from the first that sees key j0 to the last that
      // sees key j0 + nk - 1 (Note [Masks from sorted positions]); none: the key tile gets nothing.
      const int64_t i_first = std::lower_bound(q_pos, q_pos + Tq, k_pos[j0]) - q_pos;
      const int64_t i_end =
          w > 0 ? std::lower_bound(q_pos, q_pos + Tq, int64_t{k_pos[j0 + nk - 1]} + w) - q_pos : Tq;
      if (i_first >= i_end) continue;
      const int64_t qt_lo = i_first / TQ, qt_hi = tiles(i_end, TQ);
      const int64_t krow = (b * Tk + j0) * nkv + g;  // the tile's first row of the (B, Tk, nkv) rows
      rows_load_transposed(kt, k + krow * hd, nkv * hd, nk, hd, hdp);
      rows_load_transposed(vt, v + krow * hdv, nkv * hdv, nk, hdv, hdvp);
      std::fill(dk_acc, dk_acc + TK * (hdp + hdvp), 0.0f);  // dk_acc and dv_acc
      int64_t visited = 0;
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (int64_t qt = qt_lo; qt < qt_hi; ++qt) {
          const int64_t i0 = qt * TQ, nq = std::min(TQ, Tq - i0);
          tile_visible_runs(lo, hi, q_pos, k_pos, i0, nq, Tk, w);
          if (!tile_pair_visible(lo, hi, nq, j0, nk)) continue;
          ++visited;
          query_tile_load(q, o, lse, dout, qs, dos, lse_t, D, b, h, i0, nq, Tq, nh, hd, hdp, hdv, hdvp);
          std::fill(s, s + 2 * TQ * TK, 0.0f);  // s and dp
          tile_gemm(qs, hdp, kt, TK, s, TK, TQ, TK, hdp);
          tile_gemm(dos, hdvp, vt, TK, dp, TK, TQ, TK, hdvp);
          tile_probs_and_score_grads(s, dp, lo, hi, lse_t, D, nk, j0, scale);
          tile_transpose(tr, s, TQ, TK);
          tile_gemm(tr, TQ, dos, hdvp, dv_acc, hdvp, TK, hdvp, TQ);
          tile_transpose(tr, dp, TQ, TK);
          tile_gemm(tr, TQ, qs, hdp, dk_acc, hdp, TK, hdp, TQ);
        }
      }
      tile_pairs_computed.fetch_add(visited, std::memory_order_relaxed);
      if (visited == 0) continue;  // every query fell between the keys: nothing to add
      for (int64_t j = 0; j < nk; ++j) {
        float* dkr = dk + (krow + j * nkv) * hd;   // (hd)
        float* dvr = dv + (krow + j * nkv) * hdv;  // (hdv)
        for (int64_t c = 0; c < hd; ++c) dkr[c] += scale * dk_acc[j * hdp + c];
        for (int64_t c = 0; c < hdv; ++c) dvr[c] += dv_acc[j * hdvp + c];
      }
    }
  }
  // Pass 2: dQ of each query tile, one item per (b, head, query tile), key tiles in order. Later query
  // tiles see at least as many keys: hand them out first.
  const int64_t items2 = B * nh * nqt;
#pragma omp parallel if (items2 > 1)
  {
    std::vector<float> scratch(scratch_size);
    float* qs = scratch.data();     // (TQ, hdp) queries
    float* dos = qs + TQ * hdp;     // (TQ, hdvp) output gradients
    float* kt = dos + TQ * hdvp;    // (hdp, TK) keys, transposed
    float* vt = kt + hdp * TK;      // (hdvp, TK) values, transposed
    float* ks = vt + hdvp * TK;     // (TK, hdp) keys
    float* dq_acc = ks + TK * hdp;  // (TQ, hdp) unscaled dQ of the query tile
    float* s = dq_acc + TQ * hdp;   // (TQ, TK) scores, then P
    float* dp = s + TQ * TK;        // (TQ, TK) dP, then dS
    float* lse_t = dp + TQ * TK;    // (TQ)
    float* D = lse_t + TQ;          // (TQ)
    int64_t lo[TQ], hi[TQ];         // (TQ) each query's visible run of the block's keys
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items2; ++it) {
      const int64_t qt = nqt - 1 - it % nqt, bh = it / nqt, b = bh / nh, h = bh % nh, g = h / group;
      const int64_t i0 = qt * TQ, nq = std::min(TQ, Tq - i0);
      // Key tiles that may hold a key some query of the tile sees, as in the forward.
      tile_visible_runs(lo, hi, q_pos, k_pos, i0, nq, Tk, w);
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
        std::fill(s, s + 2 * TQ * TK, 0.0f);  // s and dp
        tile_gemm(qs, hdp, kt, TK, s, TK, TQ, TK, hdp);
        tile_gemm(dos, hdvp, vt, TK, dp, TK, TQ, TK, hdvp);
        tile_probs_and_score_grads(s, dp, lo, hi, lse_t, D, nk, j0, scale);
        tile_gemm(dp, TK, ks, hdp, dq_acc, hdp, TQ, hdp, TK);
      }
      tile_pairs_computed.fetch_add(visited, std::memory_order_relaxed);
      if (visited == 0) continue;  // every query fell between the keys: nothing to add
      for (int64_t r = 0; r < nq; ++r) {
        float* dqr = dq + ((b * Tq + i0 + r) * nh + h) * hd;  // (hd)
        for (int64_t c = 0; c < hd; ++c) dqr[c] += scale * dq_acc[r * hdp + c];
      }
    }
  }
}

}  // namespace fp::ops::cpu
