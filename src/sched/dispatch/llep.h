// What LLEP (llep.cpp) and PipelinedLLEP (pipelined_llep.cpp) share: the layer's plan from the
// all-gathered counts, the exchange of spilled experts' weights and of their gradients, and the
// statistics the benchmark reports. Internal to src/sched/dispatch (dispatch.h is the interface).
//
// Legend: m routed copies of this rank, H hidden, I expert width, E experts, W ranks, E_p = E / W,
// G guest experts of this rank (computed here, owned elsewhere), P = 3 I H floats of one expert's
// weights (gate (I, H), up (I, H), down (H, I), packed in that order).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sched/dispatch/dispatch.h"
#include "model/expert_ffn.h"
#include "sched/dispatch/llep_plan.h"

namespace fp {

LlepParams llep_params(const DispatchSchedule& d);

// One layer's plan, the same on every rank.
struct LlepLayer {
  LlepPlan plan;
  std::vector<int64_t> counts;     // (W, E) copies of expert e routed by source rank s
  std::vector<LlepPiece> pieces;   // this rank's copies, by expert then position: where each piece goes
  std::vector<int64_t> guests;     // (G) experts computed here and owned elsewhere, ascending (so by home)
  int64_t n_max = 0;               // the most tokens any rank has (chunking must agree on every rank)
};
// Collective (all-gather of the E counts and the token count): offsets (E + 1) rows of each expert in this rank's xs,
// the copies of `tokens` of the rank's tokens (MoeChunk::n).
void llep_layer_build(StepContext& s, const LlepParams& p, std::span<const int64_t> offsets, int64_t tokens,
                      LlepLayer& out);

// The weights of this rank's guest experts, received point-to-point from their homes, and their
// gradients, sent home in backward and added there to the owner's (docs/design.md: "A rank that computes
// a foreign expert receives that expert's weights point-to-point ... in backward, sends the weight
// gradients home, where they are added to the native ones").
//
// Transfers go in W - 1 rounds of send_recv_start: in round r this rank sends to rank + r and receives
// from rank - r (what each pair exchanges follows from the plan, which every rank holds). All rounds
// are started at once and waited for together, so they run during the token all-to-all that the
// caller issues in between. Buffers: category comm (transient copies for communication).
class GuestExperts {
 public:
  // Starts the weight transfers of layer lp under plan L (collective). Allocates w (G, P) and the
  // packed copies of this rank's experts that other ranks compute (staging (S, P)).
  void weights_start(StepContext& s, const LayerParams& lp, const LlepLayer& L);
  // Waits for them; frees the staging copies.
  void weights_wait(StepContext& s);
  // Guest j's weights; gradients go to the grads buffer (grads_zero must have run for d_* to be set).
  ExpertWeights weights(int64_t j) const;
  int64_t count() const { return static_cast<int64_t>(guests_.size()); }
  // Allocates the gradient buffer (G, P), zeroed.
  void grads_zero(StepContext& s);
  // Starts sending the guest gradients home (collective) and receiving, for this rank's experts, the
  // gradients their guests computed (staging (S, P)).
  void grads_start(StepContext& s);
  // Waits; adds the received gradients into lp's owned experts (in a fixed order: ascending expert,
  // then ascending guest rank); frees the gradient and staging buffers.
  void grads_finish(StepContext& s, const LayerParams& lp);
  // Frees the received weights.
  void release();

 private:
  // Round r: (expert, peer) pairs this rank sends and receives, in order.
  void rounds_build(const StepContext& s, const LlepLayer& L);

  std::vector<int64_t> guests_;  // (G) as in LlepLayer
  std::vector<int64_t> out_;     // (S) this rank's experts in the order they are packed: round, then expert
  std::vector<int64_t> out_first_;  // (W + 1) out_ of round r: [first[r], first[r+1]) (round 0 empty)
  std::vector<int64_t> in_start_, in_n_;  // (W) guests_ received in round r: in_n_[r] from in_start_[r]
  FfnDims dims_;                          // the experts' FFN (expert_packed_size: P_)
  int64_t P_ = 0;                         // elements of one expert's packed weights (model/expert_ffn.h)
  int64_t H_ = 0, I_ = 0;
  Tensor w_;                     // (G, P) received weights
  Tensor g_;                     // (G, P) guest gradients
  Tensor staging_;               // (S, P) packed weights out, or gradients in
  std::vector<CommRequest> reqs_;
};

// What the benchmark reports of the last forward of an llep or pipelined_llep dispatch.
struct LlepStats {
  bool active = false;            // the plan spilled (imbalance >= lambda)
  double imbalance = 1.0;         // max / mean of the native rank loads
  double load_ratio = 1.0;        // max / mean of the rank loads under the plan
  int64_t guests = 0;             // guest experts of this rank
  // pipelined_llep only
  int64_t chunks = 0;             // K
  int64_t c_eff = 0;
  double chunk_send_ratio = 0;    // max over chunks of this rank's largest send to one rank / its mean send per rank
  int64_t chunk_recv_max = 0;     // the most rows this rank received in one chunk
  int64_t chunk_recv_bound = 0;   // W * k * c_eff
  uint64_t chunk_bound_bytes = 0; // 2 * W * k * c_eff * H * 4: the launch-time bound of the expert-side buffers
  uint64_t chunk_peak_bytes = 0;  // the most bytes of expert-side chunk buffers held at once (tracked at alloc)
};
// The base of both variants: their statistics.
class LlepDispatchBase : public ExpertDispatch {
 public:
  const LlepStats& stats() const { return stats_; }

 protected:
  LlepStats stats_;
};
// The statistics of an llep or pipelined_llep dispatch; null for other variants.
const LlepStats* llep_stats(const ExpertDispatch& d);


// The factories (registered in dispatch.cpp).
std::unique_ptr<ExpertDispatch> dispatch_llep_create(const DispatchSchedule& sched);
// s.n: tokens per rank (the same on every rank); the largest window the MoE block hands over is
// min(s.n, sched.token_chunk) (all s.n when token_chunk is 0). Checks at launch that the chunk bound fits the device.
std::unique_ptr<ExpertDispatch> dispatch_pipelined_llep_create(const DispatchSchedule& sched, const StepContext& s);

}  // namespace fp
