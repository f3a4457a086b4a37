// The meta backend performs the identical allocation sequence as cpu; over-capacity errors name the
// category that ran out.
#include <gtest/gtest.h>

#include "../common/optim_schedule.h"
#include "../common/qwen_config.h"
#include "backend/backend.h"
#include "core/precision.h"
#include "core/units.h"
#include "data/random_batch.h"
#include "sched/optim/optimizer.h"
#include "step/step.h"

namespace fp {

namespace {
ModelConfig small_config() { return qwen_small_config(3); }

std::vector<LedgerEvent> run_events(const std::string& device, const RoutingProfile& p, const ModelConfig& m,
                                    int64_t B, int64_t T) {
  auto be = backend_create(device, kUnlimitedBytes, kUnlimitedBytes);
  Model model(m, *be, p);
  model.init_weights(m.seed);
  Batch b = batch_random(B, T, m.vocab_size, 3);
  StepOutputs out = step_forward_backward(model, b);
  if (device == "cpu") {
    EXPECT_TRUE(std::isfinite(out.loss));
  }
  return be->device_ledger().events();
}

// The whole step `train` runs (zero grads, forward and backward, the optimizer's step): the device
// and host ledgers.
std::pair<std::vector<LedgerEvent>, std::vector<LedgerEvent>> step_events(const std::string& device,
                                                                          const OptimConfig& oc,
                                                                          const Precision& precision = {}) {
  const ModelConfig m = small_config();
  auto be = backend_create(device, kUnlimitedBytes, kUnlimitedBytes);
  Model model(m, *be, routing_profile_parse("hot:0.9:2"), Schedules{}, precision);
  model.init_weights(m.seed);
  std::unique_ptr<Optimizer> optim = optimizer_create(oc, model.params(), *be);
  model.zero_grads();
  Batch b = batch_random(2, 29, m.vocab_size, 5);
  StepOutputs out = step_forward_backward(model, b);
  optim->step(1, 1);
  if (device == "cpu") {
    EXPECT_TRUE(std::isfinite(out.loss));
  }
  return {be->device_ledger().events(), be->host_ledger().events()};
}

void expect_same_events(const std::vector<LedgerEvent>& cpu, const std::vector<LedgerEvent>& meta,
                        const std::string& what) {
  ASSERT_EQ(cpu.size(), meta.size()) << what;
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_EQ(cpu[i].alloc, meta[i].alloc) << what << " event " << i;
    ASSERT_EQ(cpu[i].bytes, meta[i].bytes) << what << " event " << i << " " << cpu[i].tag;
    ASSERT_EQ(cpu[i].tag, meta[i].tag) << what << " event " << i;
    ASSERT_EQ(cpu[i].total_after, meta[i].total_after) << what << " event " << i;
  }
}
}  // namespace

// Meta skips the optimizer's update (it allocates nothing after launch): the whole step, optimizer
// included, must still allocate exactly as on cpu, for every optimizer schedule.
TEST(MetaBackend, SameLedgersAsCpuThroughTheOptimizerStep) {
  for (const char* sched : {"device", "offload_serial", "offload_stream", "offload_stream:host"}) {
    OptimConfig oc;
    const std::string name = sched;
    oc.sched = name == "offload_stream:host" ? optim_named("offload_stream", "host") : optim_named(name);
    oc.sched.bucket_params = 500;  // several buckets on the small model
    auto [cpu_dev, cpu_host] = step_events("cpu", oc);
    auto [meta_dev, meta_host] = step_events("meta", oc);
    ASSERT_GT(cpu_dev.size(), 100u);
    expect_same_events(cpu_dev, meta_dev, std::string(sched) + " device ledger");
    expect_same_events(cpu_host, meta_host, std::string(sched) + " host ledger");
  }
}

// The bf16 recipe computes on cpu (Note [bf16 on a computing backend]): its ledgers, AdamW's f32
// master included, are the planner's (meta) event for event, and its activations are half the fp32
// run's bytes.
TEST(MetaBackend, Bf16RecipeSameLedgersAsCpuThroughTheOptimizerStep) {
  OptimConfig oc;
  oc.sched = optim_named("device");
  auto [cpu_dev, cpu_host] = step_events("cpu", oc, precision_recipe("bf16"));
  auto [meta_dev, meta_host] = step_events("meta", oc, precision_recipe("bf16"));
  ASSERT_GT(cpu_dev.size(), 100u);
  expect_same_events(cpu_dev, meta_dev, "bf16 device ledger");
  expect_same_events(cpu_host, meta_host, "bf16 host ledger");
  // The fp32 run allocates the same activations in the same order (the bf16 run adds AdamW's masters,
  // category optimizer): each bf16 activation is half its fp32 twin, the f32 statistics equal.
  auto [f32_dev, f32_host] = step_events("cpu", oc);
  auto activations = [](const std::vector<LedgerEvent>& ev) {
    std::vector<LedgerEvent> out;
    for (const LedgerEvent& e : ev)
      if (e.alloc && e.category == Category::Category_activations) out.push_back(e);
    return out;
  };
  const std::vector<LedgerEvent> ab = activations(cpu_dev), af = activations(f32_dev);
  ASSERT_EQ(ab.size(), af.size());
  int halved = 0;
  for (size_t i = 0; i < ab.size(); ++i) {
    ASSERT_EQ(ab[i].tag, af[i].tag) << "activation " << i;
    ASSERT_EQ(ab[i].dtype == DType::DType_BF16 ? 2 * ab[i].bytes : ab[i].bytes, af[i].bytes) << ab[i].tag;
    halved += ab[i].dtype == DType::DType_BF16;
  }
  EXPECT_GT(halved, 50);
}

TEST(MetaBackend, SameLedgerEventSequenceAsCpu) {
  for (const char* prof : {"balanced", "hot:0.9:2", "hot:0.5:3"}) {
    RoutingProfile p = routing_profile_parse(prof);
    ModelConfig m = small_config();
    auto cpu = run_events("cpu", p, m, 2, 37);
    auto meta = run_events("meta", p, m, 2, 37);
    ASSERT_EQ(cpu.size(), meta.size()) << prof;
    ASSERT_GT(cpu.size(), 100u);
    for (size_t i = 0; i < cpu.size(); ++i) {
      ASSERT_EQ(cpu[i].alloc, meta[i].alloc) << prof << " event " << i;
      ASSERT_EQ(cpu[i].category, meta[i].category) << prof << " event " << i << " " << cpu[i].tag;
      ASSERT_EQ(cpu[i].bytes, meta[i].bytes) << prof << " event " << i << " " << cpu[i].tag;
      ASSERT_EQ(cpu[i].tag, meta[i].tag) << prof << " event " << i;
      ASSERT_EQ(cpu[i].shape, meta[i].shape) << prof << " event " << i;
      ASSERT_EQ(cpu[i].total_after, meta[i].total_after) << prof << " event " << i;
    }
  }
}

TEST(MetaBackend, RouterProfileIsAnErrorOnMeta) {
  auto be = backend_create("meta", kUnlimitedBytes, kUnlimitedBytes);
  try {
    Model model(small_config(), *be, RoutingProfile{});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("routing profile"), std::string::npos);
    EXPECT_NE(e.hint().find("balanced"), std::string::npos);
  }
}

TEST(MetaBackend, ScalesToLongContextInstantly) {
  ModelConfig m = small_config();
  m.vocab_size = 32000;
  m.hidden_size = 1024;
  m.head_dim = 128;
  m.num_attention_heads = 8;
  m.num_key_value_heads = 2;
  auto be = backend_create("meta", kUnlimitedBytes, kUnlimitedBytes);
  Model model(m, *be, routing_profile_parse("balanced"));
  Batch b = batch_random(1, 131072, m.vocab_size, 1);
  step_forward_backward(model, b);
  const Ledger& l = be->device_ledger();
  // Full logits, log-softmax and their gradient: 3 x n x V fp32 at once.
  EXPECT_EQ(l.peak(Category::Category_vocab), 3ull * 131072 * 32000 * 4);
  // One boundary per layer.
  EXPECT_EQ(l.peak(Category::Category_checkpoints), 3ull * 131072 * 1024 * 4);
}

TEST(OutOfMemory, NamesTheCategoryThatRanOut) {
  ModelConfig m = small_config();
  m.vocab_size = 4096;  // the vocabulary dominates
  RoutingProfile p = routing_profile_parse("balanced");
  uint64_t peak = 0;
  {
    auto be = backend_create("meta", kUnlimitedBytes, kUnlimitedBytes);
    Model model(m, *be, p);
    step_forward_backward(model, batch_random(2, 64, m.vocab_size, 1));
    peak = be->device_ledger().total_peak();
  }
  for (const char* dev : {"meta", "cpu"}) {
    auto be = backend_create(dev, peak - 1, kUnlimitedBytes);
    Model model(m, *be, p);
    model.init_weights(1);
    try {
      step_forward_backward(model, batch_random(2, 64, m.vocab_size, 1));
      FAIL() << dev;
    } catch (const OutOfMemoryError& e) {
      EXPECT_EQ(e.category(), Category::Category_vocab) << e.what();
      EXPECT_NE(e.hint().find("vocab.schedule = \"ring\""), std::string::npos);
    }
    // Everything the failed step held was given back.
    EXPECT_EQ(be->device_ledger().current(Category::Category_activations), 0u) << dev;
    EXPECT_EQ(be->device_ledger().current(Category::Category_vocab), 0u) << dev;
  }
}

TEST(Model, BatchValidationNamesThePosition) {
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  ModelConfig m = small_config();
  Model model(m, *be, RoutingProfile{});
  Batch b = batch_random(2, 8, m.vocab_size, 1);
  b.tokens[11] = 50;
  try {
    step_forward_backward(model, b);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 50 at sequence 1, position 3"), std::string::npos) << e.what();
  }
  b = batch_random(2, 8, m.vocab_size, 1);
  b.targets[0] = -1;
  EXPECT_THROW(step_forward_backward(model, b), Error);
  for (auto& t : b.targets) t = -100;
  EXPECT_THROW(step_forward_backward(model, b), Error);
}

TEST(Model, BitwiseDeterministic) {
  ModelConfig m = small_config();
  std::vector<std::vector<float>> grads[2];
  double loss[2];
  for (int r = 0; r < 2; ++r) {
    auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
    Model model(m, *be, RoutingProfile{});
    model.init_weights(m.seed);
    loss[r] = step_forward_backward(model, batch_random(2, 70, m.vocab_size, 5)).loss;
    for (Param& p : model.params().all()) {
      const float* g = p.g.f32();
      grads[r].emplace_back(g, g + p.g.numel());
    }
  }
  EXPECT_EQ(loss[0], loss[1]);
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_EQ(grads[0][i], grads[1][i]) << i;
}

}  // namespace fp
