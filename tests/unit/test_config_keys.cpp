// The key registry (Note [One key registry], train/config_keys.h): every key round-trips through TOML,
// --set and the saved config; every key is classified for resume, and a resume refuses a changed key that
// alters the arithmetic, naming it, and lets a schedule or run key change; the planner's --schedule and
// `flatpeak keys` read the same keys; docs/config.md is `flatpeak keys --markdown`.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "plan/plan.h"
#include "train/config_keys.h"
#include "train/run_config.h"

namespace fp {

namespace {

std::string file_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const std::string kTiny = std::string(FLATPEAK_SOURCE_DIR) + "/configs/tiny.toml";

// DeepSeek-V3's layer on tiny.toml (tests/dist/dist_check.py's DEEPSEEK): the base for its own keys.
const std::vector<std::string> kDeepseek = {
    "model.model_type=deepseek_v3", "model.num_key_value_heads=4",     "model.q_lora_rank=24",
    "model.kv_lora_rank=16",        "model.qk_nope_head_dim=12",       "model.qk_rope_head_dim=16",
    "model.v_head_dim=10",          "model.n_shared_experts=1",        "model.n_group=4",
    "model.topk_group=2",           "model.routed_scaling_factor=2.5", "model.first_k_dense_replace=1",
    "model.intermediate_size=96",   "model.router_aux_loss_coef=0",    "moe.bias_update_rate=0.01"};

// gpt-oss's layer on tiny.toml (two layers: one sliding, one full): the base for its own keys.
const std::vector<std::string> kGptOss = {"model.model_type=gpt_oss", "model.swiglu_alpha=1.702",
                                          "model.swiglu_limit=7.0", "model.sliding_window=32",
                                          "model.layer_types=[\"sliding_attention\", \"full_attention\"]"};

// For every key: another valid value (as typed after --set) and whether it needs the DeepSeek base or the
// gpt-oss one. A key missing here fails RegistryKeysAreAllClassified: a new key must be given one, and so
// placed.
struct Other {
  const char* value;
  bool deepseek = false;
  bool gpt_oss = false;
};
const std::map<std::string, Other> kOther = {
    {"model.model_type", {"deepseek_v3"}},  // with DeepSeek's keys: ModelTypeChangesTheArchitecture
    {"model.hidden_size", {"96"}},
    {"model.num_hidden_layers", {"3"}},
    {"model.num_attention_heads", {"8"}},
    {"model.num_key_value_heads", {"4"}},
    {"model.head_dim", {"8"}},
    {"model.num_experts", {"16"}},
    {"model.num_experts_per_tok", {"3"}},
    {"model.moe_intermediate_size", {"32"}},
    {"model.vocab_size", {"300"}},
    {"model.rope_theta", {"500000.0"}},
    {"model.rms_norm_eps", {"1e-5"}},
    {"model.norm_topk_prob", {"false"}},
    {"model.router_aux_loss_coef", {"0.02"}},
    {"model.attention_bias", {"true"}},
    {"model.tie_word_embeddings", {"true"}},
    {"model.sliding_window", {"64"}},
    {"model.decoder_sparse_step", {"2"}},
    {"model.intermediate_size", {"128"}},
    {"model.q_lora_rank", {"0", true}},
    {"model.kv_lora_rank", {"8", true}},
    {"model.qk_nope_head_dim", {"8", true}},
    {"model.qk_rope_head_dim", {"8", true}},  // with head_dim: set below
    {"model.v_head_dim", {"12", true}},
    {"model.rope_interleave", {"true", true}},
    {"model.n_shared_experts", {"2", true}},
    {"model.n_group", {"2", true}},
    {"model.topk_group", {"1", true}},
    {"model.routed_scaling_factor", {"1.5", true}},
    {"model.first_k_dense_replace", {"0", true}},
    {"model.mlp_only_layers", {"[0]"}},
    {"model.layer_types", {"[\"full_attention\", \"sliding_attention\"]", false, true}},
    {"model.swiglu_alpha", {"1.5", false, true}},
    {"model.swiglu_limit", {"3.0", false, true}},
    {"model.rope_scaling", {"{ rope_type = \"linear\", factor = 2.0 }"}},
    {"model.seed", {"99"}},
    {"train.batch_size", {"2"}},
    {"train.seq_len", {"128"}},
    {"train.steps", {"300"}},
    {"train.checkpoint_every", {"10"}},
    {"train.keep_checkpoints", {"3"}},
    {"train.checkpoint_async", {"true"}},
    {"train.step_timeout", {"30"}},
    {"train.grad_accum", {"4"}},
    {"train.loss_spike_factor", {"5.0"}},
    {"optim.lr", {"1e-3"}},
    {"optim.beta1", {"0.8"}},
    {"optim.beta2", {"0.99"}},
    {"optim.eps", {"1e-6"}},
    {"optim.weight_decay", {"0.0"}},
    {"optim.grad_clip", {"0.5"}},
    {"optim.warmup_steps", {"5"}},
    {"optim.min_lr_ratio", {"0.5"}},
    {"optim.schedule", {"offload_stream"}},
    {"optim.bucket_params", {"4096"}},
    {"optim.slots", {"3"}},
    {"optim.update_on", {"host"}},
    {"data.source", {"/tmp/tokens.bin"}},
    {"data.task", {"recall_packed"}},
    {"data.pairs", {"3"}},
    {"data.loss_on", {"answers"}},
    {"data.seed", {"7"}},
    {"data.documents", {"eos"}},
    {"data.eos_id", {"2"}},
    {"data.context_split", {"balanced"}},
    {"eval.data", {"/tmp/val.bin"}},
    {"parallel.dp", {"2"}},
    {"parallel.cp", {"2"}},
    {"parallel.ep", {"4"}},
    {"parallel.fsdp", {"4"}},
    {"eval.every", {"50"}},
    {"eval.batches", {"4"}},
    {"moe.routing_profile", {"balanced"}},
    {"moe.dispatch", {"pipelined_llep"}},
    {"moe.bias_update_rate", {"0.002", true}},
    {"moe.token_chunk", {"64"}},
    {"llep.lambda", {"2.0"}},
    {"llep.alpha", {"1.5"}},
    {"llep.min_tokens_per_gemm", {"16"}},
    {"pipelined.chunk_cap", {"32"}},
    {"pipelined.max_chunks", {"8"}},
    {"pipelined.membership", {"contiguous"}},
    {"vocab.schedule", {"ring"}},
    {"vocab.block_tokens", {"64"}},
    {"vocab.ring_mode", {"weights"}},
    {"vocab.keep_strips", {"true"}},
    {"ckpt.schedule", {"sco"}},
    {"ckpt.host_budget", {"1GiB"}},
    {"ckpt.recompute", {"false"}},
    {"ckpt.layer_tile", {"64"}},
    {"ckpt.every", {"2"}},
    {"precision.recipe", {"bf16"}},
    {"precision.params", {"bf16"}},
    {"precision.grads", {"bf16"}},
    {"precision.activations", {"bf16"}},
    {"precision.master", {"bf16"}},
    {"precision.moments", {"bf16"}},
    {"precision.logits", {"bf16"}},
    {"precision.router", {"bf16"}},
};

// The keys a resume may change, by design: the schedules (the same arithmetic, exact against the plain
// variant) and how the run is driven. Every other key alters the arithmetic and a resume refuses it.
const std::set<std::string> kMayChangeOnResume = {"model.seed",
                                                  "train.checkpoint_every",
                                                  "train.keep_checkpoints",
                                                  "train.checkpoint_async",
                                                  "train.step_timeout",
                                                  "train.grad_accum",
                                                  "train.loss_spike_factor",
                                                  "eval.data",
                                                  "parallel.dp",
                                                  "parallel.cp",
                                                  "parallel.ep",
                                                  "parallel.fsdp",
                                                  "eval.every",
                                                  "eval.batches",
                                                  "optim.schedule",
                                                  "optim.bucket_params",
                                                  "optim.slots",
                                                  "optim.update_on",
                                                  "moe.dispatch",
                                                  "data.context_split",
                                                  "moe.token_chunk",
                                                  "llep.lambda",
                                                  "llep.alpha",
                                                  "llep.min_tokens_per_gemm",
                                                  "pipelined.chunk_cap",
                                                  "pipelined.max_chunks",
                                                  "pipelined.membership",
                                                  "vocab.schedule",
                                                  "vocab.block_tokens",
                                                  "vocab.ring_mode",
                                                  "vocab.keep_strips",
                                                  "ckpt.schedule",
                                                  "ckpt.host_budget",
                                                  "ckpt.recompute",
                                                  "ckpt.layer_tile",
                                                  "ckpt.every"};

// Extra --set items a key's other value needs to stay valid (a second key that must agree).
std::vector<std::string> companions(const std::string& key) {
  if (key == "model.qk_rope_head_dim") return {"model.head_dim=8"};
  if (key == "model.decoder_sparse_step" || key == "model.mlp_only_layers") return {"model.intermediate_size=96"};
  return {};
}

RunConfig base(bool deepseek, std::vector<std::string> more = {}, bool gpt_oss = false) {
  std::vector<std::string> sets = deepseek ? kDeepseek : gpt_oss ? kGptOss : std::vector<std::string>{};
  sets.insert(sets.end(), more.begin(), more.end());
  return config_load(kTiny, sets);
}

}  // namespace

TEST(ConfigKeys, RegistryKeysAreAllClassified) {
  std::set<std::string> names;
  for (const ConfigKey& k : config_keys()) {
    EXPECT_TRUE(names.insert(k.name).second) << "twice: " << k.name;
    EXPECT_TRUE(kOther.count(k.name)) << k.name << " has no other value in this test: give it one, and decide "
                                      << "whether a resume may change it (kMayChangeOnResume)";
    EXPECT_FALSE(k.doc.empty()) << k.name << " has no doc line";
    const bool may_change = k.effect != KeyEffect::KeyEffect_arithmetic;
    EXPECT_EQ(may_change, kMayChangeOnResume.count(k.name) == 1)
        << k.name << " is " << key_effect_name(k.effect) << " in the registry";
  }
  for (const auto& [name, other] : kOther) EXPECT_TRUE(names.count(name)) << name << ": no such key";
}

// TOML and the saved config: config_toml of a config parses back to the same config, key for key; on the
// Qwen3-MoE base and on the DeepSeek-V3 one, each with every non-model key at another value.
TEST(ConfigKeys, EveryKeyRoundTripsThroughTomlAndTheSavedConfig) {
  for (const int arch : {0, 1, 2}) {  // qwen3_moe, deepseek_v3, gpt_oss
    const bool deepseek = arch == 1;
    std::vector<std::string> more;
    for (const auto& [name, other] : kOther)
      if (name.rfind("model.", 0) != 0 && name != "moe.bias_update_rate" && name != "moe.token_chunk" &&
          name != "ckpt.layer_tile" && name != "ckpt.every")
        more.push_back(name + "=" + other.value);
    const RunConfig c = base(deepseek, more, arch == 2);
    const nlohmann::json saved = config_json(c);
    const RunConfig back = config_parse(config_toml(c), "round trip");
    EXPECT_EQ(config_json(back), saved) << config_toml(c);
    // Each key's value from the saved config alone sets the same value on a fresh config.
    for (const ConfigKey& k : config_keys()) {
      const nlohmann::json v = k.get(c);
      if (v.is_null()) continue;
      RunConfig fresh;  // of the same architecture: a key of the other one is not read (null)
      fresh.model.model_type = c.model.model_type;
      k.set(fresh, saved[k.table()][k.key()], "saved");
      EXPECT_EQ(k.get(fresh), v) << k.name;
    }
  }
}

// --set: each key at its other value reads back as that value, on top of the base (and the TOML round
// trip of that config holds).
TEST(ConfigKeys, EveryKeyTakesItsOtherValueThroughSet) {
  for (const ConfigKey& k : config_keys()) {
    if (k.name == "model.model_type") continue;  // ModelTypeChangesTheArchitecture
    const Other& o = kOther.at(k.name);
    std::vector<std::string> more = companions(k.name);
    more.push_back(k.name + "=" + o.value);
    RunConfig c;
    try {
      c = base(o.deepseek, more, o.gpt_oss);
    } catch (const Error& e) {
      ADD_FAILURE() << k.name << "=" << o.value << ": " << e.what();
      continue;
    }
    RunConfig probe;  // of the base's architecture
    probe.model.model_type = c.model.model_type;
    config_key_set_text(probe, k, o.value, "probe");
    EXPECT_EQ(k.get(c), k.get(probe)) << k.name;
    EXPECT_NE(k.get(c), k.get(base(o.deepseek, {}, o.gpt_oss))) << k.name << ": the other value is the base's";
    EXPECT_EQ(config_json(config_parse(config_toml(c), "round trip")), config_json(c)) << k.name;
  }
}

// A resume against a checkpoint of the base: a key that alters the arithmetic, changed, is refused and
// named; a schedule or run key, changed, is allowed and said.
TEST(ConfigKeys, ResumeRefusesArithmeticKeysAndAllowsScheduleKeys) {
  for (const ConfigKey& k : config_keys()) {
    if (k.name == "model.model_type") continue;  // ModelTypeChangesTheArchitecture
    const Other& o = kOther.at(k.name);
    const RunConfig then = base(o.deepseek, {}, o.gpt_oss);
    std::vector<std::string> more = companions(k.name);
    more.push_back(k.name + "=" + o.value);
    const RunConfig now = base(o.deepseek, more, o.gpt_oss);
    const ResumeCheck r = config_resume_check(config_json(then), now, false);
    auto names = [&](const std::vector<std::string>& v) {
      for (const std::string& line : v)
        if (line.rfind(k.name + ":", 0) == 0) return true;
      return false;
    };
    if (kMayChangeOnResume.count(k.name)) {
      EXPECT_TRUE(r.refused.empty()) << k.name << ": " << (r.refused.empty() ? "" : r.refused.front());
      EXPECT_TRUE(names(r.changed)) << k.name << " changed is not said";
    } else {
      EXPECT_TRUE(names(r.refused)) << k.name << " changed is not refused by name";
    }
  }
  // --extend lets train.steps change, nothing else.
  const RunConfig then = base(false), now = base(false, {"train.steps=500"});
  EXPECT_TRUE(config_resume_check(config_json(then), now, true).refused.empty());
  EXPECT_FALSE(config_resume_check(config_json(then), now, false).refused.empty());
}

// model.model_type takes the other architecture's keys with it: set through --set with them, round-tripped,
// and refused by a resume.
TEST(ConfigKeys, ModelTypeChangesTheArchitecture) {
  const RunConfig qwen = base(false), deepseek = base(true);
  EXPECT_EQ(config_key_find("model.model_type")->get(deepseek), "deepseek_v3");
  EXPECT_EQ(config_json(config_parse(config_toml(deepseek), "round trip")), config_json(deepseek));
  const ResumeCheck r = config_resume_check(config_json(qwen), deepseek, false);
  EXPECT_TRUE(std::any_of(r.refused.begin(), r.refused.end(),
                          [](const std::string& l) { return l.rfind("model.model_type:", 0) == 0; }));
  const RunConfig gpt_oss = base(false, {}, true);
  EXPECT_EQ(config_key_find("model.model_type")->get(gpt_oss), "gpt_oss");
  EXPECT_EQ(config_json(config_parse(config_toml(gpt_oss), "round trip")), config_json(gpt_oss));
  const ResumeCheck g = config_resume_check(config_json(qwen), gpt_oss, false);
  EXPECT_TRUE(std::any_of(g.refused.begin(), g.refused.end(),
                          [](const std::string& l) { return l.rfind("model.model_type:", 0) == 0; }));
  // A key of another architecture is refused by name.
  EXPECT_THROW(base(false, {"model.swiglu_limit=3.0"}), Error);
  EXPECT_THROW(base(false, {"model.q_lora_rank=8"}, true), Error);
}

// An older flatpeak's saved config (a subset; precision as one string): what it holds is compared, what it
// does not hold is named when this run sets it otherwise than the default; a key unknown here is refused.
TEST(ConfigKeys, ResumeFromAnOlderCheckpointNamesWhatItDidNotRecord) {
  const RunConfig now = base(true, {"moe.bias_update_rate=0.05"});
  nlohmann::json then = config_json(now);
  then.erase("config_format");  // an older flatpeak's: a subset
  then["moe"].erase("bias_update_rate");
  const ResumeCheck r = config_resume_check(then, now, false);
  EXPECT_TRUE(r.refused.empty());
  ASSERT_EQ(r.not_recorded.size(), 1u);
  EXPECT_EQ(r.not_recorded[0], "moe.bias_update_rate");
  nlohmann::json old = config_json(base(false));
  old.erase("config_format");
  old.erase("precision");
  old["precision"] = "params bf16";
  EXPECT_FALSE(config_resume_check(old, base(false), false).refused.empty());
  // [model] as the Hugging Face config.json (its spellings): left to the checkpoint's own config.json check.
  nlohmann::json hf = config_json(base(false));
  hf.erase("config_format");
  hf["model"] = nlohmann::json::parse(model_config_hf_json(base(false).model));
  EXPECT_TRUE(config_resume_check(hf, base(false), false).refused.empty());
  // A key this flatpeak does not know (a newer one wrote the checkpoint) is refused by name.
  nlohmann::json newer = config_json(base(false));
  newer["train"]["micro_batches"] = 4;
  const ResumeCheck rn = config_resume_check(newer, base(false), false);
  ASSERT_EQ(rn.refused.size(), 1u);
  EXPECT_EQ(rn.refused[0], "train.micro_batches: checkpoint 4, not a key of this flatpeak");
}

// Note [A device mesh]: train.batch_size is per replica; a resume may change it with parallel.dp when the
// global micro-batch, dp x batch_size, stays.
TEST(ConfigKeys, ResumeTakesAnotherMeshWithTheSameGlobalBatch) {
  const nlohmann::json then = config_json(base(false, {"parallel.dp=2", "train.batch_size=2"}));
  EXPECT_TRUE(config_resume_check(then, base(false, {"train.batch_size=4"}), false).refused.empty());
  EXPECT_TRUE(config_resume_check(then, base(false, {"parallel.dp=4", "train.batch_size=1"}), false).refused.empty());
  // Another per-replica batch on the same replicas changes the global batch: refused by name.
  const ResumeCheck r = config_resume_check(then, base(false, {"parallel.dp=2", "train.batch_size=3"}), false);
  ASSERT_EQ(r.refused.size(), 1u);
  EXPECT_EQ(r.refused[0], "train.batch_size: checkpoint 2, now 3");
  // Fewer replicas of the same batch_size: a layout change, allowed and said (as train.grad_accum's).
  const ResumeCheck fewer = config_resume_check(then, base(false, {"train.batch_size=2"}), false);
  EXPECT_TRUE(fewer.refused.empty());
  ASSERT_EQ(fewer.changed.size(), 1u);
  EXPECT_EQ(fewer.changed[0], "parallel.dp: checkpoint 2, now 1");
}

// The planner's --schedule takes the registry's plan keys by name and by alias, and nothing else.
TEST(ConfigKeys, PlannerTakesThePlanKeysByNameAndAlias) {
  for (const ConfigKey& k : config_keys()) {
    if (!(k.commands & kKeyPlan)) continue;
    const Other& o = kOther.at(k.name);
    for (const std::string& spelling : [&] {
           std::vector<std::string> v = {k.name};
           v.insert(v.end(), k.aliases.begin(), k.aliases.end());
           return v;
         }()) {
      plan::Settings s;
      s.sched = plan::planner_schedules();
      s.routing = routing_profile_parse("balanced");
      EXPECT_NO_THROW(plan::settings_apply(s, spelling + "=" + o.value)) << spelling;
      RunConfig got;
      got.schedules = s.sched;
      got.precision = s.precision;
      got.moe.routing_profile = s.routing;
      got.train.checkpoint_async = s.checkpoint_async;
      RunConfig want;
      config_key_set_text(want, k, o.value, "want");
      EXPECT_EQ(k.get(got), k.get(want)) << spelling;
    }
  }
  plan::Settings s;
  EXPECT_THROW(plan::settings_apply(s, "train.seq_len=64"), Error);  // not a plan key
}

// docs/config.md holds `flatpeak keys --markdown` after its heading: the documentation of the keys is the
// registry's.
TEST(ConfigKeys, DocsConfigIsTheRegistry) {
  const std::string doc = file_text(std::string(FLATPEAK_SOURCE_DIR) + "/docs/config.md");
  const std::string table = config_keys_describe(true);
  EXPECT_NE(doc.find(table), std::string::npos)
      << "docs/config.md is out of date: regenerate its table with `build/flatpeak keys --markdown`";
}

}  // namespace fp
