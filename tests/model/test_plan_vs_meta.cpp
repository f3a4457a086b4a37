// The planner against the engine: for one rank with the plain schedules and every dtype f32 (what
// the engine allocates), plan_step's per-category peaks and step peak equal the ledger of a real
// training step (zero grads, forward_backward, AdamW step) on the meta backend, and on the cpu
// backend at small scale. On a mismatch the first allocation event that differs is printed.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "data/random_batch.h"
#include "model/model.h"
#include "plan/plan.h"
#include "sched/optim/adamw.h"

namespace fp {

namespace {

struct Case {
  const char* name;
  int64_t L, H, nh, nkv, hd, E, k, I, V, B, T;
  double coef = 0.01;              // router_aux_loss_coef (0: no aux-loss bias tensor)
  const char* routing = "balanced";
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

plan::Input case_input(const Case& c) {
  plan::Input in;
  in.model = case_config(c);
  in.context = c.T;
  for (const char* item : {"dtype=f32", "optim=device"}) plan::settings_apply(in.settings, item);
  plan::settings_apply(in.settings, fmt::format("batch={}", c.B));
  plan::settings_apply(in.settings, fmt::format("routing={}", c.routing));
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

// One training step as the trainer runs it; compares its ledger with the plan.
void check_case(const Case& c, const char* device) {
  SCOPED_TRACE(fmt::format("{} on {}", c.name, device));
  const ModelConfig m = case_config(c);
  auto be = backend_create(device, kUnlimitedBytes, kUnlimitedBytes);
  Model model(m, *be, routing_profile_parse(c.routing));
  model.init_weights(m.seed);
  AdamW opt(model.params(), *be, OptimConfig{});
  model.zero_grads();
  Batch batch = batch_random(c.B, c.T, c.V, 11);
  model.forward_backward(batch);
  opt.step(1, 1);
  const Ledger& led = be->device_ledger();

  plan::PeakReplay dev(/*record_events=*/true), host;
  const plan::Result r = plan::plan_step(case_input(c), &dev, &host);
  bool all_equal = true;
  for (Category cat : kAllCategories) {
    EXPECT_EQ(r.peak[static_cast<int>(cat)], led.peak(cat)) << category_name(cat);
    all_equal = all_equal && r.peak[static_cast<int>(cat)] == led.peak(cat);
    EXPECT_TRUE(r.validated[static_cast<int>(cat)]) << category_name(cat);
  }
  EXPECT_EQ(r.step_peak, led.total_peak());
  all_equal = all_equal && r.step_peak == led.total_peak();
  EXPECT_EQ(r.host_needed, be->host_ledger().total_peak());
  EXPECT_TRUE(r.predicted.empty());
  if (!all_equal) ADD_FAILURE() << first_difference(led.events(), dev.events());
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
    {"one_token", 2, 32, 4, 2, 8, 8, 2, 32, 200, 1, 1},
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
};

}  // namespace

TEST(PlanVsMeta, EveryCategoryAndTheStepPeakAreExactOnOneRank) {
  for (const Case& c : kMetaCases) check_case(c, "meta");
  EXPECT_GE(std::size(kMetaCases), 20u);
}

TEST(PlanVsMeta, CpuRunsAtSmallScaleAgreeToo) {
  // The cpu backend computes (and its allocation sequence equals meta's): a few small cases.
  for (const Case& c : kMetaCases)
    if (std::string(c.name) == "tiny" || std::string(c.name) == "odd_everything" ||
        std::string(c.name) == "hot_routing" || std::string(c.name) == "no_aux_loss")
      check_case(c, "cpu");
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
