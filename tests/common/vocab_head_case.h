// What the Ring-DTP tests share (tests/model/test_ring_dtp.cpp on one rank, tests/dist/ring_dtp_case.cpp
// under mpirun): a model that is only the head, and bitwise comparison. Header-only, test code only.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "model/config.h"

namespace fp::head_test {

// A model with no layers: embedding, final norm and lm_head (H hidden, V vocabulary).
inline ModelConfig head_config(int64_t H, int64_t V) {
  ModelConfig m;
  m.hidden_size = H;
  m.num_hidden_layers = 0;
  m.num_attention_heads = 1;
  m.num_key_value_heads = 1;
  m.head_dim = 8;
  m.num_experts = 1;
  m.num_experts_per_tok = 1;
  m.moe_intermediate_size = 8;
  m.vocab_size = V;
  m.rope_theta = 10000;
  m.rms_norm_eps = 1e-6;
  m.norm_topk_prob = true;
  m.router_aux_loss_coef = 0;
  m.seed = 3;
  return m;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace fp::head_test
