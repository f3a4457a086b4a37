// The chunk order of PipelinedLLEP (sched/dispatch/pipelined_llep.cpp): a rank's routed copies, in
// expert order, stably sorted by (chunk, destination rank), a kernel of the table (backend/kernels.h),
// so the order is built where the rows lie; only the counts go to the host (the dispatch sizes its
// buffers and exchanges by them), as the routing sort's offsets (ops/moe_routing.h).
// m routed copies, P pieces, K chunks, W ranks, B block counters.
//
// A piece is a range of rows going to one destination (LLEP's plan, sched/dispatch/llep.h); the pieces
// come in row order and tile [0, m). Piece p is (begin, end, dest, base, stride), five int64: rows
// [begin, end) go to rank dest in [0, W), and its rows of chunk i are counted in block counter
// base + i stride (in [0, B)): the dispatch lays its counters out per destination as it exchanges them.
// A row's chunk is its token's: t / c_eff (contiguous) or t mod K (strided); it must lie in [0, K).
#pragma once

#include <cstdint>

namespace fp::ops {

// The contract of each kernel: its signature, shapes, dtypes and what must hold bit for bit. A backend's
// table entry adds an ExecContext first (backend/kernels.h); each backend implements it in its own room
// (backend/cpu/kernels, backend/cuda).

// The sizes and options of a chunk order.
struct ChunkOrderSpec {
  int64_t m = 0;         // routed copies (rows)
  int64_t P = 0;         // pieces
  int64_t K = 1;         // chunks
  int64_t c_eff = 0;     // tokens per chunk when contiguous
  bool strided = false;  // a token's chunk is t mod K, else t / c_eff
  int64_t W = 1;         // ranks
  int64_t B = 0;         // block counters
};

// rows (m) the token of each copy in expert order, pieces (P, 5) as above ->
//   order (m): the row indices sorted by group g = chunk * W + dest, within a group by row (stable);
//   tokens (m), when not null: rows[order[j]];
//   group_offsets (K W + 1): group g is order[group_offsets[g], group_offsets[g + 1]);
//   block_counts (B): the rows of each block counter.
// Every output is overwritten. Asserts that the pieces tile [0, m), that every dest, counter and chunk is
// in range. Deterministic; needs no workspace (Note [Counting sort in the offsets array] in
// backend/cpu/kernels/moe_routing.cpp).
using moe_chunk_order_fn = void(const int32_t* rows, const int64_t* pieces, ChunkOrderSpec spec, int32_t* order,
                                int32_t* tokens, int64_t* group_offsets, int64_t* block_counts);

}  // namespace fp::ops

namespace fp::ops {}  // namespace fp::ops
