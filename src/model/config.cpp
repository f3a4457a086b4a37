#include "model/config.h"

#include <nlohmann/json.hpp>

#include <cmath>

#include "core/error.h"
#include "model/hf_config.h"

namespace fp {

namespace {
constexpr const char* kConfigHint = "see configs/tiny.toml for a complete, commented example";
}  // namespace


bool ModelConfig::layer_is_sparse(int64_t l) const {
  for (int64_t d : mlp_only_layers)
    if (d == l) return false;
  return decoder_sparse_step >= 1 && (l + 1) % decoder_sparse_step == 0;
}

int64_t ModelConfig::sparse_layer_count() const {
  int64_t n = 0;
  for (int64_t l = 0; l < num_hidden_layers; ++l) n += layer_is_sparse(l) ? 1 : 0;
  return n;
}

int64_t ModelConfig::param_count() const {
  const int64_t H = hidden_size, hd = head_dim;
  int64_t attn = 2 * H;                                                     // two RMSNorms
  attn += num_attention_heads * hd * H * 2 + num_key_value_heads * hd * H * 2;  // q, o, k, v
  attn += 2 * hd;                                                           // q_norm, k_norm
  if (attention_bias) attn += (num_attention_heads + 2 * num_key_value_heads) * hd + H;  // q, k, v, o biases
  const int64_t sparse = sparse_layer_count();
  const int64_t moe = num_experts * H + num_experts * 3 * moe_intermediate_size * H;  // router, experts
  const int64_t dense = 3 * intermediate_size * H;                                 // one SwiGLU MLP
  return (tie_word_embeddings ? 1 : 2) * vocab_size * H + H + num_hidden_layers * attn + sparse * moe +
         (num_hidden_layers - sparse) * dense;
}

std::string RoutingProfile::str() const {
  switch (kind) {
    case Kind::Kind_router: return "router";
    case Kind::Kind_balanced: return "balanced";
    case Kind::Kind_hot: return fmt::format("hot:{}:{}", hot_fraction, hot_experts);
  }
  return "?";
}

RoutingProfile routing_profile_parse(const std::string& s, const std::string& key) {
  RoutingProfile p;
  const std::string hint = "write \"router\" (the model's router), \"balanced\", or \"hot:R:H\" (fraction R of the "
                           "tokens to the first H experts), e.g. \"hot:0.95:16\"";
  if (s == "router") return p;
  if (s == "balanced") {
    p.kind = RoutingProfile::Kind::Kind_balanced;
    return p;
  }
  if (s.rfind("hot:", 0) == 0) {
    const size_t c2 = s.find(':', 4);
    FP_CHECK(c2 != std::string::npos, hint, "{} = \"{}\": expected hot:R:H", key, s);
    try {
      size_t used = 0;
      p.hot_fraction = std::stod(s.substr(4, c2 - 4), &used);
      FP_CHECK(used == c2 - 4, hint, "{} = \"{}\": R is not a number", key, s);
      p.hot_experts = std::stoll(s.substr(c2 + 1), &used);
      FP_CHECK(used == s.size() - c2 - 1, hint, "{} = \"{}\": H is not an integer", key, s);
    } catch (const std::logic_error&) {
      throw Error(fmt::format("{} = \"{}\": R and H must be numbers", key, s), hint);
    }
    FP_CHECK(p.hot_fraction >= 0 && p.hot_fraction <= 1, hint, "{} = \"{}\": R must lie in [0, 1]", key, s);
    FP_CHECK(p.hot_experts >= 1, hint, "{} = \"{}\": H must be at least 1", key, s);
    p.kind = RoutingProfile::Kind::Kind_hot;
    return p;
  }
  throw Error(fmt::format("{} = \"{}\" is not a routing profile", key, s), hint);
}

void model_config_validate(const ModelConfig& m, const std::string& src) {
  auto positive = [&](const char* key, int64_t v) {
    FP_CHECK(v >= 1, kConfigHint, "{}: model.{} = {} must be at least 1", src, key, v);
  };
  positive("hidden_size", m.hidden_size);
  positive("num_hidden_layers", m.num_hidden_layers);
  positive("num_attention_heads", m.num_attention_heads);
  positive("num_key_value_heads", m.num_key_value_heads);
  positive("head_dim", m.head_dim);
  positive("num_experts", m.num_experts);
  positive("num_experts_per_tok", m.num_experts_per_tok);
  positive("moe_intermediate_size", m.moe_intermediate_size);
  positive("vocab_size", m.vocab_size);
  FP_CHECK(m.num_attention_heads % m.num_key_value_heads == 0,
           "grouped-query attention shares each key/value head among an equal number of query heads",
           "{}: model.num_attention_heads = {} is not a multiple of model.num_key_value_heads = {}", src,
           m.num_attention_heads, m.num_key_value_heads);
  FP_CHECK(m.head_dim % 2 == 0, "rotary embeddings rotate pairs of dimensions", "{}: model.head_dim = {} must be even",
           src, m.head_dim);
  FP_CHECK(m.num_experts_per_tok <= m.num_experts, "each token picks k distinct experts",
           "{}: model.num_experts_per_tok = {} exceeds model.num_experts = {}", src, m.num_experts_per_tok,
           m.num_experts);
  FP_CHECK(m.vocab_size <= 2147483647, kConfigHint, "{}: model.vocab_size = {} does not fit token ids (int32)", src,
           m.vocab_size);
  FP_CHECK(std::isfinite(m.rope_theta) && m.rope_theta > 0, kConfigHint, "{}: model.rope_theta = {} must be > 0", src,
           m.rope_theta);
  FP_CHECK(std::isfinite(m.rms_norm_eps) && m.rms_norm_eps > 0, kConfigHint, "{}: model.rms_norm_eps = {} must be > 0",
           src, m.rms_norm_eps);
  FP_CHECK(std::isfinite(m.router_aux_loss_coef) && m.router_aux_loss_coef >= 0, kConfigHint,
           "{}: model.router_aux_loss_coef = {} must be >= 0", src, m.router_aux_loss_coef);
  FP_CHECK(m.sliding_window >= 0, "0 is full causal attention; W > 0 lets each query see its last W positions",
           "{}: model.sliding_window = {} must be >= 0", src, m.sliding_window);
  FP_CHECK(m.decoder_sparse_step >= 1, "1 makes every layer a MoE layer; s makes every s-th one",
           "{}: model.decoder_sparse_step = {} must be at least 1", src, m.decoder_sparse_step);
  for (int64_t l : m.mlp_only_layers)
    FP_CHECK(l >= 0 && l < m.num_hidden_layers, "mlp_only_layers lists layer indices 0 .. num_hidden_layers - 1",
             "{}: model.mlp_only_layers holds {}, outside 0 .. {}", src, l, m.num_hidden_layers - 1);
  FP_CHECK(m.sparse_layer_count() >= 1, "flatpeak trains MoE models: keep at least one MoE layer",
           "{}: mlp_only_layers and decoder_sparse_step = {} leave no MoE layer", src, m.decoder_sparse_step);
  if (m.sparse_layer_count() < m.num_hidden_layers)
    FP_CHECK(m.intermediate_size >= 1, "a dense layer's MLP has width intermediate_size",
             "{}: model.intermediate_size = {} must be at least 1 when a layer is dense", src, m.intermediate_size);
}

std::string model_config_hf_json(const ModelConfig& m) {
  nlohmann::ordered_json j = {{"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"}};
  model_keys_visit(m, [&](const char* key, const auto& v) { j[key] = v; });  // the architecture
  // In Hugging Face's spelling: intermediate_size is inert when every layer is sparse, and the window is
  // use_sliding_window + sliding_window (max_window_layers 0: every layer, as transformers 5.x computes
  // it; Note [Sliding window] in model/hf_config.cpp).
  const bool dense = m.sparse_layer_count() < m.num_hidden_layers;
  j.update(nlohmann::ordered_json{
      {"intermediate_size", dense ? m.intermediate_size : m.moe_intermediate_size},
      {"mlp_only_layers", m.mlp_only_layers},
      {"rope_scaling", rope_scaling_json(m.rope_scaling)},
      {"output_router_logits", true},
      {"hidden_act", "silu"},
      {"attention_dropout", 0.0},
      {"use_sliding_window", m.sliding_window > 0},
      {"sliding_window", m.sliding_window > 0 ? nlohmann::ordered_json(m.sliding_window) : nlohmann::ordered_json()},
      {"max_window_layers", m.sliding_window > 0 ? 0 : m.num_hidden_layers},
      // dynamic RoPE reads it; otherwise inert
      {"max_position_embeddings", m.rope_scaling.kind == RopeScaling::Kind::Kind_dynamic
                                      ? m.rope_scaling.original_max_position_embeddings
                                      : int64_t{1} << 20},
      {"initializer_range", 0.02},
      {"torch_dtype", "float32"},
      {"use_cache", true},
  });
  return j.dump(2);
}

}  // namespace fp
