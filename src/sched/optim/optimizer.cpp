#include "sched/optim/optimizer.h"

#include "sched/optim/adamw.h"

namespace fp {

std::unique_ptr<Optimizer> optimizer_create(const OptimConfig& cfg, ParamStore& params, Backend& be) {
  return std::make_unique<AdamW>(params, be, cfg);
}

}  // namespace fp
