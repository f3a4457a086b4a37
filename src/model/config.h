// Model configuration: the Qwen3-MoE, DeepSeek-V3 and gpt-oss architectures with Hugging Face key names
// ([model] of a run config, see train/run_config.h), and routing profiles.
//
// Note [Two architectures, one layer]: model_type "qwen3_moe" (Qwen3MoeForCausalLM), "deepseek_v3"
// (DeepseekV3ForCausalLM; DeepSeek-V3, R1 and Kimi-K2) and "gpt_oss" (GptOssForCausalLM) share the
// decoder layer's frame (two RMSNorms, attention, a MoE or dense MLP, the residuals) and differ in three
// places, each chosen by model_type:
//   attention  qwen3_moe: GQA with per-head q/k RMSNorm; deepseek_v3: multi-head latent attention (MLA:
//              q_lora_rank, kv_lora_rank, qk_nope/qk_rope/v head widths, one RoPE key shared by the heads);
//              gpt_oss: GQA without q/k norms, with biases, a learned sink logit per head in every softmax
//              (Note [Attention sinks] in ops/attention.h), and per layer a sliding window or full
//              attention (layer_types)
//   router     qwen3_moe: softmax top-k; deepseek_v3: sigmoid scores, experts chosen on scores +
//              e_score_correction_bias within the topk_group best of n_group groups, weights the scores
//              (renormalised with norm_topk_prob) times routed_scaling_factor (Note [Sigmoid routing]);
//              gpt_oss: a linear layer with a bias, top-k of the logits, softmax over the k chosen (the
//              softmax top-k renormalised, norm_topk_prob = true)
//   MLP        deepseek_v3 adds n_shared_experts shared experts (one SwiGLU of width n_shared_experts x
//              moe_intermediate_size on every token, never dispatched); its dense layers are the first
//              first_k_dense_replace ones (qwen3_moe: mlp_only_layers and decoder_sparse_step); gpt_oss's
//              experts have biases and the clamped SwiGLU (Note [The clamped SwiGLU] in ops/swiglu.h), and
//              every layer is a MoE layer
// A key of one architecture in another's config is refused by name (model_config_validate).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fp {

// RoPE scaling (Hugging Face's rope_scaling / rope_parameters; model/rope_scaling.h computes the
// frequencies). Values left at 0 take transformers' defaults there.
struct RopeScaling {
  enum class Kind { Kind_default, Kind_linear, Kind_yarn, Kind_llama3, Kind_dynamic };
  Kind kind = Kind::Kind_default;
  double factor = 1;                         // linear, yarn, llama3, dynamic
  int64_t original_max_position_embeddings = 0;  // yarn, llama3; dynamic: the model's max_position_embeddings,
                                                 // past which the base grows (yarn's and dynamic's default,
                                                 // max_position_embeddings, is filled in on parsing)
  double attention_factor = 0;               // yarn: 0 = from factor, mscale, mscale_all_dim
  double beta_fast = 0, beta_slow = 0;       // yarn: 0 = 32, 1
  double mscale = 0, mscale_all_dim = 0;     // yarn (DeepSeek's form)
  bool truncate = true;                      // yarn: round the correction range to whole dimensions
  double low_freq_factor = 0, high_freq_factor = 0;  // llama3 (required)
  bool operator==(const RopeScaling&) const = default;
};
// "default", "linear", "yarn", "llama3", "dynamic".
const char* rope_kind_name(RopeScaling::Kind k);

enum class ModelType { ModelType_qwen3_moe, ModelType_deepseek_v3, ModelType_gpt_oss };
// "qwen3_moe", "deepseek_v3", "gpt_oss".
const char* model_type_name(ModelType t);

struct ModelConfig {
  ModelType model_type = ModelType::ModelType_qwen3_moe;
  int64_t hidden_size = 0;            // H
  int64_t num_hidden_layers = 0;      // L
  int64_t num_attention_heads = 0;    // nh
  int64_t num_key_value_heads = 0;    // nkv
  int64_t head_dim = 0;               // hd
  int64_t num_experts = 0;            // E
  int64_t num_experts_per_tok = 0;    // k
  int64_t moe_intermediate_size = 0;  // I
  int64_t vocab_size = 0;             // V
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-6;
  bool norm_topk_prob = true;
  double router_aux_loss_coef = 0.001;
  // Hugging Face's switches beyond the plain Qwen3-MoE layer (docs/models.md).
  bool attention_bias = false;       // biases on q_proj, k_proj, v_proj and o_proj
  bool tie_word_embeddings = false;  // lm_head is model.embed_tokens (one parameter, one gradient)
  // Sliding-window attention on every layer (use_sliding_window): query i sees keys j with
  // i - sliding_window < j <= i. 0: full causal attention.
  int64_t sliding_window = 0;
  // Dense layers: layer l is a MoE layer unless l is in mlp_only_layers or (l + 1) % decoder_sparse_step
  // != 0; a dense layer's MLP is one SwiGLU of width intermediate_size (Qwen3MoeMLP).
  std::vector<int64_t> mlp_only_layers;
  int64_t decoder_sparse_step = 1;
  int64_t intermediate_size = 0;
  // deepseek_v3 (Note [Two architectures, one layer]); zero / one / false under qwen3_moe.
  int64_t q_lora_rank = 0;         // 0: q_proj (Hugging Face's null); else q_a_proj, q_a_layernorm, q_b_proj
  int64_t kv_lora_rank = 0;        // the compressed key/value latent (kv_a_proj_with_mqa, kv_a_layernorm)
  int64_t qk_nope_head_dim = 0;    // the per-head key/query part without RoPE
  int64_t qk_rope_head_dim = 0;    // the RoPE part (head_dim, the RoPE width, equals it)
  int64_t v_head_dim = 0;          // value (and attention output) head width
  bool rope_interleave = false;    // RoPE rotates adjacent pairs (2i, 2i+1) instead of (i, i + d/2)
  int64_t n_shared_experts = 0;    // shared experts of a MoE layer (one SwiGLU of n_shared_experts x I)
  int64_t n_group = 1;             // expert groups of the group-limited top-k
  int64_t topk_group = 1;          // groups a token may pick its experts from
  double routed_scaling_factor = 1.0;  // the routed experts' weights are multiplied by it
  int64_t first_k_dense_replace = 0;   // layers 0 .. first_k_dense_replace - 1 are dense
  // gpt_oss (Note [Two architectures, one layer]); empty / zero under the others.
  // Per layer "sliding_attention" (window sliding_window) or "full_attention"; empty: sliding_window on
  // every layer (qwen3_moe's use_sliding_window).
  std::vector<std::string> layer_types;
  double swiglu_alpha = 0;  // the clamped SwiGLU's sigmoid gain (1.702); 0: the plain SwiGLU
  double swiglu_limit = 0;  // its clamp (7.0)
  uint64_t seed = 0;

  bool is_deepseek() const { return model_type == ModelType::ModelType_deepseek_v3; }
  bool is_gpt_oss() const { return model_type == ModelType::ModelType_gpt_oss; }
  // Per-head q/k RMSNorm (qwen3_moe).
  bool qk_norm() const { return model_type == ModelType::ModelType_qwen3_moe; }
  // gpt_oss: a learned sink logit per head (self_attn.sinks), a bias on the router (mlp.router.bias) and on
  // every expert projection.
  bool attention_sinks() const { return is_gpt_oss(); }
  bool router_bias() const { return is_gpt_oss(); }
  bool expert_bias() const { return is_gpt_oss(); }
  // The attention window of layer l (0: full causal attention).
  int64_t layer_window(int64_t l) const {
    if (layer_types.empty()) return sliding_window;
    return layer_types[static_cast<size_t>(l)] == "sliding_attention" ? sliding_window : 0;
  }
  // Whether the router is DeepSeek's sigmoid router with e_score_correction_bias (Note [Sigmoid routing]).
  bool router_sigmoid() const { return is_deepseek(); }
  // Query/key and value head widths of the attention kernels (MLA: nope + rope, v_head_dim; GQA: head_dim).
  int64_t qk_head_dim() const { return is_deepseek() ? qk_nope_head_dim + qk_rope_head_dim : head_dim; }
  int64_t value_head_dim() const { return is_deepseek() ? v_head_dim : head_dim; }
  // Key/value heads the attention kernels see (MLA expands its latent to one key and value per query head).
  int64_t attention_kv_heads() const { return is_deepseek() ? num_attention_heads : num_key_value_heads; }

  // Whether layer l has the MoE block (router and experts) or a dense MLP.
  bool layer_is_sparse(int64_t l) const;
  // How many layers are MoE layers.
  int64_t sparse_layer_count() const;

  // Parameter count of the whole model.
  int64_t param_count() const;
};

// The architecture's scalar keys under their Hugging Face names, in config.json order: f(name, member)
// for each (int64_t, double or bool members; rope_scaling and seed are not scalars of the file; model_type
// is visited by the callers that read it as a string). One list for the run config's schema, --init-from's
// filling in and the differences a resume reports.
template <class M, class F>  // M: ModelConfig or const ModelConfig
void model_keys_visit(M& m, F&& f) {
  f("hidden_size", m.hidden_size);
  f("num_hidden_layers", m.num_hidden_layers);
  f("num_attention_heads", m.num_attention_heads);
  f("num_key_value_heads", m.num_key_value_heads);
  f("head_dim", m.head_dim);
  f("num_experts", m.num_experts);
  f("num_experts_per_tok", m.num_experts_per_tok);
  f("moe_intermediate_size", m.moe_intermediate_size);
  f("vocab_size", m.vocab_size);
  f("rope_theta", m.rope_theta);
  f("rms_norm_eps", m.rms_norm_eps);
  f("norm_topk_prob", m.norm_topk_prob);
  f("router_aux_loss_coef", m.router_aux_loss_coef);
  // Optional (model_key_optional): their defaults are the plain Qwen3-MoE layer.
  f("attention_bias", m.attention_bias);
  f("tie_word_embeddings", m.tie_word_embeddings);
  f("sliding_window", m.sliding_window);
  f("decoder_sparse_step", m.decoder_sparse_step);
  f("intermediate_size", m.intermediate_size);
  // deepseek_v3 (Note [Two architectures, one layer]).
  f("q_lora_rank", m.q_lora_rank);
  f("kv_lora_rank", m.kv_lora_rank);
  f("qk_nope_head_dim", m.qk_nope_head_dim);
  f("qk_rope_head_dim", m.qk_rope_head_dim);
  f("v_head_dim", m.v_head_dim);
  f("rope_interleave", m.rope_interleave);
  f("n_shared_experts", m.n_shared_experts);
  f("n_group", m.n_group);
  f("topk_group", m.topk_group);
  f("routed_scaling_factor", m.routed_scaling_factor);
  f("first_k_dense_replace", m.first_k_dense_replace);
  // gpt_oss.
  f("swiglu_alpha", m.swiglu_alpha);
  f("swiglu_limit", m.swiglu_limit);
}
// Keys of model_keys_visit a run config may leave out (and mlp_only_layers, which is a list).
inline bool model_key_optional(std::string_view key) {
  for (const char* k : {"attention_bias", "tie_word_embeddings", "sliding_window", "decoder_sparse_step",
                        "intermediate_size", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                        "v_head_dim", "rope_interleave", "n_shared_experts", "n_group", "topk_group",
                        "routed_scaling_factor", "first_k_dense_replace", "swiglu_alpha", "swiglu_limit"})
    if (key == k) return true;
  return false;
}
// The keys of model_keys_visit only model_type "gpt_oss" reads (and layer_types, a list).
inline bool model_key_gpt_oss_only(std::string_view key) { return key == "swiglu_alpha" || key == "swiglu_limit"; }
// The keys of model_keys_visit only model_type "deepseek_v3" reads (Note [Two architectures, one layer]).
inline bool model_key_deepseek_only(std::string_view key) {
  for (const char* k : {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                        "rope_interleave", "n_shared_experts", "n_group", "topk_group", "routed_scaling_factor",
                        "first_k_dense_replace"})
    if (key == k) return true;
  return false;
}
// Parses "qwen3_moe", "deepseek_v3" or "gpt_oss"; throws fp::Error naming `key`.
ModelType model_type_parse(const std::string& s, const std::string& key = "model.model_type");

// Which experts the tokens go to. "router": the model's own router (cpu only); "balanced" and
// "hot:R:H" override the router's choice (weights are still the router's probabilities at the chosen
// experts), so that cpu and meta runs allocate identically and benchmarks control the skew.
struct RoutingProfile {
  enum class Kind { Kind_router, Kind_balanced, Kind_hot };
  Kind kind = Kind::Kind_router;
  double hot_fraction = 0;  // R: fraction of tokens sent to the hot experts
  int64_t hot_experts = 0;  // H: number of hot experts
  std::string str() const;
};
// Parses "router", "balanced", "hot:0.95:16". Throws fp::Error naming `key`.
RoutingProfile routing_profile_parse(const std::string& s, const std::string& key = "moe.routing_profile");

// Checks the relations between model keys (also used for configs built in code).
void model_config_validate(const ModelConfig& m, const std::string& source);

// Hugging Face config.json for Qwen3MoeForCausalLM (model_type qwen3_moe), DeepseekV3ForCausalLM or
// GptOssForCausalLM.
std::string model_config_hf_json(const ModelConfig& m);

}  // namespace fp
