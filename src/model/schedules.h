// Which schedule each flattenable peak uses (DESIGN.md, "The four schedules"). Every family keeps its
// plain variant, so a run can compare them side by side. Parsed from the run config
// (train/run_config.h: [vocab], [ckpt], [optim], [moe]).
#pragma once

#include <cstdint>
#include <string>

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

struct ModelSchedules {
  VocabSchedule vocab;
  CkptSchedule ckpt;
};

}  // namespace fp
