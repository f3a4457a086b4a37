// One training step of a model: forward with per-layer activation checkpointing, the head (loss), the
// load-balancing loss, and the backward with recompute. The model (model/model.h) is the architecture:
// its config, parameters and their layout over the ranks, and the blocks; this is what runs them.
// Legend: n = B * T tokens on this rank, H hidden, L layers, E experts, V vocabulary.
//
// Note [Per-layer checkpointing]: the forward keeps only each layer's input x_l (n, H) in category
// checkpoints, freeing everything else as soon as it is consumed. The head (final norm, logits, loss)
// runs right after the last layer and yields d x_L. The backward then visits layers L-1..0: recompute
// layer l from x_l keeping its intermediates (activations), run its backward, free x_l. So at any
// time the activations of one layer exist, plus L boundaries: the peak SCO flattens.
//
// Note [No recompute]: with ckpt.recompute = false the forward keeps, per layer, what the backward reads
// (the attention block's AttnActs, x1, and the MoE or MLP block's acts, all category activations) besides
// the boundary x_l, and the backward runs each layer's backward on them: no layer runs twice. The forward
// with keep is the same arithmetic as the recompute, so the loss and every gradient are bit for bit those
// of the plain plan (tests/model/test_recompute.cpp); what changes is the activations peak, L layers' instead of
// one's, and the time, one forward less. This is transformers without gradient checkpointing. The MoE
// token side then runs whole: moe.token_chunk, which bounds the layer being recomputed, is refused with it.
//
// Loss = mean cross-entropy over target tokens (-100 ignored) + router_aux_loss_coef * aux, where aux is
// Hugging Face's load_balancing_loss_func over all layers' router outputs concatenated:
//   aux = E * sum_e (C_e / R) * (P_e / R),  R = L * n rows, C_e routed copies of expert e over all
//   layers and slots, P_e the sum of expert e's router probability over all rows.
// Its gradient w.r.t. every router probability of expert e is coef * E * C_e / R^2, the same for every
// token (RouterStats, aux_bias).
#pragma once

#include <cstdint>
#include <vector>

#include "data/batch.h"
#include "model/model.h"

namespace fp {

// How one step's losses are weighted when it is one micro-batch of a larger optimizer step (Note
// [Gradient accumulation] in train/trainer.cpp). The defaults are a step of its own.
struct StepWeights {
  int64_t targets = 0;      // the target tokens the cross-entropy is averaged over (0: this step's, every rank's)
  double aux_weight = 1.0;  // the share of the load-balancing loss this step carries (1/M of M micro-batches)
};

struct StepOutputs {
  double loss = 0;            // ce_loss + coef * aux_weight * aux_loss (NaN on meta)
  double ce_loss = 0;         // the cross-entropy summed over this step's targets / StepWeights::targets
  double aux_loss = 0;        // this step's load-balancing loss (unweighted)
  int64_t target_tokens = 0;  // targets that are not -100
  std::vector<int64_t> expert_counts;  // (L, E) routed copies per layer and expert
};

// Forward, loss and backward of `model` on this rank's batch, in the model's schedules and over its
// comm (collective when it has one); gradients are accumulated into the params' local_g() (their .g on
// one rank). Validates the batch (shapes, token ids, targets; at least one target over every rank) with
// fp::Error first. logits_out (tests): the (B, T, V) logits.
// weights: a micro-batch's share (StepWeights); gradients add to what the params hold, so M calls between two
// zero_grads accumulate.
StepOutputs step_forward_backward(Model& model, const Batch& batch, std::vector<float>* logits_out = nullptr,
                                  const StepWeights& weights = {});
// Forward and loss only (evaluation): no gradient is touched, no layer is recomputed.
StepOutputs step_forward(Model& model, const Batch& batch, std::vector<float>* logits_out = nullptr);

}  // namespace fp
