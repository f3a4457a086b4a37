#include "model/config.h"

#include <nlohmann/json.hpp>

#include <cmath>

#include "core/error.h"
#include "model/hf_config.h"

namespace fp {

namespace {
constexpr const char* kConfigHint = "see configs/tiny.toml for a complete, commented example";
}  // namespace


const char* model_type_name(ModelType t) {
  switch (t) {
    case ModelType::ModelType_deepseek_v3:
      return "deepseek_v3";
    case ModelType::ModelType_gpt_oss:
      return "gpt_oss";
    case ModelType::ModelType_qwen3_moe:
      break;
  }
  return "qwen3_moe";
}

ModelType model_type_parse(const std::string& s, const std::string& key) {
  if (s == "qwen3_moe") return ModelType::ModelType_qwen3_moe;
  if (s == "deepseek_v3") return ModelType::ModelType_deepseek_v3;
  if (s == "gpt_oss") return ModelType::ModelType_gpt_oss;
  throw Error(fmt::format("{} = \"{}\" is not implemented", key, s),
              "flatpeak computes \"qwen3_moe\" (Qwen3MoeForCausalLM), \"deepseek_v3\" (DeepseekV3ForCausalLM: "
              "DeepSeek-V3, R1, Kimi-K2) and \"gpt_oss\" (GptOssForCausalLM)");
}

bool ModelConfig::layer_is_sparse(int64_t l) const {
  if (l < first_k_dense_replace) return false;
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
  const int64_t H = hidden_size, hd = head_dim, nh = num_attention_heads;
  int64_t attn = 2 * H;  // two RMSNorms
  if (is_deepseek()) {
    const int64_t dqk = qk_head_dim();
    attn += q_lora_rank > 0 ? q_lora_rank * H + q_lora_rank + nh * dqk * q_lora_rank : nh * dqk * H;  // queries
    attn += (kv_lora_rank + qk_rope_head_dim) * H + kv_lora_rank;  // kv_a_proj_with_mqa, kv_a_layernorm
    attn += nh * (qk_nope_head_dim + v_head_dim) * kv_lora_rank;   // kv_b_proj
    attn += H * nh * v_head_dim;                                    // o_proj
  } else {
    attn += nh * hd * H * 2 + num_key_value_heads * hd * H * 2;  // q, o, k, v
    if (qk_norm()) attn += 2 * hd;                               // q_norm, k_norm
    if (attention_bias) attn += (nh + 2 * num_key_value_heads) * hd + H;  // q, k, v, o biases
    if (attention_sinks()) attn += nh;                                    // sinks
  }
  const int64_t sparse = sparse_layer_count();
  int64_t moe = num_experts * H + num_experts * 3 * moe_intermediate_size * H;  // router, experts
  if (router_sigmoid()) moe += num_experts;                                       // e_score_correction_bias
  if (router_bias()) moe += num_experts;                                          // mlp.router.bias
  if (expert_bias()) moe += num_experts * (2 * moe_intermediate_size + H);        // gate, up, down biases
  moe += 3 * n_shared_experts * moe_intermediate_size * H;                        // shared experts
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

namespace {
// gpt_oss's own relations: its router is the renormalised softmax top-k, every layer is a MoE layer, and
// each layer's attention is named by layer_types.
void gpt_oss_validate(const ModelConfig& m, const std::string& src) {
  auto unused = [&](const char* key, bool at_default) {
    FP_CHECK(at_default, "gpt_oss: every layer is a MoE layer of num_experts experts of moe_intermediate_size",
             "{}: model.{} is set, but model_type \"gpt_oss\" does not read it", src, key);
  };
  unused("mlp_only_layers", m.mlp_only_layers.empty());
  unused("decoder_sparse_step", m.decoder_sparse_step == 1);
  unused("intermediate_size", m.intermediate_size == 0);
  FP_CHECK(m.norm_topk_prob,
           "gpt-oss's router takes the softmax over the k chosen logits: the softmax top-k renormalised",
           "{}: model.norm_topk_prob = false is not gpt_oss's router", src);
  constexpr const char* kClamp =
      "gpt-oss's experts: out = (clamp(up, -limit, limit) + 1) * g sigmoid(alpha g), g = "
      "min(gate, limit); transformers' defaults alpha 1.702, limit 7.0";
  FP_CHECK(std::isfinite(m.swiglu_alpha) && m.swiglu_alpha > 0, kClamp, "{}: model.swiglu_alpha = {} must be > 0", src,
           m.swiglu_alpha);
  FP_CHECK(std::isfinite(m.swiglu_limit) && m.swiglu_limit > 0, kClamp, "{}: model.swiglu_limit = {} must be > 0", src,
           m.swiglu_limit);
  constexpr const char* kTypes =
      "layer_types names each layer's attention: \"sliding_attention\" (the last "
      "sliding_window positions) or \"full_attention\"";
  FP_CHECK(m.layer_types.empty() || static_cast<int64_t>(m.layer_types.size()) == m.num_hidden_layers, kTypes,
           "{}: model.layer_types has {} entries for num_hidden_layers = {}", src, m.layer_types.size(),
           m.num_hidden_layers);
  bool sliding = false;
  for (const std::string& t : m.layer_types) {
    FP_CHECK(t == "sliding_attention" || t == "full_attention", kTypes, "{}: model.layer_types holds \"{}\"", src, t);
    sliding = sliding || t == "sliding_attention";
  }
  FP_CHECK(!sliding || m.sliding_window >= 1, kTypes, "{}: a sliding_attention layer needs model.sliding_window >= 1",
           src);
}

// The keys of one architecture (Note [Two architectures, one layer]): those of the other are refused by
// name, and DeepSeek-V3's relations are checked.
void model_config_validate_architecture(const ModelConfig& m, const std::string& src) {
  const char* type = model_type_name(m.model_type);
  // A key another architecture reads, set here: refused by name (it would be ignored otherwise).
  auto unused = [&](const char* key, bool at_default, const char* owner) {
    FP_CHECK(at_default, fmt::format("{} is a key of model_type \"{}\" (Note [Two architectures, one layer])", key, owner),
             "{}: model.{} is set, but model_type \"{}\" does not read it", src, key, type);
  };
  if (!m.is_gpt_oss()) {
    unused("swiglu_alpha", m.swiglu_alpha == 0, "gpt_oss");
    unused("swiglu_limit", m.swiglu_limit == 0, "gpt_oss");
    unused("layer_types", m.layer_types.empty(), "gpt_oss");
  }
  if (!m.is_deepseek()) {
    unused("q_lora_rank", m.q_lora_rank == 0, "deepseek_v3");
    unused("kv_lora_rank", m.kv_lora_rank == 0, "deepseek_v3");
    unused("qk_nope_head_dim", m.qk_nope_head_dim == 0, "deepseek_v3");
    unused("qk_rope_head_dim", m.qk_rope_head_dim == 0, "deepseek_v3");
    unused("v_head_dim", m.v_head_dim == 0, "deepseek_v3");
    unused("rope_interleave", !m.rope_interleave, "deepseek_v3");
    unused("n_shared_experts", m.n_shared_experts == 0, "deepseek_v3");
    unused("n_group", m.n_group == 1, "deepseek_v3");
    unused("topk_group", m.topk_group == 1, "deepseek_v3");
    unused("routed_scaling_factor", m.routed_scaling_factor == 1.0, "deepseek_v3");
    unused("first_k_dense_replace", m.first_k_dense_replace == 0, "deepseek_v3");
    if (m.is_gpt_oss()) gpt_oss_validate(m, src);
    return;
  }
  unused("mlp_only_layers", m.mlp_only_layers.empty(), "qwen3_moe");
  unused("decoder_sparse_step", m.decoder_sparse_step == 1, "qwen3_moe");
  unused("sliding_window", m.sliding_window == 0, "qwen3_moe");
  FP_CHECK(!m.attention_bias, "DeepSeek-V3's attention biases (q_a_proj, kv_a_proj_with_mqa, o_proj) are not implemented",
           "{}: model.attention_bias = true is not implemented for model_type \"deepseek_v3\"", src);
  constexpr const char* kMla = "multi-head latent attention: q/k heads of qk_nope_head_dim + qk_rope_head_dim, values of "
                               "v_head_dim, from latents of kv_lora_rank (and q_lora_rank, 0 for none)";
  for (auto [key, v] : {std::pair{"kv_lora_rank", m.kv_lora_rank}, {"qk_nope_head_dim", m.qk_nope_head_dim},
                        {"qk_rope_head_dim", m.qk_rope_head_dim}, {"v_head_dim", m.v_head_dim}})
    FP_CHECK(v >= 1, kMla, "{}: model.{} = {} must be at least 1", src, key, v);
  FP_CHECK(m.q_lora_rank >= 0, kMla, "{}: model.q_lora_rank = {} must be >= 0 (0: no query latent)", src, m.q_lora_rank);
  FP_CHECK(m.qk_rope_head_dim % 2 == 0, "rotary embeddings rotate pairs of dimensions",
           "{}: model.qk_rope_head_dim = {} must be even", src, m.qk_rope_head_dim);
  FP_CHECK(m.head_dim == m.qk_rope_head_dim, "under MLA head_dim is the RoPE width (transformers sets it so)",
           "{}: model.head_dim = {} must equal model.qk_rope_head_dim = {}", src, m.head_dim, m.qk_rope_head_dim);
  FP_CHECK(m.num_key_value_heads == m.num_attention_heads, "MLA expands its latent to a key and a value per query head",
           "{}: model.num_key_value_heads = {} must equal model.num_attention_heads = {}", src, m.num_key_value_heads,
           m.num_attention_heads);
  constexpr const char* kGroups = "n_group groups of num_experts / n_group experts; each token picks its k experts "
                                  "within the topk_group groups whose two best experts score highest";
  FP_CHECK(m.n_group >= 1 && m.num_experts % m.n_group == 0, kGroups,
           "{}: model.n_group = {} must divide model.num_experts = {}", src, m.n_group, m.num_experts);
  FP_CHECK(m.num_experts / m.n_group >= 2, kGroups, "{}: a group of {} / {} = {} experts has no two best (at least 2 per group)",
           src, m.num_experts, m.n_group, m.num_experts / m.n_group);
  FP_CHECK(m.topk_group >= 1 && m.topk_group <= m.n_group, kGroups, "{}: model.topk_group = {} must lie in 1 .. n_group = {}",
           src, m.topk_group, m.n_group);
  FP_CHECK(m.topk_group * (m.num_experts / m.n_group) >= m.num_experts_per_tok, kGroups,
           "{}: topk_group = {} groups of {} experts hold fewer than num_experts_per_tok = {}", src, m.topk_group,
           m.num_experts / m.n_group, m.num_experts_per_tok);
  FP_CHECK(std::isfinite(m.routed_scaling_factor) && m.routed_scaling_factor > 0, kGroups,
           "{}: model.routed_scaling_factor = {} must be > 0", src, m.routed_scaling_factor);
  FP_CHECK(m.n_shared_experts >= 0, "shared experts run on every token beside the routed ones",
           "{}: model.n_shared_experts = {} must be >= 0", src, m.n_shared_experts);
  FP_CHECK(m.first_k_dense_replace >= 0, "layers 0 .. first_k_dense_replace - 1 are dense",
           "{}: model.first_k_dense_replace = {} must be >= 0", src, m.first_k_dense_replace);
  FP_CHECK(m.router_aux_loss_coef == 0.0,
           "DeepSeek-V3 balances its experts without an auxiliary loss (e_score_correction_bias, moe.bias_update_rate); "
           "set router_aux_loss_coef = 0",
           "{}: model.router_aux_loss_coef = {} is not implemented for the sigmoid router of model_type \"deepseek_v3\"",
           src, m.router_aux_loss_coef);
}
}  // namespace

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
  model_config_validate_architecture(m, src);
}

namespace {
// DeepseekV3ForCausalLM's config.json: its own names for the expert count and the query latent (null
// for none); no head_dim (transformers derives it from qk_rope_head_dim), no Qwen3-MoE keys.
nlohmann::ordered_json deepseek_hf_json(const ModelConfig& m) {
  nlohmann::ordered_json j = {{"architectures", {"DeepseekV3ForCausalLM"}}, {"model_type", "deepseek_v3"}};
  const bool dense = m.sparse_layer_count() < m.num_hidden_layers;
  j.update(nlohmann::ordered_json{
      {"vocab_size", m.vocab_size},
      {"hidden_size", m.hidden_size},
      {"intermediate_size", dense ? m.intermediate_size : m.moe_intermediate_size},
      {"moe_intermediate_size", m.moe_intermediate_size},
      {"num_hidden_layers", m.num_hidden_layers},
      {"num_attention_heads", m.num_attention_heads},
      {"num_key_value_heads", m.num_key_value_heads},
      {"n_shared_experts", m.n_shared_experts},
      {"n_routed_experts", m.num_experts},
      {"routed_scaling_factor", m.routed_scaling_factor},
      {"kv_lora_rank", m.kv_lora_rank},
      {"q_lora_rank", m.q_lora_rank > 0 ? nlohmann::ordered_json(m.q_lora_rank) : nlohmann::ordered_json()},
      {"qk_rope_head_dim", m.qk_rope_head_dim},
      {"v_head_dim", m.v_head_dim},
      {"qk_nope_head_dim", m.qk_nope_head_dim},
      {"n_group", m.n_group},
      {"topk_group", m.topk_group},
      {"num_experts_per_tok", m.num_experts_per_tok},
      {"first_k_dense_replace", m.first_k_dense_replace},
      {"norm_topk_prob", m.norm_topk_prob},
      {"rms_norm_eps", m.rms_norm_eps},
      {"rope_theta", m.rope_theta},
      {"rope_scaling", rope_scaling_json(m.rope_scaling)},
      {"rope_interleave", m.rope_interleave},
      {"tie_word_embeddings", m.tie_word_embeddings},
      {"attention_bias", false},
      {"hidden_act", "silu"},
      {"attention_dropout", 0.0},
  });
  return j;
}

// GptOssForCausalLM's config.json as transformers 5 writes it: num_local_experts, intermediate_size the
// expert width, layer_types, rope_parameters, the clamped SwiGLU's two numbers. output_router_logits true: flatpeak
// always adds the load-balancing loss (docs/models.md), and so does transformers then.
nlohmann::ordered_json gpt_oss_hf_json(const ModelConfig& m) {
  nlohmann::ordered_json j = {{"architectures", {"GptOssForCausalLM"}}, {"model_type", "gpt_oss"}};
  // transformers 5's rope_parameters, default RoPE spelled out: GptOssConfig reads a missing or null one
  // as its YaRN default.
  nlohmann::ordered_json rope = {{"rope_type", "default"}};
  if (m.rope_scaling.kind != RopeScaling::Kind::Kind_default)
    rope = nlohmann::ordered_json::parse(rope_scaling_json(m.rope_scaling).dump());
  rope["rope_theta"] = m.rope_theta;
  std::vector<std::string> types = m.layer_types;
  if (types.empty()) types.assign(static_cast<size_t>(m.num_hidden_layers), "sliding_attention");
  j.update(nlohmann::ordered_json{
      {"vocab_size", m.vocab_size},
      {"hidden_size", m.hidden_size},
      {"intermediate_size", m.moe_intermediate_size},
      {"num_hidden_layers", m.num_hidden_layers},
      {"num_attention_heads", m.num_attention_heads},
      {"num_key_value_heads", m.num_key_value_heads},
      {"head_dim", m.head_dim},
      {"num_local_experts", m.num_experts},
      {"num_experts_per_tok", m.num_experts_per_tok},
      {"sliding_window", m.sliding_window > 0 ? nlohmann::ordered_json(m.sliding_window) : nlohmann::ordered_json()},
      {"layer_types", types},
      {"rms_norm_eps", m.rms_norm_eps},
      {"rope_parameters", rope},
      {"router_aux_loss_coef", m.router_aux_loss_coef},
      {"output_router_logits", true},
      {"swiglu_alpha", m.swiglu_alpha},
      {"swiglu_limit", m.swiglu_limit},
      {"attention_bias", m.attention_bias},
      {"tie_word_embeddings", m.tie_word_embeddings},
      {"hidden_act", "silu"},
      {"attention_dropout", 0.0},
  });
  return j;
}
}  // namespace

std::string model_config_hf_json(const ModelConfig& m) {
  nlohmann::ordered_json j;
  if (m.is_deepseek()) {
    j = deepseek_hf_json(m);
  } else if (m.is_gpt_oss()) {
    j = gpt_oss_hf_json(m);
  } else {
    j = {{"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"}};
    model_keys_visit(m, [&](const char* key, const auto& v) {  // the architecture, without the others' keys
      if (!model_key_deepseek_only(key) && !model_key_gpt_oss_only(key)) j[key] = v;
    });
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
    });
  }
  j.update(nlohmann::ordered_json{
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
