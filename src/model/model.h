// The decoder-only MoE model (Qwen3-MoE semantics, Hugging Face names), one forward+backward step
// with per-layer activation checkpointing.
//
// Note [Per-layer checkpointing]: the forward keeps only each layer's input x_l (n, H) in category
// checkpoints, freeing everything else as soon as it is consumed. The head (final norm, logits, loss)
// runs right after the last layer and yields d x_L. The backward then visits layers L-1..0: recompute
// layer l from x_l keeping its intermediates (activations), run its backward, free x_l. So at any
// time the activations of one layer exist, plus L boundaries: the peak SCO flattens.
//
// Loss = mean cross-entropy over target tokens (-100 ignored) + router_aux_loss_coef * aux, where aux is
// Hugging Face's load_balancing_loss_func over all layers' router outputs concatenated:
//   aux = E * sum_e (C_e / R) * (P_e / R),  R = L * n rows, C_e routed copies of expert e over all
//   layers and slots, P_e the sum of expert e's router probability over all rows.
// Its gradient w.r.t. every router probability of expert e is coef * E * C_e / R^2, the same for every
// token (RouterStats, aux_bias).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "comm/comm.h"
#include "model/config.h"
#include "model/params.h"
#include "model/schedules.h"

namespace fp {

// One step's tokens on this rank (host memory): B sequences of T tokens, row-major (B, T).
// Under context parallelism T is this rank's share of each sequence and positions says which
// positions of the sequence they are (data/context_split.h); empty positions mean 0..T-1.
struct Batch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> tokens;     // (B, T) ids in [0, V)
  std::vector<int32_t> targets;    // (B, T) ids in [0, V) or -100 (ignored)
  std::vector<int32_t> positions;  // (T) ascending positions in the sequence, or empty
};

struct StepOutputs {
  double loss = 0;        // ce_loss + coef * aux_loss (NaN on meta)
  double ce_loss = 0;
  double aux_loss = 0;
  int64_t target_tokens = 0;  // targets that are not -100
  std::vector<int64_t> expert_counts;  // (L, E) routed copies per layer and expert
};

class Model {
 public:
  // Allocates parameters and gradients. The profile overrides the router (required on meta, where
  // the router computes nothing: "router" is an error there).
  // sched: the schedule of each flattenable peak (plain variants by default).
  // comm: the ranks this model is spread over (context parallel over the tokens; dense parameters
  // sharded FSDP-style, Note [FSDP layout] in model/params.h); null: one process.
  Model(const ModelConfig& cfg, Backend& be, RoutingProfile profile = {}, ModelSchedules sched = {},
        Comm* comm = nullptr);

  // Deterministic initial weights (cpu); see ParamStore::init.
  void init_weights(uint64_t seed) { params_.init(seed); }
  void zero_grads() { params_.zero_grads(); }

  // Forward, loss and backward; gradients are accumulated into the params' local_g() (their .g on one
  // rank). Validates the batch (shapes, token ids, targets) with fp::Error first. logits_out (tests):
  // the (B, T, V) logits.
  StepOutputs forward_backward(const Batch& batch, std::vector<float>* logits_out = nullptr) {
    return step(batch, logits_out, true);
  }
  // Forward and loss only (evaluation): no gradient is touched, no layer is recomputed.
  StepOutputs forward(const Batch& batch, std::vector<float>* logits_out = nullptr) {
    return step(batch, logits_out, false);
  }

  // deepseek_v3, after a training step (Note [Sigmoid routing] in ops/router.h): each MoE layer's
  // e_score_correction_bias moves by `rate` toward balance, b_e += rate * sign(mean - c_e), with c_e the
  // routed copies of expert e in that layer over every rank (expert_counts of the step's outputs, summed
  // over ranks here: collective) and mean their average. Only when the backend computes. Returns the
  // parameters it wrote (for Optimizer::weights_written); empty without a sigmoid router or at rate 0.
  std::vector<Param*> routing_bias_update(const std::vector<int64_t>& expert_counts, double rate);

  ParamStore& params() { return params_; }
  const ModelConfig& config() const { return cfg_; }
  Backend& backend() { return be_; }

 private:
  StepOutputs step(const Batch& batch, std::vector<float>* logits_out, bool backward);

  ModelConfig cfg_;
  Backend& be_;
  RoutingProfile profile_;
  ModelSchedules sched_;
  Comm* comm_;
  ParamStore params_;
};

// Throws fp::Error naming the first bad position: shapes, ids out of [0, V), targets neither in
// [0, V) nor -100, no target at all.
void batch_validate(const Batch& b, int64_t vocab_size);

}  // namespace fp
