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
// expert side holds at most rows_chunk = E_p * k * c_eff rows per chunk; two chunks are in flight
// (chunk i computes while i+1 is dispatched): dispatch <= 2 * E_p * k * c_eff * H * bytes. The
// backward recomputes the experts chunk by chunk, so the layer keeps only the token side.
void chunk_expert_forward(Step& s, bool for_backward) {
  PeakReplay& d = s.d;
  const int64_t H = s.H, I = s.I, rc = s.rows_chunk;
  Id recv = d.alloc(kDisp, 2 * s.act(rc * H), "llep.recv2");  // 2 x (rc, H)
  Id g = d.alloc(kAct, s.act(rc * I), "llep.g");
  Id u = d.alloc(kAct, s.act(rc * I), "llep.u");
  Id act = d.alloc(kAct, s.act(rc * I), "llep.act");
  if (!for_backward) {
    d.free(g);
    d.free(u);
    Id ys = d.alloc(kDisp, s.act(rc * H), "llep.ys");
    d.free(act);
    d.free(ys);
    d.free(recv);
    return;
  }
  Id dys = d.alloc(kDisp, s.act(rc * H), "llep.dys");
  Id dact = d.alloc(kAct, s.act(rc * I), "llep.dact");
  d.free(dys);
  d.free(act);
  Id dg = d.alloc(kAct, s.act(rc * I), "llep.dg");
  Id du = d.alloc(kAct, s.act(rc * I), "llep.du");
  d.free(dact);
  d.free(g);
  d.free(u);
  Id dxs = d.alloc(kDisp, s.act(rc * H), "llep.dxs");
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
  d.free(tok_loss);
  d.free(sum);
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

// Predicted (Ring-DTP, DESIGN.md). One rank: token blocks of n_blk against the whole vocabulary with
// the online log-sum-exp, the block's gradient computed in the same sweep. P ranks: n_blk x V/P
// strips around the ring, the shards (move weights) or the activations (move activations) in flight.
void head_ring(Step& s) {
  PeakReplay& d = s.d;
  const int64_t N = s.N, H = s.H, P = s.z.vocab_ring;
  const int64_t nb = std::min(s.sched.block_tokens, N), Vp = ceil_div(s.V, P);
  const int64_t strips = s.sched.vocab_strips > 0 ? s.sched.vocab_strips : (P == 1 ? 1 : 2);
  Id xn = d.alloc(kAct, s.act(N * H), "head.xn");
  Id rstd = d.alloc(kAct, s.f32(N), "head.rstd");
  Id state = d.alloc(kWs, s.f32(3 * N), "ring.mzy");  // running (m, z, y) per token
  Id tok_loss = d.alloc(kWs, s.f32(N), "head.token_loss");
  Id dxn = d.alloc(kAct, s.act(N * H), "head.dxn");
  Id comm = kNone;
  if (P > 1) {
    if (s.z.ring_mode == "weights")  // the shard being used and the one arriving, dW travelling home
      comm = d.alloc(kComm, 2 * s.wt(Vp * H) + 2 * s.f32(Vp * H), "ring.shards");
    else  // the batch, its running state, and dX travelling
      comm = d.alloc(kComm, 2 * s.act(N * H) + 2 * s.f32(N * H) + 2 * s.f32(3 * N), "ring.activations");
  }
  Id strip = d.alloc(kVocab, static_cast<uint64_t>(strips) * s.lg(nb * Vp), "ring.strips");  // strips x (n_blk, V/P)
  d.free(strip);
  d.free(comm);
  d.free(tok_loss);
  d.free(state);
  d.free(xn);
  d.free(dxn);
  d.free(rstd);
}

// ---- boundaries (sched/ckpt/boundary_store.h; SCO predicted) ---------------------------------------
struct Boundaries {
  std::vector<Id> dev;   // (N, H) on the device, per layer
  std::vector<Id> host;  // (N, H) on the host, per layer (sco)
  int64_t offloaded = 0; // sco: layers [0, offloaded) go to host
};

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

  // ---- persistent: ParamStore (params, grads), then the optimizer's state.
  const uint64_t wb = dtype_size(set.dtypes.weights), gb = dtype_size(set.dtypes.grads);
  const uint64_t master_b = set.dtypes.weights == set.dtypes.master ? 0 : dtype_size(set.dtypes.master);
  const uint64_t mom_b = dtype_size(set.dtypes.moments);
  const int64_t P = z.params_per_rank;
  Id params = dev.alloc(kParams, P * wb, "params");
  Id grads = dev.alloc(kGrads, P * gb, "grads");
  const Optim optim = r.sched.optim;
  FP_ASSERT(optim != Optim::Optim_auto, "plan_step receives a resolved optimizer schedule");
  Id opt_state = kNone, sumsq = kNone;
  Id host_state = kNone, host_grads = kNone;
  if (optim == Optim::Optim_device) {
    opt_state = dev.alloc(kOpt, P * (2 * mom_b + master_b), "adamw.m_v");  // m, v (+ master)
  } else {
    // Predicted: master weights, m and v in (pinned) host memory.
    host_state = host.alloc(kOpt, P * (dtype_size(set.dtypes.master) + 2 * mom_b), "host.master_m_v");
  }
  sumsq = dev.alloc(kWs, 4, "adamw.grad_sumsq");  // (1)

  // ---- the step (model.cpp)
  Id tokens = dev.alloc(kAct, s.i32(N), "input.tokens");
  Id targets = dev.alloc(kAct, s.i32(N), "input.targets");
  Id pos = dev.alloc(kAct, s.i32(N), "input.positions");
  Boundaries b;
  b.dev.assign(static_cast<size_t>(L), kNone);
  b.host.assign(static_cast<size_t>(L), kNone);
  const bool sco = r.sched.ckpt == Ckpt::Ckpt_sco;
  if (sco) {
    // Predicted (SCO): boundaries go to host in layer order until the budget is used up; the host
    // memory left after the optimizer's state bounds the budget.
    uint64_t budget = r.sched.ckpt_host_budget;
    if (in.host_mem != kUnlimitedBytes) {
      const uint64_t left = in.host_mem > host.total_current() ? in.host_mem - host.total_current() : 0;
      budget = std::min(budget, left);
    }
    const uint64_t one = s.act(N * H);
    b.offloaded = budget == kUnlimitedBytes ? L : std::min<int64_t>(L, static_cast<int64_t>(budget / one));
    z.boundaries_offloaded = b.offloaded;
  }
  Id embed_unit = kNone;
  if (s.multi) embed_unit = dev.alloc(kParams, s.wt(s.V * H), "fsdp.embed_tokens");  // gathered (V, H)
  Id x = dev.alloc(kCkpt, s.act(N * H), "ckpt.layer0");
  dev.free(embed_unit);
  Id pending = kNone;  // sco: a boundary whose copy to host is in flight
  for (int64_t l = 0; l < L; ++l) {
    Id unit = kNone;
    if (s.multi) unit = dev.alloc(kParams, s.wt(s.unit_params), "fsdp.layer");
    AttnIds attn;
    Id x1 = attn_forward(s, attn, false);
    if (sco && l < b.offloaded) {
      b.host[l] = host.alloc(kCkpt, s.act(N * H), "sco.host_boundary");
      pending = x;  // freed once its copy is done: predicted after the next boundary exists
      x = kNone;
    } else {
      b.dev[l] = x;
      x = kNone;
    }
    const bool last = l + 1 == L;
    MoeIds moe;
    x = moe_forward(s, moe, false, last ? kAct : kCkpt);
    dev.free(pending);
    dev.free(x1);
    dev.free(unit);
  }

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
    if (sco && l < b.offloaded) {
      // Predicted: restore l (unless prefetched) and prefetch l - 1 while l recomputes: two on device.
      if (b.dev[l] == kNone) b.dev[l] = dev.alloc(kCkpt, s.act(N * H), "sco.restore");
      if (l > 0 && l - 1 < b.offloaded) b.dev[l - 1] = dev.alloc(kCkpt, s.act(N * H), "sco.restore");
    }
    AttnIds attn;
    MoeIds moe;
    Id x1 = attn_forward(s, attn, true);
    Id x2 = moe_forward(s, moe, true, kAct);
    dev.free(x2);
    moe_backward(s, moe);
    dev.free(x1);
    attn_backward(s, attn);
    dev.free(b.dev[l]);
    dev.free(unit_grad);
    dev.free(unit);
  }
  for (Id& hb : b.host) host.free(hb);  // store->clear()
  if (s.multi) {
    Id g = dev.alloc(kGrads, s.gr(s.V * H), "fsdp.embed_tokens.grad");  // unsharded, then reduce-scatter
    dev.free(g);
  }
  dev.free(dx);
  dev.free(aux_bias);
  dev.free(pos);
  dev.free(targets);
  dev.free(tokens);

  // ---- optimizer step (sched/optim): the device variant allocates nothing more.
  if (optim == Optim::Optim_offload_stream) {
    // Predicted (OffloadStreamAdamW, update on the device): S staging slots of the largest bucket,
    // 16 B per parameter (fp32 master, m, v, gradient).
    const int64_t bucket = std::min<int64_t>(r.sched.bucket_params, P);
    Id staging = dev.alloc(kOpt, static_cast<uint64_t>(r.sched.slots) * bucket * 16, "offload.staging");
    dev.free(staging);
  } else if (optim == Optim::Optim_offload_serial) {
    // Predicted: every gradient copied to host (fp32) for the CPU update, parameters copied back in place.
    host_grads = host.alloc(kGrads, P * 4, "host.grads");
    host.free(host_grads);
  }
  (void)params;
  (void)grads;
  (void)opt_state;
  (void)sumsq;
  (void)host_state;
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
