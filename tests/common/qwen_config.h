// A small Qwen3-MoE model for the model tests: hidden 24, 4 query heads of 8 over 2 KV heads, 6 experts
// top-2 of width 20, vocabulary 50, the load-balancing loss on (0.01).
#pragma once

#include "model/config.h"

namespace fp {

inline ModelConfig qwen_small_config(int64_t layers) {
  ModelConfig m;
  m.hidden_size = 24, m.num_hidden_layers = layers, m.num_attention_heads = 4, m.num_key_value_heads = 2;
  m.head_dim = 8, m.num_experts = 6, m.num_experts_per_tok = 2, m.moe_intermediate_size = 20, m.vocab_size = 50;
  m.rope_theta = 10000, m.rms_norm_eps = 1e-6, m.norm_topk_prob = true, m.router_aux_loss_coef = 0.01;
  m.seed = 7;
  return m;
}

}  // namespace fp
