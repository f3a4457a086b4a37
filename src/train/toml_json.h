// A TOML node as JSON (the key registry's values, train/config_keys.h): scalars, inline tables and
// arrays: the run config (run_config.cpp, config_keys.cpp) and the planner's model presets
// (plan/model_file.cpp).
#pragma once

#include <toml++/toml.h>

#include <nlohmann/json.hpp>
#include <string>

namespace fp {

inline nlohmann::json toml_node_json(const toml::node& n) {
  if (auto i = n.value<int64_t>(); n.is_integer() && i) return *i;
  if (auto d = n.value<double>(); n.is_floating_point() && d) return *d;
  if (auto b = n.value<bool>(); n.is_boolean() && b) return *b;
  if (auto sv = n.value<std::string>(); n.is_string() && sv) return *sv;
  if (const toml::table* t = n.as_table()) {
    nlohmann::json j = nlohmann::json::object();
    for (auto&& [k, v] : *t) j[std::string(k.str())] = toml_node_json(v);
    return j;
  }
  if (const toml::array* a = n.as_array()) {
    nlohmann::json j = nlohmann::json::array();
    for (const toml::node& e : *a) j.push_back(toml_node_json(e));
    return j;
  }
  return nullptr;  // dates and times: refused by the type check
}

}  // namespace fp
