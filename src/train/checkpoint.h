// Training checkpoints.
//
// Layout of an output directory DIR:
//   DIR/step-00000050/model.safetensors      weights, Hugging Face names (loads in transformers)
//   DIR/step-00000050/config.json            Qwen3MoeForCausalLM config (model_type qwen3_moe)
//   DIR/step-00000050/optimizer.safetensors  AdamW state: "<param>.exp_avg", "<param>.exp_avg_sq"
//   DIR/step-00000050/trainer_state.json     step, data position, run config, format version
//   DIR/checkpoint -> step-00000050          the latest complete checkpoint (a symlink)
//
// Note [Atomic checkpoints]: a checkpoint is written into "step-N.tmp", every file fsynced, the
// directory renamed to "step-N" and fsynced, and only then the "checkpoint" symlink is replaced
// atomically (a new link renamed over it). A process killed at any point leaves "checkpoint" pointing
// at the previous complete step; stray ".tmp" directories are ignored and cleaned by the next save.
// The previous checkpoint is kept until the next one is complete.
#pragma once

#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "model/params.h"
#include "sched/optim/optimizer.h"

namespace fp {

struct TrainerState {
  int64_t step = 0;            // optimizer steps taken
  int64_t data_position = 0;   // where the data source resumes (sequence index or token offset)
  std::string run_config;      // JSON of the run's config (checked on resume)
  // The length of the learning-rate schedule when it differs from the run's train.steps (a run
  // continued with --extend: Note [Extending a finished run] in trainer.cpp); 0: train.steps.
  int64_t schedule_steps = 0;
};

// Writes a checkpoint of `step` under dir (Note [Atomic checkpoints]). Returns the step directory.
// Collective over params.comm(): every rank calls it; the whole tensors are gathered to rank 0, which
// alone writes (Note [Checkpoints over W ranks] in checkpoint.cpp: the files do not depend on W).
std::string checkpoint_save(const std::string& dir, const ModelConfig& cfg, ParamStore& params, const Optimizer* optim,
                            const TrainerState& state, Backend& be);

// The directory of the latest complete checkpoint: dir itself when it holds model.safetensors, else
// dir/checkpoint. Throws fp::Error when there is none.
std::string checkpoint_resolve(const std::string& dir);

// Loads weights (and, when optim is not null, the optimizer state) from a checkpoint directory into
// already allocated tensors; every name, shape and dtype is checked, and the model config must
// match cfg. Returns the trainer state (step 0 when the directory has none, e.g. weights only).
// On W ranks every rank reads the files and keeps its own rows (a checkpoint of any W loads).
TrainerState checkpoint_load(const std::string& dir, const ModelConfig& cfg, ParamStore& params, Optimizer* optim,
                             Backend& be);

}  // namespace fp
