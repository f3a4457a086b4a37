// A Hugging Face config.json for Qwen3MoeForCausalLM, read strictly (docs/models.md).
//
// Note [Every config key is read or refused]: a checkpoint from the Hub or from transformers'
// save_pretrained carries keys that change the function the model computes (RoPE scaling, sliding
// windows, biases, tied embeddings, dense layers, the activation). Ignoring one gives logits that are
// wrong while the mean loss barely moves, so every key of the file falls in one of three groups:
//   - read: the architecture flatpeak computes (hidden_size, ..., norm_topk_prob), in both the
//     transformers 4.x and 5.x spellings (num_experts / num_local_experts; rope_theta / rope_parameters;
//     head_dim left out when it equals hidden_size / num_attention_heads);
//   - checked: a key whose value flatpeak computes only for one setting (hidden_act = "silu",
//     attention_bias = false, tie_word_embeddings = false, use_sliding_window = false, no
//     rope_scaling, every layer sparse, attention_dropout = 0): any other value is an error naming the
//     key, its value and what is supported;
//   - inert: keys that do not change the computed function (token ids, use_cache, initializer_range,
//     torch_dtype, max_position_embeddings under default RoPE, ...), listed by name.
// A key in none of the groups is an error naming it: a new transformers key is refused until someone
// decides which group it belongs to.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "model/config.h"

namespace fp {

struct HfConfig {
  ModelConfig model;          // seed 0: the weights come from the checkpoint
  nlohmann::ordered_json raw;  // the file as read, keys in their order (written back on save)
  std::string dtype;          // torch_dtype (4.x) or dtype (5.x): "float32", "bfloat16", ...; "" if absent
  // HfMode_plan, a type flatpeak does not compute: what of the file the engine's layer does not model.
  std::vector<std::string> approximate;
  // gpt_oss with quantization_config.quant_method "mxfp4": the experts are stored as MXFP4 blocks and
  // scales (dequantized to bf16 on load, train/checkpoint.cpp).
  bool mxfp4 = false;
};

// How config.json is read: the one reader, in two modes.
//   strict  (train, eval, convert, --init-from): Qwen3-MoE, DeepSeek-V3 (Kimi-K2) and gpt-oss, every key read,
//           checked or listed inert, anything else refused (Note [Every config key is read or refused]).
//   plan    (flatpeak plan --model): those types exactly as strict; any other MoE type (Mixtral,
//           ...) leniently, for the dimensions a memory plan needs, with what the engine's layer does not
//           model listed in HfConfig::approximate (Note [config.json in plan mode] in hf_config.cpp):
//           hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads (default: heads),
//           head_dim (default: hidden / heads), num_experts | num_local_experts | n_routed_experts,
//           num_experts_per_tok | experts_per_token, moe_intermediate_size | intermediate_size,
//           vocab_size, router_aux_loss_coef | aux_loss_alpha (default 0.001), tie_word_embeddings,
//           first_k_dense_replace (dense first layers of intermediate_size); MLA (kv_lora_rank) becomes GQA
//           with the same K/V bytes per token.
enum class HfMode { HfMode_strict, HfMode_plan };

// Parses and checks the text of a config.json. source names the file in errors. Throws fp::Error.
HfConfig hf_config_parse(const std::string& text, const std::string& source, HfMode mode = HfMode::HfMode_strict);

// Reads DIR/config.json.
HfConfig hf_config_read(const std::string& dir);

// A rope_scaling / rope_parameters dictionary (null: default RoPE) as RopeScaling; its rope_theta, if
// any, into *theta. Keys that the rope_type does not read, dynamic NTK and LongRoPE are refused, naming
// `where` (e.g. "config.json: rope_scaling"). Note [RoPE scaling as transformers computes it].
// max_position_embeddings: YaRN's original context when the dictionary names none (0: required).
RopeScaling rope_scaling_parse(const nlohmann::json& d, const std::string& where, std::optional<double>* theta = nullptr,
                               int64_t max_position_embeddings = 0);
// The dictionary flatpeak writes for r (null for default RoPE).
nlohmann::json rope_scaling_json(const RopeScaling& r);

// The architecture keys (Hugging Face names) where a and b differ, as "key: A vs B" (seed is not
// compared: it only seeds fresh weights).
std::vector<std::string> model_config_differences(const ModelConfig& a, const ModelConfig& b);
// The same, but for router_aux_loss_coef: the weight of the training loss's load-balancing term, not part of
// the function the model computes. A run may train a checkpoint with its own (gpt-oss's published files
// say 0.9), and the checkpoints it writes say what it trained with (train/checkpoint.cpp).
std::vector<std::string> model_function_differences(const ModelConfig& a, const ModelConfig& b);

}  // namespace fp
