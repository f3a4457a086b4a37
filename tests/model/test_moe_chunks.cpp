// Note [The MoE token side in chunks] (model/moe_block.cpp): moe.token_chunk < n runs the MoE block's
// token side chunk by chunk. Against the unchunked step on the same weights and batch: the same losses
// and logits (to float rounding of the expert GEMMs' rows), every gradient within 1e-6 norm-relative
// (the weight gradients accumulate chunk by chunk), for the Qwen3-MoE layer with its load-balancing loss
// and DeepSeek-V3's (shared experts, the sigmoid router); a chunk of n or more is the unchunked step bit
// for bit; the token side's activations peak falls with the chunk; meta allocates as cpu under profiles.
// Across ranks and dispatches: tests/dist (dist_check.py grads, the *_chunked variants).
#include <gtest/gtest.h>

#include <cmath>

#include "../common/deepseek_config.h"
#include "../common/norm_rel.h"
#include "backend/backend.h"
#include "core/units.h"
#include "data/random_batch.h"
#include "step/step.h"

namespace fp {

namespace {
ModelConfig qwen_config() {
  ModelConfig m;
  m.hidden_size = 24, m.num_hidden_layers = 2, m.num_attention_heads = 4, m.num_key_value_heads = 2, m.head_dim = 8;
  m.num_experts = 6, m.num_experts_per_tok = 2, m.moe_intermediate_size = 20, m.vocab_size = 50;
  m.norm_topk_prob = true, m.router_aux_loss_coef = 0.05, m.seed = 5;
  return m;
}

ModelConfig deepseek_config() {
  ModelConfig m = deepseek_small_config(2, 0, 0);
  m.seed = 5;
  return m;
}

struct StepRun {
  StepOutputs out;
  std::vector<float> logits;
  std::vector<std::vector<float>> grads;
  uint64_t act_peak = 0;
  std::vector<LedgerEvent> events;
};

StepRun run(const ModelConfig& m, const std::string& device, int64_t token_chunk, const RoutingProfile& p = {}) {
  auto be = backend_create(device, kUnlimitedBytes, kUnlimitedBytes);
  Schedules sched;
  sched.dispatch.token_chunk = token_chunk;
  Model model(m, *be, p, sched);
  model.init_weights(m.seed);
  StepRun r;
  r.out = step_forward_backward(model, batch_random(2, 45, m.vocab_size, 8), device == "cpu" ? &r.logits : nullptr);
  if (device == "cpu")
    for (Param& q : model.params().all()) {
      std::vector<float> g(static_cast<size_t>(q.g.numel()));
      be->copy_to_host(g.data(), q.g.data(), q.g.bytes());
      r.grads.push_back(std::move(g));
    }
  r.act_peak = be->device_ledger().peak(Category::Category_activations);
  r.events = be->device_ledger().events();
  return r;
}

}  // namespace

TEST(MoeChunks, ChunkedStepMatchesTheWholeTokenSide) {
  for (const ModelConfig& m : {qwen_config(), deepseek_config()}) {
    SCOPED_TRACE(model_type_name(m.model_type));
    const StepRun whole = run(m, "cpu", 0);
    // 90 tokens: chunks of 7 (the last of 6), 32 and 89; 90 and more is one chunk.
    for (int64_t chunk : {7, 32, 89}) {
      SCOPED_TRACE(chunk);
      const StepRun c = run(m, "cpu", chunk);
      EXPECT_NEAR(c.out.loss, whole.out.loss, 1e-6 * std::fabs(whole.out.loss));
      EXPECT_NEAR(c.out.aux_loss, whole.out.aux_loss, 1e-6 * std::fabs(whole.out.aux_loss) + 1e-12);
      EXPECT_EQ(c.out.expert_counts, whole.out.expert_counts);
      EXPECT_LE(norm_rel(c.logits, whole.logits), 1e-6);
      ASSERT_EQ(c.grads.size(), whole.grads.size());
      double worst = 0;
      for (size_t i = 0; i < c.grads.size(); ++i) worst = std::max(worst, norm_rel(c.grads[i], whole.grads[i]));
      EXPECT_LE(worst, 1e-6);
      // The token side is bounded by the chunk; h2 and x2 stay whole across the chunks, so a chunk close to
      // n costs a little more than none.
      if (chunk <= 32) {
        EXPECT_LT(c.act_peak, whole.act_peak) << "the token side is bounded by the chunk";
      }
    }
    const StepRun one = run(m, "cpu", 90);
    EXPECT_EQ(one.out.loss, whole.out.loss);
    EXPECT_EQ(one.logits, whole.logits);
    EXPECT_EQ(one.grads, whole.grads);
  }
}

TEST(MoeChunks, MetaAllocatesAsCpu) {
  for (const char* prof : {"balanced", "hot:0.9:2", "hot:0.5:1"}) {
    for (const ModelConfig& m : {qwen_config(), deepseek_config()}) {
      SCOPED_TRACE(testing::Message() << prof << " " << model_type_name(m.model_type));
      const RoutingProfile p = routing_profile_parse(prof);
      const StepRun cpu = run(m, "cpu", 16, p);
      const StepRun meta = run(m, "meta", 16, p);
      ASSERT_EQ(cpu.events.size(), meta.events.size());
      for (size_t j = 0; j < cpu.events.size(); ++j) {
        ASSERT_EQ(cpu.events[j].tag, meta.events[j].tag) << "event " << j;
        ASSERT_EQ(cpu.events[j].bytes, meta.events[j].bytes) << "event " << j << " " << cpu.events[j].tag;
        ASSERT_EQ(cpu.events[j].total_after, meta.events[j].total_after) << "event " << j;
      }
      EXPECT_EQ(cpu.out.expert_counts, meta.out.expert_counts);
    }
  }
}

}  // namespace fp
