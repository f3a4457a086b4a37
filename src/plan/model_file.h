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

// Hugging Face config.json, read by the one reader in its plan mode (hf_config_parse, HfMode_plan in
// model/hf_config.h): the engine's own types exactly as train reads them, others leniently with what is
// approximated listed in Model::approximate.
Model model_from_hf_json(const std::string& text, const std::string& source);

// TOML: optional top-level name, ranks (the preset's rank count), notes (strings); [model] with
// hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, num_experts,
// num_experts_per_tok, moe_intermediate_size, vocab_size, and optional head_dim (hidden / heads), the
// other keys of model_keys_visit (model/config.h: the layer's switches among them) and mlp_only_layers.
// Other tables (a run config's) are ignored.
Model model_from_toml(const std::string& text, const std::string& source);

}  // namespace fp::plan
