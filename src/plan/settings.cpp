// --schedule items of flatpeak plan: schedule presets and key=value settings; context lengths.
#include <charconv>
#include <cmath>
#include <string>
#include <utility>

#include "core/error.h"
#include "plan/plan.h"
#include "train/config_keys.h"

namespace fp::plan {

namespace {

// What --schedule takes, from the key registry (Note [One key registry] in train/config_keys.h).
const std::string& keys_hint() {
  static const std::string hint = [] {
    std::string keys;
    for (const ConfigKey& k : config_keys()) {
      if (!(k.commands & kKeyPlan) || k.name == "moe.routing_profile") continue;
      keys += (keys.empty() ? "" : " ") + k.name + "=";
      if (!k.aliases.empty()) keys += fmt::format(" ({}=)", fmt::join(k.aliases, "= "));
    }
    return "items: baseline | flatpeak | a run-config key=value (`flatpeak keys` says what each takes; the short "
           "spelling in parentheses is an alias): " +
           keys + " | routing=balanced|hot:R:H | batch= rank= | dtype=D (every precision field)";
  }();
  return hint;
}

int64_t int_parse(std::string_view key, std::string_view v, int64_t min) {
  int64_t out = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  FP_CHECK(ec == std::errc() && p == v.data() + v.size(), keys_hint(), "--schedule {}={}: not an integer", key, v);
  FP_CHECK(out >= min, keys_hint(), "--schedule {}={}: must be at least {}", key, v, min);
  return out;
}

}  // namespace

Schedules planner_schedules() {
  Schedules s;
  s.optim.kind = OptimSchedule::Kind::Kind_auto;
  return s;
}

void settings_set_baseline(Settings& settings) {
  Schedules& s = settings.sched;
  settings.shrink = false;
  s.dispatch.kind = DispatchSchedule::Kind::Kind_standard;
  s.dispatch.token_chunk = 0;
  s.ckpt.layer_tile = 0;
  s.vocab.kind = VocabSchedule::Kind::Kind_full;
  s.ckpt.kind = CkptSchedule::Kind::Kind_device;
  s.optim.kind = OptimSchedule::Kind::Kind_auto;
}

void settings_set_flatpeak(Settings& settings) {
  Schedules& s = settings.sched;
  settings.shrink = true;
  s.dispatch.kind = DispatchSchedule::Kind::Kind_pipelined_llep;
  s.dispatch.token_chunk = kFlatpeakTokenChunk;
  s.ckpt.layer_tile = kFlatpeakLayerTile;
  s.vocab.kind = VocabSchedule::Kind::Kind_ring;
  s.ckpt.kind = CkptSchedule::Kind::Kind_sco;
  s.optim.kind = OptimSchedule::Kind::Kind_offload_stream;
}

void settings_apply(Settings& s, std::string_view item) {
  if (item == "baseline") return settings_set_baseline(s);
  if (item == "flatpeak") return settings_set_flatpeak(s);
  const size_t eq = item.find('=');
  FP_CHECK(eq != std::string_view::npos && eq > 0, keys_hint(),
           "--schedule {}: expected baseline, flatpeak or key=value", item);
  std::string_view key = item.substr(0, eq);
  const std::string_view v = item.substr(eq + 1);
  if (key == "dtype") {
    const DType d = dtype_parse(v);
    Precision& pr = s.precision;
    pr.params = pr.grads = pr.activations = pr.master = pr.moments = pr.logits = pr.router = d;
    return;
  }
  if (key == "cp" || key == "ep" || key == "fsdp")
    throw Error(fmt::format("--schedule {}: the layout is not a schedule; --mesh sets dp, cp, ep and fsdp", item),
                "give the layout with --mesh dp=D,cp=C,ep=E,fsdp=F (or the rank count with --ranks)");
  if (key == "batch") {
    s.layout.batch = int_parse(key, v, 1);
    return;
  }
  if (key == "rank") {
    s.layout.rank = int_parse(key, v, 0);
    return;
  }
  // A run-config key, by its name or its alias: the registry's parser, then the one validation.
  const ConfigKey* k = config_key_find(key, /*aliases=*/true);
  if (k == nullptr || !(k->commands & kKeyPlan))
    throw Error(fmt::format("--schedule {}: unknown key '{}'", item, key), keys_hint());
  const std::string source = fmt::format("--schedule {}", item);
  RunConfig next;
  next.schedules = s.sched;
  next.precision = s.precision;
  next.moe.routing_profile = s.routing;
  next.train.checkpoint_async = s.checkpoint_async;
  try {
    config_key_set_text(next, *k, v, source);
    schedules_validate(next.schedules, source, /*auto_optim=*/true);
  } catch (const Error& e) {
    throw Error(e.what(), keys_hint());
  }
  FP_CHECK(next.moe.routing_profile.kind != RoutingProfile::Kind::Kind_router,
           "use routing=balanced or routing=hot:R:H",
           "--schedule {}: the planner needs a routing profile (the router is data dependent)", item);
  if (k->name == "ckpt.layer_tile" || k->name == "vocab.block_tokens") s.shrink = false;  // as given
  s.sched = std::move(next.schedules);
  s.precision = std::move(next.precision);
  s.routing = next.moe.routing_profile;
  s.checkpoint_async = next.train.checkpoint_async;
}

int64_t context_parse(std::string_view s) {
  const std::string hint = "write the context as tokens: 1048576, 1M (2^20), 128K (2^17)";
  FP_CHECK(!s.empty(), hint, "empty context length");
  int64_t mult = 1;
  std::string_view num = s;
  const char last = s.back();
  if (last == 'K' || last == 'k') mult = int64_t{1} << 10;
  if (last == 'M' || last == 'm') mult = int64_t{1} << 20;
  if (last == 'G' || last == 'g') mult = int64_t{1} << 30;
  if (mult != 1) num = s.substr(0, s.size() - 1);
  int64_t v = 0;
  const auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
  FP_CHECK(ec == std::errc() && p == num.data() + num.size() && v >= 1, hint, "context '{}' is not a length", s);
  FP_CHECK(v <= (int64_t{1} << 40) / mult, hint, "context '{}' is too large", s);
  return v * mult;
}

std::string context_format(int64_t t) {
  if (t >= (int64_t{1} << 20) && t % (int64_t{1} << 20) == 0) return fmt::format("{}M", t >> 20);
  if (t >= (int64_t{1} << 10) && t % (int64_t{1} << 10) == 0) return fmt::format("{}K", t >> 10);
  return fmt::format("{}", t);
}

}  // namespace fp::plan
