// Host-side routing bookkeeping (not a kernel): the stable counting sort of routed copies by expert.
// n tokens, k slots, E experts, m = n * k copies.
#pragma once

#include <cstdint>

namespace fp::ops {

// topk_idx (n, k) -> rows (m): token of each copy in expert order (within an expert, tokens in order,
// then slots in order); slot_pos (n, k): the row of token t's slot j; expert_offsets (E + 1): rows of
// expert e are [offsets[e], offsets[e+1]). Asserts every index lies in [0, E).
void moe_routing_build(const int32_t* topk_idx, int64_t n, int64_t k, int64_t E, int32_t* rows, int32_t* slot_pos,
                       int64_t* expert_offsets);

}  // namespace fp::ops
