// --schedule items of flatpeak plan: schedule presets and key=value settings; context lengths.
#include <charconv>
#include <cmath>
#include <string>

#include "core/error.h"
#include "plan/plan.h"

namespace fp::plan {

namespace {

constexpr const char* kKeysHint =
    "items: baseline | flatpeak | dispatch=standard|llep|pipelined_llep | vocab=full|ring | ckpt=device|sco | "
    "optim=auto|device|offload_serial|offload_stream | block_tokens= ring_mode= keep_strips= "
    "chunk_tokens= (chunk_cap=) max_chunks= membership=strided|contiguous lambda= alpha= min_tokens_per_gemm= "
    "token_chunk= (0: the whole token side at once) "
    "bucket_params= slots= update_on=device|host ckpt_host_budget=SIZE | batch= rank= | "
    "routing=balanced|hot:R:H | "
    "precision.recipe=fp32|bf16 | precision.params= precision.grads= precision.activations= precision.master= "
    "precision.moments= precision.logits= precision.router= (f32|bf16|f16) | dtype=D (every field)";

int64_t int_parse(std::string_view key, std::string_view v, int64_t min) {
  int64_t out = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  FP_CHECK(ec == std::errc() && p == v.data() + v.size(), kKeysHint, "--schedule {}={}: not an integer", key, v);
  FP_CHECK(out >= min, kKeysHint, "--schedule {}={}: must be at least {}", key, v, min);
  return out;
}

double double_parse(std::string_view key, std::string_view v, double min) {
  double out = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  FP_CHECK(ec == std::errc() && p == v.data() + v.size() && std::isfinite(out), kKeysHint,
           "--schedule {}={}: not a number", key, v);
  FP_CHECK(out >= min, kKeysHint, "--schedule {}={}: must be at least {}", key, v, min);
  return out;
}

template <class Enum, size_t N>
Enum enum_parse(std::string_view key, std::string_view v, const std::pair<std::string_view, Enum> (&table)[N]) {
  std::string names;
  for (const auto& [name, value] : table) {
    if (name == v) return value;
    if (!names.empty()) names += '|';
    names += name;
  }
  throw Error(fmt::format("--schedule {}={}: not one of {}", key, v, names), kKeysHint);
}

constexpr std::pair<std::string_view, Dispatch> kDispatch[] = {{"standard", Dispatch::Dispatch_standard},
                                                               {"llep", Dispatch::Dispatch_llep},
                                                               {"pipelined_llep", Dispatch::Dispatch_pipelined_llep}};
constexpr std::pair<std::string_view, Vocab> kVocab[] = {{"full", Vocab::Vocab_full}, {"ring", Vocab::Vocab_ring}};
constexpr std::pair<std::string_view, Ckpt> kCkpt[] = {{"device", Ckpt::Ckpt_device}, {"sco", Ckpt::Ckpt_sco}};
constexpr std::pair<std::string_view, Optim> kOptim[] = {{"auto", Optim::Optim_auto},
                                                         {"device", Optim::Optim_device},
                                                         {"offload_serial", Optim::Optim_offload_serial},
                                                         {"offload_stream", Optim::Optim_offload_stream}};

template <class Enum, size_t N>
std::string_view enum_name(Enum e, const std::pair<std::string_view, Enum> (&table)[N]) {
  for (const auto& [name, value] : table)
    if (value == e) return name;
  return "?";
}

}  // namespace

std::string_view dispatch_name(Dispatch d) { return enum_name(d, kDispatch); }
std::string_view vocab_name(Vocab v) { return enum_name(v, kVocab); }
std::string_view ckpt_name(Ckpt c) { return enum_name(c, kCkpt); }
std::string_view optim_name(Optim o) { return enum_name(o, kOptim); }

void schedules_set_baseline(Schedules& s) {
  s.dispatch = Dispatch::Dispatch_standard;
  s.token_chunk = 0;
  s.vocab = Vocab::Vocab_full;
  s.ckpt = Ckpt::Ckpt_device;
  s.optim = Optim::Optim_auto;
}

void schedules_set_flatpeak(Schedules& s) {
  s.dispatch = Dispatch::Dispatch_pipelined_llep;
  s.token_chunk = kFlatpeakTokenChunk;
  s.vocab = Vocab::Vocab_ring;
  s.ckpt = Ckpt::Ckpt_sco;
  s.optim = Optim::Optim_offload_stream;
}

void settings_apply(Settings& s, std::string_view item) {
  if (item == "baseline") return schedules_set_baseline(s.sched);
  if (item == "flatpeak") return schedules_set_flatpeak(s.sched);
  const size_t eq = item.find('=');
  FP_CHECK(eq != std::string_view::npos && eq > 0, kKeysHint, "--schedule {}: expected baseline, flatpeak or key=value",
           item);
  const std::string_view key = item.substr(0, eq), v = item.substr(eq + 1);
  Schedules& sc = s.sched;
  Precision& pr = s.precision;
  if (key == "dispatch") sc.dispatch = enum_parse(key, v, kDispatch);
  else if (key == "vocab") sc.vocab = enum_parse(key, v, kVocab);
  else if (key == "ckpt") sc.ckpt = enum_parse(key, v, kCkpt);
  else if (key == "optim") sc.optim = enum_parse(key, v, kOptim);
  else if (key == "block_tokens") sc.block_tokens = int_parse(key, v, 1);
  else if (key == "ring_mode") {
    FP_CHECK(v == "auto" || v == "weights" || v == "activations", kKeysHint,
             "--schedule ring_mode={}: not one of auto|weights|activations", v);
    sc.ring_mode = std::string(v);
  } else if (key == "keep_strips") {
    FP_CHECK(v == "true" || v == "false", kKeysHint, "--schedule keep_strips={}: not one of true|false", v);
    sc.keep_strips = v == "true";
  } else if (key == "chunk_tokens" || key == "chunk_cap") sc.chunk_tokens = int_parse(key, v, 1);
  else if (key == "membership") {
    FP_CHECK(v == "strided" || v == "contiguous", kKeysHint, "--schedule membership={}: not one of strided|contiguous",
             v);
    sc.strided = v == "strided";
  } else if (key == "lambda") sc.lambda = double_parse(key, v, 0.0);
  else if (key == "alpha") {
    sc.alpha = double_parse(key, v, 0.0);
    FP_CHECK(sc.alpha > 0, kKeysHint, "--schedule alpha={}: must be positive", v);
  } else if (key == "min_tokens_per_gemm") sc.min_tokens_per_gemm = int_parse(key, v, 1);
  else if (key == "max_chunks") sc.max_chunks = int_parse(key, v, 1);
  else if (key == "token_chunk") sc.token_chunk = int_parse(key, v, 0);
  else if (key == "bucket_params") sc.bucket_params = int_parse(key, v, 1);
  else if (key == "slots") sc.slots = int_parse(key, v, 1);
  else if (key == "update_on") {
    FP_CHECK(v == "device" || v == "host", kKeysHint, "--schedule update_on={}: not one of device|host", v);
    sc.update_on_host = v == "host";
  }
  else if (key == "ckpt_host_budget") sc.ckpt_host_budget = bytes_parse(v);
  else if (key == "cp" || key == "ep" || key == "fsdp")
    throw Error(fmt::format("--schedule {}: the engine runs one layout, cp = ep = fsdp = W (context parallel over "
                            "every rank, every dense parameter sharded over W, E / W experts per rank), and a plan "
                            "is a run of the engine",
                            item),
                "give the rank count with --ranks; other layouts are not implemented");
  else if (key == "batch") s.layout.batch = int_parse(key, v, 1);
  else if (key == "rank") s.layout.rank = int_parse(key, v, 0);
  else if (key == "routing") {
    s.routing = routing_profile_parse(std::string(v), "--schedule routing");
    FP_CHECK(s.routing.kind != RoutingProfile::Kind::Kind_router, "use routing=balanced or routing=hot:R:H",
             "--schedule routing=router: the planner needs a routing profile (the router is data dependent)");
  } else if (key == "precision.recipe") {
    FP_CHECK(v == "fp32" || v == "bf16", kKeysHint, "--schedule precision.recipe={}: not one of fp32|bf16", v);
    pr = precision_recipe(v);
  } else if (key == "dtype") {
    const DType d = dtype_parse(v);
    pr.params = pr.grads = pr.activations = pr.master = pr.moments = pr.logits = pr.router = d;
  } else if (key == "precision.params" || key == "dtype.weights") pr.params = dtype_parse(v);
  else if (key == "precision.grads" || key == "dtype.grads") pr.grads = dtype_parse(v);
  else if (key == "precision.activations" || key == "dtype.activations") pr.activations = dtype_parse(v);
  else if (key == "precision.master" || key == "dtype.master") pr.master = dtype_parse(v);
  else if (key == "precision.moments" || key == "dtype.moments") pr.moments = dtype_parse(v);
  else if (key == "precision.logits" || key == "dtype.logits") pr.logits = dtype_parse(v);
  else if (key == "precision.router" || key == "dtype.router") pr.router = dtype_parse(v);
  else throw Error(fmt::format("--schedule {}: unknown key '{}'", item, key), kKeysHint);
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
