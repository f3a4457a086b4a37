// The ModelConfig of a test case's shape: any struct with the fields H, L, nh, nkv, hd, E, k, I, V
// (hidden, layers, heads, KV heads, head dim, experts, top-k, expert width, vocabulary).
#pragma once

#include "model/config.h"

namespace fp {

template <class Shape>
ModelConfig case_model(const Shape& s, double aux_coef = 0.01, uint64_t seed = 5) {
  ModelConfig m;
  m.hidden_size = s.H;
  m.num_hidden_layers = s.L;
  m.num_attention_heads = s.nh;
  m.num_key_value_heads = s.nkv;
  m.head_dim = s.hd;
  m.num_experts = s.E;
  m.num_experts_per_tok = s.k;
  m.moe_intermediate_size = s.I;
  m.vocab_size = s.V;
  m.router_aux_loss_coef = aux_coef;
  m.seed = seed;
  return m;
}

}  // namespace fp
