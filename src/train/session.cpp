// What train, step, eval, convert, the benches and the planner share (train/session.h).
#include "train/session.h"

#include <cmath>

#include "data/loader.h"
#include "model/hf_config.h"
#include "model/routing.h"

namespace fp {

std::unique_ptr<Model> run_model_create(const RunConfig& cfg, Backend& be, Comm* comm, RankGroups groups) {
  const RoutingProfile profile = routing_profile_on(cfg.moe.routing_profile, be.computes());
  auto model = std::make_unique<Model>(cfg.model, be, profile, cfg.schedules, cfg.precision, comm, groups);
  model->init_weights(cfg.model.seed);
  return model;
}

CheckpointModel checkpoint_model_load(const std::string& path, uint64_t device_mem) {
  CheckpointModel c;
  c.dir = checkpoint_resolve(path);
  const ModelConfig m = hf_config_read(c.dir).model;
  c.be = backend_create("cpu", device_mem, kUnlimitedBytes);
  c.model = std::make_unique<Model>(m, *c.be, RoutingProfile{});
  // Every tensor read, or the load stops naming it (Note [No weight is dropped silently]).
  c.read = checkpoint_load(c.dir, m, c.model->params(), nullptr, *c.be);
  return c;
}

TrainStepResult train_step(Model& model, Optimizer& optim, int64_t step, int64_t schedule_total,
                           double bias_update_rate, const std::function<StepOutputs()>& forward_backward,
                           const std::function<void(const StepOutputs&)>& before_update) {
  TrainStepResult r;
  model.zero_grads();
  r.out = forward_backward();
  if (before_update) before_update(r.out);
  r.stats = optim.step(step, schedule_total);
  // DeepSeek-V3's aux-loss-free balancing: the routing bias follows this step's expert loads.
  optim.weights_written(model.routing_bias_update(r.out.expert_counts, bias_update_rate));
  model.backend().synchronize();
  return r;
}

std::vector<Batch> eval_batches_read(const TokenFile& file, int64_t T, int64_t sequences, int64_t max_batches,
                                     const DocumentMarker& documents, const char* T_what) {
  std::vector<Batch> batches = token_file_eval_batches(file, T, sequences, T_what, max_batches);
  for (Batch& b : batches) documents.mark(b);
  return batches;
}

HeldOutLoss held_out_loss(size_t batches, const std::function<StepOutputs(size_t)>& forward,
                          const std::function<void(size_t, const StepOutputs&)>& on_batch) {
  HeldOutLoss r;
  double sum = 0;
  for (size_t i = 0; i < batches; ++i) {
    const StepOutputs out = forward(i);
    sum += out.ce_loss * static_cast<double>(out.target_tokens);
    r.targets += out.target_tokens;
    if (on_batch) on_batch(i, out);
  }
  r.loss = r.targets > 0 ? sum / static_cast<double>(r.targets) : std::nan("");
  return r;
}

}  // namespace fp
