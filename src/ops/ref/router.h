// Scalar reference of the MoE router (the oracle for backend/cpu/kernels/router.cpp): softmax over E experts,
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

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "ops/router.h"

namespace fp::ops::ref {

// topk_w (n, k) = probs (n, E) at topk_idx (n, k), divided by their sum when norm. topk_idx may repeat
// an expert (a routing profile can): each copy then carries the probability once.
template <class T>
void router_gather(const T* probs, const int32_t* topk_idx, T* topk_w, RouterSpec spec) {
  const int64_t n = spec.n, E = spec.E, k = spec.k;
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
    if (spec.norm)
      for (int64_t j = 0; j < k; ++j) w[j] = static_cast<T>(static_cast<double>(w[j]) / s);
  }
}

// logits (n, E) -> probs (n, E), topk_idx (n, k) by descending probability, ties to the lower expert
// id; topk_w (n, k) = probs at topk_idx, divided by their sum when norm.
template <class T>
void router_forward(const T* logits, T* probs, int32_t* topk_idx, T* topk_w, RouterSpec spec) {
  const int64_t n = spec.n, E = spec.E, k = spec.k;
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
  router_gather(probs, topk_idx, topk_w, spec);
}

// dlogits (n, E), overwritten, from d_topk_w (n, k) through the gather (renormalised when norm) and
// the softmax; dprobs_bias (E), may be null, is added to d probs of every row.
//   without norm: dp[e] = sum_j [idx_j == e] dw_j
//   with norm:    w_j = p_{idx_j} / S, S = sum_i p_{idx_i}:  dp[idx_j] += dw_j / S - sum_i dw_i p_{idx_i} / S^2
//                 (accumulated per slot, so a repeated expert also gets its repeated share of S's term)
//   softmax:      dlogit[e] = p[e] * (dp[e] - sum_e' p[e'] dp[e'])
template <class T>
void router_backward(const T* probs, const int32_t* topk_idx, const T* d_topk_w, const T* dprobs_bias, T* dlogits,
                     RouterSpec spec) {
  const int64_t n = spec.n, E = spec.E, k = spec.k;
  for (int64_t t = 0; t < n; ++t) {
    const T* p = probs + t * E;             // (E)
    const int32_t* idx = topk_idx + t * k;  // (k)
    const T* dw = d_topk_w + t * k;         // (k)
    T* dp = dlogits + t * E;                // (E): d probs first, then d logits in place
    for (int64_t e = 0; e < E; ++e) dp[e] = dprobs_bias ? dprobs_bias[e] : T(0);
    for (int64_t j = 0; j < k; ++j)
      FP_ASSERT(idx[j] >= 0 && idx[j] < E, "router_backward: token {} slot {} expert {} outside [0, {})", t, j,
                idx[j], E);
    if (spec.norm) {
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

// ---- DeepSeek-V3's sigmoid router (Note [Sigmoid routing] in ops/router.h), written plainly: every
// selection is a repeated argmax with ties to the lower index.

template <class T>
void router_sigmoid_gather(const T* scores, const int32_t* topk_idx, T* topk_w, RouterSpec spec) {
  const int64_t n = spec.n, E = spec.E, k = spec.k;
  for (int64_t t = 0; t < n; ++t) {
    const T* s = scores + t * E;
    const int32_t* idx = topk_idx + t * k;
    T* w = topk_w + t * k;
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      FP_ASSERT(idx[j] >= 0 && idx[j] < E, "router_sigmoid_gather: expert {} outside [0, {})", idx[j], E);
      sum += static_cast<double>(s[idx[j]]);
    }
    const double c = spec.norm ? static_cast<double>(spec.scaling) / (sum + 1e-20) : static_cast<double>(spec.scaling);
    for (int64_t j = 0; j < k; ++j) w[j] = static_cast<T>(static_cast<double>(s[idx[j]]) * c);
  }
}

template <class T>
void router_sigmoid_forward(const T* logits, const T* bias, T* scores, int32_t* topk_idx, T* topk_w, RouterSpec spec) {
  const int64_t n = spec.n, E = spec.E, k = spec.k, n_group = spec.n_group, topk_group = spec.topk_group;
  FP_ASSERT(E % n_group == 0 && E / n_group >= 2 && topk_group <= n_group && topk_group * (E / n_group) >= k);
  const int64_t per = E / n_group;
  std::vector<T> c(static_cast<size_t>(E)), gs(static_cast<size_t>(n_group));
  std::vector<char> allowed(static_cast<size_t>(E)), taken(static_cast<size_t>(n_group));
  for (int64_t t = 0; t < n; ++t) {
    const T* x = logits + t * E;
    T* s = scores + t * E;
    for (int64_t e = 0; e < E; ++e) {
      s[e] = T(1) / (T(1) + std::exp(-x[e]));
      c[e] = s[e] + bias[e];
    }
    for (int64_t g = 0; g < n_group; ++g) {  // the sum of the group's two largest (the larger first)
      int64_t a = -1, b = -1;
      for (int64_t e = g * per; e < (g + 1) * per; ++e)
        if (a < 0 || c[e] > c[a]) a = e;
      for (int64_t e = g * per; e < (g + 1) * per; ++e)
        if (e != a && (b < 0 || c[e] > c[b])) b = e;
      gs[g] = c[a] + c[b];
    }
    std::fill(taken.begin(), taken.end(), 0);
    std::fill(allowed.begin(), allowed.end(), 0);
    for (int64_t i = 0; i < topk_group; ++i) {
      int64_t best = -1;
      for (int64_t g = 0; g < n_group; ++g)
        if (!taken[g] && (best < 0 || gs[g] > gs[best])) best = g;
      FP_ASSERT(best >= 0);
      taken[best] = 1;
      for (int64_t e = best * per; e < (best + 1) * per; ++e) allowed[e] = 1;
    }
    int32_t* idx = topk_idx + t * k;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e)
        if (allowed[e] && (best < 0 || c[e] > c[best])) best = e;
      FP_ASSERT(best >= 0);
      allowed[best] = 0;
      idx[j] = static_cast<int32_t>(best);
    }
  }
  router_sigmoid_gather(scores, topk_idx, topk_w, spec);
}

//   without norm: d s[idx_j] += r dw_j;  with norm: d s[idx_j] += r (dw_j / S' - sum_i dw_i s_i / S'^2),
//   S' = sum_i s_{idx_i} + 1e-20;  then d logit = d s * s (1 - s).
template <class T>
void router_sigmoid_backward(const T* scores, const int32_t* topk_idx, const T* d_topk_w, T* dlogits, RouterSpec spec) {
  const int64_t n = spec.n, E = spec.E, k = spec.k;
  std::vector<double> ds(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t) {
    const T* s = scores + t * E;
    const int32_t* idx = topk_idx + t * k;
    const T* dw = d_topk_w + t * k;
    std::fill(ds.begin(), ds.end(), 0.0);
    const double r = static_cast<double>(spec.scaling);
    double sum = 0, dot = 0;
    for (int64_t j = 0; j < k; ++j) {
      sum += static_cast<double>(s[idx[j]]);
      dot += static_cast<double>(dw[j]) * static_cast<double>(s[idx[j]]);
    }
    const double S = sum + 1e-20;
    for (int64_t j = 0; j < k; ++j)
      ds[idx[j]] += spec.norm ? r * (static_cast<double>(dw[j]) / S - dot / (S * S)) : r * static_cast<double>(dw[j]);
    for (int64_t e = 0; e < E; ++e)
      dlogits[t * E + e] = static_cast<T>(ds[e] * static_cast<double>(s[e]) * (1.0 - static_cast<double>(s[e])));
  }
}

// bias[r] += rate * sign(mean - load[r]), in double, rounded once.
template <class T>
void routing_bias_update(T* bias, const double* load, int64_t rows, double mean, double rate) {
  for (int64_t r = 0; r < rows; ++r) {
    const double err = mean - load[r];
    const double sign = static_cast<double>((err > 0) - (err < 0));
    bias[r] = static_cast<T>(static_cast<double>(bias[r]) + sign * rate);
  }
}

}  // namespace fp::ops::ref
