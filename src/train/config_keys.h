// The run config's keys, each once: name, type, default, one line of doc, its validation, what a change
// on resume means and the commands that read it.
//
// Note [One key registry]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A setting reaches the engine by several routes: a TOML file, `--set table.key=value`, the planner's
// `--schedule key=value` (with its short aliases), a benchmark's flags, the config a checkpoint
// records, and the comparison a resume makes against it. Each route used to keep its own list of
// keys, so a key could be added to one and forgotten by another (a resume with another
// moe.bias_update_rate went through because the saved config did not hold it). Now every route reads
// config_keys():
//   - TOML and --set: config_parse (run_config.cpp) stores each key of the registry, in registry order,
//     and refuses any other by name;
//   - the planner's --schedule (plan/settings.cpp): the keys marked for `plan`, by name or alias;
//   - benchmark flags: config_key_flag names a flag and its help after a key (cli/bench.cpp);
//   - `flatpeak keys` prints the registry (docs/config.md is its output, checked by a test);
//   - the saved config (trainer_state.json's run_config) is config_json: every key's value;
//   - a resume compares key by key (config_resume_check): a key whose change alters the arithmetic is
//     refused by name, a key that only schedules the same arithmetic (or drives the run) may change and
//     the change is said.
// tests/unit/test_config_keys.cpp round-trips every key through TOML, --set and the saved config, and
// classifies every key for resume: a new key fails it until it is placed.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "train/run_config.h"

namespace fp {

enum class KeyType {
  KeyType_int,
  KeyType_float,
  KeyType_bool,
  KeyType_string,
  KeyType_table,
  KeyType_int_list,
  KeyType_string_list
};
// "an integer", "a number", ...: what a value of this type is written as.
const char* key_type_text(KeyType t);

// What a changed value between a checkpoint and its resume means.
enum class KeyEffect {
  KeyEffect_arithmetic,  // the model, the data, the loss or the update change: a resume refuses it by name
  KeyEffect_schedule,    // the same arithmetic scheduled otherwise (the schedules' exactness): allowed, said
  KeyEffect_run,         // how the run is driven (checkpoint cadence, stop policy): allowed, said
};
const char* key_effect_name(KeyEffect e);  // "arithmetic", "schedule", "run"

// The commands that read a key (a bit set).
enum KeyCommand : uint32_t {
  kKeyTrain = 1u << 0,  // flatpeak train (and step, bench step/checkpoint/optimizer: the whole run config)
  kKeyPlan = 1u << 1,   // flatpeak plan --schedule key=value
  kKeyBench = 1u << 2,  // a flag of flatpeak bench dispatch or vocab (config_key_flag)
  kKeyEval = 1u << 3,   // flatpeak eval --set (the keys of how the data is read)
};
// "train, plan", ...
std::string key_commands_text(uint32_t commands);

struct ConfigKey {
  std::string name;  // "vocab.block_tokens": table and key
  KeyType type;
  bool required = false;  // a run config must give it
  KeyEffect effect = KeyEffect::KeyEffect_arithmetic;
  uint32_t commands = kKeyTrain;
  std::string doc;                   // one line
  std::vector<std::string> aliases;  // the planner's short spellings ("block_tokens"), if any
  std::string flag;                  // a benchmark's flag for it ("--block-tokens"), or ""
  // Stores a value of the right type (checked before) into c; throws fp::Error "<source>: <name> ..."
  // for a value the key does not take.
  std::function<void(RunConfig& c, const nlohmann::json& v, const std::string& source)> set;
  // The value c holds, as set takes it: set(c', get(c)) gives c' the same setting. null: not set (a
  // table key at its default).
  std::function<nlohmann::json(const RunConfig& c)> get;
  // The key's own range check, run after every key is stored (cross-key checks: config_validate).
  std::function<void(const RunConfig& c, const std::string& source)> check;

  std::string table() const { return name.substr(0, name.find('.')); }
  std::string key() const { return name.substr(name.find('.') + 1); }
};

// Every key, in the order they are stored ([model] first, precision.recipe before its fields).
const std::vector<ConfigKey>& config_keys();
// By name ("vocab.block_tokens") or, with aliases, by the planner's short spelling; nullptr if none.
const ConfigKey* config_key_find(std::string_view name, bool aliases = false);
// The known tables, in registry order.
std::vector<std::string> config_tables();

// Stores value v (as a config file gives it) in key k of c: the type check ("<source>: <name> must be
// <type>", with `hint`), then k.set. The one store of TOML files, --set, --schedule and presets.
void config_key_store(RunConfig& c, const ConfigKey& k, const nlohmann::json& v, const std::string& source,
                      const char* hint = nullptr);

// Sets key k of c from text as typed on a command line (a TOML value, else a bare string); throws
// fp::Error naming source and the key.
void config_key_set_text(RunConfig& c, const ConfigKey& k, std::string_view text, const std::string& source);

// The cross-key checks of a whole config (after every key's own check): the model's relations, the
// schedules' combinations, the routing profile against the experts.
void config_validate(const RunConfig& c, const std::string& source);

// Every key's value: {"table": {"key": value, ...}, ...} (null values left out). The config a checkpoint
// records; config_parse of config_toml(c) gives c back.
nlohmann::json config_json(const RunConfig& c);
// The same as TOML text (tables in registry order).
std::string config_toml(const RunConfig& c);

// A resume's comparison of the config a checkpoint recorded (config_json of the run that wrote it, or an
// older flatpeak's subset) with this run's.
struct ResumeCheck {
  std::vector<std::string> refused;       // "key: checkpoint A, now B" of arithmetic keys, and keys unknown here
  std::vector<std::string> changed;       // the same of schedule and run keys (allowed)
  std::vector<std::string> not_recorded;  // arithmetic keys the checkpoint does not hold (older flatpeak)
};
// extend: train.steps may differ (Note [Extending a finished run] in trainer.cpp).
ResumeCheck config_resume_check(const nlohmann::json& then, const RunConfig& now, bool extend);

// A benchmark flag for key `name` (its `flag`): the flag and its help, the doc line and the key's name.
struct KeyFlag {
  std::string flag, help;
};
KeyFlag config_key_flag(std::string_view name);

// The registry as a table for people: `flatpeak keys` (text) and docs/config.md (markdown).
std::string config_keys_describe(bool markdown);

}  // namespace fp
