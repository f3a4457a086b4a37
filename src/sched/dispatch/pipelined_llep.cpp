// PipelinedLLEP (docs/design.md, "PipelinedLLEP"; dispatch.h contract): LLEP's plan, dispatched in K chunks
// (chunk_plan.h), so that what a rank receives at once is bounded at launch, whatever the router does.
// Legend: n tokens of this rank, m = n k routed copies, H hidden, I expert width, E experts, W ranks,
// K chunks, c_eff tokens of one source per chunk, m_i this rank's copies in chunk i (<= k c_eff),
// r_i the rows this rank computes in chunk i (<= W k c_eff).
//
// Every routed copy goes to the rank LLEP's plan names (llep_plan.h: by its global position); the
// chunks only decide *when*: chunk i carries the copies of this rank's tokens in chunk i (contiguous
// or strided membership), so a destination receives at most W k c_eff rows per chunk.
//
// The chunk order (pllep.rows (m) i32: the rows of xs chunk by chunk, within a chunk by destination then
// row) is built on the device from the MoE block's rows (MoeChunk::rows, the token of each row) by the
// kernel moe_chunk_order (ops/moe_chunk_order.h), given the plan's pieces as a small table
// (pllep.pieces (P, 5) i64, uploaded); only its counts come to the host (pllep.counts (K W + 1 + B) i64:
// the rows per chunk and destination, and per destination, chunk and computed expert), to size the
// buffers and the exchanges. No O(m) host work and no rows on the host. The block's rows are freed as
// soon as they are read (MoeChunk::release_rows).
//
// Forward, chunk by chunk (category dispatch; `pllep.send`, `pllep.back` are token side, at most
// m_i rows; `pllep.recv`, `pllep.y` expert side, r_i rows):
//   pllep.send (m_i, H)   xs rows of the chunk, by destination -> all-to-all-v -> pllep.recv (r_i, H);
//                         send freed
//   FFN                   on the received rows as they are: one group per (source, expert) block,
//                         no regrouping copy; g, u, act (r_i, I) activations; recv freed, pllep.y (r_i, H)
//   pllep.back (m_i, H)   all-to-all-v back; y freed; the rows are copied into the output; back freed
// The output is xs itself (each chunk's rows of xs are sent before its results overwrite them), so
// the token side holds one (m, H) buffer. With keep, backward needs the rows again: when the MoE block
// offers its normed tokens (MoeChunk::h2) they are gathered from there (pllep.tokens (m) i32: the token of
// each chunk row), otherwise xs stays for backward and the output is a new moe.ys (m, H) (category activations, as xs).
//
// With keep (the forward before backward), each chunk's FFN intermediates g, u, act (r_i, I, category
// activations) are kept, but not its received rows: Note [Why PipelinedLLEP sends the rows again].
// Backward, per chunk: the chunk's xs rows travel again (pllep.recv_x (r_i, H)), its dys rows travel
// (pllep.dy (r_i, H)), the FFN backward gives pllep.dx (r_i, H), which travels back into the rows of
// dys (the returned dxs is dys, overwritten in place). Guest weight gradients go home at the end
// (llep.h).
//
// Expert-side buffers at once: forward recv then y, with keep recv + y; backward recv_x + dy, then
// recv_x + dx: at most 2 r_i rows <= 2 W k c_eff, so the bound 2 W k c_eff H x 4 bytes
// (chunk_dispatch_bound_bytes) holds; tests/dist/llep_case.cpp checks it on the ledger's timeline.
//
// Note [Why PipelinedLLEP sends the rows again]
// Keeping each chunk's received rows for backward would keep all K chunks' rows at once: R rows, the
// receive volume the schedule exists to bound. Backward needs them (the weight gradients of gate and
// up are dg^T x), so the chunk's rows are sent again: communication only, no recompute. The FFN
// intermediates (I wide) are kept, as LLEP and standard keep theirs: the same R I floats in category
// activations, so the expert FLOPs equal LLEP's. (Recomputing them instead would bound the
// activations too, at the price of one expert forward per layer.)
#include <algorithm>
#include <map>
#include <memory>
#include <optional>

#include "model/routing.h"
#include "sched/dispatch/chunk_plan.h"
#include "sched/dispatch/llep.h"

namespace fp {

namespace {

// Host bookkeeping of one layer's chunks (built in forward, used again by backward).
struct ChunkLayout {
  ChunkPlan cp;
  int64_t W = 1;
  std::vector<int64_t> pieces;        // (P, 5) the plan's pieces as moe_chunk_order reads them
  int64_t blocks = 0;                 // B: its block counters, K x the experts every rank computes
  std::vector<int64_t> first;         // (K + 1) chunk i's rows are pllep.rows[first[i], first[i+1])
  std::vector<int64_t> send_elems;    // (K, W) floats this rank sends each rank per chunk
  std::vector<int64_t> recv_elems;    // (K, W) floats this rank receives from each rank per chunk
  std::vector<int64_t> block_expert;  // blocks arriving, chunk by chunk, source-major: the expert ...
  std::vector<int64_t> block_rows;    // ... and its rows
  std::vector<int64_t> block_first;   // (K + 1) chunk i's blocks
};

struct PipelinedActs : DispatchActs {
  std::shared_ptr<const LlepLayer> layer;     // both shared by every layer of a step under a routing profile
  std::shared_ptr<const ChunkLayout> chunks;
  GuestExperts guests;          // received weights kept for backward
  Tensor xs;                    // (m, H) the routed copies, sent again chunk by chunk in backward, unless ...
  Tensor tokens;                // (m) i32 ... the rows are gathered again from MoeChunk::h2: each chunk row's token
  Tensor rows;                  // (m) i32 xs rows, chunk by chunk, within a chunk by destination then row
  std::vector<ExpertActs> ffn;  // (K) each chunk's g, u, act (r_i, I); x is not kept
};

class PipelinedLlepDispatch : public LlepDispatchBase {
 public:
  PipelinedLlepDispatch(const DispatchSchedule& sched, uint64_t bound_bytes)
      : sched_(sched), params_(llep_params(sched)), launch_bound_(bound_bytes) {
    stats_.chunk_bound_bytes = bound_bytes;
  }
  std::string_view name() const override { return "pipelined_llep"; }
  bool reads_rows() const override { return true; }  // chunk membership is by token (moe_chunk_order)
  void profile_reset() override { profile_by_n_.clear(); }

  Tensor forward(StepContext& s, const LayerParams& lp, Tensor xs, std::span<const int64_t> offsets,
                 const MoeChunk& chunk, std::unique_ptr<DispatchActs>* keep) override {
    Backend& be = s.be;
    const ops::KernelLauncher K = be.kernels();
    const int64_t H = s.cfg.hidden_size, m = xs.dim(0);
    PipelinedActs scratch;
    PipelinedActs* a = &scratch;
    if (keep) {
      auto acts = std::make_unique<PipelinedActs>();
      a = acts.get();
      *keep = std::move(acts);
    }
    // Note [One chunk layout per step under a routing profile]: a profile routes every layer of a step
    // alike on every rank (Note [A routing profile is routed once per step] in model/blocks.h), so the
    // LLEP plan and the chunk layout are the same for every layer: built once, then shared. Every rank
    // decides alike (the profile is the run's), so the collectives inside (the all-gather of the
    // expert counts, the exchange of chunk counts) are skipped everywhere at once. On meta at 1M
    // tokens and 64 ranks this is most of a step's host work. The chunk order itself (pllep.rows) is a
    // device buffer of each layer's forward: the kernel builds it every layer (on the layer's own rows,
    // the same under a profile), and only a new layout reads its counts back.
    // Under token chunks (Note [The MoE token side in chunks]) one layout per chunk of the block, and one set
    // per n of the block (Note [One routing per token count] in model/moe_block.cpp): a kept layout brings
    // back the statistics its build left.
    const bool profiled = s.profile.kind != RoutingProfile::Kind::Kind_router;
    const size_t slot = static_cast<size_t>(chunk.index);
    std::vector<ProfileLayout>& kept = profile_by_n_[s.n];
    if (kept.size() <= slot) kept.resize(slot + 1);
    const bool fresh = !profiled || kept[slot].chunks == nullptr;
    std::shared_ptr<LlepLayer> layer;
    std::shared_ptr<ChunkLayout> built;
    if (fresh) {
      layer = std::make_shared<LlepLayer>();
      llep_layer_build(s, params_, offsets, chunk.n, *layer);
      built = std::make_shared<ChunkLayout>();
      chunks_prepare(s, offsets, chunk, *layer, *built);
      a->layer = layer;
      a->chunks = built;
    } else {
      a->layer = kept[slot].layer;
      a->chunks = kept[slot].chunks;
      stats_ = kept[slot].stats;
      last_ = kept[slot].last;
    }
    const ChunkLayout& C = *a->chunks;

    a->rows = be.alloc(kDispatch, {m}, DType::DType_I32, "pllep.rows");  // (m)
    // Backward sends the rows again: from the block's h2 when the block offers it (then xs can take
    // the outputs in place, as without keep), else from xs kept here (then the output is new).
    const bool regather = keep && chunk.h2 != nullptr;
    if (regather) a->tokens = be.alloc(kDispatch, {m}, DType::DType_I32, "pllep.tokens");  // (m)
    // The chunk order on the device, every layer; its counts to the host when the layout is new.
    chunk_order(s, chunk, C, *a, m, fresh);
    if (fresh) {
      chunks_finish(s, offsets, chunk, *layer, *built);
      if (profiled) kept[slot] = {layer, built, stats_, last_};
    }
    Tensor out;  // (m, H) expert order
    if (keep && !regather) out = be.alloc(kAct, {m, H}, s.precision.activations, "moe.ys");

    a->guests.weights_start(s, lp, *a->layer);  // overlaps the first chunk's all-to-all
    if (keep) a->ffn.resize(static_cast<size_t>(C.cp.K));
    for (int64_t i = 0; i < C.cp.K; ++i) {
      const int64_t mi = C.first[i + 1] - C.first[i], ri = recv_rows(C, i, H);
      Tensor send = be.alloc(kDispatch, {mi, H}, s.precision.activations, "pllep.send");  // (m_i, H)
      K.moe_gather(xs.buf(), ptr_at(a->rows.i32(), C.first[i]), send.buf(), mi, H);
      ExpertActs scratch;
      ExpertActs& ffn = keep ? a->ffn[i] : scratch;
      ffn.x = be.alloc(kDispatch, {ri, H}, s.precision.activations, "pllep.recv");  // (r_i, H) source-major
      exchange(s, send, ffn.x, C, i, false);
      send.reset();
      if (i == 0) a->guests.weights_wait(s);
      groups_fill(s, lp, *a, i);
      Tensor y = expert_ffn_forward(be, expert_ffn_dims(s.cfg), weights_, offsets_, ffn, keep != nullptr, "pllep.y", kDispatch,
                                    s.precision.activations);  // (r_i, H)
      ffn.x.reset();  // sent again in backward (Note [Why PipelinedLLEP sends the rows again])
      Tensor back = be.alloc(kDispatch, {mi, H}, s.precision.activations, "pllep.back");  // (m_i, H)
      exchange(s, y, back, C, i, true);
      y.reset();
      K.moe_scatter(back.buf(), ptr_at(a->rows.i32(), C.first[i]), out.defined() ? out.buf() : xs.buf(), mi, H);
    }
    if (out.defined()) {
      a->xs = std::move(xs);
      return out;
    }
    if (!keep) a->guests.release();
    return xs;  // overwritten chunk by chunk with the expert outputs
  }

  Tensor backward(StepContext& s, const LayerParams& lp, Tensor dys, std::span<const int64_t> offsets,
                  const MoeChunk& chunk, std::unique_ptr<DispatchActs> acts) override {
    Backend& be = s.be;
    const ops::KernelLauncher K = be.kernels();
    auto* a = dynamic_cast<PipelinedActs*>(acts.get());
    FP_ASSERT(a != nullptr, "pipelined_llep backward needs the acts of a pipelined_llep forward with keep");
    const int64_t H = s.cfg.hidden_size;
    const ChunkLayout& C = *a->chunks;

    a->guests.grads_zero(s);
    for (int64_t i = 0; i < C.cp.K; ++i) {
      const int64_t mi = C.first[i + 1] - C.first[i], ri = recv_rows(C, i, H);
      const int32_t* rows_i = ptr_at(a->rows.i32(), C.first[i]);
      groups_fill(s, lp, *a, i);
      ExpertActs& ffn = a->ffn[i];  // g, u, act kept by the forward; x comes again
      {
        Tensor send = be.alloc(kDispatch, {mi, H}, s.precision.activations, "pllep.send_x");  // (m_i, H)
        if (a->tokens.defined()) {
          FP_ASSERT(chunk.h2 != nullptr, "pipelined_llep: the forward gathered from the chunk's h2, the backward has none");
          K.moe_gather(chunk.h2->cbuf(), ptr_at(a->tokens.i32(), C.first[i]), send.buf(), mi, H);
        } else {
          K.moe_gather(a->xs.buf(), rows_i, send.buf(), mi, H);
        }
        ffn.x = be.alloc(kDispatch, {ri, H}, s.precision.activations, "pllep.recv_x");  // (r_i, H)
        exchange(s, send, ffn.x, C, i, false);
      }
      Tensor dy = be.alloc(kDispatch, {ri, H}, s.precision.activations, "pllep.dy");  // (r_i, H)
      {
        Tensor send = be.alloc(kDispatch, {mi, H}, s.precision.activations, "pllep.send_dy");  // (m_i, H)
        K.moe_gather(dys.buf(), rows_i, send.buf(), mi, H);
        exchange(s, send, dy, C, i, false);
      }
      Tensor dx = expert_ffn_backward(be, expert_ffn_dims(s.cfg), weights_, offsets_, ffn, dy, "pllep.dx", kDispatch,
                                      s.precision.activations);  // (r_i, H)
      Tensor back = be.alloc(kDispatch, {mi, H}, s.precision.activations, "pllep.back");  // (m_i, H)
      exchange(s, dx, back, C, i, true);
      dx.reset();
      // The chunk's rows of dys were sent above: they take the input gradients now.
      K.moe_scatter(back.buf(), rows_i, dys.buf(), mi, H);
    }
    a->xs.reset();
    a->tokens.reset();
    a->rows.reset();
    a->guests.grads_start(s);
    a->guests.grads_finish(s, lp);
    a->guests.release();
    (void)offsets;
    return dys;  // now d loss / d xs
  }

 private:
  // r_i: the rows this rank receives in chunk i.
  static int64_t recv_rows(const ChunkLayout& C, int64_t i, int64_t H) {
    int64_t r = 0;
    for (int64_t s = 0; s < C.W; ++s) r += C.recv_elems[i * C.W + s];
    return r / H;
  }

  // Chunk i's rows: to the experts (back = false: send by destination -> recv by source) or back.
  void exchange(StepContext& s, const Tensor& from, Tensor& to, const ChunkLayout& C, int64_t i, bool back) {
    const int W = s.ep.size();
    const int64_t* sc = (back ? C.recv_elems.data() : C.send_elems.data()) + i * W;
    const int64_t* rc = (back ? C.send_elems.data() : C.recv_elems.data()) + i * W;
    s.ep_data.all_to_all_v(s.be.compute_stream(), from.data(), sc, to.data(), rc, from.dtype());
  }

  // The chunk layout of this layer, before the chunk order: membership, the experts each rank computes,
  // and the plan's pieces as the table moe_chunk_order reads.
  void chunks_prepare(StepContext& s, std::span<const int64_t> offsets, const MoeChunk& chunk, const LlepLayer& layer,
                      ChunkLayout& C) {
    const int W = s.ep.size();
    const int64_t E = s.cfg.num_experts;
    // n_max, not n: K and c_eff must be the same on every rank (every chunk is one collective).
    C.cp = chunk_plan_build(std::max<int64_t>(layer.n_max, 1), sched_.chunk_cap,
                            chunk_budget(sched_.max_chunks, chunk.n, s.n),
                            sched_.strided ? ChunkMembership::ChunkMembership_strided
                                           : ChunkMembership::ChunkMembership_contiguous);
    const int64_t Kc = C.cp.K;
    C.W = W;

    // Note [Counts only for the experts a rank computes]: destination d computes its native experts and
    // the ones whose plan intervals name d (its guests); every rank holds the plan, so a source sends
    // d counts for those X_d experts only: K x |X_d| numbers instead of K x E (at 64 ranks, 384 experts
    // and 128 chunks that is 25 MB less per rank and layer).
    const LlepPlan& pl = layer.plan;
    comp_pos_.assign(static_cast<size_t>(W * E), -1);  // (W, E) position of e in X_d, or -1
    for (int64_t e = 0; e < E; ++e) {
      comp_pos_[pl.home(e) * E + e] = 0;
      for (int32_t d : pl.guests(e)) comp_pos_[d * E + e] = 0;
    }
    comp_first_.assign(static_cast<size_t>(W + 1), 0);
    for (int d = 0; d < W; ++d) {
      int32_t n = 0;
      for (int64_t e = 0; e < E; ++e)
        if (comp_pos_[d * E + e] >= 0) comp_pos_[d * E + e] = n++;
      comp_first_[d + 1] = comp_first_[d] + n;
    }

    // The pieces: rows [offsets[e] + begin, offsets[e] + end) go to d, and their rows of chunk i are
    // counted in send_blocks_'s entry for (d, i, x): per d (K, |X_d|) from K comp_first_[d].
    C.pieces.clear();
    for (const LlepPiece& pc : layer.pieces) {
      const int d = pc.dest;
      const int32_t x = comp_pos_[d * E + pc.expert];
      FP_ASSERT(x >= 0, "pipelined_llep: rows of expert {} go to rank {}, which does not compute it", pc.expert, d);
      C.pieces.insert(C.pieces.end(), {offsets[pc.expert] + pc.begin, offsets[pc.expert] + pc.end, d,
                                       Kc * comp_first_[d] + x, comp_first_[d + 1] - comp_first_[d]});
    }
    C.blocks = Kc * comp_first_[W];
  }

  // The chunk order of this forward (a->rows, and a->tokens when defined), on the device from the block's
  // rows: moe_chunk_order. With `counts`, its counts come to the host (order_counts_: (K W + 1) offsets
  // of the (chunk, destination) groups, then the B block counters). Frees the block's rows when it is
  // done with them. Allocated on meta too (the same ledger), where nothing is computed.
  void chunk_order(StepContext& s, const MoeChunk& chunk, const ChunkLayout& C, PipelinedActs& a, int64_t m,
                   bool counts) {
    Backend& be = s.be;
    FP_ASSERT(chunk.rows != nullptr && chunk.rows->defined() && chunk.rows->numel() == m,
              "pipelined_llep: the forward needs the block's rows (MoeChunk::rows) of its {} rows", m);
    const int64_t P = static_cast<int64_t>(C.pieces.size()) / 5, G = C.cp.K * C.W;
    Tensor pieces = be.alloc(kDispatch, {5 * P}, DType::DType_I64, "pllep.pieces");  // (P, 5)
    be.copy_from_host(pieces.data(), C.pieces.data(), pieces.bytes());
    Tensor dev_counts = be.alloc(kDispatch, {G + 1 + C.blocks}, DType::DType_I64, "pllep.counts");
    auto* dc = static_cast<int64_t*>(dev_counts.data());
    const ops::ChunkOrderSpec spec{
        m, P, C.cp.K, C.cp.c_eff, C.cp.membership == ChunkMembership::ChunkMembership_strided, C.W, C.blocks};
    be.kernels().moe_chunk_order(chunk.rows->i32(), static_cast<const int64_t*>(pieces.data()), spec, a.rows.i32(),
                                 a.tokens.defined() ? a.tokens.i32() : nullptr, dc, ptr_at(dc, G + 1));
    if (counts && be.computes()) {
      order_counts_.resize(static_cast<size_t>(G + 1 + C.blocks));
      be.copy_to_host(order_counts_.data(), dev_counts.data(), dev_counts.bytes());
    }
    if (chunk.release_rows) chunk.rows->reset();
    dev_counts.reset();
    pieces.reset();
  }

  // The chunk layout of this layer, after the chunk order: per-chunk rows by destination, and (one
  // all-to-all of counts) what every chunk brings from every source.
  void chunks_finish(StepContext& s, std::span<const int64_t> offsets, const MoeChunk& chunk, const LlepLayer& layer,
                     ChunkLayout& C) {
    const int W = s.ep.size();
    const int64_t E = s.cfg.num_experts, H = s.cfg.hidden_size, k = s.cfg.num_experts_per_tok;
    const int64_t m = offsets[E], Kc = C.cp.K;

    // Per (chunk, destination) rows (counts_) and per (destination, chunk, expert) blocks (send_blocks_,
    // per d: (K, |X_d|)), from the chunk order's counts or, on meta under a profile, in closed form.
    counts_.assign(static_cast<size_t>(Kc * W + 1), 0);  // (K * W + 1): counts_[1 + i W + d]
    send_blocks_.assign(static_cast<size_t>(C.blocks), 0);
    const bool closed_form = !s.be.computes() && s.profile.kind != RoutingProfile::Kind::Kind_router;
    FP_ASSERT(closed_form || s.be.computes(),
              "pipelined_llep: meta has no rows to order; it counts a routing profile in closed form");
    if (closed_form) {
      counts_from_profile(s, chunk, layer, C.cp);
    } else {
      for (int64_t g = 0; g < Kc * W; ++g) counts_[g + 1] = order_counts_[g + 1] - order_counts_[g];
      std::copy(order_counts_.begin() + Kc * W + 1, order_counts_.end(), send_blocks_.begin());
    }
    std::vector<int64_t>& cnt = counts_;
    C.send_elems.assign(static_cast<size_t>(Kc * W), 0);
    for (int64_t j = 0; j < Kc * W; ++j) C.send_elems[j] = cnt[j + 1] * H;
    for (int64_t j = 0; j < Kc * W; ++j) cnt[j + 1] += cnt[j];
    C.first.assign(static_cast<size_t>(Kc + 1), 0);
    for (int64_t i = 0; i <= Kc; ++i) C.first[i] = cnt[i * W];
    FP_ASSERT(C.first[Kc] == m, "pipelined_llep: the chunks hold {} rows, xs {}", C.first[Kc], m);

    const int me = s.ep.rank();
    const int64_t Xme = comp_first_[me + 1] - comp_first_[me];
    recv_blocks_.assign(static_cast<size_t>(W * Kc * Xme), 0);  // (W sources, K, |X_me|)
    pair_counts_.resize(static_cast<size_t>(W));
    recv_counts_.assign(static_cast<size_t>(W), Kc * Xme);
    for (int d = 0; d < W; ++d) pair_counts_[d] = Kc * (comp_first_[d + 1] - comp_first_[d]);
    s.ep.all_to_all_v(send_blocks_.data(), pair_counts_.data(), recv_blocks_.data(), recv_counts_.data(),
                      DType::DType_I64);
    // X_me in ascending expert order, as the blocks were merged before.
    comp_experts_.clear();
    for (int64_t e = 0; e < E; ++e)
      if (comp_pos_[me * E + e] >= 0) comp_experts_.push_back(e);
    C.recv_elems.assign(static_cast<size_t>(Kc * W), 0);
    C.block_expert.clear();
    C.block_rows.clear();
    C.block_first.assign(1, 0);
    int64_t recv_max = 0;
    double send_ratio = 0;
    for (int64_t i = 0; i < Kc; ++i) {
      int64_t ri = 0;
      for (int src = 0; src < W; ++src)
        for (int64_t x = 0; x < Xme; ++x) {
          const int64_t e = comp_experts_[x];
          const int64_t c = recv_blocks_[(src * Kc + i) * Xme + x];
          if (c == 0) continue;
          C.recv_elems[i * W + src] += c * H;
          ri += c;
          // Adjacent blocks of one expert (the last of a source, the first of the next) merge: one GEMM.
          if (!C.block_expert.empty() && static_cast<int64_t>(C.block_expert.size()) > C.block_first.back() &&
              C.block_expert.back() == e)
            C.block_rows.back() += c;
          else {
            C.block_expert.push_back(e);
            C.block_rows.push_back(c);
          }
        }
      C.block_first.push_back(static_cast<int64_t>(C.block_expert.size()));
      recv_max = std::max(recv_max, ri);
      int64_t mx = 0, sum = 0;
      for (int d = 0; d < W; ++d) {
        mx = std::max(mx, C.send_elems[i * W + d]);
        sum += C.send_elems[i * W + d];
      }
      if (sum > 0) send_ratio = std::max(send_ratio, static_cast<double>(mx) * W / static_cast<double>(sum));
    }
    const LlepPlan& plan = layer.plan;
    stats_ = {plan.active, plan.imbalance, plan.load_ratio(), static_cast<int64_t>(layer.guests.size())};
    stats_.chunks = Kc;
    stats_.c_eff = C.cp.c_eff;
    stats_.chunk_send_ratio = send_ratio;
    stats_.chunk_recv_max = recv_max;
    stats_.chunk_recv_bound = chunk_recv_bound(W, k, C.cp.c_eff);
    const uint64_t a = dtype_size(s.precision.activations);  // the dispatch buffers' element bytes
    // The launch-time bound holds for every window of the token side (Note [The MoE token side in chunks]):
    // a shorter last window has a smaller one of its own.
    stats_.chunk_bound_bytes = std::max(launch_bound_, chunk_dispatch_bound_bytes(W, k, C.cp.c_eff, H, a));
    // Expert side at once: 2 r_i rows (see the file comment).
    stats_.chunk_peak_bytes = 2 * static_cast<uint64_t>(recv_max) * static_cast<uint64_t>(H) * a;
    FP_ASSERT(recv_max <= stats_.chunk_recv_bound, "pipelined_llep: {} rows in one chunk over the bound {}", recv_max,
              stats_.chunk_recv_bound);
    int64_t sent_away = 0, R = 0;
    for (int64_t i = 0; i < Kc; ++i)
      for (int d = 0; d < W; ++d) {
        if (d != s.ep.rank()) sent_away += C.send_elems[i * W + d] / H;
        R += C.recv_elems[i * W + d] / H;
      }
    last_ = {sent_away, R};
  }

  // The counts of the chunk order on meta under a profile, in closed form (Note [Meta routes a profile in closed
  // form] in model/routing.cpp): a piece of expert e's rows [begin, end) is the expert's tokens from
  // its row begin's to its row end - 1's, and a chunk is a token range (contiguous) or a residue class
  // mod K (strided). O(pieces x K x k), nothing per row.
  void counts_from_profile(const StepContext& s, const MoeChunk& chunk, const LlepLayer& layer, const ChunkPlan& cp) {
    const int W = s.ep.size();
    const int64_t E = s.cfg.num_experts, k = s.cfg.num_experts_per_tok, Kc = cp.K;
    const bool strided = cp.membership == ChunkMembership::ChunkMembership_strided;
    std::optional<ProfileTokens> tokens;
    int64_t expert = -1, before = 0;
    // The profile routes the rank's n tokens; the MoE block may hand over one window of them (Note [The MoE
    // token side in chunks]): tokens [b, b + chunk.n), counted from b for the chunk membership.
    const int64_t b = chunk.t0;
    by_class_.resize(static_cast<size_t>(Kc));
    for (const LlepPiece& pc : layer.pieces) {
      if (pc.expert != expert) {
        tokens.emplace(s.profile, s.n, k, E, expert = pc.expert);
        before = tokens->count(0, b);  // the expert's rows in earlier windows
      }
      const int d = pc.dest;
      const int32_t x = comp_pos_[d * E + expert];
      FP_ASSERT(x >= 0, "pipelined_llep: rows of expert {} go to rank {}, which does not compute it", expert, d);
      const int64_t Xd = comp_first_[d + 1] - comp_first_[d];
      int64_t* blocks = send_blocks_.data() + Kc * comp_first_[d];
      // The piece's tokens, in the rank's numbering.
      const int64_t t0 = tokens->nth(before + pc.begin), t1 = tokens->nth(before + pc.end - 1) + 1;
      const auto add = [&](int64_t i, int64_t rows) {
        counts_[i * W + d + 1] += rows;
        blocks[i * Xd + x] += rows;
      };
      if (strided) {  // chunk of window token t - b: (t - b) mod K
        std::fill(by_class_.begin(), by_class_.end(), 0);
        tokens->count_classes(t0, t1, Kc, by_class_.data());
        const int64_t shift = b % Kc;
        for (int64_t i = 0; i < Kc; ++i) add(i, by_class_[(i + shift) % Kc]);
      } else {
        for (int64_t i = (t0 - b) / cp.c_eff; i <= (t1 - 1 - b) / cp.c_eff; ++i)
          add(i, tokens->count(std::max(t0, b + i * cp.c_eff), std::min(t1, b + (i + 1) * cp.c_eff)));
      }
    }
  }

  // The FFN groups of chunk i (offsets_, weights_): one per arriving block.
  void groups_fill(const StepContext& s, const LayerParams& lp, PipelinedActs& a, int64_t i) {
    const ChunkLayout& C = *a.chunks;
    const int me = s.ep.rank();
    const std::vector<int64_t>& guests = a.layer->guests;
    offsets_.assign(1, 0);
    weights_.clear();
    if (!s.be.computes()) {
      // Meta computes nothing (the grouped entries of expert_ffn.cpp are no-ops there) and allocates by the
      // chunk's total rows alone: one group of them, so a plan does not look up a weight per block.
      int64_t rows = 0;
      for (int64_t b = C.block_first[i]; b < C.block_first[i + 1]; ++b) rows += C.block_rows[b];
      offsets_.push_back(rows);
      weights_.push_back({});
      return;
    }
    for (int64_t b = C.block_first[i]; b < C.block_first[i + 1]; ++b) {
      const int64_t e = C.block_expert[b];
      offsets_.push_back(offsets_.back() + C.block_rows[b]);
      if (a.layer->plan.home(e) == me) {
        weights_.push_back(expert_weights(lp, e));
      } else {
        const auto it = std::lower_bound(guests.begin(), guests.end(), e);
        FP_ASSERT(it != guests.end() && *it == e, "pipelined_llep: expert {} is neither owned nor a guest here", e);
        weights_.push_back(a.guests.weights(it - guests.begin()));
      }
    }
  }

  DispatchSchedule sched_;
  LlepParams params_;
  uint64_t launch_bound_ = 0;  // chunk_dispatch_bound_bytes of the largest window, reserved at launch
  // Host scratch reused across layers.
  std::vector<int64_t> order_counts_;  // (K W + 1 + B) what moe_chunk_order counted (chunk_order)
  std::vector<int64_t> counts_, by_class_, send_blocks_, recv_blocks_, pair_counts_, recv_counts_, offsets_;
  std::vector<int64_t> comp_first_, comp_experts_;  // Note [Counts only for the experts a rank computes]
  std::vector<int32_t> comp_pos_;
  std::vector<ExpertWeights> weights_;
  // Note [One chunk layout per step under a routing profile]; one per token chunk of the MoE block, by the
  // block's n (Note [One routing per token count] in model/moe_block.cpp).
  struct ProfileLayout {
    std::shared_ptr<const LlepLayer> layer;
    std::shared_ptr<const ChunkLayout> chunks;
    LlepStats stats;  // what chunks_finish left in stats_ and last_
    DispatchStats last;
  };
  std::map<int64_t, std::vector<ProfileLayout>> profile_by_n_;
};

}  // namespace

std::unique_ptr<ExpertDispatch> dispatch_pipelined_llep_create(const DispatchSchedule& sched, const StepContext& s) {
  const int64_t W = s.ep.size(), k = s.cfg.num_experts_per_tok, H = s.cfg.hidden_size;
  // The launch bound is the largest window's (Note [The MoE token side in chunks] in model/moe_block.cpp).
  const int64_t window = sched.token_chunk > 0 ? std::min(s.n, sched.token_chunk) : s.n;
  const ChunkPlan cp = chunk_plan_build(std::max<int64_t>(window, 1), sched.chunk_cap,
                                        chunk_budget(sched.max_chunks, window, s.n),
                                        sched.strided ? ChunkMembership::ChunkMembership_strided
                                                      : ChunkMembership::ChunkMembership_contiguous);
  const uint64_t a = dtype_size(s.precision.activations);
  const uint64_t bound = chunk_dispatch_bound_bytes(W, k, cp.c_eff, H, a);
  // The launch-time reservation: the expert-side chunk buffers never exceed `bound`, so a device
  // that cannot hold it fails here, before the step, naming the key that sizes it.
  const Ledger& ledger = s.be.device().ledger();
  const uint64_t used = ledger.total_current();
  FP_CHECK(ledger.capacity() >= used && bound <= ledger.capacity() - used,
           "lower pipelined.chunk_cap (or pipelined.max_chunks is capping K), or raise --device-mem",
           "pipelined_llep: the chunk dispatch buffers need up to {} bytes (2 x W {} x k {} x c_eff {} x H {} x {} B) "
           "but the device has {} of {} bytes free at launch",
           bound, W, k, cp.c_eff, H, a, ledger.capacity() - std::min(used, ledger.capacity()), ledger.capacity());
  return std::make_unique<PipelinedLlepDispatch>(sched, bound);
}

}  // namespace fp
