// Which schedule each flattenable peak uses (DESIGN.md, "The four schedules"). Every family keeps its
// plain variant, so a run can compare them side by side. Parsed from the run config
// (train/run_config.h: [vocab], [ckpt], [optim], [moe], [llep], [pipelined], [precision]).
#pragma once

#include <cstdint>
#include <string>

#include "core/precision.h"
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

struct ModelSchedules {
  VocabSchedule vocab;
  CkptSchedule ckpt;
  DispatchSchedule dispatch;
  // The dtype of every allocation (core/precision.h, Note [Which dtype each allocation gets]); all f32
  // by default. A computing backend refuses anything else until bf16 compute lands (Model's constructor).
  Precision precision;
};

}  // namespace fp
