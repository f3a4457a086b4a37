// Block attention by global positions (ops/attention_block.h), forward with a log-sum-exp merge and
// backward, tile by tile: the kernels of ring attention.
// Dimensions: B sequences, Tq queries and Tk keys each, nh query heads, nkv kv heads, group = nh / nkv
// query heads per kv head, hd head_dim, hdp = hd rounded up to kNr, TQ x TK the (query, key) tile, nqt /
// nkt the number of query / key tiles. As in ops/cpu/attention.cpp, no buffer grows with Tq or Tk: each
// thread owns a fixed scratch of a few tiles.
//
// The tiling, the register-blocked tile products and the two-pass deterministic backward are those of
// ops/cpu/attention.cpp (Note [Deterministic attention backward] there; Note [Tile products as
// register-blocked loops] in ops/cpu/attention_tile.h); what differs is the mask and the merge.
//
// Note [Masks from sorted positions]: with q_pos and k_pos ascending, the keys query i sees are a prefix
// of the block, [0, nvis_i) with nvis_i = #{j : k_pos[j] <= q_pos[i]}, and nvis ascends with i. The mask
// is therefore a staircase like the causal diagonal (contiguous positions give nvis_i = i + 1, exactly
// attention.cpp's keys_visible): row r of the tile pair (i0, j0) sees clamp(nvis_{i0+r} - j0, 0, nk)
// keys, and a tile pair is fully masked iff the LAST query of the query tile sees no key of the key tile
// (nvis_{i0+nq-1} <= j0), the min/max test on positions k_pos[j0] > q_pos[i0+nq-1]. The forward and
// pass 2 visit key tiles below ceil(nvis_last / TK) only; pass 1 starts at the query tile holding the
// first query that sees key j0. Each work item finds its tile's counts by binary search (TQ searches
// of log2 Tk steps against a tile product's TQ * TK * hd multiply-adds). In a zig-zag ring every chunk
// pair is fully visible, fully masked or diagonal, so when C is a multiple of the tile the ring visits
// exactly the tile pairs of the whole causal sequence (528 of 528 at T = 2048, docs/benchmarks.md);
// otherwise the tiles straddling chunk edges add a few.
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

void block_shapes_check(int64_t B, int64_t Tq, int64_t Tk, int64_t nh, int64_t nkv, int64_t hd) {
  FP_ASSERT(B >= 0 && Tq >= 0 && Tk >= 0 && nh > 0 && nkv > 0 && hd > 0 && nh % nkv == 0,
            "attention block shapes B={} Tq={} Tk={} nh={} nkv={} hd={} (nh must be a multiple of nkv)", B, Tq, Tk,
            nh, nkv, hd);
}

void positions_check(const int32_t* q_pos, const int32_t* k_pos, int64_t Tq, int64_t Tk) {
  for (int64_t i = 1; i < Tq; ++i) FP_ASSERT(q_pos[i - 1] <= q_pos[i], "q_pos not ascending at {}", i);
  for (int64_t j = 1; j < Tk; ++j) FP_ASSERT(k_pos[j - 1] <= k_pos[j], "k_pos not ascending at {}", j);
}

// nvis (TQ): how many keys each of the nq queries from i0 sees, #{j : k_pos[j] <= q_pos[i]} (Note [Masks
// from sorted positions]); 0 in the padded rows. The counts ascend: each search starts at the last.
void tile_visible_counts(int64_t* __restrict nvis, const int32_t* q_pos, const int32_t* k_pos, int64_t i0,
                         int64_t nq, int64_t Tk) {
  int64_t j = 0;
  for (int64_t r = 0; r < TQ; ++r) {
    if (r < nq) j = std::upper_bound(k_pos + j, k_pos + Tk, q_pos[i0 + r]) - k_pos;
    nvis[r] = r < nq ? j : 0;
  }
}

// Keys of the key tile starting at j0 (nk keys) seen by a query that sees the first nvis keys.
inline int64_t keys_visible(int64_t nvis, int64_t j0, int64_t nk) { return std::clamp<int64_t>(nvis - j0, 0, nk); }

// Backward tile core (as in attention.cpp, with the positional mask): on entry s (TQ, TK) holds q.k and
// dp (TQ, TK) holds dO.v of a query tile against nk keys from j0; on exit s holds P = exp(scale q.k -
// lse) and dp holds dS = P (dP - D), both zero where masked or padded. nvis, lse, D (TQ): the rows'
// visible key counts (Note [Masks from sorted positions]; 0 in padded rows), log-sum-exps and
// rowsum(dO * O).
void tile_probs_and_score_grads(float* __restrict s, float* __restrict dp, const int64_t* __restrict nvis,
                                const float* __restrict lse, const float* __restrict D, int64_t nk, int64_t j0,
                                float scale) {
  for (int64_t r = 0; r < TQ; ++r) {
    float* sr = s + r * TK;    // (TK)
    float* dpr = dp + r * TK;  // (TK)
    const int64_t jend = keys_visible(nvis[r], j0, nk);
    row_probs_and_score_grads(sr, dpr, jend, scale, lse[r], D[r]);
  }
}

}  // namespace

void attention_block_forward(const float* q, const float* k, const float* v, const int32_t* q_pos,
                             const int32_t* k_pos, float* o, float* lse, bool first, int64_t B, int64_t Tq,
                             int64_t Tk, int64_t nh, int64_t nkv, int64_t hd, float scale) {
  block_shapes_check(B, Tq, Tk, nh, nkv, hd);
  if (B == 0 || Tq == 0) return;
  positions_check(q_pos, k_pos, Tq, Tk);
  const int64_t group = nh / nkv, hdp = hd_padded(hd), nqt = tiles(Tq, TQ);
  const int64_t items = B * nh * nqt;
#pragma omp parallel if (items > 1)
  {
    std::vector<float> scratch(3 * TQ * hdp + TK * hdp + TQ * TK + 2 * TQ);
    float* qs = scratch.data();   // (TQ, hdp) query tile
    float* acc = qs + TQ * hdp;   // (TQ, hdp) unnormalised output
    float* kt = acc + TQ * hdp;   // (hdp, TK) key tile, transposed
    float* vs = kt + hdp * TK;    // (TK, hdp) value tile
    float* s = vs + TK * hdp;     // (TQ, TK) scores, then probabilities
    float* m = s + TQ * TK;       // (TQ) running max of the scaled scores
    float* l = m + TQ;            // (TQ) running sum of exp(score - m)
    int64_t nvis[TQ];             // (TQ) keys of the block each query sees
    // Later query tiles see at least as many keys: hand them out first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t qt = nqt - 1 - it % nqt, bh = it / nqt, b = bh / nh, h = bh % nh, g = h / group;
      const int64_t i0 = qt * TQ, nq = std::min(TQ, Tq - i0);
      const int64_t qoff = ((b * Tq + i0) * nh + h) * hd;
      // Key tiles holding a key that some query of the tile sees (Note [Masks from sorted positions]).
      tile_visible_counts(nvis, q_pos, k_pos, i0, nq, Tk);
      const int64_t nkt = tiles(nvis[nq - 1], TK);
      if (!first && nkt == 0) continue;  // the whole tile is masked: the state stays as it is
      rows_load(qs, q + qoff, nh * hd, nq, TQ, hd, hdp);
      std::fill(acc, acc + TQ * hdp, 0.0f);
      std::fill(m, m + TQ, kNegInf);
      std::fill(l, l + TQ, 0.0f);
      for (int64_t kt_i = 0; kt_i < nkt; ++kt_i) {
        const int64_t j0 = kt_i * TK, nk = std::min(TK, Tk - j0);
        const int64_t koff = ((b * Tk + j0) * nkv + g) * hd;
        rows_load_transposed(kt, k + koff, nkv * hd, nk, hd, hdp);
        rows_load(vs, v + koff, nkv * hd, nk, TK, hd, hdp);
        std::fill(s, s + TQ * TK, 0.0f);
        tile_gemm(qs, hdp, kt, TK, s, TK, TQ, TK, hdp);
        for (int64_t r = 0; r < TQ; ++r)
          row_online_softmax(s + r * TK, keys_visible(nvis[r], j0, nk), scale, m[r], l[r], acc + r * hdp, hdp);
        tile_gemm(s, TK, vs, hdp, acc, hdp, TQ, hdp, TK);
      }
      // Note [Merging partial attention].
      for (int64_t r = 0; r < nq; ++r) {
        float* orow = o + qoff + r * nh * hd;         // (hd)
        float& L = lse[(b * nh + h) * Tq + i0 + r];  // the row's running log-sum-exp
        const float* arow = acc + r * hdp;            // (hdp)
        if (l[r] == 0.0f) {  // no visible key in this block (l >= 1 as soon as one is)
          if (first) {
            std::fill(orow, orow + hd, 0.0f);
            L = kNegInf;
          }
          continue;
        }
        if (first || L == kNegInf) {
          for (int64_t c = 0; c < hd; ++c) orow[c] = arow[c] / l[r];
          L = m[r] + std::log(l[r]);
          continue;
        }
        const float lse_b = m[r] + std::log(l[r]);
        const float merged = std::max(L, lse_b) + std::log1p(std::exp(-std::abs(L - lse_b)));
        const float w_old = std::exp(L - merged), w_acc = std::exp(m[r] - merged);
        for (int64_t c = 0; c < hd; ++c) orow[c] = orow[c] * w_old + arow[c] * w_acc;
        L = merged;
      }
    }
  }
}

void attention_block_backward(const float* q, const float* k, const float* v, const float* o, const float* lse,
                              const float* dout, const int32_t* q_pos, const int32_t* k_pos, float* dq, float* dk,
                              float* dv, int64_t B, int64_t Tq, int64_t Tk, int64_t nh, int64_t nkv, int64_t hd,
                              float scale) {
  block_shapes_check(B, Tq, Tk, nh, nkv, hd);
  if (B == 0 || Tq == 0 || Tk == 0) return;
  positions_check(q_pos, k_pos, Tq, Tk);
  const int64_t group = nh / nkv, hdp = hd_padded(hd), nqt = tiles(Tq, TQ), nkt = tiles(Tk, TK);
  // Per thread, as attention_backward: qs, dos (TQ, hdp); kt, vt (hdp, TK); ks (TK, hdp); two
  // accumulators of up to max(TQ, TK) rows; s, dp (TQ, TK); tr (TK, TQ); lse_t, D (TQ); and nvis (TQ)
  // on the stack.
  const int64_t tmax = std::max(TQ, TK);
  const int64_t scratch_size = 2 * TQ * hdp + 3 * TK * hdp + 2 * tmax * hdp + 3 * TQ * TK + 2 * TQ;
  // Pass 1: dK, dV of each key tile, one item per (b, kv head, key tile) summing over the heads of the
  // group, then the query tiles in order (Note [Deterministic attention backward], attention.cpp).
  const int64_t items1 = B * nkv * nkt;
#pragma omp parallel if (items1 > 1)
  {
    std::vector<float> scratch(scratch_size);
    float* qs = scratch.data();         // (TQ, hdp) queries
    float* dos = qs + TQ * hdp;         // (TQ, hdp) output gradients
    float* kt = dos + TQ * hdp;         // (hdp, TK) keys, transposed
    float* vt = kt + hdp * TK;          // (hdp, TK) values, transposed
    float* dk_acc = vt + hdp * TK;      // (TK, hdp) unscaled dK of the key tile
    float* dv_acc = dk_acc + TK * hdp;  // (TK, hdp) dV of the key tile
    float* s = dv_acc + TK * hdp;       // (TQ, TK) scores, then P
    float* dp = s + TQ * TK;            // (TQ, TK) dP, then dS
    float* tr = dp + TQ * TK;           // (TK, TQ) P^T or dS^T
    float* lse_t = tr + TK * TQ;        // (TQ)
    float* D = lse_t + TQ;              // (TQ)
    int64_t nvis[TQ];                   // (TQ) keys of the block each query of the tile sees
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items1; ++it) {
      const int64_t kt_i = it % nkt, bg = it / nkt, b = bg / nkv, g = bg % nkv;
      const int64_t j0 = kt_i * TK, nk = std::min(TK, Tk - j0);
      // The first query that sees key j0; none: the key tile gets nothing from this query block.
      const int64_t i_first = std::lower_bound(q_pos, q_pos + Tq, k_pos[j0]) - q_pos;
      if (i_first == Tq) continue;
      const int64_t koff = ((b * Tk + j0) * nkv + g) * hd;
      rows_load_transposed(kt, k + koff, nkv * hd, nk, hd, hdp);
      rows_load_transposed(vt, v + koff, nkv * hd, nk, hd, hdp);
      std::fill(dk_acc, dk_acc + 2 * TK * hdp, 0.0f);  // dk_acc and dv_acc
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (int64_t qt = i_first / TQ; qt < nqt; ++qt) {
          const int64_t i0 = qt * TQ, nq = std::min(TQ, Tq - i0);
          query_tile_load(q, o, lse, dout, qs, dos, lse_t, D, b, h, i0, nq, Tq, nh, hd, hdp);
          tile_visible_counts(nvis, q_pos, k_pos, i0, nq, Tk);
          std::fill(s, s + 2 * TQ * TK, 0.0f);  // s and dp
          tile_gemm(qs, hdp, kt, TK, s, TK, TQ, TK, hdp);
          tile_gemm(dos, hdp, vt, TK, dp, TK, TQ, TK, hdp);
          tile_probs_and_score_grads(s, dp, nvis, lse_t, D, nk, j0, scale);
          tile_transpose(tr, s, TQ, TK);
          tile_gemm(tr, TQ, dos, hdp, dv_acc, hdp, TK, hdp, TQ);
          tile_transpose(tr, dp, TQ, TK);
          tile_gemm(tr, TQ, qs, hdp, dk_acc, hdp, TK, hdp, TQ);
        }
      }
      for (int64_t j = 0; j < nk; ++j) {
        float* dkr = dk + koff + j * nkv * hd;  // (hd)
        float* dvr = dv + koff + j * nkv * hd;  // (hd)
        for (int64_t c = 0; c < hd; ++c) {
          dkr[c] += scale * dk_acc[j * hdp + c];
          dvr[c] += dv_acc[j * hdp + c];
        }
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
    float* dos = qs + TQ * hdp;     // (TQ, hdp) output gradients
    float* kt = dos + TQ * hdp;     // (hdp, TK) keys, transposed
    float* vt = kt + hdp * TK;      // (hdp, TK) values, transposed
    float* ks = vt + hdp * TK;      // (TK, hdp) keys
    float* dq_acc = ks + TK * hdp;  // (TQ, hdp) unscaled dQ of the query tile
    float* s = dq_acc + TQ * hdp;   // (TQ, TK) scores, then P
    float* dp = s + TQ * TK;        // (TQ, TK) dP, then dS
    float* lse_t = dp + TQ * TK;    // (TQ)
    float* D = lse_t + TQ;          // (TQ)
    int64_t nvis[TQ];               // (TQ) keys of the block each query of the tile sees
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items2; ++it) {
      const int64_t qt = nqt - 1 - it % nqt, bh = it / nqt, b = bh / nh, h = bh % nh, g = h / group;
      const int64_t i0 = qt * TQ, nq = std::min(TQ, Tq - i0);
      tile_visible_counts(nvis, q_pos, k_pos, i0, nq, Tk);
      const int64_t nkt_q = tiles(nvis[nq - 1], TK);  // key tiles some query of the tile sees
      if (nkt_q == 0) continue;
      query_tile_load(q, o, lse, dout, qs, dos, lse_t, D, b, h, i0, nq, Tq, nh, hd, hdp);
      std::fill(dq_acc, dq_acc + TQ * hdp, 0.0f);
      for (int64_t kt_i = 0; kt_i < nkt_q; ++kt_i) {
        const int64_t j0 = kt_i * TK, nk = std::min(TK, Tk - j0);
        const int64_t koff = ((b * Tk + j0) * nkv + g) * hd;
        rows_load_transposed(kt, k + koff, nkv * hd, nk, hd, hdp);
        rows_load_transposed(vt, v + koff, nkv * hd, nk, hd, hdp);
        rows_load(ks, k + koff, nkv * hd, nk, TK, hd, hdp);
        std::fill(s, s + 2 * TQ * TK, 0.0f);  // s and dp
        tile_gemm(qs, hdp, kt, TK, s, TK, TQ, TK, hdp);
        tile_gemm(dos, hdp, vt, TK, dp, TK, TQ, TK, hdp);
        tile_probs_and_score_grads(s, dp, nvis, lse_t, D, nk, j0, scale);
        tile_gemm(dp, TK, ks, hdp, dq_acc, hdp, TQ, hdp, TK);
      }
      for (int64_t r = 0; r < nq; ++r) {
        float* dqr = dq + ((b * Tq + i0 + r) * nh + h) * hd;  // (hd)
        for (int64_t c = 0; c < hd; ++c) dqr[c] += scale * dq_acc[r * hdp + c];
      }
    }
  }
}

}  // namespace fp::ops::cpu
