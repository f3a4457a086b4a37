// MoE router after its gate GEMM: softmax over E experts in fp32, top-k, optional renormalisation
// of the k weights (norm_topk_prob). n tokens, E experts, k experts per token.
#pragma once

#include <cstdint>

namespace fp::ops::cpu {

// logits (n, E) -> probs (n, E) (softmax, max-subtracted), topk_idx (n, k) by descending probability
// (ties: lower expert id first), topk_w (n, k) = probs at topk_idx, divided by their sum when norm.
void router_forward(const float* logits, float* probs, int32_t* topk_idx, float* topk_w, int64_t n, int64_t E,
                    int64_t k, bool norm);
// Weights for a given choice (a routing profile that overrides the router): topk_w (n, k) = probs at
// topk_idx (n, k), renormalised when norm.
void router_gather(const float* probs, const int32_t* topk_idx, float* topk_w, int64_t n, int64_t E, int64_t k,
                   bool norm);
// dlogits (n, E), overwritten, from d_topk_w (n, k) through the (renormalised) gather and the softmax.
// dprobs_bias (E), may be null: added to d probs of every row (the load-balancing loss's gradient,
// which is the same for every token of a step).
void router_backward(const float* probs, const int32_t* topk_idx, const float* d_topk_w, const float* dprobs_bias,
                     float* dlogits, int64_t n, int64_t E, int64_t k, bool norm);

}  // namespace fp::ops::cpu
