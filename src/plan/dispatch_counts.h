// The sizes behind one rank's expert-dispatch buffers under each variant of sched/dispatch, in a
// world of W ranks that route their N tokens alike by a routing profile (a meta run's setting, and
// the benchmarks'): standard EP's receive count; LLEP's plan (llep_plan_build, the pure function the
// engine runs on the all-gathered counts) with the rows, guest experts and weight sends of each rank;
// PipelinedLLEP's per-chunk sends and receives (chunk_plan_build). Host arithmetic over the routing
// of one rank's N tokens (routing_profile_assign, moe_routing_build: the engine's own expert order).
// Legend: N tokens per rank, k top-k, E experts, W expert-parallel ranks, m = N k, K chunks.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "sched/dispatch/llep_plan.h"

namespace fp::plan {

enum class DispatchKind { DispatchKind_standard, DispatchKind_llep, DispatchKind_pipelined_llep };

struct ChunkSettings {
  int64_t chunk_cap = 1024;  // pipelined.chunk_cap: c
  int64_t max_chunks = 128;  // pipelined.max_chunks: K_max
  bool strided = true;       // pipelined.membership
};

// What one rank's dispatch allocates by, per layer (every layer routes alike under a profile).
struct DispatchCounts {
  int32_t rank = 0;
  bool llep_active = false;       // llep / pipelined_llep: the plan spilled (imbalance >= lambda)
  int64_t rows = 0;               // R: rows this rank computes (its own included)
  int64_t guests = 0;             // G: experts computed here and owned elsewhere (weights received)
  int64_t weights_out = 0;        // S: (own expert, other rank computing it) pairs: weights sent
  int64_t K = 0, c_eff = 0;       // pipelined_llep: chunks and tokens per source per chunk
  std::vector<int64_t> chunk_send;  // (K) m_i: routed copies this rank sends in chunk i
  std::vector<int64_t> chunk_recv;  // (K) r_i: rows this rank receives in chunk i
  int64_t chunk_recv_max() const;
  bool same_sizes(const DispatchCounts& o) const;  // everything but the rank
};

// The counts of every rank (W entries). W = 1 is the local dispatch: rows = m, nothing else.
// Throws fp::Error for the "router" profile and for m >= 2^31 (the engine's int32 row ids).
std::vector<DispatchCounts> dispatch_counts(const RoutingProfile& profile, int64_t N, int64_t k, int64_t E, int64_t W,
                                            DispatchKind kind, const LlepParams& llep, const ChunkSettings& chunks);

}  // namespace fp::plan
