#include "sched/optim/optimizer.h"

#include "core/error.h"
#include "sched/optim/adamw.h"
#include "sched/optim/offload.h"

namespace fp {

std::unique_ptr<Optimizer> optimizer_create(const OptimConfig& cfg, ParamStore& params, Backend& be) {
  if (cfg.schedule == "device") return std::make_unique<AdamW>(params, be, cfg);
  if (cfg.schedule == "offload_serial") return std::make_unique<OffloadSerialAdamW>(params, be, cfg);
  if (cfg.schedule == "offload_stream") return std::make_unique<OffloadStreamAdamW>(params, be, cfg);
  throw Error(fmt::format("optim.schedule = \"{}\" is not an optimizer schedule", cfg.schedule),
              "set optim.schedule = \"device\", \"offload_serial\" or \"offload_stream\"");
}

}  // namespace fp
