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

#include <cmath>

#include "core/error.h"

namespace fp::ops::cpu {

namespace {
// Below this many elements the OpenMP fork costs more than the work.
constexpr int64_t kParallelMin = 1 << 14;
}  // namespace

void router_gather(const float* probs, const int32_t* topk_idx, float* topk_w, int64_t n, int64_t E, int64_t k,
                   bool norm) {
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
    if (norm)
      for (int64_t j = 0; j < k; ++j) w[j] = static_cast<float>(static_cast<double>(w[j]) / s);
  }
}

void router_forward(const float* logits, float* probs, int32_t* topk_idx, float* topk_w, int64_t n, int64_t E,
                    int64_t k, bool norm) {
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
    if (norm)
      for (int64_t j = 0; j < k; ++j) w[j] = static_cast<float>(static_cast<double>(w[j]) / s);
  }
}

void router_backward(const float* probs, const int32_t* topk_idx, const float* d_topk_w, const float* dprobs_bias,
                     float* dlogits, int64_t n, int64_t E, int64_t k, bool norm) {
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
    if (norm) {
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

}  // namespace fp::ops::cpu
