// The allocation sequence of one training step, per rank, with every size in closed form, replayed
// through a PeakReplay (Note [Why the planner replays instead of summing] in plan/replay.h).
//
// Legend: N tokens per rank, H hidden, Q = nh*hd query width, Kv = nkv*hd key/value width, E experts,
// k top-k, m = N*k routes sent, R routes received (hottest rank), Re rows an expert side computes
// (m on one rank, R with expert parallelism), I expert FFN width, V vocabulary, L layers, W ranks.
//
// The one-rank plain sequence mirrors, allocation for allocation and free for free:
//   model/model.cpp (Model::step), model/attention_block.cpp, model/moe_block.cpp,
//   sched/vocab/head_full.cpp, sched/ckpt/boundary_store.h (DeviceBoundaryStore),
//   model/params.cpp (ParamStore), sched/optim/adamw.cpp (AdamW: m, v, one workspace float).
// A change in any of them must be mirrored here; tests/model/test_plan_vs_meta.cpp fails otherwise
// and prints the first event that differs.
//
// Everything under `if (multi)` or a flattened schedule is predicted from DESIGN.md (flagged in
// Result::predicted) until the engine runs it and a meta run validates it.
#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "plan/routing_counts.h"
#include "plan/step_replay.h"

namespace fp::plan {

namespace {

constexpr Category kParams = Category::Category_params;
constexpr Category kGrads = Category::Category_grads;
constexpr Category kOpt = Category::Category_optimizer;
constexpr Category kAct = Category::Category_activations;
constexpr Category kCkpt = Category::Category_checkpoints;
constexpr Category kDisp = Category::Category_dispatch;
constexpr Category kVocab = Category::Category_vocab;
constexpr Category kComm = Category::Category_comm;
constexpr Category kWs = Category::Category_workspace;
using Id = PeakReplay::Id;
constexpr Id kNone = PeakReplay::kNone;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Shared by every phase of one plan.
struct Step {
  Step(const ModelConfig& c, const Settings& s, const Schedules& sc, PeakReplay& dev, PeakReplay& host)
      : cfg(c), set(s), sched(sc), d(dev), h(host) {}
  const ModelConfig& cfg;
  const Settings& set;
  const Schedules& sched;
  PeakReplay& d;  // device
  PeakReplay& h;  // host
  Sizes z;
  int64_t N = 0, H = 0, Q = 0, Kv = 0, nh = 0, nkv = 0, E = 0, k = 0, I = 0, V = 0, L = 0, m = 0, Re = 0;
  bool multi = false;  // W > 1: FSDP units, context-parallel rings, expert-parallel all-to-all
  int64_t rows_chunk = 0;  // pipelined_llep: rows an expert side holds per chunk (the launch bound)
  int64_t unit_params = 0; // W > 1: parameters of one gathered layer unit (FSDP)

  // Bytes of n elements of each kind.
  uint64_t act(int64_t n) const { return static_cast<uint64_t>(n) * dtype_size(set.dtypes.activations); }
  uint64_t f32(int64_t n) const { return static_cast<uint64_t>(n) * 4; }
  uint64_t i32(int64_t n) const { return static_cast<uint64_t>(n) * 4; }
  uint64_t rt(int64_t n) const { return static_cast<uint64_t>(n) * dtype_size(set.dtypes.router); }
  uint64_t lg(int64_t n) const { return static_cast<uint64_t>(n) * dtype_size(set.dtypes.logits); }
  uint64_t wt(int64_t n) const { return static_cast<uint64_t>(n) * dtype_size(set.dtypes.weights); }
  uint64_t gr(int64_t n) const { return static_cast<uint64_t>(n) * dtype_size(set.dtypes.grads); }
};

// ---- attention block (model/attention_block.cpp) ----------------------------------------------
struct AttnIds {
  Id h1 = kNone, rstd1 = kNone, q_raw = kNone, k_raw = kNone, v = kNone, q = kNone, k = kNone, rstd_q = kNone,
     rstd_k = kNone, o = kNone, lse = kNone;
};

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
    // Predicted: ring attention passes key/value blocks around the context-parallel ring; the block
    // being used and the one arriving: 2 x (k, v) of (N, Kv).
    Id ring = d.alloc(kComm, 2 * 2 * s.act(N * s.Kv), "cp.kv_ring");
    d.free(ring);
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
    // Predicted: (k, v) blocks travel again, and their gradients travel home accumulated in fp32.
    Id ring = d.alloc(kComm, 2 * 2 * s.act(N * s.Kv) + 2 * 2 * s.f32(N * s.Kv), "cp.kv_grad_ring");
    d.free(ring);
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
struct MoeIds {
  Id h2 = kNone, rstd2 = kNone, probs = kNone, topk_idx = kNone, topk_w = kNone, rows = kNone, slot_pos = kNone;
  Id x_exp = kNone;  // (Re, H) rows in expert order on the expert side (the engine's moe.xs)
  Id g = kNone, u = kNone, act = kNone;  // (Re, I)
  Id ys = kNone;     // (m, H) expert outputs back in the token side's expert order (moe.ys)
};

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
  a.rows = d.alloc(kDisp, s.i32(s.m), "moe.rows");                 // (m)
  a.slot_pos = d.alloc(kDisp, s.i32(N * s.k), "moe.slot_pos");     // (N, k)
}

Id moe_forward_standard(Step& s, MoeIds& a, bool keep, Category out_cat) {
  PeakReplay& d = s.d;
  const int64_t N = s.N, H = s.H, I = s.I, Re = s.Re;
  router_forward(s, a);
  if (!s.multi) {
    a.x_exp = d.alloc(kDisp, s.act(s.m * H), "moe.xs");  // (m, H)
  } else {
    // Predicted (standard EP): the send buffer in destination order, the all-to-all, then the
    // receive buffer of every route that lands here; the send buffer is done after the exchange.
    Id send = d.alloc(kDisp, s.act(s.m * H), "ep.send");   // (m, H)
    a.x_exp = d.alloc(kDisp, s.act(Re * H), "ep.recv");    // (R, H)
    d.free(send);
  }
  if (!keep) {
    d.free(a.h2);
    d.free(a.rstd2);
    d.free(a.probs);
    d.free(a.topk_idx);
    d.free(a.rows);
  }
  a.g = d.alloc(kAct, s.act(Re * I), "moe.g");
  a.u = d.alloc(kAct, s.act(Re * I), "moe.u");
  a.act = d.alloc(kAct, s.act(Re * I), "moe.act");
  if (!keep) {
    d.free(a.x_exp);
    d.free(a.g);
    d.free(a.u);
  }
  if (!s.multi) {
    a.ys = d.alloc(kDisp, s.act(s.m * H), "moe.ys");  // (m, H)
  } else {
    Id y_exp = d.alloc(kDisp, s.act(Re * H), "ep.y_send");  // (R, H)
    a.ys = d.alloc(kDisp, s.act(s.m * H), "ep.y_recv");     // (m, H) back on the token side
    d.free(y_exp);
  }
  if (!keep) d.free(a.act);
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
  Id dys = d.alloc(kDisp, s.act(s.m * H), s.multi ? "ep.dy_send" : "moe.dys");  // (m, H)
  Id dw = d.alloc(kAct, s.rt(N * s.k), "moe.dw");                               // (N, k)
  d.free(a.ys);
  d.free(a.topk_w);
  if (s.multi) {
    Id dys_exp = d.alloc(kDisp, s.act(Re * H), "ep.dy_recv");  // (R, H)
    d.free(dys);
    dys = dys_exp;
  }
  Id dact = d.alloc(kAct, s.act(Re * I), "moe.dact");
  d.free(dys);
  d.free(a.act);
  Id dg = d.alloc(kAct, s.act(Re * I), "moe.dg");
  Id du = d.alloc(kAct, s.act(Re * I), "moe.du");
  d.free(dact);
  d.free(a.g);
  d.free(a.u);
  Id dxs = d.alloc(kDisp, s.act(Re * H), s.multi ? "ep.dx_send" : "moe.dxs");
  d.free(dg);
  d.free(du);
  d.free(a.x_exp);
  if (s.multi) {
    Id dx_tok = d.alloc(kDisp, s.act(s.m * H), "ep.dx_recv");  // (m, H)
    d.free(dxs);
    dxs = dx_tok;
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

// ---- head (sched/vocab/head_full.cpp; Ring-DTP predicted) ------------------------------------------
void head_full(Step& s) {
  PeakReplay& d = s.d;
  const int64_t N = s.N, H = s.H, V = s.V;
  Id unit = kNone, unit_grad = kNone;
  if (s.multi) unit = d.alloc(kParams, s.wt(V * H + H), "fsdp.lm_head");  // gathered (V, H) + norm
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
  if (s.multi) unit_grad = d.alloc(kGrads, s.gr(V * H + H), "fsdp.lm_head.grad");  // unsharded, then reduce-scatter
  Id dxn = d.alloc(kAct, s.act(N * H), "head.dxn");
  d.free(dlogits);
  d.free(xn);
  d.free(dxn);
  d.free(rstd);
  d.free(unit_grad);
  d.free(unit);
}

// Ring-DTP (sched/vocab/ring_dtp.cpp). One rank (exact, Note [Ring-DTP on one rank]): a working set
// reserved when the head starts, one strip (n_blk, V) and the online state m (N) f32, z (N) f64,
// y (N) f32, the block's gradient formed in place in the strip. P ranks (predicted, Note [Ring-DTP on
// P ranks]): the strip is (n_blk, V/P) (vocab_strips of them), and the shards (move weights) or the
// activations (move activations) are in flight.
void head_ring(Step& s) {
  PeakReplay& d = s.d;
  const int64_t N = s.N, H = s.H, P = s.z.vocab_ring;
  const int64_t nb = std::min(s.sched.block_tokens, N), Vp = ceil_div(s.V, P);
  const int64_t strips = s.sched.vocab_strips > 0 ? s.sched.vocab_strips : 1;
  Id xn = d.alloc(kAct, s.act(N * H), "head.xn");
  Id rstd = d.alloc(kAct, s.f32(N), "head.rstd");
  Id strip = d.alloc(kVocab, static_cast<uint64_t>(strips) * s.lg(nb * Vp), "ring.strip");  // (n_blk, V/P)
  Id m = d.alloc(kVocab, s.f32(N), "ring.m");
  Id z = d.alloc(kVocab, static_cast<uint64_t>(N) * 8, "ring.z");  // f64
  Id y = d.alloc(kVocab, s.f32(N), "ring.y");
  Id loss_sum = d.alloc(kWs, 8, "ring.loss_sum");  // (1) f64
  Id dxn = d.alloc(kAct, s.act(N * H), "head.dxn");
  Id comm = kNone;
  if (P > 1) {
    if (s.z.ring_mode == "weights")  // the shard being used and the one arriving, dW travelling home
      comm = d.alloc(kComm, 2 * s.wt(Vp * H) + 2 * s.f32(Vp * H), "ring.shards");
    else  // the batch, its running state, and dX travelling
      comm = d.alloc(kComm, 2 * s.act(N * H) + 2 * s.f32(N * H) + 2 * 16 * static_cast<uint64_t>(N),
                     "ring.activations");
    d.free(comm);
  }
  d.free(loss_sum);
  d.free(y);
  d.free(z);
  d.free(m);
  d.free(strip);
  d.free(xn);
  d.free(dxn);
  d.free(rstd);
}

// ---- boundaries (sched/ckpt/boundary_store.h DeviceBoundaryStore, sched/ckpt/sco.h ScoBoundaryStore)
struct Boundaries {
  std::vector<Id> dev;          // (N, H) on the device, per layer
  std::vector<Id> host;         // (N, H) on the host, per layer (sco)
  std::vector<bool> offloaded;  // sco: the boundary went to host
  Id pending = kNone;           // sco: the device copy whose offload is in flight
  uint64_t host_used = 0;       // sco: bytes of boundaries on the host
};

// ScoBoundaryStore::put: finish the previous offload (free its device copy), then send x_l to host
// unless it is the last boundary or it would exceed the budget or the host capacity.
void sco_put(Step& s, Boundaries& b, int64_t l, Id& x, uint64_t budget, uint64_t host_cap) {
  s.d.free(b.pending);
  const uint64_t bytes = s.act(s.N * s.H);
  const bool fits_budget = bytes <= budget - std::min(budget, b.host_used);
  const bool fits_host = host_cap == kUnlimitedBytes || s.h.total_current() + bytes <= host_cap;
  if (l + 1 == s.L || !fits_budget || !fits_host) {
    b.dev[l] = x;
  } else {
    b.host[l] = s.h.alloc(kCkpt, bytes, "sco.host.layer");
    b.host_used += bytes;
    b.offloaded[l] = true;
    b.pending = x;
  }
  x = kNone;
}

// ScoBoundaryStore::get: restore x_l unless prefetched, and prefetch x_{l-1}.
void sco_get(Step& s, Boundaries& b, int64_t l) {
  if (b.offloaded[l] && b.dev[l] == kNone) b.dev[l] = s.d.alloc(kCkpt, s.act(s.N * s.H), "ckpt.layer.restored");
  if (l > 0 && b.offloaded[l - 1] && b.dev[l - 1] == kNone)
    b.dev[l - 1] = s.d.alloc(kCkpt, s.act(s.N * s.H), "ckpt.layer.restored");
}

// The largest bucket of offload_plan_make (sched/optim/offload.cpp) over parameters of these sizes,
// in order: a bucket that splits a parameter ends on a multiple of kOffloadAlign = 16 elements.
int64_t bucket_largest(const std::vector<int64_t>& sizes, int64_t bucket) {
  constexpr int64_t kAlign = 16;
  int64_t largest = 0, cur = 0;
  auto close = [&] {
    largest = std::max(largest, cur);
    cur = 0;
  };
  for (const int64_t n : sizes) {
    int64_t off = 0;
    while (off < n) {
      int64_t take = std::min(n - off, bucket - cur);
      if (take < n - off) {
        const int64_t aligned = (off + take) / kAlign * kAlign - off;
        if (aligned > 0) {
          take = aligned;
        } else if (cur > 0) {
          close();
          continue;
        }
      }
      if (cur == 0 && take == bucket && n - off > bucket && off % kAlign == 0 && bucket % kAlign == 0) {
        // Whole aligned buckets inside one long parameter: the loop would close them one by one.
        largest = std::max(largest, bucket);
        off += (n - off - 1) / bucket * bucket;
        continue;
      }
      cur += take;
      off += take;
      if (cur == bucket) close();
    }
  }
  close();
  return largest;
}

// Parameter sizes in ParamStore order (model/params.cpp).
std::vector<int64_t> param_sizes(const ModelConfig& c) {
  const int64_t H = c.hidden_size, hd = c.head_dim, I = c.moe_intermediate_size;
  const int64_t Q = c.num_attention_heads * hd, Kv = c.num_key_value_heads * hd;
  std::vector<int64_t> v = {c.vocab_size * H};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    for (int64_t n : {H, Q * H, Kv * H, Kv * H, H * Q, hd, hd, H, c.num_experts * H}) v.push_back(n);
    for (int64_t e = 0; e < c.num_experts; ++e)
      for (int j = 0; j < 3; ++j) v.push_back(I * H);
  }
  v.push_back(H);
  v.push_back(c.vocab_size * H);
  return v;
}

}  // namespace

Result step_replay(const Input& in, const Schedules& sched, PeakReplay* device_replay, PeakReplay* host_replay) {
  const ModelConfig& c = in.model;
  const Settings& set = in.settings;
  model_config_validate(c, "plan");
  FP_CHECK(in.context >= 1, "pass --context T with T >= 1", "context length {} is not positive", in.context);

  Result r;
  r.sched = sched;
  Sizes& z = r.sizes;
  const Layout& lay = set.layout;
  FP_CHECK(lay.ranks >= 1 && lay.batch >= 1, "ranks and batch are at least 1", "ranks {} batch {}", lay.ranks,
           lay.batch);
  z.ranks = lay.ranks;
  z.cp = lay.cp > 0 ? lay.cp : lay.ranks;
  z.ep = lay.ep > 0 ? lay.ep : std::gcd(c.num_experts, lay.ranks);
  FP_CHECK(z.ranks % z.cp == 0, "cp must divide the rank count", "cp = {} does not divide W = {}", z.cp, z.ranks);
  FP_CHECK(z.ranks % z.ep == 0 && c.num_experts % z.ep == 0,
           "ep must divide both the rank count and the number of experts",
           "ep = {} with W = {} ranks and E = {} experts", z.ep, z.ranks, c.num_experts);
  z.dp = z.ranks / z.cp;
  FP_CHECK(in.context * lay.batch >= z.cp, "give at least one token per rank",
           "context {} x batch {} is less than cp = {} ranks", in.context, lay.batch, z.cp);
  z.tokens = ceil_div(in.context * lay.batch, z.cp);
  z.params_total = c.param_count();
  z.params_per_rank = ceil_div(z.params_total, z.ranks);

  PeakReplay local_dev, local_host;
  PeakReplay& dev = device_replay ? *device_replay : local_dev;
  PeakReplay& host = host_replay ? *host_replay : local_host;
  Step s(c, set, r.sched, dev, host);
  s.z = z;
  s.N = z.tokens;
  s.H = c.hidden_size;
  s.nh = c.num_attention_heads;
  s.nkv = c.num_key_value_heads;
  s.Q = s.nh * c.head_dim;
  s.Kv = s.nkv * c.head_dim;
  s.E = c.num_experts;
  s.k = c.num_experts_per_tok;
  s.I = c.moe_intermediate_size;
  s.V = c.vocab_size;
  s.L = c.num_hidden_layers;
  s.m = s.N * s.k;
  s.multi = z.ranks > 1;
  const int64_t H = s.H, L = s.L, N = s.N;

  // Routes the hottest rank receives (standard EP); on one rank every route stays.
  z.routes_sent = s.m;
  z.routes_received = z.ep > 1 ? routes_received_max(set.routing, N, s.k, s.E, z.ep) : s.m;
  s.Re = s.multi ? z.routes_received : s.m;
  if (r.sched.dispatch == Dispatch::Dispatch_pipelined_llep) {
    FP_CHECK(r.sched.chunk_tokens >= 1 && r.sched.max_chunks >= 1, "chunk_tokens and max_chunks are >= 1",
             "pipelined_llep chunk_tokens = {}, max_chunks = {}", r.sched.chunk_tokens, r.sched.max_chunks);
    z.chunks = std::min(ceil_div(N, r.sched.chunk_tokens), r.sched.max_chunks);
    z.chunk_tokens = ceil_div(N, z.chunks);
    s.rows_chunk = z.ep * s.k * z.chunk_tokens;
  }
  if (r.sched.vocab == Vocab::Vocab_ring) {
    z.vocab_ring = z.ranks;
    const int64_t Vp = ceil_div(s.V, z.vocab_ring);
    z.ring_mode = r.sched.ring_mode == "auto" ? (N <= Vp ? "activations" : "weights") : r.sched.ring_mode;
    FP_CHECK(r.sched.block_tokens >= 1, "vocab block_tokens is >= 1", "block_tokens = {}", r.sched.block_tokens);
  }
  const int64_t dense_layer = 2 * H + 2 * s.Q * H + 2 * s.Kv * H + 2 * c.head_dim + s.E * H;
  const int64_t expert_layer = s.E * 3 * s.I * H;
  s.unit_params = dense_layer + (z.ranks / z.ep > 1 ? (s.E / z.ep) * 3 * s.I * H : 0);
  s.z = z;

  // ---- persistent: ParamStore (params, grads), then the optimizer (sched/optim/optimizer.cpp).
  const uint64_t wb = dtype_size(set.dtypes.weights), gb = dtype_size(set.dtypes.grads);
  const uint64_t master_b = dtype_size(set.dtypes.master), mom_b = dtype_size(set.dtypes.moments);
  const int64_t P = z.params_per_rank;
  dev.alloc(kParams, P * wb, "params");
  dev.alloc(kGrads, P * gb, "grads");
  const Optim optim = r.sched.optim;
  FP_ASSERT(optim != Optim::Optim_auto, "step_replay receives a resolved optimizer schedule");
  if (optim == Optim::Optim_device) {
    // AdamW (adamw.cpp): m and v on the device, and a master copy when the weights are not fp32.
    const uint64_t master_dev = set.dtypes.weights == set.dtypes.master ? 0 : master_b;
    dev.alloc(kOpt, P * (2 * mom_b + master_dev), "adamw.m_v");
  } else {
    // OffloadAdamW (offload.cpp): fp32 master, m, v in (pinned) host memory, 12 B per parameter.
    host.alloc(kOpt, P * (master_b + 2 * mom_b), "host.master_m_v");
    if (optim == Optim::Optim_offload_serial) {
      host.alloc(kGrads, P * gb, "host.grads");  // every gradient comes down for the CPU update
    } else {
      // OffloadStreamAdamW: S staging slots of the largest bucket, reserved at construction; on the
      // device (update there) rows grad, param, m, v: 16 B per element; on the host: the gradient.
      const int64_t largest = s.multi ? std::min<int64_t>(r.sched.bucket_params, P)  // predicted: shards
                                      : bucket_largest(param_sizes(c), r.sched.bucket_params);
      z.bucket_largest = largest;
      for (int64_t k = 0; k < r.sched.slots && largest > 0; ++k) {
        if (r.sched.update_on_host)
          host.alloc(kOpt, static_cast<uint64_t>(largest) * 4, "optim.host_slot");
        else
          dev.alloc(kOpt, static_cast<uint64_t>(largest) * 16, "optim.slot");  // (4, B_max) f32
      }
    }
  }
  dev.alloc(kWs, 4, "adamw.grad_sumsq");  // (1)

  // ---- the step (model.cpp)
  Id tokens = dev.alloc(kAct, s.i32(N), "input.tokens");
  Id targets = dev.alloc(kAct, s.i32(N), "input.targets");
  Id pos = dev.alloc(kAct, s.i32(N), "input.positions");
  const bool sco = r.sched.ckpt == Ckpt::Ckpt_sco;
  Boundaries b;
  b.dev.assign(static_cast<size_t>(L), kNone);
  b.host.assign(static_cast<size_t>(L), kNone);
  b.offloaded.assign(static_cast<size_t>(L), false);
  Id embed_unit = kNone;
  if (s.multi) embed_unit = dev.alloc(kParams, s.wt(s.V * H), "fsdp.embed_tokens");  // gathered (V, H)
  Id x = dev.alloc(kCkpt, s.act(N * H), "ckpt.layer0");
  dev.free(embed_unit);
  for (int64_t l = 0; l < L; ++l) {
    Id unit = kNone;
    if (s.multi) unit = dev.alloc(kParams, s.wt(s.unit_params), "fsdp.layer");
    AttnIds attn;
    Id x1 = attn_forward(s, attn, false);
    if (sco) {
      sco_put(s, b, l, x, r.sched.ckpt_host_budget, in.host_mem);
    } else {
      b.dev[l] = x;
      x = kNone;
    }
    const bool last = l + 1 == L;
    MoeIds moe;
    x = moe_forward(s, moe, false, last ? kAct : kCkpt);
    dev.free(x1);
    dev.free(unit);
  }
  z.boundaries_offloaded = std::count(b.offloaded.begin(), b.offloaded.end(), true);

  Id aux_bias = kNone;
  if (c.router_aux_loss_coef != 0.0) aux_bias = dev.alloc(kWs, s.f32(s.E), "moe.aux_bias");  // (E)
  Id dx = dev.alloc(kAct, s.act(N * H), "grad.x");
  if (r.sched.vocab == Vocab::Vocab_ring)
    head_ring(s);
  else
    head_full(s);
  dev.free(x);

  for (int64_t l = L - 1; l >= 0; --l) {
    Id unit = kNone, unit_grad = kNone;
    if (s.multi) {
      unit = dev.alloc(kParams, s.wt(s.unit_params), "fsdp.layer");
      unit_grad = dev.alloc(kGrads, s.gr(s.unit_params), "fsdp.layer.grad");  // unsharded, then reduce-scatter
    }
    if (sco) {
      if (l == L - 1) dev.free(b.pending);
      sco_get(s, b, l);
    }
    AttnIds attn;
    MoeIds moe;
    Id x1 = attn_forward(s, attn, true);
    Id x2 = moe_forward(s, moe, true, kAct);
    dev.free(x2);
    moe_backward(s, moe);
    dev.free(x1);
    attn_backward(s, attn);
    dev.free(b.dev[l]);  // store->release(l)
    dev.free(unit_grad);
    dev.free(unit);
  }
  if (s.multi) {
    Id g = dev.alloc(kGrads, s.gr(s.V * H), "fsdp.embed_tokens.grad");  // unsharded, then reduce-scatter
    dev.free(g);
  }
  dev.free(dx);  // end of Model::step: destroyed in reverse order
  dev.free(aux_bias);
  for (Id& hb : b.host) host.free(hb);  // the store and its host buffers
  dev.free(targets);
  dev.free(tokens);
  dev.free(pos);
  // The optimizer step allocates nothing: every variant reserved its working set at construction.
  (void)expert_layer;

  // ---- results
  r.sizes = z;
  r.peak = dev.peaks();
  r.at_peak = dev.at_total_peak();
  r.step_peak = dev.total_peak();
  r.peak_tag = dev.total_peak_tag();
  r.binding = kAllCategories[0];
  for (Category cat : kAllCategories)
    if (r.at_peak[static_cast<int>(cat)] > r.at_peak[static_cast<int>(r.binding)]) r.binding = cat;
  r.host_peak = host.peaks();
  r.host_needed = host.total_peak();
  r.fits_device = in.device_mem == kUnlimitedBytes || r.step_peak <= in.device_mem;
  r.fits_host = in.host_mem == kUnlimitedBytes || r.host_needed <= in.host_mem;
  return r;
}

}  // namespace fp::plan
