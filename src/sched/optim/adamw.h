// AdamW with the whole optimizer state on the device (the plain variant; the host-offload schedules
// of docs/design.md, OffloadStreamAdamW, reuse its kernel ops/adamw.h and must equal it bit for bit).
//
// One step: the global gradient L2 norm over every parameter, clipping to optim.grad_clip by
// scaling the gradients inside the update (torch.nn.utils.clip_grad_norm_ then torch.optim.AdamW),
// the learning rate of the schedule (lr_schedule.h), then the update of each parameter in order.
// Weight decay applies to matrices and embeddings (rank >= 2), not to 1-D norm weights.
//
// Device memory: m and v of every parameter's local storage (its FSDP shard on W ranks), category
// optimizer, in the precision's moments dtype (ParamStore::precision()); a master copy of the weights
// in the master dtype only when the parameters are stored in another dtype (Note [When AdamW keeps
// a master copy] in adamw.cpp); and one float in category workspace for the per-parameter sum of
// squares.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "model/params.h"
#include "sched/optim/lr_schedule.h"
#include "sched/optim/optimizer.h"

namespace fp {

class AdamW final : public Optimizer {
 public:
  // Allocates m and v (zero-filled) for every parameter of params, in the store's order. params and
  // be must outlive the optimizer.
  AdamW(ParamStore& params, Backend& be, const OptimConfig& cfg);

  using StepStats = Optimizer::StepStats;

  // Applies step `step` (1-based, PyTorch's state["step"]) of a run of total_steps steps, reading the
  // gradients in params and updating the weights. step must be steps_taken() + 1 (an internal
  // invariant: bias correction depends on it). Throws fp::Error, before any parameter or moment is
  // touched, when the gradient norm is not finite (NaN/Inf in a gradient).
  StepStats step(int64_t step, int64_t total_steps) override;

  // The moments, in the order of params.all(): m()[i] belongs to params.all()[i].
  const std::vector<Tensor>& m() const { return m_; }  // exp_avg, each shaped like its local_w()
  const std::vector<Tensor>& v() const { return v_; }  // exp_avg_sq
  // For checkpoints: ("<param name>.exp_avg", &m_i), ("<param name>.exp_avg_sq", &v_i), parameter by
  // parameter. The pointers stay valid for the optimizer's lifetime; loading writes into their data.
  std::vector<std::pair<std::string, const Tensor*>> state_tensors() const override;
  void weights_written(const std::vector<Param*>& params) override;
  void master_loaded() override { master_synced_ = !master_.empty(); }

  // The last step applied (0 before any). A resumed run sets it to the checkpoint's step after loading
  // the moments.
  int64_t steps_taken() const override { return steps_taken_; }
  void set_steps_taken(int64_t steps) override { steps_taken_ = steps; }

  const OptimConfig& config() const { return cfg_; }

 private:
  ParamStore& params_;
  Backend& be_;
  const OptimConfig cfg_;
  std::vector<Tensor> m_;  // shaped like param i's local_w() (its FSDP shard), category optimizer
  std::vector<Tensor> v_;  // shaped like param i's local_w(), category optimizer
  std::vector<Tensor> master_;  // params dtype != master dtype only: shaped like local_w(), category optimizer
  bool master_synced_ = false;  // master_ holds the weights (widened) since they were last written
  Tensor sumsq_;           // (1) category workspace: reduce_sumsq's output
  std::vector<ops::AdamWTensor> bucket_;  // the step's table of every parameter (adamw_update_multi)
  int64_t steps_taken_ = 0;
};

}  // namespace fp
