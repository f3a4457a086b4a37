// How evenly ring attention's work falls on the ranks for packed documents (Note [Balanced rings] in
// data/context_split.h): windows of documents drawn from a length distribution, each dealt to W ranks by
// zig-zag and by the balanced split, and every rank's attention work counted as the tiled kernels do it
// (the cpu backend's attention_block_tile_pairs query over the rank's queries and every rank's key block).
// Legend: T tokens per window, W ranks, N = T / W tokens per rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/context_split.h"

namespace fp::plan {

// Document lengths: log-normal with this mean and log-standard-deviation `tail` (a long tail: most
// documents short, a few very long), at least 1 token; seed draws them.
struct DocMix {
  double mean = 16384;
  double tail = 1.0;
  uint64_t seed = 1;
};
// "mean=16K,tail=1.5[,seed=3]" (a size takes K/M suffixes, as --context does); throws fp::Error naming `flag`.
DocMix doc_mix_parse(const std::string& text, const std::string& flag = "--docs");
// The documents of `windows` consecutive windows of T tokens cut from one stream of the mix: a window may
// start inside a document (its fragment then starts at 0). (windows, T) document starts, a Batch with B =
// windows and no tokens (context_assignment and context_work read only the starts).
Batch doc_mix_windows(const DocMix& mix, int64_t T, int64_t windows);

// One split's work: per window (a step of one sequence), per rank. A step waits for its most loaded rank,
// so the figure is each window's max / mean over the ranks: its mean over the windows and the worst.
struct SplitWork {
  std::vector<std::vector<int64_t>> tile_pairs;  // (windows, W): the tile pairs each rank's queries compute
  std::vector<std::vector<int64_t>> pairs;       // (windows, W): the visible (query, key) pairs (context_work)
  double mean_max_over_mean() const;             // of tile_pairs, averaged over the windows
  double worst_max_over_mean() const;            // of tile_pairs, the worst window
  double pairs_mean_max_over_mean() const;       // of pairs, averaged over the windows
};
struct RingBalance {
  int64_t T = 0, windows = 0;
  int W = 0;
  double documents_per_window = 0;  // the mean number of documents (or fragments) in a window
  SplitWork zigzag, balanced;
};
// Every window dealt by both splits (each window on its own: the splits see one window at a time, as a
// step does with B = 1). window: the model's sliding window (0: none).
RingBalance ring_balance(const DocMix& mix, int64_t T, int W, int64_t windows, int64_t window = 0);
// The table the planner prints.
std::string ring_balance_table(const DocMix& mix, const RingBalance& r);

}  // namespace fp::plan
