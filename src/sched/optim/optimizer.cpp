#include "sched/optim/optimizer.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "sched/optim/adamw.h"
#include "sched/optim/offload.h"

namespace fp {

std::unique_ptr<Optimizer> optimizer_create(const OptimConfig& cfg, ParamStore& params, Backend& be) {
  switch (cfg.sched.kind) {
    case OptimSchedule::Kind::Kind_device: return std::make_unique<AdamW>(params, be, cfg);
    case OptimSchedule::Kind::Kind_offload_serial: return std::make_unique<OffloadSerialAdamW>(params, be, cfg);
    case OptimSchedule::Kind::Kind_offload_stream: return std::make_unique<OffloadStreamAdamW>(params, be, cfg);
    case OptimSchedule::Kind::Kind_auto: break;
  }
  throw Error("optim.schedule = \"auto\" reached the optimizer unresolved",
              "flatpeak plan resolves auto; a run names \"device\", \"offload_serial\" or \"offload_stream\"");
}

std::unique_ptr<Optimizer> optimizer_create(OptimConfig hyper, const OptimSchedule& sched, ParamStore& params,
                                            Backend& be) {
  hyper.sched = sched;
  return optimizer_create(hyper, params, be);
}

ops::AdamWHyper adamw_hyper(const OptimConfig& cfg, const Optimizer::StepStats& st, const Param& p, int64_t step) {
  const double wd = p.shape.rank >= 2 ? cfg.weight_decay : 0.0;
  const auto f = [](double x) { return static_cast<float>(x); };
  return {f(st.lr), f(cfg.beta1), f(cfg.beta2), f(cfg.eps), f(wd), f(st.clip_scale), step};
}

Tensor grad_sumsq_alloc(ParamStore& params, Backend& be) {
  return be.alloc_f32(Category::Category_workspace, {static_cast<int64_t>(params.all().size())}, "adamw.grad_sumsq");
}

Optimizer::StepStats step_stats_begin(const OptimConfig& cfg, ParamStore& params, Backend& be, const Tensor& sumsq,
                                      int64_t step, int64_t total_steps) {
  Optimizer::StepStats st{};
  st.lr = lr_at(cfg, step, total_steps);
  st.clip_scale = 1.0;
  params.replica_grads_reduce();  // the replicas' sums first (Note [Experts in groups] in model/params.h)
  if (!be.computes()) {
    st.grad_norm = std::numeric_limits<double>::quiet_NaN();
    return st;
  }
  st.grad_norm = grad_norm_global(params, be, sumsq);
  FP_CHECK(std::isfinite(st.grad_norm), "lower optim.lr or check the data",
           "non-finite gradient norm at step {} ({}): a gradient holds NaN or Inf; no update was applied", step,
           st.grad_norm);
  if (cfg.grad_clip > 0) {
    const double coef = cfg.grad_clip / (st.grad_norm + 1e-6);
    if (coef < 1.0) st.clip_scale = coef;
  }
  return st;
}

double grad_norm_global(ParamStore& params, Backend& be, const Tensor& sumsq) {
  const auto& k = be.kernels();
  const int64_t P = static_cast<int64_t>(params.all().size());
  FP_ASSERT(sumsq.numel() == P, "grad_norm_global: sumsq holds {} slots for {} params", sumsq.numel(), P);
  // Every parameter's partial in one call (Note [The optimizer in buckets] in ops/adamw.h).
  std::vector<CBuf> grads;
  std::vector<int64_t> sizes;
  grads.reserve(static_cast<size_t>(P));
  sizes.reserve(static_cast<size_t>(P));
  for (const Param& p : params.all()) {
    grads.push_back(p.local_g().cbuf());
    sizes.push_back(p.local_g().numel());
  }
  k.reduce_sumsq_multi(grads.data(), sizes.data(), P, sumsq.f32());  // computes: data exists
  std::vector<float> s(static_cast<size_t>(P));
  be.copy_to_host(s.data(), sumsq.data(), sumsq.bytes());
  // Each element of the model's gradient counts once: a dense row on the rank whose shard holds it, an
  // expert on its owner, each on its first group only (the other groups hold the same sums, Note [Experts
  // in groups] in model/params.h).
  double total = 0.0;
  int64_t i = 0;
  for (const Param& p : params.all()) {
    const float v = s[static_cast<size_t>(i++)];
    if (!params.replicated_elsewhere(p)) total += static_cast<double>(v);
  }
  params.comm().all_reduce_sum(&total, 1, DType::DType_F64);
  return std::sqrt(total);
}

}  // namespace fp
