// LLEP, least-loaded expert parallelism (docs/design.md, "PipelinedLLEP"): the assignment plan of expert
// work to ranks, and the mapping of every routed copy to the rank that computes it. Pure host
// arithmetic on global counts: every rank holds the same counts (after the all-reduce / all-gather of
// the dispatch), so every rank builds the same plan, bit for bit.
//
// Legend: E experts, W expert-parallel ranks (E_p in docs/design.md), expert e's home rank is
// e / (E / W); load[e] routed copies of expert e over all ranks; counts (W, E) the copies of expert e
// routed by source rank s.
//
// Global order of an expert's copies: source ranks in order, and within a source the local order
// after the stable sort by expert (ops::moe_routing_build: tokens in order, then slots). The plan cuts
// each expert's [0, load[e]) into intervals, each computed by one rank; a copy goes to the rank whose
// interval holds its global position.
#pragma once

#include <cstdint>
#include <vector>

namespace fp {

struct LlepParams {
  double lambda = 1.3;                // llep.lambda: plan only when max/mean rank load >= lambda
  double alpha = 1.0;                 // llep.alpha: cap = max(floor(alpha * floor(total / W)), 1)
  int64_t min_tokens_per_gemm = 1024; // llep.min_tokens_per_gemm (m): no spilled piece below m that leaves work
};

// [start, end) of one expert's global order, computed on `rank`.
struct LlepInterval {
  int32_t rank = 0;
  int64_t start = 0, end = 0;
};

struct LlepPlan {
  int64_t E = 0, W = 0;
  bool active = false;     // false: below lambda, standard EP (every expert at home)
  double imbalance = 1.0;  // max / mean of the native rank loads (1 when nothing is routed)
  int64_t cap = 0;         // routes a rank should compute at most (active plans)
  std::vector<int64_t> interval_first;   // (E + 1): expert e's intervals are [first[e], first[e+1])
  std::vector<LlepInterval> intervals;   // ascending start, covering [0, load[e]); none for load 0
  std::vector<int64_t> rank_load;        // (W) routes each rank computes under the plan

  int64_t experts_per_rank() const { return E / W; }
  int32_t home(int64_t e) const { return static_cast<int32_t>(e / (E / W)); }
  // Ranks that compute expert e without owning it (each once, ascending): they need e's weights.
  std::vector<int32_t> guests(int64_t e) const;
  // max / mean of rank_load (1 when nothing is routed).
  double load_ratio() const;
};

// load (E) global copies per expert. Asserts W >= 1, E % W == 0, loads >= 0, alpha > 0, m >= 1.
// Inactive (imbalance < lambda, or nothing routed): one home interval per routed expert.
LlepPlan llep_plan_build(const int64_t* load, int64_t E, int64_t W, const LlepParams& params);

// Consecutive local copies of one expert from one source going to one rank: the source's copies of
// `expert` at local positions [begin, end) (0 = its first copy of that expert).
struct LlepPiece {
  int32_t expert = 0;
  int32_t dest = 0;
  int64_t begin = 0, end = 0;
};

// The pieces of source rank src, by expert ascending then begin (so the concatenation is the
// source's expert order). counts (W, E). Empty pieces are omitted.
void llep_pieces(const LlepPlan& plan, const int64_t* counts, int32_t src, std::vector<LlepPiece>& out);

}  // namespace fp
