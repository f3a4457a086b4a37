#include "train/run_config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

#include "core/error.h"
#include "core/units.h"
#include "model/hf_config.h"
#include "model/routing.h"
#include "train/config_keys.h"
#include "train/toml_json.h"

namespace fp {

namespace {

constexpr const char* kTomlHint = "see configs/tiny.toml for a complete, commented example";

// "a.b=value": value parsed as a TOML value, or taken as a bare string when it is not one.
void override_apply(toml::table& doc, const std::string& ov, const std::string& source) {
  const size_t eq = ov.find('=');
  FP_CHECK(eq != std::string::npos && eq > 0, "write --set table.key=value, e.g. --set model.hidden_size=128",
           "{}: override '{}' is not of the form table.key=value", source, ov);
  std::string path = ov.substr(0, eq);
  std::string value = ov.substr(eq + 1);
  const size_t dot = path.find('.');
  FP_CHECK(dot != std::string::npos && dot > 0 && dot + 1 < path.size(),
           "keys are written table.key, e.g. model.hidden_size or train.seq_len", "{}: override key '{}' has no table",
           source, path);
  const std::string table = path.substr(0, dot);
  const std::string key = path.substr(dot + 1);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", value}};
  }
  if (!doc.contains(table)) doc.insert(table, toml::table{});
  toml::table* t = doc[table].as_table();
  FP_CHECK(t != nullptr, kTomlHint, "{}: '{}' is not a table", source, table);
  t->insert_or_assign(key, *parsed["v"].node());
}

// Note [A model from a checkpoint]: with `train --init-from DIR` the architecture is DIR's config.json;
// the run config's [model] table is optional, and each key it does give must agree (checked after the
// build). Every [model] key it leaves out is filled in here from the checkpoint, so the run's own config
// (metrics, trainer_state.json, resume checks) names the whole model as before. router_aux_loss_coef is the
// exception: a training choice, not the model's function, it may differ (model_function_differences).
void model_fill(toml::table& doc, const ModelConfig& m) {
  if (!doc.contains("model")) doc.insert("model", toml::table{});
  toml::table* t = doc["model"].as_table();
  if (t == nullptr) return;  // config_build reports "[model] must be a table"
  if (!t->contains("model_type")) t->insert("model_type", std::string(model_type_name(m.model_type)));
  model_keys_visit(m, [&](const char* key, const auto& v) {
    if (!t->contains(key)) t->insert(key, v);
  });
  if (!t->contains("seed")) t->insert("seed", static_cast<int64_t>(m.seed));
  if (!m.mlp_only_layers.empty() && !t->contains("mlp_only_layers")) {
    toml::array a;
    for (int64_t l : m.mlp_only_layers) a.push_back(l);
    t->insert("mlp_only_layers", a);
  }
  if (!m.layer_types.empty() && !t->contains("layer_types")) {
    toml::array a;
    for (const std::string& l : m.layer_types) a.push_back(l);
    t->insert("layer_types", a);
  }
  if (m.rope_scaling.kind != RopeScaling::Kind::Kind_default && !t->contains("rope_scaling")) {
    toml::table r;
    const nlohmann::json j = rope_scaling_json(m.rope_scaling);  // outlives the loop (items() is a view)
    for (auto& [k, v] : j.items()) {
      if (v.is_number_integer())
        r.insert(k, v.get<int64_t>());
      else if (v.is_number())
        r.insert(k, v.get<double>());
      else if (v.is_boolean())
        r.insert(k, v.get<bool>());
      else
        r.insert(k, v.get<std::string>());
    }
    t->insert("rope_scaling", r);
  }
}

// The config of a parsed document (overrides applied): unknown keys refused, every key of the registry
// (train/config_keys.h) stored in its order and checked.
RunConfig config_build(const toml::table& doc, const std::string& source) {
  RunConfig c;
  c.source = source;
  const std::vector<ConfigKey>& keys = config_keys();
  const std::vector<std::string> tables = config_tables();

  // Unknown tables and keys first: a typo must not silently fall back to a default.
  for (auto&& [tkey, tnode] : doc) {
    const std::string tname(tkey.str());
    FP_CHECK(std::find(tables.begin(), tables.end(), tname) != tables.end(),
             fmt::format("known tables: [{}]", fmt::join(tables, "], [")), "{}: unknown table [{}]", source, tname);
    const toml::table* t = tnode.as_table();
    FP_CHECK(t != nullptr, kTomlHint, "{}: '{}' must be a table ([{}])", source, tname, tname);
    for (auto&& [k, v] : *t) {
      const std::string name = tname + "." + std::string(k.str());
      if (config_key_find(name) != nullptr) continue;
      // [ckpt] is the activation checkpoints' schedule; writing the checkpoint files is [train]'s.
      FP_CHECK(name != "ckpt.async", "[ckpt] holds the activation checkpoints' schedule (SCO, recompute)",
               "{}: unknown key ckpt.async: checkpoints written in the background are train.checkpoint_async = true",
               source);
      std::string known;
      for (const ConfigKey& f : keys)
        if (f.table() == tname) known += (known.empty() ? "" : ", ") + f.key();
      throw Error(fmt::format("{}: unknown key {}", source, name),
                  "keys of [" + tname + "]: " + known + " (`flatpeak keys` lists them all)");
    }
  }
  for (const ConfigKey& k : keys) {
    const toml::node* n = doc.at_path(k.name).node();
    if (n == nullptr) {
      FP_CHECK(!k.required, kTomlHint, "{}: missing key {}", source, k.name);
      continue;
    }
    config_key_store(c, k, toml_node_json(*n), source, kTomlHint);
  }

  // MLA: head_dim is the RoPE width; a config may leave it out.
  if (doc.at_path("model.head_dim").node() == nullptr) {
    FP_CHECK(c.model.is_deepseek(), kTomlHint, "{}: missing key model.head_dim", source);
    c.model.head_dim = c.model.qk_rope_head_dim;
  }
  FP_CHECK(c.model.router_sigmoid() || doc.at_path("moe.bias_update_rate").node() == nullptr,
           "moe.bias_update_rate moves DeepSeek-V3's e_score_correction_bias (model_type \"deepseek_v3\")",
           "{}: moe.bias_update_rate is set, but model_type \"{}\" has no routing bias", source,
           model_type_name(c.model.model_type));
  config_validate(c, source);
  return c;
}
}  // namespace

RunConfig config_parse(const std::string& text, const std::string& source, const std::vector<std::string>& overrides,
                       const ModelConfig* model_from) {
  toml::table doc;
  try {
    doc = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    throw Error(fmt::format("{}:{}:{}: malformed TOML: {}", source, where.line, where.column, e.description()),
                kTomlHint);
  }
  for (const std::string& ov : overrides) override_apply(doc, ov, source);
  if (model_from != nullptr) model_fill(doc, *model_from);
  try {
    RunConfig c = config_build(doc, source);
    if (model_from != nullptr) {
      // Note [A model from a checkpoint]: the keys the config gives must be the checkpoint's, but the
      // load-balancing loss's weight, which the run may choose (model_function_differences).
      const std::vector<std::string> diff = model_function_differences(c.model, *model_from);
      FP_CHECK(diff.empty(),
               "leave [model] out of the run config (the checkpoint's config.json describes the model), or make "
               "it agree",
               "{}: [model] disagrees with the checkpoint's config.json: {} (config vs checkpoint)", source,
               fmt::join(diff, "; "));
    }
    return c;
  } catch (const Error& e) {
    // A value that came from --set is the user's typing, not the file's: say so.
    const std::string what = e.what(), prefix = source + ": ";
    for (const std::string& ov : overrides) {
      const std::string key = ov.substr(0, ov.find('='));
      if (what.rfind(prefix, 0) == 0 && what.find(key) != std::string::npos)
        throw Error(fmt::format("--set {} (over {}): {}", ov, source, what.substr(prefix.size())), e.hint());
    }
    throw;
  }
}

RunConfig config_load(const std::string& path, const std::vector<std::string>& overrides,
                      const ModelConfig* model_from) {
  std::ifstream in(path);
  FP_CHECK(in.good(), "pass --config with the path of a TOML file, e.g. configs/tiny.toml",
           "cannot read config file '{}'", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return config_parse(ss.str(), path, overrides, model_from);
}

std::string oom_hint(Category c, const std::string& space, const RunConfig& cfg) {
  const Schedules& s = cfg.schedules;
  if (space == "host")
    return fmt::format("raise --host-mem: host memory holds the {} that the offload schedules moved off the device{}",
                       category_name(c),
                       s.ckpt.kind == CkptSchedule::Kind::Kind_sco ? " (or lower ckpt.host_budget: boundaries over "
                                                                     "it stay on the device)"
                                                                   : "");
  switch (c) {
    case Category::Category_dispatch:
      if (s.dispatch.kind == DispatchSchedule::Kind::Kind_pipelined_llep)
        return "moe.dispatch is already pipelined_llep: lower pipelined.chunk_cap (each chunk's buffers are "
               "2 * W * k * c_eff * H * bytes), or use more ranks";
      break;
    case Category::Category_vocab:
      if (s.vocab.kind == VocabSchedule::Kind::Kind_ring)
        return "vocab.schedule is already ring: lower vocab.block_tokens (block_tokens x V/P logit strips)";
      break;
    case Category::Category_activations:
      if (!s.ckpt.recompute)
        return "ckpt.recompute is false: every layer's activations stay from forward to backward; set "
               "ckpt.recompute = true to keep one layer's at a time (the backward recomputes each layer)";
      break;
    case Category::Category_checkpoints:
      if (s.ckpt.kind == CkptSchedule::Kind::Kind_sco)
        return "ckpt.schedule is already sco: boundaries stay on the device when the host has no room for them: "
               "raise --host-mem (or ckpt.host_budget); at most two then stay on the device";
      break;
    case Category::Category_optimizer:
      if (s.optim.kind == OptimSchedule::Kind::Kind_offload_stream)
        return "optim.schedule is already offload_stream: the device holds optim.slots x the largest bucket x 16 B; "
               "lower optim.bucket_params or optim.slots";
      if (s.optim.kind == OptimSchedule::Kind::Kind_offload_serial)
        return "optim.schedule is offload_serial: its device side is the weights and gradients; the state is on "
               "the host already";
      break;
    default:
      break;
  }
  return std::string(category_hint(c));
}

}  // namespace fp
