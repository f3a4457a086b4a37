// Run configuration, read from TOML (configs/*.toml) with command-line overrides (--set key=value).
// Its keys are the registry's (train/config_keys.h, Note [One key registry]): `flatpeak keys` and
// docs/config.md list them, tables [model] [train] [optim] [data] [moe] [llep] [pipelined] [vocab] [ckpt]
// [precision]; configs/tiny.toml is the commented example.
//
// Unknown tables or keys, missing keys, wrong types and impossible values are fp::Error naming the
// key (e.g. "model.num_attention_heads = 5 is not a multiple of model.num_key_value_heads = 2").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memory/category.h"
#include "model/config.h"
#include "model/schedules.h"
#include "sched/optim/adamw.h"

namespace fp {

struct TrainConfig {
  int64_t batch_size = 1;        // sequences per step (global)
  int64_t seq_len = 0;           // T
  int64_t steps = 1;             // length of the run (and of the learning-rate schedule)
  int64_t checkpoint_every = 0;  // steps between checkpoints; 0: only at the end
  // The run's checkpoints kept on disk: the newest and the keep_checkpoints - 1 before it (Note [Atomic
  // checkpoints], Note [Resuming from the newest sound checkpoint] in train/checkpoint.h).
  int64_t keep_checkpoints = 2;
  // Checkpoints written by a background thread from a host copy while the next steps run (Note
  // [Checkpoints off the critical path] in train/checkpoint_writer.h); false: the step waits for the files.
  bool checkpoint_async = false;
  int64_t grad_accum = 1;  // micro-batches of batch_size sequences per optimizer step (Note [Gradient accumulation])
  // Note [A loss spike stops the run] (trainer.cpp): a loss above this multiple of the median of the
  // last kLossWindow losses stops the run before its update; 0: off.
  double loss_spike_factor = 10;
  // Note [A step that does not finish] (core/watchdog.h): seconds a step may take before the process ends
  // with an error naming it (exit 124); 0: off.
  double step_timeout = 0;
};

struct MoeConfig {
  RoutingProfile routing_profile;
  // deepseek_v3: the step by which each MoE layer's e_score_correction_bias moves after every training
  // step, up for an expert below the mean load and down above it (Note [Sigmoid routing]); 0 freezes it.
  // DeepSeek-V3's value (its report, section 2.1.2).
  double bias_update_rate = 0.001;
};

struct DataConfig {
  std::string source = "recall";  // "recall": the built-in long-context task; otherwise a token file
  std::string task = "recall";    // recall: "recall" ([KEY, k, v] triples) | "recall_packed" (one pair token per plant)
  int64_t pairs = 0;              // recall: key->value pairs per sequence (0: seq_len / 64, at least 1)
  std::string loss_on = "all";    // recall: "all" positions or only the "answers"
  uint64_t seed = 1;
  std::string documents = "none";  // token file: "none" (one stream) | "eos" | "index" (data/documents.h)
  int64_t eos_id = -1;             // documents = "eos": the EOS id (-1: --init-from's config.json eos_token_id)
  std::string context_split = "zigzag";  // "zigzag" | "balanced": a window dealt to the ranks (data/context_split.h)
};

// The device mesh (Note [A device mesh] in trainer.cpp): W = dp x cp ranks (mpirun -np W).
struct ParallelConfig {
  int64_t dp = 1;    // data-parallel replicas, each reading its own sequences
  int64_t cp = 0;    // context-parallel ranks per replica (ring attention); 0: W / dp
  int64_t ep = 0;    // ranks the experts are split over; 0: W (the one layout implemented)
  int64_t fsdp = 0;  // ranks the dense parameters are sharded over; 0: W (the one layout implemented)
};

// Held-out evaluation while training (Note [Held-out evaluation] in trainer.cpp).
struct EvalConfig {
  std::string data;     // a token file ("": none), read as data.documents says
  int64_t every = 0;    // steps between evaluations (0: only after the last step)
  int64_t batches = 0;  // batches of train.batch_size x train.seq_len per evaluation (0: the whole file once)
};

struct RunConfig {
  ModelConfig model;
  TrainConfig train;
  OptimConfig optim;  // AdamW's hyperparameters; its schedule is schedules.optim (optimizer_create)
  DataConfig data;
  EvalConfig eval;
  ParallelConfig parallel;
  MoeConfig moe;
  // Every schedule setting (model/schedules.h): [vocab], [ckpt], optim.schedule and its settings,
  // moe.dispatch, moe.token_chunk, [llep], [pipelined]
  Schedules schedules;
  // [precision]: the dtype of every allocation (core/precision.h); all f32 by default.
  Precision precision;
  std::string source;  // file it came from, for messages
};

// Reads path and applies overrides ("model.hidden_size=128", "moe.routing_profile=hot:0.9:2"; a
// value that is not TOML is taken as a string). Validates everything; throws fp::Error naming the
// file and key. model_from (train --init-from): the architecture of a checkpoint; [model] is then
// optional and every key it gives must agree (Note [A model from a checkpoint] in run_config.cpp).
RunConfig config_load(const std::string& path, const std::vector<std::string>& overrides = {},
                      const ModelConfig* model_from = nullptr);

// What to change when category c of the device (or the host) runs out under this config: the
// schedule that flattens c when it is not in use, else the settings that size the one in use (never
// a recommendation of the schedule already running).
std::string oom_hint(Category c, const std::string& space, const RunConfig& cfg);
// The same from TOML text (tests).
RunConfig config_parse(const std::string& toml_text, const std::string& source,
                       const std::vector<std::string>& overrides = {}, const ModelConfig* model_from = nullptr);

}  // namespace fp
