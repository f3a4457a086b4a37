// model_type "deepseek_v3" in the engine: the meta backend allocates exactly as cpu (the planner's promise),
// the aux-loss-free bias update follows the step's loads by the sign rule (and the offloaded optimizer's
// master follows it), and a step is bitwise repeatable. Logits and gradients against the PyTorch twin:
// tests/reference (model_vs_twin_mla, model_vs_twin_mla_yarn).
#include <gtest/gtest.h>

#include <cmath>

#include "../common/optim_schedule.h"
#include "backend/backend.h"
#include "core/units.h"
#include "data/random_batch.h"
#include "sched/optim/optimizer.h"
#include "step/step.h"
#include "../common/deepseek_config.h"

namespace fp {

namespace {
ModelConfig deepseek_config() { return deepseek_small_config(3, 12, 1); }

std::vector<float> host_of(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  be.copy_to_host(v.data(), t.data(), t.bytes());
  return v;
}
}  // namespace

TEST(DeepseekV3, MetaAllocatesAsCpu) {
  const ModelConfig m = deepseek_config();
  for (const char* prof : {"balanced", "hot:0.5:2"}) {
    std::vector<LedgerEvent> ev[2];
    int i = 0;
    for (const char* device : {"cpu", "meta"}) {
      auto be = backend_create(device, kUnlimitedBytes, kUnlimitedBytes);
      Model model(m, *be, routing_profile_parse(prof));
      model.init_weights(m.seed);
      StepOutputs out = step_forward_backward(model, batch_random(2, 37, m.vocab_size, 3));
      if (std::string(device) == "cpu") {
        EXPECT_TRUE(std::isfinite(out.loss));
      }
      ev[i++] = be->device_ledger().events();
    }
    ASSERT_GT(ev[0].size(), 100u);
    ASSERT_EQ(ev[0].size(), ev[1].size()) << prof;
    for (size_t j = 0; j < ev[0].size(); ++j) {
      ASSERT_EQ(ev[0][j].tag, ev[1][j].tag) << prof << " event " << j;
      ASSERT_EQ(ev[0][j].bytes, ev[1][j].bytes) << prof << " event " << j << " " << ev[0][j].tag;
      ASSERT_EQ(ev[0][j].total_after, ev[1][j].total_after) << prof << " event " << j;
    }
  }
}

// b_e += rate * sign(mean load - load_e) per MoE layer, from the step's own counts; the dense layer has
// no bias; a second, identical step moves it again; an optimizer step leaves it where the update put it
// (its gradient is zero), and the offloaded optimizer's host master follows the written weights.
TEST(DeepseekV3, RoutingBiasFollowsTheLoads) {
  const ModelConfig m = deepseek_config();
  for (const char* sched : {"device", "offload_stream"}) {
    SCOPED_TRACE(sched);
    auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
    Model model(m, *be);
    model.init_weights(m.seed);
    OptimConfig oc;
    oc.sched = optim_named(sched);
    std::unique_ptr<Optimizer> optim = optimizer_create(oc, model.params(), *be);
    const Batch batch = batch_random(2, 40, m.vocab_size, 9);
    const double rate = 0.125;  // exact in float: the expected values below are exact
    std::vector<std::vector<float>> before(m.num_hidden_layers);
    for (int step = 1; step <= 2; ++step) {
      model.zero_grads();
      StepOutputs out = step_forward_backward(model, batch);
      for (int64_t l = 1; l < m.num_hidden_layers; ++l)
        before[l] = host_of(*be, model.params().layers[l].gate_bias->w);
      optim->step(step, 2);
      for (int64_t l = 1; l < m.num_hidden_layers; ++l)  // zero gradient: AdamW leaves the bias
        EXPECT_EQ(host_of(*be, model.params().layers[l].gate_bias->w), before[l]) << "layer " << l;
      const std::vector<Param*> written = model.routing_bias_update(out.expert_counts, rate);
      optim->weights_written(written);
      ASSERT_EQ(written.size(), 2u);  // layers 1 and 2 (layer 0 is dense)
      EXPECT_EQ(model.params().layers[0].gate_bias, nullptr);
      int moved = 0;
      for (int64_t l = 1; l < m.num_hidden_layers; ++l) {
        const std::vector<float> after = host_of(*be, model.params().layers[l].gate_bias->w);
        double mean = 0;
        for (int64_t e = 0; e < m.num_experts; ++e) mean += static_cast<double>(out.expert_counts[l * m.num_experts + e]);
        mean /= static_cast<double>(m.num_experts);
        for (int64_t e = 0; e < m.num_experts; ++e) {
          const double c = static_cast<double>(out.expert_counts[l * m.num_experts + e]);
          const double want = before[l][e] + (c < mean ? rate : c > mean ? -rate : 0.0);
          EXPECT_EQ(after[e], static_cast<float>(want)) << "layer " << l << " expert " << e << " load " << c;
          moved += after[e] != before[l][e];
        }
      }
      EXPECT_GT(moved, 0);
    }
    // The next optimizer step starts from the written bias: it is still there after it.
    model.zero_grads();
    step_forward_backward(model, batch);
    const std::vector<float> b1 = host_of(*be, model.params().layers[1].gate_bias->w);
    optim->step(3, 3);
    EXPECT_EQ(host_of(*be, model.params().layers[1].gate_bias->w), b1);
  }
}

TEST(DeepseekV3, StepIsBitwiseRepeatable) {
  const ModelConfig m = deepseek_config();
  std::vector<float> logits[2];
  std::vector<float> grads[2];
  for (int run = 0; run < 2; ++run) {
    auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
    Model model(m, *be);
    model.init_weights(m.seed);
    step_forward_backward(model, batch_random(2, 70, m.vocab_size, 4), &logits[run]);
    for (Param& p : model.params().all()) {
      const std::vector<float> g = host_of(*be, p.g);
      grads[run].insert(grads[run].end(), g.begin(), g.end());
    }
  }
  EXPECT_EQ(logits[0], logits[1]);
  EXPECT_EQ(grads[0], grads[1]);
}

}  // namespace fp
