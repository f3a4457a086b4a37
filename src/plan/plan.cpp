// plan_step: resolves the baseline's optimizer rule, replays the step (step_plan.cpp), and labels
// each category exact or predicted; plan_reach: the largest context that fits.
#include "plan/plan.h"

#include "core/error.h"
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

// Note [Which plans are validated]: a formula is "validated" once the engine runs that schedule or
// layout and tests/model/test_plan_vs_meta.cpp checks the plan against a meta run of it: the whole
// allocation sequence, event for event, and every peak. Multi-rank layouts run through a comm of W
// ranks that moves no device data and answers the host count exchanges as W identically routing
// ranks would, which allocates what the hottest rank of a real run allocates. The engine's layout on
// W > 1 ranks is cp = ep = fsdp = W (context parallel over every rank, every dense parameter
// sharded by rows, E / W experts per rank, the vocabulary ring over W); another layout is a
// prediction. Flip a flag here in the same change that adds its configurations to that test.
struct Validated {
  bool context_parallel = true;  // model/ring_attention.cpp: K/V (and dK/dV) blocks in comm
  bool fsdp = true;              // model/params.cpp: row shards, gathered units, unsharded unit gradients
  bool expert_parallel = true;   // sched/dispatch/standard.cpp: all-to-all-v, receive-side grouping
  bool llep = true;              // sched/dispatch/llep.cpp: the plan's rows, guest weights (every rank)
  bool pipelined_llep = true;    // sched/dispatch/pipelined_llep.cpp: chunk by chunk (every rank)
  bool ring_one_rank = true;     // Ring-DTP with a replicated LM head (sched/vocab/ring_dtp.cpp)
  bool ring_p_ranks = true;      // Ring-DTP over P = W vocabulary shards (sched/vocab/ring_dtp_ring.cpp)
  bool sco = true;               // SCO (sched/ckpt/sco.cpp)
  bool offload_serial = true;    // serial host AdamW (sched/optim/offload.cpp)
  bool offload_stream = true;    // OffloadStreamAdamW, update on the device or the host
};
constexpr Validated kValidated{};

void label(const Input& in, Result& r) {
  const Schedules& s = r.sched;
  const Sizes& z = r.sizes;
  r.validated.fill(true);
  auto predict = [&](bool validated, std::string what, std::initializer_list<Category> cats) {
    if (validated) return;
    r.predicted.push_back(std::move(what));
    for (Category c : cats) r.validated[static_cast<int>(c)] = false;
  };
  const bool engine_layout = z.cp == z.ranks && z.ep == z.ranks && z.fsdp == z.ranks;
  if (z.ranks > 1 && !engine_layout)
    predict(false,
            fmt::format("layout cp = {}, ep = {}, fsdp = {} on {} ranks (the engine runs cp = ep = fsdp = W)", z.cp,
                        z.ep, z.fsdp, z.ranks),
            {kParams, kGrads, kOpt, kAct, kDisp, kComm, kVocab});
  if (z.cp > 1) predict(kValidated.context_parallel, "cp > 1: context parallel (ring attention)", {kComm, kAct});
  if (z.fsdp > 1) predict(kValidated.fsdp, "fsdp > 1: FSDP sharding (gathered units)", {kParams, kGrads, kOpt});
  if (z.ep > 1)
    predict(kValidated.expert_parallel, "ep > 1: expert parallel (all-to-all buffers, hottest rank)",
            {kParams, kGrads, kOpt, kDisp, kAct});
  if (z.ep > 1 && s.dispatch == Dispatch::Dispatch_llep)
    predict(kValidated.llep, "dispatch=llep (LLEP)", {kDisp, kAct, kComm});
  if (z.ep > 1 && s.dispatch == Dispatch::Dispatch_pipelined_llep)
    predict(kValidated.pipelined_llep, "dispatch=pipelined_llep (PipelinedLLEP)", {kDisp, kAct, kComm});
  if (s.vocab == Vocab::Vocab_ring) {
    if (z.vocab_ring > 1)
      predict(kValidated.ring_p_ranks, "vocab=ring over P > 1 shards (Ring-DTP)", {kVocab, kAct, kWs, kComm});
    else
      predict(kValidated.ring_one_rank, "vocab=ring (Ring-DTP)", {kVocab, kAct, kWs});
    // The engine keeps one strip; several live strips are a proposal.
    predict(s.vocab_strips <= 1, "vocab_strips > 1 (several Ring-DTP strips live at once)", {kVocab});
  }
  if (s.ckpt == Ckpt::Ckpt_sco) predict(kValidated.sco, "ckpt=sco (SCO)", {kCkpt});
  if (s.optim == Optim::Optim_offload_serial)
    predict(kValidated.offload_serial, "optim=offload_serial (serial host AdamW)", {kOpt});
  if (s.optim == Optim::Optim_offload_stream)
    predict(kValidated.offload_stream, "optim=offload_stream (OffloadStreamAdamW)", {kOpt});

  const bool sharded = z.params_per_rank != z.params_total;
  const std::string shard =
      sharded ? "P_rank (dense / fsdp, ceil(R / fsdp) rows per tensor, + experts / max(ep, fsdp))" : "P";
  auto& f = r.formula;
  f[static_cast<int>(kParams)] =
      z.fsdp > 1 ? shard + " x w + the gathered FSDP unit x w (one layer's attention, router and norms [+ its local "
                           "experts when fsdp > ep], the embedding, or the LM head)"
                 : shard + " x w";
  f[static_cast<int>(kGrads)] =
      z.fsdp > 1 ? shard + " x g + the unsharded gradient of the unit in backward x g (before its reduce-scatter)"
                 : shard + " x g";
  switch (s.optim) {
    case Optim::Optim_device:
      f[static_cast<int>(kOpt)] = shard + " x (m + v [+ master when weights are not the master dtype]): " +
                                  (in.settings.dtypes.weights == in.settings.dtypes.master ? "8 B" : "12 B") +
                                  " per parameter in fp32";
      break;
    case Optim::Optim_offload_serial:
      f[static_cast<int>(kOpt)] = "0 (master, m, v on the host: " + shard + " x 12 B, + the gradient copy)";
      break;
    case Optim::Optim_offload_stream:
      f[static_cast<int>(kOpt)] = "slots x B_max x 16 B staging (B_max: the largest bucket, <= bucket_params)";
      break;
    case Optim::Optim_auto: break;
  }
  f[static_cast<int>(kAct)] =
      "replayed: inputs 3 N x 4 + dx N H a + one layer's recompute and backward (N x {H, Q, Kv}, Re x I, the token "
      "side N k x H: xs, ys (which takes dys in place), dxs, with 2 x N k x 4 ids); or the head";
  f[static_cast<int>(kCkpt)] = s.ckpt == Ckpt::Ckpt_sco
                                   ? "2 x N x H x a (the last boundary and one restored; + boundaries beyond the host budget)"
                                   : "L x N x H x a";
  if (z.ep <= 1)
    f[static_cast<int>(kDisp)] = "0 (one rank receives nothing: its routed copies are activations)";
  else if (s.dispatch == Dispatch::Dispatch_pipelined_llep)
    f[static_cast<int>(kDisp)] = "2 x N k x 4 ids + the chunk in flight: m_i x H x a sent, 2 x r_i x H x a received "
                                 "and computed (r_i <= E_p x k x c_eff, whatever the routing)";
  else if (s.dispatch == Dispatch::Dispatch_llep && z.llep_active)
    f[static_cast<int>(kDisp)] = "2 x N k x 4 + 2 x R x 4 ids + 3 x R x H x a, R = the rows LLEP's plan gives "
                                 "this rank (near the mean N k)";
  else
    f[static_cast<int>(kDisp)] = "2 x R x 4 ids + 3 x R x H x a (in the recompute: the rows grouped by expert and "
                                 "two of y, y_send, dy_recv, dy), R = routes this rank's experts receive (>= N k "
                                 "on the hottest)";
  f[static_cast<int>(kVocab)] = s.vocab == Vocab::Vocab_ring
                                    ? "strips x n_blk x V/P x l + 16 B x N (online m f32, z f64, y f32)"
                                    : "3 x N x V x l (logits, log-softmax, gradient)";
  f[static_cast<int>(kComm)] = z.cp > 1 ? "backward ring attention: 2 x (k, v) x N x Kv x a + 2 x (dk, dv) x N x Kv x 4"
                                          " (+ Ring-DTP shards or activations in flight; + LLEP's guest expert weights "
                                          "and gradients, (G + S) x 3 I H)"
                                        : "0";
  f[static_cast<int>(kWs)] = s.vocab == Vocab::Vocab_ring ? "4 + 4E + 8 (grad norm, aux-loss bias, f64 loss sum)"
                                                          : "4 (grad norm) + 4E (aux-loss bias) + 4N + 4 (token losses)";
}

}  // namespace

Result plan_step(const Input& in, PeakReplay* device_replay, PeakReplay* host_replay) {
  Schedules sched = in.settings.sched;
  if (sched.optim == Optim::Optim_auto) {
    // The baseline's rule: the optimizer on the device when the whole step fits, otherwise the
    // serial host offload.
    sched.optim = Optim::Optim_device;
    if (!step_replay(in, sched, nullptr, nullptr).fits_device) sched.optim = Optim::Optim_offload_serial;
  }
  Result r = step_replay(in, sched, device_replay, host_replay);
  label(in, r);
  return r;
}

Reach plan_reach(Input in, int64_t cap) {
  const int64_t g = in.settings.layout.cp > 0 ? in.settings.layout.cp : in.settings.layout.ranks;
  auto fits = [&](int64_t T) {
    in.context = T;
    return plan_step(in).fits();
  };
  int64_t lo = 0, hi = -1;  // lo fits (0: nothing known), hi does not (-1: nothing known)
  for (int64_t T = g * ((1024 + g - 1) / g); T <= cap; T *= 2) {
    if (!fits(T)) {
      hi = T;
      break;
    }
    lo = T;
  }
  Reach out;
  if (hi < 0) {
    out.capped = true;
  } else {
    while (hi - lo > g) {
      const int64_t mid = lo + (hi - lo) / g / 2 * g;
      (fits(mid) ? lo : hi) = mid;
    }
  }
  out.max_context = lo;
  if (lo > 0) {
    out.max_pow2 = 1;
    while (out.max_pow2 * 2 <= lo) out.max_pow2 *= 2;
    in.context = lo;
    out.at_max = plan_step(in);
  }
  return out;
}

}  // namespace fp::plan
