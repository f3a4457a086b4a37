// The optimizer's hyper-parameters and its learning-rate schedule: linear warmup, then cosine decay
// to a floor. Pure arithmetic (no backend), so config parsing and planning can use it alone.
#pragma once

#include <cstdint>

#include "model/schedules.h"

namespace fp {

// [optim] of a run config (train/run_config.h validates the ranges).
struct OptimConfig {
  double lr = 3e-3;  // peak learning rate, reached at the end of warmup
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double grad_clip = 1.0;      // max global gradient L2 norm; 0 = off
  int64_t warmup_steps = 10;   // linear warmup length; 0 = none
  double min_lr_ratio = 0.1;   // the cosine ends at lr * min_lr_ratio
  // Where the state lives and how the update is scheduled (sched/optim/optimizer.h): the one schedule
  // struct's optim member (model/schedules.h), never "auto" here.
  OptimSchedule sched;
};

// Learning rate of step `step` (1-based) of a run of total_steps steps:
//   step <= warmup_steps:  lr * step / warmup_steps                           (lr at step == warmup)
//   after:                 lr_min + 0.5 * (lr - lr_min) * (1 + cos(pi * p)),  lr_min = lr * min_lr_ratio,
//                          p = (step - warmup) / max(1, total - warmup) clamped to [0, 1]
// so the cosine reaches lr_min at total_steps and stays there past it.
double lr_at(const OptimConfig& cfg, int64_t step, int64_t total_steps);

}  // namespace fp
