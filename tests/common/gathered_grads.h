// Every parameter's whole gradient, gathered to rank 0 (FSDP shards, experts on their owners): the
// tests that compare a step's gradients between schedules, recipes or rank counts.
#pragma once

#include <vector>

#include "model/params.h"

namespace fp {

// (P) rank 0: each parameter's gradient (numel of its shape, widened to f32) in layout() order; other
// ranks: P empty vectors. Collective: every rank calls it, at the same point of the program.
inline std::vector<std::vector<float>> grads_gathered(ParamStore& ps, int rank) {
  std::vector<std::vector<float>> out;
  for (const ParamInfo& p : ps.layout()) {
    out.emplace_back(rank == 0 ? static_cast<size_t>(p.shape.numel()) : 0);
    ps.full_gather(p, p.local ? &p.local->local_g() : nullptr, rank == 0 ? out.back().data() : nullptr);
  }
  return out;
}

}  // namespace fp
