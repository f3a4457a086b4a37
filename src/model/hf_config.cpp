// Strict reading of a Hugging Face Qwen3-MoE, DeepSeek-V3 or gpt-oss config.json (Note [Every config key is read or
// refused]).
#include "model/hf_config.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <set>

#include "core/error.h"
#include "io/atomic_file.h"

namespace fp {

namespace {

constexpr const char* kSupported =
    "flatpeak computes Qwen3MoeForCausalLM with SiLU experts (attention with or without biases and a sliding window, "
    "tied or untied embeddings, MoE and dense layers) and DeepseekV3ForCausalLM (MLA, sigmoid group-limited routing, "
    "shared experts, dense first layers) and GptOssForCausalLM (sinks, alternating sliding/full layers, biased "
    "router and experts, the clamped SwiGLU, MXFP4 experts read), with default/linear/yarn/llama3/dynamic RoPE "
    "(docs/models.md)";

// Keys that do not change the function the model computes (PretrainedConfig's bookkeeping, token ids,
// generation defaults that older transformers wrote into config.json, and Qwen3-MoE keys that only
// matter for a feature whose switch is checked: sliding_window and max_window_layers when
// use_sliding_window is false, intermediate_size when every layer is sparse, max_position_embeddings
// except as YaRN's default original context and dynamic RoPE's M).
//
// Note [Sliding window]: transformers 5.x's Qwen3-MoE slides the window on every layer when
// use_sliding_window is true, and its mask lets query i see keys i - sliding_window < j <= i
// (masking_utils.sliding_window_overlay). transformers 4.x slid it only on layers >= max_window_layers
// (the flash-attention path); the two agree when max_window_layers is 0, which is what flatpeak writes, and
// any other max_window_layers with the window on is refused rather than guessed. The kernels skip the
// tiles outside the window (ops/attention.h), so the cost falls with it.
const std::set<std::string>& inert_keys() {
  static const std::set<std::string> keys = {
      // bookkeeping
      "_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache", "initializer_range",
      "output_router_logits", "return_dict", "output_hidden_states", "output_attentions", "torchscript",
      "use_bfloat16", "chunk_size_feed_forward", "id2label", "label2id", "problem_type", "tokenizer_class",
      "prefix", "finetuning_task", "task_specific_params", "tf_legacy_loss", "keys_to_ignore_at_inference",
      // token ids
      "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
      // generation defaults (transformers 4.x wrote them into config.json)
      "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
      "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
      "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
      "output_scores", "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id",
      "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
      // Qwen3-MoE keys inert under the checked switches
      "sliding_window", "max_window_layers", "intermediate_size", "max_position_embeddings",
  };
  return keys;
}

class Reader {
 public:
  Reader(const nlohmann::ordered_json& j, const std::string& source) : j_(j), source_(source) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  bool j_contains(const char* key) const { return j_.contains(key); }
  const nlohmann::ordered_json& at(const char* key) {
    seen_.insert(key);
    return j_[key];
  }
  void mark(const char* key) { seen_.insert(key); }

  int64_t integer(const char* key, const char* fallback_key = nullptr) {
    for (const char* k : {key, fallback_key}) {
      if (k == nullptr || !has(k)) continue;
      const auto& v = at(k);
      FP_CHECK(v.is_number_integer(), kSupported, "{}: {} = {} is not an integer", source_, k, v.dump());
      return v.get<int64_t>();
    }
    throw Error(fmt::format("{}: missing key {}{}", source_, key,
                            fallback_key ? fmt::format(" (or {})", fallback_key) : std::string()),
                "a config.json as transformers writes it has every architecture key");
  }
  double number(const char* key, double fallback) {
    if (!has(key)) return mark(key), fallback;
    const auto& v = at(key);
    FP_CHECK(v.is_number(), kSupported, "{}: {} = {} is not a number", source_, key, v.dump());
    return v.get<double>();
  }
  bool boolean(const char* key, bool fallback) {
    if (!has(key)) return mark(key), fallback;
    const auto& v = at(key);
    FP_CHECK(v.is_boolean(), kSupported, "{}: {} = {} is not true or false", source_, key, v.dump());
    return v.get<bool>();
  }
  // A key flatpeak computes for one value only: absent or equal to `ok`.
  template <typename T>
  void only(const char* key, const T& ok, const std::string& what) {
    if (!j_.contains(key)) return mark(key);  // null is a value here (transformers would not take it either)
    const auto& v = at(key);
    FP_CHECK(v == nlohmann::ordered_json(ok), kSupported, "{}: {} = {} is not implemented ({}); flatpeak supports {} = {}",
             source_, key, v.dump(), what, key, nlohmann::ordered_json(ok).dump());
  }
  // Every key neither read, checked nor inert.
  void refuse_unknown() const {
    std::vector<std::string> unknown;
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!seen_.count(it.key()) && !inert_keys().count(it.key())) unknown.push_back(it.key());
    FP_CHECK(unknown.empty(),
             "flatpeak refuses a key it does not know rather than ignore one that changes the model (docs/models.md "
             "lists the keys it reads, checks and ignores)",
             "{}: unknown key{} {}", source_, unknown.size() > 1 ? "s" : "", fmt::join(unknown, ", "));
  }

  const std::string& source() const { return source_; }

 private:
  const nlohmann::ordered_json& j_;
  std::string source_;
  std::set<std::string> seen_;
};

// rope_scaling (4.x) or rope_parameters (5.x) as read by rope_scaling_parse; absent or null is
// default RoPE.
RopeScaling rope_dictionary(Reader& r, const char* key, std::optional<double>* theta, int64_t max_position_embeddings) {
  if (!r.has(key)) return r.mark(key), RopeScaling{};
  return rope_scaling_parse(r.at(key), fmt::format("{}: {}", r.source(), key), theta, max_position_embeddings);
}


// DeepseekV3ForCausalLM's own keys (Note [Two architectures, one layer] in model/config.h): multi-head
// latent attention, the sigmoid router's groups and scale, shared experts, dense first layers. Keys of the
// original DeepSeek code that transformers' class computes for one value only are checked (moe_layer_freq,
// scoring_func, topk_method); its training-time keys (aux_loss_alpha, seq_aux) and the multi-token
// prediction module (num_nextn_predict_layers: weights transformers does not load either) are inert. A key
// left out takes transformers' DeepseekV3Config default (q_lora_rank 1536, n_group 8, topk_group 4,
// routed_scaling_factor 2.5, first_k_dense_replace 3, n_shared_experts 1, rope_interleave and
// norm_topk_prob true), as transformers would compute the file; the widths of MLA are required.
void deepseek_parse(Reader& r, ModelConfig& m) {
  const std::string& source = r.source();
  // Absent: transformers' default; null: refused (transformers' class would fail on it), but q_lora_rank.
  auto integer_or = [&](const char* key, int64_t fallback) {
    if (!r.j_contains(key)) return r.mark(key), fallback;
    FP_CHECK(r.has(key), kSupported, "{}: {} = null is not implemented", source, key);
    return r.integer(key);
  };
  m.kv_lora_rank = r.integer("kv_lora_rank");
  FP_CHECK(!r.has("q_lora_rank") || r.at("q_lora_rank") != 0, kSupported,
           "{}: q_lora_rank = 0; write null for queries without a latent (q_proj)", source);
  m.q_lora_rank = r.j_contains("q_lora_rank") && !r.has("q_lora_rank") ? (r.mark("q_lora_rank"), 0)  // null: q_proj
                                                                         : integer_or("q_lora_rank", 1536);
  m.qk_nope_head_dim = r.integer("qk_nope_head_dim");
  m.qk_rope_head_dim = r.integer("qk_rope_head_dim");
  m.v_head_dim = r.integer("v_head_dim");
  m.head_dim = m.qk_rope_head_dim;  // transformers sets head_dim to the RoPE width
  for (const char* k : {"head_dim", "qk_head_dim"})  // derived attributes save_pretrained may write
    if (r.has(k)) {
      const int64_t want = std::string_view(k) == "head_dim" ? m.qk_rope_head_dim : m.qk_nope_head_dim + m.qk_rope_head_dim;
      FP_CHECK(r.integer(k) == want, kSupported, "{}: {} = {} disagrees with the MLA widths ({} expected)", source, k,
               r.at(k).dump(), want);
    } else {
      r.mark(k);
    }
  m.rope_interleave = r.boolean("rope_interleave", true);
  m.n_shared_experts = integer_or("n_shared_experts", 1);
  m.n_group = integer_or("n_group", 8);
  m.topk_group = integer_or("topk_group", 4);
  m.routed_scaling_factor = r.number("routed_scaling_factor", 2.5);
  m.first_k_dense_replace = integer_or("first_k_dense_replace", 3);
  r.only("moe_layer_freq", 1, "MoE layers other than every layer past first_k_dense_replace; transformers' "
         "DeepseekV3ForCausalLM computes 1");
  r.only("scoring_func", "sigmoid", "the router's scores; DeepseekV3ForCausalLM computes sigmoid");
  r.only("topk_method", "noaux_tc", "the router's choice; DeepseekV3ForCausalLM computes noaux_tc (group-limited, "
         "with e_score_correction_bias)");
  for (const char* k : {"aux_loss_alpha", "seq_aux", "ep_size", "num_nextn_predict_layers", "num_mtp_layers",
                        "pretraining_tp", "auto_map"})
    r.mark(k);
}

// RoPE from rope_theta (4.x) and rope_scaling, or rope_parameters (5.x), which must agree where both are given;
// default_theta where none names a theta. max_position_embeddings is read only as YaRN's default original
// context (otherwise inert). Returns whether either dictionary was given (not null).
bool rope_read(Reader& r, ModelConfig& m, double default_theta) {
  const std::string& source = r.source();
  std::optional<double> theta_scaling, theta_params;
  int64_t max_positions = 0;
  if (r.has("max_position_embeddings") && r.at("max_position_embeddings").is_number_integer())
    max_positions = r.at("max_position_embeddings").get<int64_t>();
  const bool given = r.has("rope_scaling") || r.has("rope_parameters");
  const RopeScaling scaling = rope_dictionary(r, "rope_scaling", &theta_scaling, max_positions);
  const RopeScaling params = rope_dictionary(r, "rope_parameters", &theta_params, max_positions);
  FP_CHECK(scaling.kind == RopeScaling::Kind::Kind_default || params.kind == RopeScaling::Kind::Kind_default ||
               scaling == params,
           kSupported, "{}: rope_scaling and rope_parameters disagree", source);
  m.rope_scaling = scaling.kind != RopeScaling::Kind::Kind_default ? scaling : params;
  m.rope_theta = default_theta;
  int theta_sources = 0;
  for (const std::optional<double>& t : {theta_params, theta_scaling})
    if (t) m.rope_theta = *t, ++theta_sources;
  if (r.has("rope_theta")) {
    const double t = r.number("rope_theta", 0);
    FP_CHECK(theta_sources == 0 || t == m.rope_theta, kSupported,
             "{}: rope_theta = {} disagrees with the rope_theta of rope_parameters ({})", source, t, m.rope_theta);
    m.rope_theta = t;
  }
  r.mark("rope_theta");
  return given;
}

// GptOssForCausalLM's config.json (transformers 5's GptOssConfig; the published openai/gpt-oss files
// add experts_per_token and initial_context_length, which transformers does not read). A key left out
// takes GptOssConfig's default: rope_theta 150000 and, with neither rope_scaling nor rope_parameters,
// YaRN of factor 32 over 4096 positions with truncate = false; sliding_window 128; layer_types sliding
// on even layers, full on odd; attention_bias true; rms_norm_eps 1e-5; swiglu_alpha 1.702, swiglu_limit
// 7.0; router_aux_loss_coef 0.001. quantization_config is read for MXFP4 experts only (HfConfig::mxfp4).
void gpt_oss_parse(Reader& r, HfConfig& out) {
  ModelConfig& m = out.model;
  const std::string& source = r.source();
  if (r.has("architectures")) {
    const auto& a = r.at("architectures");
    FP_CHECK(a.is_array() && a.size() == 1 && a[0] == "GptOssForCausalLM",
             "flatpeak computes the causal language model head (lm_head) only",
             "{}: architectures = {} is not implemented; flatpeak reads [\"GptOssForCausalLM\"]", source, a.dump());
  }
  m.hidden_size = r.integer("hidden_size");
  m.num_hidden_layers = r.integer("num_hidden_layers");
  m.num_attention_heads = r.integer("num_attention_heads");
  m.num_key_value_heads = r.has("num_key_value_heads") ? r.integer("num_key_value_heads") : m.num_attention_heads;
  r.mark("num_key_value_heads");
  FP_CHECK(m.num_attention_heads >= 1, kSupported, "{}: num_attention_heads = {} must be at least 1", source,
           m.num_attention_heads);
  m.head_dim = r.has("head_dim") ? r.integer("head_dim") : m.hidden_size / m.num_attention_heads;
  r.mark("head_dim");
  m.num_experts = r.integer("num_local_experts", "num_experts");
  if (r.has("num_local_experts") && r.has("num_experts"))
    FP_CHECK(r.at("num_local_experts") == r.at("num_experts"), kSupported,
             "{}: num_local_experts = {} and num_experts = {} disagree", source, r.at("num_local_experts").dump(),
             r.at("num_experts").dump());
  r.mark("num_experts");
  m.num_experts_per_tok = r.integer("num_experts_per_tok", "experts_per_token");
  if (r.has("experts_per_token"))
    FP_CHECK(r.integer("experts_per_token") == m.num_experts_per_tok, kSupported,
             "{}: experts_per_token = {} and num_experts_per_tok = {} disagree", source,
             r.at("experts_per_token").dump(), m.num_experts_per_tok);
  r.mark("experts_per_token");
  m.moe_intermediate_size = r.integer("intermediate_size");  // gpt-oss's expert width
  m.vocab_size = r.integer("vocab_size");
  m.norm_topk_prob = true;  // Note [Two architectures, one layer]: softmax over the k chosen logits
  m.rms_norm_eps = r.number("rms_norm_eps", 1e-5);
  m.router_aux_loss_coef = r.number("router_aux_loss_coef", 0.001);
  m.swiglu_alpha = r.number("swiglu_alpha", 1.702);
  m.swiglu_limit = r.number("swiglu_limit", 7.0);
  m.attention_bias = r.boolean("attention_bias", true);
  m.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  // RoPE: rope_theta and rope_scaling (as the published files write them), or rope_parameters.
  if (!rope_read(r, m, 150000.0)) {  // GptOssConfig.__post_init__'s default
    m.rope_scaling.kind = RopeScaling::Kind::Kind_yarn;
    m.rope_scaling.factor = 32.0;
    m.rope_scaling.beta_fast = 32.0;
    m.rope_scaling.beta_slow = 1.0;
    m.rope_scaling.truncate = false;
    m.rope_scaling.original_max_position_embeddings = 4096;
  }
  // Attention per layer.
  if (!r.j_contains("sliding_window")) {
    m.sliding_window = 128;
  } else if (r.has("sliding_window")) {
    m.sliding_window = r.integer("sliding_window");
  }
  r.mark("sliding_window");
  if (r.has("layer_types")) {
    const auto& t = r.at("layer_types");
    FP_CHECK(t.is_array(), kSupported, "{}: layer_types = {} is not a list", source, t.dump());
    for (const auto& e : t) {
      FP_CHECK(e == "sliding_attention" || e == "full_attention", kSupported,
               "{}: layer_types holds {}; gpt_oss's layers are \"sliding_attention\" or \"full_attention\"", source,
               e.dump());
      m.layer_types.push_back(e.get<std::string>());
    }
  } else {
    for (int64_t l = 0; l < m.num_hidden_layers; ++l)
      m.layer_types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
  }
  r.mark("layer_types");
  r.only("hidden_act", "silu",
         "gpt-oss's experts compute the clamped SwiGLU whatever hidden_act says; transformers "
         "writes \"silu\"");
  r.only("attention_dropout", 0, "dropout on the attention probabilities");
  r.mark("initial_context_length");  // the original implementation's, read by no transformers code
  if (r.has("quantization_config")) {
    const auto& q = r.at("quantization_config");
    FP_CHECK(q.is_object() && q.contains("quant_method") && q["quant_method"] == "mxfp4",
             "flatpeak dequantizes gpt-oss's MXFP4 experts on load; other quantized weights are not implemented",
             "{}: quantization_config = {} is not implemented", source, q.dump());
    for (auto it = q.begin(); it != q.end(); ++it)
      FP_CHECK(it.key() == "quant_method" || it.key() == "modules_to_not_convert", kSupported,
               "{}: quantization_config.{} = {} is not implemented", source, it.key(), it.value().dump());
    out.mxfp4 = true;
  }
  r.mark("quantization_config");
  m.seed = 0;
}

constexpr const char* kHfHint =
    "a Hugging Face config.json needs hidden_size, num_hidden_layers, num_attention_heads, vocab_size, the "
    "number of experts (num_experts, num_local_experts or n_routed_experts), num_experts_per_tok and the expert "
    "width (moe_intermediate_size or intermediate_size)";
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

// Note [config.json in plan mode]: a type flatpeak does not compute (Mixtral, gpt-oss, ...) is planned
// with the engine's layer on the dimensions a memory plan needs; every feature of the file the layer
// does not have is listed in out.approximate, and the plan says it is approximate.
void hf_config_plan(const nlohmann::ordered_json& raw, const std::string& source, HfConfig& out) {
  const nlohmann::json j = nlohmann::json::parse(raw.dump());
  ModelConfig& c = out.model;
  HfConfig& m = out;
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
  const std::string type =
      j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : "";
  if (!type.empty() && type != "qwen3_moe")
    m.approximate.push_back(fmt::format("{} planned with the engine's Qwen3-MoE layer (per-head q/k RMSNorm, softmax "
                                  "top-k router, SwiGLU experts)",
                                  type));
  model_config_validate(c, source);
}

}  // namespace

HfConfig hf_config_parse(const std::string& text, const std::string& source, HfMode mode) {
  HfConfig out;
  try {
    out.raw = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not JSON: {}", source, e.what()), "a config.json is one JSON object");
  }
  FP_CHECK(out.raw.is_object(), "a config.json is one JSON object", "{}: not a JSON object", source);
  if (mode == HfMode::HfMode_plan) {
    const auto& t = out.raw.contains("model_type") ? out.raw["model_type"] : nlohmann::ordered_json();
    if (!(t == "qwen3_moe" || t == "deepseek_v3" || t == "kimi_k2" || t == "gpt_oss")) {
      hf_config_plan(out.raw, source, out);
      return out;
    }
  }
  Reader r(out.raw, source);

  // What model this is (Note [Two architectures, one layer] in model/config.h).
  FP_CHECK(r.has("model_type"), kSupported, "{}: missing key model_type (flatpeak reads \"qwen3_moe\" and \"deepseek_v3\")",
           source);
  const auto& type = r.at("model_type");
  FP_CHECK(type.is_string(), kSupported, "{}: model_type = {} is not a string", source, type.dump());
  ModelConfig& m = out.model;
  // Kimi-K2 publishes model_type "kimi_k2" with DeepSeek-V3's class (architectures DeepseekV3ForCausalLM):
  // the same architecture, read as deepseek_v3 (the file's own keys are kept when written back).
  const bool kimi = type == "kimi_k2";
  m.model_type = kimi ? ModelType::ModelType_deepseek_v3
                      : model_type_parse(type.get<std::string>(), fmt::format("{}: model_type", source));
  if (m.is_gpt_oss()) {
    gpt_oss_parse(r, out);
    r.refuse_unknown();
    for (const char* k : {"torch_dtype", "dtype"})
      if (out.raw.contains(k) && out.raw[k].is_string()) out.dtype = out.raw[k].get<std::string>();
    model_config_validate(m, source);
    return out;
  }
  const bool deepseek = m.is_deepseek();
  if (r.has("architectures")) {
    const char* arch = deepseek ? "DeepseekV3ForCausalLM" : "Qwen3MoeForCausalLM";
    const auto& a = r.at("architectures");
    FP_CHECK(a.is_array() && a.size() == 1 && a[0] == arch, "flatpeak computes the causal language model head (lm_head) only",
             "{}: architectures = {} is not implemented; flatpeak reads [\"{}\"]", source, a.dump(), arch);
  }

  // The architecture.
  m.hidden_size = r.integer("hidden_size");
  m.num_hidden_layers = r.integer("num_hidden_layers");
  m.num_attention_heads = r.integer("num_attention_heads");
  // DeepSeek-V3: null means one per query head.
  m.num_key_value_heads = deepseek && !r.has("num_key_value_heads") ? (r.mark("num_key_value_heads"), m.num_attention_heads)
                                                                    : r.integer("num_key_value_heads");
  const char* experts_key = deepseek ? "n_routed_experts" : "num_experts";
  m.num_experts = r.integer(experts_key, "num_local_experts");
  if (r.has(experts_key) && r.has("num_local_experts"))
    FP_CHECK(r.at("num_local_experts") == r.at(experts_key), kSupported, "{}: {} = {} and num_local_experts = {} disagree",
             source, experts_key, r.at(experts_key).dump(), r.at("num_local_experts").dump());
  r.mark("num_local_experts");
  m.num_experts_per_tok = r.integer("num_experts_per_tok");
  m.moe_intermediate_size = r.integer("moe_intermediate_size");
  m.vocab_size = r.integer("vocab_size");
  if (deepseek) {
    deepseek_parse(r, m);
  } else if (r.has("head_dim")) {  // transformers 5.x leaves it out when it is hidden_size / num_attention_heads
    m.head_dim = r.integer("head_dim");
  } else {
    r.mark("head_dim");
    FP_CHECK(m.num_attention_heads > 0, kSupported, "{}: num_attention_heads = {} must be at least 1", source,
             m.num_attention_heads);
    m.head_dim = m.hidden_size / m.num_attention_heads;
  }
  m.rms_norm_eps = r.number("rms_norm_eps", 1e-6);
  m.norm_topk_prob = r.boolean("norm_topk_prob", deepseek);  // transformers' defaults
  m.router_aux_loss_coef = deepseek ? 0.0 : r.number("router_aux_loss_coef", 0.001);
  // RoPE: rope_theta (4.x) and rope_scaling, or rope_parameters (5.x).
  rope_read(r, m, 10000.0);
  m.seed = 0;

  // The layer's switches (Note [Sliding window] for the window).
  m.attention_bias = r.boolean("attention_bias", false);
  m.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  if (!deepseek && r.boolean("use_sliding_window", false)) {
    FP_CHECK(r.has("sliding_window") && r.at("sliding_window").is_number_integer() &&
                 r.at("sliding_window").get<int64_t>() >= 1,
             "use_sliding_window = true needs sliding_window, the number of positions each query sees",
             "{}: sliding_window = {} is not a positive integer", source,
             r.has("sliding_window") ? r.at("sliding_window").dump() : "null");
    m.sliding_window = r.at("sliding_window").get<int64_t>();
    if (r.has("max_window_layers")) {
      const auto& mw = r.at("max_window_layers");
      FP_CHECK(mw == 0, "transformers 4.x slides the window on layers >= max_window_layers only, 5.x on every layer; "
               "flatpeak computes 5.x's, the same in both when max_window_layers = 0",
               "{}: max_window_layers = {} with use_sliding_window = true is not implemented", source, mw.dump());
    }
  }
  if (!deepseek) {
    // Dense layers (Qwen3MoeMLP of width intermediate_size): the key is read only when a layer is dense.
    m.decoder_sparse_step = r.has("decoder_sparse_step") ? r.integer("decoder_sparse_step") : 1;
    r.mark("decoder_sparse_step");
    if (r.has("mlp_only_layers")) {
      const auto& d = r.at("mlp_only_layers");
      FP_CHECK(d.is_array(), kSupported, "{}: mlp_only_layers = {} is not a list of layer indices", source, d.dump());
      for (const auto& l : d) {
        FP_CHECK(l.is_number_integer(), kSupported, "{}: mlp_only_layers holds {}, not a layer index", source, l.dump());
        m.mlp_only_layers.push_back(l.get<int64_t>());
      }
    }
    r.mark("mlp_only_layers");
  }
  if (m.decoder_sparse_step >= 1 && m.sparse_layer_count() < m.num_hidden_layers)
    m.intermediate_size = r.integer("intermediate_size");

  // Switches flatpeak computes for one setting only.
  r.only("hidden_act", "silu", "the experts' activation");
  r.only("attention_dropout", 0, "dropout on the attention probabilities");
  if (r.has("layer_types")) {
    const char* want = m.sliding_window > 0 ? "sliding_attention" : "full_attention";
    for (const auto& t : r.at("layer_types"))
      FP_CHECK(t == want, "flatpeak computes one kind of attention on every layer (Note [Sliding window])",
               "{}: layer_types holds {}; with use_sliding_window = {} every layer is \"{}\"", source, t.dump(),
               m.sliding_window > 0, want);
  }
  r.mark("layer_types");
  if (r.has("quantization_config"))
    throw Error(fmt::format("{}: quantization_config is not implemented (quantized weights)", source),
                "load a checkpoint in float32, bfloat16 or float16");
  r.mark("quantization_config");
  for (const char* k : {"is_encoder_decoder", "add_cross_attention"}) r.only(k, false, "an encoder-decoder model");
  if (r.has("pruned_heads"))
    FP_CHECK(r.at("pruned_heads").empty(), kSupported, "{}: pruned_heads = {} is not implemented", source,
             r.at("pruned_heads").dump());
  r.mark("pruned_heads");
  r.refuse_unknown();

  for (const char* k : {"torch_dtype", "dtype"})
    if (out.raw.contains(k) && out.raw[k].is_string()) out.dtype = out.raw[k].get<std::string>();
  model_config_validate(m, source);
  return out;
}

HfConfig hf_config_read(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  FP_CHECK(std::filesystem::exists(path), "a Hugging Face checkpoint directory holds config.json and the weights",
           "'{}' has no config.json", dir);
  return hf_config_parse(file_read(path), path);
}

RopeScaling rope_scaling_parse(const nlohmann::json& d, const std::string& where, std::optional<double>* theta,
                               int64_t max_position_embeddings) {
  constexpr const char* kRopeHint =
      "flatpeak computes rope_type \"default\", \"linear\", \"yarn\", \"llama3\" and \"dynamic\" (docs/models.md); "
      "LongRoPE is not implemented";
  RopeScaling out;
  if (d.is_null()) return out;
  FP_CHECK(d.is_object(), kRopeHint, "{} = {} is not an object", where, d.dump());
  std::string type = "default";
  for (const char* k : {"rope_type", "type"})
    if (d.contains(k)) {
      FP_CHECK(d[k].is_string(), kRopeHint, "{}.{} = {} is not a string", where, k, d[k].dump());
      type = d[k].get<std::string>();
    }
  using K = RopeScaling::Kind;
  if (type == "default") out.kind = K::Kind_default;
  else if (type == "linear") out.kind = K::Kind_linear;
  else if (type == "yarn") out.kind = K::Kind_yarn;
  else if (type == "llama3") out.kind = K::Kind_llama3;
  else if (type == "dynamic") out.kind = K::Kind_dynamic;
  else throw Error(fmt::format("{}: rope_type \"{}\" is not implemented", where, type), kRopeHint);
  // Which keys each kind reads (anything else in the dictionary is refused by name).
  std::set<std::string> allowed = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};
  if (out.kind != K::Kind_default) allowed.insert("factor");
  if (out.kind == K::Kind_yarn)
    for (const char* k : {"original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
                          "mscale_all_dim", "truncate"})
      allowed.insert(k);
  if (out.kind == K::Kind_llama3)
    for (const char* k : {"original_max_position_embeddings", "low_freq_factor", "high_freq_factor"}) allowed.insert(k);
  if (out.kind == K::Kind_dynamic) allowed.insert("original_max_position_embeddings");
  auto number = [&](const char* k, double& dst) {
    if (!d.contains(k) || d[k].is_null()) return false;
    FP_CHECK(d[k].is_number(), kRopeHint, "{}.{} = {} is not a number", where, k, d[k].dump());
    dst = d[k].get<double>();
    return true;
  };
  for (auto it = d.begin(); it != d.end(); ++it)
    FP_CHECK(allowed.count(it.key()), kRopeHint, "{}.{} = {} is not implemented for rope_type \"{}\"", where, it.key(),
             it.value().dump(), type);
  double v = 0;
  if (number("rope_theta", v) && theta != nullptr) *theta = v;
  if (number("partial_rotary_factor", v))
    FP_CHECK(v == 1.0, kRopeHint, "{}.partial_rotary_factor = {} is not implemented (RoPE on every dimension)", where, v);
  if (out.kind == K::Kind_default) return out;
  FP_CHECK(number("factor", out.factor) && out.factor >= 1, kRopeHint, "{}: rope_type \"{}\" needs factor >= 1{}", where,
           type, d.contains("factor") ? fmt::format(" (got {})", d["factor"].dump()) : std::string());
  double orig = 0;
  if (number("original_max_position_embeddings", orig)) {
    FP_CHECK(orig >= 1 && orig == std::floor(orig), kRopeHint, "{}.original_max_position_embeddings = {} must be a "
             "positive integer", where, orig);
    out.original_max_position_embeddings = static_cast<int64_t>(orig);
  }
  if (out.kind == K::Kind_yarn) {
    number("attention_factor", out.attention_factor);
    number("beta_fast", out.beta_fast);
    number("beta_slow", out.beta_slow);
    number("mscale", out.mscale);
    number("mscale_all_dim", out.mscale_all_dim);
    if (d.contains("truncate")) {
      FP_CHECK(d["truncate"].is_boolean(), kRopeHint, "{}.truncate = {} is not true or false", where,
               d["truncate"].dump());
      out.truncate = d["truncate"].get<bool>();
    }
    FP_CHECK(out.attention_factor >= 0, kRopeHint, "{}.attention_factor = {} must be > 0", where, out.attention_factor);
    // Without original_max_position_embeddings YaRN scales from the model's max_position_embeddings.
    if (out.original_max_position_embeddings == 0) out.original_max_position_embeddings = max_position_embeddings;
    FP_CHECK(out.original_max_position_embeddings > 0, kRopeHint,
             "{}: rope_type \"yarn\" needs original_max_position_embeddings (the context the model was trained at)",
             where);
  }
  if (out.kind == K::Kind_dynamic) {
    // transformers grows the base past config.json's max_position_embeddings; a run config's TOML, which
    // has no such key, gives it as original_max_position_embeddings. Both given must agree.
    FP_CHECK(out.original_max_position_embeddings == 0 || max_position_embeddings == 0 ||
                 out.original_max_position_embeddings == max_position_embeddings,
             kRopeHint, "{}.original_max_position_embeddings = {} disagrees with max_position_embeddings = {} (dynamic "
             "RoPE grows the base past the latter)", where, out.original_max_position_embeddings,
             max_position_embeddings);
    if (out.original_max_position_embeddings == 0) out.original_max_position_embeddings = max_position_embeddings;
    FP_CHECK(out.original_max_position_embeddings > 0, kRopeHint,
             "{}: rope_type \"dynamic\" needs max_position_embeddings (the length past which the base grows)", where);
  }
  if (out.kind == K::Kind_llama3) {
    FP_CHECK(out.original_max_position_embeddings > 0 && number("low_freq_factor", out.low_freq_factor) &&
                 number("high_freq_factor", out.high_freq_factor) && out.high_freq_factor > out.low_freq_factor &&
                 out.low_freq_factor > 0,
             kRopeHint, "{}: rope_type \"llama3\" needs original_max_position_embeddings, low_freq_factor and "
             "high_freq_factor > low_freq_factor > 0", where);
  }
  return out;
}

nlohmann::json rope_scaling_json(const RopeScaling& r) {
  using K = RopeScaling::Kind;
  if (r.kind == K::Kind_default) return nullptr;
  nlohmann::ordered_json j = {{"rope_type", rope_kind_name(r.kind)}, {"factor", r.factor}};
  if (r.original_max_position_embeddings > 0) j["original_max_position_embeddings"] = r.original_max_position_embeddings;
  if (r.kind == K::Kind_yarn) {
    if (r.attention_factor > 0) j["attention_factor"] = r.attention_factor;
    if (r.beta_fast != 0) j["beta_fast"] = r.beta_fast;
    if (r.beta_slow != 0) j["beta_slow"] = r.beta_slow;
    if (r.mscale != 0) j["mscale"] = r.mscale;
    if (r.mscale_all_dim != 0) j["mscale_all_dim"] = r.mscale_all_dim;
    if (!r.truncate) j["truncate"] = false;
  }
  if (r.kind == K::Kind_llama3) {
    j["low_freq_factor"] = r.low_freq_factor;
    j["high_freq_factor"] = r.high_freq_factor;
  }
  return nlohmann::json::parse(j.dump());
}

std::vector<std::string> model_config_differences(const ModelConfig& a, const ModelConfig& b) {
  std::vector<std::string> d;
  if (a.model_type != b.model_type)
    d.push_back(fmt::format("model_type: {} vs {}", model_type_name(a.model_type), model_type_name(b.model_type)));
  // The same member of b for each of a's (both visits walk one list in one order).
  std::vector<std::string> values_b;
  model_keys_visit(b, [&](const char*, const auto& y) { values_b.push_back(fmt::format("{}", y)); });
  size_t i = 0;
  model_keys_visit(a, [&](const char* key, const auto& x) {
    const std::string xa = fmt::format("{}", x);
    if (xa != values_b[i]) d.push_back(fmt::format("{}: {} vs {}", key, xa, values_b[i]));
    ++i;
  });
  if (a.mlp_only_layers != b.mlp_only_layers)
    d.push_back(fmt::format("mlp_only_layers: [{}] vs [{}]", fmt::join(a.mlp_only_layers, ", "),
                            fmt::join(b.mlp_only_layers, ", ")));
  if (!(a.rope_scaling == b.rope_scaling))
    d.push_back(fmt::format("rope_scaling: {} vs {}", rope_scaling_json(a.rope_scaling).dump(),
                            rope_scaling_json(b.rope_scaling).dump()));
  return d;
}

std::vector<std::string> model_function_differences(const ModelConfig& a, const ModelConfig& b) {
  std::vector<std::string> d = model_config_differences(a, b);
  std::erase_if(d, [](const std::string& line) { return line.rfind("router_aux_loss_coef:", 0) == 0; });
  return d;
}

}  // namespace fp
