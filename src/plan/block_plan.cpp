// The blocks and heads of one step's allocation sequence (step_replay.h), mirroring, allocation for
// allocation and free for free: model/attention_block.cpp with model/ring_attention.cpp,
// model/moe_block.cpp, sched/vocab/head_full.cpp, sched/vocab/ring_dtp.cpp. A change in any of them
// must be mirrored here; tests/model/test_plan_vs_meta.cpp fails otherwise and prints the first
// event that differs (one rank, and rank r of W through a comm that moves nothing). Standard EP
// (sched/dispatch/standard.cpp), FSDP units and Ring-DTP over P ranks (sched/vocab/ring_dtp_ring.cpp)
// are validated at the engine's layout (cp = ep = fsdp = W); PipelinedLLEP is predicted from
// DESIGN.md (Note [Which plans are validated] in plan.cpp).
// Legend: see step_replay.h.
#include <algorithm>

#include "plan/step_replay.h"

namespace fp::plan::detail {

// ---- attention block (model/attention_block.cpp) ----------------------------------------------

Id attn_forward(Step& s, AttnIds& a, bool keep) {
  PeakReplay& d = s.d;
  const int64_t N = s.N;
  a.h1 = d.alloc(kAct, s.act(N * s.H), "attn.h1");        // (N, H)
  a.rstd1 = d.alloc(kAct, s.f32(N), "attn.rstd1");        // (N)
  a.q_raw = d.alloc(kAct, s.act(N * s.Q), "attn.q_raw");  // (N, Q)
  a.k_raw = d.alloc(kAct, s.act(N * s.Kv), "attn.k_raw"); // (N, Kv)
  a.v = d.alloc(kAct, s.act(N * s.Kv), "attn.v");         // (N, Kv)
  if (!keep) {
    d.free(a.h1);
    d.free(a.rstd1);
  }
  a.q = d.alloc(kAct, s.act(N * s.Q), "attn.q");
  a.k = d.alloc(kAct, s.act(N * s.Kv), "attn.k");
  a.rstd_q = d.alloc(kAct, s.f32(N * s.nh), "attn.rstd_q");   // (N*nh)
  a.rstd_k = d.alloc(kAct, s.f32(N * s.nkv), "attn.rstd_k");  // (N*nkv)
  if (!keep) {
    d.free(a.q_raw);
    d.free(a.k_raw);
    d.free(a.rstd_q);
    d.free(a.rstd_k);
  }
  a.o = d.alloc(kAct, s.act(N * s.Q), "attn.o");
  a.lse = d.alloc(kAct, s.f32(N * s.nh), "attn.lse");  // (B, nh, T/cp)
  if (s.z.cp > 1) {
    // model/ring_attention.cpp: the K/V block in use and the one arriving from the previous rank.
    Id kv[4];
    const char* tags[4] = {"ring.k0", "ring.k1", "ring.v0", "ring.v1"};
    for (int i = 0; i < 4; ++i) kv[i] = d.alloc(kComm, s.act(N * s.Kv), tags[i]);  // (N, Kv) each
    for (int i = 3; i >= 0; --i) d.free(kv[i]);
  }
  if (!keep) {
    d.free(a.q);
    d.free(a.k);
    d.free(a.v);
    d.free(a.lse);
  }
  Id x1 = d.alloc(kAct, s.act(N * s.H), "attn.x1");
  if (!keep) d.free(a.o);
  return x1;
}

void attn_backward(Step& s, AttnIds& a) {
  PeakReplay& d = s.d;
  const int64_t N = s.N;
  Id d_o = d.alloc(kAct, s.act(N * s.Q), "attn.d_o");
  Id dq = d.alloc(kAct, s.act(N * s.Q), "attn.dq");
  Id dk = d.alloc(kAct, s.act(N * s.Kv), "attn.dk");
  Id dv = d.alloc(kAct, s.act(N * s.Kv), "attn.dv");
  if (s.z.cp > 1) {
    // model/ring_attention.cpp: K/V blocks travel again, and their gradients travel with them,
    // accumulated in fp32, until they are home.
    Id kv[8];
    const char* tags[8] = {"ring.k0", "ring.k1", "ring.v0", "ring.v1", "ring.dk0", "ring.dk1", "ring.dv0", "ring.dv1"};
    for (int i = 0; i < 8; ++i) kv[i] = d.alloc(kComm, i < 4 ? s.act(N * s.Kv) : s.f32(N * s.Kv), tags[i]);
    for (int i = 7; i >= 0; --i) d.free(kv[i]);
  }
  d.free(d_o);
  d.free(a.o);
  d.free(a.lse);
  d.free(a.q);
  d.free(a.k);
  Id dq_raw = d.alloc(kAct, s.act(N * s.Q), "attn.dq_raw");
  Id dk_raw = d.alloc(kAct, s.act(N * s.Kv), "attn.dk_raw");
  d.free(dq);
  d.free(dk);
  d.free(a.q_raw);
  d.free(a.k_raw);
  d.free(a.rstd_q);
  d.free(a.rstd_k);
  Id dh1 = d.alloc(kAct, s.act(N * s.H), "attn.dh1");
  d.free(dq_raw);
  d.free(dk_raw);
  d.free(dv);
  d.free(a.v);
  d.free(a.h1);
  Id dnorm = d.alloc(kAct, s.act(N * s.H), "attn.dnorm");
  d.free(a.rstd1);
  d.free(dnorm);
  d.free(dh1);
}

// ---- MoE block (model/moe_block.cpp) --------------------------------------------------------------

void router_forward(Step& s, MoeIds& a) {
  PeakReplay& d = s.d;
  const int64_t N = s.N;
  a.h2 = d.alloc(kAct, s.act(N * s.H), "moe.h2");
  a.rstd2 = d.alloc(kAct, s.f32(N), "moe.rstd2");
  Id logits = d.alloc(kAct, s.rt(N * s.E), "moe.router_logits");  // (N, E)
  a.probs = d.alloc(kAct, s.rt(N * s.E), "moe.probs");             // (N, E)
  a.topk_idx = d.alloc(kAct, s.i32(N * s.k), "moe.topk_idx");      // (N, k)
  a.topk_w = d.alloc(kAct, s.rt(N * s.k), "moe.topk_w");           // (N, k)
  d.free(logits);
  a.rows = d.alloc(kAct, s.i32(s.m), "moe.rows");                  // (m)
  a.slot_pos = d.alloc(kAct, s.i32(N * s.k), "moe.slot_pos");      // (N, k)
}

// The expert side of standard EP's forward (sched/dispatch/standard.cpp): the received rows
// source-major, regrouped by local expert (Note [Receive-side grouping]: a second (R, H) buffer and the
// two (R) permutations), the FFN, and the outputs put back source-major. Returns y_send (R, H).
Id ep_forward_expert_side(Step& s, MoeIds& a, Id& xs, bool keep) {
  PeakReplay& d = s.d;
  const int64_t H = s.H, I = s.I, Re = s.Re;
  Id recv = d.alloc(kDisp, s.act(Re * H), "ep.recv");  // (R, H) source-major
  d.free(xs);
  a.perm = d.alloc(kDisp, s.i32(Re), "ep.perm");      // (R)
  a.unperm = d.alloc(kDisp, s.i32(Re), "ep.unperm");  // (R)
  a.x_exp = d.alloc(kDisp, s.act(Re * H), "ep.x");    // (R, H) grouped by local expert
  d.free(recv);
  if (!keep) d.free(a.perm);
  a.g = d.alloc(kAct, s.act(Re * I), "moe.g");
  a.u = d.alloc(kAct, s.act(Re * I), "moe.u");
  a.act = d.alloc(kAct, s.act(Re * I), "moe.act");
  if (!keep) {
    d.free(a.x_exp);
    d.free(a.g);
    d.free(a.u);
  }
  Id y = d.alloc(kDisp, s.act(Re * H), "ep.y");  // (R, H) grouped
  if (!keep) d.free(a.act);
  Id y_send = d.alloc(kDisp, s.act(Re * H), "ep.y_send");  // (R, H) source-major
  d.free(y);
  if (!keep) d.free(a.unperm);
  return y_send;
}

Id moe_forward_standard(Step& s, MoeIds& a, bool keep, Category out_cat) {
  PeakReplay& d = s.d;
  const int64_t N = s.N, H = s.H, I = s.I, Re = s.Re;
  router_forward(s, a);
  Id xs = d.alloc(kAct, s.act(s.m * H), "moe.xs");  // (m, H) routed copies in expert order
  if (!keep) {
    d.free(a.h2);
    d.free(a.rstd2);
    d.free(a.probs);
    d.free(a.topk_idx);
    d.free(a.rows);
  }
  if (!s.ep) {
    // The local dispatch (sched/dispatch/local.cpp): the FFN runs on xs in place.
    a.x_exp = xs;
    a.g = d.alloc(kAct, s.act(Re * I), "moe.g");
    a.u = d.alloc(kAct, s.act(Re * I), "moe.u");
    a.act = d.alloc(kAct, s.act(Re * I), "moe.act");
    if (!keep) {
      d.free(a.x_exp);
      d.free(a.g);
      d.free(a.u);
    }
    a.ys = d.alloc(kAct, s.act(s.m * H), "moe.ys");  // (m, H)
    if (!keep) d.free(a.act);
  } else {
    Id y_send = ep_forward_expert_side(s, a, xs, keep);
    a.ys = d.alloc(kAct, s.act(s.m * H), "moe.ys");  // (m, H) back on the token side
    d.free(y_send);
  }
  Id x2 = d.alloc(out_cat, s.act(N * H), out_cat == kCkpt ? "ckpt.layer" : "moe.x2");
  if (!keep) {
    d.free(a.ys);
    d.free(a.slot_pos);
    d.free(a.topk_w);
  }
  return x2;
}

// Router backward and post_attention_layernorm backward: the tail both dispatch variants share.
void moe_backward_tail(Step& s, MoeIds& a, Id& dw, Id& dh2) {
  PeakReplay& d = s.d;
  const int64_t N = s.N;
  Id dlogits = d.alloc(kAct, s.rt(N * s.E), "moe.drouter_logits");
  d.free(dlogits);
  d.free(dw);
  d.free(a.probs);
  d.free(a.topk_idx);
  d.free(a.h2);
  Id dnorm = d.alloc(kAct, s.act(N * s.H), "moe.dnorm");
  d.free(a.rstd2);
  d.free(dnorm);
  d.free(dh2);
}

void moe_backward_standard(Step& s, MoeIds& a) {
  PeakReplay& d = s.d;
  const int64_t N = s.N, H = s.H, I = s.I, Re = s.Re;
  Id dys = d.alloc(kAct, s.act(s.m * H), "moe.dys");  // (m, H)
  Id dw = d.alloc(kAct, s.rt(N * s.k), "moe.dw");       // (N, k)
  d.free(a.ys);
  d.free(a.topk_w);
  Id dy = dys;  // (Re, H) what the FFN backward reads
  if (s.ep) {
    // sched/dispatch/standard.cpp: received source-major, regrouped like the forward's rows.
    Id dy_recv = d.alloc(kDisp, s.act(Re * H), "ep.dy_recv");  // (R, H)
    d.free(dys);
    dy = d.alloc(kDisp, s.act(Re * H), "ep.dy");  // (R, H) grouped
    d.free(dy_recv);
    d.free(a.perm);
  }
  // sched/dispatch/expert_ffn.cpp
  Id dact = d.alloc(kAct, s.act(Re * I), "moe.dact");
  d.free(dy);
  d.free(a.act);
  Id dg = d.alloc(kAct, s.act(Re * I), "moe.dg");
  Id du = d.alloc(kAct, s.act(Re * I), "moe.du");
  d.free(dact);
  d.free(a.g);
  d.free(a.u);
  // Received rows (ep.dx) are dispatch; the local dispatch's rows are the token side (activations).
  Id dx = d.alloc(s.ep ? kDisp : kAct, s.act(Re * H), s.ep ? "ep.dx" : "moe.dxs");  // (Re, H)
  d.free(dg);
  d.free(du);
  d.free(a.x_exp);
  Id dxs = dx;  // (m, H) back in the token side's expert order
  if (s.ep) {
    Id dx_send = d.alloc(kDisp, s.act(Re * H), "ep.dx_send");  // (R, H) source-major
    d.free(dx);
    d.free(a.unperm);
    dxs = d.alloc(kAct, s.act(s.m * H), "moe.dxs");
    d.free(dx_send);
  }
  Id dh2 = d.alloc(kAct, s.act(N * H), "moe.dh2");
  d.free(dxs);
  d.free(a.slot_pos);
  d.free(a.rows);
  moe_backward_tail(s, a, dw, dh2);
}

// Predicted (PipelinedLLEP, DESIGN.md): each source sends at most c_eff tokens per chunk, so an
// expert side holds at most rows_chunk = E_p * k * c_eff rows per chunk, and a chunk's buffers are
// released before the next chunk allocates: the received rows and their expert outputs,
// dispatch <= 2 * E_p * k * c_eff * H * bytes. The backward recomputes the experts chunk by chunk,
// so the layer keeps only the token side.
void chunk_expert_forward(Step& s, bool for_backward) {
  PeakReplay& d = s.d;
  const int64_t H = s.H, I = s.I, rc = s.rows_chunk;
  Id recv = d.alloc(kDisp, s.act(rc * H), "llep.recv");  // (rc, H)
  Id g = d.alloc(kAct, s.act(rc * I), "llep.g");
  Id u = d.alloc(kAct, s.act(rc * I), "llep.u");
  Id act = d.alloc(kAct, s.act(rc * I), "llep.act");
  if (!for_backward) {
    d.free(g);
    d.free(u);
    Id ys = d.alloc(kDisp, s.act(rc * H), "llep.ys");  // (rc, H)
    d.free(act);
    d.free(recv);
    d.free(ys);
    return;
  }
  Id dys = d.alloc(kDisp, s.act(rc * H), "llep.dys");  // (rc, H) received output gradients
  Id dact = d.alloc(kAct, s.act(rc * I), "llep.dact");
  d.free(dys);
  d.free(act);
  Id dg = d.alloc(kAct, s.act(rc * I), "llep.dg");
  Id du = d.alloc(kAct, s.act(rc * I), "llep.du");
  d.free(dact);
  d.free(g);
  d.free(u);
  Id dxs = d.alloc(kDisp, s.act(rc * H), "llep.dxs");  // (rc, H) input gradients going back
  d.free(dg);
  d.free(du);
  d.free(recv);
  d.free(dxs);
}

Id moe_forward_llep(Step& s, MoeIds& a, bool keep, Category out_cat) {
  PeakReplay& d = s.d;
  router_forward(s, a);
  if (keep) return kNone;  // the backward recomputes chunk by chunk (no layer output needed)
  Id x2 = d.alloc(out_cat, s.act(s.N * s.H), out_cat == kCkpt ? "ckpt.layer" : "moe.x2");
  chunk_expert_forward(s, false);  // every chunk has the same bound: one replays the peak
  d.free(a.h2);
  d.free(a.rstd2);
  d.free(a.probs);
  d.free(a.topk_idx);
  d.free(a.rows);
  d.free(a.slot_pos);
  d.free(a.topk_w);
  return x2;
}

void moe_backward_llep(Step& s, MoeIds& a) {
  PeakReplay& d = s.d;
  Id dw = d.alloc(kAct, s.rt(s.N * s.k), "moe.dw");
  Id dh2 = d.alloc(kAct, s.act(s.N * s.H), "moe.dh2");
  chunk_expert_forward(s, true);
  d.free(a.topk_w);
  d.free(a.slot_pos);
  d.free(a.rows);
  moe_backward_tail(s, a, dw, dh2);
}

Id moe_forward(Step& s, MoeIds& a, bool keep, Category out_cat) {
  return s.sched.dispatch == Dispatch::Dispatch_pipelined_llep ? moe_forward_llep(s, a, keep, out_cat)
                                                               : moe_forward_standard(s, a, keep, out_cat);
}
void moe_backward(Step& s, MoeIds& a) {
  if (s.sched.dispatch == Dispatch::Dispatch_pipelined_llep)
    moe_backward_llep(s, a);
  else
    moe_backward_standard(s, a);
}

// ---- head (sched/vocab/head_full.cpp, sched/vocab/ring_dtp.cpp) ------------------------------------------
void head_full(Step& s) {
  PeakReplay& d = s.d;
  const int64_t N = s.N, H = s.H, V = s.V;
  Id unit = kNone, unit_grad = kNone;
  // Gathered lm_head (V, H) + model.norm (H), fsdp blocks of rows each; its unsharded gradient is
  // allocated before the head runs (model.cpp: unit_grad_begin), reduce-scattered after it.
  const int64_t F = s.z.fsdp, unit_numel = F * (ceil_div(V, F) * H + ceil_div(H, F));
  if (s.fsdp) unit = d.alloc(kParams, s.wt(unit_numel), "fsdp.lm_head");
  if (s.fsdp) unit_grad = d.alloc(kGrads, s.gr(unit_numel), "fsdp.lm_head.grad");
  Id xn = d.alloc(kAct, s.act(N * H), "head.xn");
  Id rstd = d.alloc(kAct, s.f32(N), "head.rstd");
  Id logits = d.alloc(kVocab, s.lg(N * V), "head.logits");  // (N, V)
  Id logp = d.alloc(kVocab, s.lg(N * V), "head.logp");      // (N, V)
  Id tok_loss = d.alloc(kWs, s.f32(N), "head.token_loss");
  Id sum = d.alloc(kWs, s.f32(1), "head.loss_sum");
  d.free(sum);  // scope end: destroyed in reverse order
  d.free(tok_loss);
  Id dlogits = d.alloc(kVocab, s.lg(N * V), "head.dlogits");  // (N, V)
  d.free(logp);
  d.free(logits);
  Id dxn = d.alloc(kAct, s.act(N * H), "head.dxn");
  d.free(dlogits);
  d.free(xn);
  d.free(dxn);
  d.free(rstd);
  d.free(unit_grad);
  d.free(unit);
}

// Ring-DTP (sched/vocab/ring_dtp.cpp). One rank (Note [Ring-DTP on one rank]): a working set
// reserved when the head starts, one strip (n_blk, V) and the online state m (N) f32, z (N) f64,
// y (N) f32, the block's gradient formed in place in the strip. P ranks (sched/vocab/ring_dtp_ring.cpp,
// ring_dtp_working_set in sched/vocab/ring_dtp.h): head.dxn first, then the strip (n_blk, V/P) and
// the state, and one comm buffer for what is in flight: the shard in use and the one arriving, and in
// backward three dW partial sums (move weights), or the batch in use and the one arriving with its
// targets and running state, and in backward three dX partial sums (move activations). Every rank
// holds N tokens here, so n_max = N. keep_strips keeps the pass's strips instead of one: (N, V) when
// the weights move, (P N, rows of this rank's shard) when the activations do: Vp rows, the most any
// rank holds (the last ranks may hold fewer).
void head_ring(Step& s) {
  PeakReplay& d = s.d;
  const int64_t N = s.N, H = s.H, P = s.z.vocab_ring;
  const int64_t nb = std::min(s.sched.block_tokens, N), Vp = ceil_div(s.V, P);
  // Ring-DTP reads this rank's lm_head rows (ParamStore::lm_head_shard()): only model.norm is
  // gathered, and its unsharded gradient exists while the head runs (model.cpp).
  const int64_t F = s.z.fsdp;
  Id unit = kNone, unit_grad = kNone;
  if (s.fsdp) unit = d.alloc(kParams, s.wt(F * ceil_div(H, F)), "fsdp.norm");
  if (s.fsdp) unit_grad = d.alloc(kGrads, s.gr(F * ceil_div(H, F)), "fsdp.norm.grad");  // then reduce-scatter
  const int64_t strips = s.sched.vocab_strips > 0 ? s.sched.vocab_strips : 1;
  Id xn = d.alloc(kAct, s.act(N * H), "head.xn");
  Id rstd = d.alloc(kAct, s.f32(N), "head.rstd");
  Id dxn = kNone;
  if (P > 1) dxn = d.alloc(kAct, s.act(N * H), "head.dxn");
  Id strip = kNone;
  if (P > 1 && s.sched.keep_strips)  // the whole pass: (N, V) (weights) or (P N, Vp) (activations)
    strip = d.alloc(kVocab, s.z.ring_mode == "weights" ? s.lg(N * s.V) : s.lg(P * N * Vp), "ring.strips_kept");
  else
    strip = d.alloc(kVocab, static_cast<uint64_t>(strips) * s.lg(nb * Vp), "ring.strip");  // (n_blk, V/P)
  Id m = d.alloc(kVocab, s.f32(N), "ring.m");
  Id z = d.alloc(kVocab, static_cast<uint64_t>(N) * 8, "ring.z");  // f64
  Id y = d.alloc(kVocab, s.f32(N), "ring.y");
  Id loss_sum = d.alloc(kWs, 8, "ring.loss_sum");  // (1) f64
  Id comm = kNone;
  if (P > 1) {
    const uint64_t n = static_cast<uint64_t>(N);
    if (s.z.ring_mode == "weights")  // 2 shards (Vp, H), 3 dW partial sums (Vp, H) f32
      comm = d.alloc(kComm, 2 * s.wt(Vp * H) + 3 * s.f32(Vp * H), "ring.shards");
    else  // 2 batches (N, H) with targets i32 and state m f32, z f64, y f32; 3 dX partial sums (N, H) f32
      comm = d.alloc(kComm, 2 * (s.act(N * H) + 4 * n + 16 * n) + 3 * s.f32(N * H), "ring.activations");
    d.free(comm);
  } else {
    dxn = d.alloc(kAct, s.act(N * H), "head.dxn");
  }
  d.free(loss_sum);
  d.free(y);
  d.free(z);
  d.free(m);
  d.free(strip);
  d.free(xn);
  d.free(dxn);
  d.free(rstd);
  d.free(unit_grad);
  d.free(unit);
}

}  // namespace fp::plan::detail
