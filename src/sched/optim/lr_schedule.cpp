#include "sched/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace fp {

double lr_at(const OptimConfig& cfg, int64_t step, int64_t total_steps) {
  const int64_t warmup = cfg.warmup_steps;
  if (warmup > 0 && step <= warmup) return cfg.lr * static_cast<double>(step) / static_cast<double>(warmup);
  const double lr_min = cfg.lr * cfg.min_lr_ratio;
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - warmup));
  const double progress = std::clamp(static_cast<double>(step - warmup) / span, 0.0, 1.0);
  return lr_min + 0.5 * (cfg.lr - lr_min) * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace fp
