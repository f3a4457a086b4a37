// Model configuration: the Qwen3-MoE architecture with Hugging Face key names ([model] of a run
// config, see train/run_config.h), and routing profiles.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fp {

struct ModelConfig {
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
  double rms_norm_eps = 1e-6;
  bool norm_topk_prob = true;
  double router_aux_loss_coef = 0.001;
  uint64_t seed = 0;

  // Parameter count of the whole model.
  int64_t param_count() const;
};

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

// Hugging Face config.json for Qwen3MoeForCausalLM (model_type qwen3_moe, untied embeddings).
std::string model_config_hf_json(const ModelConfig& m);

}  // namespace fp
