// Note [Gradient accumulation] (train/trainer.cpp): M micro-batches between two zero_grads, each weighted
// by StepWeights, against one step on the whole global batch on the same weights:
//   - Qwen3-MoE without the load-balancing loss and DeepSeek-V3 (whose router has none): the loss and every
//     gradient within 1e-6 (norm-relative), with the ignored targets spread unevenly over the micro-batches
//     (the global token mean, not a mean of means: the mean of the micro-batches' own means is checked to
//     differ), and the expert loads summed over the micro-batches equal to the global batch's;
//   - with the load-balancing loss: the accumulated loss is the global cross-entropy plus the mean of the
//     micro-batches' own aux losses (Megatron's convention, stated in the Note).
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

ModelConfig qwen_config(double aux) {
  ModelConfig m;
  m.hidden_size = 24, m.num_hidden_layers = 2, m.num_attention_heads = 4, m.num_key_value_heads = 2, m.head_dim = 8;
  m.num_experts = 6, m.num_experts_per_tok = 2, m.moe_intermediate_size = 20, m.vocab_size = 50;
  m.norm_topk_prob = true, m.router_aux_loss_coef = aux, m.seed = 5;
  return m;
}

// A global batch of 4 sequences of 40 tokens; sequence 0 has most of its targets ignored.
Batch global_batch(int64_t V) {
  Batch b = batch_random(4, 40, V, 9);
  for (int64_t t = 0; t < 30; ++t) b.targets[t] = -100;
  for (int64_t t = 0; t < 40; t += 3) b.targets[2 * 40 + t] = -100;
  return b;
}

Batch rows(const Batch& g, int64_t first, int64_t count) {
  Batch b;
  b.B = count, b.T = g.T;
  b.tokens.assign(g.tokens.begin() + first * g.T, g.tokens.begin() + (first + count) * g.T);
  b.targets.assign(g.targets.begin() + first * g.T, g.targets.begin() + (first + count) * g.T);
  return b;
}

struct Result {
  StepOutputs out;
  std::vector<std::vector<float>> grads;
  double mean_of_means = 0;  // the wrong normalisation, for contrast
};

// M micro-batches of the global batch (M = 0: the global batch as one step).
Result run(const ModelConfig& m, const Batch& g, int64_t M) {
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  Model model(m, *be, RoutingProfile{});
  model.init_weights(m.seed);
  model.zero_grads();
  Result r;
  if (M == 0) {
    r.out = step_forward_backward(model, g);
  } else {
    int64_t targets = 0;
    for (const int32_t t : g.targets) targets += t != -100;
    for (int64_t mb = 0; mb < M; ++mb) {
      const Batch b = rows(g, mb * g.B / M, g.B / M);
      const StepOutputs o = step_forward_backward(model, b, nullptr, StepWeights{targets, 1.0 / M});
      int64_t mine = 0;
      for (const int32_t t : b.targets) mine += t != -100;
      r.mean_of_means += o.ce_loss * static_cast<double>(targets) / static_cast<double>(mine) / M;
      r.out.loss += o.loss;
      r.out.ce_loss += o.ce_loss;
      r.out.aux_loss += o.aux_loss / M;
      if (r.out.expert_counts.empty()) r.out.expert_counts.assign(o.expert_counts.size(), 0);
      for (size_t i = 0; i < o.expert_counts.size(); ++i) r.out.expert_counts[i] += o.expert_counts[i];
    }
  }
  for (Param& p : model.params().all()) {
    std::vector<float> h(static_cast<size_t>(p.g.numel()));
    be->copy_to_host(h.data(), p.g.data(), p.g.bytes());
    r.grads.push_back(std::move(h));
  }
  return r;
}

}  // namespace

TEST(GradAccum, MicroBatchesEqualOneStepOnTheGlobalBatch) {
  for (const ModelConfig& m : {qwen_config(0.0), deepseek_small_config(2, 0, 1)}) {
    SCOPED_TRACE(model_type_name(m.model_type));
    const Batch g = global_batch(m.vocab_size);
    const Result whole = run(m, g, 0);
    for (const int64_t M : {2, 4}) {
      SCOPED_TRACE(M);
      const Result acc = run(m, g, M);
      EXPECT_NEAR(acc.out.loss, whole.out.loss, 1e-6 * whole.out.loss);
      // The mean of the micro-batches' own means is 100x further off than the tolerance.
      EXPECT_GT(std::fabs(acc.mean_of_means - whole.out.ce_loss), 100e-6 * whole.out.loss)
          << "the batch does not tell the means apart";
      EXPECT_EQ(acc.out.expert_counts, whole.out.expert_counts);
      double worst = 0;
      for (size_t i = 0; i < acc.grads.size(); ++i) worst = std::max(worst, norm_rel(acc.grads[i], whole.grads[i]));
      std::printf("%s M=%lld: loss %.9f vs %.9f, worst gradient %.2e (norm-relative)\n", model_type_name(m.model_type),
                  static_cast<long long>(M), acc.out.loss, whole.out.loss, worst);
      EXPECT_LE(worst, 1e-6);
    }
  }
}

TEST(GradAccum, LoadBalancingLossIsTheMeanOfTheMicroBatches) {
  const ModelConfig m = qwen_config(0.05);
  const Batch g = global_batch(m.vocab_size);
  const Result acc = run(m, g, 2), whole = run(m, g, 0);
  double aux = 0;
  for (int64_t mb = 0; mb < 2; ++mb) aux += run(m, rows(g, 2 * mb, 2), 0).out.aux_loss / 2;
  EXPECT_NEAR(acc.out.aux_loss, aux, 1e-12);
  EXPECT_NEAR(acc.out.ce_loss, whole.out.ce_loss, 1e-6 * whole.out.ce_loss);
  EXPECT_NEAR(acc.out.loss, acc.out.ce_loss + 0.05 * aux, 1e-9);
}

}  // namespace fp
