// Parameters with Hugging Face names (Qwen3MoeForCausalLM), each with its gradient.
//
// Legend: H hidden, V vocabulary, nh/nkv query/key-value heads, hd head_dim, E experts,
// I expert FFN width. Linear weights are stored (out, in) like nn.Linear.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"

namespace fp {

struct Param {
  std::string name;  // Hugging Face tensor name
  Tensor w;          // category params
  Tensor g;          // category grads, accumulated (+=) by backward
};

struct LayerParams {
  Param* input_layernorm;           // (H)
  Param* q_proj;                    // (nh*hd, H)
  Param* k_proj;                    // (nkv*hd, H)
  Param* v_proj;                    // (nkv*hd, H)
  Param* o_proj;                    // (H, nh*hd)
  Param* q_norm;                    // (hd)
  Param* k_norm;                    // (hd)
  Param* post_attention_layernorm;  // (H)
  Param* gate;                      // (E, H) the router
  std::vector<Param*> gate_proj;    // E x (I, H)
  std::vector<Param*> up_proj;      // E x (I, H)
  std::vector<Param*> down_proj;    // E x (H, I)
};

class ParamStore {
 public:
  // Allocates every weight (params) and gradient (grads) on the backend, in HF order.
  ParamStore(const ModelConfig& cfg, Backend& be);

  // cpu: linear weights and embeddings ~ N(0, 0.02) (HF initializer_range), norms = 1; deterministic
  // in seed. meta: nothing to write.
  void init(uint64_t seed);
  void zero_grads();

  std::deque<Param>& all() { return params_; }
  const std::deque<Param>& all() const { return params_; }
  // nullptr when there is no such name.
  Param* find(const std::string& name);

  Param* embed_tokens = nullptr;  // (V, H)
  Param* norm = nullptr;          // (H)
  Param* lm_head = nullptr;       // (V, H)
  std::vector<LayerParams> layers;

 private:
  Param* add(const std::string& name, const Shape& shape);

  Backend& be_;
  const ModelConfig cfg_;
  std::deque<Param> params_;  // a deque: Param* stay valid as it grows
};

}  // namespace fp
