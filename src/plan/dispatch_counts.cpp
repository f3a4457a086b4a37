// Per-rank dispatch sizes (dispatch_counts.h), as sched/dispatch/llep.cpp and pipelined_llep.cpp
// derive them on each rank of a run from the exchanged counts.
#include "plan/dispatch_counts.h"

#include <algorithm>

#include "core/error.h"
#include "model/routing.h"
#include "ops/moe_routing.h"
#include "plan/routing_counts.h"
#include "sched/dispatch/chunk_plan.h"

namespace fp::plan {

int64_t DispatchCounts::chunk_recv_max() const {
  return chunk_recv.empty() ? 0 : *std::max_element(chunk_recv.begin(), chunk_recv.end());
}

bool DispatchCounts::same_sizes(const DispatchCounts& o) const {
  return llep_active == o.llep_active && rows == o.rows && guests == o.guests && weights_out == o.weights_out &&
         K == o.K && c_eff == o.c_eff && chunk_send == o.chunk_send && chunk_recv == o.chunk_recv;
}

std::vector<DispatchCounts> dispatch_counts(const RoutingProfile& profile, int64_t N, int64_t k, int64_t E, int64_t W,
                                            DispatchKind kind, const LlepParams& llep, const ChunkSettings& chunks) {
  FP_CHECK(W >= 1 && E % W == 0, "the expert-parallel degree divides the number of experts",
           "{} experts over {} ranks", E, W);
  const int64_t m = N * k;
  const std::vector<int64_t> counts = routing_counts(profile, N, k, E);  // (E), the same on every rank
  std::vector<DispatchCounts> out(static_cast<size_t>(W));
  for (int32_t r = 0; r < W; ++r) out[r].rank = r;
  const int64_t per = E / W;
  if (W == 1) {
    out[0].rows = m;
    return out;
  }
  if (kind == DispatchKind::DispatchKind_standard) {
    for (int32_t r = 0; r < W; ++r)
      for (int64_t e = r * per; e < (r + 1) * per; ++e) out[r].rows += W * counts[e];
    return out;
  }

  // LLEP's plan over the global loads (every source routes alike: W times one rank's counts).
  std::vector<int64_t> load(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) load[e] = W * counts[e];
  const LlepPlan plan = llep_plan_build(load.data(), E, W, llep);
  for (int32_t r = 0; r < W; ++r) {
    DispatchCounts& d = out[r];
    d.llep_active = plan.active;
    for (int64_t e = 0; e < E; ++e)
      for (int64_t i = plan.interval_first[e]; i < plan.interval_first[e + 1]; ++i) {
        if (plan.intervals[i].rank == r && plan.home(e) != r) {
          ++d.guests;
          break;
        }
      }
  }
  // Weight sends: round by round, each own expert to each other rank holding one of its intervals.
  std::vector<bool> seen(static_cast<size_t>(W));
  for (int64_t e = 0; e < E; ++e) {
    const int32_t home = plan.home(e);
    std::fill(seen.begin(), seen.end(), false);
    for (int64_t i = plan.interval_first[e]; i < plan.interval_first[e + 1]; ++i) {
      const int32_t g = plan.intervals[i].rank;
      if (g != home && !seen[g]) {
        seen[g] = true;
        ++out[home].weights_out;
      }
    }
  }
  // Rows each rank computes: the plan's intervals (what every source's pieces add up to; below lambda
  // the home intervals, standard EP's rows).
  for (int64_t e = 0; e < E; ++e)
    for (int64_t i = plan.interval_first[e]; i < plan.interval_first[e + 1]; ++i)
      out[plan.intervals[i].rank].rows += plan.intervals[i].end - plan.intervals[i].start;
  if (kind == DispatchKind::DispatchKind_llep) return out;

  // PipelinedLLEP: a copy travels in its token's chunk. Expert e's global position p is copy
  // p mod c_e of source p / c_e (every source has the same c_e copies of e, in the same token order),
  // so an interval [a, b) holds whole rounds of e's copies (each adds e's chunk histogram) and at
  // most two partial rounds, walked copy by copy: O(m) for the whole world instead of O(W m).
  FP_CHECK(m < (int64_t{1} << 31), "plan a shorter context or more ranks",
           "{} routed copies per rank exceed the engine's int32 row ids", m);
  std::vector<int32_t> topk(static_cast<size_t>(m)), rows(static_cast<size_t>(m)), slot(static_cast<size_t>(m));
  std::vector<int64_t> offsets(static_cast<size_t>(E + 1));
  routing_profile_assign(profile, N, k, E, topk.data());
  ops::moe_routing_build(topk.data(), N, k, E, rows.data(), slot.data(), offsets.data());
  const ChunkPlan cp = chunk_plan_build(std::max<int64_t>(N, 1), chunks.chunk_cap, chunks.max_chunks,
                                        chunks.strided ? ChunkMembership::ChunkMembership_strided
                                                       : ChunkMembership::ChunkMembership_contiguous);
  const int64_t K = cp.K;
  std::vector<int32_t>& chunk = topk;  // (m) reused: the chunk of each local copy, in expert order
  for (int64_t j = 0; j < m; ++j) chunk[j] = static_cast<int32_t>(cp.chunk_of(rows[j]));
  std::vector<int64_t> send(static_cast<size_t>(K), 0);
  for (int64_t t = 0; t < N; ++t) send[cp.chunk_of(t)] += k;
  for (DispatchCounts& d : out) {
    d.K = K;
    d.c_eff = cp.c_eff;
    d.chunk_send = send;
    d.chunk_recv.assign(static_cast<size_t>(K), 0);
  }
  std::vector<int64_t> hist(static_cast<size_t>(K));  // (K) expert e's copies per chunk, one source
  for (int64_t e = 0; e < E; ++e) {
    const int64_t ce = offsets[e + 1] - offsets[e];
    if (ce == 0) continue;
    const int32_t* ch = chunk.data() + offsets[e];
    std::fill(hist.begin(), hist.end(), 0);
    for (int64_t q = 0; q < ce; ++q) ++hist[ch[q]];
    for (int64_t i = plan.interval_first[e]; i < plan.interval_first[e + 1]; ++i) {
      const LlepInterval& iv = plan.intervals[i];
      std::vector<int64_t>& recv = out[iv.rank].chunk_recv;
      int64_t p = iv.start;
      for (; p < iv.end && p % ce != 0; ++p) ++recv[ch[p % ce]];
      const int64_t rounds = (iv.end - p) / ce;
      if (rounds > 0)
        for (int64_t c = 0; c < K; ++c) recv[c] += rounds * hist[c];
      for (p += rounds * ce; p < iv.end; ++p) ++recv[ch[p % ce]];
    }
  }
  return out;
}

}  // namespace fp::plan
