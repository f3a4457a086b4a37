// The optimizer of a training run, by schedule (docs/design.md, OffloadStreamAdamW):
//   device          AdamW with fp32 m, v on the device (adamw.h): the plain variant.
//   offload_serial  state in host memory; all gradients to host, CPU AdamW, all parameters back.
//   offload_stream  the same state, pipelined through optim.slots staging slots of buckets.
// Every variant computes the same update (ops/adamw.h), so results are comparable bit for bit.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "model/params.h"
#include "model/schedules.h"
#include "sched/optim/lr_schedule.h"

namespace fp {

class Optimizer {
 public:
  struct StepStats {
    double grad_norm;   // global L2 norm of the gradients before clipping; NaN on meta (no data)
    double lr;          // learning rate of this step
    double clip_scale;  // factor applied to the gradients (1: no clipping)
  };
  virtual ~Optimizer() = default;
  // Step `step` (1-based) of total_steps; reads params' gradients, updates their weights. Throws
  // fp::Error before touching anything when the gradient norm is not finite.
  virtual StepStats step(int64_t step, int64_t total_steps) = 0;
  // ("<param>.exp_avg", m), ("<param>.exp_avg_sq", v) for checkpoints; device or host tensors; and
  // ("<param>.master", master) where the optimizer keeps its own f32 copy of weights stored in
  // another dtype (AdamW under the bf16 recipe).
  virtual std::vector<std::pair<std::string, const Tensor*>> state_tensors() const = 0;
  // A checkpoint's "<param>.master" tensors were read into the state_tensors() masters (resume): they,
  // not the rounded weights, are what the next update starts from.
  virtual void master_loaded() {}
  virtual int64_t steps_taken() const = 0;
  virtual void set_steps_taken(int64_t steps) = 0;
  // These parameters' weights (local_w) were written outside the optimizer (DeepSeek-V3's routing bias,
  // Model::routing_bias_update): a copy of them the optimizer keeps (a master) is refreshed from them.
  virtual void weights_written(const std::vector<Param*>& params) = 0;
};

// The optimizer of cfg's schedule over params. Each rank updates only the storage it holds
// (Param::local_w: its FSDP shards and whole tensors), so optimizer state exists for owned shards only.
std::unique_ptr<Optimizer> optimizer_create(const OptimConfig& cfg, ParamStore& params, Backend& be);
// The same for the AdamW hyperparameters of hyper and the schedule of Schedules::optim (resolved: not
// auto), the one place the schedule struct becomes the optimizers' configuration.
std::unique_ptr<Optimizer> optimizer_create(OptimConfig hyper, const OptimSchedule& sched, ParamStore& params,
                                            Backend& be);

// The kernel's scalars for parameter p at step `step` (1-based): cfg's, st's lr and clipping, and no
// decay on 1-D parameters (RMSNorm weights), as in the usual GPT/Qwen training recipes.
ops::AdamWHyper adamw_hyper(const OptimConfig& cfg, const Optimizer::StepStats& st, const Param& p, int64_t step);

// The L2 norm of the whole model's gradient, the same bits on every rank and in every variant: per
// parameter one device reduction of its local gradient into its slot of sumsq (one float per local
// parameter, grad_sumsq_alloc), then one read of all of them (one synchronisation, not one per
// parameter), summed in double in parameter order, then summed over the ranks of params.comm()
// (all_reduce in the comm's fixed order; every element of the gradient lives on one rank). Only when
// the backend computes.
double grad_norm_global(ParamStore& params, Backend& be, const Tensor& sumsq);
// grad_norm_global's device buffer: (number of params this rank holds) floats, category workspace.
Tensor grad_sumsq_alloc(ParamStore& params, Backend& be);

// The opening of every variant's step, one code so their updates stay the same bits: the learning rate
// at `step`; the replicas' gradient sums (ParamStore::replica_grads_reduce); the global gradient norm
// (grad_norm_global into sumsq), checked finite before anything is written (a non-finite gradient must
// not reach the weights or the moments: fp::Error); torch.nn.utils.clip_grad_norm_'s coefficient
// max_norm / (norm + 1e-6) where it is below 1. On meta the norm is NaN (there are no gradients to read).
Optimizer::StepStats step_stats_begin(const OptimConfig& cfg, ParamStore& params, Backend& be, const Tensor& sumsq,
                                      int64_t step, int64_t total_steps);

}  // namespace fp
