// flatpeak plan against a real multi-process meta run (run under mpirun -np W; W = 1 runs too).
// For every case (model shape x schedules x routing x precision recipe), each MPI rank runs one
// training step as the trainer does (zero grads, step_forward_backward, the optimizer step) on its own meta
// backend with the MPI world as its comm, and compares its ledgers with plan::plan_step's run of the
// same step (W threads in this process, comm/thread_comm.h):
//   - every category's device peak, the step peak, every host category's peak and the host total;
//   - on the cases marked `events`, the whole device and host timelines, event for event (alloc or
//     free, category, bytes, tensor name);
//   - the plan's rank is the one whose step peak is the largest over the MPI ranks (all_reduce_max).
// The two runs share the engine but nothing else: the thread world answers the host exchanges itself,
// MPI moves them; on both, the meta data channel moves no device buffer (comm/data_comm.h).
// Prints each failing check (case, rank, what differs); exits non-zero when any failed.
#include <cstdio>
#include <string>
#include <vector>

#include "../common/case_model.h"
#include "backend/backend.h"
#include "comm/comm.h"
#include "data/context_split.h"
#include "plan/plan.h"
#include "sched/optim/optimizer.h"
#include "step/step.h"

using namespace fp;

namespace {

int g_failures = 0, g_checks = 0;

#define PLAN_CHECK(cond, ...)                                                                       \
  do {                                                                                              \
    ++g_checks;                                                                                     \
    if (!(cond)) {                                                                                  \
      ++g_failures;                                                                                 \
      std::fprintf(stderr, "FAILED [rank %d] %s\n", comm.rank(), fmt::format(__VA_ARGS__).c_str()); \
    }                                                                                               \
  } while (0)

struct CaseShape {
  const char* name;
  int64_t L, H, nh, nkv, hd, E, k, I, V, B, T;
};

struct Case {
  CaseShape shape;
  std::vector<std::string> items;  // plan --schedule items (schedules, routing, precision)
  bool events = false;             // compare the timelines event for event
  uint64_t host_mem = kUnlimitedBytes;
  bool dp2 = false;  // 2 data-parallel replicas of W / 2 context-parallel ranks (Note [A device mesh]); W even
};


std::string event_str(const LedgerEvent& e) {
  return fmt::format("{} {} '{}' {} B", e.alloc ? "alloc" : "free", category_name(e.category), e.tag, e.bytes);
}

// The first event where two timelines part, or "" when they agree.
std::string timeline_diff(const std::vector<LedgerEvent>& real, const std::vector<LedgerEvent>& plan) {
  const size_t n = std::min(real.size(), plan.size());
  for (size_t i = 0; i < n; ++i) {
    const LedgerEvent &a = real[i], &b = plan[i];
    if (a.alloc != b.alloc || a.category != b.category || a.bytes != b.bytes || a.tag != b.tag)
      return fmt::format("event {}: mpirun {}, plan {}", i, event_str(a), event_str(b));
  }
  if (real.size() != plan.size()) return fmt::format("mpirun has {} events, plan {}", real.size(), plan.size());
  return "";
}

void case_run(Comm& comm, const Case& c) {
  const int W = comm.size(), r = comm.rank();
  plan::Input in;
  in.model = case_model(c.shape);
  in.context = c.shape.T;
  in.host_mem = c.host_mem;
  in.settings.layout.ranks = W;
  const int cp = c.dp2 ? W / 2 : W;
  in.settings.layout.cp = cp;
  plan::settings_apply(in.settings, fmt::format("batch={}", c.shape.B));
  plan::settings_apply(in.settings, "optim=device");
  for (const std::string& it : c.items) plan::settings_apply(in.settings, it);
  std::string label = std::string(c.shape.name) + (c.dp2 ? " dp2" : "");
  for (const std::string& it : c.items) label += " " + it;

  std::vector<plan::RankPlan> ranks;
  plan::PlanOptions opt;
  opt.events = c.events;
  opt.ranks = &ranks;
  const plan::Result p = plan::plan_step(in, opt);

  // The same step on this MPI rank, as the trainer runs it.

  std::unique_ptr<Backend> be = backend_create("meta", kUnlimitedBytes, c.host_mem);
  be->host_ledger().overcommit_set(true);
  // Alive until the ledgers are read (the plan reads them before its model goes).
  Model model(in.model, *be, in.settings.routing, p.sched, p.precision, W > 1 ? &comm : nullptr);
  if (W > 1) model.set_context_parallel(cp);
  std::unique_ptr<Optimizer> optim;
  {
    model.init_weights(in.model.seed);
    optim = optimizer_create(OptimConfig{}, p.sched.optim, model.params(), *be);
    model.zero_grads();
    Batch batch;
    batch.B = c.shape.B;
    batch.T = c.shape.T / cp;
    batch.tokens.assign(static_cast<size_t>(batch.B * batch.T), 0);
    batch.targets.assign(batch.tokens.size(), 0);
    if (cp > 1) batch.positions = context_positions(c.shape.T, r % cp, cp);
    step_forward_backward(model, batch);
    optim->step(1, 1);
    be->synchronize();
  }
  const Ledger& d = be->device_ledger();
  const Ledger& h = be->host_ledger();
  const plan::RankPlan& mine = ranks[static_cast<size_t>(r)];
  for (Category cat : kAllCategories) {
    const int i = static_cast<int>(cat);
    PLAN_CHECK(mine.peak[i] == d.peak(cat), "{}: device {} peak: mpirun {}, plan {}", label, category_name(cat),
               d.peak(cat), mine.peak[i]);
    PLAN_CHECK(mine.host_peak[i] == h.peak(cat), "{}: host {} peak: mpirun {}, plan {}", label, category_name(cat),
               h.peak(cat), mine.host_peak[i]);
  }
  PLAN_CHECK(mine.step_peak == d.total_peak(), "{}: step peak: mpirun {}, plan {}", label, d.total_peak(),
             mine.step_peak);
  PLAN_CHECK(mine.host_needed == h.total_peak(), "{}: host total: mpirun {}, plan {}", label, h.total_peak(),
             mine.host_needed);
  if (c.events) {
    // The plan keeps its timelines from its Model's construction on, like this run's.
    const std::string dd = timeline_diff(d.events(), mine.events), hd = timeline_diff(h.events(), mine.host_events);
    PLAN_CHECK(dd.empty(), "{}: device timeline: {}", label, dd);
    PLAN_CHECK(hd.empty(), "{}: host timeline: {}", label, hd);
    PLAN_CHECK(!d.events().empty(), "{}: the device timeline is empty", label);
  }
  // The plan describes the rank with the largest step peak of the real world.
  uint64_t top = d.total_peak();
  comm.all_reduce_max(&top, 1, DType::DType_I64);
  PLAN_CHECK(p.step_peak == top, "{}: plan's step peak {} (rank {}) is not the world's largest {}", label, p.step_peak,
             p.sizes.rank, top);
  PLAN_CHECK(p.exact(), "{}: a plan of the engine's own model must be exact", label);
}

}  // namespace

int main() {
  Comm& comm = comm_world();
  try {
    // E divisible by 8 and T by 2 x 8, so every shape runs on W = 1, 2, 4 and 8.
    const CaseShape tiny{"tiny", 2, 64, 4, 2, 16, 8, 2, 64, 256, 2, 256};
    const CaseShape gqa{"gqa-v1000", 3, 48, 6, 2, 8, 16, 4, 40, 1000, 1, 512};
    const CaseShape wide{"wide-vocab", 2, 32, 4, 1, 16, 8, 1, 24, 5003, 1, 160};
    std::vector<Case> cases;
    for (const char* recipe : {"precision.recipe=fp32", "precision.recipe=bf16"}) {
      auto add = [&](const CaseShape& s, std::vector<std::string> items, bool events = false,
                     uint64_t host = kUnlimitedBytes) {
        items.insert(items.begin(), recipe);
        cases.push_back({s, std::move(items), events, host});
      };
      add(tiny, {"baseline", "optim=device"}, true);
      add(tiny, {"flatpeak", "chunk_cap=16"}, true);
      add(tiny, {"flatpeak", "routing=hot:0.9:2", "chunk_cap=32", "membership=contiguous"}, true);
      add(gqa, {"dispatch=llep", "routing=hot:0.95:4", "min_tokens_per_gemm=8"});
      add(gqa, {"dispatch=standard", "routing=hot:0.8:4"});
      add(gqa, {"dispatch=pipelined_llep", "routing=hot:0.95:4", "chunk_cap=8", "max_chunks=4"});
      add(gqa, {"vocab=ring", "ring_mode=weights", "block_tokens=24"});
      add(wide, {"vocab=ring", "ring_mode=activations", "keep_strips=true", "block_tokens=40"});
      add(wide, {"vocab=ring", "ring_mode=weights", "keep_strips=true"});
      add(gqa, {"ckpt=sco"}, false, 1 << 20);
      add(gqa, {"ckpt=sco", "ckpt_host_budget=8KiB"});
      add(tiny, {"optim=offload_serial"});
      add(tiny, {"optim=offload_stream", "bucket_params=5000", "slots=3"}, true);
      add(tiny, {"optim=offload_stream", "update_on=host", "bucket_params=4096"});
    }
    if (comm.size() % 2 == 0) {  // the mesh: 2 replicas, baseline and flatpeak, event for event
      cases.push_back({tiny, {"precision.recipe=fp32", "baseline", "optim=device"}, true, kUnlimitedBytes, true});
      cases.push_back({tiny, {"precision.recipe=bf16", "flatpeak", "chunk_cap=16"}, true, kUnlimitedBytes, true});
    }
    for (const Case& c : cases) case_run(comm, c);
    int bad = g_failures;
    comm.all_reduce_sum(&bad, 1, DType::DType_I32);
    int checks = g_checks;
    comm.all_reduce_sum(&checks, 1, DType::DType_I32);
    if (comm.rank() == 0)
      std::printf("plan_case on %d rank(s), %zu cases: %d checks passed, %d failed\n", comm.size(), cases.size(),
                  checks - bad, bad);
    comm.barrier();
    return bad ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error [rank %d]: %s\n", comm.rank(), e.what());
    comm.abort(1);
  }
}
