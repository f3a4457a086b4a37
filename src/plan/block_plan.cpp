// The blocks and heads of one step's allocation sequence (step_replay.h), mirroring, allocation for
// allocation and free for free: model/attention_block.cpp with model/ring_attention.cpp,
// model/moe_block.cpp, sched/vocab/head_full.cpp, sched/vocab/ring_dtp.cpp. A change in any of them
// must be mirrored here; tests/model/test_plan_vs_meta.cpp fails otherwise and prints the first
// event that differs (one rank, and every rank r of W). The expert dispatches (sched/dispatch:
// standard.cpp, llep.cpp, pipelined_llep.cpp), FSDP units and Ring-DTP over P ranks
// (sched/vocab/ring_dtp_ring.cpp) are validated at the engine's layout (cp = ep = fsdp = W; Note
// [Which plans are validated] in plan.cpp).
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

// sched/dispatch/expert_ffn.cpp, forward over r rows x: g, u, act (r, I) activations; without keep
// x, g, u and act are freed around y. Returns y (r, H) in y_cat.
Id ffn_forward(Step& s, int64_t r, Id& x, Id& g, Id& u, Id& act, bool keep, Category y_cat, const char* y_tag) {
  PeakReplay& d = s.d;
  g = d.alloc(kAct, s.act(r * s.I), "moe.g");
  u = d.alloc(kAct, s.act(r * s.I), "moe.u");
  act = d.alloc(kAct, s.act(r * s.I), "moe.act");
  if (!keep) {
    d.free(x);
    d.free(g);
    d.free(u);
  }
  Id y = d.alloc(y_cat, s.act(r * s.H), y_tag);
  if (!keep) d.free(act);
  return y;
}

// The expert side of standard EP's forward (sched/dispatch/standard.cpp): the received rows
// source-major, regrouped by local expert (Note [Receive-side grouping]: a second (R, H) buffer and the
// two (R) permutations), the FFN, and the outputs put back source-major. Returns y_send (R, H).
Id ep_forward_expert_side(Step& s, MoeIds& a, Id& xs, bool keep) {
  PeakReplay& d = s.d;
  const int64_t H = s.H, Re = s.Re;
  Id recv = d.alloc(kDisp, s.act(Re * H), "ep.recv");  // (R, H) source-major
  d.free(xs);
  a.perm = d.alloc(kDisp, s.i32(Re), "ep.perm");      // (R)
  a.unperm = d.alloc(kDisp, s.i32(Re), "ep.unperm");  // (R)
  a.x_exp = d.alloc(kDisp, s.act(Re * H), "ep.x");    // (R, H) grouped by local expert
  d.free(recv);
  if (!keep) d.free(a.perm);
  Id y = ffn_forward(s, Re, a.x_exp, a.g, a.u, a.act, keep, kDisp, "ep.y");  // (R, H) grouped
  Id y_send = d.alloc(kDisp, s.act(Re * H), "ep.y_send");  // (R, H) source-major
  d.free(y);
  if (!keep) d.free(a.unperm);
  return y_send;
}

// The local dispatch (sched/dispatch/local.cpp, one rank): the FFN runs on xs in place.
Id local_forward(Step& s, MoeIds& a, Id xs, bool keep) {
  a.x_exp = xs;
  return ffn_forward(s, s.Re, a.x_exp, a.g, a.u, a.act, keep, kAct, "moe.ys");  // (m, H)
}

// Standard EP (sched/dispatch/standard.cpp), also LLEP below lambda.
Id standard_forward(Step& s, MoeIds& a, Id xs, bool keep) {
  Id y_send = ep_forward_expert_side(s, a, xs, keep);
  Id ys = s.d.alloc(kAct, s.act(s.m * s.H), "moe.ys");  // (m, H) back on the token side
  s.d.free(y_send);
  return ys;
}

// The bytes of G (or S) experts' packed weights (G, 3 I H) and gradients (GuestExperts in llep.h).
uint64_t guest_weights(const Step& s, int64_t G) { return s.wt(G * 3 * s.I * s.H); }
uint64_t guest_grads(const Step& s, int64_t G) { return s.gr(G * 3 * s.I * s.H); }

// LLEP with its plan active (sched/dispatch/llep.cpp): R rows computed here under the plan.
Id llep_forward(Step& s, MoeIds& a, Id xs, bool keep) {
  PeakReplay& d = s.d;
  const int64_t H = s.H, m = s.m, R = s.dc->rows;
  a.guest_w = d.alloc(kComm, guest_weights(s, s.dc->guests), "llep.guest_w");     // (G, P)
  Id w_out = d.alloc(kComm, guest_weights(s, s.dc->weights_out), "llep.w_out");  // (S, P)
  a.idx_a = d.alloc(kDisp, s.i32(m), "llep.send_rows");  // (m)
  a.idx_b = d.alloc(kDisp, s.i32(m), "llep.send_pos");   // (m)
  Id send = d.alloc(kDisp, s.act(m * H), "llep.send");  // (m, H) by destination
  d.free(xs);
  Id recv = d.alloc(kDisp, s.act(R * H), "llep.recv");  // (R, H) source-major
  d.free(send);
  d.free(w_out);
  a.perm = d.alloc(kDisp, s.i32(R), "llep.perm");
  a.unperm = d.alloc(kDisp, s.i32(R), "llep.unperm");
  a.x_exp = d.alloc(kDisp, s.act(R * H), "llep.x");  // (R, H) grouped by expert
  d.free(recv);
  if (!keep) d.free(a.perm);
  Id y = ffn_forward(s, R, a.x_exp, a.g, a.u, a.act, keep, kDisp, "llep.y");  // (R, H)
  Id y_send = d.alloc(kDisp, s.act(R * H), "llep.y_send");
  d.free(y);
  if (!keep) {
    d.free(a.unperm);
    d.free(a.guest_w);
  }
  Id back = d.alloc(kDisp, s.act(m * H), "llep.back");  // (m, H)
  d.free(y_send);
  Id ys = d.alloc(kAct, s.act(m * H), "moe.ys");
  if (!keep) {
    d.free(a.idx_a);
    d.free(a.idx_b);
  }
  d.free(back);
  return ys;
}

// PipelinedLLEP (sched/dispatch/pipelined_llep.cpp): LLEP's plan in K chunks; chunk i sends m_i rows
// and receives r_i. The output is xs itself; with keep the chunk's FFN intermediates stay (its
// received rows are sent again in backward), and the rows are gathered again from moe.h2 by token.
Id pipelined_forward(Step& s, MoeIds& a, Id xs, bool keep) {
  PeakReplay& d = s.d;
  const int64_t H = s.H, m = s.m;
  const DispatchCounts& dc = *s.dc;
  a.idx_a = d.alloc(kDisp, s.i32(m), "pllep.rows");                // (m)
  if (keep) a.idx_b = d.alloc(kDisp, s.i32(m), "pllep.tokens");    // (m)
  a.guest_w = d.alloc(kComm, guest_weights(s, dc.guests), "llep.guest_w");     // (G, P)
  Id w_out = d.alloc(kComm, guest_weights(s, dc.weights_out), "llep.w_out");  // (S, P)
  for (int64_t i = 0; i < dc.K; ++i) {
    const int64_t mi = dc.chunk_send[i], ri = dc.chunk_recv[i];
    Id send = d.alloc(kDisp, s.act(mi * H), "pllep.send");  // (m_i, H)
    Id recv = d.alloc(kDisp, s.act(ri * H), "pllep.recv");  // (r_i, H)
    d.free(send);
    if (i == 0) d.free(w_out);
    Id g = kNone, u = kNone, act = kNone;
    Id y = ffn_forward(s, ri, recv, g, u, act, keep, kDisp, "pllep.y");  // (r_i, H)
    d.free(recv);  // with keep too: sent again in backward
    Id back = d.alloc(kDisp, s.act(mi * H), "pllep.back");  // (m_i, H)
    d.free(y);
    d.free(back);
    if (keep) {
      a.cg.push_back(g);
      a.cu.push_back(u);
      a.cact.push_back(act);
    }
  }
  if (!keep) {
    d.free(a.guest_w);
    d.free(a.idx_a);
  }
  return xs;
}

Id moe_forward(Step& s, MoeIds& a, bool keep, Category out_cat) {
  PeakReplay& d = s.d;
  const int64_t N = s.N, H = s.H;
  router_forward(s, a);
  Id xs = d.alloc(kAct, s.act(s.m * H), "moe.xs");  // (m, H) routed copies in expert order
  if (!keep) {
    d.free(a.h2);
    d.free(a.rstd2);
    d.free(a.probs);
    d.free(a.topk_idx);
    d.free(a.rows);
  }
  // The engine's dispatch: local on one rank; LLEP below lambda is standard EP.
  if (!s.ep)
    a.ys = local_forward(s, a, xs, keep);
  else if (s.sched.dispatch == Dispatch::Dispatch_pipelined_llep)
    a.ys = pipelined_forward(s, a, xs, keep);
  else if (s.sched.dispatch == Dispatch::Dispatch_llep && s.dc->llep_active)
    a.ys = llep_forward(s, a, xs, keep);
  else
    a.ys = standard_forward(s, a, xs, keep);
  Id x2 = d.alloc(out_cat, s.act(N * H), out_cat == kCkpt ? "ckpt.layer" : "moe.x2");
  if (!keep) {
    d.free(a.ys);
    d.free(a.slot_pos);
    d.free(a.topk_w);
  }
  return x2;
}

// Router backward and post_attention_layernorm backward: the tail every dispatch variant shares.
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

// sched/dispatch/expert_ffn.cpp: dy (r, H) -> dx (r, H) in dx_cat; frees dy, act, g, u and x.
Id ffn_backward(Step& s, int64_t r, Id dy, Id x, Id g, Id u, Id act, Category dx_cat, const char* dx_tag) {
  PeakReplay& d = s.d;
  Id dact = d.alloc(kAct, s.act(r * s.I), "moe.dact");
  d.free(dy);
  d.free(act);
  Id dg = d.alloc(kAct, s.act(r * s.I), "moe.dg");
  Id du = d.alloc(kAct, s.act(r * s.I), "moe.du");
  d.free(dact);
  d.free(g);
  d.free(u);
  Id dx = d.alloc(dx_cat, s.act(r * s.H), dx_tag);
  d.free(dg);
  d.free(du);
  d.free(x);
  return dx;
}

// Standard EP (and LLEP below lambda) and the local dispatch: dys -> dxs (m, H).
Id standard_backward(Step& s, MoeIds& a, Id dys) {
  PeakReplay& d = s.d;
  const int64_t H = s.H, Re = s.Re;
  Id dy = dys;  // (Re, H) what the FFN backward reads
  if (s.ep) {
    // sched/dispatch/standard.cpp: received source-major, regrouped like the forward's rows.
    Id dy_recv = d.alloc(kDisp, s.act(Re * H), "ep.dy_recv");  // (R, H)
    d.free(dys);
    dy = d.alloc(kDisp, s.act(Re * H), "ep.dy");  // (R, H) grouped
    d.free(dy_recv);
    d.free(a.perm);
  }
  // Received rows (ep.dx) are dispatch; the local dispatch's rows are the token side (activations).
  Id dx = ffn_backward(s, Re, dy, a.x_exp, a.g, a.u, a.act, s.ep ? kDisp : kAct, s.ep ? "ep.dx" : "moe.dxs");
  if (!s.ep) return dx;  // (m, H) in the token side's expert order
  Id dx_send = d.alloc(kDisp, s.act(Re * H), "ep.dx_send");  // (R, H) source-major
  d.free(dx);
  d.free(a.unperm);
  Id dxs = d.alloc(kAct, s.act(s.m * H), "moe.dxs");
  d.free(dx_send);
  return dxs;
}

Id llep_backward(Step& s, MoeIds& a, Id dys) {
  PeakReplay& d = s.d;
  const int64_t H = s.H, m = s.m, R = s.dc->rows;
  Id dsend = d.alloc(kDisp, s.act(m * H), "llep.dsend");  // (m, H) by destination
  d.free(dys);
  d.free(a.idx_a);
  Id dy_recv = d.alloc(kDisp, s.act(R * H), "llep.dy_recv");  // (R, H) source-major
  d.free(dsend);
  Id dy = d.alloc(kDisp, s.act(R * H), "llep.dy");  // (R, H) grouped
  d.free(dy_recv);
  d.free(a.perm);
  Id guest_g = d.alloc(kComm, guest_grads(s, s.dc->guests), "llep.guest_g");  // (G, P)
  Id dx = ffn_backward(s, R, dy, a.x_exp, a.g, a.u, a.act, kDisp, "llep.dx");
  Id g_in = d.alloc(kComm, guest_grads(s, s.dc->weights_out), "llep.g_in");  // (S, P)
  Id dx_send = d.alloc(kDisp, s.act(R * H), "llep.dx_send");
  d.free(dx);
  d.free(a.unperm);
  Id dback = d.alloc(kDisp, s.act(m * H), "llep.dback");
  d.free(dx_send);
  d.free(g_in);
  d.free(guest_g);
  d.free(a.guest_w);
  Id dxs = d.alloc(kAct, s.act(m * H), "moe.dxs");
  d.free(a.idx_b);
  d.free(dback);
  return dxs;
}

// PipelinedLLEP, chunk by chunk: the chunk's rows travel again (from moe.h2), its output gradients
// travel, the FFN backward runs on the kept intermediates, the input gradients come back into dys.
Id pipelined_backward(Step& s, MoeIds& a, Id dys) {
  PeakReplay& d = s.d;
  const int64_t H = s.H;
  const DispatchCounts& dc = *s.dc;
  Id guest_g = d.alloc(kComm, guest_grads(s, dc.guests), "llep.guest_g");  // (G, P)
  for (int64_t i = 0; i < dc.K; ++i) {
    const int64_t mi = dc.chunk_send[i], ri = dc.chunk_recv[i];
    Id send_x = d.alloc(kDisp, s.act(mi * H), "pllep.send_x");  // (m_i, H)
    Id recv_x = d.alloc(kDisp, s.act(ri * H), "pllep.recv_x");  // (r_i, H)
    d.free(send_x);
    Id dy = d.alloc(kDisp, s.act(ri * H), "pllep.dy");          // (r_i, H)
    Id send_dy = d.alloc(kDisp, s.act(mi * H), "pllep.send_dy");
    d.free(send_dy);
    Id dx = ffn_backward(s, ri, dy, recv_x, a.cg[i], a.cu[i], a.cact[i], kDisp, "pllep.dx");
    Id back = d.alloc(kDisp, s.act(mi * H), "pllep.back");  // (m_i, H)
    d.free(dx);
    d.free(back);
  }
  d.free(a.idx_b);
  d.free(a.idx_a);
  Id g_in = d.alloc(kComm, guest_grads(s, dc.weights_out), "llep.g_in");  // (S, P)
  d.free(g_in);
  d.free(guest_g);
  d.free(a.guest_w);
  return dys;  // now the input gradients
}

void moe_backward(Step& s, MoeIds& a) {
  PeakReplay& d = s.d;
  const int64_t N = s.N, H = s.H;
  Id dw = d.alloc(kAct, s.rt(N * s.k), "moe.dw");  // (N, k)
  Id dys = a.ys;  // (m, H) formed in place in ys's buffer
  a.ys = kNone;
  d.free(a.topk_w);
  Id dxs = kNone;
  if (s.ep && s.sched.dispatch == Dispatch::Dispatch_pipelined_llep)
    dxs = pipelined_backward(s, a, dys);
  else if (s.ep && s.sched.dispatch == Dispatch::Dispatch_llep && s.dc->llep_active)
    dxs = llep_backward(s, a, dys);
  else
    dxs = standard_backward(s, a, dys);
  Id dh2 = d.alloc(kAct, s.act(N * H), "moe.dh2");
  d.free(dxs);
  d.free(a.slot_pos);
  d.free(a.rows);
  moe_backward_tail(s, a, dw, dh2);
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
// the weights move, (P N, rows of this rank's shard) when the activations do (the last ranks may
// hold fewer than Vp rows).
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
    strip = d.alloc(kVocab, s.z.ring_mode == "weights" ? s.lg(N * s.V) : s.lg(P * N * shard_rows(s.V, P, s.rank)),
                    "ring.strips_kept");
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
