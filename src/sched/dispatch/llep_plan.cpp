// LLEP assignment plan and route mapping (docs/design.md, "PipelinedLLEP"). Pure host arithmetic.
// Legend: E experts, W expert-parallel ranks, home(e) = e / (E / W), load (E), counts (W, E).
#include "sched/dispatch/llep_plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace fp {

std::vector<int32_t> LlepPlan::guests(int64_t e) const {
  std::vector<int32_t> out;
  for (int64_t i = interval_first[e]; i < interval_first[e + 1]; ++i)
    if (intervals[i].rank != home(e)) out.push_back(intervals[i].rank);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

double LlepPlan::load_ratio() const {
  const int64_t total = std::accumulate(rank_load.begin(), rank_load.end(), int64_t{0});
  if (total == 0) return 1.0;
  const int64_t mx = *std::max_element(rank_load.begin(), rank_load.end());
  return static_cast<double>(mx) * static_cast<double>(W) / static_cast<double>(total);
}

namespace {

// Appends [start, end) on rank to e's pieces, merging with the previous piece when it continues it
// on the same rank (one GEMM per expert and rank where the plan allows).
void interval_push(std::vector<LlepInterval>& v, int32_t rank, int64_t start, int64_t end) {
  if (end <= start) return;
  if (!v.empty() && v.back().rank == rank && v.back().end == start) {
    v.back().end = end;
    return;
  }
  v.push_back({rank, start, end});
}

}  // namespace

LlepPlan llep_plan_build(const int64_t* load, int64_t E, int64_t W, const LlepParams& params) {
  FP_ASSERT(W >= 1 && E >= W && E % W == 0, "llep_plan_build: E={} W={}", E, W);
  FP_ASSERT(params.alpha > 0 && params.min_tokens_per_gemm >= 1, "llep_plan_build: alpha={} m={}", params.alpha,
            params.min_tokens_per_gemm);
  LlepPlan p;
  p.E = E;
  p.W = W;
  std::vector<int64_t> native(static_cast<size_t>(W), 0);  // (W) routes of each rank's own experts
  int64_t total = 0;
  for (int64_t e = 0; e < E; ++e) {
    FP_ASSERT(load[e] >= 0, "llep_plan_build: load[{}] = {}", e, load[e]);
    native[p.home(e)] += load[e];
    total += load[e];
  }
  if (total > 0) {
    const int64_t mx = *std::max_element(native.begin(), native.end());
    p.imbalance = static_cast<double>(mx) * static_cast<double>(W) / static_cast<double>(total);
  }
  p.active = total > 0 && W > 1 && p.imbalance >= params.lambda;

  // Per-expert pieces, gathered in visiting order, laid out by expert at the end.
  std::vector<std::vector<LlepInterval>> per_expert(static_cast<size_t>(E));
  if (!p.active) {
    for (int64_t e = 0; e < E; ++e) interval_push(per_expert[e], p.home(e), 0, load[e]);
    p.rank_load = native;
  } else {
    p.cap = std::max<int64_t>(static_cast<int64_t>(std::floor(params.alpha * static_cast<double>(total / W))), 1);
    std::vector<int64_t> pending = native;                     // (W) native work not yet placed
    std::vector<int64_t> assigned(static_cast<size_t>(W), 0);  // (W) work placed so far
    auto eff = [&](int64_t g) { return assigned[g] + pending[g]; };

    std::vector<int64_t> order;  // routed experts by load descending, ties by lower id
    for (int64_t e = 0; e < E; ++e)
      if (load[e] > 0) order.push_back(e);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return load[a] > load[b]; });

    std::vector<int32_t> others;  // (W - 1) the ranks other than the home, by eff then id
    others.reserve(static_cast<size_t>(W));
    for (int64_t e : order) {
      const int64_t n = load[e];
      const int32_t g0 = p.home(e);
      pending[g0] -= n;
      const int64_t avail = p.cap - eff(g0);
      if (avail >= n) {
        interval_push(per_expert[e], g0, 0, n);
        assigned[g0] += n;
        continue;
      }
      const int64_t keep = std::max<int64_t>(avail, 0);
      interval_push(per_expert[e], g0, 0, keep);
      assigned[g0] += keep;
      int64_t off = keep, rest = n - keep;

      others.clear();
      for (int32_t g = 0; g < W; ++g)
        if (g != g0) others.push_back(g);
      std::stable_sort(others.begin(), others.end(), [&](int32_t a, int32_t b) { return eff(a) < eff(b); });
      for (int32_t g : others) {
        const int64_t room = p.cap - eff(g);
        if (room <= 0) continue;
        const int64_t take = std::min(rest, room);
        // A piece below m that leaves work is not worth its own GEMM and weight transfer.
        if (take < params.min_tokens_per_gemm && take < rest) continue;
        interval_push(per_expert[e], g, off, off + take);
        assigned[g] += take;
        off += take;
        rest -= take;
        if (rest == 0) break;
      }
      // Forced remainder: no rank had room (or only for pieces below m).
      if (rest > 0) {
        interval_push(per_expert[e], others.front(), off, n);
        assigned[others.front()] += rest;
      }
    }
    p.rank_load = assigned;
  }

  p.interval_first.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) {
    std::vector<LlepInterval>& v = per_expert[e];
    // Pieces are pushed in ascending start already (home first, then spills); keep the contract explicit.
    std::sort(v.begin(), v.end(), [](const LlepInterval& a, const LlepInterval& b) { return a.start < b.start; });
    p.intervals.insert(p.intervals.end(), v.begin(), v.end());
    p.interval_first[e + 1] = static_cast<int64_t>(p.intervals.size());
  }
  return p;
}

void llep_pieces(const LlepPlan& plan, const int64_t* counts, int32_t src, std::vector<LlepPiece>& out) {
  const int64_t E = plan.E, W = plan.W;
  FP_ASSERT(src >= 0 && src < W, "llep_pieces: src={} W={}", src, W);
  out.clear();
  for (int64_t e = 0; e < E; ++e) {
    int64_t base = 0;  // global position of src's first copy of e
    for (int32_t s = 0; s < src; ++s) base += counts[s * E + e];
    const int64_t lo = base, hi = base + counts[src * E + e];
    if (hi == lo) continue;
    int64_t covered = 0;
    for (int64_t i = plan.interval_first[e]; i < plan.interval_first[e + 1]; ++i) {
      const LlepInterval& iv = plan.intervals[i];
      const int64_t a = std::max(lo, iv.start), b = std::min(hi, iv.end);
      if (a < b) {
        out.push_back({static_cast<int32_t>(e), iv.rank, a - base, b - base});
        covered += b - a;
      }
    }
    FP_ASSERT(covered == hi - lo, "llep_pieces: source {} expert {}: {} of {} copies planned (counts disagree with "
              "the plan's loads)", src, e, covered, hi - lo);
  }
}

}  // namespace fp
