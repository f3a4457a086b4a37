// The decoder-only MoE model (Qwen3-MoE semantics, Hugging Face names) as an architecture: its config,
// its parameters laid out over the ranks (model/params.h), the schedules, precision and routing profile its
// steps run in, and the blocks (model/blocks.h). A step (forward, loss, backward) is run by step/step.h.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "comm/comm.h"
#include "core/precision.h"
#include "model/config.h"
#include "model/params.h"
#include "model/schedules.h"

namespace fp {

// Note [Support by shape and options] (backend/kernels.h): the uses a step of this config in precision p makes
// of the entries whose cases a backend may refuse: attention, flash and the ring's blocks (its head widths,
// every window its layers use, its sinks), and the experts' grouped GEMMs (their bias epilogues).
std::vector<ops::KernelUse> model_kernel_uses(const ModelConfig& cfg, const Precision& p);

class Model {
 public:
  // Allocates parameters and gradients. The profile overrides the router (required on meta, where
  // the router computes nothing: "router" is an error there).
  // sched: the schedule of each flattenable peak (plain variants by default). precision: the dtype of every
  // allocation (core/precision.h, Note [Which dtype each allocation gets]; all f32 by default). A computing
  // backend computes the fp32 and bf16 recipes, with every schedule, and refuses any other mix by name
  // (Note [bf16 on a computing backend] in model/model.cpp).
  // comm: the ranks this model is spread over (context parallel over the tokens; dense parameters
  // sharded FSDP-style, Note [FSDP layout] in model/params.h); null: one process. groups: the ranks per
  // expert group and per dense-shard group (Note [Experts in groups] in model/params.h); 0: every rank.
  Model(const ModelConfig& cfg, Backend& be, RoutingProfile profile = {}, Schedules sched = {},
        const Precision& precision = {}, Comm* comm = nullptr, RankGroups groups = {});

  // Deterministic initial weights (cpu); see ParamStore::init.
  void init_weights(uint64_t seed) { params_.init(seed); }
  void zero_grads() { params_.zero_grads(); }

  // deepseek_v3, after a training step (Note [Sigmoid routing] in ops/router.h): each MoE layer's
  // e_score_correction_bias moves by `rate` toward balance, b_e += rate * sign(mean - c_e), with c_e the
  // routed copies of expert e in that layer over every rank (expert_counts of the step's outputs, summed
  // over ranks here: collective) and mean their average. Only when the backend computes. Returns the
  // parameters it wrote (for Optimizer::weights_written); empty without a sigmoid router or at rate 0.
  std::vector<Param*> routing_bias_update(const std::vector<int64_t>& expert_counts, double rate);

  ParamStore& params() { return params_; }
  const ModelConfig& config() const { return cfg_; }
  Backend& backend() { return be_; }
  const RoutingProfile& routing_profile() const { return profile_; }
  const Schedules& schedules() const { return sched_; }
  const Precision& precision() const { return params_.precision(); }
  Comm* comm() const { return comm_; }  // null: one process

  // Note [A device mesh] (train/trainer.cpp): the ranks form dp replicas of cp consecutive ranks each;
  // ring attention runs within a replica's cp ranks. Default cp = every rank (dp = 1). cp divides the
  // comm's size; experts and the dense shards stay spread over every rank.
  void set_context_parallel(int cp);
  int context_parallel() const { return cp_; }

  // Note [One routing per token count] (model/moe_block.cpp): under a routing profile a step keeps what it
  // routed for each number of tokens a MoE block sees; with reroute, it routes afresh at every change of that
  // number (StepContext::reroute_each_n; tests compare the two).
  void set_reroute_each_n(bool reroute) { reroute_each_n_ = reroute; }
  bool reroute_each_n() const { return reroute_each_n_; }

 private:
  ModelConfig cfg_;
  Backend& be_;
  RoutingProfile profile_;
  Schedules sched_;
  Comm* comm_;
  int cp_;
  bool reroute_each_n_ = false;
  ParamStore params_;
};

}  // namespace fp
