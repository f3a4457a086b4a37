// Expert dispatch, the interface the MoE block calls (model/moe_block.cpp): the schedules that take a rank's routed token copies to the experts that compute
// them and bring the outputs back (docs/design.md, "PipelinedLLEP"). One interface, declared here where the model
// uses it; the local variant is the model's own (model/local_dispatch.cpp), the others are schedules,
// implemented in sched/dispatch/ and made by expert_dispatch_create (sched/dispatch/dispatch.h):
//
//   local           (model/local_dispatch.cpp) W = 1: every expert is here; the expert FFN runs on xs
//                                   directly, no comm: the model's plain single-rank path.
//   standard        (standard.cpp)  expert parallelism: rank r owns experts [r E_p, (r+1) E_p)
//                                   (model/layout.h); count exchange, all-to-all-v of the rows, a
//                                   receive-side permutation grouping each local expert's rows, the
//                                   FFN, the permutation back, all-to-all-v back. Its receive buffers
//                                   are sized by the actual routing, so they grow under skew: the
//                                   plain variant that PipelinedLLEP flattens.
//   llep            (llep.cpp)      LLEP: the least-loaded plan (llep_plan.h) moves pieces of hot experts
//                                   to other ranks with the experts' weights; standard below lambda.
//   pipelined_llep  (pipelined_llep.cpp) LLEP's plan dispatched in K chunks (chunk_plan.h): what a rank
//                                   receives at once is bounded at launch. Reads MoeChunk::rows (the token
//                                   of each row of xs, on the device) for chunk membership, in the kernel
//                                   ops/moe_chunk_order.h; on meta under a profile, the profile's closed
//                                   form (model/routing.h).
//
// Legend: n tokens on this rank, k experts per token, m = n * k routed copies, H hidden, I expert FFN
// width, E experts, W ranks, E_p = E / W, R = rows this rank computes (under standard: every route of
// every rank that lands on its experts).
//
// Contract of every variant
// - Input: xs (m, H), this rank's routed copies in expert order (the counting sort of
//   ops/moe_routing.h: expert by expert, and within an expert tokens then slots in order), category
//   activations (the token side: what the rank itself routes); offsets (E + 1) on the host: the rows
//   of global expert e are [offsets[e], offsets[e+1]). The counts are real on every backend (on meta
//   they come from the routing profile). chunk (MoeChunk): which of the rank's tokens xs holds the
//   copies of; the same for a forward and the backward of its acts.
// - forward returns ys (m, H) in category activations, in the same order: ys[i] = expert_e(xs[i]) for the
//   expert e whose range holds i. Ownership of xs passes to the call: the variant frees it as soon as
//   it is done with it (or keeps it in its DispatchActs when backward needs it).
// - keep == nullptr (the checkpointed forward): everything the call allocated, except ys, is freed
//   before it returns. keep != nullptr (the recompute before backward): *keep receives the variant's
//   own DispatchActs subclass with what its backward needs.
// - backward takes dys (m, H) (d loss / d ys, formed in place in ys's buffer by the MoE block,
//   ownership passes) and the acts of that forward (freed here), and returns dxs (m, H) = d loss / d xs,
//   category activations (it may be dys's buffer); only what a rank receives is category dispatch.
//   Weight gradients accumulate (+=) into lp's .g of the experts this rank owns, and only those: with W > 1 a variant
//   never dereferences lp.gate_proj[e] / up_proj[e] / down_proj[e] of an expert it does not own (they
//   may be nullptr). A variant that computes a foreign expert sends its weight gradient home.
// - Every rank calls forward and backward the same number of times in the same order (collectives
//   stay matched), also on meta, where data pointers are null, comm calls move nothing and the ledger
//   sees exactly the allocations of a cpu run with the same routing.
// - Deterministic: fixed order of every reduction (weight gradients accumulate row blocks in a fixed
//   order; the comm engine is deterministic for a fixed W).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "model/blocks.h"

namespace fp {

// The tokens one dispatch call serves, given by the MoE block (model/moe_block.cpp) with xs: the rank's
// tokens [t0, t0 + n), window number `index` of the block (Note [The MoE token side in chunks]; an
// unchunked block is the one window {0, 0, n}). Every field is the caller's and lives through the call.
struct MoeChunk {
  int64_t index = 0;  // the window's number in the block, 0 unchunked: per-window caches key on it
  int64_t t0 = 0;     // its first token among the rank's n
  int64_t n = 0;      // its tokens; every rank's windows have the same sizes (the collectives stay matched)
  // (m) i32 on the device: the token of each row of xs (expert order), counted from t0 (the routing sort's
  // rows, moe.rows); given to a forward of a variant that reads_rows() only, null otherwise and in backward.
  // No data on meta. With release_rows the block is done with them: the forward frees them (resets *rows)
  // as soon as it has read them, so they are not alive beside its buffers.
  Tensor* rows = nullptr;
  bool release_rows = false;
  // (n, H) the window's normed tokens (MoeActs::h2), offered to a forward with keep and to the backward
  // (null otherwise): a dispatch that sends rows again in backward may gather them from it (token of row
  // i: rows[i]) instead of keeping xs.
  const Tensor* h2 = nullptr;
};

// What the last forward moved, for tests and benchmarks (rows of H values).
struct DispatchStats {
  int64_t rows_sent = 0;      // rows of xs this rank sent to other ranks (0 with W = 1)
  int64_t rows_received = 0;  // R: rows this rank computed (its own included)
};

class ExpertDispatch {
 public:
  virtual ~ExpertDispatch() = default;
  virtual std::string_view name() const = 0;

  // xs (m, H) -> ys (m, H); see the contract above.
  virtual Tensor forward(StepContext& s, const LayerParams& lp, Tensor xs, std::span<const int64_t> offsets,
                         const MoeChunk& chunk, std::unique_ptr<DispatchActs>* keep) = 0;
  // dys (m, H) -> dxs (m, H); acts: what forward left in *keep (same offsets and chunk).
  virtual Tensor backward(StepContext& s, const LayerParams& lp, Tensor dys, std::span<const int64_t> offsets,
                          const MoeChunk& chunk, std::unique_ptr<DispatchActs> acts) = 0;

  // Whether forward reads MoeChunk::rows (the device rows, as pipelined_llep's chunk membership): the
  // MoE block keeps them alive into the call for such a variant only (Note [The routing sort on the
  // device] in model/moe_block.cpp); the others get a null MoeChunk::rows, the rows freed before.
  virtual bool reads_rows() const { return false; }
  // Forget what was built under a routing profile, for every number of tokens: with
  // StepContext::reroute_each_n, the MoE blocks now see another n (the last, shorter tile of Note
  // [Sequence-tiled layers]); otherwise what was built is kept by n (Note [One routing per token count] in
  // model/moe_block.cpp).
  virtual void profile_reset() {}

  const DispatchStats& last() const { return last_; }

 protected:
  DispatchStats last_;
};

// W = 1: the expert FFN in place (no comm).
// The W = 1 variant (model/local_dispatch.cpp): the MoE block's own when the step sets none.
std::unique_ptr<ExpertDispatch> dispatch_local_create();

}  // namespace fp
