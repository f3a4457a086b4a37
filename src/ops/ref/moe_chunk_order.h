// Scalar reference of the chunk order (the oracle for backend/cpu/kernels/moe_chunk_order.cpp): each row's chunk and
// destination found independently (its piece by search), then group by group every row scanned in
// order, so stability holds by construction (O(K W m)).
// m routed copies, P pieces, K chunks, W ranks, B block counters.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/moe_chunk_order.h"

namespace fp::ops::ref {

// As ops::cpu::moe_chunk_order (ops/moe_chunk_order.h); assumes valid pieces.
inline void moe_chunk_order(const int32_t* rows, const int64_t* pieces, ChunkOrderSpec spec, int32_t* order,
                            int32_t* tokens, int64_t* group_offsets, int64_t* block_counts) {
  const int64_t m = spec.m, K = spec.K, c_eff = spec.c_eff, W = spec.W, B = spec.B;
  const bool strided = spec.strided;
  std::vector<int64_t> group(static_cast<size_t>(m)), counter(static_cast<size_t>(m));
  for (int64_t r = 0; r < m; ++r) {
    int64_t p = 0;
    while (!(pieces[5 * p] <= r && r < pieces[5 * p + 1])) ++p;
    const int64_t chunk = strided ? rows[r] % K : rows[r] / c_eff;
    group[r] = chunk * W + pieces[5 * p + 2];
    counter[r] = pieces[5 * p + 3] + chunk * pieces[5 * p + 4];
  }
  for (int64_t b = 0; b < B; ++b) {
    block_counts[b] = 0;
    for (int64_t r = 0; r < m; ++r) block_counts[b] += counter[r] == b;
  }
  int64_t pos = 0;
  for (int64_t g = 0; g < K * W; ++g) {
    group_offsets[g] = pos;
    for (int64_t r = 0; r < m; ++r)
      if (group[r] == g) {
        order[pos] = static_cast<int32_t>(r);
        if (tokens != nullptr) tokens[pos] = rows[r];
        ++pos;
      }
  }
  group_offsets[K * W] = pos;
}

}  // namespace fp::ops::ref
