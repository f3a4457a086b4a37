#include "plan/model_file.h"

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <type_traits>

#include "core/error.h"
#include "model/hf_config.h"

namespace fp::plan {

namespace {

constexpr const char* kHfHint =
    "a Hugging Face config.json needs hidden_size, num_hidden_layers, num_attention_heads, vocab_size, the "
    "number of experts (num_experts, num_local_experts or n_routed_experts), num_experts_per_tok and the expert "
    "width (moe_intermediate_size or intermediate_size)";
constexpr const char* kTomlHint = "see configs/models/*.toml for presets ([model] with Qwen3-MoE key names)";

std::string file_read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  FP_CHECK(f.good(), "check the path of --model", "cannot read model file '{}'", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string stem(const std::string& path) { return std::filesystem::path(path).stem().string(); }

// The first present key among names, as an integer (null counts as absent).
bool hf_int(const nlohmann::json& j, std::initializer_list<const char*> names, int64_t& out, const std::string& src) {
  for (const char* n : names) {
    if (!j.contains(n) || j[n].is_null()) continue;
    FP_CHECK(j[n].is_number_integer(), kHfHint, "{}: {} = {} is not an integer", src, n, j[n].dump());
    out = j[n].get<int64_t>();
    return true;
  }
  return false;
}

void hf_require(const nlohmann::json& j, std::initializer_list<const char*> names, int64_t& out, const std::string& src) {
  if (hf_int(j, names, out, src)) return;
  std::string list;
  for (const char* n : names) list += list.empty() ? std::string(n) : std::string(" or ") + n;
  throw Error(fmt::format("{}: missing {}", src, list), kHfHint);
}

}  // namespace

Model model_from_hf_json(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not JSON: {}", source, e.what()), kHfHint);
  }
  FP_CHECK(j.is_object(), kHfHint, "{}: a config.json is one JSON object", source);
  Model m;
  m.source = source;
  m.name = j.contains("_name_or_path") && j["_name_or_path"].is_string() ? j["_name_or_path"].get<std::string>()
                                                                         : stem(source);
  ModelConfig& c = m.cfg;
  // The architecture the engine computes is read as train and eval read it (every key, strictly), so the
  // plan is of the very model they would run.
  // Qwen3-MoE and DeepSeek-V3 (Kimi-K2 publishes its own model_type for DeepSeek-V3's class) are the
  // engine's own architectures: read strictly, planned exactly.
  if (j.contains("model_type") &&
      (j["model_type"] == "qwen3_moe" || j["model_type"] == "deepseek_v3" || j["model_type"] == "kimi_k2")) {
    c = hf_config_parse(text, source).model;
    return m;
  }
  hf_require(j, {"hidden_size"}, c.hidden_size, source);
  hf_require(j, {"num_hidden_layers"}, c.num_hidden_layers, source);
  hf_require(j, {"num_attention_heads"}, c.num_attention_heads, source);
  if (!hf_int(j, {"num_key_value_heads"}, c.num_key_value_heads, source)) c.num_key_value_heads = c.num_attention_heads;
  FP_CHECK(c.num_attention_heads >= 1, kHfHint, "{}: num_attention_heads must be >= 1", source);
  if (!hf_int(j, {"head_dim"}, c.head_dim, source)) c.head_dim = c.hidden_size / c.num_attention_heads;
  hf_require(j, {"num_experts", "num_local_experts", "n_routed_experts"}, c.num_experts, source);
  hf_require(j, {"num_experts_per_tok", "experts_per_token"}, c.num_experts_per_tok, source);
  hf_require(j, {"moe_intermediate_size", "intermediate_size"}, c.moe_intermediate_size, source);
  hf_require(j, {"vocab_size"}, c.vocab_size, source);
  c.router_aux_loss_coef = 0.001;
  for (const char* n : {"router_aux_loss_coef", "aux_loss_alpha"})
    if (j.contains(n) && j[n].is_number()) {
      c.router_aux_loss_coef = j[n].get<double>();
      break;
    }

  int64_t kv_lora = 0, rope = 0, nope = 0, vhd = 0;
  if (hf_int(j, {"kv_lora_rank"}, kv_lora, source)) {
    // MLA caches kv_lora_rank + qk_rope_head_dim numbers per token and layer; plan it as GQA whose
    // k and v together hold the same: nkv * hd = (kv_lora_rank + rope) / 2, with hd the even divisor
    // closest to the mean of MLA's q/k and v head widths.
    hf_int(j, {"qk_rope_head_dim"}, rope, source);
    hf_int(j, {"qk_nope_head_dim"}, nope, source);
    hf_int(j, {"v_head_dim"}, vhd, source);
    const int64_t kv = kv_lora + rope, half = kv / 2, target = std::max<int64_t>(2, (nope + rope + vhd) / 2);
    int64_t best_nkv = 0, best_hd = 0;
    for (int64_t nkv = 1; nkv <= c.num_attention_heads; ++nkv) {
      if (kv % 2 != 0 || half % nkv != 0 || c.num_attention_heads % nkv != 0) continue;
      const int64_t hd = half / nkv;
      if (hd % 2 != 0) continue;
      if (best_nkv == 0 || std::llabs(hd - target) < std::llabs(best_hd - target)) {
        best_nkv = nkv;
        best_hd = hd;
      }
    }
    FP_CHECK(best_nkv > 0, kHfHint, "{}: cannot map MLA (kv_lora_rank {} + qk_rope_head_dim {}) onto GQA heads", source,
             kv_lora, rope);
    c.num_key_value_heads = best_nkv;
    c.head_dim = best_hd;
    m.approximate.push_back(fmt::format(
        "MLA approximated by GQA with the same K/V bytes per token: {} KV heads x head_dim {} (k + v = {} = "
        "kv_lora_rank {} + qk_rope_head_dim {}); {} query heads of head_dim {} (MLA: q/k {}, v {})",
        best_nkv, best_hd, 2 * best_nkv * best_hd, kv_lora, rope, c.num_attention_heads, best_hd, nope + rope, vhd));
  }
  int64_t shared = 0, dense = 0, window = 0;
  if (hf_int(j, {"n_shared_experts", "num_shared_experts"}, shared, source) && shared > 0)
    m.approximate.push_back(fmt::format("{} shared expert(s) per layer not modeled (the engine has routed experts only)",
                                  shared));
  if (hf_int(j, {"first_k_dense_replace"}, dense, source) && dense > 0) {
    // DeepSeek-V3's dense first layers: the engine's dense layer (one SwiGLU of intermediate_size).
    hf_require(j, {"intermediate_size"}, c.intermediate_size, source);
    for (int64_t l = 0; l < std::min(dense, c.num_hidden_layers); ++l) c.mlp_only_layers.push_back(l);
  }
  if (hf_int(j, {"sliding_window"}, window, source) && window > 0)
    m.approximate.push_back(fmt::format("sliding-window layers (window {}) planned as full causal attention: the "
                                  "engine's tiled attention keeps O(N) memory either way",
                                  window));
  if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean())
    c.tie_word_embeddings = j["tie_word_embeddings"].get<bool>();
  const std::string type = j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : "";
  if (type == "gpt_oss")
    m.approximate.push_back("attention sinks, biases and the clamped SwiGLU of gpt-oss not modeled (a few parameters)");
  if (!type.empty() && type != "qwen3_moe")
    m.approximate.push_back(fmt::format("{} planned with the engine's Qwen3-MoE layer (per-head q/k RMSNorm, softmax "
                                  "top-k router, SwiGLU experts)",
                                  type));
  model_config_validate(c, source);
  return m;
}

Model model_from_toml(const std::string& text, const std::string& source) {
  toml::table doc;
  try {
    doc = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw Error(fmt::format("{}: {}", source, e.description()), kTomlHint);
  }
  Model m;
  m.source = source;
  m.name = doc["name"].value_or(stem(source));
  m.default_ranks = doc["ranks"].value_or(int64_t{0});
  if (const toml::array* notes = doc["notes"].as_array())
    for (const toml::node& n : *notes)
      if (n.is_string()) m.notes.push_back(*n.value<std::string>());
  const toml::table* t = doc["model"].as_table();
  FP_CHECK(t != nullptr, kTomlHint, "{}: no [model] table", source);
  ModelConfig& c = m.cfg;
  if (const toml::node* n = t->get("model_type")) {
    FP_CHECK(n->is_string(), kTomlHint, "{}: model.model_type must be a string", source);
    c.model_type = model_type_parse(*n->value<std::string>(), fmt::format("{}: model.model_type", source));
  }
  // Every architecture key of the run config's [model] (model_keys_visit), the layer's switches included.
  model_keys_visit(c, [&](const char* key, auto& member) {
    const toml::node* n = t->get(key);
    using T = std::remove_reference_t<decltype(member)>;
    if (n == nullptr) {
      const bool defaulted = model_key_optional(key) || std::string_view(key) == "head_dim" ||
                             std::is_same_v<T, double> || std::is_same_v<T, bool>;
      FP_CHECK(defaulted, kTomlHint, "{}: missing model.{}", source, key);
      return;
    }
    if constexpr (std::is_same_v<T, int64_t>) {
      FP_CHECK(n->is_integer(), kTomlHint, "{}: model.{} must be an integer", source, key);
      member = *n->value<int64_t>();
    } else if constexpr (std::is_same_v<T, double>) {
      FP_CHECK(n->is_number(), kTomlHint, "{}: model.{} must be a number", source, key);
      member = *n->value<double>();
    } else {
      FP_CHECK(n->is_boolean(), kTomlHint, "{}: model.{} must be true or false", source, key);
      member = *n->value<bool>();
    }
  });
  if (const toml::array* a = (*t)["mlp_only_layers"].as_array())
    for (const toml::node& l : *a) {
      FP_CHECK(l.is_integer(), kTomlHint, "{}: model.mlp_only_layers must be a list of integers", source);
      c.mlp_only_layers.push_back(*l.value<int64_t>());
    }
  FP_CHECK(c.num_attention_heads >= 1, kTomlHint, "{}: model.num_attention_heads must be >= 1", source);
  if (c.head_dim == 0) c.head_dim = c.is_deepseek() ? c.qk_rope_head_dim : c.hidden_size / c.num_attention_heads;
  model_config_validate(c, source);
  return m;
}

Model model_load(const std::string& path) {
  const std::string text = file_read(path);
  if (std::filesystem::path(path).extension() == ".json") return model_from_hf_json(text, path);
  return model_from_toml(text, path);
}

}  // namespace fp::plan
