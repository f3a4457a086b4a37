// plan_step: the engine on meta over W threads (Note [The engine is its own planner] in plan.h);
// plan_reach: the largest context that fits, by search over such runs.
#include "plan/plan.h"

#include <algorithm>

#include "backend/backend.h"
#include "core/error.h"
#include "core/timing.h"
#include "data/context_split.h"
#include "sched/dispatch/chunk_plan.h"
#include "sched/optim/optimizer.h"
#include "sched/vocab/ring_dtp.h"
#include "step/step.h"
#include "train/checkpoint.h"
#include "train/session.h"

namespace fp::plan {

namespace {

// One training step as the trainer runs it (zero grads, step_forward_backward, the optimizer step) on
// every rank of a W-rank thread world, each on its own meta backend; returns every rank's ledgers.
std::vector<RankPlan> world_run(const Input& in, const Schedules& sc, const PlanOptions& opt) {
  const ModelConfig& cfg = in.model;
  const int W = static_cast<int>(in.settings.layout.ranks);
  const int cp = static_cast<int>(in.settings.layout.context_ranks());
  const int64_t B = in.settings.layout.batch, T = in.context;
  FP_CHECK(cp >= 1 && W % cp == 0, "--mesh dp=D,cp=C with D x C ranks", "{} context-parallel ranks do not divide {}",
           cp, W);
  std::vector<RankPlan> out(static_cast<size_t>(W));
  ThreadWorld world(W);
  world.run([&](Comm& comm) {
    const int r = comm.rank();
    // Unlimited device (the plan reads the whole step's peak); the host at its capacity, which SCO
    // reads to place boundaries, overcommitted so an offload that needs more is measured, not refused.
    std::unique_ptr<Backend> be = backend_create("meta", kUnlimitedBytes, in.host_mem);
    be->host_ledger().overcommit_set(true);
    if (!opt.events) {
      be->device_ledger().events_limit_set(0);
      be->host_ledger().events_limit_set(0);
      // Note [Repeats replayed once] (memory/ledger.h): the counters are the plan, and a block repeated
      // alike moves them once.
      be->device_ledger().repeats_set(!opt.full_replay);
      be->host_ledger().repeats_set(!opt.full_replay);
    }
    fp::Model model(cfg, *be, in.settings.routing, sc, in.settings.precision, W > 1 ? &comm : nullptr,
                    RankGroups{static_cast<int>(in.settings.layout.ep), static_cast<int>(in.settings.layout.fsdp)});
    if (W > 1) model.set_context_parallel(cp);
    model.set_reroute_each_n(opt.reroute_each_n);
    RankPlan& rp = out[static_cast<size_t>(r)];
    // Elements, counted per tensor: not the params bytes over one dtype's size, which counts a parameter
    // kept in f32 among bf16 ones twice (Note [Parameters kept in f32] in model/params.h).
    for (const Param& p : model.params().all()) rp.params_per_rank += p.local_w().numel();
    model.init_weights(cfg.seed);
    std::unique_ptr<Optimizer> optim = optimizer_create(OptimConfig{}, sc.optim, model.params(), *be);
    // Data never reaches a meta backend; only the shapes and this rank's positions matter.
    Batch batch;
    batch.B = B;
    batch.T = cp > 1 ? T / cp : T;
    batch.tokens.assign(static_cast<size_t>(batch.B * batch.T), 0);
    batch.targets.assign(batch.tokens.size(), 0);
    if (cp > 1) batch.positions = context_positions(T, r % cp, cp);
    // Note [A step that cannot fit is not run]: every rank learns whether the described one is over skip_over.
    int64_t skip = 0;
    if (opt.skip_over > 0) {
      const int64_t described = in.settings.layout.rank;
      skip = (described < 0 || described == r) && be->device_ledger().total_current() > opt.skip_over ? 1 : 0;
      comm.all_reduce_max(&skip, 1, DType::DType_I64);
    }
    // Note [Time in the planner]: the step's work alone, counted from here (weights' initialisation is not a step's).
    be->work_reset(in.profile.get(), W);
    if (skip == 0)
      train_step(model, *optim, 1, 1, 0.0, [&] { return step_forward_backward(model, batch); });  // as train runs it
    if (const WorkLog* w = be->work()) rp.work = *w;
    // train.checkpoint_async: the host copy rank 0 allocates for the run, as train allocates it (a fresh run
    // writes its weights in its own dtype).
    if (in.settings.checkpoint_async) {
      CheckpointFormat format;
      format.weights = model.params().precision().params;
      rp.host_checkpoint_copy = checkpoint_image_bytes(cfg, model.params(), true, format).total();
    }
    const Ledger& d = be->device_ledger();
    const Ledger& h = be->host_ledger();
    for (Category c : kAllCategories) {
      rp.peak[static_cast<int>(c)] = d.peak(c);
      rp.host_peak[static_cast<int>(c)] = h.peak(c);
    }
    rp.at_peak = d.at_total_peak();
    rp.step_peak = d.total_peak();
    rp.peak_tag = d.total_peak_tag();
    rp.host_needed = h.total_peak();
    rp.events_seen = d.events_seen();
    rp.host_events_seen = h.events_seen();
    rp.events_repeated = d.events_repeated() + h.events_repeated();
    const uint64_t boundary =
        static_cast<uint64_t>(batch.B * batch.T * cfg.hidden_size) * dtype_size(in.settings.precision.activations);
    rp.boundaries_offloaded = boundary > 0 ? static_cast<int64_t>(h.peak(kCkpt) / boundary) : 0;
    if (opt.events) {
      rp.events = d.events();
      rp.host_events = h.events();
    }
  });
  return out;
}

// The rank the plan describes: the largest step peak; among equals the largest sum of category
// peaks, then the first.
int64_t rank_pick(const std::vector<RankPlan>& ranks) {
  auto key = [&](size_t r) {
    uint64_t sum = 0;
    for (uint64_t b : ranks[r].peak) sum += b;
    return std::pair<uint64_t, uint64_t>{ranks[r].step_peak, sum};
  };
  size_t top = 0;
  for (size_t r = 1; r < ranks.size(); ++r)
    if (key(r) > key(top)) top = r;
  return static_cast<int64_t>(top);
}

void describe(const Input& in, Result& r) {
  const Schedules& s = r.sched;
  const Sizes& z = r.sizes;
  const Precision& p = r.precision;
  auto& f = r.formula;
  const std::string shard = z.ranks > 1 ? "P / W (FSDP rows of every dense tensor, E / W experts)" : "P";
  f[static_cast<int>(kParams)] =
      shard + fmt::format(" x {}", dtype_name(p.params)) +
      (z.ranks > 1 ? " + one gathered FSDP unit (a layer, the embedding or the LM head)" : "");
  f[static_cast<int>(kGrads)] = shard + fmt::format(" x {}", dtype_name(p.grads)) +
                                (z.ranks > 1 ? " + the unsharded gradient of the unit in backward" : "");
  switch (s.optim.kind) {
    case OptimSchedule::Kind::Kind_device:
      f[static_cast<int>(kOpt)] = shard + fmt::format(" x (m, v in {}{})", dtype_name(p.moments),
                                                      p.params == p.master ? "" : " + an fp32 master copy");
      break;
    case OptimSchedule::Kind::Kind_offload_serial:
      f[static_cast<int>(kOpt)] = "0 on the device (master, m, v on the host)";
      break;
    case OptimSchedule::Kind::Kind_offload_stream:
      f[static_cast<int>(kOpt)] = "slots x the largest bucket (<= bucket_params) of staging";
      break;
    case OptimSchedule::Kind::Kind_auto:
      break;
  }
  f[static_cast<int>(kAct)] =
      s.ckpt.recompute ? "one layer's recompute and backward (N x {H, Q, Kv}, the token side N k x H, the "
                         "experts' rows x I), or the head"
                       : "every layer's activations, kept from forward to backward (ckpt.recompute = false: L x "
                         "(N x {H, Q, Kv}, the token side N k x H, the experts' rows x I))";
  f[static_cast<int>(kCkpt)] = s.ckpt.kind == CkptSchedule::Kind::Kind_sco
                                   ? "2 x N x H (the last boundary and one restored; + any beyond the host budget)"
                                   : "L x N x H";
  f[static_cast<int>(kDispatch)] =
      z.ranks == 1 ? "0 (one rank receives nothing: its routed copies are activations)"
      : s.dispatch.kind == DispatchSchedule::Kind::Kind_pipelined_llep
          ? "the chunk in flight: at most 2 x W k c_eff x H, whatever the routing"
          : "what this rank's experts receive: R x H (R = routes to its experts, or LLEP's share)";
  f[static_cast<int>(kVocab)] = s.vocab.kind == VocabSchedule::Kind::Kind_ring
                                    ? "one n_blk x V/P strip (+ kept strips) + the online "
                                      "state (m, z, y) per token"
                                    : "3 x N x V (logits, log-softmax, gradient)";
  f[static_cast<int>(kComm)] = z.ranks > 1 ? "ring attention K/V (dK/dV) blocks, Ring-DTP shards or batches in "
                                             "flight, LLEP's guest expert weights"
                                           : "0";
  f[static_cast<int>(kWs)] = "grad-norm and aux-loss scalars (+ per-token losses with the full head)";
}

// Note [Time in the planner]: the described rank's counts, and the slowest rank's predicted time.
void step_time(const Input& in, const std::vector<RankPlan>& ranks, const RankPlan& rp, Result& r) {
  StepTime& t = r.time;
  const WorkLog& w = rp.work;
  for (int i = 0; i < ops::kKernelCount; ++i) {
    const KernelCount& k = w.kernels()[static_cast<size_t>(i)];
    const auto id = static_cast<ops::KernelId>(i);
    t.flops += k.flops;
    t.kernel_calls += k.calls;
    if (id == ops::KernelId::KernelId_gemm || id == ops::KernelId::KernelId_gemm_tiled ||
        id == ops::KernelId::KernelId_gemm_grouped || id == ops::KernelId::KernelId_gemm_grouped_weight)
      t.gemm_flops += k.flops;
    if (id == ops::KernelId::KernelId_attention_forward || id == ops::KernelId::KernelId_attention_backward ||
        id == ops::KernelId::KernelId_attention_block_forward || id == ops::KernelId::KernelId_attention_block_backward)
      t.attention_flops += k.flops;
  }
  for (int l = 0; l < kNumLinks; ++l) t.link_bytes[static_cast<size_t>(l)] = w.links()[static_cast<size_t>(l)].bytes;
  const double tokens = static_cast<double>(r.sizes.tokens);
  t.model_flops = model_flops_estimate(in.model, tokens, static_cast<double>(in.context));
  if (!in.profile) return;
  t.predicted = true;
  t.profile = in.profile->name;
  for (const RankPlan& x : ranks) t.seconds = std::max(t.seconds, x.work.step_seconds());
  t.busy = w.busy();
  int top = 0;
  for (int c = 1; c < kNumTimeClasses; ++c)
    if (t.busy[static_cast<size_t>(c)] > t.busy[static_cast<size_t>(top)]) top = c;
  t.binding = static_cast<TimeClass>(top);
  t.peak_flops = in.profile->gemm_bf16;
  if (r.precision.activations == DType::DType_F32) t.peak_flops = in.profile->gemm_f32;
  if (t.seconds > 0) {
    t.tokens_per_s = tokens / t.seconds;
    if (t.peak_flops > 0) t.mfu = t.model_flops / (t.seconds * t.peak_flops);
  }
}

// The plan of one resolved schedule.
Result plan_resolved(const Input& in, const Schedules& sc, const PlanOptions& opt) {
  const Clock::time_point t0 = Clock::now();
  const ModelConfig& c = in.model;
  const Layout& lay = in.settings.layout;
  FP_CHECK(lay.ranks >= 1 && lay.batch >= 1, "ranks and batch are at least 1", "ranks {} batch {}", lay.ranks,
           lay.batch);
  FP_CHECK(lay.rank < lay.ranks, "rank= names a rank below --ranks", "rank={} with {} ranks", lay.rank, lay.ranks);
  FP_CHECK(lay.expert_ranks() == 1 || c.num_experts % lay.expert_ranks() == 0,
           "choose a rank count (or --mesh ep=) that divides the number of experts (the engine places E / ep experts "
           "on each rank)",
           "{} experts cannot be spread over {} ranks", c.num_experts, lay.expert_ranks());
  FP_CHECK(lay.context_ranks() == 1 || in.context % (2 * lay.context_ranks()) == 0,
           "choose a context divisible by 2 x the context-parallel ranks (context parallelism cuts each sequence "
           "into 2cp zig-zag chunks)",
           "context {} is not divisible by 2 x {} context-parallel ranks", in.context, lay.context_ranks());
  std::vector<RankPlan> local;
  std::vector<RankPlan>& ranks = opt.ranks != nullptr ? *opt.ranks : local;
  ranks = world_run(in, sc, opt);
  const int64_t pick = lay.rank >= 0 ? lay.rank : rank_pick(ranks);
  const RankPlan& rp = ranks[static_cast<size_t>(pick)];

  Result r;
  r.sched = sc;
  r.precision = in.settings.precision;
  Sizes& z = r.sizes;
  z.ranks = lay.ranks;
  z.rank = pick;
  z.tokens = lay.batch * in.context / lay.context_ranks();
  z.routes_sent = z.tokens * c.num_experts_per_tok;
  z.params_total = c.param_count();
  z.params_per_rank = rp.params_per_rank;
  z.boundaries_offloaded = sc.ckpt.kind == CkptSchedule::Kind::Kind_sco ? rp.boundaries_offloaded : 0;
  if (sc.vocab.kind == VocabSchedule::Kind::Kind_ring) {
    z.vocab_ring = lay.ranks;
    if (lay.ranks > 1) {
      VocabSchedule v;
      v.ring_mode = sc.vocab.ring_mode;
      z.ring_mode =
          ring_dtp_mode(v, z.tokens, c.vocab_size, static_cast<int>(lay.ranks)) == RingMode::RingMode_activations
              ? "activations"
              : "weights";
    }
  }
  if (sc.dispatch.kind == DispatchSchedule::Kind::Kind_pipelined_llep && lay.ranks > 1) {
    const int64_t window = sc.dispatch.token_chunk > 0 ? std::min(z.tokens, sc.dispatch.token_chunk) : z.tokens;
    const ChunkPlan cp = chunk_plan_build(
        std::max<int64_t>(window, 1), sc.dispatch.chunk_cap, chunk_budget(sc.dispatch.max_chunks, window, z.tokens),
        sc.dispatch.strided ? ChunkMembership::ChunkMembership_strided : ChunkMembership::ChunkMembership_contiguous);
    z.chunks = cp.K;
    z.chunk_tokens = cp.c_eff;
  }
  r.peak = rp.peak;
  r.at_peak = rp.at_peak;
  r.step_peak = rp.step_peak;
  r.peak_tag = rp.peak_tag;
  r.host_peak = rp.host_peak;
  r.host_needed = rp.host_needed;
  // Rank 0 holds the checkpoint copy besides its step's host memory: host_needed is the larger of the
  // described rank's and rank 0's.
  r.host_checkpoint_copy = ranks[0].host_checkpoint_copy;
  if (r.host_checkpoint_copy > 0)
    r.host_needed = std::max(pick == 0 ? 0 : rp.host_needed, ranks[0].host_needed + r.host_checkpoint_copy);
  r.binding = Category::Category_params;
  for (Category cat : kAllCategories)
    if (r.at_peak[static_cast<int>(cat)] > r.at_peak[static_cast<int>(r.binding)]) r.binding = cat;
  r.fits_device = in.device_mem == kUnlimitedBytes || r.step_peak <= in.device_mem;
  r.fits_host = in.host_mem == kUnlimitedBytes || r.host_needed <= in.host_mem;
  r.approximate = in.approximate;
  step_time(in, ranks, rp, r);
  describe(in, r);
  r.seconds = seconds_since(t0);
  return r;
}

}  // namespace

namespace {

Result plan_optim(const Input& in, Schedules sched, const PlanOptions& opt) {
  schedules_validate(sched, "plan", /*auto_optim=*/true);
  if (sched.optim.kind != OptimSchedule::Kind::Kind_auto) return plan_resolved(in, sched, opt);
  // The baseline's rule: the optimizer on the device when the whole step fits, otherwise the serial
  // host offload.
  //
  // Note [A step that cannot fit is not run]
  // The optimizer on the device allocates its state (m, v and the master copy: 12 B per parameter of the
  // rank's shard in the paper's recipe) with the parameters and gradients before the step, at every
  // context: DeepSeek-V3 on 64 x 141 GB holds more than the device then, and each baseline point of a reach
  // search ran that step only to find it does not fit. A peak is at least what is held at any moment, so when
  // the rank the plan describes holds more than the device before the step (rank_pick describes the rank with
  // the largest peak, at least that rank's), the step cannot fit and is not run (PlanOptions::skip_over): the
  // plan is the same, the serial offload's, one engine run sooner. The first try's result is kept only when it
  // fits.
  sched.optim.kind = OptimSchedule::Kind::Kind_device;
  PlanOptions first_try = opt;
  if (in.device_mem != kUnlimitedBytes) first_try.skip_over = in.device_mem;
  Result r = plan_resolved(in, sched, first_try);
  if (r.fits_device) return r;
  sched.optim.kind = OptimSchedule::Kind::Kind_offload_serial;
  const double first = r.seconds;
  r = plan_resolved(in, sched, opt);
  r.seconds += first;
  return r;
}

}  // namespace

// Note [The planner shrinks what binds]
// The flatpeak preset starts from layer tiles of kFlatpeakLayerTile tokens and Ring-DTP strips of 1024 (the
// times measured in docs/benchmarks.md: larger tiles and strips cost less). When its step does not fit the
// device, the planner halves what binds and plans again: the strip while the vocabulary binds (down to
// kMinStrip tokens), the tile while activations or comm bind (down to kMinTile; the ring's blocks travel in
// chunks of the tile, Note [The ring's blocks in chunks] in model/ring_attention.cpp), until the step fits or
// neither can shrink. So each context gets the largest tile and strip that fit, and the reach search the reach
// they give; the plan prints the tile and strip it chose. A key given by name is kept (Settings::shrink).
Result plan_step(const Input& in, const PlanOptions& opt) {
  Result r = plan_optim(in, in.settings.sched, opt);
  if (!in.settings.shrink) return r;
  constexpr int64_t kMinStrip = 128, kMinTile = 1024;
  Schedules s = in.settings.sched;
  double seconds = r.seconds;
  while (!r.fits_device) {
    const bool act = r.binding == Category::Category_activations || r.binding == Category::Category_comm;
    if (r.binding == Category::Category_vocab && s.vocab.kind == VocabSchedule::Kind::Kind_ring &&
        s.vocab.block_tokens > kMinStrip)
      s.vocab.block_tokens /= 2;
    else if (act && s.ckpt.layer_tile > kMinTile)
      s.ckpt.layer_tile /= 2;
    else
      break;
    r = plan_optim(in, s, opt);
    seconds += r.seconds;
  }
  r.seconds = seconds;
  return r;
}

double model_flops_estimate(const ModelConfig& m, double tokens, double T) {
  const double H = static_cast<double>(m.hidden_size), hd = static_cast<double>(m.head_dim);
  const double attn_proj = H * hd * static_cast<double>(2 * m.num_attention_heads + 2 * m.num_key_value_heads);
  const double experts = 3.0 * H * static_cast<double>(m.moe_intermediate_size * m.num_experts_per_tok);
  const double router = H * static_cast<double>(m.num_experts);
  const double per_token =
      static_cast<double>(m.num_hidden_layers) * (attn_proj + experts + router) + H * static_cast<double>(m.vocab_size);
  const double attn =
      static_cast<double>(m.num_hidden_layers) * 2.0 * 2.0 * T / 2.0 * hd * static_cast<double>(m.num_attention_heads);
  return (6.0 * per_token + 3.0 * attn) * tokens;
}

// Note [Searching the reach]
// Each point of the search is a W-rank run of the engine on meta (seconds at the paper's scale), so
// the search asks few points. How full a plan is: f(T) = step_peak / device_mem when the step fits,
// and the larger of that and host_needed / host_mem when it does not (fits iff f <= 1; the host ratio
// is left out of fitting points because SCO fills the host up to its capacity and then keeps
// boundaries on the device, so that ratio sits near 1 over a long range and says nothing about the
// edge). f is close to linear in T: the step's tensors are linear in the tokens per rank (no T x T
// anywhere) plus a constant (parameters, optimizer state). So the next point is where the line
// through two points reaches 1: extrapolated from the last two fitting points until a point does not
// fit, then interpolated inside the bracket with the Illinois rule (when the same end moves twice in
// a row, the other end's distance to 1 is halved, so a kink in f cannot stall the search), rounded to
// the engine's granularity g. The answer is exact at that granularity: max_context fits and
// max_context + g does not (or the cap is reached).
Reach plan_reach(Input in, int64_t cap, const ReachProgress& progress) {
  // The engine's granularity: T a multiple of 2cp on cp > 1 context-parallel ranks (the zig-zag split).
  const int64_t cp = in.settings.layout.context_ranks(), g = cp > 1 ? 2 * cp : 1;
  auto fill = [&](const Result& r) {
    double dev = 0, host = 0;
    if (in.device_mem != kUnlimitedBytes)
      dev = static_cast<double>(r.step_peak) / static_cast<double>(std::max<uint64_t>(in.device_mem, 1));
    if (in.host_mem != kUnlimitedBytes)
      host = static_cast<double>(r.host_needed) / static_cast<double>(std::max<uint64_t>(in.host_mem, 1));
    return r.fits() ? dev : std::max({dev, host, 1.0 + 1e-9});
  };
  struct Point {
    int64_t T = 0;
    double f = 0;
  };
  const Clock::time_point t0 = Clock::now();
  int points = 0;
  int64_t best_T = 0;
  Result best;  // the plan of the largest context that fitted so far (the reach's, at the end)
  auto eval = [&](int64_t T, Point& p) {
    in.context = T;
    ++points;
    Result r = plan_step(in);
    p = {T, fill(r)};
    if (progress) progress(T, r.fits(), r.seconds);
    const bool fits = r.fits();
    if (fits && T > best_T) {
      best_T = T;
      best = std::move(r);
    }
    return fits;
  };
  auto down = [&](double T) { return std::max<int64_t>(g, static_cast<int64_t>(T) / g * g); };
  Point lo, lo_prev, hi;  // lo fits (T 0: nothing known), hi does not (T 0: nothing known)
  Point p;
  const int64_t first = g * ((1024 + g - 1) / g);
  if (first > cap) return {};  // nothing searched
  if (eval(first, p)) {
    lo = p;
  } else {
    hi = p;
  }
  // Extrapolate up to a point that does not fit (or the cap).
  while (hi.T == 0 && lo.T < cap) {
    int64_t next = 2 * lo.T;
    if (lo_prev.T > 0 && lo.f > lo_prev.f) {
      const double slope = (lo.f - lo_prev.f) / static_cast<double>(lo.T - lo_prev.T);
      // Aim a little past the line's crossing, so that the point usually does not fit and brackets.
      next = down(static_cast<double>(lo.T) + 1.02 * (1.0 - lo.f) / slope) + g;
      next = std::clamp<int64_t>(next, lo.T + g, 64 * lo.T);
    }
    next = std::min(next, cap / g * g);
    if (next <= lo.T) break;
    lo_prev = lo;
    (eval(next, p) ? lo : hi) = p;
  }
  Reach out;
  if (hi.T == 0) {
    out.capped = true;
  } else {
    double flo = lo.f, fhi = hi.f;  // the ends' values as the Illinois rule weighs them
    int last_side = 0;              // +1: lo moved last, -1: hi moved last
    while (hi.T - lo.T > g) {
      int64_t mid = lo.T + (hi.T - lo.T) / g / 2 * g;  // bisection when nothing fits yet
      if (lo.T > 0 && fhi > flo) {
        const double t = static_cast<double>(lo.T) + (1.0 - flo) / (fhi - flo) * static_cast<double>(hi.T - lo.T);
        mid = std::clamp<int64_t>(down(t), lo.T + g, hi.T - g);
      }
      const bool fits = eval(mid, p);
      if (fits) {
        lo = p;
        flo = p.f;
        if (last_side == 1) fhi = 1.0 + (fhi - 1.0) / 2;
      } else {
        hi = p;
        fhi = p.f;
        if (last_side == -1) flo = 1.0 - (1.0 - flo) / 2;
      }
      last_side = fits ? 1 : -1;
    }
  }
  out.max_context = lo.T;
  if (lo.T > 0) {
    FP_ASSERT(best_T == lo.T, "plan_reach: the reach {} is not the largest fitting point {}", lo.T, best_T);
    out.max_pow2 = 1;
    while (out.max_pow2 * 2 <= lo.T) out.max_pow2 *= 2;
    out.at_max = std::move(best);
  }
  out.points = points;
  out.seconds = seconds_since(t0);
  return out;
}

}  // namespace fp::plan
