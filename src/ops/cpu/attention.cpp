// Causal grouped-query flash attention (ops/attention.h), forward and backward, tile by tile.
// Dimensions: B sequences, T tokens each, nh query heads, nkv kv heads, group = nh / nkv query heads per
// kv head, hd the query/key head width, hdv the value/output head width (Note [Value heads of their own
// width], ops/attention.h), hdp / hdvp = hd / hdv rounded up to kNr (the padded row lengths of the scratch
// tiles of q, k, dq, dk / of v, o, dO, dV), TQ x TK = kAttentionTileQ x kAttentionTileK the (query, key)
// tile, nqt / nkt the number of query / key tiles. No buffer grows with T * T: each thread owns a fixed
// scratch of a few (64, hdp), (64, hdvp) and (64, 64) tiles, allocated once per parallel region.
//
// Forward (FlashAttention-2): threads take (b, h, query tile) items; each walks the key tiles at or
// below the diagonal keeping a running max m and sum l per query (online softmax), rescaling its
// (TQ, hdp) output accumulator when the max grows. Key tiles fully above the diagonal are never
// visited; inside the diagonal tile the keys after each query are masked.
//
// A sliding window w > 0 (Note [Sliding-window bands], ops/cpu/attention_tile.h) adds a lower edge
// parallel to the diagonal: query i sees keys (i - w, i]. Over the query tile [i0, i0 + nq) those form
// the one contiguous range [i0 - w + 1, i0 + nq - 1], so the forward and pass 2 start at the key tile
// holding key i0 - w + 1 (and every tile from there to the diagonal holds a visible pair), and pass 1
// stops at the query tile holding query j0 + nk - 2 + w, the last that sees a key of the key tile
// [j0, j0 + nk). Per row, the keys before the edge are masked like those after the query. A window
// >= T masks nothing and is run as w = 0. Every query sees itself, so l > 0 and no row is empty.
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
// Note [Tile products as register-blocked loops]: in ops/cpu/attention_tile.h, with the tile helpers this
// file shares with ops/cpu/attention_block.cpp.
#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "ops/cpu/attention_tile.h"

namespace fp::ops::cpu {

namespace {

using namespace attention_tile;  // TQ, TK, tile_gemm, rows_load, ... (ops/cpu/attention_tile.h)

// The first key query i sees: i - w + 1 with a window w > 0 (clamped to 0), else 0.
inline int64_t first_key(int64_t i, int64_t w) { return w > 0 ? std::max<int64_t>(0, i - w + 1) : 0; }

// The keys of the key tile starting at j0 (nk keys) that query i sees, as [jbeg, jend) within the tile:
// j0 + jbeg = first_key(i) and j0 + jend = i + 1, both clamped to the tile (jbeg = 0 without a window).
struct KeyRun {
  int64_t jbeg, jend;
};
inline KeyRun keys_visible(int64_t i, int64_t j0, int64_t nk, int64_t w) {
  return {std::clamp<int64_t>(first_key(i, w) - j0, 0, nk), std::clamp<int64_t>(i - j0 + 1, 0, nk)};
}

// Backward tile core, shared by both passes so they form the same P and dS. On entry s (TQ, TK) holds
// q.k and dp (TQ, TK) holds dO.v of nq queries from i0 against nk keys from j0; on exit s holds
// P = exp(scale q.k - lse) and dp holds dS = P (dP - D), both zero where masked or padded.
// lse, D (TQ): the rows' log-sum-exp and rowsum(dO * O); w the window (0: none).
void tile_probs_and_score_grads(float* __restrict s, float* __restrict dp, const float* __restrict lse,
                                const float* __restrict D, int64_t nq, int64_t nk, int64_t i0, int64_t j0, float scale,
                                int64_t w) {
  for (int64_t r = 0; r < TQ; ++r) {
    float* sr = s + r * TK;    // (TK)
    float* dpr = dp + r * TK;  // (TK)
    const KeyRun run = r < nq ? keys_visible(i0 + r, j0, nk, w) : KeyRun{0, 0};
    row_probs_and_score_grads(sr, dpr, run.jbeg, run.jend, scale, lse[r], D[r]);
  }
}

void shapes_check(int64_t B, int64_t T, int64_t nh, int64_t nkv, int64_t hd, int64_t hdv, int64_t window) {
  FP_ASSERT(B >= 0 && T >= 0 && nh > 0 && nkv > 0 && hd > 0 && hdv > 0 && nh % nkv == 0 && window >= 0,
            "attention shapes B={} T={} nh={} nkv={} hd={} hdv={} window={} (nh must be a multiple of nkv, "
            "window >= 0)",
            B, T, nh, nkv, hd, hdv, window);
}

}  // namespace

void attention_forward(const float* q, const float* k, const float* v, float* o, float* lse, int64_t B, int64_t T,
                       int64_t nh, int64_t nkv, int64_t hd, int64_t hdv, float scale, int64_t window) {
  shapes_check(B, T, nh, nkv, hd, hdv, window);
  if (B == 0 || T == 0) return;
  const int64_t w = window >= T ? 0 : window;  // a window of T or more masks nothing
  const int64_t group = nh / nkv, hdp = hd_padded(hd), hdvp = hd_padded(hdv), nqt = (T + TQ - 1) / TQ;
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
    // The last query tiles visit the most key tiles (without a window): hand them out first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t qt = nqt - 1 - it % nqt, bh = it / nqt, b = bh / nh, h = bh % nh, g = h / group;
      const int64_t i0 = qt * TQ, nq = std::min(TQ, T - i0);
      const int64_t qrow = (b * T + i0) * nh + h;  // the tile's first row of the (B, T, nh) rows
      rows_load(qs, q + qrow * hd, nh * hd, nq, TQ, hd, hdp);
      std::fill(acc, acc + TQ * hdvp, 0.0f);
      std::fill(m, m + TQ, -std::numeric_limits<float>::infinity());
      std::fill(l, l + TQ, 0.0f);
      // Key tiles from the one holding the first query's first key to the one holding the last query:
      // the rest are masked.
      const int64_t kt_lo = first_key(i0, w) / TK, nkt = (i0 + nq - 1) / TK + 1;
      tile_pairs_computed.fetch_add(nkt - kt_lo, std::memory_order_relaxed);
      for (int64_t kt_i = kt_lo; kt_i < nkt; ++kt_i) {
        const int64_t j0 = kt_i * TK, nk = std::min(TK, T - j0);
        const int64_t krow = (b * T + j0) * nkv + g;  // the tile's first row of the (B, T, nkv) rows
        rows_load_transposed(kt, k + krow * hd, nkv * hd, nk, hd, hdp);
        rows_load(vs, v + krow * hdv, nkv * hdv, nk, TK, hdv, hdvp);
        std::fill(s, s + TQ * TK, 0.0f);
        tile_gemm(qs, hdp, kt, TK, s, TK, TQ, TK, hdp);
        for (int64_t r = 0; r < TQ; ++r) {
          const KeyRun run = r < nq ? keys_visible(i0 + r, j0, nk, w) : KeyRun{0, 0};
          row_online_softmax(s + r * TK, run.jbeg, run.jend, scale, m[r], l[r], acc + r * hdvp, hdvp);
        }
        tile_gemm(s, TK, vs, hdvp, acc, hdvp, TQ, hdvp, TK);
      }
      for (int64_t r = 0; r < nq; ++r) {
        float* orow = o + (qrow + r * nh) * hdv;  // (hdv)
        for (int64_t c = 0; c < hdv; ++c) orow[c] = acc[r * hdvp + c] / l[r];
        lse[(b * nh + h) * T + i0 + r] = m[r] + std::log(l[r]);
      }
    }
  }
}

void attention_backward(const float* q, const float* k, const float* v, const float* o, const float* lse,
                        const float* dout, float* dq, float* dk, float* dv, int64_t B, int64_t T, int64_t nh,
                        int64_t nkv, int64_t hd, int64_t hdv, float scale, int64_t window) {
  shapes_check(B, T, nh, nkv, hd, hdv, window);
  if (B == 0 || T == 0) return;
  const int64_t w = window >= T ? 0 : window;  // a window of T or more masks nothing
  const int64_t group = nh / nkv, hdp = hd_padded(hd), hdvp = hd_padded(hdv);
  const int64_t nqt = (T + TQ - 1) / TQ, nkt = (T + TK - 1) / TK;
  // Per thread: qs (TQ, hdp), dos (TQ, hdvp); kt (hdp, TK), vt (hdvp, TK); ks (TK, hdp); two
  // accumulators of up to max(TQ, TK) rows, of hdp (dK or dQ) and of hdvp (dV) columns; s, dp (TQ, TK);
  // tr (TK, TQ); lse_t, D (TQ).
  const int64_t tmax = std::max(TQ, TK);
  const int64_t scratch_size = TQ * (hdp + hdvp) + TK * (2 * hdp + hdvp) + tmax * (hdp + hdvp) + 3 * TQ * TK + 2 * TQ;
  // Pass 1: dK, dV (Note [Deterministic attention backward]). Key tile 0 is seen by every query tile:
  // ascending key tiles hand out the heaviest items first.
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
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items1; ++it) {
      const int64_t kt_i = it % nkt, bg = it / nkt, b = bg / nkv, g = bg % nkv;
      const int64_t j0 = kt_i * TK, nk = std::min(TK, T - j0);
      const int64_t krow = (b * T + j0) * nkv + g;  // the tile's first row of the (B, T, nkv) rows
      rows_load_transposed(kt, k + krow * hd, nkv * hd, nk, hd, hdp);
      rows_load_transposed(vt, v + krow * hdv, nkv * hdv, nk, hdv, hdvp);
      std::fill(dk_acc, dk_acc + TK * (hdp + hdvp), 0.0f);  // dk_acc and dv_acc
      // Query tiles holding a query at or after key j0 and, with a window, at or before query
      // j0 + nk - 2 + w, the last that sees the tile's last key.
      const int64_t qt_lo = j0 / TQ, qt_hi = w > 0 ? std::min(nqt, (j0 + nk - 2 + w) / TQ + 1) : nqt;
      tile_pairs_computed.fetch_add(group * (qt_hi - qt_lo), std::memory_order_relaxed);
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (int64_t qt = qt_lo; qt < qt_hi; ++qt) {
          const int64_t i0 = qt * TQ, nq = std::min(TQ, T - i0);
          query_tile_load(q, o, lse, dout, qs, dos, lse_t, D, b, h, i0, nq, T, nh, hd, hdp, hdv, hdvp);
          std::fill(s, s + 2 * TQ * TK, 0.0f);  // s and dp
          tile_gemm(qs, hdp, kt, TK, s, TK, TQ, TK, hdp);
          tile_gemm(dos, hdvp, vt, TK, dp, TK, TQ, TK, hdvp);
          tile_probs_and_score_grads(s, dp, lse_t, D, nq, nk, i0, j0, scale, w);
          tile_transpose(tr, s, TQ, TK);
          tile_gemm(tr, TQ, dos, hdvp, dv_acc, hdvp, TK, hdvp, TQ);
          tile_transpose(tr, dp, TQ, TK);
          tile_gemm(tr, TQ, qs, hdp, dk_acc, hdp, TK, hdp, TQ);
        }
      }
      for (int64_t j = 0; j < nk; ++j) {
        float* dkr = dk + (krow + j * nkv) * hd;   // (hd)
        float* dvr = dv + (krow + j * nkv) * hdv;  // (hdv)
        for (int64_t c = 0; c < hd; ++c) dkr[c] = scale * dk_acc[j * hdp + c];
        for (int64_t c = 0; c < hdv; ++c) dvr[c] = dv_acc[j * hdvp + c];
      }
    }
  }
  // Pass 2: dQ. The last query tiles visit the most key tiles: hand them out first.
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
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items2; ++it) {
      const int64_t qt = nqt - 1 - it % nqt, bh = it / nqt, b = bh / nh, h = bh % nh, g = h / group;
      const int64_t i0 = qt * TQ, nq = std::min(TQ, T - i0);
      query_tile_load(q, o, lse, dout, qs, dos, lse_t, D, b, h, i0, nq, T, nh, hd, hdp, hdv, hdvp);
      std::fill(dq_acc, dq_acc + TQ * hdp, 0.0f);
      // Key tiles from the first query's first key up to the last query, as in the forward.
      const int64_t kt_lo = first_key(i0, w) / TK, nkt_q = (i0 + nq - 1) / TK + 1;
      tile_pairs_computed.fetch_add(nkt_q - kt_lo, std::memory_order_relaxed);
      for (int64_t kt_i = kt_lo; kt_i < nkt_q; ++kt_i) {
        const int64_t j0 = kt_i * TK, nk = std::min(TK, T - j0);
        const int64_t krow = (b * T + j0) * nkv + g;  // the tile's first row of the (B, T, nkv) rows
        rows_load_transposed(kt, k + krow * hd, nkv * hd, nk, hd, hdp);
        rows_load_transposed(vt, v + krow * hdv, nkv * hdv, nk, hdv, hdvp);
        rows_load(ks, k + krow * hd, nkv * hd, nk, TK, hd, hdp);
        std::fill(s, s + 2 * TQ * TK, 0.0f);  // s and dp
        tile_gemm(qs, hdp, kt, TK, s, TK, TQ, TK, hdp);
        tile_gemm(dos, hdvp, vt, TK, dp, TK, TQ, TK, hdvp);
        tile_probs_and_score_grads(s, dp, lse_t, D, nq, nk, i0, j0, scale, w);
        tile_gemm(dp, TK, ks, hdp, dq_acc, hdp, TQ, hdp, TK);
      }
      for (int64_t r = 0; r < nq; ++r) {
        float* dqr = dq + ((b * T + i0 + r) * nh + h) * hd;  // (hd)
        for (int64_t c = 0; c < hd; ++c) dqr[c] = scale * dq_acc[r * hdp + c];
      }
    }
  }
}

bool attention_tile::uses_avx2() {
  const char* force = std::getenv("FLATPEAK_SIMD");
  if (force != nullptr && std::string_view(force) == "baseline") return false;
#if FP_ATTENTION_TILE_AVX2
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

}  // namespace fp::ops::cpu
