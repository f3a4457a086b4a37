// Context parallelism: which tokens of each sequence a rank holds (README, "Multi-process runs";
// docs/design.md, "Architecture"). Legend: T tokens per sequence, W ranks, N = T / W tokens per rank,
// C = T / (2W) tokens per zig-zag chunk.
//
// Note [Zig-zag pieces]: a sequence is cut into 2W chunks of C tokens and rank r holds chunks r and
// 2W-1-r. Under causal attention the cost of a query grows with its position, so pairing an early
// chunk with a late one gives every rank the same work (contiguous pieces would leave rank W-1 with
// about 2W-1 times rank 0's work). Positions stay ascending within a rank, which the ring attention
// kernels use to skip fully masked tiles.
//
// Note [Balanced rings]: zig-zag balances one causal sequence. A window of packed documents (Note
// [Documents from EOS] in data/documents.h) is not one: a query's work is the number of keys it sees,
// its position in its document (capped by a sliding window), so a rank whose chunks hold the starts of
// long documents has little work and one holding their ends has much. The balanced split (data.
// context_split = "balanced") deals the window in units of U = N / m tokens (m the largest of 16, 8, 4,
// 2 that divides N with U >= 64, else 2): every unit's work is counted exactly (summed over the B
// sequences), and the units go, heaviest first, each to the rank with the least work so far among those
// that hold fewer than m (ties: the lower unit, the lower rank), a longest-processing-time schedule with
// equal counts (PTRR in torchtitan is of this kind). Every rank then holds N positions, sorted: any such
// assignment is exact, because ring attention masks by the global positions and document starts
// (ops/attention_block.h) and every other op is per token, so the split changes only the order in which
// each query's key blocks arrive. Without documents and windows the units' work grows with position and
// the schedule pairs early units with late ones, as zig-zag does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/batch.h"

namespace fp {

enum class ContextSplit {
  ContextSplit_zigzag,    // Note [Zig-zag pieces]
  ContextSplit_balanced,  // Note [Balanced rings]
};
// "zigzag" / "balanced"; throws fp::Error naming `key` otherwise.
ContextSplit context_split_parse(const std::string& text, const std::string& key = "data.context_split");

// The global positions (N) that rank r of W holds in every sequence under zig-zag. Requires T % (2W) == 0
// (W == 1: all of 0..T-1, any T).
std::vector<int32_t> context_positions(int64_t T, int rank, int world);

// Every rank's positions (W lists of N ascending positions) of the global batch g (B, T) under `split`;
// window: the model's sliding window (0: none), which caps a query's work (Note [Balanced rings]).
std::vector<std::vector<int32_t>> context_assignment(const Batch& g, int world, ContextSplit split, int64_t window = 0);

// The attention work of the positions pos of g: the (query, key) pairs they see, summed over the B
// sequences (a query at position p sees p - max(p - window + 1, its document start) + 1 keys).
int64_t context_work(const Batch& g, const std::vector<int32_t>& pos, int64_t window = 0);

// Rank r's piece of a global batch (B, T): (B, N) tokens, targets and document starts with their positions.
Batch context_slice(const Batch& global, int rank, int world, ContextSplit split = ContextSplit::ContextSplit_zigzag,
                    int64_t window = 0);

}  // namespace fp
