// The planner against the engine: for one rank with the plain schedules and every dtype f32 (what
// the engine allocates), plan_step's per-category peaks and step peak equal the ledger of a real
// training step (zero grads, forward_backward, AdamW step) on the meta backend, and on the cpu
// backend at small scale. On a mismatch the first allocation event that differs is printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "backend/backend.h"
#include "comm/comm.h"
#include "data/context_split.h"
#include "data/random_batch.h"
#include "model/model.h"
#include "plan/plan.h"
#include "plan/routing_counts.h"
#include "sched/optim/adamw.h"
#include "sched/optim/optimizer.h"
#include "../common/thread_world.h"

namespace fp {

namespace {

struct Case {
  const char* name;
  int64_t L, H, nh, nkv, hd, E, k, I, V, B, T;
  double coef = 0.01;              // router_aux_loss_coef (0: no aux-loss bias tensor)
  const char* routing = "balanced";
};

// The schedule of each family, as the engine and the planner name them.
struct Sched {
  const char* vocab = "full";          // full | ring
  int64_t block_tokens = 1024;         // ring
  const char* ring_mode = "auto";      // ring, W > 1: weights | activations | auto
  bool keep_strips = false;            // ring, W > 1
  const char* ckpt = "device";         // device | sco
  uint64_t host_budget = kUnlimitedBytes;  // sco
  uint64_t host_mem = kUnlimitedBytes;     // host arena capacity (sco places boundaries by it too)
  const char* optim = "device";        // device | offload_serial | offload_stream
  int64_t bucket_params = 1 << 20;     // offload_stream
  int64_t slots = 2;                   // offload_stream
  const char* update_on = "device";    // offload_stream
  const char* dispatch = "standard";   // W > 1: standard | llep | pipelined_llep
  double lambda = 1.3;                 // llep, pipelined_llep
  int64_t min_tokens = 1024;           // llep, pipelined_llep: min_tokens_per_gemm
  int64_t chunk_cap = 1024;            // pipelined_llep
  int64_t max_chunks = 128;            // pipelined_llep
  bool strided = true;                 // pipelined_llep
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

plan::Input case_input(const Case& c, const Sched& sc = {}) {
  plan::Input in;
  in.model = case_config(c);
  in.context = c.T;
  in.host_mem = sc.host_mem;
  for (const std::string& item :
       {std::string("dtype=f32"), fmt::format("batch={}", c.B), fmt::format("routing={}", c.routing),
        fmt::format("vocab={}", sc.vocab), fmt::format("block_tokens={}", sc.block_tokens),
        fmt::format("ring_mode={}", sc.ring_mode), fmt::format("keep_strips={}", sc.keep_strips),
        fmt::format("ckpt={}", sc.ckpt), fmt::format("optim={}", sc.optim),
        fmt::format("bucket_params={}", sc.bucket_params), fmt::format("slots={}", sc.slots),
        fmt::format("update_on={}", sc.update_on), fmt::format("dispatch={}", sc.dispatch),
        fmt::format("lambda={}", sc.lambda), fmt::format("min_tokens_per_gemm={}", sc.min_tokens),
        fmt::format("chunk_cap={}", sc.chunk_cap), fmt::format("max_chunks={}", sc.max_chunks),
        fmt::format("membership={}", sc.strided ? "strided" : "contiguous")})
    plan::settings_apply(in.settings, item);
  in.settings.sched.ckpt_host_budget = sc.host_budget;
  return in;
}

// The index of the first event with this tag (the step's first allocation), or the size.
template <class Ev>
size_t first_tagged(const std::vector<Ev>& ev, const std::string& tag) {
  for (size_t i = 0; i < ev.size(); ++i)
    if (ev[i].tag == tag) return i;
  return ev.size();
}

// Where the step's event sequences part (persistent state is aggregated in the plan, so the
// comparison starts at the step's first allocation).
std::string first_difference(const std::vector<LedgerEvent>& real, const std::vector<plan::PeakReplay::Event>& pl) {
  size_t i = first_tagged(real, "input.tokens"), j = first_tagged(pl, "input.tokens");
  for (; i < real.size() && j < pl.size(); ++i, ++j) {
    const LedgerEvent& a = real[i];
    const plan::PeakReplay::Event& b = pl[j];
    if (a.alloc != b.alloc || a.category != b.category || a.bytes != b.bytes)
      return fmt::format("event {}: engine {} {} '{}' {} B in {}, plan {} '{}' {} B in {}", i,
                         a.alloc ? "alloc" : "free", a.tag, a.shape.str(), a.bytes, category_name(a.category),
                         b.alloc ? "alloc" : "free", b.tag, b.bytes, category_name(b.category));
  }
  if (i != real.size() || j != pl.size())
    return fmt::format("lengths differ: engine has {} more events, plan {} more", real.size() - i, pl.size() - j);
  return "the sequences agree";
}

// Rank r of a world of W ranks that all route their tokens alike (the routing profiles depend on
// the token index only): with the meta backend (no data) a step allocates exactly what rank r of a
// real run allocates, since sizes never depend on the data and every rank's piece has N = B T / W
// tokens, so multi-rank plans are checked in one process. Device buffers (null on meta) move
// nothing; host buffers (the counts behind the sizes: EP's count exchange, LLEP's loads, Ring-DTP's
// token counts) get what the W identical ranks would send: in all_to_all_v every source sends what
// this rank sends itself, all_gather repeats this rank's block, the sums are W times this rank's.
class MetaWorldComm final : public Comm {
 public:
  MetaWorldComm(int world, int rank) : world_(world), rank_(rank) {}
  std::string_view name() const override { return "meta-world"; }
  int rank() const override { return rank_; }
  int size() const override { return world_; }
  void all_reduce_sum(void* data, int64_t n, DType t) override { scale(data, data, n, t); }
  void all_reduce_max(void*, int64_t, DType) override {}  // the max of W equal values
  void all_gather(const void* send, void* recv, int64_t n, DType t) override {
    if (send == nullptr || recv == nullptr) return;
    const size_t b = static_cast<size_t>(n) * dtype_size(t);
    for (int r = 0; r < world_; ++r) std::memmove(static_cast<char*>(recv) + r * b, send, b);
  }
  void reduce_scatter_sum(const void* send, void* recv, int64_t n, DType t) override {
    if (send == nullptr || recv == nullptr) return;
    scale(static_cast<const char*>(send) + static_cast<size_t>(rank_ * n) * dtype_size(t), recv, n, t);
  }
  void all_to_all_v(const void* send, const int64_t* send_counts, void* recv, const int64_t* recv_counts,
                    DType t) override {
    if (send == nullptr || recv == nullptr) return;
    const size_t b = dtype_size(t);
    int64_t self_off = 0, recv_off = 0;  // elements
    for (int d = 0; d < rank_; ++d) self_off += send_counts[d];
    for (int src = 0; src < world_; ++src) {
      const int64_t n = std::min(send_counts[rank_], recv_counts[src]);
      std::memmove(static_cast<char*>(recv) + recv_off * b, static_cast<const char*>(send) + self_off * b, n * b);
      recv_off += recv_counts[src];
    }
  }
  void send_recv(const void* send, int64_t n, int, void* recv, int64_t n_recv, int, DType t) override {
    if (send != nullptr && recv != nullptr) std::memmove(recv, send, std::min(n, n_recv) * dtype_size(t));
  }
  void barrier() override {}
  [[noreturn]] void abort(int) override { std::abort(); }

 private:
  // out (n) = W x in (n), host data of the integer and floating dtypes the engine reduces.
  void scale(const void* in, void* out, int64_t n, DType t) const {
    if (in == nullptr || out == nullptr) return;
    for (int64_t i = 0; i < n; ++i) {
      switch (t) {
        case DType::DType_F32: static_cast<float*>(out)[i] = static_cast<const float*>(in)[i] * world_; break;
        case DType::DType_F64: static_cast<double*>(out)[i] = static_cast<const double*>(in)[i] * world_; break;
        case DType::DType_I32: static_cast<int32_t*>(out)[i] = static_cast<const int32_t*>(in)[i] * world_; break;
        case DType::DType_I64: static_cast<int64_t*>(out)[i] = static_cast<const int64_t*>(in)[i] * world_; break;
        default: FP_ASSERT(false, "MetaWorldComm cannot sum dtype {}", static_cast<int>(t));
      }
    }
  }
  int world_, rank_;
};

// The rank the plan describes: the one that receives the most routes under standard EP (the first
// of equals); its step peak is the largest, or equal to the largest with larger category peaks.
int hottest_rank(const Case& c, int world) {
  if (world == 1) return 0;
  const int64_t N = c.B * c.T / world;
  const std::vector<int64_t> counts = plan::routing_counts(routing_profile_parse(c.routing), N, c.k, c.E);
  const int64_t per = c.E / world;
  int best = 0;
  int64_t best_sum = -1;
  for (int r = 0; r < world; ++r) {
    int64_t sum = 0;
    for (int64_t e = r * per; e < (r + 1) * per; ++e) sum += counts[e];
    if (sum > best_sum) {
      best = r;
      best_sum = sum;
    }
  }
  return best;
}

// The schedules of a Sched, as the engine names them.
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

// A step that has run, with its model and optimizer still alive (their state is on the ledgers).
struct StepRun {
  std::unique_ptr<Backend> be;
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> opt;
};

// One training step as the trainer runs it, on rank comm->rank() of comm->size() (one rank when
// comm is null): zero grads, forward_backward, the optimizer step.
StepRun run_step(const Case& c, const char* device, const Sched& sc, Comm* comm) {
  const ModelConfig m = case_config(c);
  StepRun run;
  run.be = backend_create(device, kUnlimitedBytes, sc.host_mem);
  run.model = std::make_unique<Model>(m, *run.be, routing_profile_parse(c.routing), model_schedules(sc), comm);
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

// The plan of rank `rank` against the ledgers of that rank's backend. planner_picks: plan without
// naming the rank, and expect the planner to pick this one.
void compare(const Case& c, const Sched& sc, int world, int rank, Backend& be, bool planner_picks = false) {
  const Ledger& led = be.device_ledger();
  plan::PeakReplay dev(/*record_events=*/true), host;
  plan::Input in = case_input(c, sc);
  in.settings.layout.ranks = world;
  in.settings.layout.rank = planner_picks ? -1 : rank;
  for (const std::string& item : {fmt::format("cp={}", world), fmt::format("ep={}", world),
                                  fmt::format("fsdp={}", world)})
    plan::settings_apply(in.settings, item);
  const plan::Result r = plan::plan_step(in, &dev, &host);
  EXPECT_EQ(r.sizes.rank, rank);
  bool all_equal = true;
  for (Category cat : kAllCategories) {
    EXPECT_EQ(r.peak[static_cast<int>(cat)], led.peak(cat)) << category_name(cat);
    all_equal = all_equal && r.peak[static_cast<int>(cat)] == led.peak(cat);
    EXPECT_TRUE(r.validated[static_cast<int>(cat)]) << category_name(cat);
  }
  EXPECT_EQ(r.step_peak, led.total_peak());
  all_equal = all_equal && r.step_peak == led.total_peak();
  EXPECT_EQ(r.host_needed, be.host_ledger().total_peak());
  for (Category cat : kAllCategories)
    EXPECT_EQ(r.host_peak[static_cast<int>(cat)], be.host_ledger().peak(cat)) << "host " << category_name(cat);
  EXPECT_TRUE(r.predicted.empty());
  if (world > 1) {
    EXPECT_GT(led.peak(Category::Category_comm), 0u);  // the ring's K/V blocks exist
  }
  if (!all_equal) ADD_FAILURE() << first_difference(led.events(), dev.events());
  EXPECT_EQ(first_difference(led.events(), dev.events()), "the sequences agree");
}

// One training step as the trainer runs it; compares its ledgers with the plan. world > 1: the
// hottest rank of the engine's layout (context parallel over W, FSDP over W, experts E / W per rank,
// the vocabulary ring over W), meta only.
void check_case(const Case& c, const char* device, const Sched& sc = {}, int world = 1) {
  const int rank = hottest_rank(c, world);
  SCOPED_TRACE(fmt::format("{} on {}, {}, W = {}, rank {}", c.name, device, sc.str(), world, rank));
  MetaWorldComm comm(world, rank);
  StepRun run = run_step(c, device, sc, world > 1 ? &comm : nullptr);
  compare(c, sc, world, rank, *run.be, /*planner_picks=*/true);
}

// Every rank of a W-rank world (threads joined by test::ThreadWorld, meta backends): each rank's
// ledgers against the plan of that rank, and the planner's own pick is the rank whose step peak is
// the largest. LLEP's plan sends a rank rows by their global position, so ranks differ; this world
// moves the counts for real (MetaWorldComm's W identical ranks would not).
void check_world(const Case& c, const Sched& sc, int world) {
  SCOPED_TRACE(fmt::format("{} on meta, {}, W = {}, every rank", c.name, sc.str(), world));
  std::vector<StepRun> runs(static_cast<size_t>(world));
  test::ThreadWorld(world).run([&](Comm& comm) { runs[comm.rank()] = run_step(c, "meta", sc, &comm); });
  // The rank with the largest step peak; among equals the largest sum of category peaks, then the first.
  auto key = [&](int r) {
    const Ledger& led = runs[r].be->device_ledger();
    uint64_t sum = 0;
    for (Category cat : kAllCategories) sum += led.peak(cat);
    return std::pair<uint64_t, uint64_t>{led.total_peak(), sum};
  };
  int top = 0;
  for (int r = 0; r < world; ++r) {
    compare(c, sc, world, r, *runs[r].be);
    if (key(r) > key(top)) top = r;
  }
  compare(c, sc, world, top, *runs[top].be, /*planner_picks=*/true);
}


// >= 20 configurations: layers, hidden, heads (MHA, GQA, MQA, head_dim != H / heads), experts,
// top-k (1, k = E), expert width, vocabulary (small and larger than n), batch and context.
const Case kMetaCases[] = {
    {"tiny", 2, 64, 4, 2, 16, 8, 2, 64, 256, 4, 256},
    {"one_layer", 1, 32, 2, 1, 16, 4, 1, 16, 100, 1, 17},
    {"mha", 3, 48, 6, 6, 8, 6, 2, 20, 500, 2, 33},
    {"mqa", 2, 96, 8, 1, 12, 16, 4, 40, 1000, 1, 129},
    {"wide_heads", 2, 64, 2, 2, 64, 8, 2, 32, 300, 3, 50},
    {"k_equals_E", 2, 40, 4, 2, 10, 4, 4, 24, 64, 2, 31},
    {"top1", 4, 24, 4, 2, 6, 10, 1, 12, 77, 1, 300},
    {"many_experts", 2, 64, 4, 4, 16, 128, 8, 32, 512, 1, 200},
    {"wide_ffn", 2, 32, 4, 2, 8, 8, 2, 1024, 128, 2, 64},
    {"vocab_heavy", 2, 32, 4, 2, 8, 8, 2, 16, 32000, 1, 512},
    {"long_context", 2, 64, 4, 2, 16, 8, 2, 64, 256, 1, 8192},
    {"batch8", 3, 32, 4, 4, 8, 8, 2, 32, 200, 8, 100},
    {"two_tokens", 2, 32, 4, 2, 8, 8, 2, 32, 200, 1, 2},
    {"deep", 12, 32, 4, 2, 8, 8, 2, 32, 200, 2, 64},
    {"no_aux_loss", 2, 64, 4, 2, 16, 8, 2, 64, 256, 2, 100, 0.0},
    {"hot_routing", 2, 64, 4, 2, 16, 16, 2, 64, 256, 2, 100, 0.01, "hot:0.9:4"},
    {"hot_routing_skewed", 3, 48, 6, 3, 8, 12, 3, 40, 300, 1, 333, 0.01, "hot:1:3"},
    {"odd_everything", 5, 37, 3, 1, 14, 7, 3, 29, 997, 3, 71},
    {"heads_gt_hidden", 2, 32, 16, 4, 32, 8, 2, 16, 128, 1, 96},
    {"large_vocab_short", 1, 128, 8, 2, 16, 32, 4, 64, 151936, 1, 64},
    {"qwen3_30b_like", 4, 2048, 32, 4, 128, 128, 8, 768, 151936, 1, 4096},
    {"paper_hidden_slice", 2, 7168, 64, 8, 128, 384, 8, 2048, 200000, 1, 2048},
    {"mixtral_like_slice", 2, 6144, 48, 8, 128, 8, 2, 16384, 32000, 1, 8192},
    {"gpt_oss_like_slice", 3, 2880, 64, 8, 64, 128, 4, 2880, 201088, 2, 1024},
    // On 4 and 8 ranks the balanced profile loads rank 1 most (its experts get the extra routes), and
    // no row count divides by W (FSDP padding rows, a short last vocabulary shard).
    {"uneven_ranks", 2, 34, 5, 1, 6, 8, 3, 24, 203, 1, 80},
};

}  // namespace

TEST(PlanVsMeta, EveryCategoryAndTheStepPeakAreExactOnOneRank) {
  for (const Case& c : kMetaCases) check_case(c, "meta");
  EXPECT_GE(std::size(kMetaCases), 20u);
}

TEST(PlanVsMeta, CpuRunsAtSmallScaleAgreeToo) {
  // The cpu backend computes (and its allocation sequence equals meta's): a few small cases.
  for (const Case& c : kMetaCases)
    if (std::string(c.name) == "one_layer" || std::string(c.name) == "odd_everything" ||
        std::string(c.name) == "hot_routing" || std::string(c.name) == "no_aux_loss")
      check_case(c, "cpu");
}

// The flattened schedules that run on one rank, alone and together, against meta.
TEST(PlanVsMeta, OneRankFlattenedSchedulesAreExact) {
  const std::vector<std::string> models = {"tiny", "mqa", "deep", "odd_everything", "vocab_heavy", "qwen3_30b_like"};
  // Small buckets cut a model into many buckets and each costs the engine a pipeline round even on
  // meta: they run on the smallest models only.
  const std::vector<std::string> small = {"one_layer", "two_tokens"};
  const std::vector<std::pair<Sched, std::vector<std::string>>> runs = {
      {{.vocab = "ring"}, models},
      {{.vocab = "ring", .block_tokens = 7}, models},
      {{.vocab = "ring", .block_tokens = 100000}, models},
      {{.ckpt = "sco"}, models},
      {{.ckpt = "sco", .host_budget = 1}, models},  // nothing fits the budget: every boundary stays
      {{.optim = "offload_serial"}, models},
      {{.optim = "offload_stream"}, models},
      {{.optim = "offload_stream", .bucket_params = 1000, .slots = 3}, small},
      {{.optim = "offload_stream", .bucket_params = 37, .slots = 1, .update_on = "host"}, small},
      {{.optim = "offload_stream", .bucket_params = 5}, small},  // below the 16-element alignment
      // every single-rank flattened schedule composed
      {{.vocab = "ring", .block_tokens = 64, .ckpt = "sco", .optim = "offload_stream"}, models},
      {{.vocab = "ring", .block_tokens = 64, .ckpt = "sco", .optim = "offload_stream", .bucket_params = 4096}, small},
  };
  for (const auto& [sc, names] : runs)
    for (const std::string& name : names)
      for (const Case& c : kMetaCases)
        if (c.name == name) check_case(c, "meta", sc);
}

// SCO with a budget or a host arena that holds only some boundaries: the rest stay on the device.
TEST(PlanVsMeta, ScoPartialOffloadIsExact) {
  for (const Case& c : kMetaCases) {
    if (std::string(c.name) != "deep") continue;
    const uint64_t boundary = static_cast<uint64_t>(c.B * c.T * c.H) * 4;
    check_case(c, "meta", {.ckpt = "sco", .host_budget = 5 * boundary + 3});
    check_case(c, "meta", {.ckpt = "sco", .host_mem = 3 * boundary});
    // the optimizer's host state leaves less room for boundaries
    const uint64_t state = static_cast<uint64_t>(case_config(c).param_count()) * 12;
    check_case(c, "meta", {.ckpt = "sco", .host_mem = state + 4 * boundary, .optim = "offload_stream"});
  }
}

TEST(PlanVsMeta, CpuRunsOfTheFlattenedSchedulesAgree) {
  for (const Case& c : kMetaCases)
    if (std::string(c.name) == "odd_everything")
      check_case(c, "cpu", {.vocab = "ring", .block_tokens = 50, .ckpt = "sco", .optim = "offload_stream",
                            .bucket_params = 999});
}

// W ranks as the engine lays them out (ring attention over zig-zag pieces, FSDP over W, standard
// expert parallelism with E / W experts per rank, Ring-DTP over W vocabulary shards): the hottest rank.
TEST(PlanVsMeta, ContextParallelRanksAreExact) {
  for (int world : {2, 4, 8})
    for (const char* name : {"tiny", "mqa", "deep", "odd_everything", "long_context", "hot_routing",
                             "hot_routing_skewed", "uneven_ranks", "qwen3_30b_like"})
      for (const Case& c : kMetaCases) {
        if (std::string(c.name) != name || c.T % (2 * world) != 0 || c.E % world != 0) continue;
        check_case(c, "meta", {}, world);
        check_case(c, "meta", {.vocab = "ring", .block_tokens = 100, .ckpt = "sco", .optim = "offload_stream"}, world);
        // both ring modes whatever auto picks (activations when N <= V / W)
        for (const char* mode : {"weights", "activations"})
          for (bool keep : {false, true})
            check_case(c, "meta", {.vocab = "ring", .block_tokens = 64, .ring_mode = mode, .keep_strips = keep}, world);
      }
}

// Every rank of a real W-rank world (check_world): LLEP and PipelinedLLEP under balanced routing (the
// plan stays inactive, standard EP's rows) and hot profiles (the plan spills hot experts to other
// ranks with their weights), both chunk memberships, chunk caps that leave short chunks, a K_max that
// caps K, one chunk; standard EP; Ring-DTP in both modes with and without kept strips (the last
// ranks' shorter vocabulary shard); everything composed.
TEST(PlanVsMeta, EveryRankOfARealWorldIsExact) {
  const Case hot = {"hot_dispatch", 2, 32, 4, 2, 8, 16, 2, 24, 200, 1, 512, 0.01, "hot:0.9:2"};
  const Case hot3 = {"hot_top3", 2, 40, 4, 1, 10, 8, 3, 16, 150, 2, 96, 0.01, "hot:0.7:3"};
  const Case bal = {"balanced_dispatch", 2, 32, 4, 2, 8, 8, 2, 24, 128, 1, 256};
  int checked = 0;
  for (int world : {2, 4, 8})
    for (const Case& c : {hot, hot3, bal}) {
      if (c.T % (2 * world) != 0 || c.E % world != 0) continue;
      check_world(c, {.dispatch = "standard"}, world);
      check_world(c, {.dispatch = "llep", .min_tokens = 8}, world);
      check_world(c, {.dispatch = "llep", .lambda = 1.0, .min_tokens = 1}, world);
      for (bool strided : {true, false}) {
        check_world(c, {.dispatch = "pipelined_llep", .min_tokens = 8, .chunk_cap = 16, .strided = strided}, world);
        check_world(c, {.dispatch = "pipelined_llep", .min_tokens = 8, .chunk_cap = 7, .max_chunks = 3,
                        .strided = strided}, world);
      }
      check_world(c, {.dispatch = "pipelined_llep", .chunk_cap = 100000}, world);  // one chunk
      checked += 7;
    }
  EXPECT_GE(checked, 20);
  // The cases reach what they are meant to: a spilling plan with guest experts, several chunks.
  for (int world : {2, 4, 8}) {
    plan::Input in = case_input(hot, {.dispatch = "pipelined_llep", .min_tokens = 8, .chunk_cap = 16});
    in.settings.layout.ranks = world;
    const plan::Result r = plan::plan_step(in);
    EXPECT_TRUE(r.sizes.llep_active) << world;
    EXPECT_GT(r.sizes.chunks, 1) << world;
    int64_t guests = 0;
    for (int rank = 0; rank < world; ++rank) {
      in.settings.layout.rank = rank;
      guests += plan::plan_step(in).sizes.guests;
    }
    EXPECT_GT(guests, 0) << world;
  }
  // every rank of the plain layout and of Ring-DTP in both modes (the last ranks' shorter vocabulary
  // shard included), on a model whose rows divide by no W
  for (const Case& c : kMetaCases)
    if (std::string(c.name) == "uneven_ranks")
      for (int world : {2, 4, 8}) {
        check_world(c, {}, world);
        for (const char* mode : {"weights", "activations"})
          for (bool keep : {false, true})
            check_world(c, {.vocab = "ring", .block_tokens = 16, .ring_mode = mode, .keep_strips = keep}, world);
      }
  // every flattened schedule composed, and a hot profile, on 4 ranks
  check_world(hot, {.vocab = "ring", .block_tokens = 64, .ckpt = "sco", .optim = "offload_stream",
                    .dispatch = "pipelined_llep", .min_tokens = 8, .chunk_cap = 32}, 4);
}

// bf16 plans scale the same sequence: a category made only of activation-dtype tensors halves.
TEST(PlanVsMeta, Bf16CheckpointsAreHalfTheF32Ones) {
  const Case c = kMetaCases[0];
  plan::Input f32 = case_input(c), bf16 = case_input(c);
  plan::settings_apply(bf16.settings, "dtype.activations=bf16");
  const int ck = static_cast<int>(Category::Category_checkpoints);
  EXPECT_EQ(plan::plan_step(bf16).peak[ck] * 2, plan::plan_step(f32).peak[ck]);
}

}  // namespace fp
