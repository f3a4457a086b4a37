#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "backend/backend.h"
#include "core/error.h"
#include "core/units.h"
#include "model/hf_config.h"
#include "model/params.h"
#include "train/run_config.h"
#include "../common/tiny_config.h"

namespace fp {

namespace {

// Expects config_parse to fail with a message containing every fragment.
void expect_error(const std::string& text, std::vector<std::string> overrides,
                  std::initializer_list<const char*> fragments) {
  try {
    config_parse(text, "test.toml", overrides);
    ADD_FAILURE() << "accepted a bad config: " << (overrides.empty() ? text : overrides[0]);
  } catch (const Error& e) {
    for (const char* f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}
// Written as Hugging Face's config.json and read back, m is the same model; its parameter count is what
// the store allocates.
void expect_round_trip_and_count(const ModelConfig& m, ParamStore& ps) {
  const ModelConfig back = hf_config_parse(model_config_hf_json(m), "config.json").model;
  EXPECT_TRUE(model_config_differences(m, back).empty()) << fmt::format("{}", fmt::join(model_config_differences(m, back), "; "));
  int64_t allocated = 0;
  for (const ParamInfo& p : ps.layout()) allocated += p.shape.numel();
  EXPECT_EQ(m.param_count(), allocated);
}
}  // namespace

TEST(Config, TinyParses) {
  RunConfig c = config_parse(tiny_text(), "tiny.toml");
  EXPECT_EQ(c.model.hidden_size, 64);
  EXPECT_EQ(c.model.num_experts, 8);
  EXPECT_TRUE(c.model.norm_topk_prob);
  EXPECT_EQ(c.moe.routing_profile.kind, RoutingProfile::Kind::Kind_router);
}

TEST(Config, OverridesApply) {
  RunConfig c = config_parse(tiny_text(), "tiny.toml",
                             {"model.hidden_size=128", "moe.routing_profile=hot:0.9:2", "train.seq_len=64"});
  EXPECT_EQ(c.model.hidden_size, 128);
  EXPECT_EQ(c.train.seq_len, 64);
  EXPECT_EQ(c.moe.routing_profile.kind, RoutingProfile::Kind::Kind_hot);
  EXPECT_DOUBLE_EQ(c.moe.routing_profile.hot_fraction, 0.9);
  EXPECT_EQ(c.moe.routing_profile.hot_experts, 2);
}

TEST(Config, ErrorsNameTheKey) {
  const std::string t = tiny_text();
  expect_error(t, {"model.hidden_sise=3"}, {"unknown key model.hidden_sise"});
  expect_error(t, {"optimizer.lr=3"}, {"unknown table [optimizer]"});
  expect_error(t, {"model.num_attention_heads=5"}, {"model.num_attention_heads = 5", "num_key_value_heads = 2"});
  expect_error(t, {"model.num_experts_per_tok=9"}, {"model.num_experts_per_tok = 9", "num_experts = 8"});
  expect_error(t, {"model.head_dim=15"}, {"model.head_dim = 15", "even"});
  expect_error(t, {"model.hidden_size=0"}, {"model.hidden_size = 0"});
  expect_error(t, {"model.rms_norm_eps=-1.0"}, {"model.rms_norm_eps"});
  expect_error(t, {"model.hidden_size=\"big\""}, {"model.hidden_size must be an integer"});
  expect_error(t, {"model.norm_topk_prob=1"}, {"model.norm_topk_prob must be true or false"});
  expect_error(t, {"moe.routing_profile=hot:2:3"}, {"moe.routing_profile", "[0, 1]"});
  expect_error(t, {"moe.routing_profile=skewed"}, {"not a routing profile"});
  // k = 2: one hot expert takes at most half of the routes (Note [Hot routes per slot]).
  expect_error(t, {"moe.routing_profile=hot:0.6:1"}, {"moe.routing_profile", "at most H / k = 1 / 2"});
  expect_error(t, {"moe.routing_profile=hot:0.5:7"}, {"moe.routing_profile", "cold experts"});
  expect_error(t, {"train.seq_len=1"}, {"train.seq_len"});
  expect_error(t, {"nodot=1"}, {"has no table"});
  expect_error(t, {"model.vocab_size"}, {"table.key=value"});
}

TEST(Config, MissingKeyNamed) {
  std::string t = tiny_text();
  const size_t p = t.find("vocab_size");
  t.erase(p, t.find('\n', p) - p);
  expect_error(t, {}, {"missing key model.vocab_size"});
}

TEST(Config, MalformedTomlGivesLine) {
  expect_error("[model\nhidden_size = 3", {}, {"test.toml:1", "malformed TOML"});
}

TEST(Config, MissingFile) { EXPECT_THROW(config_load("/nonexistent/x.toml"), Error); }

TEST(Config, HuggingFaceJson) {
  RunConfig c = config_parse(tiny_text(), "tiny.toml");
  const std::string j = model_config_hf_json(c.model);
  EXPECT_NE(j.find("\"model_type\": \"qwen3_moe\""), std::string::npos);
  EXPECT_NE(j.find("\"tie_word_embeddings\": false"), std::string::npos);
}

TEST(Config, ParamCountMatchesLayout) {
  RunConfig c = config_parse(tiny_text(), "tiny.toml");
  const ModelConfig& m = c.model;
  // embed + lm_head + final norm + per layer (norms, attention, q/k norms, router, experts)
  const int64_t per_layer = 2 * 64 + (4 * 16 * 64) * 2 + (2 * 16 * 64) * 2 + 2 * 16 + 8 * 64 + 8 * 3 * 64 * 64;
  EXPECT_EQ(m.param_count(), 2 * 256 * 64 + 64 + 2 * per_layer);
}

// The layer's switches in a run config: parsed, written as Hugging Face's config.json and read back to
// the same model; the parameter count equals the parameters the store allocates.
TEST(Config, LayerSwitchesRoundTrip) {
  const RunConfig c = config_parse(tiny_text(), "tiny.toml",
                                   {"model.attention_bias=true", "model.tie_word_embeddings=true",
                                    "model.sliding_window=48", "model.mlp_only_layers=[1]",
                                    "model.intermediate_size=96",
                                    "model.rope_scaling={ rope_type = \"dynamic\", factor = 2.0, "
                                    "original_max_position_embeddings = 64 }"});
  const ModelConfig& m = c.model;
  EXPECT_TRUE(m.attention_bias && m.tie_word_embeddings);
  EXPECT_EQ(m.sliding_window, 48);
  EXPECT_EQ(m.mlp_only_layers, std::vector<int64_t>{1});
  EXPECT_FALSE(m.layer_is_sparse(1));
  EXPECT_EQ(m.rope_scaling.kind, RopeScaling::Kind::Kind_dynamic);
  auto be = backend_create("meta", kUnlimitedBytes, kUnlimitedBytes);
  ParamStore ps(m, *be);
  expect_round_trip_and_count(m, ps);
  EXPECT_EQ(ps.lm_head, ps.embed_tokens);
  EXPECT_EQ(ps.find("lm_head.weight"), nullptr);
  EXPECT_NE(ps.find("model.layers.1.mlp.down_proj.weight"), nullptr);
  EXPECT_NE(ps.find("model.layers.0.self_attn.o_proj.bias"), nullptr);
  // A list where a number belongs, and a dense layer without its width, are refused by name.
  expect_error(tiny_text(), {"model.mlp_only_layers=1"}, {"model.mlp_only_layers"});
  expect_error(tiny_text(), {"model.mlp_only_layers=[0]"}, {"intermediate_size"});
}

// model_type "deepseek_v3" in a run config: its keys parsed (head_dim defaults to the RoPE width), written
// as DeepseekV3ForCausalLM's config.json and read back to the same model; the parameter count equals the
// store's; the other architecture's keys are refused by name in each.
TEST(Config, DeepseekV3RoundTrip) {
  const std::vector<std::string> ds = {
      "model.model_type=deepseek_v3", "model.num_key_value_heads=4", "model.q_lora_rank=24",
      "model.kv_lora_rank=16",        "model.qk_nope_head_dim=12",    "model.qk_rope_head_dim=8",
      "model.v_head_dim=10",          "model.n_shared_experts=2",     "model.n_group=4",
      "model.topk_group=2",           "model.routed_scaling_factor=2.5", "model.first_k_dense_replace=1",
      "model.intermediate_size=96",   "model.router_aux_loss_coef=0", "model.rope_interleave=true",
      "moe.bias_update_rate=0.01"};
  // head_dim may be left out under MLA: it is the RoPE width.
  std::string text = tiny_text();
  const size_t at = text.find("head_dim = 16\n");
  ASSERT_NE(at, std::string::npos);
  text.erase(at, std::string("head_dim = 16\n").size());
  const RunConfig c = config_parse(text, "tiny.toml", ds);
  const ModelConfig& m = c.model;
  EXPECT_TRUE(m.is_deepseek() && m.router_sigmoid());
  EXPECT_EQ(m.qk_head_dim(), 20);
  EXPECT_EQ(m.value_head_dim(), 10);
  EXPECT_FALSE(m.layer_is_sparse(0));
  EXPECT_TRUE(m.layer_is_sparse(1));
  EXPECT_EQ(c.moe.bias_update_rate, 0.01);
  const std::string json = model_config_hf_json(m);
  EXPECT_NE(json.find("\"DeepseekV3ForCausalLM\""), std::string::npos);
  EXPECT_EQ(json.find("q_norm"), std::string::npos);
  auto be = backend_create("meta", kUnlimitedBytes, kUnlimitedBytes);
  ParamStore ps(m, *be);
  expect_round_trip_and_count(m, ps);
  EXPECT_NE(ps.find("model.layers.1.self_attn.kv_a_proj_with_mqa.weight"), nullptr);
  EXPECT_NE(ps.find("model.layers.1.mlp.gate.e_score_correction_bias"), nullptr);
  EXPECT_NE(ps.find("model.layers.1.mlp.shared_experts.down_proj.weight"), nullptr);
  EXPECT_NE(ps.find("model.layers.0.mlp.down_proj.weight"), nullptr);
  EXPECT_EQ(ps.find("model.layers.1.self_attn.q_norm.weight"), nullptr);
  EXPECT_EQ(m.head_dim, 8);
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> o = ds;
    o.insert(o.end(), extra.begin(), extra.end());
    return o;
  };
  expect_error(tiny_text(), ds, {"head_dim = 16", "qk_rope_head_dim"});  // tiny's head_dim, not the RoPE width
  expect_error(text, with({"model.n_group=3"}), {"n_group"});
  expect_error(text, with({"model.topk_group=1", "model.num_experts_per_tok=4"}), {"topk_group"});
  expect_error(text, with({"model.router_aux_loss_coef=0.01"}), {"router_aux_loss_coef"});
  expect_error(text, with({"model.sliding_window=16"}), {"sliding_window", "deepseek_v3"});
  expect_error(text, with({"model.num_key_value_heads=2"}), {"num_key_value_heads"});
  expect_error(text, with({"model.model_type=deepseek_v4"}), {"model_type", "deepseek_v4"});
  // DeepSeek's keys in a Qwen3-MoE config, and the bias rate without a sigmoid router.
  expect_error(tiny_text(), {"model.kv_lora_rank=16"}, {"kv_lora_rank", "qwen3_moe"});
  expect_error(tiny_text(), {"moe.bias_update_rate=0.01"}, {"bias_update_rate"});
}

// The schedule settings are one struct (model/schedules.h) under one name each: the run config's
// TOML keys and plan's --schedule items set the same fields, and the one validation refuses the same
// values in both. The precision recipe is its own struct beside them (core/precision.h) (tests/unit/test_plan.cpp:
// PlanSettings.RunConfigNames).
TEST(Config, SchedulesByTheirOneName) {
  const std::vector<std::string> items = {"vocab.schedule=ring",
                                          "vocab.block_tokens=96",
                                          "vocab.ring_mode=weights",
                                          "vocab.keep_strips=true",
                                          "ckpt.schedule=sco",
                                          "ckpt.host_budget=1GiB",
                                          "moe.dispatch=pipelined_llep",
                                          "moe.token_chunk=64",
                                          "llep.lambda=1.5",
                                          "llep.alpha=2.0",
                                          "llep.min_tokens_per_gemm=7",
                                          "pipelined.chunk_cap=32",
                                          "pipelined.max_chunks=5",
                                          "pipelined.membership=contiguous",
                                          "optim.schedule=offload_stream",
                                          "optim.bucket_params=500",
                                          "optim.slots=3",
                                          "optim.update_on=host"};
  const std::vector<std::string> precision_items = {"precision.recipe=bf16", "precision.logits=bf16"};
  std::vector<std::string> all = items;
  all.insert(all.end(), precision_items.begin(), precision_items.end());
  const RunConfig c = config_parse(tiny_text(), "tiny.toml", all);
  Schedules want;
  for (const std::string& it : items) {
    const size_t eq = it.find('=');
    ASSERT_TRUE(schedules_set(want, it.substr(0, eq), it.substr(eq + 1), "test")) << it;
  }
  Precision want_precision;
  for (const std::string& it : precision_items) {
    const size_t eq = it.find('=');
    EXPECT_FALSE(schedules_set(want, it.substr(0, eq), it.substr(eq + 1), "test")) << it << ": not a schedule";
    precision_key_set(want_precision, it.substr(0, eq), it.substr(eq + 1), "test");
  }
  const Schedules& s = c.schedules;
  EXPECT_EQ(s.vocab.kind, VocabSchedule::Kind::Kind_ring);
  EXPECT_EQ(s.vocab.block_tokens, 96);
  EXPECT_EQ(s.vocab.ring_mode, "weights");
  EXPECT_TRUE(s.vocab.keep_strips);
  EXPECT_EQ(s.ckpt.kind, CkptSchedule::Kind::Kind_sco);
  EXPECT_EQ(s.ckpt.host_budget, uint64_t{1} << 30);
  EXPECT_EQ(s.dispatch.kind, DispatchSchedule::Kind::Kind_pipelined_llep);
  EXPECT_EQ(s.dispatch.token_chunk, 64);
  EXPECT_EQ(s.dispatch.lambda, 1.5);
  EXPECT_EQ(s.dispatch.alpha, 2.0);
  EXPECT_EQ(s.dispatch.min_tokens_per_gemm, 7);
  EXPECT_EQ(s.dispatch.chunk_cap, 32);
  EXPECT_EQ(s.dispatch.max_chunks, 5);
  EXPECT_FALSE(s.dispatch.strided);
  EXPECT_EQ(s.optim.kind, OptimSchedule::Kind::Kind_offload_stream);
  EXPECT_EQ(s.optim.bucket_params, 500);
  EXPECT_EQ(s.optim.slots, 3);
  EXPECT_TRUE(s.optim.update_on_host);
  EXPECT_EQ(c.precision.logits, DType::DType_BF16);
  EXPECT_EQ(c.precision.params, DType::DType_BF16);
  // Every field the same as the one parser's from the same text.
  EXPECT_EQ(s.vocab.block_tokens, want.vocab.block_tokens);
  EXPECT_EQ(s.ckpt.host_budget, want.ckpt.host_budget);
  EXPECT_EQ(s.dispatch.chunk_cap, want.dispatch.chunk_cap);
  EXPECT_EQ(s.optim.slots, want.optim.slots);
  EXPECT_EQ(precision_describe(c.precision), precision_describe(want_precision));
  // The one validation: ranges, and auto only where the planner resolves it.
  expect_error(tiny_text(), {"optim.schedule=auto"}, {"optim.schedule = \"auto\""});
  expect_error(tiny_text(), {"optim.slots=0"}, {"optim.slots = 0 must be >= 1"});
  expect_error(tiny_text(), {"pipelined.chunk_cap=0"}, {"pipelined.chunk_cap = 0 must be >= 1"});
  expect_error(tiny_text(), {"moe.token_chunk=-1"}, {"moe.token_chunk = -1 must be >= 0"});
  expect_error(tiny_text(), {"vocab.schedule=rings"}, {"vocab.schedule", "not one of full|ring"});
  // ckpt.recompute (Note [No recompute] in step/step.h): true by default, a boolean, and refused beside
  // moe.token_chunk, which bounds the layer being recomputed.
  EXPECT_TRUE(config_parse(tiny_text(), "tiny.toml", {}).schedules.ckpt.recompute);
  EXPECT_FALSE(config_parse(tiny_text(), "tiny.toml", {"ckpt.recompute=false"}).schedules.ckpt.recompute);
  Schedules no_recompute;
  ASSERT_TRUE(schedules_set(no_recompute, "ckpt.recompute", "false", "test"));
  EXPECT_FALSE(no_recompute.ckpt.recompute);
  expect_error(tiny_text(), {"ckpt.recompute=false", "moe.token_chunk=64"},
               {"moe.token_chunk = 64 needs ckpt.recompute = true"});
  expect_error(tiny_text(), {"ckpt.recompute=maybe"}, {"ckpt.recompute"});
  Schedules planner = want;
  planner.optim.kind = OptimSchedule::Kind::Kind_auto;
  EXPECT_NO_THROW(schedules_validate(planner, "test", /*auto_optim=*/true));
  EXPECT_THROW(schedules_validate(planner, "test"), Error);
  EXPECT_FALSE(schedules_set(planner, "train.seq_len", "4", "test"));
}

}  // namespace fp
