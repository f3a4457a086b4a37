// The MoE routers (ops/router.h) on cuda. n tokens, E experts, k experts per token.
//
// The routers give one thread a token and run the cpu's loops on it (backend/cpu/kernels/router.cpp):
// the same insertion top-k (ties to the lower id, a NaN row picking 0 .. k-1), the same double sums in
// the same order, so given the same exponentials every output has the cpu's bits. exp_f32 agrees with
// glibc's expf but in rare near-ties (Note [Bits as the cpu's] in common.cuh), so probs and scores meet
// the error model (bit for bit almost always), and a top-k choice can differ from the cpu's only where
// two experts' probabilities are within an ulp of each other. The router is cheap next to its gate GEMM
// (E exps per token against 2 E H flops); a warp per token would read the rows coalesced, which matters
// once a GPU measures it.
// Device loops hold k and topk_group in registers: k <= kMaxK, topk_group <= kMaxGroups, else refused.
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace fp::ops::cuda {

namespace {

constexpr int kMaxK = 16;
constexpr int kMaxGroups = 64;

// Inserts (v, id) into the list (vals, ids) of at most cap entries kept by (v descending, id ascending);
// ids arrive ascending, so a tie keeps the earlier one first (the cpu's insert_top).
template <class Id>
__device__ void insert_top(float v, Id id, float* vals, Id* ids, int& cnt, int cap) {
  if (cnt == cap && !(v > vals[cap - 1])) return;
  int pos = cnt < cap ? cnt++ : cap - 1;
  for (; pos > 0 && v > vals[pos - 1]; --pos) {
    vals[pos] = vals[pos - 1];
    ids[pos] = ids[pos - 1];
  }
  vals[pos] = v;
  ids[pos] = id;
}

__global__ void router_forward_kernel(const float* logits, float* probs, int32_t* topk_idx, float* topk_w,
                                      RouterSpec spec) {
  const int64_t E = spec.E;
  const int k = static_cast<int>(spec.k);
  FP_CUDA_GRID_STRIDE(t, spec.n) {
    const float* x = logits + t * E;  // (E)
    float* p = probs + t * E;         // (E)
    float mx = x[0];
    for (int64_t e = 1; e < E; ++e) mx = x[e] > mx ? x[e] : mx;
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) {
      p[e] = exp_f32(x[e] - mx);
      sum += static_cast<double>(p[e]);
    }
    const double inv = 1.0 / sum;
    for (int64_t e = 0; e < E; ++e) p[e] = static_cast<float>(static_cast<double>(p[e]) * inv);
    float w[kMaxK];
    int32_t idx[kMaxK];
    int cnt = 0;
    for (int64_t e = 0; e < E; ++e) insert_top(p[e], static_cast<int32_t>(e), w, idx, cnt, k);
    double s = 0;
    for (int j = 0; j < k; ++j) s += static_cast<double>(w[j]);
    for (int j = 0; j < k; ++j) {
      topk_idx[t * k + j] = idx[j];
      topk_w[t * k + j] = spec.norm ? static_cast<float>(static_cast<double>(w[j]) / s) : w[j];
    }
  }
}

__global__ void router_gather_kernel(const float* probs, const int32_t* topk_idx, float* topk_w, RouterSpec spec) {
  const int64_t E = spec.E, k = spec.k;
  FP_CUDA_GRID_STRIDE(t, spec.n) {
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

__global__ void router_backward_kernel(const float* probs, const int32_t* topk_idx, const float* d_topk_w,
                                       const float* dprobs_bias, float* dlogits, RouterSpec spec) {
  const int64_t E = spec.E, k = spec.k;
  FP_CUDA_GRID_STRIDE(t, spec.n) {
    const float* p = probs + t * E;         // (E)
    const int32_t* idx = topk_idx + t * k;  // (k)
    const float* dw = d_topk_w + t * k;     // (k)
    float* dp = dlogits + t * E;            // (E): d probs first, then d logits in place
    for (int64_t e = 0; e < E; ++e) dp[e] = dprobs_bias ? dprobs_bias[e] : 0.0f;
    if (spec.norm) {
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
    double pdp = 0;
    for (int64_t e = 0; e < E; ++e) pdp += static_cast<double>(p[e]) * static_cast<double>(dp[e]);
    for (int64_t e = 0; e < E; ++e)
      dp[e] = static_cast<float>(static_cast<double>(p[e]) * (static_cast<double>(dp[e]) - pdp));
  }
}

__device__ float sigmoid(float x) { return 1.0f / (1.0f + exp_f32(-x)); }

// w (k) = r s[idx] (renormalised with norm), sums in double (the cpu's sigmoid_weights).
__device__ void sigmoid_weights(const float* s, const int32_t* idx, float* w, int64_t k, bool norm, float scaling) {
  double sum = 0;
  for (int64_t j = 0; j < k; ++j) sum += static_cast<double>(s[idx[j]]);
  const double c = norm ? static_cast<double>(scaling) / (sum + 1e-20) : static_cast<double>(scaling);
  for (int64_t j = 0; j < k; ++j) w[j] = static_cast<float>(static_cast<double>(s[idx[j]]) * c);
}

__global__ void router_sigmoid_forward_kernel(const float* logits, const float* bias, float* scores, int32_t* topk_idx,
                                              float* topk_w, RouterSpec spec) {
  const int64_t E = spec.E, n_group = spec.n_group, per = E / n_group;
  const int k = static_cast<int>(spec.k), topk_group = static_cast<int>(spec.topk_group);
  FP_CUDA_GRID_STRIDE(t, spec.n) {
    const float* x = logits + t * E;  // (E)
    float* s = scores + t * E;        // (E)
    for (int64_t e = 0; e < E; ++e) s[e] = sigmoid(x[e]);
    float gval[kMaxGroups];
    int64_t gid[kMaxGroups];
    int ng = 0;
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
      insert_top(a + b, g, gval, gid, ng, topk_group);
    }
    for (int i = 1; i < ng; ++i)  // the chosen groups in id order (insertion sort: ng is small)
      for (int j = i; j > 0 && gid[j - 1] > gid[j]; --j) {
        const int64_t tmp = gid[j];
        gid[j] = gid[j - 1];
        gid[j - 1] = tmp;
      }
    int32_t* idx = topk_idx + t * k;  // (k)
    float cval[kMaxK];
    int32_t cid[kMaxK];
    int cnt = 0;
    for (int i = 0; i < ng; ++i)
      for (int64_t e = gid[i] * per; e < (gid[i] + 1) * per; ++e)
        insert_top(s[e] + bias[e], static_cast<int32_t>(e), cval, cid, cnt, k);
    for (int j = 0; j < k; ++j) idx[j] = cid[j];
    sigmoid_weights(s, cid, topk_w + t * k, k, spec.norm, spec.scaling);
  }
}

__global__ void router_sigmoid_gather_kernel(const float* scores, const int32_t* topk_idx, float* topk_w,
                                             RouterSpec spec) {
  FP_CUDA_GRID_STRIDE(t, spec.n)
  sigmoid_weights(scores + t * spec.E, topk_idx + t * spec.k, topk_w + t * spec.k, spec.k, spec.norm, spec.scaling);
}

__global__ void router_sigmoid_backward_kernel(const float* scores, const int32_t* topk_idx, const float* d_topk_w,
                                               float* dlogits, RouterSpec spec) {
  const int64_t E = spec.E, k = spec.k;
  FP_CUDA_GRID_STRIDE(t, spec.n) {
    const float* s = scores + t * E;        // (E)
    const int32_t* idx = topk_idx + t * k;  // (k)
    const float* dw = d_topk_w + t * k;     // (k)
    float* d = dlogits + t * E;             // (E): d scores first, then d logits
    for (int64_t e = 0; e < E; ++e) d[e] = 0.0f;
    const double r = static_cast<double>(spec.scaling);
    if (spec.norm) {
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
    for (int64_t j = 0; j < k; ++j) {  // sigmoid: d logit = d s * s (1 - s); a repeated expert once
      const int32_t e = idx[j];
      bool seen = false;
      for (int64_t i = 0; i < j; ++i) seen = seen || idx[i] == e;
      if (seen) continue;
      d[e] =
          static_cast<float>(static_cast<double>(d[e]) * static_cast<double>(s[e]) * (1.0 - static_cast<double>(s[e])));
    }
  }
}

void k_check(const char* kernel, const RouterSpec& spec) {
  if (spec.k < 1 || spec.k > kMaxK || spec.k > spec.E) cuda_refuse(kernel, "k must lie in [1, min(E, 16)]");
}

}  // namespace

void router_forward(const ExecContext& c, const float* logits, float* probs, int32_t* topk_idx, float* topk_w,
                    RouterSpec spec) {
  k_check("router_forward", spec);
  if (spec.n <= 0) return;
  router_forward_kernel<<<blocks_for(spec.n, 64), 64, 0, stream_of(c)>>>(logits, probs, topk_idx, topk_w, spec);
  launched("router_forward");
}

void router_gather(const ExecContext& c, const float* probs, const int32_t* topk_idx, float* topk_w, RouterSpec spec) {
  if (spec.n <= 0) return;
  router_gather_kernel<<<blocks_for(spec.n), kThreads, 0, stream_of(c)>>>(probs, topk_idx, topk_w, spec);
  launched("router_gather");
}

void router_backward(const ExecContext& c, const float* probs, const int32_t* topk_idx, const float* d_topk_w,
                     const float* dprobs_bias, float* dlogits, RouterSpec spec) {
  if (spec.n <= 0) return;
  router_backward_kernel<<<blocks_for(spec.n, 64), 64, 0, stream_of(c)>>>(probs, topk_idx, d_topk_w, dprobs_bias,
                                                                          dlogits, spec);
  launched("router_backward");
}

void router_sigmoid_forward(const ExecContext& c, const float* logits, const float* bias, float* scores,
                            int32_t* topk_idx, float* topk_w, RouterSpec spec) {
  k_check("router_sigmoid_forward", spec);
  const int64_t E = spec.E, n_group = spec.n_group, topk_group = spec.topk_group;
  if (!(n_group >= 1 && E % n_group == 0 && E / n_group >= 2 && topk_group >= 1 && topk_group <= n_group &&
        topk_group * (E / n_group) >= spec.k && topk_group <= kMaxGroups))
    cuda_refuse("router_sigmoid_forward", "groups that do not divide E, or more than 64 chosen groups");
  if (spec.n <= 0) return;
  router_sigmoid_forward_kernel<<<blocks_for(spec.n, 64), 64, 0, stream_of(c)>>>(logits, bias, scores, topk_idx, topk_w,
                                                                                 spec);
  launched("router_sigmoid_forward");
}

void router_sigmoid_gather(const ExecContext& c, const float* scores, const int32_t* topk_idx, float* topk_w,
                           RouterSpec spec) {
  if (spec.n <= 0) return;
  router_sigmoid_gather_kernel<<<blocks_for(spec.n), kThreads, 0, stream_of(c)>>>(scores, topk_idx, topk_w, spec);
  launched("router_sigmoid_gather");
}

void router_sigmoid_backward(const ExecContext& c, const float* scores, const int32_t* topk_idx, const float* d_topk_w,
                             float* dlogits, RouterSpec spec) {
  if (spec.n <= 0) return;
  router_sigmoid_backward_kernel<<<blocks_for(spec.n, 64), 64, 0, stream_of(c)>>>(scores, topk_idx, d_topk_w, dlogits,
                                                                                  spec);
  launched("router_sigmoid_backward");
}

// One thread an entry: the double add rounded once, the cpu's bits (ops/router.h).
__global__ void routing_bias_update_kernel(float* bias, const double* load, int64_t rows, double mean, double rate) {
  FP_CUDA_GRID_STRIDE(r, rows) {
    const double step = mean > load[r] ? rate : mean < load[r] ? -rate : 0.0;
    bias[r] = static_cast<float>(static_cast<double>(bias[r]) + step);
  }
}

void routing_bias_update(const ExecContext& c, float* bias, const double* load, int64_t rows, double mean,
                         double rate) {
  if (rows <= 0) return;
  routing_bias_update_kernel<<<blocks_for(rows), kThreads, 0, stream_of(c)>>>(bias, load, rows, mean, rate);
  launched("routing_bias_update");
}

}  // namespace fp::ops::cuda
