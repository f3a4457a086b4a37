// A small DeepSeek-V3 model for the model tests (model_type deepseek_v3): MLA with or without the
// query latent, the sigmoid router choosing within 2 of 4 expert groups, a shared expert, and
// first_k_dense dense first layers.
#pragma once

#include "model/config.h"

namespace fp {

inline ModelConfig deepseek_small_config(int64_t layers, int64_t q_lora_rank, int64_t first_k_dense) {
  ModelConfig m;
  m.model_type = ModelType::ModelType_deepseek_v3;
  m.hidden_size = 24, m.num_hidden_layers = layers, m.num_attention_heads = 4, m.num_key_value_heads = 4;
  m.q_lora_rank = q_lora_rank, m.kv_lora_rank = 10, m.qk_nope_head_dim = 6, m.qk_rope_head_dim = 4;
  m.v_head_dim = 5, m.head_dim = 4, m.rope_interleave = true;
  m.num_experts = 8, m.num_experts_per_tok = 2, m.moe_intermediate_size = 16, m.vocab_size = 50;
  m.n_group = 4, m.topk_group = 2, m.routed_scaling_factor = 2.5, m.n_shared_experts = 1;
  m.first_k_dense_replace = first_k_dense, m.intermediate_size = 20, m.router_aux_loss_coef = 0;
  m.seed = 7;
  return m;
}

}  // namespace fp
