// The routing sort (ops/moe_routing.h) and PipelinedLLEP's chunk order (ops/moe_chunk_order.h) on cuda: the
// two stable counting sorts of the routed copies. n tokens, k slots, E experts, m = n * k copies; P pieces,
// K chunks, W ranks, B block counters.
//
// Note [The device's routing sort]: a stable counting sort (Note [Counting sort in the offsets array] in
// backend/cpu/kernels/moe_routing.cpp) in one block: thread e counts expert e's copies, one thread scans
// the counts into the offsets, thread e places its copies in copy order. Integers only: the cpu's bits.
// Each thread reads all m indices (broadcast loads), O(E m) in all: ~10^7 loads for E = 256 and 8k
// tokens of k = 8, a fraction of a millisecond; a CUB radix sort by expert (stable) is the way past that.
// The cpu asserts every index in [0, E); here an index outside is counted by no expert, so
// expert_offsets[E] < m shows it (and the rows past it are left as they were).
//
// The chunk order is the cpu's two passes (backend/cpu/kernels/moe_chunk_order.cpp) on one device thread:
// O(m + P) dependent steps, correct and the cpu's bits, slow for large m (~a millisecond per 10^5 copies);
// a parallel version is a histogram and a scan per group, as the routing sort's CUB version would be. The
// cpu's checks of the pieces are not repeated here (the dispatch builds them on the host, where they are
// checked by the cpu path's tests); a piece out of range writes out of bounds.
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace fp::ops::cuda {

namespace {

// Note [The device's routing sort].
__global__ void routing_build_kernel(const int32_t* topk_idx, int64_t n, int64_t k, int64_t E, int32_t* rows,
                                     int32_t* slot_pos, int64_t* offsets) {
  const int64_t m = n * k;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int64_t cnt = 0;
    for (int64_t i = 0; i < m; ++i) cnt += topk_idx[i] == e;
    offsets[e + 1] = cnt;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    offsets[0] = 0;
    for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int64_t pos = offsets[e];
    for (int64_t i = 0; i < m; ++i)
      if (topk_idx[i] == e) {
        rows[pos] = static_cast<int32_t>(i / k);
        slot_pos[i] = static_cast<int32_t>(pos);
        ++pos;
      }
  }
}

// The cpu's moe_chunk_order, on one thread.
__global__ void chunk_order_kernel(const int32_t* rows, const int64_t* pieces, ChunkOrderSpec spec, int32_t* order,
                                   int32_t* tokens, int64_t* group_offsets, int64_t* block_counts) {
  const int64_t P = spec.P, K = spec.K, c_eff = spec.c_eff, W = spec.W, B = spec.B, G = K * W;
  const auto chunk_of = [&](int64_t r) {
    const int64_t t = rows[r];
    return spec.strided ? t % K : t / c_eff;
  };
  for (int64_t g = 0; g <= G; ++g) group_offsets[g] = 0;
  for (int64_t b = 0; b < B; ++b) block_counts[b] = 0;
  for (int64_t p = 0; p < P; ++p) {
    const int64_t* pc = pieces + 5 * p;
    const int64_t begin = pc[0], stop = pc[1], dest = pc[2], base = pc[3], stride = pc[4];
    for (int64_t r = begin; r < stop; ++r) {
      const int64_t i = chunk_of(r), g = i * W + dest;
      if (g + 2 <= G) ++group_offsets[g + 2];
      ++block_counts[base + i * stride];
    }
  }
  for (int64_t g = 1; g <= G; ++g) group_offsets[g] += group_offsets[g - 1];
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

}  // namespace

void moe_routing_build(const ExecContext& c, const int32_t* topk_idx, int64_t n, int64_t k, int64_t E, int32_t* rows,
                       int32_t* slot_pos, int64_t* expert_offsets) {
  if (E < 1) cuda_refuse("moe_routing_build", "no experts");
  routing_build_kernel<<<1, 1024, 0, stream_of(c)>>>(topk_idx, n, k, E, rows, slot_pos, expert_offsets);
  launched("moe_routing_build");
}

void moe_chunk_order(const ExecContext& c, const int32_t* rows, const int64_t* pieces, ChunkOrderSpec spec,
                     int32_t* order, int32_t* tokens, int64_t* group_offsets, int64_t* block_counts) {
  if (!(spec.m >= 0 && spec.P >= 0 && spec.K >= 1 && spec.W >= 1 && spec.B >= 0 && (spec.strided || spec.c_eff >= 1)))
    cuda_refuse("moe_chunk_order", "a spec with m, P, B >= 0, K, W >= 1 and c_eff >= 1 unless strided");
  if (spec.m > INT32_MAX) cuda_refuse("moe_chunk_order", "more copies than int32 rows hold");
  chunk_order_kernel<<<1, 1, 0, stream_of(c)>>>(rows, pieces, spec, order, tokens, group_offsets, block_counts);
  launched("moe_chunk_order");
}

}  // namespace fp::ops::cuda
