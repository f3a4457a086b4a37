#include "sched/optim/optimizer.h"

#include <cmath>

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

double grad_norm_global(ParamStore& params, Backend& be, const Tensor& sumsq) {
  const auto& k = be.kernels();
  double total = 0.0;
  for (const Param& p : params.all()) {  // each element of the model's gradient is on one rank only
    k.reduce_sumsq(p.local_g().f32(), p.local_g().numel(), sumsq.f32());
    float s = 0.0f;
    be.copy_to_host(&s, sumsq.data(), sizeof(float));
    total += static_cast<double>(s);
  }
  params.comm().all_reduce_sum(&total, 1, DType::DType_F64);
  return std::sqrt(total);
}

}  // namespace fp
