#include "data/context_split.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace fp {

namespace {

// The units of one rank under the balanced split: m units of U tokens (Note [Balanced rings]).
int64_t balanced_units_per_rank(int64_t N) {
  for (const int64_t m : {16, 8, 4})
    if (N % m == 0 && N / m >= 64) return m;
  return 2;
}

void split_check(int64_t T, int world) {
  FP_CHECK(T % (2 * world) == 0, "choose train.seq_len divisible by 2 x the number of ranks",
           "train.seq_len = {} is not divisible by 2 x {} ranks (context parallelism cuts each sequence into "
           "2W pieces)",
           T, world);
}

}  // namespace

ContextSplit context_split_parse(const std::string& text, const std::string& key) {
  if (text == "zigzag") return ContextSplit::ContextSplit_zigzag;
  if (text == "balanced") return ContextSplit::ContextSplit_balanced;
  throw Error(fmt::format("{} = \"{}\" is neither \"zigzag\" nor \"balanced\"", key, text),
              "write \"zigzag\" (one causal sequence) or \"balanced\" (packed documents; docs/data.md)");
}

std::vector<int32_t> context_positions(int64_t T, int rank, int world) {
  std::vector<int32_t> pos;
  if (world == 1) {
    pos.resize(static_cast<size_t>(T));
    std::iota(pos.begin(), pos.end(), 0);
    return pos;
  }
  split_check(T, world);
  const int64_t C = T / (2 * world);
  pos.reserve(static_cast<size_t>(2 * C));
  for (int64_t chunk : {static_cast<int64_t>(rank), static_cast<int64_t>(2 * world - 1 - rank)})
    for (int64_t t = 0; t < C; ++t) pos.push_back(static_cast<int32_t>(chunk * C + t));
  return pos;
}

int64_t context_work(const Batch& g, const std::vector<int32_t>& pos, int64_t window) {
  int64_t work = 0;
  for (int64_t b = 0; b < g.B; ++b)
    for (const int32_t p : pos) {
      int64_t first = g.doc_start.empty() ? 0 : g.doc_start[b * g.T + p];
      if (window > 0) first = std::max<int64_t>(first, p - window + 1);
      work += p - first + 1;
    }
  return work;
}

std::vector<std::vector<int32_t>> context_assignment(const Batch& g, int world, ContextSplit split, int64_t window) {
  std::vector<std::vector<int32_t>> ranks(static_cast<size_t>(world));
  if (world == 1 || split == ContextSplit::ContextSplit_zigzag) {
    for (int r = 0; r < world; ++r) ranks[r] = context_positions(g.T, r, world);
    return ranks;
  }
  split_check(g.T, world);
  const int64_t N = g.T / world, m = balanced_units_per_rank(N), U = N / m, units = g.T / U;
  std::vector<int64_t> work(static_cast<size_t>(units));
  std::vector<int32_t> unit_pos(static_cast<size_t>(U));
  for (int64_t u = 0; u < units; ++u) {
    std::iota(unit_pos.begin(), unit_pos.end(), static_cast<int32_t>(u * U));
    work[u] = context_work(g, unit_pos, window);
  }
  std::vector<int64_t> order(static_cast<size_t>(units));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return work[a] > work[b]; });
  std::vector<int64_t> load(static_cast<size_t>(world), 0), held(static_cast<size_t>(world), 0);
  for (const int64_t u : order) {
    int best = -1;
    for (int r = 0; r < world; ++r)
      if (held[r] < m && (best < 0 || load[r] < load[best])) best = r;
    load[best] += work[u];
    ++held[best];
    for (int64_t t = 0; t < U; ++t) ranks[best].push_back(static_cast<int32_t>(u * U + t));
  }
  for (std::vector<int32_t>& p : ranks) std::sort(p.begin(), p.end());
  return ranks;
}

Batch context_slice(const Batch& g, int rank, int world, ContextSplit split, int64_t window) {
  if (world == 1) return g;
  const std::vector<int32_t> pos = split == ContextSplit::ContextSplit_zigzag
                                       ? context_positions(g.T, rank, world)
                                       : context_assignment(g, world, split, window)[rank];
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
