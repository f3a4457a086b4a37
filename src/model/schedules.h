// Which schedule each flattenable peak uses (docs/design.md, "The four schedules"): the one schedule
// model. The dtypes are another concept, the precision recipe (core/precision.h), which Model takes beside
// these. Every family keeps its plain variant, so a run can compare them side by
// side. One struct (Schedules), one name per setting (the run config's dotted TOML name, e.g.
// pipelined.chunk_cap, written next to each field), one validation (schedules_validate). The run config
// (train/run_config.h: [vocab], [ckpt], [optim], [moe], [llep], [pipelined]) fills it from
// TOML, `flatpeak plan --schedule key=value` through schedules_set, and the engine (Model, the step,
// dispatch, vocab, ckpt, optimizer creation) reads it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/units.h"

namespace fp {

// Vocabulary projection and loss.
struct VocabSchedule {
  enum class Kind { Kind_full, Kind_ring };
  Kind kind = Kind::Kind_full;     // full: (n, V) logits, log-softmax and gradient; ring: Ring-DTP
  int64_t block_tokens = 1024;     // ring: strip height (tokens per block)
  std::string ring_mode = "auto";  // ring, W > 1: "weights" | "activations" | "auto"
  bool keep_strips = false;        // ring, W > 1: keep the N x V/P strips for backward (memory for time)
};

// Checkpoint boundaries (the layer inputs kept from forward to backward).
struct CkptSchedule {
  enum class Kind { Kind_device, Kind_sco };
  Kind kind = Kind::Kind_device;            // device: all L on the device; sco: offloaded to host
  uint64_t host_budget = kUnlimitedBytes;   // sco: host bytes for boundaries; the rest stay on device
  // ckpt.recompute: true, the backward recomputes each layer from its boundary (Note [Per-layer
  // checkpointing] in step/step.h); false, the forward keeps every layer's activations for the backward
  // and no layer runs twice (Note [No recompute]): L layers' activations for one forward less.
  bool recompute = true;
  // ckpt.layer_tile: > 0, each layer's token-wise work runs in tiles of at most this many of a rank's
  // tokens in the forward, the recompute and the backward (Note [Sequence-tiled layers] in
  // model/layer_tiles.cpp); 0, whole layers.
  int64_t layer_tile = 0;
  // ckpt.every = k: a boundary every k layers (layers 0, k, 2k, ...); the backward recomputes a group's
  // other k - 1 boundaries from its first, then runs its layers last first (Note [Boundaries every k
  // layers] in step/step.cpp): L / k boundaries kept for k - 1 more layer forwards in each group.
  int64_t every = 1;
};

// Expert dispatch (sched/dispatch/dispatch.h): how routed copies reach their experts when W > 1.
struct DispatchSchedule {
  enum class Kind { Kind_standard, Kind_llep, Kind_pipelined_llep };
  Kind kind = Kind::Kind_standard;  // moe.dispatch
  // llep and pipelined_llep: the least-loaded plan (sched/dispatch/llep_plan.h)
  double lambda = 1.3;                 // llep.lambda: plan only when max/mean rank load >= lambda
  double alpha = 1.0;                  // llep.alpha: per-rank cap = alpha * mean load
  int64_t min_tokens_per_gemm = 1024;  // llep.min_tokens_per_gemm: smallest spilled piece that leaves work
  // pipelined_llep: chunks (sched/dispatch/chunk_plan.h)
  int64_t chunk_cap = 1024;            // pipelined.chunk_cap: c, tokens per source per chunk
  int64_t max_chunks = 128;            // pipelined.max_chunks: K_max
  bool strided = true;                 // pipelined.membership: "strided" (true) | "contiguous"
  // Every dispatch: the MoE block's token side in chunks of this many of a rank's tokens (moe.token_chunk;
  // 0: all n at once). Note [The MoE token side in chunks] in model/moe_block.cpp.
  int64_t token_chunk = 0;
};

// The optimizer's schedule (sched/optim/optimizer.h): where AdamW's state lives and how the update runs.
struct OptimSchedule {
  // auto: the planner's baseline rule (device when the whole step fits, else offload_serial); only the
  // planner resolves it (plan/plan.h), a run config refuses it (schedules_validate).
  enum class Kind { Kind_auto, Kind_device, Kind_offload_serial, Kind_offload_stream };
  Kind kind = Kind::Kind_device;   // optim.schedule
  int64_t bucket_params = 1 << 20;  // optim.bucket_params: offload_stream, parameters per bucket
  int64_t slots = 2;                // optim.slots: offload_stream, staging slots
  bool update_on_host = false;      // optim.update_on = "host" | "device" (default): offload_stream
};

struct Schedules {
  VocabSchedule vocab;
  CkptSchedule ckpt;
  DispatchSchedule dispatch;
  OptimSchedule optim;
};

// The names of the families, as the run config writes them (vocab.schedule = "ring", ...).
std::string_view schedule_name(VocabSchedule::Kind k);
std::string_view schedule_name(CkptSchedule::Kind k);
std::string_view schedule_name(DispatchSchedule::Kind k);
std::string_view schedule_name(OptimSchedule::Kind k);
// optim.update_on as the run config writes it: "host" or "device".
std::string_view update_on_name(const OptimSchedule& o);

// Sets one setting by its dotted name from text, as written in TOML or on a command line (strings
// unquoted): the schedule keys of the registry (train/config_keys.h; optim.schedule takes auto too: see
// OptimSchedule). Returns false for a key that is not a schedule
// setting; throws fp::Error "<source>: <key> = <value> ..." for a value that does not parse (ranges:
// schedules_validate).
bool schedules_set(Schedules& s, std::string_view key, std::string_view value, std::string_view source);

// The one validation of a Schedules (ranges and combinations), for the run config and the planner:
// throws fp::Error "<source>: <key> = <value> must be ...". auto_optim: optim.schedule = "auto" is
// allowed (the planner resolves it).
void schedules_validate(const Schedules& s, std::string_view source, bool auto_optim = false);

}  // namespace fp
