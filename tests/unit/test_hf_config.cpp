// model/hf_config.h and model/rope_scaling.h: published Qwen3-MoE configs parse, RoPE scaling tables
// have the properties their definitions give (independent of the code's formulas), differences are
// named. The end-to-end checks against the PyTorch twin are in tests/cli/test_hf.py.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>

#include "core/error.h"
#include "model/hf_config.h"
#include "model/rope_scaling.h"
#include "ops/rope.h"

namespace fp {
namespace {

// Qwen/Qwen3-30B-A3B's config.json as published (transformers 4.51).
constexpr const char* kQwen3_30B = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
  "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
  "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
  "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

std::string with(const std::string& key_value) {
  std::string s = kQwen3_30B;
  return s.substr(0, s.size() - 1) + ", " + key_value + "}";
}

TEST(HfConfig, PublishedQwen3MoeParses) {
  const HfConfig c = hf_config_parse(kQwen3_30B, "Qwen3-30B-A3B/config.json");
  EXPECT_EQ(c.model.hidden_size, 2048);
  EXPECT_EQ(c.model.num_hidden_layers, 48);
  EXPECT_EQ(c.model.head_dim, 128);
  EXPECT_EQ(c.model.num_experts, 128);
  EXPECT_EQ(c.model.num_experts_per_tok, 8);
  EXPECT_EQ(c.model.moe_intermediate_size, 768);
  EXPECT_EQ(c.model.rope_theta, 1e6);
  EXPECT_TRUE(c.model.norm_topk_prob);
  EXPECT_EQ(c.model.rope_scaling.kind, RopeScaling::Kind::Kind_default);
  EXPECT_EQ(c.dtype, "bfloat16");
  // The parameter count (published: 30.5B in total).
  EXPECT_NEAR(static_cast<double>(c.model.param_count()) / 1e9, 30.5, 0.1);
}

TEST(HfConfig, RefusesByName) {
  for (const auto& [kv, needle] : std::vector<std::pair<std::string, std::string>>{
           // the published config's max_window_layers = 48: transformers 4.x and 5.x disagree there
           {R"("use_sliding_window": true, "sliding_window": 4096)", "max_window_layers"},
           {R"("use_sliding_window": true, "max_window_layers": 0)", "sliding_window"},
           {R"("layer_types": ["sliding_attention"])", "layer_types"},
           {R"("decoder_sparse_step": 0)", "decoder_sparse_step"},
           {R"("mlp_only_layers": [48])", "mlp_only_layers"},
           {R"("mlp_only_layers": "0")", "mlp_only_layers"},
           {R"("hidden_act": null)", "hidden_act"},
           {R"("some_new_key": 3)", "some_new_key"},
       }) {
    // A duplicate key: nlohmann keeps the last, so the appended value wins.
    try {
      hf_config_parse(with(kv), "config.json");
      ADD_FAILURE() << kv << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
}

// The layer's switches: each read into ModelConfig, and the parameter count follows them.
TEST(HfConfig, LayerSwitches) {
  const ModelConfig plain = hf_config_parse(kQwen3_30B, "config.json").model;
  const ModelConfig m =
      hf_config_parse(with(R"("use_sliding_window": true, "sliding_window": 4096, "max_window_layers": 0,
      "attention_bias": true, "tie_word_embeddings": true, "mlp_only_layers": [0, 5], "decoder_sparse_step": 2)"),
                      "config.json")
          .model;
  EXPECT_EQ(m.sliding_window, 4096);
  EXPECT_TRUE(m.attention_bias);
  EXPECT_TRUE(m.tie_word_embeddings);
  EXPECT_EQ(m.mlp_only_layers, (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(m.intermediate_size, 6144);
  // Sparse: odd layers (decoder_sparse_step 2) but 5: 1, 3, 7, ..., 47 -> 23 of 48.
  EXPECT_EQ(m.sparse_layer_count(), 23);
  EXPECT_FALSE(m.layer_is_sparse(0));
  EXPECT_TRUE(m.layer_is_sparse(1));
  EXPECT_FALSE(m.layer_is_sparse(5));
  const int64_t H = 2048, V = 151936, q = 32 * 128, kv = 4 * 128, E = 128, I = 768, Id = 6144;
  const int64_t moe = E * H + 3 * E * I * H, dense = 3 * Id * H, bias = q + 2 * kv + H;
  EXPECT_EQ(m.param_count(), plain.param_count() - V * H + 48 * bias - 25 * moe + 25 * dense);
  // Without a dense layer intermediate_size is inert: not read, left 0 (a resume compares it).
  EXPECT_EQ(plain.intermediate_size, 0);
  EXPECT_EQ(plain.sliding_window, 0);
}

// Qwen3's documented long-context setting: YaRN, factor 4 over the 32768 tokens it was trained at.
TEST(RopeScaling, YarnKeepsFastDimensionsAndStretchesSlowOnes) {
  HfConfig c = hf_config_parse(
      with(R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})"),
      "config.json");
  ASSERT_EQ(c.model.rope_scaling.kind, RopeScaling::Kind::Kind_yarn);
  const RopeTable t = rope_table(c.model);
  const std::vector<double> plain = ops::rope_default_inv_freq(1e6, 128);
  ASSERT_EQ(t.inv_freq.size(), plain.size());
  EXPECT_NEAR(t.attention_factor, 1 + 0.1 * std::log(4.0), 1e-12);  // the YaRN paper's sqrt(1/t)
  // Dimensions turning more than beta_fast = 32 times over 32768 tokens are kept; fewer than
  // beta_slow = 1 time are divided by the factor; every one lies between the two.
  for (size_t i = 0; i < plain.size(); ++i) {
    const double turns = 32768 * plain[i] / (2 * std::numbers::pi);
    if (turns > 32 * 1.5) {
      EXPECT_DOUBLE_EQ(t.inv_freq[i], plain[i]) << i;
    }
    if (turns < 1 / 1.5) {
      EXPECT_DOUBLE_EQ(t.inv_freq[i], plain[i] / 4) << i;
    }
    EXPECT_LE(t.inv_freq[i], plain[i] * (1 + 1e-15)) << i;
    EXPECT_GE(t.inv_freq[i], plain[i] / 4 * (1 - 1e-15)) << i;
  }
  // YaRN with DeepSeek's mscale pair: the attention factor is their ratio.
  c = hf_config_parse(with(R"("rope_scaling": {"rope_type": "yarn", "factor": 40, "mscale": 1.0,
      "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096})"), "config.json");
  EXPECT_DOUBLE_EQ(rope_table(c.model).attention_factor, 1.0);
}

TEST(RopeScaling, Llama3AndLinear) {
  HfConfig c = hf_config_parse(with(R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"),
                               "config.json");
  const RopeTable t = rope_table(c.model);
  const std::vector<double> plain = ops::rope_default_inv_freq(1e6, 128);
  for (size_t i = 0; i < plain.size(); ++i) {
    const double wavelen = 2 * std::numbers::pi / plain[i];
    if (wavelen < 8192 / 4.0) {
      EXPECT_DOUBLE_EQ(t.inv_freq[i], plain[i]) << i;      // short: kept
    }
    if (wavelen > 8192 / 1.0) {
      EXPECT_DOUBLE_EQ(t.inv_freq[i], plain[i] / 8) << i;  // long: divided
    }
  }
  EXPECT_EQ(t.attention_factor, 1.0);
  c = hf_config_parse(with(R"("rope_scaling": {"type": "linear", "factor": 2.0})"), "config.json");
  const RopeTable l = rope_table(c.model);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_DOUBLE_EQ(l.inv_freq[i], plain[i] / 2);
}

TEST(HfConfig, DifferencesNameEveryKey) {
  const ModelConfig a = hf_config_parse(kQwen3_30B, "a").model;
  ModelConfig b = a;
  b.head_dim = 64;
  b.rope_scaling.kind = RopeScaling::Kind::Kind_linear;
  b.rope_scaling.factor = 2;
  const std::vector<std::string> d = model_config_differences(a, b);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0], "head_dim: 128 vs 64");
  EXPECT_NE(d[1].find("rope_scaling"), std::string::npos);
  EXPECT_TRUE(model_config_differences(a, a).empty());
}

// deepseek-ai/DeepSeek-V3's config.json as published (transformers 4.33, remote code), without its
// quantization_config (FP8 weights: refused on its own below).
constexpr const char* kDeepseekV3 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
               "AutoModel": "modeling_deepseek.DeepseekV3Model",
               "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
  "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
  "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
  "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
  "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
  "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 128, "num_experts_per_tok": 8,
  "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "pretraining_tp": 1,
  "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "original_max_position_embeddings": 4096, "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true,
  "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
  "transformers_version": "4.33.1", "use_cache": true, "v_head_dim": 128, "vocab_size": 129280})";

std::string deepseek_with(const std::string& key_value) {
  std::string s = kDeepseekV3;
  return s.substr(0, s.size() - 1) + ", " + key_value + "}";
}

TEST(HfConfig, PublishedDeepseekV3Parses) {
  const ModelConfig m = hf_config_parse(kDeepseekV3, "DeepSeek-V3/config.json").model;
  EXPECT_TRUE(m.is_deepseek());
  EXPECT_EQ(m.num_experts, 256);
  EXPECT_EQ(m.head_dim, 64);
  EXPECT_EQ(m.qk_head_dim(), 192);
  EXPECT_EQ(m.value_head_dim(), 128);
  EXPECT_EQ(m.q_lora_rank, 1536);
  EXPECT_EQ(m.n_group, 8);
  EXPECT_EQ(m.topk_group, 4);
  EXPECT_EQ(m.routed_scaling_factor, 2.5);
  EXPECT_TRUE(m.rope_interleave);  // transformers' default when the key is absent
  EXPECT_EQ(m.first_k_dense_replace, 3);
  EXPECT_EQ(m.sparse_layer_count(), 58);
  EXPECT_EQ(m.router_aux_loss_coef, 0.0);
  EXPECT_EQ(m.rope_scaling.kind, RopeScaling::Kind::Kind_yarn);
  // Published: 671B parameters in the main model (685B with the multi-token prediction module).
  EXPECT_NEAR(static_cast<double>(m.param_count()) / 671e9, 1.0, 0.005) << m.param_count();
  // q_lora_rank null (DeepSeek-V2-Lite's form): q_proj instead of the query latent.
  const ModelConfig lite = hf_config_parse(deepseek_with(R"("q_lora_rank": null)"), "config.json").model;
  EXPECT_EQ(lite.q_lora_rank, 0);
  EXPECT_EQ(m.param_count() - lite.param_count(),
            int64_t{61} * ((int64_t{1536} * 7168 + 1536 + 128 * 192 * 1536) - int64_t{128} * 192 * 7168));
}

// What transformers 5.24's save_pretrained writes for a DeepseekV3ForCausalLM made from DeepseekV3Config
// (scripts/interop_hf_in.py, case deepseek_noq_yarn, checked there against transformers' logits): the 5.x
// spelling (rope_parameters, dtype) with the derived head_dim and qk_head_dim, num_nextn_predict_layers
// (its num_mtp_layers, whose modules the class does not build), pretraining_tp and output_router_logits.
constexpr const char* kDeepseekV3Transformers5 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 0, "dtype": "bfloat16", "eos_token_id": 1, "first_k_dense_replace": 1, "head_dim": 8,
  "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 96,
  "kv_lora_rank": 24, "max_position_embeddings": 256, "model_type": "deepseek_v3", "moe_intermediate_size": 32,
  "n_group": 1, "n_routed_experts": 8, "n_shared_experts": 1, "norm_topk_prob": false, "num_attention_heads": 4,
  "num_experts_per_tok": 2, "num_hidden_layers": 3, "num_key_value_heads": 4, "num_nextn_predict_layers": 1,
  "output_router_logits": false, "pad_token_id": null, "pretraining_tp": 1, "q_lora_rank": null,
  "qk_head_dim": 24, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "rms_norm_eps": 1e-06,
  "rope_interleave": false,
  "rope_parameters": {"factor": 4.0, "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 64,
                      "rope_theta": 10000.0, "rope_type": "yarn"},
  "routed_scaling_factor": 2.5, "tie_word_embeddings": false, "topk_group": 1, "transformers_version": "5.24.0",
  "use_cache": true, "v_head_dim": 12, "vocab_size": 128})";

TEST(HfConfig, TransformersDeepseekV3Parses) {
  const HfConfig c = hf_config_parse(kDeepseekV3Transformers5, "deepseek_noq_yarn/config.json");
  const ModelConfig& m = c.model;
  EXPECT_TRUE(m.is_deepseek());
  EXPECT_EQ(c.dtype, "bfloat16");
  EXPECT_EQ(m.q_lora_rank, 0);  // null: q_proj
  EXPECT_EQ(m.kv_lora_rank, 24);
  EXPECT_EQ(m.head_dim, 8);
  EXPECT_EQ(m.qk_head_dim(), 24);
  EXPECT_EQ(m.value_head_dim(), 12);
  EXPECT_FALSE(m.rope_interleave);
  EXPECT_FALSE(m.norm_topk_prob);
  EXPECT_EQ(m.n_group, 1);
  EXPECT_EQ(m.first_k_dense_replace, 1);
  EXPECT_EQ(m.intermediate_size, 96);  // the dense first layer's width
  EXPECT_EQ(m.rope_theta, 10000.0);
  EXPECT_EQ(m.rope_scaling.kind, RopeScaling::Kind::Kind_yarn);
  EXPECT_EQ(m.rope_scaling.factor, 4.0);
  EXPECT_EQ(m.rope_scaling.original_max_position_embeddings, 64);
  EXPECT_EQ(m.rope_scaling.mscale, 1.0);
  EXPECT_EQ(m.rope_scaling.mscale_all_dim, 1.0);
  // The derived widths are checked, not ignored.
  const std::string text = kDeepseekV3Transformers5;
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {R"("qk_head_dim": 24)", R"("qk_head_dim": 25)"}, {R"("head_dim": 8)", R"("head_dim": 16)"}}) {
    std::string bad = text;
    bad.replace(bad.find(from), from.size(), to);
    try {
      hf_config_parse(bad, "config.json");
      ADD_FAILURE() << to << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(to.substr(1, to.find('"', 1) - 1)), std::string::npos) << e.what();
    }
  }
}

// Keys left out take transformers' DeepseekV3Config defaults (what transformers computes for the file).
TEST(HfConfig, DeepseekV3DefaultsAreTransformers) {
  std::string text = kDeepseekV3;
  for (const char* key : {"\"q_lora_rank\": 1536,", "\"n_group\": 8,", "\"topk_group\": 4,",
                          "\"routed_scaling_factor\": 2.5,", "\"first_k_dense_replace\": 3,", "\"n_shared_experts\": 1,",
                          "\"norm_topk_prob\": true,"}) {
    const size_t at = text.find(key);
    ASSERT_NE(at, std::string::npos) << key;
    text.erase(at, std::string(key).size());
  }
  const ModelConfig m = hf_config_parse(text, "config.json").model;
  const ModelConfig full = hf_config_parse(kDeepseekV3, "config.json").model;
  EXPECT_TRUE(model_config_differences(m, full).empty()) << fmt::format("{}", fmt::join(model_config_differences(m, full), "; "));
  // null: q_proj for q_lora_rank; refused for a count transformers' class cannot take as null.
  EXPECT_EQ(hf_config_parse(deepseek_with(R"("q_lora_rank": null)"), "c").model.q_lora_rank, 0);
  EXPECT_THROW(hf_config_parse(deepseek_with(R"("n_group": null)"), "c"), Error);
}

TEST(HfConfig, DeepseekV3RefusesByName) {
  for (const auto& [kv, needle] : std::vector<std::pair<std::string, std::string>>{
           {R"("quantization_config": {"quant_method": "fp8"})", "quantization_config"},
           {R"("moe_layer_freq": 2)", "moe_layer_freq"},
           {R"("scoring_func": "softmax")", "scoring_func"},
           {R"("topk_method": "greedy")", "topk_method"},
           {R"("q_lora_rank": 0)", "q_lora_rank"},
           {R"("n_group": 7)", "n_group"},
           {R"("attention_bias": true)", "attention_bias"},
           {R"("num_key_value_heads": 1)", "num_key_value_heads"},
           {R"("architectures": ["Qwen3MoeForCausalLM"])", "architectures"},
           {R"("head_dim": 128)", "head_dim"},
           {R"("some_new_key": 3)", "some_new_key"},
       }) {
    try {
      hf_config_parse(deepseek_with(kv), "config.json");
      ADD_FAILURE() << kv << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace fp
