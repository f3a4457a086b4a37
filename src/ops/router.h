// MoE router after its gate GEMM: softmax over E experts in fp32, top-k, optional renormalisation
// of the k weights (norm_topk_prob); and DeepSeek-V3's sigmoid router. n tokens, E experts, k experts
// per token.
//
// Note [Sigmoid routing] (DeepSeek-V3, transformers' DeepseekV3TopkRouter): per token,
//   s_e = sigmoid(logit_e)                          the scores (kept for backward, in place of probs)
//   c_e = s_e + b_e                                  b: e_score_correction_bias, used for the choice only
//   group g of the n_group groups of E / n_group consecutive experts scores the sum of its two largest c_e;
//   the topk_group best groups are allowed, and the k largest c_e among their experts are chosen
//   w_j = r * s_{idx_j} / (sum_i s_{idx_i} + 1e-20) with norm (norm_topk_prob), else r * s_{idx_j};
//   r = routed_scaling_factor.
// Ties (groups or experts) go to the lower index. No gradient flows through the choice or b: d logit_e =
// d s_e s_e (1 - s_e), nonzero for the chosen experts only. b moves between steps instead, by
// moe.bias_update_rate against each expert's load (aux-loss-free balancing, model/model.h).
#pragma once

#include <cstdint>

namespace fp::ops {

// The contract of each kernel: its signature, shapes, dtypes and what must hold bit for bit. A backend's
// table entry adds an ExecContext first (backend/kernels.h); each backend implements it in its own room
// (backend/cpu/kernels, backend/cuda).

// The sizes and options of every router kernel; the softmax router reads n, E, k and norm.
struct RouterSpec {
  int64_t n = 0;           // tokens
  int64_t E = 0;           // experts
  int64_t k = 0;           // experts per token
  bool norm = false;       // renormalise the k weights (norm_topk_prob)
  int64_t n_group = 1;     // sigmoid: groups of E / n_group consecutive experts
  int64_t topk_group = 1;  // sigmoid: the groups a token may pick its experts from
  float scaling = 1.0f;    // sigmoid: routed_scaling_factor r
};

// logits (n, E) -> probs (n, E) (softmax, max-subtracted), topk_idx (n, k) by descending probability
// (ties: lower expert id first), topk_w (n, k) = probs at topk_idx, divided by their sum when norm.
using router_forward_fn = void(const float* logits, float* probs, int32_t* topk_idx, float* topk_w, RouterSpec spec);

// Weights for a given choice (a routing profile that overrides the router): topk_w (n, k) = probs at
// topk_idx (n, k), renormalised when norm.
using router_gather_fn = void(const float* probs, const int32_t* topk_idx, float* topk_w, RouterSpec spec);

// dlogits (n, E), overwritten, from d_topk_w (n, k) through the (renormalised) gather and the softmax.
// dprobs_bias (E), may be null: added to d probs of every row (the load-balancing loss's gradient,
// which is the same for every token of a step).
using router_backward_fn = void(const float* probs, const int32_t* topk_idx, const float* d_topk_w,
                                const float* dprobs_bias, float* dlogits, RouterSpec spec);

// Note [Sigmoid routing]: logits (n, E), bias (E) -> scores (n, E), topk_idx (n, k) by descending
// s + b, topk_w (n, k). n_group divides E with at least two experts per group, 1 <= topk_group <= n_group,
// topk_group groups hold at least k experts.
using router_sigmoid_forward_fn = void(const float* logits, const float* bias, float* scores, int32_t* topk_idx,
                                       float* topk_w, RouterSpec spec);

// The weights of a given choice (a routing profile): topk_w (n, k) from scores at topk_idx.
using router_sigmoid_gather_fn = void(const float* scores, const int32_t* topk_idx, float* topk_w, RouterSpec spec);

// dlogits (n, E), overwritten, from d_topk_w (n, k) through the weights and the sigmoid.
using router_sigmoid_backward_fn = void(const float* scores, const int32_t* topk_idx, const float* d_topk_w,
                                        float* dlogits, RouterSpec spec);

// The sigmoid router's bias b between steps (aux-loss-free balancing, Model::routing_bias_update): each of
// rows entries moved by rate toward the mean load, in double, rounded once:
//   bias[r] = float(double(bias[r]) + (mean > load[r] ? rate : mean < load[r] ? -rate : 0)).
// load (rows) f64 is every rank's routed copies of those experts (device memory); mean and rate are host
// scalars. Bit for bit that formula on every backend.
using routing_bias_update_fn = void(float* bias, const double* load, int64_t rows, double mean, double rate);

}  // namespace fp::ops
