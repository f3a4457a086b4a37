// Which rank holds what when a model is spread over W ranks: pure arithmetic, no backend, no comm.
// Legend: W ranks of an expert group (parallel.ep; all the run's ranks by default), E experts, E_p = E / W
// experts per rank.
//
// Experts (expert parallelism): rank r of the group owns the contiguous block [r * E_p, (r + 1) * E_p).
// Only the owner reads an expert's weights and writes its gradient (sched/dispatch/standard.cpp); the
// routed token copies of its group travel to it. With W = 1 rank 0 owns every expert.
#pragma once

#include <cstdint>

#include "core/error.h"

namespace fp {

struct ExpertLayout {
  int64_t first = 0;  // the first owned expert
  int64_t count = 0;  // E_p owned experts: [first, first + count)
  bool owns(int64_t e) const { return e >= first && e < first + count; }
};

// Rank `rank` of W over E experts. A user error unless W divides E (every rank owns as many experts:
// the all-to-all and the optimizer shards assume it).
inline ExpertLayout expert_layout(int rank, int W, int64_t E) {
  FP_CHECK(W >= 1 && E % W == 0,
           "choose model.num_experts divisible by the ranks of an expert group (parallel.ep; 0: mpirun -np)",
           "{} experts cannot be spread evenly over {} ranks (expert parallelism gives each rank E / W)", E, W);
  const int64_t per = E / W;
  return {rank * per, per};
}

// The rank that owns expert e (W divides E: see expert_layout).
inline int expert_owner(int64_t e, int W, int64_t E) { return static_cast<int>(e / (E / W)); }

}  // namespace fp
