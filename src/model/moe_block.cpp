// MoE block of a decoder layer, forward and backward: norm, router (softmax, or DeepSeek-V3's sigmoid:
// Note [Sigmoid routing] in ops/router.h), expert order, the expert dispatch (model/expert_dispatch.h),
// combine; DeepSeek-V3's shared experts beside them.
// Legend: n tokens, H hidden, E experts, k experts per token, m = n * k routed copies, I expert width,
// Is = n_shared_experts * I.
//
// Note [Shared experts]: the shared experts are one SwiGLU of width Is on every token's normed input h2,
// with the layer's own weights (row-sharded with the layer's dense weights, never dispatched). The block
// computes them before the routed copies leave: x2 = (shared(h2) + x1), formed in the FFN's output buffer,
// and the combine then adds the routed outputs into it, so h2 can go before the dispatch as without
// shared experts (x2 is alive during the dispatch instead: the same n x H). transformers sums
// x1 + (routed + shared); the order of the three terms differs from it by float rounding only.
#include "model/blocks.h"
#include "model/routing.h"
#include "model/expert_dispatch.h"
#include "model/expert_ffn.h"

namespace fp {

namespace {

FfnDims shared_dims(const ModelConfig& c) {
  return {c.hidden_size, c.n_shared_experts * c.moe_intermediate_size, "moe.shared"};
}
ExpertWeights shared_weights(const LayerParams& lp) {
  return {lp.shared_gate_proj->w.buf(), lp.shared_up_proj->w.buf(), lp.shared_down_proj->w.buf(),
          lp.shared_gate_proj->g.buf(), lp.shared_up_proj->g.buf(), lp.shared_down_proj->g.buf()};
}

// The router kernels' sizes and options for n tokens (ops/router.h).
ops::RouterSpec router_spec(const ModelConfig& c, int64_t n) {
  const auto r = static_cast<float>(c.routed_scaling_factor);
  return {n, c.num_experts, c.num_experts_per_tok, c.norm_topk_prob, c.n_group, c.topk_group, r};
}

// Whether the step routes a profile in closed form (meta: Note [Meta routes a profile in closed form] in
// model/routing.cpp), reading no expert order back.
bool routing_closed_form(const StepContext& s) {
  return s.profile.kind != RoutingProfile::Kind::Kind_router && !s.be.computes();
}

// The step's dispatch; without one (a StepContext built by hand, one rank) the local one.
ExpertDispatch& expert_dispatch(StepContext& s) {
  if (s.dispatch != nullptr) return *s.dispatch;
  FP_ASSERT(s.ep.size() == 1, "an expert group of several ranks needs s.dispatch (expert_dispatch_create)");
  thread_local std::unique_ptr<ExpertDispatch> local = dispatch_local_create();
  return *local;
}

// Note [One routing per token count]
// Note [A routing profile is routed once per step] holds for one n: what a profile routes (the offsets, per token
// chunk too, and a computing backend's choice host_topk), and what the dispatch builds from it (pipelined_llep's
// LLEP plan and chunk layouts, Note [One chunk layout per step under a routing profile]), is a function of the
// block's n and the run's settings alone (the profile, k, E, the ranks, the token chunk, the chunk cap), the
// same on every rank. A step with tiles sees two n's (the tile's and the last, shorter tile's) and switches
// between them twice per layer and pass; each n's routing is kept for the step (StepContext::profile_by_n, and
// the dispatch's by n) and taken back when its n returns, where it used to be routed and built afresh (on meta
// at 64 ranks, seconds per step near a preset's reach). The ledgers see the same events either way: the
// block and the dispatch allocate the same tensors for a kept routing as for a fresh one (the chunk order's
// pieces and counts are allocated on every call, fresh or not; only a computing backend reads the counts
// back, a copy), and what a fresh build adds, the all-gather of the expert counts and the all-to-all of the
// chunk counts, is host numbers on the control channel, matched on every rank because every rank sees the
// same n's in the same order. StepContext::reroute_each_n routes afresh at every change of n, as before;
// tests/unit/test_plan.cpp (PlanReuse) compares both timelines event for event on every preset.
void profile_cache_for_n(StepContext& s) {
  if (s.profile_n == s.n) return;
  if (s.reroute_each_n) {
    s.profile_offsets.clear();
    s.profile_chunk_offsets.clear();
    s.host_topk.clear();
    if (s.dispatch != nullptr) s.dispatch->profile_reset();
  } else {
    StepContext::ProfileRouting& was = s.profile_by_n[s.profile_n];
    was.offsets.swap(s.profile_offsets);
    was.chunk_offsets.swap(s.profile_chunk_offsets);
    was.host_topk.swap(s.host_topk);
    StepContext::ProfileRouting& now = s.profile_by_n[s.n];
    s.profile_offsets.swap(now.offsets);
    s.profile_chunk_offsets.swap(now.chunk_offsets);
    s.host_topk.swap(now.host_topk);
  }
  s.profile_n = s.n;
}

// h2 = rmsnorm(x1), the router (probs, topk_idx, topk_w into a) and a routing profile's choice over the
// router's, uploaded into a.topk_idx from s.host_topk (n, k). assign_profile: s.host_topk receives the
// profile's choice first; otherwise it holds it already (a profile routed earlier in the step) or nothing
// reads it (meta's closed form). The router's own choice stays on the device (Note [The routing sort on
// the device]).
void norm_and_route(StepContext& s, const LayerParams& lp, const Tensor& x1, MoeActs& a, bool assign_profile) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t n = s.n, H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok;
  a.h2 = be.alloc(kAct, {n, H}, s.precision.activations, "moe.h2");
  a.rstd2 = be.alloc_f32(kAct, {n}, "moe.rstd2");
  K.rmsnorm_forward(x1.buf(), lp.post_attention_layernorm->w.buf(), a.h2.buf(), a.rstd2.f32(), n, H,
                    static_cast<float>(c.rms_norm_eps));

  // Router: logits (n, E) -> probs, top-k. A routing profile overrides the choice, not the weights.
  {
    Tensor logits = be.alloc(kAct, {n, E}, s.precision.router, "moe.router_logits");
    linear_forward(be, a.h2.buf(), lp.gate->w.buf(), logits.f32(), n, H, E);
    if (c.router_bias()) K.bias_add(logits.f32(), lp.router_bias->w.buf(), n, E);  // gpt_oss
    a.probs = be.alloc(kAct, {n, E}, s.precision.router, "moe.probs");
    a.topk_idx = be.alloc(kAct, {n, k}, DType::DType_I32, "moe.topk_idx");
    a.topk_w = be.alloc(kAct, {n, k}, s.precision.router, "moe.topk_w");
    if (c.router_sigmoid())
      K.router_sigmoid_forward(logits.f32(), lp.gate_bias->w.f32(), a.probs.f32(), a.topk_idx.i32(), a.topk_w.f32(),
                               router_spec(c, n));
    else
      K.router_forward(logits.f32(), a.probs.f32(), a.topk_idx.i32(), a.topk_w.f32(), router_spec(c, n));
  }
  const bool profiled = s.profile.kind != RoutingProfile::Kind::Kind_router;
  if (assign_profile) {
    FP_ASSERT(profiled);
    s.host_topk.resize(static_cast<size_t>(n * k));
    routing_profile_assign(s.profile, n, k, E, s.host_topk.data());
  }
  if (profiled) {
    be.copy_from_host(a.topk_idx.data(), s.host_topk.data(), a.topk_idx.bytes());
    if (c.router_sigmoid())
      K.router_sigmoid_gather(a.probs.f32(), a.topk_idx.i32(), a.topk_w.f32(), router_spec(c, n));
    else
      K.router_gather(a.probs.f32(), a.topk_idx.i32(), a.topk_w.f32(), router_spec(c, n));
  }
}

// Note [The routing sort on the device]
// The expert order (rows (m), slot_pos (n, k), offsets (E + 1): the stable counting sort of
// ops/moe_routing.h) is built by the kernel table's moe_routing_build from the top-k on the device, the
// router's or a profile's choice uploaded there, so rows and slot_pos never leave the device. Only the
// E + 1 offsets cross to the host: the dispatch sizes its buffers and collectives by the counts (as
// every GPU MoE reads its counts back). A dispatch that plans per row (ExpertDispatch::reads_rows:
// pipelined_llep's chunk order, ops/moe_chunk_order.h) reads the rows on the device too, so the block
// keeps them alive into its forward and the forward frees them once read (MoeChunk::release_rows); only
// its counts come back. Before, the (n, k) top-k went to the host and rows and slot_pos came back: 3 n k
// int32 per layer; then the rows still went down for pipelined_llep: n k int32 per layer. The offsets
// are category workspace for the sort's duration, allocated on meta too (the same ledger); there they
// come from the profile's closed form (Note [Meta routes a profile in closed form]) or from the step's
// first routing (Note [A routing profile is routed once per step]), never from the device.

// rows (nc k) and slot_pos (nc, k) of the block's tokens [t0, t0 + nc), allocated here (activations), by
// the routing sort; offsets (E + 1), when not null, receive its counts (null: the caller has them).
void routing_sort(StepContext& s, const MoeActs& a, int64_t t0, int64_t nc, Tensor& rows, Tensor& slot_pos,
                  std::vector<int64_t>* offsets) {
  Backend& be = s.be;
  const int64_t E = s.cfg.num_experts, k = s.cfg.num_experts_per_tok;
  rows = be.alloc(kAct, {nc * k}, DType::DType_I32, "moe.rows");
  slot_pos = be.alloc(kAct, {nc, k}, DType::DType_I32, "moe.slot_pos");
  Tensor dev_offsets = be.alloc(Category::Category_workspace, {E + 1}, DType::DType_I64, "moe.expert_offsets");
  be.kernels().moe_routing_build(ptr_at(a.topk_idx.i32(), t0 * k), nc, k, E, rows.i32(), slot_pos.i32(),
                                 static_cast<int64_t*>(dev_offsets.data()));
  if (offsets == nullptr) return;
  offsets->resize(static_cast<size_t>(E + 1));
  be.copy_to_host(offsets->data(), dev_offsets.data(), dev_offsets.bytes());
}

// stats (the load-balancing loss's): routed copies per expert from the offsets (E + 1) of a chunk of the
// block's tokens (added), and with sums the router probabilities summed over all the block's tokens, added
// on the device into stats.prob_sum where the step asks for them (each column in token order, in double:
// the sums a host loop would make; nothing crosses to the host here, Note [One read at the step's end] in
// step/step.cpp).
void stats_fill(StepContext& s, const MoeActs& a, std::span<const int64_t> offsets, RouterStats& stats, bool sums) {
  const int64_t E = s.cfg.num_experts;
  stats.counts.resize(static_cast<size_t>(E), 0);
  for (int64_t e = 0; e < E; ++e) stats.counts[e] += offsets[e + 1] - offsets[e];
  if (sums && stats.prob_sum != nullptr) s.be.kernels().column_sums_f64(a.probs.f32(), s.n, E, stats.prob_sum);
}

// ---- Note [The MoE token side in chunks]
// With moe.token_chunk = c < n the block's token side runs in chunks of c of the rank's tokens (the last
// may be shorter): per chunk its routed copies are sorted by expert, gathered from h2 (xs, m_c = c k
// rows), sent through the dispatch (every rank has the same n, so every rank makes the same number of
// dispatch calls and the collectives stay matched) and combined into the chunk's rows of x2. In the
// backward pass the recompute and the backward run chunk by chunk (moe_block_recompute_backward):
// the chunk's forward with keep, the combine's backward for its rows (d ys, and d w into the (n, k) top-k
// weight gradient), the dispatch's backward, d h2 scattered into its rows; the router's backward then
// runs once over all tokens. So the routed copies (xs, ys, dys, dxs), the rows and the FFN intermediates
// exist for one chunk at a time: the block's token side is bounded by c, not by n k. What stays whole is
// per token: h2, d h2, the router's (n, E) and (n, k) tensors, and the shared experts' intermediates.
// A dispatch sees the chunk as its tokens: the block hands it a MoeChunk (model/expert_dispatch.h) with the
// window, its rows' tokens counted from the chunk's first token and, where offered, the chunk's rows of h2
// (the unchunked block is the one window of all n tokens); a routing profile routes the rank's n tokens as without
// chunks (the chunk takes its rows of that choice, in closed form on meta), so chunked and unchunked
// steps route alike. Results: every token's output and every input gradient are the same function; the
// expert GEMMs see the rows of one chunk at a time, and the weight gradients accumulate chunk by chunk, so
// the sums run in another order (not bit-identical; within 1e-6 relative, tests/model/test_moe_chunks.cpp).
// c >= n is the unchunked block, bit for bit.

bool moe_chunked(const StepContext& s) { return s.moe_token_chunk > 0 && s.moe_token_chunk < s.n; }

// The routing of the block's tokens [t0, t0 + nc), its chunk number `chunk`: rows (m_c) and slot_pos
// (nc, k) on the device (chunk-local token and slot positions) and the offsets (E + 1) of its copies by
// expert on the host (Note [The routing sort on the device]).
void chunk_route(StepContext& s, const MoeActs& a, int64_t chunk, int64_t t0, int64_t nc, Tensor& rows,
                 Tensor& slot_pos, std::vector<int64_t>& offsets) {
  const int64_t E = s.cfg.num_experts, k = s.cfg.num_experts_per_tok;
  const bool closed_form = routing_closed_form(s);
  routing_sort(s, a, t0, nc, rows, slot_pos, closed_form ? nullptr : &offsets);
  if (!closed_form) return;
  // Note [Meta routes a profile in closed form]; every layer routes a chunk alike (Note [A routing
  // profile is routed once per step]): counted once per step.
  const size_t c = static_cast<size_t>(chunk);
  if (s.profile_chunk_offsets.size() <= c) s.profile_chunk_offsets.resize(c + 1);
  if (s.profile_chunk_offsets[c].empty()) {
    s.profile_chunk_offsets[c].assign(static_cast<size_t>(E + 1), 0);
    routing_profile_offsets_range(s.profile, s.n, k, E, t0, t0 + nc, s.profile_chunk_offsets[c].data());
  }
  offsets = s.profile_chunk_offsets[c];
}

// The shared experts' output plus x1 (Note [Shared experts]) in a new (n, H) buffer, or x1's copy.
Tensor moe_output_start(StepContext& s, const LayerParams& lp, const Tensor& x1, MoeActs& a, bool keep,
                        Category out_cat, const std::string& out_name) {
  Backend& be = s.be;
  const int64_t n = s.n, H = s.cfg.hidden_size;
  Tensor x2;
  if (s.cfg.n_shared_experts > 0) {
    ExpertActs sh;
    sh.x = Tensor::view(a.h2, 0, {n, H}, "moe.h2");
    const ExpertWeights w = shared_weights(lp);
    const int64_t offsets[2] = {0, n};
    x2 = expert_ffn_forward(be, shared_dims(s.cfg), {&w, 1}, offsets, sh, keep, out_name, out_cat,
                            s.precision.activations);
    be.kernels().add_inplace(x2.buf(), x1.buf(), n * H);
    a.shared_g = std::move(sh.g);
    a.shared_u = std::move(sh.u);
    a.shared_act = std::move(sh.act);
  } else {
    x2 = be.alloc(out_cat, {n, H}, s.precision.activations, out_name);
    be.kernels().copy(x2.buf(), x1.buf(), n * H);
  }
  return x2;
}

// The shared experts' backward from d x2 (dx): d h2's start, or zeros without shared experts.
Tensor moe_dh2_start(StepContext& s, const LayerParams& lp, MoeActs& a, const Tensor& dx) {
  Backend& be = s.be;
  const int64_t n = s.n, H = s.cfg.hidden_size;
  if (s.cfg.n_shared_experts == 0) {
    Tensor dh2 = be.alloc(kAct, {n, H}, s.precision.activations, "moe.dh2");
    be.kernels().fill(dh2.buf(), 0.0f, n * H);
    return dh2;
  }
  Tensor dy = be.alloc(kAct, {n, H}, s.precision.activations, "moe.shared.dy");
  be.kernels().copy(dy.buf(), dx.buf(), n * H);
  ExpertActs sh;
  sh.x = Tensor::view(a.h2, 0, {n, H}, "moe.h2");
  sh.g = std::move(a.shared_g);
  sh.u = std::move(a.shared_u);
  sh.act = std::move(a.shared_act);
  const ExpertWeights w = shared_weights(lp);
  const int64_t offsets[2] = {0, n};
  return expert_ffn_backward(be, shared_dims(s.cfg), {&w, 1}, offsets, sh, dy, "moe.dh2", kAct,
                             s.precision.activations);
}

// The router's backward (through the top-k weights dw (n, k), the softmax or sigmoid, and the
// load-balancing loss) into dh2, then post_attention_layernorm's into dx; frees dw and what is left of a.
void router_norm_backward(StepContext& s, const LayerParams& lp, const Tensor& x1, MoeActs& a, Tensor& dw,
                          const Tensor& aux_bias, Tensor& dh2, Tensor& dx) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t n = s.n, H = c.hidden_size, E = c.num_experts;
  // router: through the top-k weights, the softmax (or sigmoid), and the load-balancing loss.
  {
    Tensor dlogits = be.alloc(kAct, {n, E}, s.precision.router, "moe.drouter_logits");
    if (c.router_sigmoid()) {
      FP_ASSERT(!aux_bias.defined(), "the sigmoid router has no load-balancing loss (router_aux_loss_coef = 0)");
      K.router_sigmoid_backward(a.probs.f32(), a.topk_idx.i32(), dw.f32(), dlogits.f32(), router_spec(c, n));
    } else {
      K.router_backward(a.probs.f32(), a.topk_idx.i32(), dw.f32(), aux_bias.defined() ? aux_bias.f32() : nullptr,
                        dlogits.f32(), router_spec(c, n));
    }
    linear_backward_input(be, dlogits.f32(), lp.gate->w.buf(), dh2.buf(), n, H, E, 1.0f);
    linear_backward_weight(be, dlogits.f32(), a.h2.buf(), lp.gate->g.buf(), n, H, E);
    if (c.router_bias()) K.bias_backward(dlogits.f32(), lp.router_bias->g.buf(), n, E);
  }
  dw.reset();
  a.probs.reset();
  a.topk_idx.reset();
  a.h2.reset();

  // post_attention_layernorm
  Tensor dnorm = be.alloc(kAct, {n, H}, s.precision.activations, "moe.dnorm");
  rmsnorm_backward(be, x1.buf(), lp.post_attention_layernorm->w.buf(), a.rstd2.f32(), dh2.buf(), dnorm.buf(),
                   lp.post_attention_layernorm->g.buf(), n, H);
  K.add_inplace(dx.buf(), dnorm.buf(), n * H);
  a.rstd2.reset();
}

Tensor moe_block_forward_chunked(StepContext& s, const LayerParams& lp, const Tensor& x1, RouterStats* stats,
                                 Category out_cat, const std::string& out_name) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const int64_t n = s.n, H = s.cfg.hidden_size, k = s.cfg.num_experts_per_tok, c = s.moe_token_chunk;
  const bool profiled = s.profile.kind != RoutingProfile::Kind::Kind_router;
  MoeActs a;
  norm_and_route(s, lp, x1, a, profiled && be.computes());
  Tensor x2 = moe_output_start(s, lp, x1, a, false, out_cat, out_name);
  if (stats) stats->counts.clear();
  std::vector<int64_t> offsets;
  for (int64_t t0 = 0, chunk = 0; t0 < n; t0 += c, ++chunk) {
    const int64_t nc = std::min(c, n - t0), mc = nc * k;
    Tensor rows, slot_pos;
    chunk_route(s, a, chunk, t0, nc, rows, slot_pos, offsets);
    if (stats) stats_fill(s, a, offsets, *stats, chunk == 0);
    Tensor xs = be.alloc(kAct, {mc, H}, s.precision.activations, "moe.xs");
    K.moe_gather(ptr_at(a.h2.buf(), t0 * H), rows.i32(), xs.buf(), mc, H);
    // The rows go into a dispatch that reads them (Note [The routing sort on the device]), which frees them.
    const bool reads = expert_dispatch(s).reads_rows();
    if (!reads) rows.reset();
    const MoeChunk window{chunk, t0, nc, reads ? &rows : nullptr, true, nullptr};
    Tensor ys = expert_dispatch(s).forward(s, lp, std::move(xs), offsets, window, nullptr);
    K.moe_combine_forward(ys.buf(), slot_pos.i32(), ptr_at(a.topk_w.f32(), t0 * k), ptr_at(x2.buf(), t0 * H), nc, k, H);
  }
  return x2;
}
}  // namespace

Tensor moe_block_forward(StepContext& s, const LayerParams& lp, const Tensor& x1, MoeActs* keep, RouterStats* stats,
                         Category out_cat, const std::string& out_name) {
  profile_cache_for_n(s);
  if (!keep && moe_chunked(s)) return moe_block_forward_chunked(s, lp, x1, stats, out_cat, out_name);
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t n = s.n, H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok, m = n * k;
  MoeActs local;
  MoeActs& a = keep ? *keep : local;
  const bool profiled = s.profile.kind != RoutingProfile::Kind::Kind_router;
  const bool routed = profiled && !s.profile_offsets.empty();  // Note [A routing profile is routed once per step]
  // Note [Meta routes a profile in closed form] (model/routing.cpp): no (n, k) or (m) host arrays.
  const bool closed_form = routing_closed_form(s);
  norm_and_route(s, lp, x1, a, profiled && !routed && !closed_form);

  // Expert order: the routing sort on the device (Note [The routing sort on the device]); its offsets
  // come to the host, under a profile once per step.
  routing_sort(s, a, 0, n, a.rows, a.slot_pos, routed || closed_form ? nullptr : &a.offsets);
  if (routed) {
    a.offsets = s.profile_offsets;
  } else if (closed_form) {
    a.offsets.assign(static_cast<size_t>(E + 1), 0);
    routing_profile_offsets(s.profile, n, k, E, a.offsets.data());
    s.profile_offsets = a.offsets;
  } else if (profiled) {
    s.profile_offsets = a.offsets;
  }
  if (stats) {
    stats->counts.clear();
    stats_fill(s, a, a.offsets, *stats, true);
  }
  // The rows go into a dispatch that reads them (Note [The routing sort on the device]), which frees them
  // without keep.
  const bool reads = expert_dispatch(s).reads_rows();

  // Note [Shared experts]: x2 = shared(h2) + x1 before the routed copies leave.
  Tensor x2;
  if (c.n_shared_experts > 0) x2 = moe_output_start(s, lp, x1, a, keep != nullptr, out_cat, out_name);

  Tensor xs = be.alloc(kAct, {m, H}, s.precision.activations, "moe.xs");  // (m, H) routed copies in expert order
  K.moe_gather(a.h2.buf(), a.rows.i32(), xs.buf(), m, H);
  if (!keep) {
    a.h2.reset();
    a.rstd2.reset();
    a.probs.reset();
    a.topk_idx.reset();
    if (!reads) a.rows.reset();
  }

  // The experts, wherever they live: the dispatch takes xs and returns ys (m, H) in the same order.
  // Without keep, h2 was freed above and the rows are freed by the dispatch that reads them.
  const MoeChunk whole{0, 0, n, reads ? &a.rows : nullptr, !keep, keep ? &a.h2 : nullptr};
  a.ys = expert_dispatch(s).forward(s, lp, std::move(xs), a.offsets, whole, keep ? &a.dispatch : nullptr);

  if (!x2.defined()) {
    x2 = be.alloc(out_cat, {n, H}, s.precision.activations, out_name);
    K.copy(x2.buf(), x1.buf(), n * H);
  }
  K.moe_combine_forward(a.ys.buf(), a.slot_pos.i32(), a.topk_w.f32(), x2.buf(), n, k, H);
  if (!keep) {
    a.ys.reset();
    a.slot_pos.reset();
    a.topk_w.reset();
  }
  return x2;
}

void moe_block_backward(StepContext& s, const LayerParams& lp, const Tensor& x1, MoeActs& a, const Tensor& aux_bias,
                        Tensor& dx) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t n = s.n, H = c.hidden_size, k = c.num_experts_per_tok;

  // combine: x2 = x1 + sum_j w_j ys[slot_j]; the residual part stays in dx. dys is formed in place in
  // ys's buffer (each row's dw is read first): no second (m, H) buffer at the layer's peak.
  Tensor dw = be.alloc(kAct, {n, k}, s.precision.router, "moe.dw");
  K.moe_combine_backward(a.ys.buf(), a.slot_pos.i32(), a.topk_w.f32(), dx.buf(), a.ys.buf(), dw.f32(), n, k, H);
  Tensor dys = std::move(a.ys);  // (m, H) now d loss / d ys
  a.topk_w.reset();

  // Shared experts (Note [Shared experts]): their input gradient starts d h2.
  Tensor dh2;
  if (c.n_shared_experts > 0) dh2 = moe_dh2_start(s, lp, a, dx);

  // The experts' backward, wherever they live: dys (m, H) -> dxs (m, H); owned experts' weight gradients.
  const MoeChunk whole{0, 0, n, nullptr, false, &a.h2};
  Tensor dxs = expert_dispatch(s).backward(s, lp, std::move(dys), a.offsets, whole, std::move(a.dispatch));

  // back to token order
  if (!dh2.defined()) {
    dh2 = be.alloc(kAct, {n, H}, s.precision.activations, "moe.dh2");
    K.fill(dh2.buf(), 0.0f, n * H);
  }
  K.moe_scatter_add(dxs.buf(), a.slot_pos.i32(), dh2.buf(), n, k, H);
  dxs.reset();
  a.slot_pos.reset();
  a.rows.reset();

  router_norm_backward(s, lp, x1, a, dw, aux_bias, dh2, dx);
}

void moe_block_recompute_backward(StepContext& s, const LayerParams& lp, const Tensor& x1, const Tensor& aux_bias,
                                  Tensor& dx) {
  profile_cache_for_n(s);
  if (!moe_chunked(s)) {
    MoeActs a;
    moe_block_forward(s, lp, x1, &a, nullptr).reset();
    moe_block_backward(s, lp, x1, a, aux_bias, dx);
    return;
  }
  // Note [The MoE token side in chunks]: the recompute and the backward, chunk by chunk.
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t n = s.n, H = c.hidden_size, k = c.num_experts_per_tok, ct = s.moe_token_chunk;
  const bool profiled = s.profile.kind != RoutingProfile::Kind::Kind_router;
  MoeActs a;
  norm_and_route(s, lp, x1, a, profiled && be.computes());
  if (c.n_shared_experts > 0) moe_output_start(s, lp, x1, a, true, kAct, "moe.x2").reset();  // keeps its intermediates
  Tensor dh2 = moe_dh2_start(s, lp, a, dx);
  Tensor dw = be.alloc(kAct, {n, k}, s.precision.router, "moe.dw");
  std::vector<int64_t> offsets;
  for (int64_t t0 = 0, chunk = 0; t0 < n; t0 += ct, ++chunk) {
    const int64_t nc = std::min(ct, n - t0), mc = nc * k;
    Tensor rows, slot_pos;
    chunk_route(s, a, chunk, t0, nc, rows, slot_pos, offsets);
    Tensor xs = be.alloc(kAct, {mc, H}, s.precision.activations, "moe.xs");
    K.moe_gather(ptr_at(a.h2.buf(), t0 * H), rows.i32(), xs.buf(), mc, H);
    const Tensor h2_chunk = Tensor::view(a.h2, t0 * H, {nc, H}, "moe.h2");
    const bool reads = expert_dispatch(s).reads_rows();  // Note [The routing sort on the device]
    if (!reads) rows.reset();
    const MoeChunk window{chunk, t0, nc, reads ? &rows : nullptr, true, &h2_chunk};
    std::unique_ptr<DispatchActs> acts;
    Tensor ys = expert_dispatch(s).forward(s, lp, std::move(xs), offsets, window, &acts);
    // d ys in ys's buffer and the chunk's rows of d w (as moe_block_backward does for the whole block).
    K.moe_combine_backward(ys.buf(), slot_pos.i32(), ptr_at(a.topk_w.f32(), t0 * k), ptr_at(dx.buf(), t0 * H), ys.buf(),
                           ptr_at(dw.f32(), t0 * k), nc, k, H);
    const MoeChunk window_back{chunk, t0, nc, nullptr, false, &h2_chunk};
    Tensor dxs = expert_dispatch(s).backward(s, lp, std::move(ys), offsets, window_back, std::move(acts));
    K.moe_scatter_add(dxs.buf(), slot_pos.i32(), ptr_at(dh2.buf(), t0 * H), nc, k, H);
  }
  a.topk_w.reset();

  router_norm_backward(s, lp, x1, a, dw, aux_bias, dh2, dx);
}

}  // namespace fp
