// --schedule items of flatpeak plan: schedule presets and key=value settings; context lengths.
#include <charconv>
#include <cmath>
#include <string>
#include <utility>

#include "core/error.h"
#include "plan/plan.h"

namespace fp::plan {

namespace {

constexpr const char* kKeysHint =
    "items: baseline | flatpeak | a run-config schedule key=value: moe.dispatch=standard|llep|pipelined_llep "
    "vocab.schedule=full|ring ckpt.schedule=device|sco optim.schedule=auto|device|offload_serial|offload_stream "
    "vocab.block_tokens= vocab.ring_mode= vocab.keep_strips= pipelined.chunk_cap= pipelined.max_chunks= "
    "pipelined.membership=strided|contiguous llep.lambda= llep.alpha= llep.min_tokens_per_gemm= "
    "moe.token_chunk= (0: the whole token side at once) optim.bucket_params= optim.slots= "
    "optim.update_on=device|host ckpt.host_budget=SIZE ckpt.recompute=true|false | batch= rank= | "
    "routing=balanced|hot:R:H | "
    "precision.recipe=fp32|bf16 | precision.params= precision.grads= precision.activations= precision.master= "
    "precision.moments= precision.logits= precision.router= (f32|bf16|f16) | dtype=D (every field) | "
    "aliases: dispatch= vocab= ckpt= optim= block_tokens= chunk_tokens= chunk_cap= ckpt_host_budget= ... "
    "(the key without its table)";

// The planner's older short spellings, aliases of the run config's names (documented in --help).
constexpr std::pair<std::string_view, std::string_view> kAliases[] = {
    {"dispatch", "moe.dispatch"},
    {"vocab", "vocab.schedule"},
    {"ckpt", "ckpt.schedule"},
    {"optim", "optim.schedule"},
    {"block_tokens", "vocab.block_tokens"},
    {"ring_mode", "vocab.ring_mode"},
    {"keep_strips", "vocab.keep_strips"},
    {"chunk_tokens", "pipelined.chunk_cap"},
    {"chunk_cap", "pipelined.chunk_cap"},
    {"max_chunks", "pipelined.max_chunks"},
    {"membership", "pipelined.membership"},
    {"lambda", "llep.lambda"},
    {"alpha", "llep.alpha"},
    {"min_tokens_per_gemm", "llep.min_tokens_per_gemm"},
    {"token_chunk", "moe.token_chunk"},
    {"bucket_params", "optim.bucket_params"},
    {"slots", "optim.slots"},
    {"update_on", "optim.update_on"},
    {"ckpt_host_budget", "ckpt.host_budget"},
    {"recompute", "ckpt.recompute"},
    {"dtype.weights", "precision.params"},
    {"dtype.grads", "precision.grads"},
    {"dtype.activations", "precision.activations"},
    {"dtype.master", "precision.master"},
    {"dtype.moments", "precision.moments"},
    {"dtype.logits", "precision.logits"},
    {"dtype.router", "precision.router"},
};

int64_t int_parse(std::string_view key, std::string_view v, int64_t min) {
  int64_t out = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  FP_CHECK(ec == std::errc() && p == v.data() + v.size(), kKeysHint, "--schedule {}={}: not an integer", key, v);
  FP_CHECK(out >= min, kKeysHint, "--schedule {}={}: must be at least {}", key, v, min);
  return out;
}

}  // namespace

Schedules planner_schedules() {
  Schedules s;
  s.optim.kind = OptimSchedule::Kind::Kind_auto;
  s.precision = precision_recipe("bf16");
  return s;
}

void schedules_set_baseline(Schedules& s) {
  s.dispatch.kind = DispatchSchedule::Kind::Kind_standard;
  s.dispatch.token_chunk = 0;
  s.vocab.kind = VocabSchedule::Kind::Kind_full;
  s.ckpt.kind = CkptSchedule::Kind::Kind_device;
  s.optim.kind = OptimSchedule::Kind::Kind_auto;
}

void schedules_set_flatpeak(Schedules& s) {
  s.dispatch.kind = DispatchSchedule::Kind::Kind_pipelined_llep;
  s.dispatch.token_chunk = kFlatpeakTokenChunk;
  s.vocab.kind = VocabSchedule::Kind::Kind_ring;
  s.ckpt.kind = CkptSchedule::Kind::Kind_sco;
  s.optim.kind = OptimSchedule::Kind::Kind_offload_stream;
}

void settings_apply(Settings& s, std::string_view item) {
  if (item == "baseline") return schedules_set_baseline(s.sched);
  if (item == "flatpeak") return schedules_set_flatpeak(s.sched);
  const size_t eq = item.find('=');
  FP_CHECK(eq != std::string_view::npos && eq > 0, kKeysHint, "--schedule {}: expected baseline, flatpeak or key=value",
           item);
  std::string_view key = item.substr(0, eq);
  const std::string_view v = item.substr(eq + 1);
  for (const auto& [alias, name] : kAliases)
    if (key == alias) key = name;
  if (key == "dtype") {
    const DType d = dtype_parse(v);
    Precision& pr = s.sched.precision;
    pr.params = pr.grads = pr.activations = pr.master = pr.moments = pr.logits = pr.router = d;
    return;
  }
  if (key == "cp" || key == "ep" || key == "fsdp")
    throw Error(fmt::format("--schedule {}: the engine runs one layout, cp = ep = fsdp = W (context parallel over "
                            "every rank, every dense parameter sharded over W, E / W experts per rank), and a plan "
                            "is a run of the engine",
                            item),
                "give the rank count with --ranks; other layouts are not implemented");
  if (key == "batch") {
    s.layout.batch = int_parse(key, v, 1);
    return;
  }
  if (key == "rank") {
    s.layout.rank = int_parse(key, v, 0);
    return;
  }
  if (key == "routing") {
    s.routing = routing_profile_parse(std::string(v), "--schedule routing");
    FP_CHECK(s.routing.kind != RoutingProfile::Kind::Kind_router, "use routing=balanced or routing=hot:R:H",
             "--schedule routing=router: the planner needs a routing profile (the router is data dependent)");
    return;
  }
  // A schedule setting: the one parser and the one validation (model/schedules.h), with this item's hint.
  try {
    Schedules next = s.sched;
    if (!schedules_set(next, key, v, fmt::format("--schedule {}", item)))
      throw Error(fmt::format("--schedule {}: unknown key '{}'", item, item.substr(0, eq)), kKeysHint);
    schedules_validate(next, fmt::format("--schedule {}", item), /*auto_optim=*/true);
    s.sched = std::move(next);
  } catch (const Error& e) {
    throw Error(e.what(), kKeysHint);
  }
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
