// Scalar reference of the MoE router (the oracle for ops/cpu/router.cpp): softmax over E experts,
// top-k, optional renormalisation of the k weights, and the backward through all three.
// n tokens, E experts, k experts per token.
//
// Note [Router sums in double]
// Every sum over experts (the softmax denominator, the renormalisation sum S, the softmax backward's
// sum(p * dp)) accumulates in double whatever T is. E is at most a few hundred, so the cost is
// nothing next to the exp, and the sum then no longer depends on its order to within float
// rounding: probs come out correctly rounded from the float exps, and the fast kernel, written with
// the same arithmetic, produces the same bits, hence the same top-k choice even for near-ties.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/error.h"

namespace fp::ops::ref {

// topk_w (n, k) = probs (n, E) at topk_idx (n, k), divided by their sum when norm. topk_idx may repeat
// an expert (a routing profile can): each copy then carries the probability once.
template <class T>
void router_gather(const T* probs, const int32_t* topk_idx, T* topk_w, int64_t n, int64_t E, int64_t k, bool norm) {
  for (int64_t t = 0; t < n; ++t) {
    const T* p = probs + t * E;             // (E)
    const int32_t* idx = topk_idx + t * k;  // (k)
    T* w = topk_w + t * k;                  // (k)
    double s = 0;  // Note [Router sums in double]
    for (int64_t j = 0; j < k; ++j) {
      FP_ASSERT(idx[j] >= 0 && idx[j] < E, "router_gather: token {} slot {} expert {} outside [0, {})", t, j,
                idx[j], E);
      w[j] = p[idx[j]];
      s += static_cast<double>(w[j]);
    }
    if (norm)
      for (int64_t j = 0; j < k; ++j) w[j] = static_cast<T>(static_cast<double>(w[j]) / s);
  }
}

// logits (n, E) -> probs (n, E), topk_idx (n, k) by descending probability, ties to the lower expert
// id; topk_w (n, k) = probs at topk_idx, divided by their sum when norm.
template <class T>
void router_forward(const T* logits, T* probs, int32_t* topk_idx, T* topk_w, int64_t n, int64_t E, int64_t k,
                    bool norm) {
  FP_ASSERT(k >= 1 && k <= E, "router_forward: k={} E={}", k, E);
  for (int64_t t = 0; t < n; ++t) {
    const T* x = logits + t * E;  // (E)
    T* p = probs + t * E;         // (E)
    T mx = x[0];
    for (int64_t e = 1; e < E; ++e) mx = x[e] > mx ? x[e] : mx;
    double sum = 0;  // Note [Router sums in double]
    for (int64_t e = 0; e < E; ++e) {
      p[e] = std::exp(x[e] - mx);
      sum += static_cast<double>(p[e]);
    }
    const double inv = 1.0 / sum;
    for (int64_t e = 0; e < E; ++e) p[e] = static_cast<T>(static_cast<double>(p[e]) * inv);

    // Selection by repeated argmax: the j-th pick is the largest probability not yet taken; the
    // strict '>' keeps the lower id on a tie. A NaN row (NaN logits) picks 0, 1, ..., k-1.
    int32_t* idx = topk_idx + t * k;  // (k)
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken = taken || idx[i] == e;
        if (taken) continue;
        if (best < 0 || p[e] > p[best]) best = e;
      }
      idx[j] = static_cast<int32_t>(best);
    }
  }
  router_gather(probs, topk_idx, topk_w, n, E, k, norm);
}

// dlogits (n, E), overwritten, from d_topk_w (n, k) through the gather (renormalised when norm) and
// the softmax; dprobs_bias (E), may be null, is added to d probs of every row.
//   without norm: dp[e] = sum_j [idx_j == e] dw_j
//   with norm:    w_j = p_{idx_j} / S, S = sum_i p_{idx_i}:  dp[idx_j] += dw_j / S - sum_i dw_i p_{idx_i} / S^2
//                 (accumulated per slot, so a repeated expert also gets its repeated share of S's term)
//   softmax:      dlogit[e] = p[e] * (dp[e] - sum_e' p[e'] dp[e'])
template <class T>
void router_backward(const T* probs, const int32_t* topk_idx, const T* d_topk_w, const T* dprobs_bias, T* dlogits,
                     int64_t n, int64_t E, int64_t k, bool norm) {
  for (int64_t t = 0; t < n; ++t) {
    const T* p = probs + t * E;             // (E)
    const int32_t* idx = topk_idx + t * k;  // (k)
    const T* dw = d_topk_w + t * k;         // (k)
    T* dp = dlogits + t * E;                // (E): d probs first, then d logits in place
    for (int64_t e = 0; e < E; ++e) dp[e] = dprobs_bias ? dprobs_bias[e] : T(0);
    for (int64_t j = 0; j < k; ++j)
      FP_ASSERT(idx[j] >= 0 && idx[j] < E, "router_backward: token {} slot {} expert {} outside [0, {})", t, j,
                idx[j], E);
    if (norm) {
      double s = 0, dot = 0;  // S and sum_i dw_i p_{idx_i}
      for (int64_t j = 0; j < k; ++j) {
        s += static_cast<double>(p[idx[j]]);
        dot += static_cast<double>(dw[j]) * static_cast<double>(p[idx[j]]);
      }
      const double c = dot / (s * s);
      for (int64_t j = 0; j < k; ++j) dp[idx[j]] += static_cast<T>(static_cast<double>(dw[j]) / s - c);
    } else {
      for (int64_t j = 0; j < k; ++j) dp[idx[j]] += dw[j];
    }
    double pdp = 0;  // Note [Router sums in double]
    for (int64_t e = 0; e < E; ++e) pdp += static_cast<double>(p[e]) * static_cast<double>(dp[e]);
    for (int64_t e = 0; e < E; ++e) dp[e] = static_cast<T>(static_cast<double>(p[e]) * (static_cast<double>(dp[e]) - pdp));
  }
}

}  // namespace fp::ops::ref
