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

// Note [Which plans are validated]: a formula is "validated" once the engine runs that schedule and
// tests/model/test_plan_vs_meta.cpp checks the plan against a meta run of it. Flip a flag here in
// the same change that adds its configurations to that test.
// On more than one rank every formula is predicted (multi_rank), whatever the schedule.
struct Validated {
  bool multi_rank = false;       // FSDP sharding, context parallel, expert parallel (MPI, later)
  bool pipelined_llep = false;   // needs expert parallelism (multi-rank)
  bool ring = true;              // Ring-DTP on one rank (sched/vocab/ring_dtp.cpp)
  bool sco = true;               // SCO (sched/ckpt/sco.cpp)
  bool offload_serial = true;    // serial host AdamW (sched/optim/offload.cpp)
  bool offload_stream = true;    // OffloadStreamAdamW, update on the device or the host
};
constexpr Validated kValidated{};

void label(const Input& in, Result& r) {
  const Schedules& s = r.sched;
  r.validated.fill(true);
  auto predict = [&](bool validated, std::string what, std::initializer_list<Category> cats) {
    if (validated) return;
    r.predicted.push_back(std::move(what));
    for (Category c : cats) r.validated[static_cast<int>(c)] = false;
  };
  const std::initializer_list<Category> all = {kParams, kGrads, kOpt, kAct, kCkpt, kDisp, kVocab, kComm, kWs};
  if (r.sizes.ranks > 1)
    predict(kValidated.multi_rank, "W > 1: FSDP sharding, context parallel, expert parallel", all);
  if (s.dispatch == Dispatch::Dispatch_pipelined_llep)
    predict(kValidated.pipelined_llep, "dispatch=pipelined_llep (PipelinedLLEP)", {kDisp, kAct});
  if (s.vocab == Vocab::Vocab_ring) predict(kValidated.ring, "vocab=ring (Ring-DTP)", {kVocab, kAct, kWs, kComm});
  if (s.ckpt == Ckpt::Ckpt_sco) predict(kValidated.sco, "ckpt=sco (SCO)", {kCkpt});
  if (s.optim == Optim::Optim_offload_serial)
    predict(kValidated.offload_serial, "optim=offload_serial (serial host AdamW)", {kOpt});
  if (s.optim == Optim::Optim_offload_stream)
    predict(kValidated.offload_stream, "optim=offload_stream (OffloadStreamAdamW)", {kOpt});

  const bool multi = r.sizes.ranks > 1;
  const std::string shard = multi ? "P/W" : "P";
  auto& f = r.formula;
  f[static_cast<int>(kParams)] =
      multi ? "P/W x w + the gathered FSDP unit x w (one layer's attention, router and norms [+ its local experts "
              "when ep < W], the embedding, or the LM head)"
            : "P x w";
  f[static_cast<int>(kGrads)] =
      multi ? "P/W x g + the unsharded gradient of the unit in backward x g (before its reduce-scatter)" : "P x g";
  switch (s.optim) {
    case Optim::Optim_device:
      f[static_cast<int>(kOpt)] =
          shard + " x (m + v [+ master when weights are not fp32]): " + (in.settings.dtypes.weights == in.settings.dtypes.master ? "8 B" : "12 B") + " per parameter";
      break;
    case Optim::Optim_offload_serial: f[static_cast<int>(kOpt)] = "0 (master, m, v on the host: " + shard + " x 12 B)"; break;
    case Optim::Optim_offload_stream: f[static_cast<int>(kOpt)] = "slots x min(bucket, " + shard + ") x 16 B staging"; break;
    case Optim::Optim_auto: break;
  }
  f[static_cast<int>(kAct)] =
      "replayed: inputs 3 N x 4 + dx N H a + one layer's recompute and backward (N x {H, Q, Kv}, Re x I); or the head";
  f[static_cast<int>(kCkpt)] = s.ckpt == Ckpt::Ckpt_sco ? "2 x N x H x a (+ boundaries beyond the host budget)"
                                                        : "L x N x H x a";
  if (s.dispatch == Dispatch::Dispatch_pipelined_llep)
    f[static_cast<int>(kDisp)] = "2 x E_p x k x c_eff x H x a (a chunk's received rows and their outputs) + 2 x N k x 4 ids";
  else
    f[static_cast<int>(kDisp)] = multi ? "2 x N k x 4 ids + recompute: R x H (xs) + N k x H (ys) + N k x H (dys) x a, "
                                         "R = routes the hottest rank receives"
                                       : "2 x N k x 4 ids + 3 x N k x H x a (xs, ys, dys in the recompute)";
  f[static_cast<int>(kVocab)] = s.vocab == Vocab::Vocab_ring ? "strips x n_blk x V/P x l" : "3 x N x V x l (logits, log-softmax, gradient)";
  f[static_cast<int>(kComm)] = multi ? "context-parallel K/V ring (+ Ring-DTP shards or activations in flight)" : "0";
  f[static_cast<int>(kWs)] = s.vocab == Vocab::Vocab_ring ? "4 + 4E + 16 N (running m, z, y and token losses)"
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
