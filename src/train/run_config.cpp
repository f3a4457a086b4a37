#include "train/run_config.h"

#include "model/hf_config.h"

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>
#include <type_traits>

#include "core/error.h"
#include "core/units.h"
#include "model/routing.h"

namespace fp {

namespace {

constexpr const char* kConfigHint = "see configs/tiny.toml for a complete, commented example";

// One schema row per key: where it lives, its kind and how it is stored.
struct Field {
  std::string table;
  std::string key;
  enum class Kind { Kind_int, Kind_float, Kind_bool, Kind_string, Kind_table, Kind_int_list } kind;
  bool required;
  std::function<void(const toml::node&)> store;
};

// Keys read as strings first and converted after validation.
struct StringKeys {
  std::string model_type = "qwen3_moe";
  std::string profile = "router";
  std::string vocab_schedule = "full";
  std::string ckpt_schedule = "device";
  std::string ckpt_host_budget = "unlimited";
  std::string dispatch = "standard";
  std::string membership = "strided";
  std::string optim_schedule = "device";
  std::string update_on = "device";
  // [precision]: the recipe, then the fields set explicitly (applied after it, in this order).
  std::string precision_recipe = "fp32";
  std::vector<std::pair<std::string, std::string>> precision_fields;
};

// A [precision] dtype field: kept as (key, value) and applied after the recipe.
Field precision_field(const char* key, StringKeys& strings) {
  return {"precision", key, Field::Kind::Kind_string, false, [key, &strings](const toml::node& n) {
            strings.precision_fields.emplace_back(key, *n.value<std::string>());
          }};
}

// A flat TOML table of scalars as JSON (rope_scaling is written in Hugging Face's form).
nlohmann::json toml_to_json(const toml::table& t) {
  nlohmann::json j = nlohmann::json::object();
  for (auto&& [k, v] : t) {
    const std::string key(k.str());
    if (auto i = v.value<int64_t>(); v.is_integer() && i) j[key] = *i;
    else if (auto d = v.value<double>(); v.is_floating_point() && d) j[key] = *d;
    else if (auto b = v.value<bool>(); v.is_boolean() && b) j[key] = *b;
    else if (auto sv = v.value<std::string>(); v.is_string() && sv) j[key] = *sv;
    else j[key] = "<not a scalar>";  // refused by name by the parser
  }
  return j;
}

std::vector<Field> schema(RunConfig& c, StringKeys& strings) {
  using K = Field::Kind;
  auto i64 = [](int64_t* p) { return [p](const toml::node& n) { *p = *n.value<int64_t>(); }; };
  auto f64 = [](double* p) { return [p](const toml::node& n) { *p = *n.value<double>(); }; };
  auto b = [](bool* p) { return [p](const toml::node& n) { *p = *n.value<bool>(); }; };
  auto str = [](std::string* p) { return [p](const toml::node& n) { *p = *n.value<std::string>(); }; };
  ModelConfig& m = c.model;
  std::vector<Field> fields;
  model_keys_visit(m, [&](const char* key, auto& member) {
    using T = std::remove_reference_t<decltype(member)>;
    // head_dim: required but under MLA, where it is the RoPE width (checked after model_type is known).
    const bool required = !model_key_optional(key) && std::string_view(key) != "head_dim";
    if constexpr (std::is_same_v<T, int64_t>) fields.push_back({"model", key, K::Kind_int, required, i64(&member)});
    else if constexpr (std::is_same_v<T, double>) fields.push_back({"model", key, K::Kind_float, required, f64(&member)});
    else fields.push_back({"model", key, K::Kind_bool, required, b(&member)});
  });
  std::vector<Field> rest = {
      // Optional: "qwen3_moe" (default) or "deepseek_v3" (Note [Two architectures, one layer]).
      {"model", "model_type", K::Kind_string, false, str(&strings.model_type)},
      // Optional: the dense layers by index, e.g. [0, 1] (with intermediate_size).
      {"model", "mlp_only_layers", K::Kind_int_list, false,
       [&m](const toml::node& n) {
         m.mlp_only_layers.clear();
         for (const toml::node& e : *n.as_array()) m.mlp_only_layers.push_back(*e.value<int64_t>());
       }},
      // Optional: an inline table in Hugging Face's form, e.g. { rope_type = "yarn", factor = 4.0,
      // original_max_position_embeddings = 32768 } (Note [RoPE scaling as transformers computes it]).
      {"model", "rope_scaling", K::Kind_table, false,
       [&m](const toml::node& n) {
         m.rope_scaling = rope_scaling_parse(toml_to_json(*n.as_table()), "model.rope_scaling");
       }},
      {"model", "seed", K::Kind_int, true,
       [&m](const toml::node& n) { m.seed = static_cast<uint64_t>(*n.value<int64_t>()); }},
      {"train", "batch_size", K::Kind_int, false, i64(&c.train.batch_size)},
      {"train", "seq_len", K::Kind_int, true, i64(&c.train.seq_len)},
      {"train", "steps", K::Kind_int, false, i64(&c.train.steps)},
      {"train", "checkpoint_every", K::Kind_int, false, i64(&c.train.checkpoint_every)},
      {"train", "loss_spike_factor", K::Kind_float, false, f64(&c.train.loss_spike_factor)},
      {"optim", "lr", K::Kind_float, false, f64(&c.optim.lr)},
      {"optim", "beta1", K::Kind_float, false, f64(&c.optim.beta1)},
      {"optim", "beta2", K::Kind_float, false, f64(&c.optim.beta2)},
      {"optim", "eps", K::Kind_float, false, f64(&c.optim.eps)},
      {"optim", "weight_decay", K::Kind_float, false, f64(&c.optim.weight_decay)},
      {"optim", "grad_clip", K::Kind_float, false, f64(&c.optim.grad_clip)},
      {"optim", "warmup_steps", K::Kind_int, false, i64(&c.optim.warmup_steps)},
      {"optim", "min_lr_ratio", K::Kind_float, false, f64(&c.optim.min_lr_ratio)},
      {"optim", "schedule", K::Kind_string, false, str(&strings.optim_schedule)},
      {"optim", "bucket_params", K::Kind_int, false, i64(&c.schedules.optim.bucket_params)},
      {"optim", "slots", K::Kind_int, false, i64(&c.schedules.optim.slots)},
      {"optim", "update_on", K::Kind_string, false, str(&strings.update_on)},
      {"vocab", "schedule", K::Kind_string, false, str(&strings.vocab_schedule)},
      {"vocab", "block_tokens", K::Kind_int, false, i64(&c.schedules.vocab.block_tokens)},
      {"vocab", "ring_mode", K::Kind_string, false, str(&c.schedules.vocab.ring_mode)},
      {"vocab", "keep_strips", K::Kind_bool, false, b(&c.schedules.vocab.keep_strips)},
      {"ckpt", "schedule", K::Kind_string, false, str(&strings.ckpt_schedule)},
      {"ckpt", "host_budget", K::Kind_string, false, str(&strings.ckpt_host_budget)},
      {"ckpt", "recompute", K::Kind_bool, false, b(&c.schedules.ckpt.recompute)},
      {"data", "source", K::Kind_string, false, str(&c.data.source)},
      {"data", "task", K::Kind_string, false, str(&c.data.task)},
      {"data", "pairs", K::Kind_int, false, i64(&c.data.pairs)},
      {"data", "loss_on", K::Kind_string, false, str(&c.data.loss_on)},
      {"data", "seed", K::Kind_int, false,
       [&c](const toml::node& n) { c.data.seed = static_cast<uint64_t>(*n.value<int64_t>()); }},
      {"moe", "routing_profile", K::Kind_string, false,
       [&strings](const toml::node& n) { strings.profile = *n.value<std::string>(); }},
      {"moe", "dispatch", K::Kind_string, false, str(&strings.dispatch)},
      {"moe", "bias_update_rate", K::Kind_float, false, f64(&c.moe.bias_update_rate)},
      {"moe", "token_chunk", K::Kind_int, false, i64(&c.schedules.dispatch.token_chunk)},
      {"llep", "lambda", K::Kind_float, false, f64(&c.schedules.dispatch.lambda)},
      {"llep", "alpha", K::Kind_float, false, f64(&c.schedules.dispatch.alpha)},
      {"llep", "min_tokens_per_gemm", K::Kind_int, false, i64(&c.schedules.dispatch.min_tokens_per_gemm)},
      {"pipelined", "chunk_cap", K::Kind_int, false, i64(&c.schedules.dispatch.chunk_cap)},
      {"pipelined", "max_chunks", K::Kind_int, false, i64(&c.schedules.dispatch.max_chunks)},
      {"pipelined", "membership", K::Kind_string, false, str(&strings.membership)},
      {"precision", "recipe", K::Kind_string, false, str(&strings.precision_recipe)},
      precision_field("params", strings),
      precision_field("grads", strings),
      precision_field("activations", strings),
      precision_field("master", strings),
      precision_field("moments", strings),
      precision_field("logits", strings),
      precision_field("router", strings),
  };
  fields.insert(fields.end(), std::make_move_iterator(rest.begin()), std::make_move_iterator(rest.end()));
  return fields;
}

const char* kind_name(Field::Kind k) {
  switch (k) {
    case Field::Kind::Kind_int: return "an integer";
    case Field::Kind::Kind_float: return "a number";
    case Field::Kind::Kind_bool: return "true or false";
    case Field::Kind::Kind_string: return "a string";
    case Field::Kind::Kind_table: return "an inline table { key = value, ... }";
    case Field::Kind::Kind_int_list: return "a list of integers, e.g. [0, 1]";
  }
  return "?";
}

bool kind_matches(Field::Kind k, const toml::node& n) {
  switch (k) {
    case Field::Kind::Kind_int: return n.is_integer();
    case Field::Kind::Kind_float: return n.is_integer() || n.is_floating_point();
    case Field::Kind::Kind_bool: return n.is_boolean();
    case Field::Kind::Kind_string: return n.is_string();
    case Field::Kind::Kind_table: return n.is_table();
    case Field::Kind::Kind_int_list: {
      const toml::array* a = n.as_array();
      if (a == nullptr) return false;
      for (const toml::node& e : *a)
        if (!e.is_integer()) return false;
      return true;
    }
  }
  return false;
}

// "a.b=value": value parsed as a TOML value, or taken as a bare string when it is not one.
void override_apply(toml::table& doc, const std::string& ov, const std::string& source) {
  const size_t eq = ov.find('=');
  FP_CHECK(eq != std::string::npos && eq > 0, "write --set table.key=value, e.g. --set model.hidden_size=128",
           "{}: override '{}' is not of the form table.key=value", source, ov);
  std::string path = ov.substr(0, eq);
  std::string value = ov.substr(eq + 1);
  const size_t dot = path.find('.');
  FP_CHECK(dot != std::string::npos && dot > 0 && dot + 1 < path.size(),
           "keys are written table.key, e.g. model.hidden_size or train.seq_len",
           "{}: override key '{}' has no table", source, path);
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
  FP_CHECK(t != nullptr, kConfigHint, "{}: '{}' is not a table", source, table);
  t->insert_or_assign(key, *parsed["v"].node());
}

// Note [A model from a checkpoint]: with `train --init-from DIR` the architecture is DIR's config.json;
// the run config's [model] table is optional, and each key it does give must agree (checked after the
// build). Every [model] key it leaves out is filled in here from the checkpoint, so the run's own config
// (metrics, trainer_state.json, resume checks) names the whole model as before.
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
  if (m.rope_scaling.kind != RopeScaling::Kind::Kind_default && !t->contains("rope_scaling")) {
    toml::table r;
    const nlohmann::json j = rope_scaling_json(m.rope_scaling);  // outlives the loop (items() is a view)
    for (auto& [k, v] : j.items()) {
      if (v.is_number_integer()) r.insert(k, v.get<int64_t>());
      else if (v.is_number()) r.insert(k, v.get<double>());
      else if (v.is_boolean()) r.insert(k, v.get<bool>());
      else r.insert(k, v.get<std::string>());
    }
    t->insert("rope_scaling", r);
  }
}

// The config of a parsed document (overrides applied): unknown keys refused, every value checked.
RunConfig config_build(const toml::table& doc, const std::string& source) {

  RunConfig c;
  c.source = source;
  StringKeys strings;
  std::vector<Field> fields = schema(c, strings);

  // Unknown tables and keys first: a typo must not silently fall back to a default.
  for (auto&& [tkey, tnode] : doc) {
    const std::string tname(tkey.str());
    bool known_table = false;
    for (const Field& f : fields) known_table |= (f.table == tname);
    FP_CHECK(known_table, "known tables: [model], [train], [optim], [data], [moe], [vocab], [ckpt], [llep], [pipelined], [precision]", "{}: unknown table [{}]", source, tname);
    const toml::table* t = tnode.as_table();
    FP_CHECK(t != nullptr, kConfigHint, "{}: '{}' must be a table ([{}])", source, tname, tname);
    for (auto&& [k, v] : *t) {
      const std::string key(k.str());
      const Field* field = nullptr;
      for (const Field& f : fields)
        if (f.table == tname && f.key == key) field = &f;
      if (field == nullptr) {
        std::string known;
        for (const Field& f : fields)
          if (f.table == tname) known += (known.empty() ? "" : ", ") + f.key;
        throw Error(fmt::format("{}: unknown key {}.{}", source, tname, key), "keys of [" + tname + "]: " + known);
      }
      FP_CHECK(kind_matches(field->kind, v), kConfigHint, "{}: {}.{} must be {}", source, tname, key,
               kind_name(field->kind));
      field->store(v);
    }
  }
  for (const Field& f : fields) {
    const toml::node* n = doc.at_path(f.table + "." + f.key).node();
    FP_CHECK(!f.required || n != nullptr, kConfigHint, "{}: missing key {}.{}", source, f.table, f.key);
  }

  c.model.model_type = model_type_parse(strings.model_type, fmt::format("{}: model.model_type", source));
  // MLA: head_dim is the RoPE width; a config may leave it out.
  if (doc.at_path("model.head_dim").node() == nullptr) {
    FP_CHECK(c.model.is_deepseek(), kConfigHint, "{}: missing key model.head_dim", source);
    c.model.head_dim = c.model.qk_rope_head_dim;
  }
  model_config_validate(c.model, source);
  FP_CHECK(std::isfinite(c.moe.bias_update_rate) && c.moe.bias_update_rate >= 0,
           "the step of e_score_correction_bias per training step (Note [Sigmoid routing]); 0 freezes it",
           "{}: moe.bias_update_rate = {} must be >= 0", source, c.moe.bias_update_rate);
  FP_CHECK(c.model.router_sigmoid() || doc.at_path("moe.bias_update_rate").node() == nullptr,
           "moe.bias_update_rate moves DeepSeek-V3's e_score_correction_bias (model_type \"deepseek_v3\")",
           "{}: moe.bias_update_rate is set, but model_type \"{}\" has no routing bias", source,
           model_type_name(c.model.model_type));
  FP_CHECK(c.train.batch_size >= 1, kConfigHint, "{}: train.batch_size = {} must be at least 1", source,
           c.train.batch_size);
  FP_CHECK(c.train.seq_len >= 2, kConfigHint, "{}: train.seq_len = {} must be at least 2", source, c.train.seq_len);
  FP_CHECK(c.train.steps >= 1, kConfigHint, "{}: train.steps = {} must be at least 1", source, c.train.steps);
  FP_CHECK(c.train.checkpoint_every >= 0, kConfigHint, "{}: train.checkpoint_every = {} must be >= 0", source,
           c.train.checkpoint_every);
  FP_CHECK(c.train.loss_spike_factor == 0 || c.train.loss_spike_factor > 1, kConfigHint,
           "{}: train.loss_spike_factor = {} must be 0 (off) or above 1", source, c.train.loss_spike_factor);
  const OptimConfig& o = c.optim;
  FP_CHECK(std::isfinite(o.lr) && o.lr > 0, kConfigHint, "{}: optim.lr = {} must be > 0", source, o.lr);
  FP_CHECK(o.beta1 >= 0 && o.beta1 < 1, kConfigHint, "{}: optim.beta1 = {} must lie in [0, 1)", source, o.beta1);
  FP_CHECK(o.beta2 >= 0 && o.beta2 < 1, kConfigHint, "{}: optim.beta2 = {} must lie in [0, 1)", source, o.beta2);
  FP_CHECK(o.eps > 0, kConfigHint, "{}: optim.eps = {} must be > 0", source, o.eps);
  FP_CHECK(o.weight_decay >= 0, kConfigHint, "{}: optim.weight_decay = {} must be >= 0", source, o.weight_decay);
  FP_CHECK(o.grad_clip >= 0, kConfigHint, "{}: optim.grad_clip = {} must be >= 0 (0: off)", source, o.grad_clip);
  FP_CHECK(o.warmup_steps >= 0, kConfigHint, "{}: optim.warmup_steps = {} must be >= 0", source, o.warmup_steps);
  FP_CHECK(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1, kConfigHint, "{}: optim.min_lr_ratio = {} must lie in [0, 1]",
           source, o.min_lr_ratio);
  FP_CHECK(c.data.loss_on == "all" || c.data.loss_on == "answers", "write \"all\" or \"answers\"",
           "{}: data.loss_on = \"{}\" is neither \"all\" nor \"answers\"", source, c.data.loss_on);
  FP_CHECK(c.data.task == "recall" || c.data.task == "recall_packed",
           "write \"recall\" ([KEY, k, v] triples) or \"recall_packed\" (one pair token per plant); docs/data.md",
           "{}: data.task = \"{}\" is neither \"recall\" nor \"recall_packed\"", source, c.data.task);
  FP_CHECK(c.data.pairs >= 0, kConfigHint, "{}: data.pairs = {} must be >= 0", source, c.data.pairs);
  FP_CHECK(!c.data.source.empty(), "write \"recall\" or the path of a token file", "{}: data.source is empty",
           source);
  c.moe.routing_profile = routing_profile_parse(strings.profile);
  // The schedule settings read as strings, by their one name (model/schedules.h), then the one validation.
  Schedules& sc = c.schedules;
  const std::pair<const char*, const std::string*> named[] = {
      {"optim.schedule", &strings.optim_schedule}, {"optim.update_on", &strings.update_on},
      {"vocab.schedule", &strings.vocab_schedule}, {"ckpt.schedule", &strings.ckpt_schedule},
      {"ckpt.host_budget", &strings.ckpt_host_budget}, {"moe.dispatch", &strings.dispatch},
      {"pipelined.membership", &strings.membership}, {"precision.recipe", &strings.precision_recipe}};
  for (const auto& [key, value] : named) schedules_set(sc, key, *value, source);
  // [precision]: the recipe (above), then the fields given explicitly (core/precision.h).
  for (const auto& [key, value] : strings.precision_fields) schedules_set(sc, "precision." + key, value, source);
  schedules_validate(sc, source);
  routing_profile_check(c.moe.routing_profile, c.model.num_experts_per_tok, c.model.num_experts,
                        source + ": moe.routing_profile");
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
                kConfigHint);
  }
  for (const std::string& ov : overrides) override_apply(doc, ov, source);
  if (model_from != nullptr) model_fill(doc, *model_from);
  try {
    RunConfig c = config_build(doc, source);
    if (model_from != nullptr) {
      // Note [A model from a checkpoint]: the keys the config gives must be the checkpoint's.
      const std::vector<std::string> diff = model_config_differences(c.model, *model_from);
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
    default: break;
  }
  return std::string(category_hint(c));
}

}  // namespace fp
