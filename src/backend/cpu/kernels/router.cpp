// MoE router kernels: softmax over E experts, top-k, renormalisation, and the backward.
// n tokens, E experts, k experts per token.
//
// The router is cheap next to its gate GEMM (E exps per token against 2 E H flops), so these are
// the reference's arithmetic, one token per iteration across threads, with two changes: the top-k
// is one insertion pass (O(E) for the usual small k, instead of k argmax passes), and the index
// checks are gone. The arithmetic matches ops/ref/router.h operation for operation (see Note
// [Router sums in double] there), so probs and the top-k choice equal ref<float> bit for bit, and
// rows are independent, so any thread count gives the same bits.
#include "ops/router.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/kernels/ops.h"
#include "core/error.h"

namespace fp::ops::cpu {

namespace {
// Below this many elements the OpenMP fork costs more than the work.
constexpr int64_t kParallelMin = 1 << 14;
}  // namespace

void router_gather(const float* probs, const int32_t* topk_idx, float* topk_w, RouterSpec spec) {
  const int64_t n = spec.n, E = spec.E, k = spec.k;
#pragma omp parallel for schedule(static) if (n * k >= kParallelMin)
  for (int64_t t = 0; t < n; ++t) {
    const float* p = probs + t * E;         // (E)
    const int32_t* idx = topk_idx + t * k;  // (k)
    float* w = topk_w + t * k;              // (k)
    double s = 0;
    for (int64_t j = 0; j < k; ++j) {
      w[j] = p[idx[j]];
      s += static_cast<double>(w[j]);
    }
    if (spec.norm)
      for (int64_t j = 0; j < k; ++j) w[j] = static_cast<float>(static_cast<double>(w[j]) / s);
  }
}

void router_forward(const float* logits, float* probs, int32_t* topk_idx, float* topk_w, RouterSpec spec) {
  const int64_t n = spec.n, E = spec.E, k = spec.k;
  FP_ASSERT(k >= 1 && k <= E, "router_forward: k={} E={}", k, E);  // once per call, outside the threads
#pragma omp parallel for schedule(static) if (n * E >= kParallelMin)
  for (int64_t t = 0; t < n; ++t) {
    const float* x = logits + t * E;  // (E)
    float* p = probs + t * E;         // (E)
    float mx = x[0];
    for (int64_t e = 1; e < E; ++e) mx = x[e] > mx ? x[e] : mx;
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) {
      p[e] = std::exp(x[e] - mx);
      sum += static_cast<double>(p[e]);
    }
    const double inv = 1.0 / sum;
    for (int64_t e = 0; e < E; ++e) p[e] = static_cast<float>(static_cast<double>(p[e]) * inv);

    // Insertion into a list kept sorted by (probability descending, id ascending): experts arrive in
    // id order and a newcomer moves only past strictly smaller probabilities, so a tie keeps the
    // lower id first. While the list is short every expert enters; once full, only one beating the
    // last entry does (a NaN row therefore picks 0, 1, ..., k-1, like the reference). The list's
    // probabilities live in topk_w, which ends up holding exactly probs at topk_idx; keeping them
    // beside the ids saves an indirect load per comparison. The cost is the mispredicted branches
    // of ~k ln(E/k) insertions, about as much as the softmax for E = 64, k = 8.
    int32_t* idx = topk_idx + t * k;  // (k)
    float* w = topk_w + t * k;        // (k)
    int64_t cnt = 0;
    for (int64_t e = 0; e < E; ++e) {
      const float pe = p[e];
      if (cnt == k && !(pe > w[k - 1])) continue;
      int64_t pos = cnt < k ? cnt++ : k - 1;
      for (; pos > 0 && pe > w[pos - 1]; --pos) {
        w[pos] = w[pos - 1];
        idx[pos] = idx[pos - 1];
      }
      w[pos] = pe;
      idx[pos] = static_cast<int32_t>(e);
    }

    double s = 0;
    for (int64_t j = 0; j < k; ++j) s += static_cast<double>(w[j]);
    if (spec.norm)
      for (int64_t j = 0; j < k; ++j) w[j] = static_cast<float>(static_cast<double>(w[j]) / s);
  }
}

void router_backward(const float* probs, const int32_t* topk_idx, const float* d_topk_w, const float* dprobs_bias,
                     float* dlogits, RouterSpec spec) {
  const int64_t n = spec.n, E = spec.E, k = spec.k;
#pragma omp parallel for schedule(static) if (n * E >= kParallelMin)
  for (int64_t t = 0; t < n; ++t) {
    const float* p = probs + t * E;         // (E)
    const int32_t* idx = topk_idx + t * k;  // (k)
    const float* dw = d_topk_w + t * k;     // (k)
    float* dp = dlogits + t * E;            // (E): d probs first, then d logits in place
    if (dprobs_bias)
      for (int64_t e = 0; e < E; ++e) dp[e] = dprobs_bias[e];
    else
      for (int64_t e = 0; e < E; ++e) dp[e] = 0.0f;
    if (spec.norm) {
      // w_j = p_{idx_j} / S: dp[idx_j] += dw_j / S - sum_i dw_i p_{idx_i} / S^2, per slot (a repeated
      // expert gets the S term once per copy, as the chain rule says).
      double s = 0, dot = 0;
      for (int64_t j = 0; j < k; ++j) {
        s += static_cast<double>(p[idx[j]]);
        dot += static_cast<double>(dw[j]) * static_cast<double>(p[idx[j]]);
      }
      const double c = dot / (s * s);
      for (int64_t j = 0; j < k; ++j) dp[idx[j]] += static_cast<float>(static_cast<double>(dw[j]) / s - c);
    } else {
      for (int64_t j = 0; j < k; ++j) dp[idx[j]] += dw[j];
    }
    // Softmax backward: dlogit = p * (dp - sum(p * dp)).
    double pdp = 0;
    for (int64_t e = 0; e < E; ++e) pdp += static_cast<double>(p[e]) * static_cast<double>(dp[e]);
    for (int64_t e = 0; e < E; ++e)
      dp[e] = static_cast<float>(static_cast<double>(p[e]) * (static_cast<double>(dp[e]) - pdp));
  }
}

// ---- Note [Sigmoid routing]

namespace {
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// w (k) = r s[idx] (renormalised with norm), with the sums in double (Note [Router sums in double]).
void sigmoid_weights(const float* s, const int32_t* idx, float* w, int64_t k, bool norm, float scaling) {
  double sum = 0;
  for (int64_t j = 0; j < k; ++j) sum += static_cast<double>(s[idx[j]]);
  const double c = norm ? static_cast<double>(scaling) / (sum + 1e-20) : static_cast<double>(scaling);
  for (int64_t j = 0; j < k; ++j) w[j] = static_cast<float>(static_cast<double>(s[idx[j]]) * c);
}

// Inserts (v, id) into the list (vals, ids) of at most cap entries kept by (v descending, id ascending);
// ids arrive ascending, so a tie keeps the earlier one first.
template <class Id>
void insert_top(float v, Id id, float* vals, Id* ids, int64_t& cnt, int64_t cap) {
  if (cnt == cap && !(v > vals[cap - 1])) return;
  int64_t pos = cnt < cap ? cnt++ : cap - 1;
  for (; pos > 0 && v > vals[pos - 1]; --pos) {
    vals[pos] = vals[pos - 1];
    ids[pos] = ids[pos - 1];
  }
  vals[pos] = v;
  ids[pos] = id;
}
}  // namespace

void router_sigmoid_forward(const float* logits, const float* bias, float* scores, int32_t* topk_idx, float* topk_w,
                            RouterSpec spec) {
  const int64_t n = spec.n, E = spec.E, k = spec.k, n_group = spec.n_group, topk_group = spec.topk_group;
  FP_ASSERT(n_group >= 1 && E % n_group == 0 && E / n_group >= 2 && topk_group >= 1 && topk_group <= n_group &&
                topk_group * (E / n_group) >= k && k >= 1,
            "router_sigmoid_forward: E={} k={} n_group={} topk_group={}", E, k, n_group, topk_group);
  const int64_t per = E / n_group;
#pragma omp parallel if (n * E >= kParallelMin)
  {
    // Per thread, once: the chosen groups and the running top-k's values.
    std::vector<float> gval(static_cast<size_t>(topk_group)), cval(static_cast<size_t>(k));
    std::vector<int64_t> gid(static_cast<size_t>(topk_group));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      const float* x = logits + t * E;  // (E)
      float* s = scores + t * E;        // (E)
      for (int64_t e = 0; e < E; ++e) s[e] = sigmoid(x[e]);
      // The topk_group best groups by the sum of their two best s + b.
      int64_t ng = 0;
      for (int64_t g = 0; g < n_group; ++g) {
        float a = -INFINITY, b = -INFINITY;  // the two largest of the group, a >= b
        for (int64_t e = g * per; e < (g + 1) * per; ++e) {
          const float c = s[e] + bias[e];
          if (c > a) {
            b = a;
            a = c;
          } else if (c > b) {
            b = c;
          }
        }
        insert_top(a + b, g, gval.data(), gid.data(), ng, topk_group);
      }
      // Their experts in id order (groups ascending), by s + b.
      std::sort(gid.begin(), gid.begin() + ng);
      int32_t* idx = topk_idx + t * k;  // (k)
      int64_t cnt = 0;
      for (int64_t i = 0; i < ng; ++i)
        for (int64_t e = gid[i] * per; e < (gid[i] + 1) * per; ++e)
          insert_top(s[e] + bias[e], static_cast<int32_t>(e), cval.data(), idx, cnt, k);
      sigmoid_weights(s, idx, topk_w + t * k, k, spec.norm, spec.scaling);
    }
  }
}

void router_sigmoid_gather(const float* scores, const int32_t* topk_idx, float* topk_w, RouterSpec spec) {
  const int64_t n = spec.n, E = spec.E, k = spec.k;
#pragma omp parallel for schedule(static) if (n * k >= kParallelMin)
  for (int64_t t = 0; t < n; ++t)
    sigmoid_weights(scores + t * E, topk_idx + t * k, topk_w + t * k, k, spec.norm, spec.scaling);
}

void router_sigmoid_backward(const float* scores, const int32_t* topk_idx, const float* d_topk_w, float* dlogits,
                             RouterSpec spec) {
  const int64_t n = spec.n, E = spec.E, k = spec.k;
#pragma omp parallel for schedule(static) if (n * E >= kParallelMin)
  for (int64_t t = 0; t < n; ++t) {
    const float* s = scores + t * E;        // (E)
    const int32_t* idx = topk_idx + t * k;  // (k)
    const float* dw = d_topk_w + t * k;     // (k)
    float* d = dlogits + t * E;             // (E): d scores first, then d logits
    for (int64_t e = 0; e < E; ++e) d[e] = 0.0f;
    const double r = static_cast<double>(spec.scaling);
    if (spec.norm) {
      // w_j = r s_j / S', S' = S + 1e-20: d s_{idx_j} += r (dw_j / S' - sum_i dw_i s_i / S'^2), per slot.
      double sum = 0, dot = 0;
      for (int64_t j = 0; j < k; ++j) {
        sum += static_cast<double>(s[idx[j]]);
        dot += static_cast<double>(dw[j]) * static_cast<double>(s[idx[j]]);
      }
      const double S = sum + 1e-20, c = dot / (S * S);
      for (int64_t j = 0; j < k; ++j) d[idx[j]] += static_cast<float>(r * (static_cast<double>(dw[j]) / S - c));
    } else {
      for (int64_t j = 0; j < k; ++j) d[idx[j]] += static_cast<float>(r * static_cast<double>(dw[j]));
    }
    for (int64_t j = 0; j < k; ++j) {  // sigmoid: d logit = d s * s (1 - s); every other entry stays 0
      const int32_t e = idx[j];
      if (j > 0 && std::find(idx, idx + j, e) != idx + j) continue;  // a repeated expert: once
      d[e] = static_cast<float>(static_cast<double>(d[e]) * static_cast<double>(s[e]) * (1.0 - static_cast<double>(s[e])));
    }
  }
}

void routing_bias_update(float* bias, const double* load, int64_t rows, double mean, double rate) {
  for (int64_t r = 0; r < rows; ++r) {  // E entries: no threads
    const double step = mean > load[r] ? rate : mean < load[r] ? -rate : 0.0;
    bias[r] = static_cast<float>(static_cast<double>(bias[r]) + step);
  }
}

}  // namespace fp::ops::cpu
