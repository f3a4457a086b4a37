// The routing sort: the stable counting sort of routed copies by expert, a kernel of the table
// (backend/kernels.h), so the expert order is built where the router's top-k lies; only the E + 1
// offsets go to the host (the dispatch plans need the counts).
// n tokens, k slots, E experts, m = n * k copies.
#pragma once

#include <cstdint>

namespace fp::ops {

// The contract of each kernel: its signature, shapes, dtypes and what must hold bit for bit. A backend's
// table entry adds an ExecContext first (backend/kernels.h); each backend implements it in its own room
// (backend/cpu/kernels, backend/cuda).

// topk_idx (n, k) -> rows (m): token of each copy in expert order (within an expert, tokens in order,
// then slots in order); slot_pos (n, k): the row of token t's slot j; expert_offsets (E + 1): rows of
// expert e are [offsets[e], offsets[e+1]). Every output is overwritten. Asserts every index lies in
// [0, E). Needs no workspace (Note [Counting sort in the offsets array]).
using moe_routing_build_fn = void(const int32_t* topk_idx, int64_t n, int64_t k, int64_t E, int32_t* rows,
                                  int32_t* slot_pos, int64_t* expert_offsets);

}  // namespace fp::ops

namespace fp::ops {}  // namespace fp::ops
