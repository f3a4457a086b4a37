#include "model/params.h"

#include "core/rng.h"

namespace fp {

ParamStore::ParamStore(const ModelConfig& cfg, Backend& be) : be_(be), cfg_(cfg) {
  const int64_t H = cfg.hidden_size, hd = cfg.head_dim, I = cfg.moe_intermediate_size;
  embed_tokens = add("model.embed_tokens.weight", {cfg.vocab_size, H});
  layers.resize(cfg.num_hidden_layers);
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    LayerParams& l = layers[i];
    l.input_layernorm = add(p + "input_layernorm.weight", {H});
    l.q_proj = add(p + "self_attn.q_proj.weight", {cfg.num_attention_heads * hd, H});
    l.k_proj = add(p + "self_attn.k_proj.weight", {cfg.num_key_value_heads * hd, H});
    l.v_proj = add(p + "self_attn.v_proj.weight", {cfg.num_key_value_heads * hd, H});
    l.o_proj = add(p + "self_attn.o_proj.weight", {H, cfg.num_attention_heads * hd});
    l.q_norm = add(p + "self_attn.q_norm.weight", {hd});
    l.k_norm = add(p + "self_attn.k_norm.weight", {hd});
    l.post_attention_layernorm = add(p + "post_attention_layernorm.weight", {H});
    l.gate = add(p + "mlp.gate.weight", {cfg.num_experts, H});
    for (int64_t e = 0; e < cfg.num_experts; ++e) {
      const std::string q = fmt::format("{}mlp.experts.{}.", p, e);
      l.gate_proj.push_back(add(q + "gate_proj.weight", {I, H}));
      l.up_proj.push_back(add(q + "up_proj.weight", {I, H}));
      l.down_proj.push_back(add(q + "down_proj.weight", {H, I}));
    }
  }
  norm = add("model.norm.weight", {H});
  lm_head = add("lm_head.weight", {cfg.vocab_size, H});
}

Param* ParamStore::add(const std::string& name, const Shape& shape) {
  Param& p = params_.emplace_back();
  p.name = name;
  p.w = be_.alloc_f32(Category::Category_params, shape, name);
  p.g = be_.alloc_f32(Category::Category_grads, shape, name + ".grad");
  return &p;
}

Param* ParamStore::find(const std::string& name) {
  for (Param& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

void ParamStore::init(uint64_t seed) {
  if (!be_.computes()) return;
  Rng rng(seed);
  std::vector<float> host;
  for (Param& p : params_) {
    host.resize(static_cast<size_t>(p.w.numel()));
    const bool is_norm = p.w.shape().rank == 1;
    for (float& v : host) v = is_norm ? 1.0f : static_cast<float>(0.02 * rng.normal());
    be_.copy_from_host(p.w.data(), host.data(), p.w.bytes());
  }
  zero_grads();
}

void ParamStore::zero_grads() {
  for (Param& p : params_) be_.kernels().fill(p.g.f32(), 0.0f, p.g.numel());
}

}  // namespace fp
