// LLEP, least-loaded expert parallelism (docs/design.md, "PipelinedLLEP"; dispatch.h contract), and what
// it shares with PipelinedLLEP (llep.h): the layer plan, the guest experts' weights and gradients.
// Legend: m routed copies of this rank, H hidden, I expert width, E experts, W ranks, R rows this rank
// computes under the plan, G guest experts, P = 3 I H floats of one expert's weights.
//
// Forward (allocation order; category dispatch unless noted):
//   plan             all-gather of the (E) counts; llep_plan_build on every rank (the same plan)
//   below lambda     the standard dispatch, unchanged (standard.cpp)
//   llep.send_rows, llep.send_pos (m) i32   xs rows in destination order, and back
//   llep.guest_w (G, P), llep.w_out (S, P) (comm)   guest weights start (send_recv_start rounds)
//   llep.send (m, H)  xs gathered by destination (a piece of an expert may go to any rank); xs freed
//   llep.recv (R, H)  all-to-all-v; llep.send freed; the weight transfers complete (llep.w_out freed)
//   llep.perm, llep.unperm (R) i32, llep.x (R, H) grouped by expert (Note [Receive-side grouping] in
//                    standard.cpp); llep.recv freed
//   FFN              g, u, act (R, I) activations, llep.y (R, H)
//   llep.y_send (R, H) source-major; llep.back (m, H) all-to-all-v back; moe.ys (m, H) expert order
//                    (activations, as moe.xs: the rank's own routes, the same in every variant)
// Backward mirrors it; the guests' weight gradients (llep.guest_g (G, P), comm) start home during the
// all-to-all of the input gradients and are added to the owners' gradients after it.
#include "sched/dispatch/llep.h"

#include <algorithm>
#include <array>

#include "model/layout.h"

namespace fp {

LlepParams llep_params(const DispatchSchedule& d) { return {d.lambda, d.alpha, d.min_tokens_per_gemm}; }

void llep_layer_build(StepContext& s, const LlepParams& p, std::span<const int64_t> offsets, int64_t tokens,
                      LlepLayer& out) {
  const int W = s.ep.size(), me = s.ep.rank();
  const int64_t E = s.cfg.num_experts;
  FP_ASSERT(static_cast<int64_t>(offsets.size()) == E + 1);
  // One all-gather of (E + 1) numbers per rank: its copies per expert, then its token count.
  std::vector<int64_t> mine(static_cast<size_t>(E + 1));  // (E + 1)
  for (int64_t e = 0; e < E; ++e) mine[e] = offsets[e + 1] - offsets[e];
  mine[E] = tokens;
  std::vector<int64_t> all(static_cast<size_t>(W * (E + 1)));  // (W, E + 1)
  s.ep.all_gather(mine.data(), all.data(), E + 1, DType::DType_I64);
  out.counts.resize(static_cast<size_t>(W * E));
  out.n_max = 0;
  std::vector<int64_t> load(static_cast<size_t>(E), 0);  // (E) global copies per expert
  for (int r = 0; r < W; ++r) {
    for (int64_t e = 0; e < E; ++e) {
      out.counts[r * E + e] = all[r * (E + 1) + e];
      load[e] += out.counts[r * E + e];
    }
    out.n_max = std::max(out.n_max, all[r * (E + 1) + E]);
  }
  out.plan = llep_plan_build(load.data(), E, W, p);
  llep_pieces(out.plan, out.counts.data(), me, out.pieces);
  out.guests.clear();
  for (int64_t e = 0; e < E; ++e)
    if (out.plan.home(e) != me)
      for (int64_t i = out.plan.interval_first[e]; i < out.plan.interval_first[e + 1]; ++i)
        if (out.plan.intervals[i].rank == me) {
          out.guests.push_back(e);
          break;
        }
}

// ---- GuestExperts ---------------------------------------------------------------------------------

namespace {
// Row `row` of a (rows, P) buffer for the data channel (null for an empty buffer, or on meta).
void* comm_row(const Tensor& t, int64_t row, int64_t P) { return ptr_at(t.buf(), row * P).p; }
}  // namespace

void GuestExperts::rounds_build(const StepContext& s, const LlepLayer& L) {
  const int W = s.ep.size(), me = s.ep.rank();
  const LlepPlan& p = L.plan;
  guests_ = L.guests;
  out_.clear();
  out_first_.assign(static_cast<size_t>(W + 1), 0);
  in_start_.assign(static_cast<size_t>(W), 0);
  in_n_.assign(static_cast<size_t>(W), 0);
  const ExpertLayout mine = expert_layout(me, W, p.E);
  for (int r = 1; r < W; ++r) {
    const int dst = (me + r) % W, src = (me - r + W) % W;
    // Round r sends dst the weights of this rank's experts that dst computes, ascending ...
    for (int64_t e = mine.first; e < mine.first + mine.count; ++e)
      for (int64_t i = p.interval_first[e]; i < p.interval_first[e + 1]; ++i)
        if (p.intervals[i].rank == dst) {
          out_.push_back(e);
          break;
        }
    out_first_[r + 1] = static_cast<int64_t>(out_.size());
    // ... and receives src's experts that this rank computes: a run of guests_ (ascending = by home).
    int64_t j = 0;
    while (j < count() && p.home(guests_[j]) != src) ++j;
    in_start_[r] = j;
    while (j < count() && p.home(guests_[j]) == src) ++j;
    in_n_[r] = j - in_start_[r];
  }
}

void GuestExperts::weights_start(StepContext& s, const LayerParams& lp, const LlepLayer& L) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const int W = s.ep.size(), me = s.ep.rank();
  H_ = s.cfg.hidden_size;
  I_ = s.cfg.moe_intermediate_size;
  dims_ = expert_ffn_dims(s.cfg);
  P_ = expert_packed_size(dims_);
  rounds_build(s, L);
  const int64_t G = count(), S = static_cast<int64_t>(out_.size());
  w_ = be.alloc(kComm, {G, P_}, s.precision.params, "llep.guest_w");      // (G, P)
  staging_ = be.alloc(kComm, {S, P_}, s.precision.params, "llep.w_out");  // (S, P)
  for (int64_t j = 0; j < S; ++j) {
    expert_pack(K, dims_, expert_weights(lp, out_[j]), ptr_at(staging_.buf(), j * P_));
  }
  reqs_.clear();
  for (int r = 1; r < W; ++r)
    reqs_.push_back(s.ep_data.send_recv_start(
        be.compute_stream(), comm_row(staging_, out_first_[r], P_), (out_first_[r + 1] - out_first_[r]) * P_,
        (me + r) % W, comm_row(w_, in_start_[r], P_), in_n_[r] * P_, (me - r + W) % W, staging_.dtype()));
}

void GuestExperts::weights_wait(StepContext& s) {
  for (CommRequest& q : reqs_) s.ep_data.wait(q);
  reqs_.clear();
  staging_.reset();
}

ExpertWeights GuestExperts::weights(int64_t j) const {
  return expert_packed(dims_, ptr_at(w_.buf(), j * P_), g_.defined() ? ptr_at(g_.buf(), j * P_) : Buf{});
}

void GuestExperts::grads_zero(StepContext& s) {
  g_ = s.be.alloc(kComm, {count(), P_}, s.precision.grads, "llep.guest_g");  // (G, P)
  s.be.kernels().fill(g_.buf(), 0.0f, count() * P_);
}

void GuestExperts::grads_start(StepContext& s) {
  Backend& be = s.be;
  const int W = s.ep.size(), me = s.ep.rank();
  const int64_t S = static_cast<int64_t>(out_.size());
  staging_ = be.alloc(kComm, {S, P_}, s.precision.grads, "llep.g_in");  // (S, P) gradients of this rank's experts
  reqs_.clear();
  // The reverse of weights_start: round r sends rank + r the gradients of its experts (received from it
  // in weight round W - r) and receives from rank - r what was sent there in weight round W - r.
  for (int r = 1; r < W; ++r) {
    const int rb = W - r;
    reqs_.push_back(s.ep_data.send_recv_start(be.compute_stream(), comm_row(g_, in_start_[rb], P_), in_n_[rb] * P_,
                                              (me + r) % W, comm_row(staging_, out_first_[rb], P_),
                                              (out_first_[rb + 1] - out_first_[rb]) * P_, (me - r + W) % W,
                                              g_.dtype()));
  }
}

void GuestExperts::grads_finish(StepContext& s, const LayerParams& lp) {
  const ops::KernelLauncher K = s.be.kernels();
  for (CommRequest& q : reqs_) s.ep_data.wait(q);
  reqs_.clear();
  // Fixed order: ascending expert, then ascending guest rank (the guest of weight round r is rank + r).
  const int W = s.ep.size(), me = s.ep.rank();
  std::vector<std::array<int64_t, 3>> adds;  // (expert, guest rank, staging row)
  for (int r = 1; r < W; ++r)
    for (int64_t j = out_first_[r]; j < out_first_[r + 1]; ++j) adds.push_back({out_[j], (me + r) % W, j});
  std::sort(adds.begin(), adds.end());
  for (const auto& [e, guest, j] : adds) {
    expert_grads_add(K, dims_, expert_weights(lp, e), ptr_at(staging_.buf(), j * P_));
  }
  staging_.reset();
  g_.reset();
}

void GuestExperts::release() {
  w_.reset();
  g_.reset();
  staging_.reset();
}

// ---- LLEP -------------------------------------------------------------------------------------------

namespace {

struct LlepActs : DispatchActs {
  std::unique_ptr<DispatchActs> standard;  // below lambda: the standard dispatch's own acts
  LlepLayer layer;
  GuestExperts guests;                 // received weights kept for backward
  ExpertActs ffn;                      // x (R, H) grouped; g, u, act (R, I)
  Tensor send_rows, send_pos;          // (m) i32: xs row of each send slot, and its inverse
  Tensor perm, unperm;                 // (R) i32: grouped row <- source-major row, and its inverse
  std::vector<int64_t> send_elems, recv_elems;  // (W) floats to / from each rank
  std::vector<int64_t> group_experts;  // (G') experts computed here, ascending
  std::vector<int64_t> group_offsets;  // (G' + 1) grouped rows of each
};

class LlepDispatch : public LlepDispatchBase {
 public:
  explicit LlepDispatch(const DispatchSchedule& sched) : params_(llep_params(sched)), standard_(dispatch_standard_create()) {}
  std::string_view name() const override { return "llep"; }

  Tensor forward(StepContext& s, const LayerParams& lp, Tensor xs, std::span<const int64_t> offsets,
                 const MoeChunk& chunk, std::unique_ptr<DispatchActs>* keep) override {
    Backend& be = s.be;
    const ops::KernelLauncher K = be.kernels();
    const int64_t H = s.cfg.hidden_size, m = xs.dim(0);
    LlepActs scratch;
    LlepActs* a = &scratch;
    if (keep) {
      auto acts = std::make_unique<LlepActs>();
      a = acts.get();
      *keep = std::move(acts);
    }
    llep_layer_build(s, params_, offsets, chunk.n, a->layer);
    const LlepPlan& plan = a->layer.plan;
    stats_ = {plan.active, plan.imbalance, plan.load_ratio(), static_cast<int64_t>(a->layer.guests.size())};
    if (!plan.active) {  // below lambda: standard expert parallelism, unchanged
      Tensor ys = standard_->forward(s, lp, std::move(xs), offsets, chunk, keep ? &a->standard : nullptr);
      last_ = standard_->last();
      return ys;
    }
    const int64_t R = host_plan(s, offsets, *a);
    last_ = {m - a->send_elems[s.ep.rank()] / H, R};

    a->guests.weights_start(s, lp, a->layer);  // overlaps the token all-to-all below
    a->send_rows = be.alloc(kDispatch, {m}, DType::DType_I32, "llep.send_rows");  // (m)
    a->send_pos = be.alloc(kDispatch, {m}, DType::DType_I32, "llep.send_pos");    // (m)
    be.copy_from_host(a->send_rows.data(), host_send_rows_.data(), a->send_rows.bytes());
    be.copy_from_host(a->send_pos.data(), host_send_pos_.data(), a->send_pos.bytes());
    Tensor send = be.alloc(kDispatch, {m, H}, s.precision.activations, "llep.send");  // (m, H) by destination
    K.moe_gather(xs.buf(), a->send_rows.i32(), send.buf(), m, H);
    xs.reset();
    Tensor recv = be.alloc(kDispatch, {R, H}, s.precision.activations, "llep.recv");  // (R, H) source-major
    s.ep_data.all_to_all_v(be.compute_stream(), send.data(), a->send_elems.data(), recv.data(), a->recv_elems.data(),
                           send.dtype());
    send.reset();
    a->guests.weights_wait(s);

    a->perm = be.alloc(kDispatch, {R}, DType::DType_I32, "llep.perm");      // (R)
    a->unperm = be.alloc(kDispatch, {R}, DType::DType_I32, "llep.unperm");  // (R)
    be.copy_from_host(a->perm.data(), host_perm_.data(), a->perm.bytes());
    be.copy_from_host(a->unperm.data(), host_unperm_.data(), a->unperm.bytes());
    a->ffn.x = be.alloc(kDispatch, {R, H}, s.precision.activations, "llep.x");  // (R, H) grouped by expert
    K.moe_gather(recv.buf(), a->perm.i32(), a->ffn.x.buf(), R, H);
    recv.reset();
    if (!keep) a->perm.reset();

    weights_fill(s, lp, *a);
    Tensor y = expert_ffn_forward(be, expert_ffn_dims(s.cfg), weights_, a->group_offsets, a->ffn, keep != nullptr, "llep.y", kDispatch,
                                  s.precision.activations);  // (R, H)
    Tensor y_send = be.alloc(kDispatch, {R, H}, s.precision.activations, "llep.y_send");  // (R, H) source-major
    K.moe_gather(y.buf(), a->unperm.i32(), y_send.buf(), R, H);
    y.reset();
    if (!keep) {
      a->unperm.reset();
      a->guests.release();
    }
    Tensor back = be.alloc(kDispatch, {m, H}, s.precision.activations, "llep.back");  // (m, H) by destination
    s.ep_data.all_to_all_v(be.compute_stream(), y_send.data(), a->recv_elems.data(), back.data(), a->send_elems.data(),
                           y_send.dtype());
    y_send.reset();
    Tensor ys = be.alloc(kAct, {m, H}, s.precision.activations, "moe.ys");  // (m, H) expert order
    K.moe_gather(back.buf(), a->send_pos.i32(), ys.buf(), m, H);
    if (!keep) {
      a->send_rows.reset();
      a->send_pos.reset();
    }
    return ys;
  }

  Tensor backward(StepContext& s, const LayerParams& lp, Tensor dys, std::span<const int64_t> offsets,
                  const MoeChunk& chunk, std::unique_ptr<DispatchActs> acts) override {
    Backend& be = s.be;
    const ops::KernelLauncher K = be.kernels();
    auto* a = dynamic_cast<LlepActs*>(acts.get());
    FP_ASSERT(a != nullptr, "llep dispatch backward needs the acts of an llep forward with keep");
    if (a->standard) return standard_->backward(s, lp, std::move(dys), offsets, chunk, std::move(a->standard));
    const int64_t H = s.cfg.hidden_size, m = dys.dim(0), R = a->group_offsets.back();

    Tensor dsend = be.alloc(kDispatch, {m, H}, s.precision.activations, "llep.dsend");  // (m, H) by destination
    K.moe_gather(dys.buf(), a->send_rows.i32(), dsend.buf(), m, H);
    dys.reset();
    a->send_rows.reset();
    Tensor dy_recv = be.alloc(kDispatch, {R, H}, s.precision.activations, "llep.dy_recv");  // (R, H) source-major
    s.ep_data.all_to_all_v(be.compute_stream(), dsend.data(), a->send_elems.data(), dy_recv.data(),
                           a->recv_elems.data(), dsend.dtype());
    dsend.reset();
    Tensor dy = be.alloc(kDispatch, {R, H}, s.precision.activations, "llep.dy");  // (R, H) grouped
    K.moe_gather(dy_recv.buf(), a->perm.i32(), dy.buf(), R, H);
    dy_recv.reset();
    a->perm.reset();

    a->guests.grads_zero(s);
    weights_fill(s, lp, *a);
    Tensor dx = expert_ffn_backward(be, expert_ffn_dims(s.cfg), weights_, a->group_offsets, a->ffn, dy, "llep.dx", kDispatch,
                                    s.precision.activations);  // (R, H)
    a->guests.grads_start(s);  // overlaps the all-to-all of dx below
    Tensor dx_send = be.alloc(kDispatch, {R, H}, s.precision.activations, "llep.dx_send");  // (R, H) source-major
    K.moe_gather(dx.buf(), a->unperm.i32(), dx_send.buf(), R, H);
    dx.reset();
    a->unperm.reset();
    Tensor dback = be.alloc(kDispatch, {m, H}, s.precision.activations, "llep.dback");  // (m, H) by destination
    s.ep_data.all_to_all_v(be.compute_stream(), dx_send.data(), a->recv_elems.data(), dback.data(),
                           a->send_elems.data(), dx_send.dtype());
    dx_send.reset();
    a->guests.grads_finish(s, lp);
    a->guests.release();
    Tensor dxs = be.alloc(kAct, {m, H}, s.precision.activations, "moe.dxs");  // (m, H) expert order
    K.moe_gather(dback.buf(), a->send_pos.i32(), dxs.buf(), m, H);
    a->send_pos.reset();
    return dxs;
  }

 private:
  // Host side of the forward: send order and sizes, the receive blocks, the grouping of the rows
  // computed here (host_perm_, host_unperm_, group offsets). Returns R.
  int64_t host_plan(const StepContext& s, std::span<const int64_t> offsets, LlepActs& a) {
    const int W = s.ep.size(), me = s.ep.rank();
    const int64_t E = s.cfg.num_experts, H = s.cfg.hidden_size;
    const LlepLayer& L = a.layer;
    const int64_t m = offsets[E];

    // Send order: destinations in rank order; within one, the pieces in expert order. The per-row
    // arrays only where rows move (meta: the sizes alone, nothing per row).
    const bool rows = s.be.computes();
    host_send_rows_.resize(rows ? static_cast<size_t>(m) : 0);
    host_send_pos_.resize(rows ? static_cast<size_t>(m) : 0);
    a.send_elems.assign(static_cast<size_t>(W), 0);
    int64_t slot = 0;
    for (int d = 0; d < W; ++d)
      for (const LlepPiece& pc : L.pieces) {
        if (pc.dest != d) continue;
        for (int64_t i = pc.begin; rows && i < pc.end; ++i, ++slot) {
          const int64_t row = offsets[pc.expert] + i;
          host_send_rows_[slot] = static_cast<int32_t>(row);
          host_send_pos_[row] = static_cast<int32_t>(slot);
        }
        a.send_elems[d] += (pc.end - pc.begin) * H;
      }
    FP_ASSERT(!rows || slot == m, "llep: {} of {} rows planned", slot, m);

    // What arrives: from each source, its pieces for this rank, in its expert order.
    a.recv_elems.assign(static_cast<size_t>(W), 0);
    std::vector<int64_t>& per_expert = expert_rows_;  // (E) rows of each expert computed here
    per_expert.assign(static_cast<size_t>(E), 0);
    blocks_.clear();
    for (int src = 0; src < W; ++src) {
      llep_pieces(L.plan, L.counts.data(), src, src_pieces_);
      for (const LlepPiece& pc : src_pieces_)
        if (pc.dest == me) {
          blocks_.push_back({pc.expert, pc.end - pc.begin});
          per_expert[pc.expert] += pc.end - pc.begin;
          a.recv_elems[src] += (pc.end - pc.begin) * H;
        }
    }
    a.group_experts.clear();
    a.group_offsets.assign(1, 0);
    std::vector<int64_t>& group_of = group_of_;  // (E) group of expert e, -1 if not computed here
    group_of.assign(static_cast<size_t>(E), -1);
    for (int64_t e = 0; e < E; ++e)
      if (per_expert[e] > 0) {
        group_of[e] = static_cast<int64_t>(a.group_experts.size());
        a.group_experts.push_back(e);
        a.group_offsets.push_back(a.group_offsets.back() + per_expert[e]);
      }
    const int64_t R = a.group_offsets.back();
    if (!rows) return R;

    // Note [Receive-side grouping] (standard.cpp): expert-major, sources in rank order within an expert.
    host_perm_.resize(static_cast<size_t>(R));
    host_unperm_.resize(static_cast<size_t>(R));
    fill_.assign(a.group_experts.size(), 0);
    int64_t src_row = 0;
    for (const auto& [e, n] : blocks_) {
      const int64_t gi = group_of[e];
      for (int64_t t = 0; t < n; ++t) {
        const int64_t i = a.group_offsets[gi] + fill_[gi] + t;
        host_perm_[i] = static_cast<int32_t>(src_row + t);
        host_unperm_[src_row + t] = static_cast<int32_t>(i);
      }
      fill_[gi] += n;
      src_row += n;
    }
    return R;
  }

  // The weights of every expert computed here: owned ones from lp, guests from what was received.
  void weights_fill(const StepContext& s, const LayerParams& lp, LlepActs& a) {
    const int me = s.ep.rank();
    const std::vector<int64_t>& guests = a.layer.guests;
    weights_.resize(a.group_experts.size());
    for (size_t i = 0; i < a.group_experts.size(); ++i) {
      const int64_t e = a.group_experts[i];
      if (a.layer.plan.home(e) == me) {
        weights_[i] = expert_weights(lp, e);
      } else {
        const auto it = std::lower_bound(guests.begin(), guests.end(), e);
        FP_ASSERT(it != guests.end() && *it == e, "llep: expert {} computed here is neither owned nor a guest", e);
        weights_[i] = a.guests.weights(it - guests.begin());
      }
    }
  }

  LlepParams params_;
  std::unique_ptr<ExpertDispatch> standard_;
  // Host scratch reused across layers.
  std::vector<int32_t> host_send_rows_, host_send_pos_, host_perm_, host_unperm_;
  std::vector<int64_t> expert_rows_, group_of_, fill_;
  std::vector<std::pair<int64_t, int64_t>> blocks_;  // (expert, rows) arriving, source-major
  std::vector<LlepPiece> src_pieces_;
  std::vector<ExpertWeights> weights_;
};

}  // namespace

const LlepStats* llep_stats(const ExpertDispatch& d) {
  const auto* b = dynamic_cast<const LlepDispatchBase*>(&d);
  return b ? &b->stats() : nullptr;
}

std::unique_ptr<ExpertDispatch> dispatch_llep_create(const DispatchSchedule& sched) {
  return std::make_unique<LlepDispatch>(sched);
}

}  // namespace fp
