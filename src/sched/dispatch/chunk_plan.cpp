// PipelinedLLEP chunk membership and per-chunk counts. Pure host arithmetic.
// Legend: n tokens per source, k top-k, W ranks, K chunks, c_eff tokens per source per chunk.
#include "sched/dispatch/chunk_plan.h"

#include <algorithm>

#include "core/error.h"

namespace fp {

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

ChunkPlan chunk_plan_build(int64_t n, int64_t chunk_cap, int64_t max_chunks, ChunkMembership membership) {
  FP_ASSERT(n >= 1 && chunk_cap >= 1 && max_chunks >= 1, "chunk_plan_build: n={} c={} K_max={}", n, chunk_cap,
            max_chunks);
  ChunkPlan p;
  p.n = n;
  p.K = std::min(ceil_div(n, chunk_cap), max_chunks);
  p.c_eff = ceil_div(n, p.K);
  p.membership = membership;
  return p;
}

int64_t chunk_budget(int64_t max_chunks, int64_t window, int64_t n) {
  if (window >= n || n < 1) return max_chunks;
  return std::max<int64_t>(1, ceil_div(max_chunks * window, n));
}

int64_t ChunkPlan::chunk_of(int64_t token) const {
  return membership == ChunkMembership::ChunkMembership_strided ? token % K : token / c_eff;
}

int64_t chunk_recv_bound(int64_t W, int64_t k, int64_t c_eff) { return W * k * c_eff; }

uint64_t chunk_dispatch_bound_bytes(int64_t W, int64_t k, int64_t c_eff, int64_t H, uint64_t elem_bytes) {
  return 2 * static_cast<uint64_t>(chunk_recv_bound(W, k, c_eff)) * static_cast<uint64_t>(H) * elem_bytes;
}

}  // namespace fp
