// The chunk order of PipelinedLLEP (ops/moe_chunk_order.h): a stable counting sort of the routed copies
// by (chunk, destination). Two sequential passes of O(m + P) integer work (count, place), the second
// walking the pieces again rather than keeping a destination per row: small beside the gathers it
// orders, and a sequential pass is the stable order by construction.
// m routed copies, P pieces, K chunks, W ranks, B block counters.
#include "ops/moe_chunk_order.h"

#include <limits>

#include "backend/cpu/kernels/ops.h"
#include "core/error.h"

namespace fp::ops::cpu {

void moe_chunk_order(const int32_t* rows, const int64_t* pieces, ChunkOrderSpec spec, int32_t* order, int32_t* tokens,
                     int64_t* group_offsets, int64_t* block_counts) {
  const int64_t m = spec.m, P = spec.P, K = spec.K, c_eff = spec.c_eff, W = spec.W, B = spec.B;
  const bool strided = spec.strided;
  FP_ASSERT(m >= 0 && P >= 0 && K >= 1 && W >= 1 && B >= 0 && (strided || c_eff >= 1),
            "moe_chunk_order: m={} P={} K={} c_eff={} W={} B={}", m, P, K, c_eff, W, B);
  FP_ASSERT(m <= std::numeric_limits<int32_t>::max(), "moe_chunk_order: {} copies overflow int32 rows", m);
  const int64_t G = K * W;
  const auto chunk_of = [&](int64_t r) {
    const int64_t t = rows[r];
    const int64_t i = strided ? t % K : t / c_eff;
    FP_ASSERT(t >= 0 && i < K, "moe_chunk_order: row {} token {} outside the {} chunks", r, t, K);
    return i;
  };
  // Pass 1: check the pieces and count. Group g at [g + 2] (the last group's count is not needed).
  for (int64_t g = 0; g <= G; ++g) group_offsets[g] = 0;
  for (int64_t b = 0; b < B; ++b) block_counts[b] = 0;
  int64_t end = 0;
  for (int64_t p = 0; p < P; ++p) {
    const int64_t* pc = pieces + 5 * p;
    const int64_t begin = pc[0], stop = pc[1], dest = pc[2], base = pc[3], stride = pc[4];
    FP_ASSERT(begin == end && stop >= begin && stop <= m && dest >= 0 && dest < W,
              "moe_chunk_order: piece {} [{}, {}) to rank {} does not continue [0, {}) of {} rows to {} ranks", p,
              begin, stop, dest, end, m, W);
    FP_ASSERT(base >= 0 && stride >= 0 && base + (K - 1) * stride < B,
              "moe_chunk_order: piece {} counts at {} + i {} outside the {} counters", p, base, stride, B);
    for (int64_t r = begin; r < stop; ++r) {
      const int64_t i = chunk_of(r), g = i * W + dest;
      if (g + 2 <= G) ++group_offsets[g + 2];
      ++block_counts[base + i * stride];
    }
    end = stop;
  }
  FP_ASSERT(end == m, "moe_chunk_order: the pieces cover [0, {}) of {} rows", end, m);
  for (int64_t g = 1; g <= G; ++g) group_offsets[g] += group_offsets[g - 1];
  // Pass 2: rows in order, so each group lists its rows ascending (stable).
  for (int64_t p = 0; p < P; ++p) {
    const int64_t* pc = pieces + 5 * p;
    const int64_t dest = pc[2];
    for (int64_t r = pc[0]; r < pc[1]; ++r) {
      const int64_t pos = group_offsets[chunk_of(r) * W + dest + 1]++;
      order[pos] = static_cast<int32_t>(r);
      if (tokens != nullptr) tokens[pos] = rows[r];
    }
  }
}

}  // namespace fp::ops::cpu
