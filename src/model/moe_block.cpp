// MoE block of a decoder layer (single rank, plain dispatch), forward and backward.
// Legend: n tokens, H hidden, E experts, k experts per token, m = n * k routed copies, I expert width.
#include "model/blocks.h"
#include "model/routing.h"
#include "ops/moe_routing.h"

namespace fp {

namespace {
constexpr Category kAct = Category::Category_activations;
constexpr Category kDispatch = Category::Category_dispatch;
}  // namespace

Tensor moe_block_forward(StepContext& s, const LayerParams& lp, const Tensor& x1, MoeActs* keep, RouterStats* stats,
                         Category out_cat, const std::string& out_name) {
  Backend& be = s.be;
  const ops::Kernels& K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t n = s.n, H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok,
                I = c.moe_intermediate_size, m = n * k;
  MoeActs local;
  MoeActs& a = keep ? *keep : local;

  a.h2 = be.alloc_f32(kAct, {n, H}, "moe.h2");
  a.rstd2 = be.alloc_f32(kAct, {n}, "moe.rstd2");
  K.rmsnorm_forward(x1.f32(), lp.post_attention_layernorm->w.f32(), a.h2.f32(), a.rstd2.f32(), n, H,
                    static_cast<float>(c.rms_norm_eps));

  // Router: logits (n, E) -> probs, top-k. A routing profile overrides the choice, not the weights.
  {
    Tensor logits = be.alloc_f32(kAct, {n, E}, "moe.router_logits");
    linear_forward(be, a.h2.f32(), lp.gate->w.f32(), logits.f32(), n, H, E);
    a.probs = be.alloc_f32(kAct, {n, E}, "moe.probs");
    a.topk_idx = be.alloc(kAct, {n, k}, DType::DType_I32, "moe.topk_idx");
    a.topk_w = be.alloc_f32(kAct, {n, k}, "moe.topk_w");
    K.router_forward(logits.f32(), a.probs.f32(), a.topk_idx.i32(), a.topk_w.f32(), n, E, k, c.norm_topk_prob);
  }
  s.host_topk.resize(static_cast<size_t>(n * k));
  if (s.profile.kind == RoutingProfile::Kind::Kind_router) {
    be.copy_to_host(s.host_topk.data(), a.topk_idx.data(), a.topk_idx.bytes());
  } else {
    routing_profile_assign(s.profile, n, k, E, s.host_topk.data());
    be.copy_from_host(a.topk_idx.data(), s.host_topk.data(), a.topk_idx.bytes());
    K.router_gather(a.probs.f32(), a.topk_idx.i32(), a.topk_w.f32(), n, E, k, c.norm_topk_prob);
  }

  // Expert order: a stable counting sort of the routed copies by expert (host, like the count
  // exchange of expert parallelism), then the permutation goes to the device.
  s.host_rows.resize(static_cast<size_t>(m));
  s.host_slot.resize(static_cast<size_t>(m));
  a.offsets.assign(static_cast<size_t>(E + 1), 0);
  ops::moe_routing_build(s.host_topk.data(), n, k, E, s.host_rows.data(), s.host_slot.data(), a.offsets.data());
  if (stats) {
    stats->counts.assign(static_cast<size_t>(E), 0);
    for (int64_t e = 0; e < E; ++e) stats->counts[e] = a.offsets[e + 1] - a.offsets[e];
    stats->prob_sum.clear();
    if (be.computes()) {
      s.host_probs.resize(static_cast<size_t>(n * E));
      be.copy_to_host(s.host_probs.data(), a.probs.data(), a.probs.bytes());
      stats->prob_sum.assign(static_cast<size_t>(E), 0.0);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t e = 0; e < E; ++e) stats->prob_sum[e] += s.host_probs[t * E + e];
    }
  }
  a.rows = be.alloc(kDispatch, {m}, DType::DType_I32, "moe.rows");
  a.slot_pos = be.alloc(kDispatch, {n, k}, DType::DType_I32, "moe.slot_pos");
  be.copy_from_host(a.rows.data(), s.host_rows.data(), a.rows.bytes());
  be.copy_from_host(a.slot_pos.data(), s.host_slot.data(), a.slot_pos.bytes());

  a.xs = be.alloc_f32(kDispatch, {m, H}, "moe.xs");
  K.moe_gather(a.h2.f32(), a.rows.i32(), a.xs.f32(), m, H);
  if (!keep) {
    a.h2.reset();
    a.rstd2.reset();
    a.probs.reset();
    a.topk_idx.reset();
    a.rows.reset();
  }

  a.g = be.alloc_f32(kAct, {m, I}, "moe.g");
  a.u = be.alloc_f32(kAct, {m, I}, "moe.u");
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = a.offsets[e], ne = a.offsets[e + 1] - r0;
    if (ne == 0) continue;
    linear_forward(be, ptr_at(a.xs.f32(), r0 * H), lp.gate_proj[e]->w.f32(), ptr_at(a.g.f32(), r0 * I), ne, H, I);
    linear_forward(be, ptr_at(a.xs.f32(), r0 * H), lp.up_proj[e]->w.f32(), ptr_at(a.u.f32(), r0 * I), ne, H, I);
  }
  a.act = be.alloc_f32(kAct, {m, I}, "moe.act");
  K.swiglu_forward(a.g.f32(), a.u.f32(), a.act.f32(), m * I);
  if (!keep) {
    a.xs.reset();
    a.g.reset();
    a.u.reset();
  }
  a.ys = be.alloc_f32(kDispatch, {m, H}, "moe.ys");
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = a.offsets[e], ne = a.offsets[e + 1] - r0;
    if (ne == 0) continue;
    linear_forward(be, ptr_at(a.act.f32(), r0 * I), lp.down_proj[e]->w.f32(), ptr_at(a.ys.f32(), r0 * H), ne, I, H);
  }
  if (!keep) a.act.reset();

  Tensor x2 = be.alloc_f32(out_cat, {n, H}, out_name);
  K.copy(x2.f32(), x1.f32(), n * H);
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
  const int64_t n = s.n, H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok,
                I = c.moe_intermediate_size, m = n * k;

  // combine: x2 = x1 + sum_j w_j ys[slot_j]; the residual part stays in dx.
  Tensor dys = be.alloc_f32(kDispatch, {m, H}, "moe.dys");
  Tensor dw = be.alloc_f32(kAct, {n, k}, "moe.dw");
  K.moe_combine_backward(a.ys.f32(), a.slot_pos.i32(), a.topk_w.f32(), dx.f32(), dys.f32(), dw.f32(), n, k, H);
  a.ys.reset();
  a.topk_w.reset();

  // down_proj
  Tensor dact = be.alloc_f32(kAct, {m, I}, "moe.dact");
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = a.offsets[e], ne = a.offsets[e + 1] - r0;
    if (ne == 0) continue;
    linear_backward_input(be, ptr_at(dys.f32(), r0 * H), lp.down_proj[e]->w.f32(), ptr_at(dact.f32(), r0 * I), ne, I,
                          H);
    linear_backward_weight(be, ptr_at(dys.f32(), r0 * H), ptr_at(a.act.f32(), r0 * I), lp.down_proj[e]->g.f32(), ne,
                           I, H);
  }
  dys.reset();
  a.act.reset();

  // SwiGLU
  Tensor dg = be.alloc_f32(kAct, {m, I}, "moe.dg");
  Tensor du = be.alloc_f32(kAct, {m, I}, "moe.du");
  K.swiglu_backward(a.g.f32(), a.u.f32(), dact.f32(), dg.f32(), du.f32(), m * I);
  dact.reset();
  a.g.reset();
  a.u.reset();

  // gate_proj, up_proj
  Tensor dxs = be.alloc_f32(kDispatch, {m, H}, "moe.dxs");
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = a.offsets[e], ne = a.offsets[e + 1] - r0;
    if (ne == 0) continue;
    float* dxs_e = ptr_at(dxs.f32(), r0 * H);
    linear_backward_input(be, ptr_at(dg.f32(), r0 * I), lp.gate_proj[e]->w.f32(), dxs_e, ne, H, I);
    linear_backward_input(be, ptr_at(du.f32(), r0 * I), lp.up_proj[e]->w.f32(), dxs_e, ne, H, I, 1.0f);
    linear_backward_weight(be, ptr_at(dg.f32(), r0 * I), ptr_at(a.xs.f32(), r0 * H), lp.gate_proj[e]->g.f32(), ne, H,
                           I);
    linear_backward_weight(be, ptr_at(du.f32(), r0 * I), ptr_at(a.xs.f32(), r0 * H), lp.up_proj[e]->g.f32(), ne, H,
                           I);
  }
  dg.reset();
  du.reset();
  a.xs.reset();

  // back to token order
  Tensor dh2 = be.alloc_f32(kAct, {n, H}, "moe.dh2");
  K.fill(dh2.f32(), 0.0f, n * H);
  K.moe_scatter_add(dxs.f32(), a.slot_pos.i32(), dh2.f32(), n, k, H);
  dxs.reset();
  a.slot_pos.reset();
  a.rows.reset();

  // router: through the top-k weights, the softmax, and the load-balancing loss.
  {
    Tensor dlogits = be.alloc_f32(kAct, {n, E}, "moe.drouter_logits");
    K.router_backward(a.probs.f32(), a.topk_idx.i32(), dw.f32(), aux_bias.defined() ? aux_bias.f32() : nullptr,
                      dlogits.f32(), n, E, k, c.norm_topk_prob);
    linear_backward_input(be, dlogits.f32(), lp.gate->w.f32(), dh2.f32(), n, H, E, 1.0f);
    linear_backward_weight(be, dlogits.f32(), a.h2.f32(), lp.gate->g.f32(), n, H, E);
  }
  dw.reset();
  a.probs.reset();
  a.topk_idx.reset();
  a.h2.reset();

  // post_attention_layernorm
  Tensor dnorm = be.alloc_f32(kAct, {n, H}, "moe.dnorm");
  K.rmsnorm_backward(x1.f32(), lp.post_attention_layernorm->w.f32(), a.rstd2.f32(), dh2.f32(), dnorm.f32(),
                     lp.post_attention_layernorm->g.f32(), n, H);
  K.add_inplace(dx.f32(), dnorm.f32(), n * H);
  a.rstd2.reset();
}

}  // namespace fp
