// The [precision] table and the dtypes the engine allocates in (core/precision.h):
//   - the config: recipes, per-field overrides applied after the recipe, errors naming the key;
//   - a computing backend computes the fp32 and bf16 recipes and refuses any other mix by name, and a
//     bf16 cpu step tracks the fp32 one within bf16 tolerances;
//   (the engine in the bf16 recipe was checked event for event against the closed-form planner's
//   bf16 sequence before that planner was removed; tests/dist/plan_case.cpp now checks plan against
//   mpirun in both recipes)
//   - a bf16 meta step against an fp32 one: the same events, every activation-dtype tensor at half
//     its bytes, the others unchanged, so the checkpoints' peak halves exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "../common/case_model.h"
#include "../common/tiny_config.h"
#include "backend/backend.h"
#include "comm/comm.h"
#include "core/precision.h"
#include "data/context_split.h"
#include "data/random_batch.h"
#include "sched/optim/optimizer.h"
#include "step/step.h"
#include "train/run_config.h"

namespace fp {

namespace {


// The message and hint of the fp::Error fn throws ("" when it throws none).
template <class F>
std::pair<std::string, std::string> error_of(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return {e.what(), e.hint()};
  }
  return {"", ""};
}

bool has(const std::string& s, const std::string& frag) { return s.find(frag) != std::string::npos; }

}  // namespace

// ---- the config ---------------------------------------------------------------------------------

TEST(Precision, RecipesAndDescription) {
  const Precision f = precision_recipe("fp32");
  EXPECT_TRUE(precision_all_f32(f));
  EXPECT_TRUE(precision_all_f32(Precision{}));
  EXPECT_EQ(precision_describe(f), "fp32");
  const Precision b = precision_recipe("bf16");
  EXPECT_EQ(b.params, DType::DType_BF16);
  EXPECT_EQ(b.grads, DType::DType_BF16);
  EXPECT_EQ(b.activations, DType::DType_BF16);
  EXPECT_EQ(b.master, DType::DType_F32);
  EXPECT_EQ(b.moments, DType::DType_F32);
  EXPECT_EQ(b.logits, DType::DType_F32);
  EXPECT_EQ(b.router, DType::DType_F32);
  EXPECT_FALSE(precision_all_f32(b));
  EXPECT_EQ(precision_non_f32(b), "params=bf16 grads=bf16 activations=bf16");
  EXPECT_EQ(precision_describe(b),
            "bf16 (params bf16, grads bf16, activations bf16, master f32, moments f32, logits f32, router f32)");
  Precision o = b;
  precision_set(o, "logits", "bf16");
  EXPECT_TRUE(has(precision_describe(o), "bf16 with overrides"));
  EXPECT_TRUE(has(error_of([] { precision_recipe("fp8"); }).first, "precision.recipe = \"fp8\""));
}

TEST(Precision, ConfigTable) {
  const std::string t = tiny_text();
  EXPECT_TRUE(precision_all_f32(config_parse(t, "tiny.toml").precision));  // the default
  const RunConfig b = config_parse(t, "tiny.toml", {"precision.recipe=bf16"});
  EXPECT_EQ(b.precision.params, DType::DType_BF16);
  EXPECT_EQ(b.precision.master, DType::DType_F32);
  // Fields apply after the recipe, whatever the order they are given in.
  const RunConfig o = config_parse(t, "tiny.toml",
                                   {"precision.logits=bf16", "precision.recipe=bf16", "precision.params=f32"});
  EXPECT_EQ(o.precision.logits, DType::DType_BF16);
  EXPECT_EQ(o.precision.params, DType::DType_F32);
  EXPECT_EQ(o.precision.grads, DType::DType_BF16);
  const RunConfig f16 = config_parse(t, "t.toml", {"precision.activations=f16"});
  EXPECT_EQ(f16.precision.activations, DType::DType_F16);
  EXPECT_EQ(f16.precision.params, DType::DType_F32);
  // Errors name the file and the key.
  auto [m1, h1] = error_of([&] { config_parse(t, "t.toml", {"precision.weights=bf16"}); });
  EXPECT_TRUE(has(m1, "unknown key precision.weights")) << m1;
  EXPECT_TRUE(has(h1, "params")) << h1;
  auto [m2, h2] = error_of([&] { config_parse(t, "t.toml", {"precision.params=f8"}); });
  EXPECT_TRUE(has(m2, "t.toml") && has(m2, "precision.params = \"f8\"")) << m2;
  EXPECT_TRUE(has(h2, "bf16")) << h2;
  EXPECT_TRUE(has(error_of([&] { config_parse(t, "t.toml", {"precision.grads=i32"}); }).first,
                  "precision.grads = \"i32\""));
  EXPECT_TRUE(has(error_of([&] { config_parse(t, "t.toml", {"precision.recipe=mixed"}); }).first,
                  "precision.recipe = \"mixed\""));
  EXPECT_TRUE(has(error_of([&] { config_parse(t, "t.toml", {"precision.params=16"}); }).first,
                  "precision.params must be a string"));
}

// ---- a computing backend refuses non-f32 ---------------------------------------------------------

// Note [bf16 on a computing backend]: cpu computes the two recipes; the rest is refused by name
// before anything is allocated.
TEST(Precision, CpuComputesTheTwoRecipesAndRefusesTheRest) {
  const RunConfig c = config_parse(tiny_text(), "tiny.toml");
  auto cpu = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  Precision ms = precision_recipe("bf16");
  {
    Model m(c.model, *cpu, RoutingProfile{}, Schedules{}, ms);
    EXPECT_EQ(m.params().embed_tokens->w.dtype(), DType::DType_BF16);
    // The offloaded optimizers keep the f32 master on the host (Note [Offload with bf16 weights] in
    // sched/optim/offload.h): every schedule and placement takes the bf16 recipe.
    for (const auto kind : {OptimSchedule::Kind::Kind_offload_serial, OptimSchedule::Kind::Kind_offload_stream}) {
      for (const bool on_host : {false, true}) {
        OptimConfig oc;
        oc.sched.kind = kind;
        oc.sched.update_on_host = on_host;
        auto [msg, hint] = error_of([&] { auto o = optimizer_create(oc, m.params(), *cpu); });
        EXPECT_EQ(msg, "") << schedule_name(kind) << (on_host ? " on the host" : "");
      }
    }
  }
  EXPECT_EQ(cpu->device_ledger().total_current(), 0u);
  // A mix of fields other than the recipes: refused, naming the precision.
  ms = precision_recipe("bf16");
  precision_set(ms, "logits", "bf16");
  auto [msg2, hint2] = error_of([&] { Model m(c.model, *cpu, RoutingProfile{}, Schedules{}, ms); });
  EXPECT_TRUE(has(msg2, "logits bf16") && has(msg2, "cpu")) << msg2;
  EXPECT_TRUE(has(hint2, "use --device meta")) << hint2;
  EXPECT_EQ(cpu->device_ledger().total_current(), 0u);  // refused before anything was allocated
  ms = precision_recipe("fp32");
  precision_set(ms, "router", "f16");
  auto [msg3, hint3] = error_of([&] { Model m(c.model, *cpu, RoutingProfile{}, Schedules{}, ms); });
  EXPECT_TRUE(has(msg3, "router f16")) << msg3;
  // meta takes any precision, and steps through it (no kernel reads an f16 operand there)
  auto meta = backend_create("meta", kUnlimitedBytes, kUnlimitedBytes);
  precision_set(ms, "activations", "f16");
  Model m(c.model, *meta, routing_profile_parse("balanced"), Schedules{}, ms);
  EXPECT_EQ(m.params().precision().router, DType::DType_F16);
  step_forward_backward(m, batch_random(2, 64, c.model.vocab_size, 9));
  EXPECT_GT(meta->device_ledger().peak(Category::Category_activations), 0u);
  // fp32 on cpu is the default and still builds
  Model f(c.model, *cpu);
  EXPECT_TRUE(precision_all_f32(f.params().precision()));
}

// One bf16 step on cpu against the fp32 step from the same init (the bf16 weights are its rounding)
// and batch: the loss within 5e-3 relative and every parameter's gradient within 3e-2 of the fp32
// one's norm (the bf16 tolerances; bf16 keeps 8 significant bits, at most 2^-8 relative per
// rounding; measured here 0.9-2.7%). Routing by the balanced profile: with the router choosing, a token whose top-k
// flips between the precisions moves whole rows between experts (measured: 3 experts' gradients 15-20%
// apart), a property of MoE in bf16, not an error. Not a test that bf16 is right (the bf16 twin is
// that), a guard that no operand is misread: a bf16 buffer read as f32, or one left unwritten, is off
// by orders of magnitude.
TEST(Precision, Bf16StepTracksTheFp32Step) {
  const RunConfig c = config_parse(tiny_text(), "tiny.toml");
  auto run = [&](const char* recipe, std::vector<std::vector<float>>* grads) {
    auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
    Model m(c.model, *be, routing_profile_parse("balanced"), Schedules{}, precision_recipe(recipe));
    m.init_weights(c.model.seed);
    m.zero_grads();
    const StepOutputs out = step_forward_backward(m, batch_random(2, 64, c.model.vocab_size, 9));
    for (const Param& p : m.params().all()) {
      const Tensor& g = p.g;
      std::vector<float> host(static_cast<size_t>(g.numel()));
      if (g.dtype() == DType::DType_BF16) {
        std::vector<uint16_t> h(host.size());
        be->copy_to_host(h.data(), g.data(), g.bytes());
        for (size_t i = 0; i < h.size(); ++i) host[i] = bf16_to_float(h[i]);
      } else {
        be->copy_to_host(host.data(), g.data(), g.bytes());
      }
      grads->push_back(std::move(host));
    }
    return out.loss;
  };
  std::vector<std::vector<float>> gf, gb;
  const double lf = run("fp32", &gf), lb = run("bf16", &gb);
  EXPECT_NEAR(lb, lf, 5e-3 * std::abs(lf));
  ASSERT_EQ(gf.size(), gb.size());
  for (size_t k = 0; k < gf.size(); ++k) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < gf[k].size(); ++i) {
      diff += (static_cast<double>(gb[k][i]) - gf[k][i]) * (static_cast<double>(gb[k][i]) - gf[k][i]);
      norm += static_cast<double>(gf[k][i]) * gf[k][i];
    }
    if (norm == 0) continue;  // an expert no token reached
    EXPECT_LE(std::sqrt(diff), 3e-2 * std::sqrt(norm)) << "parameter " << k;
  }
}

// ---- PrecisionVsPlanner (transitional: while src/plan exists) -------------------------------------
// The approach of tests/dist/plan_case.cpp (the plan against a meta step), with the planner in its
// default dtypes instead of dtype=f32, and the engine in precision_recipe("bf16").

namespace {

struct Case {
  const char* name;
  int64_t L, H, nh, nkv, hd, E, k, I, V, B, T;
  double coef = 0.01;
  const char* routing = "balanced";
};

ModelConfig case_config(const Case& c) { return case_model(c, c.coef); }

template <class Ev>
size_t first_tagged(const std::vector<Ev>& ev, const std::string& tag) {
  for (size_t i = 0; i < ev.size(); ++i)
    if (ev[i].tag == tag) return i;
  return ev.size();
}

struct StepRun {
  std::unique_ptr<Backend> be;
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> opt;
};

// One training step on meta (zero grads, step_forward_backward, the optimizer step) in precision p, on
// rank comm->rank() of comm->size() (one rank when comm is null).
StepRun run_step(const Case& c, const Precision& p, Comm* comm) {
  const ModelConfig m = case_config(c);
  StepRun run;
  run.be = backend_create("meta", kUnlimitedBytes, kUnlimitedBytes);
  Schedules sched;  // the plain variants (model/schedules.h)
  run.model = std::make_unique<Model>(m, *run.be, routing_profile_parse(c.routing), sched, p, comm);
  Model& model = *run.model;
  model.init_weights(m.seed);
  run.opt = optimizer_create(OptimConfig{}, sched.optim, model.params(), *run.be);
  model.zero_grads();
  Batch batch = batch_random(c.B, c.T, c.V, 11);
  if (comm != nullptr) batch = context_slice(batch, comm->rank(), comm->size());
  step_forward_backward(model, batch);
  run.opt->step(1, 1);
  return run;
}

}  // namespace

// ---- bf16 against fp32 on meta ------------------------------------------------------------------

// The tags of the step's activations that stay f32 (or i32) in the bf16 recipe: statistics, ids and
// the router's tensors (Note [Which dtype each allocation gets] in core/precision.h).
const std::set<std::string> kActivationsKeptWide = {
    "input.tokens",   "input.targets",     "input.positions", "input.rope_inv_freq", "input.doc_start",
    "input.ring_pos", "attn.rstd1",        "attn.rstd_q",     "attn.rstd_k",         "attn.lse",
    "moe.rstd2",      "moe.router_logits", "moe.probs",       "moe.topk_idx",        "moe.topk_w",
    "moe.rows",       "moe.slot_pos",      "moe.dw",          "moe.drouter_logits",  "head.rstd"};

TEST(Precision, Bf16HalvesActivationsAndCheckpointsExactly) {
  const Case c = {"simple", 3, 64, 4, 2, 16, 8, 2, 64, 256, 2, 128};
  StepRun f = run_step(c, precision_recipe("fp32"), nullptr);
  StepRun b = run_step(c, precision_recipe("bf16"), nullptr);
  const std::vector<LedgerEvent>& ef = f.be->device_ledger().events();
  const std::vector<LedgerEvent>& eb = b.be->device_ledger().events();
  // The persistent state differs (bf16 adds a master copy per parameter); the step's events do not.
  const size_t sf = first_tagged(ef, "input.tokens"), sb = first_tagged(eb, "input.tokens");
  ASSERT_EQ(ef.size() - sf, eb.size() - sb);
  // Replaying fp32's events with the expected bytes gives bf16's peaks (the persistent state holds
  // no activation or checkpoint).
  std::map<Category, uint64_t> cur, peak;
  int halved = 0;
  for (size_t i = 0; i < ef.size() - sf; ++i) {
    const LedgerEvent &x = ef[sf + i], &y = eb[sb + i];
    ASSERT_EQ(x.tag, y.tag) << i;
    ASSERT_EQ(x.alloc, y.alloc) << i;
    ASSERT_EQ(x.category, y.category) << i;
    // I64: the routing sort's expert offsets (moe.expert_offsets, workspace), counts kept wide.
    EXPECT_TRUE(x.dtype == DType::DType_F32 || x.dtype == DType::DType_I32 || x.dtype == DType::DType_F64 ||
                x.dtype == DType::DType_I64)
        << x.tag;
    uint64_t want = x.bytes;
    const bool act = x.category == Category::Category_activations || x.category == Category::Category_checkpoints;
    if (act && !kActivationsKeptWide.count(x.tag)) {
      EXPECT_EQ(y.dtype, DType::DType_BF16) << x.tag;
      want = x.bytes / 2;
      ++halved;
    }
    if (!act) continue;
    EXPECT_EQ(y.bytes, want) << x.tag << " " << dtype_name(y.dtype);
    if (x.alloc) {
      cur[x.category] += want;
      peak[x.category] = std::max(peak[x.category], cur[x.category]);
    } else {
      cur[x.category] -= want;
    }
  }
  EXPECT_GT(halved, 50);
  const Ledger& lf = f.be->device_ledger();
  const Ledger& lb = b.be->device_ledger();
  EXPECT_EQ(lb.peak(kCkpt) * 2, lf.peak(kCkpt));  // checkpoints are all boundaries: exactly half
  EXPECT_EQ(lb.peak(kCkpt), peak[kCkpt]);
  EXPECT_EQ(lb.peak(kAct), peak[kAct]);
  EXPECT_LT(lb.peak(kAct), lf.peak(kAct));
  // params and grads halve; the optimizer adds the fp32 master copy beside m and v (12 B per
  // parameter instead of 8); the vocabulary stays (logits f32)
  const uint64_t P = static_cast<uint64_t>(case_config(c).param_count());
  EXPECT_EQ(lf.peak(Category::Category_params), 4 * P);
  EXPECT_EQ(lb.peak(Category::Category_params), 2 * P);
  EXPECT_EQ(lb.peak(Category::Category_grads), 2 * P);
  EXPECT_EQ(lf.peak(Category::Category_optimizer), 8 * P);
  EXPECT_EQ(lb.peak(Category::Category_optimizer), 12 * P);
  EXPECT_EQ(lb.peak(Category::Category_vocab), lf.peak(Category::Category_vocab));
}

}  // namespace fp
