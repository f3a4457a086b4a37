// Writes a training test case for the PyTorch twin (check_training.py): the initial weights, the
// batches of N AdamW steps of the built-in recall task, the loss of every step and the final weights.
//
//   train_case OUT.safetensors [STEPS]
//
// The optimizer settings travel in the metadata ("optim": JSON), so the twin can replay the run with
// torch.optim.AdamW, clip_grad_norm_ and the same learning-rate schedule.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/backend.h"
#include "core/units.h"
#include "data/recall_task.h"
#include "io/safetensors.h"
#include "sched/optim/adamw.h"
#include "step/step.h"

using namespace fp;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: train_case OUT.safetensors [STEPS]\n");
    return 2;
  }
  const int64_t steps = argc > 2 ? std::stoll(argv[2]) : 10;
  try {
    ModelConfig m;
    m.hidden_size = 32, m.num_hidden_layers = 2, m.num_attention_heads = 4, m.num_key_value_heads = 2;
    m.head_dim = 8, m.num_experts = 6, m.num_experts_per_tok = 2, m.moe_intermediate_size = 24;
    m.vocab_size = 64, m.norm_topk_prob = true, m.router_aux_loss_coef = 0.02, m.rope_theta = 10000;
    m.rms_norm_eps = 1e-6, m.seed = 3;
    OptimConfig o;
    o.lr = 1e-2, o.beta1 = 0.9, o.beta2 = 0.95, o.eps = 1e-8, o.weight_decay = 0.1, o.grad_clip = 0.5;
    o.warmup_steps = 3, o.min_lr_ratio = 0.1;
    RecallTaskConfig rc;
    rc.vocab_size = m.vocab_size, rc.seq_len = 96, rc.pairs = 2, rc.seed = 4, rc.loss_on = LossOn::LossOn_all;
    const int64_t B = 2;

    auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
    Model model(m, *be, RoutingProfile{});
    model.init_weights(m.seed);
    AdamW optim(model.params(), *be, o);

    std::vector<std::vector<float>> keep;
    std::vector<std::vector<int32_t>> keep_i;
    std::vector<SafetensorsView> views;
    auto snapshot = [&](const std::string& prefix) {
      for (Param& p : model.params().all()) {
        keep.emplace_back(static_cast<size_t>(p.w.numel()));
        be->copy_to_host(keep.back().data(), p.w.data(), p.w.bytes());
        views.push_back({prefix + p.name, DType::DType_F32, p.w.shape(), keep.back().data()});
      }
    };
    snapshot("");
    std::vector<float> losses;
    for (int64_t s = 1; s <= steps; ++s) {
      Batch b = recall_batch(rc, (s - 1) * B, B, nullptr);
      model.zero_grads();
      StepOutputs out = step_forward_backward(model, b);
      AdamW::StepStats st = optim.step(s, steps);
      losses.push_back(static_cast<float>(out.loss));
      keep_i.push_back(b.tokens);
      views.push_back({"step" + std::to_string(s) + ".input_ids", DType::DType_I32, {B, rc.seq_len}, keep_i.back().data()});
      keep_i.push_back(b.targets);
      views.push_back({"step" + std::to_string(s) + ".targets", DType::DType_I32, {B, rc.seq_len}, keep_i.back().data()});
      std::printf("step %lld loss %.6f grad norm %.4f lr %.5f\n", static_cast<long long>(s), out.loss, st.grad_norm,
                  st.lr);
    }
    views.push_back({"out.losses", DType::DType_F32, {steps}, losses.data()});
    snapshot("final.");
    nlohmann::json oj = {{"lr", o.lr},           {"beta1", o.beta1},
                         {"beta2", o.beta2},     {"eps", o.eps},
                         {"weight_decay", o.weight_decay}, {"grad_clip", o.grad_clip},
                         {"warmup_steps", o.warmup_steps}, {"min_lr_ratio", o.min_lr_ratio},
                         {"steps", steps}};
    safetensors_write(argv[1], views, {{"config", model_config_hf_json(m)}, {"optim", oj.dump()}});
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
