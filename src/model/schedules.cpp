// The one schedule and config model (model/schedules.h): the names of the families, setting one
// setting by its dotted name, and the one validation.
#include "model/schedules.h"

#include <charconv>
#include <cmath>
#include <type_traits>
#include <utility>

#include "core/error.h"

namespace fp {

namespace {

constexpr const char* kSchedulesHint = "see configs/tiny.toml and docs/design.md for the schedule settings";

constexpr std::pair<std::string_view, VocabSchedule::Kind> kVocabNames[] = {{"full", VocabSchedule::Kind::Kind_full},
                                                                            {"ring", VocabSchedule::Kind::Kind_ring}};
constexpr std::pair<std::string_view, CkptSchedule::Kind> kCkptNames[] = {{"device", CkptSchedule::Kind::Kind_device},
                                                                          {"sco", CkptSchedule::Kind::Kind_sco}};
constexpr std::pair<std::string_view, DispatchSchedule::Kind> kDispatchNames[] = {
    {"standard", DispatchSchedule::Kind::Kind_standard},
    {"llep", DispatchSchedule::Kind::Kind_llep},
    {"pipelined_llep", DispatchSchedule::Kind::Kind_pipelined_llep}};
constexpr std::pair<std::string_view, OptimSchedule::Kind> kOptimNames[] = {
    {"auto", OptimSchedule::Kind::Kind_auto},
    {"device", OptimSchedule::Kind::Kind_device},
    {"offload_serial", OptimSchedule::Kind::Kind_offload_serial},
    {"offload_stream", OptimSchedule::Kind::Kind_offload_stream}};

template <class Enum, size_t N>
std::string_view name_of(Enum e, const std::pair<std::string_view, Enum> (&table)[N]) {
  for (const auto& [name, value] : table)
    if (value == e) return name;
  return "?";
}

// "<source>: <key> = "<value>" is not one of a|b|c" for a value outside names.
[[noreturn]] void not_one_of(std::string_view source, std::string_view key, std::string_view v,
                             std::string_view names) {
  throw Error(fmt::format("{}: {} = \"{}\" is not one of {}", source, key, v, names), kSchedulesHint);
}

template <class Enum, size_t N>
Enum enum_parse(std::string_view source, std::string_view key, std::string_view v,
                const std::pair<std::string_view, Enum> (&table)[N]) {
  std::string names;
  for (const auto& [name, value] : table) {
    if (name == v) return value;
    if (!names.empty()) names += '|';
    names += name;
  }
  not_one_of(source, key, v, names);
}

template <class T>
T number_parse(std::string_view source, std::string_view key, std::string_view v) {
  T out{};
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  bool ok = ec == std::errc() && p == v.data() + v.size();
  if constexpr (std::is_floating_point_v<T>) ok = ok && std::isfinite(out);
  FP_CHECK(ok, kSchedulesHint, "{}: {} = {} is not {}", source, key, v,
           std::is_floating_point_v<T> ? "a number" : "an integer");
  return out;
}

bool bool_parse(std::string_view source, std::string_view key, std::string_view v) {
  if (v != "true" && v != "false") not_one_of(source, key, v, "true|false");
  return v == "true";
}

}  // namespace

std::string_view schedule_name(VocabSchedule::Kind k) { return name_of(k, kVocabNames); }
std::string_view schedule_name(CkptSchedule::Kind k) { return name_of(k, kCkptNames); }
std::string_view schedule_name(DispatchSchedule::Kind k) { return name_of(k, kDispatchNames); }
std::string_view schedule_name(OptimSchedule::Kind k) { return name_of(k, kOptimNames); }
std::string_view update_on_name(const OptimSchedule& o) { return o.update_on_host ? "host" : "device"; }

bool schedules_set(Schedules& s, std::string_view key, std::string_view v, std::string_view source) {
  VocabSchedule& vo = s.vocab;
  DispatchSchedule& d = s.dispatch;
  OptimSchedule& o = s.optim;
  if (key == "vocab.schedule")
    vo.kind = enum_parse(source, key, v, kVocabNames);
  else if (key == "vocab.block_tokens") vo.block_tokens = number_parse<int64_t>(source, key, v);
  else if (key == "vocab.ring_mode") vo.ring_mode = std::string(v);  // checked by schedules_validate
  else if (key == "vocab.keep_strips") vo.keep_strips = bool_parse(source, key, v);
  else if (key == "ckpt.schedule")
    s.ckpt.kind = enum_parse(source, key, v, kCkptNames);
  else if (key == "ckpt.host_budget") {
    try {
      s.ckpt.host_budget = bytes_parse(v);
    } catch (const Error& e) {
      throw Error(fmt::format("{}: {}: {}", source, key, e.what()), e.hint());
    }
  } else if (key == "ckpt.recompute") s.ckpt.recompute = bool_parse(source, key, v);
  else if (key == "ckpt.layer_tile")
    s.ckpt.layer_tile = number_parse<int64_t>(source, key, v);
  else if (key == "ckpt.every")
    s.ckpt.every = number_parse<int64_t>(source, key, v);
  else if (key == "moe.dispatch")
    d.kind = enum_parse(source, key, v, kDispatchNames);
  else if (key == "moe.token_chunk") d.token_chunk = number_parse<int64_t>(source, key, v);
  else if (key == "llep.lambda") d.lambda = number_parse<double>(source, key, v);
  else if (key == "llep.alpha") d.alpha = number_parse<double>(source, key, v);
  else if (key == "llep.min_tokens_per_gemm") d.min_tokens_per_gemm = number_parse<int64_t>(source, key, v);
  else if (key == "pipelined.chunk_cap") d.chunk_cap = number_parse<int64_t>(source, key, v);
  else if (key == "pipelined.max_chunks") d.max_chunks = number_parse<int64_t>(source, key, v);
  else if (key == "pipelined.membership") {
    if (v != "strided" && v != "contiguous") not_one_of(source, key, v, "strided|contiguous");
    d.strided = v == "strided";
  } else if (key == "optim.schedule")
    o.kind = enum_parse(source, key, v, kOptimNames);
  else if (key == "optim.bucket_params") o.bucket_params = number_parse<int64_t>(source, key, v);
  else if (key == "optim.slots") o.slots = number_parse<int64_t>(source, key, v);
  else if (key == "optim.update_on") {
    if (v != "device" && v != "host") not_one_of(source, key, v, "device|host");
    o.update_on_host = v == "host";
  } else return false;
  return true;
}

void schedules_validate(const Schedules& s, std::string_view source, bool auto_optim) {
  const VocabSchedule& vo = s.vocab;
  const DispatchSchedule& d = s.dispatch;
  const OptimSchedule& o = s.optim;
  FP_CHECK(auto_optim || o.kind != OptimSchedule::Kind::Kind_auto,
           "write \"device\", \"offload_serial\" or \"offload_stream\" (auto is the planner's baseline rule)",
           "{}: optim.schedule = \"auto\" is resolved only by flatpeak plan", source);
  FP_CHECK(o.bucket_params >= 1, kSchedulesHint, "{}: optim.bucket_params = {} must be >= 1", source, o.bucket_params);
  FP_CHECK(o.slots >= 1, kSchedulesHint, "{}: optim.slots = {} must be >= 1", source, o.slots);
  FP_CHECK(vo.block_tokens >= 1, kSchedulesHint, "{}: vocab.block_tokens = {} must be >= 1", source, vo.block_tokens);
  if (vo.ring_mode != "auto" && vo.ring_mode != "weights" && vo.ring_mode != "activations")
    not_one_of(source, "vocab.ring_mode", vo.ring_mode, "weights|activations|auto");
  FP_CHECK(std::isfinite(d.lambda) && d.lambda > 0, "1.3 plans once the busiest rank has 30% more than the mean",
           "{}: llep.lambda = {} must be > 0", source, d.lambda);
  FP_CHECK(std::isfinite(d.alpha) && d.alpha > 0, "1.0 caps every rank at the mean load",
           "{}: llep.alpha = {} must be > 0", source, d.alpha);
  FP_CHECK(d.min_tokens_per_gemm >= 1, kSchedulesHint, "{}: llep.min_tokens_per_gemm = {} must be >= 1", source,
           d.min_tokens_per_gemm);
  FP_CHECK(d.chunk_cap >= 1, kSchedulesHint, "{}: pipelined.chunk_cap = {} must be >= 1", source, d.chunk_cap);
  FP_CHECK(d.token_chunk >= 0, "tokens of a rank per chunk of the MoE block's token side; 0: all at once",
           "{}: moe.token_chunk = {} must be >= 0", source, d.token_chunk);
  // The chunks bound the MoE token side of the one layer being recomputed; without recompute every layer's
  // is kept whole (Note [No recompute] in step/step.h), so a chunk size would be ignored: refused instead.
  FP_CHECK(s.ckpt.recompute || d.token_chunk == 0,
           "set moe.token_chunk = 0 (the kept layers are whole), or ckpt.recompute = true (the chunks bound the "
           "layer being recomputed)",
           "{}: moe.token_chunk = {} needs ckpt.recompute = true", source, d.token_chunk);
  FP_CHECK(s.ckpt.layer_tile >= 0, "tokens of a rank per tile of a layer's token-wise work; 0: whole layers",
           "{}: ckpt.layer_tile = {} must be >= 0", source, s.ckpt.layer_tile);
  // The tiles bound the one layer being recomputed (Note [Sequence-tiled layers]); kept layers are whole.
  FP_CHECK(s.ckpt.recompute || s.ckpt.layer_tile == 0,
           "set ckpt.layer_tile = 0 (the kept layers are whole), or ckpt.recompute = true (the tiles bound the layer "
           "being recomputed)",
           "{}: ckpt.layer_tile = {} needs ckpt.recompute = true", source, s.ckpt.layer_tile);
  FP_CHECK(s.ckpt.every >= 1, "1 keeps every layer's boundary; k keeps one every k layers",
           "{}: ckpt.every = {} must be >= 1", source, s.ckpt.every);
  FP_CHECK(s.ckpt.recompute || s.ckpt.every == 1,
           "set ckpt.every = 1 (without recompute every layer's activations are kept), or ckpt.recompute = true",
           "{}: ckpt.every = {} needs ckpt.recompute = true", source, s.ckpt.every);
  FP_CHECK(d.max_chunks >= 1, kSchedulesHint, "{}: pipelined.max_chunks = {} must be >= 1", source, d.max_chunks);
}

}  // namespace fp
