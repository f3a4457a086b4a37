// Standard expert parallelism (dispatch.h): the plain variant whose receive buffers follow the
// routing. Rank r owns experts [r E_p, (r+1) E_p) (model/layout.h).
// Legend: m routed copies of this rank, H hidden, I expert width, E experts, W ranks, E_p = E / W,
// R rows this rank computes (every route of every rank that lands on its experts).
//
// Forward (allocation order, category dispatch unless noted):
//   count exchange   all-to-all of the (E_p) per-expert counts each rank sends each owner (host)
//   ep.recv (R, H)   all-to-all-v of the rows of xs; xs is freed (it is the send buffer: expert order
//                    is destination-rank order)
//   ep.perm, ep.unperm (R) i32, ep.x (R, H)   Note [Receive-side grouping]; ep.recv is freed
//   FFN              g, u, act (R, I) activations, ep.y (R, H)
//   ep.y_send (R, H) back in source-major order; ep.y freed
//   moe.ys (m, H)    all-to-all-v back (activations: the rank's own routes, like xs); ep.y_send freed
// Backward mirrors it: ep.dy_recv (R, H), ep.dy (R, H) grouped, the FFN backward (weight gradients of
// the owned experts), ep.dx (R, H), ep.dx_send (R, H) source-major, moe.dxs (m, H) (activations).
// Category dispatch holds exactly the R-sized buffers (what the rank receives: they grow with routing
// skew); the m-sized token side (xs, ys, dys, dxs; m = n k is fixed by the config) is activations.
//
// Note [Receive-side grouping]: all-to-all-v packs what arrives by source, and within a source by
// expert (the sender's expert order), so a local expert's rows lie in W separate blocks. The rows are
// regrouped expert-major (within an expert, sources in rank order, so the rows of one expert keep a
// fixed order and its weight gradient sums them in that order) by a row gather into a second
// buffer, so each expert runs one GEMM over contiguous rows; the outputs are gathered back to
// source-major order before they return. Like Megatron's token dispatcher (a sort of the received
// chunks), this costs a second R x H buffer for a moment: part of the plain variant's peak.
#include "sched/dispatch/dispatch.h"
#include "model/expert_ffn.h"

#include "model/layout.h"

namespace fp {

namespace {

struct StandardActs : DispatchActs {
  ExpertActs ffn;                     // x (R, H) grouped by local expert; g, u, act (R, I)
  Tensor perm, unperm;                // (R) i32: grouped row <- source-major row, and its inverse
  std::vector<int64_t> send_elems;    // (W) floats this rank sent to each rank
  std::vector<int64_t> recv_elems;    // (W) floats this rank received from each rank
  std::vector<int64_t> group_offsets; // (E_p + 1) grouped rows of each local expert
};

class StandardDispatch : public ExpertDispatch {
 public:
  std::string_view name() const override { return "standard"; }

  Tensor forward(StepContext& s, const LayerParams& lp, Tensor xs, std::span<const int64_t> offsets,
                 const MoeChunk& chunk, std::unique_ptr<DispatchActs>* keep) override {
    Backend& be = s.be;
    const ops::KernelLauncher K = be.kernels();
    const int64_t H = s.cfg.hidden_size, m = xs.dim(0);
    StandardActs scratch;
    StandardActs* a = &scratch;
    if (keep) {
      auto acts = std::make_unique<StandardActs>();
      a = acts.get();
      *keep = std::move(acts);
    }
    const int64_t R = plan(s, offsets, *a);
    last_ = {m - a->send_elems[s.ep.rank()] / H, R};

    Tensor recv = be.alloc(kDispatch, {R, H}, s.precision.activations, "ep.recv");  // (R, H) source-major
    s.ep_data.all_to_all_v(be.compute_stream(), xs.data(), a->send_elems.data(), recv.data(), a->recv_elems.data(),
                           xs.dtype());
    xs.reset();

    a->perm = be.alloc(kDispatch, {R}, DType::DType_I32, "ep.perm");      // (R)
    a->unperm = be.alloc(kDispatch, {R}, DType::DType_I32, "ep.unperm");  // (R)
    be.copy_from_host(a->perm.data(), host_perm_.data(), a->perm.bytes());
    be.copy_from_host(a->unperm.data(), host_unperm_.data(), a->unperm.bytes());
    a->ffn.x = be.alloc(kDispatch, {R, H}, s.precision.activations, "ep.x");  // (R, H) grouped by local expert
    K.moe_gather(recv.buf(), a->perm.i32(), a->ffn.x.buf(), R, H);
    recv.reset();
    if (!keep) a->perm.reset();

    weights_fill(s, lp);
    Tensor y = expert_ffn_forward(be, expert_ffn_dims(s.cfg), weights_, a->group_offsets, a->ffn, keep != nullptr, "ep.y", kDispatch,
                                  s.precision.activations);  // (R, H)
    Tensor y_send = be.alloc(kDispatch, {R, H}, s.precision.activations, "ep.y_send");  // (R, H) source-major
    K.moe_gather(y.buf(), a->unperm.i32(), y_send.buf(), R, H);
    y.reset();
    if (!keep) a->unperm.reset();

    Tensor ys = be.alloc(kAct, {m, H}, s.precision.activations, "moe.ys");  // (m, H) expert order, this rank's routes
    s.ep_data.all_to_all_v(be.compute_stream(), y_send.data(), a->recv_elems.data(), ys.data(), a->send_elems.data(),
                           y_send.dtype());
    return ys;
  }

  Tensor backward(StepContext& s, const LayerParams& lp, Tensor dys, std::span<const int64_t> offsets,
                  const MoeChunk& chunk, std::unique_ptr<DispatchActs> acts) override {
    Backend& be = s.be;
    const ops::KernelLauncher K = be.kernels();
    auto* a = dynamic_cast<StandardActs*>(acts.get());
    FP_ASSERT(a != nullptr, "standard dispatch backward needs the acts of a standard forward with keep");
    const int64_t H = s.cfg.hidden_size, m = dys.dim(0), R = a->group_offsets.back();

    Tensor dy_recv = be.alloc(kDispatch, {R, H}, s.precision.activations, "ep.dy_recv");  // (R, H) source-major
    s.ep_data.all_to_all_v(be.compute_stream(), dys.data(), a->send_elems.data(), dy_recv.data(), a->recv_elems.data(),
                           dys.dtype());
    dys.reset();
    Tensor dy = be.alloc(kDispatch, {R, H}, s.precision.activations, "ep.dy");  // (R, H) grouped
    K.moe_gather(dy_recv.buf(), a->perm.i32(), dy.buf(), R, H);
    dy_recv.reset();
    a->perm.reset();

    weights_fill(s, lp);
    Tensor dx = expert_ffn_backward(be, expert_ffn_dims(s.cfg), weights_, a->group_offsets, a->ffn, dy, "ep.dx", kDispatch,
                                    s.precision.activations);  // (R, H)
    Tensor dx_send = be.alloc(kDispatch, {R, H}, s.precision.activations, "ep.dx_send");  // (R, H) source-major
    K.moe_gather(dx.buf(), a->unperm.i32(), dx_send.buf(), R, H);
    dx.reset();
    a->unperm.reset();

    Tensor dxs = be.alloc(kAct, {m, H}, s.precision.activations, "moe.dxs");  // (m, H) expert order
    s.ep_data.all_to_all_v(be.compute_stream(), dx_send.data(), a->recv_elems.data(), dxs.data(), a->send_elems.data(),
                           dx_send.dtype());
    return dxs;
  }

 private:
  // The count exchange and everything that follows from it (host): send/receive sizes per rank, the
  // grouped offsets of the local experts, and the permutations (host_perm_, host_unperm_). Returns R.
  int64_t plan(StepContext& s, std::span<const int64_t> offsets, StandardActs& a) {
    const int W = s.ep.size(), rank = s.ep.rank();
    const int64_t E = s.cfg.num_experts, H = s.cfg.hidden_size;
    const ExpertLayout mine = expert_layout(rank, W, E);
    const int64_t Ep = mine.count;
    FP_ASSERT(static_cast<int64_t>(offsets.size()) == E + 1);

    // Rank d owns experts [d E_p, (d+1) E_p), so the counts to send it are a contiguous slice.
    send_counts_.resize(static_cast<size_t>(E));  // (E) rows of each expert in xs
    for (int64_t e = 0; e < E; ++e) send_counts_[e] = offsets[e + 1] - offsets[e];
    // (W, E_p) rows from source d for local expert j; zero first, so that a comm that moves nothing
    // (a test double) leaves a defined plan.
    recv_counts_.assign(static_cast<size_t>(W * Ep), 0);
    ep_sizes_.assign(static_cast<size_t>(W), Ep);
    s.ep.all_to_all_v(send_counts_.data(), ep_sizes_.data(), recv_counts_.data(), ep_sizes_.data(), DType::DType_I64);

    a.send_elems.assign(static_cast<size_t>(W), 0);
    a.recv_elems.assign(static_cast<size_t>(W), 0);
    a.group_offsets.assign(static_cast<size_t>(Ep + 1), 0);
    for (int d = 0; d < W; ++d) {
      a.send_elems[d] = (offsets[(d + 1) * Ep] - offsets[d * Ep]) * H;
      for (int64_t j = 0; j < Ep; ++j) {
        a.recv_elems[d] += recv_counts_[d * Ep + j] * H;
        a.group_offsets[j + 1] += recv_counts_[d * Ep + j];
      }
    }
    for (int64_t j = 0; j < Ep; ++j) a.group_offsets[j + 1] += a.group_offsets[j];
    const int64_t R = a.group_offsets[Ep];
    if (!s.be.computes()) return R;  // meta moves no row: no (R) permutation on the host

    // Note [Receive-side grouping]: grouped row i (expert j, then source, then arrival order) comes
    // from source-major row perm[i].
    host_perm_.resize(static_cast<size_t>(R));
    host_unperm_.resize(static_cast<size_t>(R));
    int64_t src_row = 0;  // first source-major row of (source d, expert j)
    std::vector<int64_t>& fill = group_fill_;  // (E_p) grouped rows of expert j placed so far
    fill.assign(static_cast<size_t>(Ep), 0);
    for (int d = 0; d < W; ++d)
      for (int64_t j = 0; j < Ep; ++j) {
        const int64_t cnt = recv_counts_[d * Ep + j];
        for (int64_t t = 0; t < cnt; ++t) {
          const int64_t i = a.group_offsets[j] + fill[j] + t;
          host_perm_[i] = static_cast<int32_t>(src_row + t);
          host_unperm_[src_row + t] = static_cast<int32_t>(i);
        }
        fill[j] += cnt;
        src_row += cnt;
      }
    return R;
  }

  // The owned experts' weights (never a foreign expert's: they may not be allocated).
  void weights_fill(const StepContext& s, const LayerParams& lp) {
    const ExpertLayout mine = expert_layout(s.ep.rank(), s.ep.size(), s.cfg.num_experts);
    weights_.resize(static_cast<size_t>(mine.count));
    for (int64_t j = 0; j < mine.count; ++j) weights_[j] = expert_weights(lp, mine.first + j);
  }

  // Host scratch reused across layers (no allocation per layer once sized).
  std::vector<int64_t> send_counts_, recv_counts_, ep_sizes_, group_fill_;
  std::vector<int32_t> host_perm_, host_unperm_;  // (R)
  std::vector<ExpertWeights> weights_;            // (E_p)
};

}  // namespace

std::unique_ptr<ExpertDispatch> dispatch_standard_create() { return std::make_unique<StandardDispatch>(); }

}  // namespace fp
