// Ring-DTP on W ranks (sched/vocab/ring_dtp_ring.cpp) against the full vocabulary head of one process
// on the same global batch. Run under mpirun -np W (W = 1 runs too: the one-rank path).
//
//   head:  for every case, ring mode (weights, activations, auto) and keep_strips off/on: the loss
//          (summed over ranks), every rank's d x_L rows, d model.norm (summed over ranks) and its
//          vocabulary shard's rows of d lm_head within the error model's bound of the head in double
//          (tests/common/head_bound.h: derived from the sums, so it holds on every BLAS kernel set),
//          and within twice it of the full head of one process; lm_head's other rows untouched (bitwise);
//          two runs bitwise equal; the vocab and comm peaks the planned working set, meta's
//          allocations cpu's. Cases: odd token counts, ranks with different counts, V not
//          divisible by W, the sub-block or the strip height, a shard with no id at all (V < W Vp),
//          ignored targets (-100), a target in every shard.
//   model: 10 AdamW steps of a small MoE model, ring (both modes) vs full on the same W ranks:
//          losses within 1e-5 relative.
//
// Every rank computes the full head of the whole global batch itself (small sizes), so nothing but
// the verdicts is exchanged. Exits non-zero on the first failing check, naming it (rank, index,
// expected, got).
// Legend: W ranks, ns (W) tokens of each rank, N their sum, H hidden, V vocabulary.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../common/error_bound.h"
#include "../common/head_bound.h"
#include "../common/vocab_head_case.h"
#include "backend/backend.h"
#include "comm/comm.h"
#include "core/rng.h"
#include "core/units.h"
#include "data/context_split.h"
#include "data/random_batch.h"
#include "sched/optim/adamw.h"
#include "sched/vocab/ring_dtp.h"
#include "sched/vocab/vocab_head.h"
#include "step/step.h"

using namespace fp;

namespace {

using head_test::head_config;
using head_test::head_reference;
using head_test::HeadReference;
using head_test::same_bits;

int g_failures = 0;

void fail(Comm& comm, const std::string& what) {
  std::fprintf(stderr, "FAILED [rank %d]: %s\n", comm.rank(), what.c_str());
  ++g_failures;
}

struct Case {
  const char* name;
  int64_t n, n_step;  // rank r holds n + r n_step tokens
  int64_t H, V, block_tokens;
};

// The global inputs, the same on every rank: x (N, H) ~ N(0, 1), norm ~ 1 + N(0, 0.1), lm_head
// ~ N(0, 0.5) (logits of a few units), lm_head's g starts at g0 ~ N(0, 0.01) (the head accumulates),
// targets uniform with every fourth ignored, and one target in every non-empty shard.
struct Inputs {
  std::vector<int64_t> ns, off;  // (W) tokens of each rank and the first of them
  int64_t N = 0;
  std::vector<float> x, norm_w, W, g0;  // (N, H), (H), (V, H), (V, H)
  std::vector<int32_t> targets;         // (N)
  int64_t count = 0;                    // targets not ignored
};

Inputs inputs_make(const Case& c, int world) {
  Inputs in;
  for (int r = 0; r < world; ++r) {
    in.off.push_back(in.N);
    in.ns.push_back(c.n + r * c.n_step);
    in.N += in.ns.back();
  }
  Rng rng(11);
  in.x.resize(in.N * c.H);
  in.norm_w.resize(c.H);
  in.W.resize(c.V * c.H);
  in.g0.resize(c.V * c.H);
  for (float& v : in.x) v = static_cast<float>(rng.normal());
  for (float& v : in.norm_w) v = static_cast<float>(1.0 + 0.1 * rng.normal());
  for (float& v : in.W) v = static_cast<float>(0.5 * rng.normal());
  for (float& v : in.g0) v = static_cast<float>(0.01 * rng.normal());
  in.targets.resize(in.N);
  for (int64_t t = 0; t < in.N; ++t)
    in.targets[t] = t % 4 == 0 ? -100 : static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.V)));
  for (int s = 0; s < world; ++s) {
    const VocabShard sh = ring_dtp_shard(c.V, world, s);
    if (sh.rows > 0) in.targets[(4 * s + 1) % in.N] = static_cast<int32_t>(sh.v0 + (s % sh.rows));
  }
  for (const int32_t t : in.targets) in.count += t != -100;
  return in;
}

struct HeadOut {
  double loss_sum = 0;
  std::vector<float> dx, dnorm, dW;  // (n, H), (H), (V, H) the whole of lm_head's g
  uint64_t vocab_peak = 0, comm_peak = 0;
  std::vector<LedgerEvent> events;  // the device ledger's, from the head call
};

// One head call on tokens [t0, t0 + n) of the global batch, on comm's ranks; on meta only the
// allocations happen (nothing is read back).
HeadOut head_run(const Case& c, const Inputs& in, Comm& comm, int64_t t0, int64_t n, const VocabSchedule& v,
                 const char* device = "cpu") {
  auto be = backend_create(device, kUnlimitedBytes, kUnlimitedBytes);
  const ModelConfig cfg = head_config(c.H, c.V);
  ParamStore ps(cfg, *be);
  be->copy_from_host(ps.norm->w.data(), in.norm_w.data(), ps.norm->w.bytes());
  be->copy_from_host(ps.lm_head->w.data(), in.W.data(), ps.lm_head->w.bytes());
  be->copy_from_host(ps.lm_head->g.data(), in.g0.data(), ps.lm_head->g.bytes());
  be->kernels().fill(ps.norm->g.f32(), 0.0f, c.H);
  StepContext s(*be, cfg, RoutingProfile{}, comm);
  s.B = 1;
  s.T = n;
  s.n = n;
  Tensor xL = be->alloc_f32(Category::Category_activations, {n, c.H}, "xL");
  be->copy_from_host(xL.data(), in.x.data() + t0 * c.H, xL.bytes());
  Tensor targets = be->alloc(Category::Category_activations, {n}, DType::DType_I32, "targets");
  be->copy_from_host(targets.data(), in.targets.data() + t0, targets.bytes());
  Tensor dx = be->alloc_f32(Category::Category_activations, {n, c.H}, "dx");
  HeadOut o;
  be->device_ledger().peaks_reset();
  const size_t first_event = be->device_ledger().events().size();
  o.loss_sum = head_loss_sum(
      *be, head_forward_backward(s, v, ps, xL, targets, 1.0f / static_cast<float>(in.count), dx, nullptr, true));
  o.vocab_peak = be->device_ledger().peak(Category::Category_vocab);
  o.comm_peak = be->device_ledger().peak(Category::Category_comm);
  const std::vector<LedgerEvent>& ev = be->device_ledger().events();
  o.events.assign(ev.begin() + static_cast<std::ptrdiff_t>(first_event), ev.end());
  if (!be->computes()) return o;
  o.dx.resize(n * c.H);
  o.dnorm.resize(c.H);
  o.dW.resize(c.V * c.H);
  be->copy_to_host(o.dx.data(), dx.data(), dx.bytes());
  be->copy_to_host(o.dnorm.data(), ps.norm->g.data(), ps.norm->g.bytes());
  be->copy_to_host(o.dW.data(), ps.lm_head->g.data(), ps.lm_head->g.bytes());
  return o;
}

// got[i] vs want[i] for i in [0, count): |got - want| <= bound[i], the error model's bound
// (Note [Tolerances from an error model], tests/common/error_bound.h). Raises *worst to the largest
// |got - want| / bound seen.
template <class W>
void near(Comm& comm, const float* got, const W* want, const double* bound, int64_t count, const std::string& what,
          double* worst) {
  std::string why;
  if (!test_bound::within_bounds(got, want, bound, count, worst, &why)) fail(comm, what + " " + why);
}

void head_case(Comm& comm, const Case& c) {
  const int W = comm.size(), r = comm.rank();
  const Inputs in = inputs_make(c, W);
  std::unique_ptr<Comm> single = comm_single();
  VocabSchedule full;
  full.kind = VocabSchedule::Kind::Kind_full;
  const HeadOut ref = head_run(c, in, *single, 0, in.N, full);
  // The head in double, and how far from it any float evaluation may be: the full head on one process
  // and the ring on W ranks are each checked against it, and against each other within twice it.
  const HeadReference exact = head_reference(in.x, in.norm_w, in.W, in.targets, 1.0 / static_cast<double>(in.count), {},
                                             in.g0, head_config(c.H, c.V).rms_norm_eps, W, false);
  const VocabShard sh = ring_dtp_shard(c.V, W, r);
  const int64_t n = in.ns[r], t0 = in.off[r];
  double worst = 0;  // the largest error seen, as a fraction of its bound
  {
    const std::string where = std::string(c.name) + ", the full head on one process";
    if (!(std::abs(ref.loss_sum - exact.loss_sum) <= exact.loss_bound)) fail(comm, where + ": loss sum off the bound");
    near(comm, ref.dx.data(), exact.dx.data(), exact.dx_bound.data(), in.N * c.H, where + ": d x_L", &worst);
    near(comm, ref.dnorm.data(), exact.dnorm.data(), exact.dnorm_bound.data(), c.H, where + ": d model.norm", &worst);
    near(comm, ref.dW.data(), exact.dW.data(), exact.dW_bound.data(), c.V * c.H, where + ": d lm_head", &worst);
  }
  std::vector<double> twice(exact.dx_bound.size() + exact.dnorm_bound.size() + exact.dW_bound.size());
  const double* dx2 = twice.data();
  const double* dn2 = dx2 + exact.dx_bound.size();
  const double* dW2 = dn2 + exact.dnorm_bound.size();
  {
    size_t i = 0;
    for (const auto* b : {&exact.dx_bound, &exact.dnorm_bound, &exact.dW_bound})
      for (const double v : *b) twice[i++] = 2 * v;
  }

  for (const char* mode : {"weights", "activations", "auto"})
    for (const bool keep : {false, true}) {
      VocabSchedule v;
      v.kind = VocabSchedule::Kind::Kind_ring;
      v.block_tokens = c.block_tokens;
      v.ring_mode = mode;
      v.keep_strips = keep;
      const std::string where =
          std::string(c.name) + ", W=" + std::to_string(W) + ", mode " + mode + (keep ? ", keep_strips" : "");
      HeadOut o[2];
      for (HeadOut& h : o) h = head_run(c, in, comm, t0, n, v);
      double loss = o[0].loss_sum;
      comm.all_reduce_sum(&loss, 1, DType::DType_F64);
      const double loss_err = std::abs(loss - exact.loss_sum);
      if (!(loss_err <= exact.loss_bound && std::abs(loss - ref.loss_sum) <= 2 * exact.loss_bound))
        fail(comm, where + ": loss sum " + std::to_string(loss) + " vs exact " + std::to_string(exact.loss_sum) +
                       " and full " + std::to_string(ref.loss_sum) + ", bound " + std::to_string(exact.loss_bound));
      worst = std::max(worst, loss_err / exact.loss_bound);
      const float* dx = o[0].dx.data();
      near(comm, dx, exact.dx.data() + t0 * c.H, exact.dx_bound.data() + t0 * c.H, n * c.H, where + ": d x_L", &worst);
      near(comm, dx, ref.dx.data() + t0 * c.H, dx2 + t0 * c.H, n * c.H, where + ": d x_L against the full head",
           &worst);
      std::vector<float> dnorm = o[0].dnorm;
      comm.all_reduce_sum(dnorm.data(), c.H, DType::DType_F32);
      near(comm, dnorm.data(), exact.dnorm.data(), exact.dnorm_bound.data(), c.H,
           where + ": d model.norm (summed over ranks)", &worst);
      near(comm, dnorm.data(), ref.dnorm.data(), dn2, c.H, where + ": d model.norm against the full head", &worst);
      const int64_t w0 = sh.v0 * c.H, wn = sh.rows * c.H;
      near(comm, o[0].dW.data() + w0, exact.dW.data() + w0, exact.dW_bound.data() + w0, wn,
           where + ": d lm_head, this rank's shard", &worst);
      near(comm, o[0].dW.data() + w0, ref.dW.data() + w0, dW2 + w0, wn, where + ": d lm_head against the full head",
           &worst);
      // Rows outside the shard: untouched (the sum over ranks is then the whole gradient).
      for (int64_t i = 0; i < c.V * c.H; ++i) {
        const bool mine = i >= sh.v0 * c.H && i < (sh.v0 + sh.rows) * c.H;
        if (!mine && std::memcmp(&o[0].dW[i], &in.g0[i], sizeof(float)) != 0) {
          fail(comm, where + ": lm_head's g changed outside this rank's shard at " + std::to_string(i));
          break;
        }
      }
      if (std::memcmp(&o[0].loss_sum, &o[1].loss_sum, sizeof(double)) != 0 || !same_bits(o[0].dx, o[1].dx) ||
          !same_bits(o[0].dnorm, o[1].dnorm) || !same_bits(o[0].dW, o[1].dW))
        fail(comm, where + ": two runs differ");
      if (W == 1) continue;
      // The working set is what ring_dtp_working_set says, reserved from block_tokens, V / W, H and
      // the token counts (sched/vocab/ring_dtp.h), and meta allocates exactly as cpu.
      const RingDtpWorkingSet ws = ring_dtp_working_set(
          v, ring_dtp_mode(v, *std::max_element(in.ns.begin(), in.ns.end()), c.V, W), r, in.ns, c.V, c.H, true);
      if (o[0].vocab_peak != ws.vocab_bytes || o[0].comm_peak != ws.comm_bytes)
        fail(comm, where + ": vocab / comm peaks " + std::to_string(o[0].vocab_peak) + " / " +
                       std::to_string(o[0].comm_peak) + ", planned " + std::to_string(ws.vocab_bytes) + " / " +
                       std::to_string(ws.comm_bytes));
      const HeadOut meta = head_run(c, in, comm, t0, n, v, "meta");
      bool same = meta.events.size() == o[0].events.size();
      for (size_t i = 0; same && i < meta.events.size(); ++i)
        same = meta.events[i].alloc == o[0].events[i].alloc && meta.events[i].tag == o[0].events[i].tag &&
               meta.events[i].bytes == o[0].events[i].bytes && meta.events[i].category == o[0].events[i].category;
      if (!same) fail(comm, where + ": meta allocates otherwise than cpu");
    }
  comm.all_reduce_max(&worst, 1, DType::DType_F64);
  if (r == 0 && g_failures == 0)
    std::printf(
        "head: %s (W=%d): 3 modes x keep_strips off/on: loss, dx, dnorm, dW within the error "
        "model's bound of the exact head (largest error %.2f of it), bitwise repeatable\n",
        c.name, W, worst);
}

// 10 AdamW steps of a small model on comm's ranks with the given vocabulary schedule.
std::vector<double> train_losses(Comm& comm, const VocabSchedule& v) {
  ModelConfig m = head_config(32, 97);
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.num_experts = 8;
  m.num_experts_per_tok = 2;
  m.moe_intermediate_size = 24;
  m.router_aux_loss_coef = 0.02;
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  Schedules sched;
  sched.vocab = v;
  Model model(m, *be, RoutingProfile{}, sched, Precision{}, &comm);
  // On W > 1 ranks lm_head is FSDP-sharded by rows: the ring reads and writes its shard alone.
  if (comm.size() > 1 && model.params().lm_head->placement != Placement::Placement_rows)
    fail(comm, "the model's lm_head is not row-sharded: the ring's FSDP path is not tested");
  model.init_weights(5);
  OptimConfig oc;
  oc.warmup_steps = 2;
  AdamW opt(model.params(), *be, oc);
  const Batch global = batch_random(2, 40, m.vocab_size, 100);
  const Batch local = context_slice(global, comm.rank(), comm.size());
  std::vector<double> losses;
  const int64_t steps = 10;
  for (int64_t s = 1; s <= steps; ++s) {
    model.zero_grads();
    losses.push_back(step_forward_backward(model, local).loss);
    opt.step(s, steps);
  }
  return losses;
}

void model_case(Comm& comm) {
  VocabSchedule full;
  const std::vector<double> ref = train_losses(comm, full);
  for (const char* mode : {"weights", "activations"}) {
    VocabSchedule v;
    v.kind = VocabSchedule::Kind::Kind_ring;
    v.block_tokens = 7;
    v.ring_mode = mode;
    const std::vector<double> got = train_losses(comm, v);
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(got[i] - ref[i]) / std::abs(ref[i]));
    if (!(worst <= 1e-5))
      fail(comm, "training, ring " + std::string(mode) + ": losses differ by " + std::to_string(worst));
    if (comm.rank() == 0)
      std::printf("model: 10 steps on W=%d, ring (%s) vs full: losses within %.1e (first %.6f, last %.6f)\n",
                  comm.size(), mode, worst, ref.front(), ref.back());
  }
  if (!(ref.back() < ref.front() - 0.1)) fail(comm, "training does not train");
}

}  // namespace

int main() {
  Comm& comm = comm_world();
  try {
    const std::vector<Case> cases = {
        {"odd n, V not divisible by W or the strip", 37, 0, 24, 1001, 8},
        {"ranks with different n, V over two sub-blocks", 21, 6, 16, 16389, 16},
        {"V < W Vp: a shard with no id", 9, 0, 8, 5, 4},
        {"one strip (block_tokens > n)", 13, 0, 20, 257, 100},
    };
    for (const Case& c : cases) head_case(comm, c);
    model_case(comm);
    int bad = g_failures;
    comm.all_reduce_max(&bad, 1, DType::DType_I32);
    if (comm.rank() == 0) std::printf(bad ? "ring_dtp_case: FAILED\n" : "ring_dtp_case: all passed\n");
    comm.barrier();
    return bad ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error [rank %d]: %s\n", comm.rank(), e.what());
    comm.abort(1);
  }
}
