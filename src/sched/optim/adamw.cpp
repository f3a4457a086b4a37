#include "sched/optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace fp {

AdamW::AdamW(ParamStore& params, Backend& be, const OptimConfig& cfg) : params_(params), be_(be), cfg_(cfg) {
  const auto& k = be_.kernels();
  const Precision& pr = params_.precision();
  // Note [When AdamW keeps a master copy]: the update runs on master weights in precision.master; when
  // the parameters are stored in that dtype they are the master (no copy), otherwise a separate copy
  // per parameter lives beside m and v (category optimizer), as the planner accounts it. The master
  // starts as the weights widened (exact; Megatron's main params are the bf16 params .float()), taken
  // at the first step and again for any weights written from outside (weights_written); each update
  // runs on it and rounds the new weights into the parameters in the same pass (ops/adamw.h's
  // param_copy), so the parameters are always the master rounded once.
  const bool master = pr.params != pr.master;
  m_.reserve(params_.all().size());
  v_.reserve(params_.all().size());
  if (master) master_.reserve(params_.all().size());
  for (const Param& p : params_.all()) {
    const Shape& shape = p.local_w().shape();  // the FSDP shard on W ranks
    if (master) master_.emplace_back(be_.alloc(Category::Category_optimizer, shape, pr.master, p.name + ".master"));
    Tensor& m = m_.emplace_back(be_.alloc(Category::Category_optimizer, shape, pr.moments, p.name + ".exp_avg"));
    Tensor& v = v_.emplace_back(be_.alloc(Category::Category_optimizer, shape, pr.moments, p.name + ".exp_avg_sq"));
    k.fill(m.buf(), 0.0f, m.numel());
    k.fill(v.buf(), 0.0f, v.numel());
  }
  sumsq_ = grad_sumsq_alloc(params_, be_);
}

AdamW::StepStats AdamW::step(int64_t step, int64_t total_steps) {
  FP_ASSERT(step == steps_taken_ + 1, "AdamW::step({}) after step {}: steps must follow each other (resume sets "
            "set_steps_taken)", step, steps_taken_);
  StepStats st = step_stats_begin(cfg_, params_, be_, sumsq_, step, total_steps);

  const auto& k = be_.kernels();
  if (!master_.empty() && !master_synced_) {
    size_t j = 0;
    for (Param& p : params_.all()) k.copy(master_[j++].buf(), p.local_w().cbuf(), p.local_w().numel());
    master_synced_ = true;
  }
  // Every parameter in one call (Note [The optimizer in buckets] in ops/adamw.h); the table's storage is
  // kept from step to step.
  bucket_.clear();
  ops::AdamWHyper h{};  // the step's scalars; each tensor's weight decay is its own
  size_t i = 0;
  for (Param& p : params_.all()) {
    Tensor& w = p.local_w();
    // With a master the update runs on it and rounds the new weights into w; else on w itself.
    ops::AdamWTensor t;
    t.param = master_.empty() ? w.f32() : master_[i].f32();
    t.grad = p.local_g().cbuf();
    t.m = m_[i].f32();
    t.v = v_[i].f32();
    t.n = w.numel();
    h = adamw_hyper(cfg_, st, p, step);
    t.weight_decay = h.weight_decay;
    t.param_copy = master_.empty() ? Buf{} : w.buf();
    bucket_.push_back(t);
    ++i;
  }
  if (!bucket_.empty()) k.adamw_update_multi(bucket_.data(), static_cast<int64_t>(bucket_.size()), h);
  steps_taken_ = step;
  return st;
}

void AdamW::weights_written(const std::vector<Param*>& params) {
  // Without a master the weights are the optimizer's only copy. With one, the written weights' master
  // is taken again from them (widened; Note [When AdamW keeps a master copy]) once the master exists.
  if (master_.empty() || !master_synced_ || params.empty()) return;
  const auto& k = be_.kernels();
  size_t i = 0;
  for (Param& p : params_.all()) {
    if (std::find(params.begin(), params.end(), &p) != params.end())
      k.copy(master_[i].buf(), p.local_w().cbuf(), p.local_w().numel());
    ++i;
  }
}

std::vector<std::pair<std::string, const Tensor*>> AdamW::state_tensors() const {
  std::vector<std::pair<std::string, const Tensor*>> out;
  out.reserve(2 * m_.size());
  size_t i = 0;
  for (const Param& p : params_.all()) {
    out.emplace_back(p.name + ".exp_avg", &m_[i]);
    out.emplace_back(p.name + ".exp_avg_sq", &v_[i]);
    if (!master_.empty()) out.emplace_back(p.name + ".master", &master_[i]);
    ++i;
  }
  return out;
}

}  // namespace fp
