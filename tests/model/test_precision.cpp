// The [precision] table and the dtypes the engine allocates in (core/precision.h):
//   - the config: recipes, per-field overrides applied after the recipe, errors naming the key;
//   - a computing backend refuses anything but fp32 (until bf16 compute lands), naming the fields;
//   - PrecisionVsPlanner (transitional, while src/plan exists): the engine in the bf16 recipe on meta
//     equals the planner in its default dtypes (bf16 weights, grads, activations; f32 master,
//     moments, logits, router) event for event, one rank and every rank of a W-rank thread world.
//     The planner's block_plan.cpp / step_plan.cpp are the specification of each allocation's dtype;
//     when the planner goes, these cases go with it (the engine's own dtype test below stays);
//   - a bf16 meta step against an fp32 one: the same events, every activation-dtype tensor at half
//     its bytes, the others unchanged, so the checkpoints' peak halves exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "backend/backend.h"
#include "comm/comm.h"
#include "core/precision.h"
#include "data/context_split.h"
#include "data/random_batch.h"
#include "model/model.h"
#include "plan/plan.h"
#include "plan/routing_counts.h"
#include "sched/optim/optimizer.h"
#include "train/run_config.h"
#include "../common/thread_world.h"

namespace fp {

namespace {

std::string tiny_text() {
  std::ifstream in(std::string(FLATPEAK_SOURCE_DIR) + "/configs/tiny.toml");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

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
  EXPECT_TRUE(precision_all_f32(config_parse(t, "tiny.toml").schedules.precision));  // the default
  const RunConfig b = config_parse(t, "tiny.toml", {"precision.recipe=bf16"});
  EXPECT_EQ(b.schedules.precision.params, DType::DType_BF16);
  EXPECT_EQ(b.schedules.precision.master, DType::DType_F32);
  // Fields apply after the recipe, whatever the order they are given in.
  const RunConfig o = config_parse(t, "tiny.toml",
                                   {"precision.logits=bf16", "precision.recipe=bf16", "precision.params=f32"});
  EXPECT_EQ(o.schedules.precision.logits, DType::DType_BF16);
  EXPECT_EQ(o.schedules.precision.params, DType::DType_F32);
  EXPECT_EQ(o.schedules.precision.grads, DType::DType_BF16);
  const RunConfig f16 = config_parse(t, "t.toml", {"precision.activations=f16"});
  EXPECT_EQ(f16.schedules.precision.activations, DType::DType_F16);
  EXPECT_EQ(f16.schedules.precision.params, DType::DType_F32);
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

TEST(Precision, CpuRefusesAnythingButFp32) {
  const RunConfig c = config_parse(tiny_text(), "tiny.toml");
  auto cpu = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  ModelSchedules ms;
  ms.precision = precision_recipe("bf16");
  auto [msg, hint] = error_of([&] { Model m(c.model, *cpu, RoutingProfile{}, ms); });
  EXPECT_TRUE(has(msg, "params=bf16 grads=bf16 activations=bf16")) << msg;
  EXPECT_TRUE(has(msg, "cpu")) << msg;
  EXPECT_EQ(hint,
            "bf16 compute is not implemented on the cpu backend yet; use --device meta to see bf16 peaks, or "
            "precision.recipe = \"fp32\"");
  EXPECT_EQ(cpu->device_ledger().total_current(), 0u);  // refused before anything was allocated
  // one field is enough, and only it is named
  ms.precision = precision_recipe("fp32");
  precision_set(ms.precision, "router", "f16");
  auto [msg2, hint2] = error_of([&] { Model m(c.model, *cpu, RoutingProfile{}, ms); });
  EXPECT_TRUE(has(msg2, "router=f16") && !has(msg2, "params=")) << msg2;
  // meta takes it
  auto meta = backend_create("meta", kUnlimitedBytes, kUnlimitedBytes);
  ms.precision = precision_recipe("bf16");
  Model m(c.model, *meta, routing_profile_parse("balanced"), ms);
  EXPECT_EQ(m.params().precision().params, DType::DType_BF16);
  EXPECT_EQ(m.params().embed_tokens->w.dtype(), DType::DType_BF16);
  // fp32 on cpu is the default and still builds
  Model f(c.model, *cpu);
  EXPECT_TRUE(precision_all_f32(f.params().precision()));
}

// ---- PrecisionVsPlanner (transitional: while src/plan exists) -------------------------------------
// The approach of tests/model/test_plan_vs_meta.cpp, with the planner in its default dtypes instead
// of dtype=f32, and the engine in precision_recipe("bf16").

namespace {

struct Case {
  const char* name;
  int64_t L, H, nh, nkv, hd, E, k, I, V, B, T;
  double coef = 0.01;
  const char* routing = "balanced";
};

struct Sched {
  const char* vocab = "full";
  int64_t block_tokens = 1024;
  const char* ring_mode = "auto";
  bool keep_strips = false;
  const char* ckpt = "device";
  uint64_t host_budget = kUnlimitedBytes;
  uint64_t host_mem = kUnlimitedBytes;
  const char* optim = "device";
  int64_t bucket_params = 1 << 20;
  int64_t slots = 2;
  const char* update_on = "device";
  const char* dispatch = "standard";
  double lambda = 1.3;
  int64_t min_tokens = 1024;
  int64_t chunk_cap = 1024;
  int64_t max_chunks = 128;
  bool strided = true;
  std::string str() const {
    return fmt::format("vocab={} block_tokens={} ring_mode={} keep_strips={} ckpt={} host_budget={} host_mem={} "
                       "optim={} bucket={} slots={} update_on={} dispatch={} lambda={} min_tokens={} chunk_cap={} "
                       "max_chunks={} strided={}",
                       vocab, block_tokens, ring_mode, keep_strips, ckpt, host_budget, host_mem, optim, bucket_params,
                       slots, update_on, dispatch, lambda, min_tokens, chunk_cap, max_chunks, strided);
  }
};

ModelConfig case_config(const Case& c) {
  ModelConfig m;
  m.hidden_size = c.H;
  m.num_hidden_layers = c.L;
  m.num_attention_heads = c.nh;
  m.num_key_value_heads = c.nkv;
  m.head_dim = c.hd;
  m.num_experts = c.E;
  m.num_experts_per_tok = c.k;
  m.moe_intermediate_size = c.I;
  m.vocab_size = c.V;
  m.router_aux_loss_coef = c.coef;
  m.seed = 5;
  return m;
}

// The planner's input: its default dtypes (no dtype= item).
plan::Input case_input(const Case& c, const Sched& sc) {
  plan::Input in;
  in.model = case_config(c);
  in.context = c.T;
  in.host_mem = sc.host_mem;
  for (const std::string& item :
       {fmt::format("batch={}", c.B), fmt::format("routing={}", c.routing), fmt::format("vocab={}", sc.vocab),
        fmt::format("block_tokens={}", sc.block_tokens), fmt::format("ring_mode={}", sc.ring_mode),
        fmt::format("keep_strips={}", sc.keep_strips), fmt::format("ckpt={}", sc.ckpt),
        fmt::format("optim={}", sc.optim), fmt::format("bucket_params={}", sc.bucket_params),
        fmt::format("slots={}", sc.slots), fmt::format("update_on={}", sc.update_on),
        fmt::format("dispatch={}", sc.dispatch), fmt::format("lambda={}", sc.lambda),
        fmt::format("min_tokens_per_gemm={}", sc.min_tokens), fmt::format("chunk_cap={}", sc.chunk_cap),
        fmt::format("max_chunks={}", sc.max_chunks),
        fmt::format("membership={}", sc.strided ? "strided" : "contiguous")})
    plan::settings_apply(in.settings, item);
  in.settings.sched.ckpt_host_budget = sc.host_budget;
  return in;
}

template <class Ev>
size_t first_tagged(const std::vector<Ev>& ev, const std::string& tag) {
  for (size_t i = 0; i < ev.size(); ++i)
    if (ev[i].tag == tag) return i;
  return ev.size();
}

// Where the step's event sequences part (persistent state is aggregated in the plan).
std::string first_difference(const std::vector<LedgerEvent>& real, const std::vector<plan::PeakReplay::Event>& pl) {
  size_t i = first_tagged(real, "input.tokens"), j = first_tagged(pl, "input.tokens");
  for (; i < real.size() && j < pl.size(); ++i, ++j) {
    const LedgerEvent& a = real[i];
    const plan::PeakReplay::Event& b = pl[j];
    if (a.alloc != b.alloc || a.category != b.category || a.bytes != b.bytes)
      return fmt::format("event {}: engine {} {} '{}' {} {} B in {}, plan {} '{}' {} B in {}", i,
                         a.alloc ? "alloc" : "free", a.tag, a.shape.str(), dtype_name(a.dtype), a.bytes,
                         category_name(a.category), b.alloc ? "alloc" : "free", b.tag, b.bytes,
                         category_name(b.category));
  }
  if (i != real.size() || j != pl.size())
    return fmt::format("lengths differ: engine has {} more events, plan {} more", real.size() - i, pl.size() - j);
  return "the sequences agree";
}

ModelSchedules model_schedules(const Sched& sc) {
  ModelSchedules ms;
  ms.vocab.kind = std::string(sc.vocab) == "ring" ? VocabSchedule::Kind::Kind_ring : VocabSchedule::Kind::Kind_full;
  ms.vocab.block_tokens = sc.block_tokens;
  ms.vocab.ring_mode = sc.ring_mode;
  ms.vocab.keep_strips = sc.keep_strips;
  ms.ckpt.kind = std::string(sc.ckpt) == "sco" ? CkptSchedule::Kind::Kind_sco : CkptSchedule::Kind::Kind_device;
  ms.ckpt.host_budget = sc.host_budget;
  DispatchSchedule& d = ms.dispatch;
  const std::string dn = sc.dispatch;
  d.kind = dn == "llep"             ? DispatchSchedule::Kind::Kind_llep
           : dn == "pipelined_llep" ? DispatchSchedule::Kind::Kind_pipelined_llep
                                    : DispatchSchedule::Kind::Kind_standard;
  d.lambda = sc.lambda;
  d.min_tokens_per_gemm = sc.min_tokens;
  d.chunk_cap = sc.chunk_cap;
  d.max_chunks = sc.max_chunks;
  d.strided = sc.strided;
  return ms;
}

struct StepRun {
  std::unique_ptr<Backend> be;
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> opt;
};

// One training step on meta (zero grads, forward_backward, the optimizer step) in precision p, on
// rank comm->rank() of comm->size() (one rank when comm is null).
StepRun run_step(const Case& c, const Sched& sc, const Precision& p, Comm* comm) {
  const ModelConfig m = case_config(c);
  StepRun run;
  run.be = backend_create("meta", kUnlimitedBytes, sc.host_mem);
  ModelSchedules ms = model_schedules(sc);
  ms.precision = p;
  run.model = std::make_unique<Model>(m, *run.be, routing_profile_parse(c.routing), ms, comm);
  Model& model = *run.model;
  model.init_weights(m.seed);
  OptimConfig oc;
  oc.schedule = sc.optim;
  oc.bucket_params = sc.bucket_params;
  oc.slots = sc.slots;
  oc.update_on = sc.update_on;
  run.opt = optimizer_create(oc, model.params(), *run.be);
  model.zero_grads();
  Batch batch = batch_random(c.B, c.T, c.V, 11);
  if (comm != nullptr) batch = context_slice(batch, comm->rank(), comm->size());
  model.forward_backward(batch);
  run.opt->step(1, 1);
  return run;
}

// The plan of `rank` (planner_picks: let the planner choose, and expect this rank) against the
// ledgers of that rank's meta backend.
void compare(const Case& c, const Sched& sc, int world, int rank, Backend& be, bool planner_picks) {
  const Ledger& led = be.device_ledger();
  plan::PeakReplay dev(/*record_events=*/true), host;
  plan::Input in = case_input(c, sc);
  in.settings.layout.ranks = world;
  in.settings.layout.rank = planner_picks ? -1 : rank;
  for (const std::string& item : {fmt::format("cp={}", world), fmt::format("ep={}", world),
                                  fmt::format("fsdp={}", world)})
    plan::settings_apply(in.settings, item);
  ASSERT_EQ(in.settings.dtypes.weights, DType::DType_BF16);  // the planner's defaults
  const plan::Result r = plan::plan_step(in, &dev, &host);
  EXPECT_EQ(r.sizes.rank, rank);
  bool all_equal = true;
  for (Category cat : kAllCategories) {
    EXPECT_EQ(r.peak[static_cast<int>(cat)], led.peak(cat)) << category_name(cat);
    all_equal = all_equal && r.peak[static_cast<int>(cat)] == led.peak(cat);
  }
  EXPECT_EQ(r.step_peak, led.total_peak());
  all_equal = all_equal && r.step_peak == led.total_peak();
  EXPECT_EQ(r.host_needed, be.host_ledger().total_peak());
  for (Category cat : kAllCategories)
    EXPECT_EQ(r.host_peak[static_cast<int>(cat)], be.host_ledger().peak(cat)) << "host " << category_name(cat);
  if (!all_equal) ADD_FAILURE() << first_difference(led.events(), dev.events());
  EXPECT_EQ(first_difference(led.events(), dev.events()), "the sequences agree");
}

// One rank.
void check_one(const Case& c, const Sched& sc = {}) {
  SCOPED_TRACE(fmt::format("{} on meta in bf16, {}, one rank", c.name, sc.str()));
  StepRun run = run_step(c, sc, precision_recipe("bf16"), nullptr);
  compare(c, sc, 1, 0, *run.be, /*planner_picks=*/true);
}

// Every rank of a W-rank thread world, and the planner's pick is the rank with the largest peak.
void check_world(const Case& c, const Sched& sc, int world) {
  SCOPED_TRACE(fmt::format("{} on meta in bf16, {}, W = {}, every rank", c.name, sc.str(), world));
  std::vector<StepRun> runs(static_cast<size_t>(world));
  test::ThreadWorld(world).run(
      [&](Comm& comm) { runs[comm.rank()] = run_step(c, sc, precision_recipe("bf16"), &comm); });
  auto key = [&](int r) {
    const Ledger& led = runs[r].be->device_ledger();
    uint64_t sum = 0;
    for (Category cat : kAllCategories) sum += led.peak(cat);
    return std::pair<uint64_t, uint64_t>{led.total_peak(), sum};
  };
  int top = 0;
  for (int r = 0; r < world; ++r) {
    compare(c, sc, world, r, *runs[r].be, false);
    if (key(r) > key(top)) top = r;
  }
  compare(c, sc, world, top, *runs[top].be, /*planner_picks=*/true);
}

const Case kCases[] = {
    {"tiny", 2, 64, 4, 2, 16, 8, 2, 64, 256, 4, 256},
    {"one_layer", 1, 32, 2, 1, 16, 4, 1, 16, 100, 1, 17},
    {"mqa", 2, 96, 8, 1, 12, 16, 4, 40, 1000, 1, 129},
    {"deep", 12, 32, 4, 2, 8, 8, 2, 32, 200, 2, 64},
    {"no_aux_loss", 2, 64, 4, 2, 16, 8, 2, 64, 256, 2, 100, 0.0},
    {"hot_routing", 2, 64, 4, 2, 16, 16, 2, 64, 256, 2, 100, 0.01, "hot:0.9:4"},
    {"odd_everything", 5, 37, 3, 1, 14, 7, 3, 29, 997, 3, 71},
    {"vocab_heavy", 2, 32, 4, 2, 8, 8, 2, 16, 32000, 1, 512},
    {"qwen3_30b_like", 4, 2048, 32, 4, 128, 128, 8, 768, 151936, 1, 4096},
};

const Case& case_named(const std::string& name) {
  for (const Case& c : kCases)
    if (name == c.name) return c;
  throw std::runtime_error("no case " + name);
}

}  // namespace

TEST(PrecisionVsPlanner, OneRankPlainSchedules) {
  for (const Case& c : kCases) check_one(c);
}

TEST(PrecisionVsPlanner, OneRankFlattenedSchedules) {
  const std::vector<std::string> models = {"tiny", "mqa", "deep", "odd_everything", "vocab_heavy"};
  const std::vector<std::string> small = {"one_layer"};
  const std::vector<std::pair<Sched, std::vector<std::string>>> runs = {
      {{.vocab = "ring"}, models},
      {{.vocab = "ring", .block_tokens = 7}, models},
      {{.ckpt = "sco"}, models},
      {{.optim = "offload_serial"}, models},
      {{.optim = "offload_stream"}, models},
      {{.optim = "offload_stream", .bucket_params = 37, .slots = 1, .update_on = "host"}, small},
      {{.vocab = "ring", .block_tokens = 64, .ckpt = "sco", .optim = "offload_stream"}, models},
  };
  for (const auto& [sc, names] : runs)
    for (const std::string& name : names) check_one(case_named(name), sc);
  // SCO with a budget or a host arena that holds only some bf16 boundaries
  const Case& d = case_named("deep");
  const uint64_t boundary = static_cast<uint64_t>(d.B * d.T * d.H) * 2;
  check_one(d, {.ckpt = "sco", .host_budget = 5 * boundary + 3});
  check_one(d, {.ckpt = "sco", .host_mem = 3 * boundary});
}

TEST(PrecisionVsPlanner, EveryRankOfAThreadWorld) {
  const Case hot = {"hot_dispatch", 2, 32, 4, 2, 8, 16, 2, 24, 200, 1, 512, 0.01, "hot:0.9:2"};
  const Case bal = {"balanced_dispatch", 2, 32, 4, 2, 8, 8, 2, 24, 128, 1, 256};
  const Case uneven = {"uneven_ranks", 2, 34, 5, 1, 6, 8, 3, 24, 203, 1, 80};
  for (int world : {2, 4})
    for (const Case& c : {hot, bal}) {
      check_world(c, {.dispatch = "standard"}, world);
      check_world(c, {.dispatch = "llep", .min_tokens = 8}, world);
      check_world(c, {.dispatch = "llep", .lambda = 1.0, .min_tokens = 1}, world);
      check_world(c, {.dispatch = "pipelined_llep", .min_tokens = 8, .chunk_cap = 16}, world);
      check_world(c, {.dispatch = "pipelined_llep", .min_tokens = 8, .chunk_cap = 7, .max_chunks = 3,
                      .strided = false}, world);
    }
  // Ring-DTP over W shards in both modes, with and without kept strips (shards and batches in flight)
  for (int world : {2, 4})
    for (const char* mode : {"weights", "activations"})
      for (bool keep : {false, true})
        check_world(uneven, {.vocab = "ring", .block_tokens = 16, .ring_mode = mode, .keep_strips = keep}, world);
  // everything flattened at once
  check_world(hot, {.vocab = "ring", .block_tokens = 64, .ckpt = "sco", .optim = "offload_stream",
                    .dispatch = "pipelined_llep", .min_tokens = 8, .chunk_cap = 32}, 4);
  check_world(bal, {.optim = "offload_serial", .dispatch = "llep", .lambda = 1.0, .min_tokens = 1}, 2);
}

// ---- bf16 against fp32 on meta ------------------------------------------------------------------

// The tags of the step's activations that stay f32 (or i32) in the bf16 recipe: statistics, ids and
// the router's tensors (Note [Which dtype each allocation gets] in core/precision.h).
const std::set<std::string> kActivationsKeptWide = {
    "input.tokens", "input.targets", "input.positions", "attn.rstd1", "attn.rstd_q", "attn.rstd_k", "attn.lse",
    "moe.rstd2", "moe.router_logits", "moe.probs", "moe.topk_idx", "moe.topk_w", "moe.rows", "moe.slot_pos",
    "moe.dw", "moe.drouter_logits", "head.rstd"};

TEST(Precision, Bf16HalvesActivationsAndCheckpointsExactly) {
  const Case c = {"simple", 3, 64, 4, 2, 16, 8, 2, 64, 256, 2, 128};
  StepRun f = run_step(c, {}, precision_recipe("fp32"), nullptr);
  StepRun b = run_step(c, {}, precision_recipe("bf16"), nullptr);
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
    EXPECT_TRUE(x.dtype == DType::DType_F32 || x.dtype == DType::DType_I32 || x.dtype == DType::DType_F64) << x.tag;
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
  const Category kAct = Category::Category_activations, kCkpt = Category::Category_checkpoints;
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
