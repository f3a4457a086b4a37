// ckpt.recompute = false (Note [No recompute] in step/step.h) against the plain recompute plan on the same
// inputs: the loss and every gradient bit for bit (the forward with keep is the recompute's arithmetic),
// on Qwen3-MoE with a dense layer and on DeepSeek-V3 (MLA, shared expert), fp32 and bf16, one rank and two
// (FSDP units, ring attention, expert parallelism with each dispatch), with SCO; no layer's forward runs
// twice; the activations peak holds every layer's (it grows with depth, where the plain plan's does not);
// and meta allocates as cpu, event for event (the planner's promise).
// Legend: L layers, W ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "../common/deepseek_config.h"
#include "../common/gathered_grads.h"
#include "../common/qwen_config.h"
#include "backend/backend.h"
#include "bench/bench_common.h"
#include "comm/thread_comm.h"
#include "core/precision.h"
#include "core/units.h"
#include "data/context_split.h"
#include "data/random_batch.h"
#include "step/step.h"

namespace fp {

namespace {

// Qwen3-MoE, L layers, layer 1 dense (mlp_only_layers).
ModelConfig qwen_config(int64_t layers) {
  ModelConfig m = qwen_small_config(layers);
  m.intermediate_size = 28;
  m.mlp_only_layers = {1};
  return m;
}

struct StepResult {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // every parameter's whole gradient, widened, in layout() order
  uint64_t activations_peak = 0;          // rank 0's device ledger
  uint64_t checkpoints_peak = 0, comm_peak = 0;
  int64_t attention_forwards = 0;         // rank 0's allocations of attn.h1: one per attention forward
  std::vector<LedgerEvent> events;        // rank 0's device ledger
};

// One forward+backward of m on W ranks (a thread world when W > 1, each rank its zig-zag piece of one
// batch of 2 x 64 tokens) on `device`.
StepResult step_run(const ModelConfig& m, const Schedules& sched, const char* profile, int W,
                    const char* device = "cpu", const char* recipe = "fp32") {
  const Batch global = batch_random(2, 64, m.vocab_size, 9);
  StepResult r;
  auto body = [&](Comm* comm) {
    auto be = backend_create(device, kUnlimitedBytes, kUnlimitedBytes);
    Model model(m, *be, routing_profile_parse(profile), sched, precision_recipe(recipe), comm);
    if (be->computes()) model.init_weights(m.seed);
    model.zero_grads();
    const int rank = comm ? comm->rank() : 0;
    const StepOutputs out = step_forward_backward(model, comm ? context_slice(global, rank, W) : global);
    std::vector<std::vector<float>> grads;
    if (be->computes()) grads = grads_gathered(model.params(), rank);  // collective
    if (rank != 0) return;
    r.grads = std::move(grads);
    r.loss = out.loss;
    r.activations_peak = be->device_ledger().peak(Category::Category_activations);
    r.checkpoints_peak = be->device_ledger().peak(Category::Category_checkpoints);
    r.comm_peak = be->device_ledger().peak(Category::Category_comm);
    r.events = be->device_ledger().events();
    for (const LedgerEvent& e : r.events) r.attention_forwards += e.alloc && e.tag == "attn.h1";
  };
  if (W == 1) {
    body(nullptr);
  } else {
    ThreadWorld world(W);
    world.run([&](Comm& comm) { body(&comm); });
  }
  return r;
}

Schedules schedules(bool recompute) {
  Schedules s;
  s.ckpt.recompute = recompute;
  return s;
}

// The same loss and gradients, bit for bit; on failure names the first differing value.
void expect_bitwise_equal(const StepResult& a, const StepResult& b) {
  EXPECT_TRUE(std::isfinite(a.loss));
  EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0) << "loss " << a.loss << " vs " << b.loss;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  ASSERT_GT(a.grads.size(), 10u);
  for (size_t p = 0; p < a.grads.size(); ++p) {
    ASSERT_EQ(a.grads[p].size(), b.grads[p].size());
    for (size_t i = 0; i < a.grads[p].size(); ++i)
      if (std::memcmp(&a.grads[p][i], &b.grads[p][i], sizeof(float)) != 0) {
        ADD_FAILURE() << "parameter " << p << " element " << i << ": " << a.grads[p][i] << " vs " << b.grads[p][i];
        break;
      }
  }
}

// Meta allocates as cpu (the planner's promise): the same device ledger events, field for field.
void expect_same_events(const StepResult& cpu, const StepResult& meta) {
  ASSERT_EQ(cpu.events.size(), meta.events.size());
  for (size_t i = 0; i < cpu.events.size(); ++i) {
    const LedgerEvent &x = cpu.events[i], &y = meta.events[i];
    ASSERT_EQ(x.alloc, y.alloc) << "event " << i << " " << x.tag;
    ASSERT_EQ(x.tag, y.tag) << "event " << i;
    ASSERT_EQ(x.category, y.category) << "event " << i << " " << x.tag;
    ASSERT_EQ(x.bytes, y.bytes) << "event " << i << " " << x.tag;
    ASSERT_EQ(x.total_after, y.total_after) << "event " << i << " " << x.tag;
  }
}

struct Case {
  const char* name;
  ModelConfig model;
  const char* profile;
  int W;
  DispatchSchedule::Kind dispatch = DispatchSchedule::Kind::Kind_standard;
  CkptSchedule::Kind ckpt = CkptSchedule::Kind::Kind_device;
};

std::vector<Case> cases() {
  return {
      {"qwen3 router W=1", qwen_config(3), "router", 1},
      {"qwen3 router W=1 sco", qwen_config(3), "router", 1, DispatchSchedule::Kind::Kind_standard,
       CkptSchedule::Kind::Kind_sco},
      {"deepseek W=1", deepseek_small_config(3, 12, 1), "balanced", 1},
      {"qwen3 hot W=2 standard", qwen_config(3), "hot:0.7:2", 2},
      {"qwen3 hot W=2 llep", qwen_config(3), "hot:0.7:2", 2, DispatchSchedule::Kind::Kind_llep},
      {"qwen3 hot W=2 pipelined_llep sco", qwen_config(3), "hot:0.7:2", 2, DispatchSchedule::Kind::Kind_pipelined_llep,
       CkptSchedule::Kind::Kind_sco},
      {"deepseek W=2", deepseek_small_config(3, 12, 1), "balanced", 2},
  };
}

}  // namespace

// Keeping every layer's activations changes no bit of the step, only which buffers live when; and the
// forward of no layer runs twice (the plain plan runs each attention forward twice).
TEST(NoRecompute, SameStepBitForBit) {
  for (const Case& c : cases()) {
    for (const char* recipe : {"fp32", "bf16"}) {
      SCOPED_TRACE(fmt::format("{} {}", c.name, recipe));
      Schedules plain = schedules(true);
      plain.dispatch.kind = c.dispatch;
      plain.dispatch.lambda = 1.0;  // llep plans (the hot profile is imbalanced)
      plain.ckpt.kind = c.ckpt;
      Schedules keep = plain;
      keep.ckpt.recompute = false;
      const StepResult a = step_run(c.model, plain, c.profile, c.W, "cpu", recipe);
      const StepResult b = step_run(c.model, keep, c.profile, c.W, "cpu", recipe);
      expect_bitwise_equal(a, b);
      const int64_t L = c.model.num_hidden_layers;
      EXPECT_EQ(a.attention_forwards, 2 * L);
      EXPECT_EQ(b.attention_forwards, L);
      EXPECT_GT(b.activations_peak, a.activations_peak);
    }
  }
}

// The plain plan's activations peak is one layer's whatever the depth; without recompute it holds every
// layer's, so it grows by the same bytes with each layer added (meta: exact bytes at no cost).
TEST(NoRecompute, ActivationsPeakHoldsEveryLayer) {
  uint64_t peak[2][3] = {};
  const int64_t depths[3] = {4, 8, 12};
  for (int keep = 0; keep < 2; ++keep)
    for (int d = 0; d < 3; ++d)
      peak[keep][d] = step_run(qwen_config(depths[d]), schedules(keep == 0), "balanced", 1, "meta").activations_peak;
  EXPECT_EQ(peak[0][0], peak[0][1]);
  EXPECT_EQ(peak[0][1], peak[0][2]);
  EXPECT_GT(peak[1][1], peak[1][0]);
  EXPECT_EQ(peak[1][2] - peak[1][1], peak[1][1] - peak[1][0]);  // 4 more (sparse) layers, the same bytes
  EXPECT_GT(peak[1][1] - peak[1][0], peak[0][0]) << "4 layers kept outweigh one layer recomputed with its backward";
}

// The planner runs the step on meta: without recompute it must allocate as cpu, event for event.
TEST(NoRecompute, MetaAllocatesAsCpu) {
  for (const Case& c : cases()) {
    if (c.W > 1) continue;  // meta on W ranks: tests/dist (plan_case)
    for (const char* recipe : {"fp32", "bf16"}) {
      SCOPED_TRACE(fmt::format("{} {}", c.name, recipe));
      Schedules s = schedules(false);
      s.ckpt.kind = c.ckpt;
      const char* profile = std::string(c.profile) == "router" ? "hot:0.7:2" : c.profile;  // meta needs one
      expect_same_events(step_run(c.model, s, profile, 1, "cpu", recipe),
                         step_run(c.model, s, profile, 1, "meta", recipe));
    }
  }
}

}  // namespace fp

namespace fp {

// Note [Boundaries every k layers] (step/step.cpp): ckpt.every = k keeps the boundaries of layers 0, k, 2k,
// ... and recomputes the others of a group in the backward. The kernels are deterministic, so the loss
// and every gradient are those of every boundary kept, bit for bit: on every case above (one and two ranks,
// every dispatch, SCO, DeepSeek-V3), k = 2 (a last group of one layer) and 3 (one group), and with layer
// tiles; the recomputed boundaries cost k - 1 more attention forwards per group; the store holds L / k
// boundaries (fewer checkpoints bytes at the peak, on meta for 12 layers).
TEST(CkptEvery, SameStepBitForBit) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    Schedules plain = schedules(true);
    plain.dispatch.kind = c.dispatch;
    plain.dispatch.lambda = 1.0;
    plain.ckpt.kind = c.ckpt;
    const StepResult a = step_run(c.model, plain, c.profile, c.W);
    const int64_t L = c.model.num_hidden_layers;
    for (int64_t k : {2, 3}) {
      SCOPED_TRACE(k);
      Schedules s = plain;
      s.ckpt.every = k;
      const StepResult b = step_run(c.model, s, c.profile, c.W);
      expect_bitwise_equal(a, b);
      const int64_t groups = (L + k - 1) / k;
      EXPECT_EQ(b.attention_forwards, 2 * L + (L - groups)) << "each group's layers but its last run once more";
    }
  }
  // With layer tiles (Note [Sequence-tiled layers]) the recomputed boundaries come from the tiled forward.
  Schedules tiled = schedules(true);
  tiled.ckpt.layer_tile = 16;
  const StepResult a = step_run(qwen_config(3), tiled, "router", 1);
  tiled.ckpt.every = 2;
  expect_bitwise_equal(a, step_run(qwen_config(3), tiled, "router", 1));
}

TEST(CkptEvery, FewerBoundariesAndMetaAllocatesAsCpu) {
  Schedules s = schedules(true);
  const uint64_t all = step_run(qwen_config(12), s, "balanced", 1, "meta").events.size();
  EXPECT_GT(all, 0u);
  auto ckpt_peak = [&](int64_t k) {
    Schedules e = s;
    e.ckpt.every = k;
    return step_run(qwen_config(12), e, "balanced", 1, "meta").checkpoints_peak;
  };
  const uint64_t one = ckpt_peak(1), four = ckpt_peak(4);
  const uint64_t boundary = 2 * 64 * static_cast<uint64_t>(qwen_config(12).hidden_size) * 4;  // (n, H) f32
  EXPECT_EQ(one, 12 * boundary) << "every layer's boundary (the last layer's output goes to the head)";
  // 3 kept, plus 3 recomputed while the last group runs backward.
  EXPECT_EQ(four, 6 * boundary);
  Schedules e = s;
  e.ckpt.every = 4;
  e.ckpt.kind = CkptSchedule::Kind::Kind_sco;
  expect_same_events(step_run(qwen_config(12), e, "hot:0.7:2", 1, "cpu"),
                     step_run(qwen_config(12), e, "hot:0.7:2", 1, "meta"));
  Schedules bad = s;
  bad.ckpt.every = 2;
  bad.ckpt.recompute = false;
  EXPECT_THROW(schedules_validate(bad, "test"), Error);
}

}  // namespace fp

namespace fp {

// Note [MLA's ring on the latent] (model/ring_attention.h): on two ranks DeepSeek-V3's ring sends the latent
// rows, so its comm buffers are two latent blocks and two f32 latent gradients, (n / W) x (kl + dr) each,
// nothing of the expanded keys and values; meta allocates as cpu event for event on the two ranks. (The
// gradients against one process: tests/dist, dist_check.py grads, deepseek.)
TEST(MlaRing, CommHoldsTheLatentAndMetaAllocatesAsCpu) {
  const ModelConfig m = deepseek_small_config(3, 12, 1);
  const Schedules s = schedules(true);
  const StepResult cpu = step_run(m, s, "balanced", 2, "cpu");
  expect_same_events(cpu, step_run(m, s, "balanced", 2, "meta"));
  const uint64_t peak = cpu.comm_peak;
  const uint64_t rows = 2 * 64 / 2, latent = static_cast<uint64_t>(m.kv_lora_rank + m.qk_rope_head_dim);
  EXPECT_EQ(peak, 4 * rows * latent * 4) << "two latent blocks and two f32 latent gradients";
}

// Note [The ring's blocks in chunks] (model/ring_attention.cpp): with layer tiles of 8 tokens each rank's 32 tokens
// of a sequence travel the ring in chunks of 8 keys, so the comm buffers hold two chunks of K and V and two of
// their f32 gradients (MLA: of the latent), a quarter of the unchunked blocks of one sequence; meta allocates as
// cpu. Tiles of a rank's 32 tokens run the unchunked ring bit for bit as in tiles of whole sequences.
TEST(RingChunks, CommHoldsTwoChunksAndMetaAllocatesAsCpu) {
  for (const ModelConfig& m : {qwen_config(2), deepseek_small_config(2, 12, 1)}) {
    SCOPED_TRACE(model_type_name(m.model_type));
    Schedules s = schedules(true);
    s.ckpt.layer_tile = 8;
    const StepResult cpu = step_run(m, s, "balanced", 2, "cpu");
    expect_same_events(cpu, step_run(m, s, "balanced", 2, "meta"));
    const uint64_t width = m.is_deepseek() ? static_cast<uint64_t>(m.kv_lora_rank + m.qk_rope_head_dim)
                                           : static_cast<uint64_t>(2 * m.num_key_value_heads * m.head_dim);
    EXPECT_EQ(cpu.comm_peak, 4 * 8 * width * 4) << "two chunks of 8 keys and two of their f32 gradients";
    s.ckpt.layer_tile = 32;  // one tile per sequence: the ring's blocks are the sequence's 32 keys
    EXPECT_EQ(step_run(m, s, "balanced", 2, "cpu").comm_peak, 4 * 32 * width * 4);
  }
}

}  // namespace fp
