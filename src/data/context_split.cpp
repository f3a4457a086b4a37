#include "data/context_split.h"

#include "core/error.h"

namespace fp {

std::vector<int32_t> context_positions(int64_t T, int rank, int world) {
  std::vector<int32_t> pos;
  if (world == 1) {
    for (int64_t t = 0; t < T; ++t) pos.push_back(static_cast<int32_t>(t));
    return pos;
  }
  FP_CHECK(T % (2 * world) == 0, "choose train.seq_len divisible by 2 x the number of ranks",
           "train.seq_len = {} is not divisible by 2 x {} ranks (context parallelism cuts each sequence into "
           "2W zig-zag chunks)",
           T, world);
  const int64_t C = T / (2 * world);
  for (int64_t chunk : {static_cast<int64_t>(rank), static_cast<int64_t>(2 * world - 1 - rank)})
    for (int64_t t = 0; t < C; ++t) pos.push_back(static_cast<int32_t>(chunk * C + t));
  return pos;
}

Batch context_slice(const Batch& g, int rank, int world) {
  if (world == 1) return g;
  const std::vector<int32_t> pos = context_positions(g.T, rank, world);
  Batch b;
  b.B = g.B;
  b.T = static_cast<int64_t>(pos.size());
  b.positions = pos;
  b.tokens.reserve(static_cast<size_t>(b.B * b.T));
  b.targets.reserve(static_cast<size_t>(b.B * b.T));
  for (int64_t s = 0; s < g.B; ++s)
    for (int32_t p : pos) {
      b.tokens.push_back(g.tokens[s * g.T + p]);
      b.targets.push_back(g.targets[s * g.T + p]);
      if (!g.doc_start.empty()) b.doc_start.push_back(g.doc_start[s * g.T + p]);
    }
  return b;
}

}  // namespace fp
