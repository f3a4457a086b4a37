#include "model/config.h"

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>

#include "core/error.h"

namespace fp {

namespace {

constexpr const char* kConfigHint = "see configs/tiny.toml for a complete, commented example";

// One schema row per key: where it lives, its kind and how it is stored.
struct Field {
  std::string table;
  std::string key;
  enum class Kind { Kind_int, Kind_float, Kind_bool, Kind_string } kind;
  bool required;
  std::function<void(const toml::node&)> store;
};

std::vector<Field> schema(RunConfig& c, std::string& profile) {
  using K = Field::Kind;
  auto i64 = [](int64_t* p) { return [p](const toml::node& n) { *p = *n.value<int64_t>(); }; };
  auto f64 = [](double* p) { return [p](const toml::node& n) { *p = *n.value<double>(); }; };
  auto b = [](bool* p) { return [p](const toml::node& n) { *p = *n.value<bool>(); }; };
  ModelConfig& m = c.model;
  return {
      {"model", "hidden_size", K::Kind_int, true, i64(&m.hidden_size)},
      {"model", "num_hidden_layers", K::Kind_int, true, i64(&m.num_hidden_layers)},
      {"model", "num_attention_heads", K::Kind_int, true, i64(&m.num_attention_heads)},
      {"model", "num_key_value_heads", K::Kind_int, true, i64(&m.num_key_value_heads)},
      {"model", "head_dim", K::Kind_int, true, i64(&m.head_dim)},
      {"model", "num_experts", K::Kind_int, true, i64(&m.num_experts)},
      {"model", "num_experts_per_tok", K::Kind_int, true, i64(&m.num_experts_per_tok)},
      {"model", "moe_intermediate_size", K::Kind_int, true, i64(&m.moe_intermediate_size)},
      {"model", "vocab_size", K::Kind_int, true, i64(&m.vocab_size)},
      {"model", "rope_theta", K::Kind_float, true, f64(&m.rope_theta)},
      {"model", "rms_norm_eps", K::Kind_float, true, f64(&m.rms_norm_eps)},
      {"model", "norm_topk_prob", K::Kind_bool, true, b(&m.norm_topk_prob)},
      {"model", "router_aux_loss_coef", K::Kind_float, true, f64(&m.router_aux_loss_coef)},
      {"model", "seed", K::Kind_int, true,
       [&m](const toml::node& n) { m.seed = static_cast<uint64_t>(*n.value<int64_t>()); }},
      {"train", "batch_size", K::Kind_int, false, i64(&c.train.batch_size)},
      {"train", "seq_len", K::Kind_int, true, i64(&c.train.seq_len)},
      {"train", "steps", K::Kind_int, false, i64(&c.train.steps)},
      {"moe", "routing_profile", K::Kind_string, false,
       [&profile](const toml::node& n) { profile = *n.value<std::string>(); }},
  };
}

const char* kind_name(Field::Kind k) {
  switch (k) {
    case Field::Kind::Kind_int: return "an integer";
    case Field::Kind::Kind_float: return "a number";
    case Field::Kind::Kind_bool: return "true or false";
    case Field::Kind::Kind_string: return "a string";
  }
  return "?";
}

bool kind_matches(Field::Kind k, const toml::node& n) {
  switch (k) {
    case Field::Kind::Kind_int: return n.is_integer();
    case Field::Kind::Kind_float: return n.is_integer() || n.is_floating_point();
    case Field::Kind::Kind_bool: return n.is_boolean();
    case Field::Kind::Kind_string: return n.is_string();
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

}  // namespace

int64_t ModelConfig::param_count() const {
  const int64_t H = hidden_size, hd = head_dim;
  int64_t per_layer = 2 * H;                                                    // two RMSNorms
  per_layer += num_attention_heads * hd * H * 2 + num_key_value_heads * hd * H * 2;  // q, o, k, v
  per_layer += 2 * hd;                                                          // q_norm, k_norm
  per_layer += num_experts * H;                                                 // router
  per_layer += num_experts * 3 * moe_intermediate_size * H;                     // experts
  return 2 * vocab_size * H + H + num_hidden_layers * per_layer;
}

std::string RoutingProfile::str() const {
  switch (kind) {
    case Kind::Kind_router: return "router";
    case Kind::Kind_balanced: return "balanced";
    case Kind::Kind_hot: return fmt::format("hot:{}:{}", hot_fraction, hot_experts);
  }
  return "?";
}

RoutingProfile routing_profile_parse(const std::string& s, const std::string& key) {
  RoutingProfile p;
  const std::string hint = "write \"router\" (the model's router), \"balanced\", or \"hot:R:H\" (fraction R of the "
                           "tokens to the first H experts), e.g. \"hot:0.95:16\"";
  if (s == "router") return p;
  if (s == "balanced") {
    p.kind = RoutingProfile::Kind::Kind_balanced;
    return p;
  }
  if (s.rfind("hot:", 0) == 0) {
    const size_t c2 = s.find(':', 4);
    FP_CHECK(c2 != std::string::npos, hint, "{} = \"{}\": expected hot:R:H", key, s);
    try {
      size_t used = 0;
      p.hot_fraction = std::stod(s.substr(4, c2 - 4), &used);
      FP_CHECK(used == c2 - 4, hint, "{} = \"{}\": R is not a number", key, s);
      p.hot_experts = std::stoll(s.substr(c2 + 1), &used);
      FP_CHECK(used == s.size() - c2 - 1, hint, "{} = \"{}\": H is not an integer", key, s);
    } catch (const std::logic_error&) {
      throw Error(fmt::format("{} = \"{}\": R and H must be numbers", key, s), hint);
    }
    FP_CHECK(p.hot_fraction >= 0 && p.hot_fraction <= 1, hint, "{} = \"{}\": R must lie in [0, 1]", key, s);
    FP_CHECK(p.hot_experts >= 1, hint, "{} = \"{}\": H must be at least 1", key, s);
    p.kind = RoutingProfile::Kind::Kind_hot;
    return p;
  }
  throw Error(fmt::format("{} = \"{}\" is not a routing profile", key, s), hint);
}

void model_config_validate(const ModelConfig& m, const std::string& src) {
  auto positive = [&](const char* key, int64_t v) {
    FP_CHECK(v >= 1, kConfigHint, "{}: model.{} = {} must be at least 1", src, key, v);
  };
  positive("hidden_size", m.hidden_size);
  positive("num_hidden_layers", m.num_hidden_layers);
  positive("num_attention_heads", m.num_attention_heads);
  positive("num_key_value_heads", m.num_key_value_heads);
  positive("head_dim", m.head_dim);
  positive("num_experts", m.num_experts);
  positive("num_experts_per_tok", m.num_experts_per_tok);
  positive("moe_intermediate_size", m.moe_intermediate_size);
  positive("vocab_size", m.vocab_size);
  FP_CHECK(m.num_attention_heads % m.num_key_value_heads == 0,
           "grouped-query attention shares each key/value head among an equal number of query heads",
           "{}: model.num_attention_heads = {} is not a multiple of model.num_key_value_heads = {}", src,
           m.num_attention_heads, m.num_key_value_heads);
  FP_CHECK(m.head_dim % 2 == 0, "rotary embeddings rotate pairs of dimensions", "{}: model.head_dim = {} must be even",
           src, m.head_dim);
  FP_CHECK(m.num_experts_per_tok <= m.num_experts, "each token picks k distinct experts",
           "{}: model.num_experts_per_tok = {} exceeds model.num_experts = {}", src, m.num_experts_per_tok,
           m.num_experts);
  FP_CHECK(m.vocab_size <= 2147483647, kConfigHint, "{}: model.vocab_size = {} does not fit token ids (int32)", src,
           m.vocab_size);
  FP_CHECK(std::isfinite(m.rope_theta) && m.rope_theta > 0, kConfigHint, "{}: model.rope_theta = {} must be > 0", src,
           m.rope_theta);
  FP_CHECK(std::isfinite(m.rms_norm_eps) && m.rms_norm_eps > 0, kConfigHint, "{}: model.rms_norm_eps = {} must be > 0",
           src, m.rms_norm_eps);
  FP_CHECK(std::isfinite(m.router_aux_loss_coef) && m.router_aux_loss_coef >= 0, kConfigHint,
           "{}: model.router_aux_loss_coef = {} must be >= 0", src, m.router_aux_loss_coef);
}

RunConfig config_parse(const std::string& text, const std::string& source, const std::vector<std::string>& overrides) {
  toml::table doc;
  try {
    doc = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    throw Error(fmt::format("{}:{}:{}: malformed TOML: {}", source, where.line, where.column, e.description()),
                kConfigHint);
  }
  for (const std::string& ov : overrides) override_apply(doc, ov, source);

  RunConfig c;
  c.source = source;
  std::string profile = "router";
  std::vector<Field> fields = schema(c, profile);

  // Unknown tables and keys first: a typo must not silently fall back to a default.
  for (auto&& [tkey, tnode] : doc) {
    const std::string tname(tkey.str());
    bool known_table = false;
    for (const Field& f : fields) known_table |= (f.table == tname);
    FP_CHECK(known_table, "known tables: [model], [train], [moe]", "{}: unknown table [{}]", source, tname);
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

  model_config_validate(c.model, source);
  FP_CHECK(c.train.batch_size >= 1, kConfigHint, "{}: train.batch_size = {} must be at least 1", source,
           c.train.batch_size);
  FP_CHECK(c.train.seq_len >= 2, kConfigHint, "{}: train.seq_len = {} must be at least 2", source, c.train.seq_len);
  FP_CHECK(c.train.steps >= 1, kConfigHint, "{}: train.steps = {} must be at least 1", source, c.train.steps);
  c.moe.routing_profile = routing_profile_parse(profile);
  const RoutingProfile& p = c.moe.routing_profile;
  if (p.kind == RoutingProfile::Kind::Kind_hot) {
    FP_CHECK(p.hot_experts >= c.model.num_experts_per_tok &&
                 c.model.num_experts - p.hot_experts >= c.model.num_experts_per_tok,
             "a hot token's k slots go to k distinct hot experts and a cold token's to k distinct cold ones",
             "{}: moe.routing_profile = \"{}\" needs num_experts_per_tok ({}) <= H <= num_experts - "
             "num_experts_per_tok ({})",
             source, p.str(), c.model.num_experts_per_tok, c.model.num_experts - c.model.num_experts_per_tok);
  }
  return c;
}

RunConfig config_load(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  FP_CHECK(in.good(), "pass --config with the path of a TOML file, e.g. configs/tiny.toml",
           "cannot read config file '{}'", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return config_parse(ss.str(), path, overrides);
}

std::string model_config_hf_json(const ModelConfig& m) {
  nlohmann::ordered_json j = {
      {"architectures", {"Qwen3MoeForCausalLM"}},
      {"model_type", "qwen3_moe"},
      {"hidden_size", m.hidden_size},
      {"num_hidden_layers", m.num_hidden_layers},
      {"num_attention_heads", m.num_attention_heads},
      {"num_key_value_heads", m.num_key_value_heads},
      {"head_dim", m.head_dim},
      {"num_experts", m.num_experts},
      {"num_experts_per_tok", m.num_experts_per_tok},
      {"moe_intermediate_size", m.moe_intermediate_size},
      {"intermediate_size", m.moe_intermediate_size},
      {"decoder_sparse_step", 1},
      {"mlp_only_layers", nlohmann::json::array()},
      {"vocab_size", m.vocab_size},
      {"rope_theta", m.rope_theta},
      {"rope_scaling", nullptr},
      {"rms_norm_eps", m.rms_norm_eps},
      {"norm_topk_prob", m.norm_topk_prob},
      {"router_aux_loss_coef", m.router_aux_loss_coef},
      {"output_router_logits", true},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"use_sliding_window", false},
      {"sliding_window", nullptr},
      {"max_window_layers", m.num_hidden_layers},
      {"max_position_embeddings", 1 << 20},
      {"tie_word_embeddings", false},
      {"initializer_range", 0.02},
      {"torch_dtype", "float32"},
      {"use_cache", false},
  };
  return j.dump(2);
}

}  // namespace fp
