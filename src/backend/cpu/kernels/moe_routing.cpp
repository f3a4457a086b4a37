// The routing sort (ops/moe_routing.h): the stable counting sort of routed copies by expert.
// One pass of O(m) integer work, sequential: it is small beside the gathers it orders, and a
// sequential pass is the stable order by construction.
// n tokens, k slots, E experts, m = n * k copies.
#include "ops/moe_routing.h"

#include <limits>

#include "backend/cpu/kernels/ops.h"
#include "core/error.h"

namespace fp::ops::cpu {

// Note [Counting sort in the offsets array]
// No scratch buffer: expert_offsets doubles as the cursors. Counting expert e at [e + 2] and taking a
// prefix sum leaves the start of expert e at [e + 1]; placing each copy at [e + 1]++ then moves that
// entry to the end of expert e, which is the start of e + 1, so the array ends as the offsets.
void moe_routing_build(const int32_t* topk_idx, int64_t n, int64_t k, int64_t E, int32_t* rows, int32_t* slot_pos,
                       int64_t* expert_offsets) {
  FP_ASSERT(n >= 0 && k >= 0 && E >= 1, "moe_routing_build: n={} k={} E={}", n, k, E);
  FP_ASSERT(n * k <= std::numeric_limits<int32_t>::max(), "moe_routing_build: {} copies overflow int32 rows",
            n * k);
  const int64_t m = n * k;
  for (int64_t i = 0; i < m; ++i)
    FP_ASSERT(topk_idx[i] >= 0 && topk_idx[i] < E, "moe_routing_build: token {} slot {} expert {} outside [0, {})",
              i / k, i % k, topk_idx[i], E);

  for (int64_t e = 0; e <= E; ++e) expert_offsets[e] = 0;
  for (int64_t i = 0; i < m; ++i)
    if (topk_idx[i] + 2 <= E) ++expert_offsets[topk_idx[i] + 2];  // the last expert's count is not needed
  for (int64_t e = 1; e <= E; ++e) expert_offsets[e] += expert_offsets[e - 1];
  // Tokens in order, then slots in order: the sort is stable.
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t pos = expert_offsets[topk_idx[t * k + j] + 1]++;
      rows[pos] = static_cast<int32_t>(t);
      slot_pos[t * k + j] = static_cast<int32_t>(pos);
    }
}

}  // namespace fp::ops::cpu
