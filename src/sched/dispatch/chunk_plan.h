// PipelinedLLEP chunking (docs/design.md, "PipelinedLLEP"): which of a source's tokens travel in which
// chunk, and what that bounds. Pure host arithmetic; identical on every rank because every rank has
// the same n (tokens per rank) and the same settings.
//
// Legend: n tokens per source rank (N in docs/design.md), k top-k, W expert-parallel ranks (E_p), H hidden,
// c = pipelined.chunk_cap, K_max = pipelined.max_chunks.
//   K = min(ceil(n / c), K_max), c_eff = ceil(n / K)
//   contiguous: chunk i = tokens [i c_eff, (i + 1) c_eff)
//   strided:    chunk i = tokens {i, i + K, i + 2K, ...}   (spreads a skewed prefix over every chunk)
// Either way a chunk holds at most c_eff tokens of each source, so a destination receives at most
// W * k * c_eff copies per chunk, whatever the router does, and the chunk's dispatch buffers (received
// copies and their expert outputs) are at most chunk_dispatch_bound_bytes: fixed at launch.
#pragma once

#include <cstdint>

namespace fp {

enum class ChunkMembership { ChunkMembership_strided, ChunkMembership_contiguous };

struct ChunkPlan {
  int64_t n = 0;      // tokens per source
  int64_t K = 1;      // chunks (>= 1)
  int64_t c_eff = 0;  // most tokens of one source in one chunk
  ChunkMembership membership = ChunkMembership::ChunkMembership_strided;

  // The chunk of one of a source's tokens (what pipelined_llep.cpp sorts its rows by).
  int64_t chunk_of(int64_t token) const;
};

// pipelined.max_chunks is a budget per layer: when the MoE block hands the dispatch a window of
// `window` of a source's n tokens at a time (Note [The MoE token side in chunks] in model/moe_block.cpp),
// each window gets its share, ceil(max_chunks window / n), at least 1, so a layer makes about as many
// chunk exchanges as without windows and c_eff stays near n / max_chunks.
int64_t chunk_budget(int64_t max_chunks, int64_t window, int64_t n);

// Asserts n >= 1, chunk_cap >= 1, max_chunks >= 1 (the config checks the user's values).
ChunkPlan chunk_plan_build(int64_t n, int64_t chunk_cap, int64_t max_chunks, ChunkMembership membership);

// The most copies a destination receives in one chunk: W * k * c_eff.
int64_t chunk_recv_bound(int64_t W, int64_t k, int64_t c_eff);
// The dispatch buffers of one chunk at the bound: 2 * W * k * c_eff * H * elem_bytes.
uint64_t chunk_dispatch_bound_bytes(int64_t W, int64_t k, int64_t c_eff, int64_t H, uint64_t elem_bytes);

}  // namespace fp
