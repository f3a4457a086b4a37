// Models to plan, from a file: a flatpeak preset or run config (TOML with a [model] table of
// Qwen3-MoE keys, e.g. configs/models/*.toml, configs/tiny.toml) or a Hugging Face config.json
// (Qwen3-MoE, Mixtral, gpt-oss, DeepSeek-V3 and alike). Architecture features the engine does not
// have are approximated and said so in Model::notes.
#pragma once

#include <string>

#include "plan/plan.h"

namespace fp::plan {

// By extension: .json is a Hugging Face config.json, anything else TOML. Throws fp::Error naming
// the file and key.
Model model_load(const std::string& path);

// Hugging Face config.json: model_type "qwen3_moe" is read strictly, as train and eval read it
// (model/hf_config.h), every switch of the layer included. Other types, leniently: hidden_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads (default: heads), head_dim (default: hidden / heads),
// num_experts | num_local_experts | n_routed_experts, num_experts_per_tok | experts_per_token,
// moe_intermediate_size | intermediate_size, vocab_size, router_aux_loss_coef | aux_loss_alpha
// (default 0.001), tie_word_embeddings, first_k_dense_replace (dense first layers of intermediate_size).
// MLA (kv_lora_rank) becomes GQA with the same K/V bytes per token; shared experts and other types'
// features are approximations, listed in Model::approximate.
Model model_from_hf_json(const std::string& text, const std::string& source);

// TOML: optional top-level name, ranks (the preset's rank count), notes (strings); [model] with
// hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, num_experts,
// num_experts_per_tok, moe_intermediate_size, vocab_size, and optional head_dim (hidden / heads), the
// other keys of model_keys_visit (model/config.h: the layer's switches among them) and mlp_only_layers.
// Other tables (a run config's) are ignored.
Model model_from_toml(const std::string& text, const std::string& source);

}  // namespace fp::plan
