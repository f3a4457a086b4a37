// Internal to src/plan: the replay of one step's allocation sequence (Note [Why the planner replays
// instead of summing] in plan/replay.h). step_plan.cpp drives the step like model.cpp drives the
// model; block_plan.cpp holds the blocks and heads like model/*_block.cpp and sched/vocab/*.cpp.
// Legend: N tokens per rank, H hidden, Q = nh*hd, Kv = nkv*hd, E experts, k top-k, m = N*k routes
// sent, Re rows an expert side computes (m, or R received with expert parallelism), I expert FFN
// width, V vocabulary, L layers.
#pragma once

#include <algorithm>
#include <vector>

#include "plan/dispatch_counts.h"
#include "plan/plan.h"

namespace fp::plan {

// The replay for resolved schedules (optim is never auto here); plan_step (plan.cpp) resolves the
// baseline's optimizer rule, then labels the result.
Result step_replay(const Input& in, const Schedules& sched, PeakReplay* device_replay, PeakReplay* host_replay);

namespace detail {

inline constexpr Category kParams = Category::Category_params;
inline constexpr Category kGrads = Category::Category_grads;
inline constexpr Category kOpt = Category::Category_optimizer;
inline constexpr Category kAct = Category::Category_activations;
inline constexpr Category kCkpt = Category::Category_checkpoints;
inline constexpr Category kDisp = Category::Category_dispatch;
inline constexpr Category kVocab = Category::Category_vocab;
inline constexpr Category kComm = Category::Category_comm;
inline constexpr Category kWs = Category::Category_workspace;
using Id = PeakReplay::Id;
inline constexpr Id kNone = PeakReplay::kNone;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows of rank r's shard of V rows over P ranks: ceil(V / P), fewer (or none) on the last ranks
// (sched/vocab/ring_dtp.h, ring_dtp_shard).
inline int64_t shard_rows(int64_t V, int64_t P, int64_t r) {
  const int64_t Vp = ceil_div(V, P), v0 = std::min(V, (r % P) * Vp);
  return std::min(Vp, V - v0);
}


// Shared by every phase of one plan.
struct Step {
  Step(const ModelConfig& c, const Settings& s, const Schedules& sc, PeakReplay& dev, PeakReplay& host)
      : cfg(c), set(s), sched(sc), d(dev), h(host) {}
  const ModelConfig& cfg;
  const Settings& set;
  const Schedules& sched;
  PeakReplay& d;  // device
  PeakReplay& h;  // host
  Sizes z;
  int64_t N = 0, H = 0, Q = 0, Kv = 0, nh = 0, nkv = 0, E = 0, k = 0, I = 0, V = 0, L = 0, m = 0, Re = 0;
  bool fsdp = false;   // fsdp > 1: parameters sharded by rows, each unit gathered before use
  bool ep = false;     // ep > 1: experts spread over ranks, all-to-all send/receive buffers
  const DispatchCounts* dc = nullptr;  // ep > 1: this rank's dispatch sizes (R, G, S, chunks)
  int64_t rank = 0;                    // the rank replayed (its vocabulary shard's rows, Ring-DTP)
  int64_t unit_params = 0; // fsdp > 1: parameters of one gathered layer unit

  // Bytes of n elements of each kind.
  uint64_t act(int64_t n) const { return static_cast<uint64_t>(n) * dtype_size(set.dtypes.activations); }
  uint64_t f32(int64_t n) const { return static_cast<uint64_t>(n) * 4; }
  uint64_t i32(int64_t n) const { return static_cast<uint64_t>(n) * 4; }
  uint64_t rt(int64_t n) const { return static_cast<uint64_t>(n) * dtype_size(set.dtypes.router); }
  uint64_t lg(int64_t n) const { return static_cast<uint64_t>(n) * dtype_size(set.dtypes.logits); }
  uint64_t wt(int64_t n) const { return static_cast<uint64_t>(n) * dtype_size(set.dtypes.weights); }
  uint64_t gr(int64_t n) const { return static_cast<uint64_t>(n) * dtype_size(set.dtypes.grads); }
};

// What a block keeps for its backward (keep = true: the recompute of the backward pass).
struct AttnIds {
  Id h1 = kNone, rstd1 = kNone, q_raw = kNone, k_raw = kNone, v = kNone, q = kNone, k = kNone, rstd_q = kNone,
     rstd_k = kNone, o = kNone, lse = kNone;
};
struct MoeIds {
  Id h2 = kNone, rstd2 = kNone, probs = kNone, topk_idx = kNone, topk_w = kNone, rows = kNone, slot_pos = kNone;
  Id x_exp = kNone;  // (Re, H) rows in expert order on the expert side (moe.xs, or ep.x grouped)
  Id perm = kNone, unperm = kNone;  // (R) i32, standard EP's receive-side grouping
  Id g = kNone, u = kNone, act = kNone;  // (Re, I)
  Id ys = kNone;     // (m, H) expert outputs back in the token side's expert order (moe.ys, or moe.xs)
  // llep: send_rows, send_pos (m) i32; pipelined_llep: pllep.rows, pllep.tokens (m) i32; both: the
  // guest experts' weights (G, 3 I H) and, per chunk, the kept FFN intermediates (r_i, I).
  Id idx_a = kNone, idx_b = kNone, guest_w = kNone;
  std::vector<Id> cg, cu, cact;
};

// model/attention_block.cpp: returns x1 (N, H); with keep, everything backward needs stays in a.
Id attn_forward(Step& s, AttnIds& a, bool keep);
void attn_backward(Step& s, AttnIds& a);
// model/moe_block.cpp with sched/dispatch/local.cpp (one rank), standard.cpp, llep.cpp or
// pipelined_llep.cpp (ep > 1, sizes from s.dc): returns x2 (N, H) in out_cat.
Id moe_forward(Step& s, MoeIds& a, bool keep, Category out_cat);
void moe_backward(Step& s, MoeIds& a);
// sched/vocab/head_full.cpp, and sched/vocab/ring_dtp.cpp with ring_dtp_ring.cpp (P = W ranks).
void head_full(Step& s);
void head_ring(Step& s);

}  // namespace detail
}  // namespace fp::plan
