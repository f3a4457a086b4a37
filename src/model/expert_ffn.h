// The expert FFN (SwiGLU: down(silu(gate x) * up x)) over rows grouped by expert, forward and
// backward: the compute every dispatch variant shares once the rows are where they are computed.
// Legend: r rows here, H hidden, I expert FFN width, G groups (experts computed here).
//
// Group i covers rows [offsets[i], offsets[i + 1]) (offsets (G + 1), offsets[0] = 0, r = offsets[G])
// and uses the weights w[i]: pointers, so a variant may compute with weights it received (LLEP) as
// well as with the owner's parameters. Empty groups are skipped (their weights are never read). Every group
// of a projection is one call of the grouped entries (Note [The experts in one call] in ops/gemm_grouped.h).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "backend/backend.h"
#include "model/config.h"
#include "model/params.h"

namespace fp {

// One expert's weights (nn.Linear layout) and where its gradients accumulate (+=). The biases (gpt_oss)
// are null where the model has none.
struct ExpertWeights {
  CBuf gate;    // (I, H)
  CBuf up;      // (I, H)
  CBuf down;    // (H, I)
  Buf d_gate;   // (I, H)
  Buf d_up;     // (I, H)
  Buf d_down;   // (H, I)
  CBuf gate_b{}, up_b{}, down_b{};       // (I), (I), (H)
  Buf d_gate_b{}, d_up_b{}, d_down_b{};  // (I), (I), (H)
};
// The weights and gradients of expert e of a layer's parameters (the caller owns e).
ExpertWeights expert_weights(const LayerParams& lp, int64_t e);

// The FFN's widths and the prefix of its intermediates' ledger names ("moe": the experts, I =
// moe_intermediate_size; "mlp": a dense layer's MLP, one group, I = intermediate_size).
// bias: the projections add biases (gpt_oss's experts); swiglu_alpha > 0: the clamped SwiGLU (Note [The
// clamped SwiGLU] in ops/swiglu.h) instead of silu(g) u.
struct FfnDims {
  int64_t H = 0, I = 0;
  const char* tag = "moe";
  bool bias = false;
  float swiglu_alpha = 0, swiglu_limit = 0;
};
// The experts' FFN of a config.
inline FfnDims expert_ffn_dims(const ModelConfig& c) {
  return {c.hidden_size,
          c.moe_intermediate_size,
          "moe",
          c.expert_bias(),
          static_cast<float>(c.swiglu_alpha),
          static_cast<float>(c.swiglu_limit)};
}

// One expert packed into one row of a buffer (LLEP's weight and gradient transfers): gate (I H), up (I H),
// down (H I), then with d.bias gate_b (I), up_b (I), down_b (H). The row's length in elements:
int64_t expert_packed_size(const FfnDims& d);
// w's weights into the row dst.
void expert_pack(const ops::KernelLauncher& K, const FfnDims& d, const ExpertWeights& w, Buf dst);
// The weights of a packed row w, their gradients in the packed row g (null: none).
ExpertWeights expert_packed(const FfnDims& d, CBuf w, Buf g);
// Adds the packed gradient row g into w's gradients.
void expert_grads_add(const ops::KernelLauncher& K, const FfnDims& d, const ExpertWeights& w, CBuf g);

struct ExpertActs {
  Tensor x;          // (r, H) input rows, grouped (set by the caller: received rows in category dispatch,
                     // or the rank's own routed copies xs in category activations for the local dispatch)
  Tensor g, u, act;  // (r, I) gate, up, silu(g) * u (category activations)
};

// In: a.x. Returns y (r, H) in category out_cat, named y_name: dispatch for received rows (sized by
// the routes that land on the rank), activations where the rows are the rank's own routed copies (local). keep = false: a.x and every
// intermediate are freed as soon as consumed (a is empty on return); keep = true: a.x, a.g, a.u,
// a.act stay for expert_ffn_backward. Allocation order (the ledger's timeline; W = 1 is the model's
// plain single-rank sequence): g, u, act, [free x, g, u], y, [free act].
// dt: the dtype of every buffer allocated here (the run's activations dtype, StepContext::precision).
Tensor expert_ffn_forward(Backend& be, const FfnDims& d, std::span<const ExpertWeights> w,
                          std::span<const int64_t> offsets, ExpertActs& a, bool keep, const std::string& y_name,
                          Category out_cat, DType dt);

// In: dy (r, H) (freed here once consumed) and a as left by a forward with keep = true (freed here).
// Returns dx (r, H) in category out_cat (as for expert_ffn_forward's y), named dx_name; accumulates each group's weight gradients
// into w[i].d_*. Allocation order: dact, [free dy, act], dg, du, [free dact, g, u], dx, [free dg, du, x].
Tensor expert_ffn_backward(Backend& be, const FfnDims& d, std::span<const ExpertWeights> w,
                           std::span<const int64_t> offsets, ExpertActs& a, Tensor& dy, const std::string& dx_name,
                           Category out_cat, DType dt);

}  // namespace fp
