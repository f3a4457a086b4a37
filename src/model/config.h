// Run configuration, read from TOML (configs/*.toml) with command-line overrides (--set key=value).
//
//   [model]  Qwen3-MoE architecture, Hugging Face key names; every key required.
//   [train]  batch_size, seq_len (tokens per sequence), steps.
//   [moe]    routing_profile = "router" | "balanced" | "hot:R:H"   (DESIGN.md, routing profiles)
//
// Unknown tables or keys, missing keys, wrong types and impossible values are fp::Error naming the
// key (e.g. "model.num_attention_heads = 6 is not a multiple of model.num_key_value_heads = 4").
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

struct TrainConfig {
  int64_t batch_size = 1;  // sequences per step (global)
  int64_t seq_len = 0;     // T
  int64_t steps = 1;
};

struct MoeConfig {
  RoutingProfile routing_profile;
};

struct RunConfig {
  ModelConfig model;
  TrainConfig train;
  MoeConfig moe;
  std::string source;  // file it came from, for messages
};

// Reads path and applies overrides ("model.hidden_size=128", "moe.routing_profile=\"hot:0.9:2\"" or
// without quotes for strings). Validates everything; throws fp::Error naming the file and key.
RunConfig config_load(const std::string& path, const std::vector<std::string>& overrides = {});
// The same from TOML text (tests).
RunConfig config_parse(const std::string& toml_text, const std::string& source,
                       const std::vector<std::string>& overrides = {});
// Checks the relations between model keys (also used for configs built in code).
void model_config_validate(const ModelConfig& m, const std::string& source);

// Hugging Face config.json for Qwen3MoeForCausalLM (model_type qwen3_moe, untied embeddings).
std::string model_config_hf_json(const ModelConfig& m);

}  // namespace fp
