// What every command that runs a model does the same way: train, step, eval, convert and the benches
// (bench step, checkpoint) and the planner build their model, load a checkpoint, run an optimizer step
// and measure a held-out loss through these, so a setting or an order of operations reaches every one
// of them or none. The training loop itself (data, resume, metrics, checkpoints, the stop policy) is
// train/trainer.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "comm/comm.h"
#include "core/units.h"
#include "data/batch.h"
#include "data/documents.h"
#include "data/token_file.h"
#include "model/model.h"
#include "sched/optim/optimizer.h"
#include "step/step.h"
#include "train/checkpoint.h"
#include "train/run_config.h"

namespace fp {

// The model of a run config on `be`: its architecture, schedules and precision, the routing profile the
// backend can run (routing_profile_on in model/routing.h: "router" is "balanced" on meta, and it says so),
// fresh weights from model.seed (on a backend that computes). comm, groups: its ranks (train; null: one
// process, Model's constructor).
std::unique_ptr<Model> run_model_create(const RunConfig& cfg, Backend& be, Comm* comm = nullptr,
                                        RankGroups groups = {});

// A flatpeak checkpoint (a run or step directory) or a Hugging Face model directory, read strictly: the
// architecture from its own config.json (model/hf_config.h), every tensor used or the load refused by
// name (train/checkpoint.h), on a cpu backend of device_mem bytes. eval and convert.
struct CheckpointModel {
  std::string dir;  // the directory read (checkpoint_resolve)
  std::unique_ptr<Backend> be;
  std::unique_ptr<Model> model;
  TrainerState read;  // what the load found: the weights' dtype, the config.json it came with
};
CheckpointModel checkpoint_model_load(const std::string& path, uint64_t device_mem = kUnlimitedBytes);

// One optimizer step as the trainer runs it, in this order: the gradients zeroed; forward_backward runs
// the forward and backward of the step's micro-batches (gradients adding up in the model's) and returns
// their outputs; before_update (may be empty) sees them before the weights move (the trainer's stop
// policy: a non-finite or spiking loss ends the run with the weights of the step before); the optimizer's
// update (step of schedule_total); DeepSeek-V3's routing bias follows the step's expert loads
// (Model::routing_bias_update at bias_update_rate); the backend synchronized.
struct TrainStepResult {
  StepOutputs out;
  Optimizer::StepStats stats;
};
TrainStepResult train_step(Model& model, Optimizer& optim, int64_t step, int64_t schedule_total,
                           double bias_update_rate, const std::function<StepOutputs()>& forward_backward,
                           const std::function<void(const StepOutputs&)>& before_update = {});

// Note [One held-out loss]: the evaluation loss of a model on a set of batches is the token mean over every
// target of every batch (each batch's cross-entropy weighted by its targets), so it does not depend on how
// the windows are batched. `flatpeak eval` and the trainer's held-out evaluation (Note [Held-out
// evaluation] in train/trainer.cpp) both read their windows and sum their losses here.
//
// The evaluation windows of a token file (token_file_eval_batches in data/token_file.h: every window of T
// + 1 tokens once, in file order, `sequences` to a batch; max_batches > 0: the first that many), marked
// with documents as training marks them (DocumentMarker::make in data/documents.h). T_what: the option or
// key that gave T, for messages.
std::vector<Batch> eval_batches_read(const TokenFile& file, int64_t T, int64_t sequences, int64_t max_batches,
                                     const DocumentMarker& documents, const char* T_what);
struct HeldOutLoss {
  double loss = 0;      // the token mean (NaN without a target)
  int64_t targets = 0;  // over this many target tokens
};
// Forward only: weights, gradients and optimizer untouched. forward(i) runs batch i (step_forward; the
// trainer: this rank's slice of it) and returns its outputs; on_batch (may be empty) sees each.
HeldOutLoss held_out_loss(size_t batches, const std::function<StepOutputs(size_t)>& forward,
                          const std::function<void(size_t, const StepOutputs&)>& on_batch = {});

}  // namespace fp
