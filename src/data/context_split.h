// Context parallelism: which tokens of each sequence a rank holds (README, "Multi-process runs";
// docs/design.md, "Architecture"). Legend: T tokens per sequence, W ranks, C = T / (2W) tokens per chunk, N = T / W tokens
// per rank.
//
// Note [Zig-zag pieces]: a sequence is cut into 2W chunks of C tokens and rank r holds chunks r and
// 2W-1-r. Under causal attention the cost of a query grows with its position, so pairing an early
// chunk with a late one gives every rank the same work (contiguous pieces would leave rank W-1 with
// about 2W-1 times rank 0's work). Positions stay ascending within a rank, which the ring attention
// kernels use to skip fully masked tiles.
#pragma once

#include <cstdint>
#include <vector>

#include "data/batch.h"

namespace fp {

// The global positions (N) that rank r of W holds in every sequence. Requires T % (2W) == 0 (W == 1:
// all of 0..T-1, any T).
std::vector<int32_t> context_positions(int64_t T, int rank, int world);

// Rank r's piece of a global batch (B, T): (B, N) tokens and targets with their positions.
Batch context_slice(const Batch& global, int rank, int world);

}  // namespace fp
