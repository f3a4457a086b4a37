// MoE block of a decoder layer, forward and backward: norm, router (softmax, or DeepSeek-V3's sigmoid:
// Note [Sigmoid routing] in ops/router.h), expert order, the expert dispatch (sched/dispatch/dispatch.h),
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
#include "ops/moe_routing.h"
#include "sched/dispatch/dispatch.h"
#include "sched/dispatch/expert_ffn.h"

namespace fp {

namespace {
constexpr Category kAct = Category::Category_activations;

FfnDims shared_dims(const ModelConfig& c) {
  return {c.hidden_size, c.n_shared_experts * c.moe_intermediate_size, "moe.shared"};
}
ExpertWeights shared_weights(const LayerParams& lp) {
  return {lp.shared_gate_proj->w.f32(), lp.shared_up_proj->w.f32(), lp.shared_down_proj->w.f32(),
          lp.shared_gate_proj->g.f32(), lp.shared_up_proj->g.f32(), lp.shared_down_proj->g.f32()};
}

// The step's dispatch; without one (a StepContext built by hand, one rank) the local one.
ExpertDispatch& expert_dispatch(StepContext& s) {
  if (s.dispatch != nullptr) return *s.dispatch;
  FP_ASSERT(s.comm.size() == 1, "a multi-rank step needs s.dispatch (expert_dispatch_create)");
  thread_local std::unique_ptr<ExpertDispatch> local = dispatch_local_create();
  return *local;
}
}  // namespace

Tensor moe_block_forward(StepContext& s, const LayerParams& lp, const Tensor& x1, MoeActs* keep, RouterStats* stats,
                         Category out_cat, const std::string& out_name) {
  Backend& be = s.be;
  const ops::Kernels& K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t n = s.n, H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok, m = n * k;
  MoeActs local;
  MoeActs& a = keep ? *keep : local;

  a.h2 = be.alloc(kAct, {n, H}, s.precision.activations, "moe.h2");
  a.rstd2 = be.alloc_f32(kAct, {n}, "moe.rstd2");
  K.rmsnorm_forward(x1.f32(), lp.post_attention_layernorm->w.f32(), a.h2.f32(), a.rstd2.f32(), n, H,
                    static_cast<float>(c.rms_norm_eps));

  // Router: logits (n, E) -> probs, top-k. A routing profile overrides the choice, not the weights.
  {
    Tensor logits = be.alloc(kAct, {n, E}, s.precision.router, "moe.router_logits");
    linear_forward(be, a.h2.f32(), lp.gate->w.f32(), logits.f32(), n, H, E);
    a.probs = be.alloc(kAct, {n, E}, s.precision.router, "moe.probs");
    a.topk_idx = be.alloc(kAct, {n, k}, DType::DType_I32, "moe.topk_idx");
    a.topk_w = be.alloc(kAct, {n, k}, s.precision.router, "moe.topk_w");
    if (c.router_sigmoid())
      K.router_sigmoid_forward(logits.f32(), lp.gate_bias->w.f32(), a.probs.f32(), a.topk_idx.i32(), a.topk_w.f32(), n,
                               E, k, c.n_group, c.topk_group, c.norm_topk_prob,
                               static_cast<float>(c.routed_scaling_factor));
    else
      K.router_forward(logits.f32(), a.probs.f32(), a.topk_idx.i32(), a.topk_w.f32(), n, E, k, c.norm_topk_prob);
  }
  const bool profiled = s.profile.kind != RoutingProfile::Kind::Kind_router;
  const bool routed = profiled && !s.profile_offsets.empty();  // Note [A routing profile is routed once per step]
  // Note [Meta routes a profile in closed form] (model/routing.cpp): no (n, k) or (m) host arrays.
  const bool closed_form = profiled && !be.computes();
  if (!routed && !closed_form) {
    s.host_topk.resize(static_cast<size_t>(n * k));
    if (profiled)
      routing_profile_assign(s.profile, n, k, E, s.host_topk.data());
    else
      be.copy_to_host(s.host_topk.data(), a.topk_idx.data(), a.topk_idx.bytes());
  }
  if (profiled) {
    be.copy_from_host(a.topk_idx.data(), s.host_topk.data(), a.topk_idx.bytes());
    if (c.router_sigmoid())
      K.router_sigmoid_gather(a.probs.f32(), a.topk_idx.i32(), a.topk_w.f32(), n, E, k, c.norm_topk_prob,
                              static_cast<float>(c.routed_scaling_factor));
    else
      K.router_gather(a.probs.f32(), a.topk_idx.i32(), a.topk_w.f32(), n, E, k, c.norm_topk_prob);
  }

  // Expert order: a stable counting sort of the routed copies by expert (host, like the count
  // exchange of expert parallelism), then the permutation goes to the device. With a profile, once
  // per step.
  if (routed) {
    a.offsets = s.profile_offsets;
  } else if (closed_form) {
    a.offsets.assign(static_cast<size_t>(E + 1), 0);
    routing_profile_offsets(s.profile, n, k, E, a.offsets.data());
    s.profile_offsets = a.offsets;
    s.host_rows.clear();  // nothing on meta reads the rows (pipelined_llep counts in closed form too)
  } else {
    s.host_rows.resize(static_cast<size_t>(m));
    s.host_slot.resize(static_cast<size_t>(m));
    a.offsets.assign(static_cast<size_t>(E + 1), 0);
    ops::moe_routing_build(s.host_topk.data(), n, k, E, s.host_rows.data(), s.host_slot.data(), a.offsets.data());
    if (profiled) s.profile_offsets = a.offsets;
  }
  if (stats) {
    stats->counts.assign(static_cast<size_t>(E), 0);
    for (int64_t e = 0; e < E; ++e) stats->counts[e] = a.offsets[e + 1] - a.offsets[e];
    stats->prob_sum.clear();
    // Summed on the device (the same double sums, in token order, as a host loop would): E numbers
    // cross to the host, not the (n, E) probabilities. Allocated on meta too (the same ledger).
    Tensor sums = be.alloc(Category::Category_workspace, {E}, DType::DType_F64, "moe.prob_sum");
    K.column_sums_f64(a.probs.f32(), n, E, sums.f64());
    if (be.computes()) {
      stats->prob_sum.resize(static_cast<size_t>(E));
      be.copy_to_host(stats->prob_sum.data(), sums.data(), sums.bytes());
    }
  }
  a.rows = be.alloc(kAct, {m}, DType::DType_I32, "moe.rows");
  a.slot_pos = be.alloc(kAct, {n, k}, DType::DType_I32, "moe.slot_pos");
  be.copy_from_host(a.rows.data(), s.host_rows.data(), a.rows.bytes());
  be.copy_from_host(a.slot_pos.data(), s.host_slot.data(), a.slot_pos.bytes());

  // Note [Shared experts]: x2 = shared(h2) + x1 before the routed copies leave.
  Tensor x2;
  if (c.n_shared_experts > 0) {
    ExpertActs sh;
    sh.x = Tensor::view(a.h2, 0, {n, H}, "moe.h2");
    const ExpertWeights w = shared_weights(lp);
    const int64_t offsets[2] = {0, n};
    x2 = expert_ffn_forward(be, shared_dims(c), {&w, 1}, offsets, sh, keep != nullptr, out_name, out_cat,
                            s.precision.activations);
    K.add_inplace(x2.f32(), x1.f32(), n * H);
    a.shared_g = std::move(sh.g);
    a.shared_u = std::move(sh.u);
    a.shared_act = std::move(sh.act);
  }

  Tensor xs = be.alloc(kAct, {m, H}, s.precision.activations, "moe.xs");  // (m, H) routed copies in expert order
  K.moe_gather(a.h2.f32(), a.rows.i32(), xs.f32(), m, H);
  if (!keep) {
    a.h2.reset();
    a.rstd2.reset();
    a.probs.reset();
    a.topk_idx.reset();
    a.rows.reset();
  }

  // The experts, wherever they live: the dispatch takes xs and returns ys (m, H) in the same order.
  s.moe_h2 = keep ? &a.h2 : nullptr;  // freed above unless kept
  a.ys = expert_dispatch(s).forward(s, lp, std::move(xs), a.offsets, keep ? &a.dispatch : nullptr);
  s.moe_h2 = nullptr;

  if (!x2.defined()) {
    x2 = be.alloc(out_cat, {n, H}, s.precision.activations, out_name);
    K.copy(x2.f32(), x1.f32(), n * H);
  }
  K.moe_combine_forward(a.ys.f32(), a.slot_pos.i32(), a.topk_w.f32(), x2.f32(), n, k, H);
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
  const ops::Kernels& K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t n = s.n, H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok;

  // combine: x2 = x1 + sum_j w_j ys[slot_j]; the residual part stays in dx. dys is formed in place in
  // ys's buffer (each row's dw is read first): no second (m, H) buffer at the layer's peak.
  Tensor dw = be.alloc(kAct, {n, k}, s.precision.router, "moe.dw");
  K.moe_combine_backward(a.ys.f32(), a.slot_pos.i32(), a.topk_w.f32(), dx.f32(), a.ys.f32(), dw.f32(), n, k, H);
  Tensor dys = std::move(a.ys);  // (m, H) now d loss / d ys
  a.topk_w.reset();

  // Shared experts (Note [Shared experts]): their input gradient starts d h2.
  Tensor dh2;
  if (c.n_shared_experts > 0) {
    Tensor dy = be.alloc(kAct, {n, H}, s.precision.activations, "moe.shared.dy");
    K.copy(dy.f32(), dx.f32(), n * H);
    ExpertActs sh;
    sh.x = Tensor::view(a.h2, 0, {n, H}, "moe.h2");
    sh.g = std::move(a.shared_g);
    sh.u = std::move(a.shared_u);
    sh.act = std::move(a.shared_act);
    const ExpertWeights w = shared_weights(lp);
    const int64_t offsets[2] = {0, n};
    dh2 = expert_ffn_backward(be, shared_dims(c), {&w, 1}, offsets, sh, dy, "moe.dh2", kAct, s.precision.activations);
  }

  // The experts' backward, wherever they live: dys (m, H) -> dxs (m, H); owned experts' weight gradients.
  s.moe_h2 = &a.h2;
  Tensor dxs = expert_dispatch(s).backward(s, lp, std::move(dys), a.offsets, std::move(a.dispatch));
  s.moe_h2 = nullptr;

  // back to token order
  if (!dh2.defined()) {
    dh2 = be.alloc(kAct, {n, H}, s.precision.activations, "moe.dh2");
    K.fill(dh2.f32(), 0.0f, n * H);
  }
  K.moe_scatter_add(dxs.f32(), a.slot_pos.i32(), dh2.f32(), n, k, H);
  dxs.reset();
  a.slot_pos.reset();
  a.rows.reset();

  // router: through the top-k weights, the softmax (or sigmoid), and the load-balancing loss.
  {
    Tensor dlogits = be.alloc(kAct, {n, E}, s.precision.router, "moe.drouter_logits");
    if (c.router_sigmoid()) {
      FP_ASSERT(!aux_bias.defined(), "the sigmoid router has no load-balancing loss (router_aux_loss_coef = 0)");
      K.router_sigmoid_backward(a.probs.f32(), a.topk_idx.i32(), dw.f32(), dlogits.f32(), n, E, k, c.norm_topk_prob,
                                static_cast<float>(c.routed_scaling_factor));
    } else {
      K.router_backward(a.probs.f32(), a.topk_idx.i32(), dw.f32(), aux_bias.defined() ? aux_bias.f32() : nullptr,
                        dlogits.f32(), n, E, k, c.norm_topk_prob);
    }
    linear_backward_input(be, dlogits.f32(), lp.gate->w.f32(), dh2.f32(), n, H, E, 1.0f);
    linear_backward_weight(be, dlogits.f32(), a.h2.f32(), lp.gate->g.f32(), n, H, E);
  }
  dw.reset();
  a.probs.reset();
  a.topk_idx.reset();
  a.h2.reset();

  // post_attention_layernorm
  Tensor dnorm = be.alloc(kAct, {n, H}, s.precision.activations, "moe.dnorm");
  rmsnorm_backward(be, x1.f32(), lp.post_attention_layernorm->w.f32(), a.rstd2.f32(), dh2.f32(), dnorm.f32(),
                     lp.post_attention_layernorm->g.f32(), n, H);
  K.add_inplace(dx.f32(), dnorm.f32(), n * H);
  a.rstd2.reset();
}

}  // namespace fp
