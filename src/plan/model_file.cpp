#include "plan/model_file.h"

#include <toml++/toml.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

#include "core/error.h"
#include "model/hf_config.h"
#include "train/config_keys.h"
#include "train/toml_json.h"

namespace fp::plan {

namespace {

constexpr const char* kTomlHint = "see configs/models/*.toml for presets ([model] with Qwen3-MoE key names)";

std::string file_read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  FP_CHECK(f.good(), "check the path of --model", "cannot read model file '{}'", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string stem(const std::string& path) { return std::filesystem::path(path).stem().string(); }

}  // namespace

Model model_from_hf_json(const std::string& text, const std::string& source) {
  // The one reader of config.json (model/hf_config.h), in its plan mode.
  HfConfig hf = hf_config_parse(text, source, HfMode::HfMode_plan);
  Model m;
  m.source = source;
  m.name = hf.raw.contains("_name_or_path") && hf.raw["_name_or_path"].is_string()
               ? hf.raw["_name_or_path"].get<std::string>()
               : stem(source);
  m.cfg = std::move(hf.model);
  m.approximate = std::move(hf.approximate);
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
  // [model] through the run config's key registry (Note [One key registry] in train/config_keys.h): the
  // same names, types and stores as a run config; a preset may leave out the numbers and switches whose
  // defaults are the plain layer's, and head_dim (hidden / heads; MLA: the RoPE width).
  RunConfig rc;
  for (const ConfigKey& k : config_keys()) {
    if (k.table() != "model") continue;
    const toml::node* n = t->get(k.key());
    if (n == nullptr) {
      const bool defaulted = !k.required || k.type != KeyType::KeyType_int || k.name == "model.seed";
      FP_CHECK(defaulted, kTomlHint, "{}: missing {}", source, k.name);
      continue;
    }
    config_key_store(rc, k, toml_node_json(*n), source, kTomlHint);
  }
  ModelConfig& c = m.cfg;
  c = rc.model;
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
