// Scalar reference of the routing sort (the oracle for backend/cpu/kernels/moe_routing.cpp): expert by expert,
// every copy scanned in token then slot order, so stability holds by construction (O(E m)).
// n tokens, k slots, E experts, m = n * k copies.
#pragma once

#include <cstdint>

namespace fp::ops::ref {

// topk_idx (n, k) -> rows (m), slot_pos (n, k), expert_offsets (E + 1): as ops::cpu::moe_routing_build.
inline void moe_routing_build(const int32_t* topk_idx, int64_t n, int64_t k, int64_t E, int32_t* rows,
                              int32_t* slot_pos, int64_t* expert_offsets) {
  int64_t pos = 0;
  expert_offsets[0] = 0;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < k; ++j)
        if (topk_idx[t * k + j] == e) {
          rows[pos] = static_cast<int32_t>(t);
          slot_pos[t * k + j] = static_cast<int32_t>(pos);
          ++pos;
        }
    expert_offsets[e + 1] = pos;
  }
}

}  // namespace fp::ops::ref
