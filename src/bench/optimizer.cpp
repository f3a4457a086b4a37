// flatpeak bench optimizer (bench/optimizer.h): the synthetic layout, the bandwidth and AdamW-kernel
// measurements, the variants' check and timing, the overlap model and the bus floor, the report.
#include "bench/optimizer.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/kernels/adamw_path.h"
#include "bench/bench_common.h"
#include "core/error.h"
#include "core/log.h"
#include "core/precision.h"
#include "core/rng.h"
#include "core/units.h"
#include "model/params.h"
#include "ops/adamw.h"
#include "sched/optim/offload.h"
#include "sched/optim/optimizer.h"
#include "train/run_config.h"

namespace fp::bench {

namespace {

// "50M" -> 50000000: K, M, G are powers of 1000 (parameter counts, not bytes).
int64_t count_parse(const std::string& s) {
  const std::string hint = "write a parameter count such as 50000000, 50M or 1.5G";
  FP_CHECK(!s.empty(), hint, "empty parameter count");
  double scale = 1;
  std::string num = s;
  switch (s.back()) {
    case 'K': case 'k': scale = 1e3; num.pop_back(); break;
    case 'M': case 'm': scale = 1e6; num.pop_back(); break;
    case 'G': case 'g': scale = 1e9; num.pop_back(); break;
    default: break;
  }
  size_t used = 0;
  double x = 0;
  try {
    x = std::stod(num, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  FP_CHECK(used == num.size() && x * scale >= 1, hint, "'{}' is not a parameter count", s);
  return static_cast<int64_t>(std::llround(x * scale));
}

// A Qwen3-MoE layout of about P parameters: 2 layers, vocabulary 4096, hidden H = 512 (halved while
// the embeddings would exceed a quarter of P, down to 32), head_dim min(128, H), experts of width H
// (3 H^2 parameters each: the tensors an MoE optimizer streams) as many as fill P.
ModelConfig bench_model(int64_t P) {
  ModelConfig m;
  m.vocab_size = 4096;
  m.hidden_size = 512;
  while (m.hidden_size > 32 && 2 * m.vocab_size * m.hidden_size > P / 4) m.hidden_size /= 2;
  m.num_hidden_layers = 2;
  m.head_dim = std::min<int64_t>(128, m.hidden_size);
  m.num_attention_heads = std::max<int64_t>(1, m.hidden_size / m.head_dim);
  m.num_key_value_heads = m.num_attention_heads >= 2 ? 2 : 1;
  m.moe_intermediate_size = m.hidden_size;
  m.num_experts = 1;
  m.num_experts_per_tok = 1;
  const int64_t H = m.hidden_size;
  const int64_t per_expert = m.num_hidden_layers * (3 * H * H + H);  // its FFN and router row, all layers
  const int64_t fixed = m.param_count() - per_expert;
  m.num_experts = std::max<int64_t>(1, (P - fixed + per_expert / 2) / per_expert);
  return m;
}

// Memory bandwidth, bytes moved (read + written) per second by glibc memcpy of a large buffer, on one
// thread (what a copy stream does) and split over the OpenMP threads; medians of `repeats`.
struct Bandwidth {
  double memcpy_one = 0, memcpy_threads = 0;
};

// AdamW's traffic without its arithmetic, split over the threads like the kernel (backend/cpu/kernels/adamw.cpp).
void adamw_traffic_loop(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                        int64_t n) {
  constexpr int64_t kBlock = 8192;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t hi = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < hi; ++i) {
      p[i] += g[i];
      m[i] -= g[i];
      v[i] += g[i];
    }
  }
}

Bandwidth bandwidth_measure(uint64_t bytes, int repeats) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::vector<double> one, all;
  for (int r = 0; r < repeats + 1; ++r) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    const double t1 = seconds_since(t0);
    t0 = Clock::now();
#pragma omp parallel
    {
      const uint64_t nt = static_cast<uint64_t>(omp_get_num_threads()), id = static_cast<uint64_t>(omp_get_thread_num());
      const uint64_t chunk = (bytes + nt - 1) / nt, lo = std::min(bytes, id * chunk), hi = std::min(bytes, lo + chunk);
      std::memcpy(a.data() + lo, b.data() + lo, hi - lo);
    }
    const double t2 = seconds_since(t0);
    if (r == 0) continue;  // first touch
    one.push_back(2.0 * static_cast<double>(bytes) / t1);
    all.push_back(2.0 * static_cast<double>(bytes) / t2);
  }
  return {median(one), median(all)};
}

// Parameters per second of the CPU AdamW kernel over P elements on each available path, with f32
// gradients and, when bf16 is set, also with bf16 gradients and the new weights rounded into a bf16
// copy (the bf16 recipe's call: Note [Offload with bf16 weights]), and of the AdamW-traffic loop on the
// same arrays, the passes alternating (so load from elsewhere on the machine falls on all alike);
// medians of repeats.
struct AdamwRates {
  nlohmann::json by_path = nlohmann::json::object();       // path name -> parameters per second
  nlohmann::json by_path_bf16 = nlohmann::json::object();  // the same with bf16 gradient and weights
  double traffic_loop = 0;                                   // elements per second of adamw_traffic_loop
};
AdamwRates adamw_rates_measure(int64_t P, int repeats, bool bf16) {
  std::vector<float> w(static_cast<size_t>(P)), g(w.size()), m(w.size(), 0.0f), v(w.size(), 0.0f);
  Rng rng(5);
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] = static_cast<float>(rng.uniform() - 0.5);
    g[i] = static_cast<float>(1e-3 * (rng.uniform() - 0.5));
  }
  std::vector<fp::bf16> g16, w16;  // (P) each, bf16 only
  if (bf16) {
    g16.resize(w.size());
    w16.resize(w.size());
    for (size_t i = 0; i < w.size(); ++i) g16[i] = {bf16_from_float(g[i])};
  }
  std::vector<ops::cpu::AdamwPath> paths;
  for (ops::cpu::AdamwPath p : {ops::cpu::AdamwPath::AdamwPath_scalar, ops::cpu::AdamwPath::AdamwPath_sse,
                                ops::cpu::AdamwPath::AdamwPath_avx2})
    if (ops::cpu::adamw_path_available(p)) paths.push_back(p);
  std::vector<std::vector<double>> rates(paths.size()), rates16(paths.size());
  std::vector<double> loop;
  for (int r = 0; r < repeats + 1; ++r) {
    for (size_t k = 0; k < paths.size(); ++k) {
      const ops::AdamWHyper h{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, r + 1};
      auto t0 = Clock::now();
      ops::cpu::adamw_update_path(paths[k], w.data(), g.data(), m.data(), v.data(), P, h, nullptr);
      if (r > 0) rates[k].push_back(static_cast<double>(P) / seconds_since(t0));
      if (!bf16) continue;
      t0 = Clock::now();
      ops::cpu::adamw_update_path(paths[k], w.data(), g16.data(), m.data(), v.data(), P, h, w16.data());
      if (r > 0) rates16[k].push_back(static_cast<double>(P) / seconds_since(t0));
    }
    const auto t0 = Clock::now();
    adamw_traffic_loop(w.data(), g.data(), m.data(), v.data(), P);
    if (r > 0) loop.push_back(static_cast<double>(P) / seconds_since(t0));
  }
  AdamwRates out;
  for (size_t k = 0; k < paths.size(); ++k) {
    out.by_path[std::string(ops::cpu::adamw_path_name(paths[k]))] = median(rates[k]);
    if (bf16) out.by_path_bf16[std::string(ops::cpu::adamw_path_name(paths[k]))] = median(rates16[k]);
  }
  out.traffic_loop = median(loop);
  return out;
}

// Stage times of one bucket (seconds) and the pipeline's dependencies (Note [OffloadStream pipeline]):
// in(g) starts when its stream is free and, for g >= S, when the slot's previous bucket released it
// (after its out stage on the device, after its update on the host); update(g) after in(g); out(g)
// after update(g). Returns the end of the last out stage.
struct Stages {
  double in = 0, update = 0, out = 0;
};
double pipeline_simulate(const std::vector<Stages>& b, int64_t S, bool slot_held_through_out) {
  const size_t n = b.size();
  std::vector<double> in_end(n), up_end(n), out_end(n);
  for (size_t g = 0; g < n; ++g) {
    double start = g > 0 ? in_end[g - 1] : 0.0;
    if (g >= static_cast<size_t>(S)) {
      const size_t prev = g - static_cast<size_t>(S);
      start = std::max(start, slot_held_through_out ? out_end[prev] : up_end[prev]);
    }
    in_end[g] = start + b[g].in;
    up_end[g] = std::max(in_end[g], g > 0 ? up_end[g - 1] : 0.0) + b[g].update;
    out_end[g] = std::max(up_end[g], g > 0 ? out_end[g - 1] : 0.0) + b[g].out;
  }
  return n ? out_end[n - 1] : 0.0;
}

// The parameters of one precision recipe: every variant of the recipe updates them in turn, from the
// same host weights and gradients (rounded to bf16 where the recipe stores bf16).
struct Store {
  std::string recipe;  // "fp32", "bf16" (the config's may name its own: precision.recipe)
  Precision precision;
  std::unique_ptr<ParamStore> ps;
};

struct OptimVariant {
  std::string name;  // "device", "offload_serial", "offload_stream/device S=2", ...
  Store* store = nullptr;
  OptimConfig cfg;
  double link = 0;   // GB/s, 0 = native copies
  std::unique_ptr<Optimizer> opt;  // the timed instance
  std::vector<double> step_s;
  std::vector<OffloadTimes> times;  // offload variants: the parts of each timed step
  OffloadTimes times_median;
  uint64_t device_optimizer = 0, host_optimizer = 0, host_grads = 0;
  std::vector<float> final_state;  // check: weights (widened), then state_tensors(), after kCheckSteps steps
  double model_s = std::nan("");  // the overlap model (offload_stream)
  double floor_s = std::nan("");  // memory traffic / best bandwidth (Note [Bus floor])
  bool bits_equal_serial = false;
  double max_rel_vs_device = std::nan("");
  int64_t largest_bucket = 0;  // offload_stream: B_max
};

constexpr int kCheckSteps = 2;

// Every weight (gradient when grads) of ps from the flat host range x (P), in the tensors' dtype
// (rounded to nearest even into bf16).
void store_set(Backend& be, ParamStore& ps, const std::vector<float>& x, bool grads) {
  size_t off = 0;
  for (Param& p : ps.all()) {
    Tensor& t = grads ? p.g : p.w;
    device_write_f32(be, t.buf(), x.data() + off, t.numel());
    off += static_cast<size_t>(t.numel());
  }
}

// The check, before any timing: kCheckSteps steps from the weights w0 (the gradients stay as set);
// keeps the weights (widened) and the optimizer's state (moments, and the master where it keeps one),
// and the optimizer's device and host bytes (it is alone then).
void variant_check(Backend& be, const std::vector<float>& w0, OptimVariant& v) {
  ParamStore& ps = *v.store->ps;
  store_set(be, ps, w0, false);
  be.link_set_gbps(v.link);
  std::unique_ptr<Optimizer> opt = optimizer_create(v.cfg, ps, be);
  v.device_optimizer = be.device_ledger().current(Category::Category_optimizer);
  v.host_optimizer = be.host_ledger().current(Category::Category_optimizer);
  v.host_grads = be.host_ledger().current(Category::Category_grads);
  if (const auto* st = dynamic_cast<const OffloadStreamAdamW*>(opt.get())) v.largest_bucket = st->plan().largest;
  for (int i = 1; i <= kCheckSteps; ++i) opt->step(i, kCheckSteps);
  be.synchronize();
  be.link_set_gbps(0);
  const std::vector<std::pair<std::string, const Tensor*>> state = opt->state_tensors();
  size_t n = 0;
  for (const Param& p : ps.all()) n += static_cast<size_t>(p.w.numel());
  for (const auto& [name, t] : state) n += static_cast<size_t>(t->numel());
  v.final_state.resize(n);
  size_t at = 0;
  for (const Param& p : ps.all()) {
    device_read_f32(be, p.w.cbuf(), p.w.numel(), v.final_state.data() + at);
    at += static_cast<size_t>(p.w.numel());
  }
  for (const auto& [name, t] : state) {
    device_read_f32(be, t->cbuf(), t->numel(), v.final_state.data() + at);
    at += static_cast<size_t>(t->numel());
  }
}

OffloadTimes times_median(const std::vector<OffloadTimes>& times) {
  auto med = [&](double OffloadTimes::*f) {
    std::vector<double> x;
    for (const OffloadTimes& t : times) x.push_back(t.*f);
    return median(x);
  };
  OffloadTimes m;
  m.norm_s = med(&OffloadTimes::norm_s);
  m.down_s = med(&OffloadTimes::down_s);
  m.update_s = med(&OffloadTimes::update_s);
  m.up_s = med(&OffloadTimes::up_s);
  m.total_s = med(&OffloadTimes::total_s);
  auto med_bytes = [&](uint64_t OffloadTimes::*f) {
    std::vector<double> x;
    for (const OffloadTimes& t : times) x.push_back(static_cast<double>(t.*f));
    return static_cast<uint64_t>(median(x));
  };
  m.down_bytes = med_bytes(&OffloadTimes::down_bytes);
  m.up_bytes = med_bytes(&OffloadTimes::up_bytes);
  return m;
}

// The overlap model of a streamed variant from the serial run of the same link mode and recipe: d2h
// and h2d seconds per byte (the serial step's copy times over the bytes it moved) and the update's
// seconds per parameter; the device-side copies at the one-thread memcpy bandwidth (the compute
// stream's copies on the cpu backend): the gradient gathered into the f32 slot row (g read, 4 B
// written) and, with f32 weights, the weights scattered back (4 B and 4 B; bf16 weights are written
// by the update kernel itself). w and g: bytes of a weight and of a gradient element.
double model_predict(const OptimVariant& serial, const OptimConfig& c, const std::vector<int64_t>& sizes, double d2d_bw,
                     double w, double g) {
  const OffloadTimes& t = serial.times_median;
  const int64_t P = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  const double down = t.down_s / static_cast<double>(std::max<uint64_t>(1, t.down_bytes));  // s per byte
  const double up = t.up_s / static_cast<double>(std::max<uint64_t>(1, t.up_bytes));
  const double upd = t.update_s / static_cast<double>(P);
  const bool on_device = !c.sched.update_on_host;
  const double d2d = (g + 4) + (w == 4 ? 8 : 0);  // bytes per parameter, read + written
  const OffloadPlan plan = offload_plan_make(sizes, c.sched.bucket_params);
  std::vector<Stages> st;
  for (const OffloadBucket& b : plan.buckets) {
    const double n = static_cast<double>(b.elements);
    if (on_device) {
      st.push_back({12 * up * n, upd * n + d2d * n / d2d_bw, 12 * down * n});  // master, m, v: 12 B each way
    } else {
      st.push_back({g * down * n, upd * n, w * up * n});  // the gradient down, the weights up
    }
  }
  return t.norm_s + pipeline_simulate(st, c.sched.slots, on_device);
}

// Note [Bus floor]: on the cpu backend the "device", the host and the copies share one memory bus,
// so a step moves at least these bytes per parameter through it (read + written), with w and g the
// bytes of a weight and of a gradient element (fp32 4 and 4, bf16 2 and 2; master, m, v f32):
//   the norm reads the gradient (g);
//   the update reads master, grad, m, v and writes master, m, v (24 + g), and with bf16 weights also
//     writes the master rounded (w): fp32 28, bf16 28;
//   a copy of b bytes reads and writes b (2b).
//   device           norm + update: fp32 32, bf16 30.
//   offload_serial   + the gradient down and the weights up (2 (g + w)); with bf16 weights the rounding
//                    is a second host pass after the update (reads 4, writes w) instead of inside it:
//                    fp32 4 + 28 + 16 = 48, bf16 2 + 26 + 6 + 8 = 42.
//   stream, host     + 2 (g + w): fp32 48, bf16 2 + 28 + 8 = 38.
//   stream, device   master, m, v up and down (48), the update on the slot's f32 gradient row
//                    (28, + w with bf16 weights rounded into the parameters), the gradient gathered
//                    into that row (g + 4) and, with f32 weights, scattered back (8): fp32 4 + 28 + 48
//                    + 8 + 8 = 96, bf16 2 + 30 + 48 + 6 = 86.
// With the copies native, no overlap can beat this floor; an emulated link only adds sleeps, so the
// overlap model governs there.
double bus_bytes_per_param(const OptimConfig& c, const Precision& p) {
  const double w = static_cast<double>(dtype_size(p.params)), g = static_cast<double>(dtype_size(p.grads));
  const bool rounded = p.params != p.master;
  const double norm = g, update = 24 + g + (rounded ? w : 0);
  switch (c.sched.kind) {
    case OptimSchedule::Kind::Kind_device:
      return norm + update;
    case OptimSchedule::Kind::Kind_offload_serial:
      return norm + (24 + g) + (rounded ? 4 + w : 0) + 2 * (g + w);
    case OptimSchedule::Kind::Kind_offload_stream:
      if (c.sched.update_on_host) return norm + update + 2 * (g + w);
      return norm + 28 + (rounded ? w : 0) + 48 + (g + 4) + (rounded ? 0 : 8);
    default:
      break;
  }
  FP_ASSERT(false, "bench optimizer: no floor for schedule {}", schedule_name(c.sched.kind));
  return 0;
}

std::string link_label(double gbps) { return gbps > 0 ? fmt::format("emulated {:g} GB/s", gbps) : "native memcpy"; }

}  // namespace

// The recipe a store computes: the fp32 one (every field f32) or exactly the bf16 one; anything else
// (f16, per-field mixes) is refused by name, as `flatpeak train` refuses it on the cpu backend (Note
// [bf16 on a computing backend] in model/model.cpp), so that no figure is silently of another precision.
Store store_checked(const Precision& p) {
  const Precision bf16 = precision_recipe("bf16");
  const bool is_bf16 = p.params == bf16.params && p.grads == bf16.grads && p.activations == bf16.activations &&
                       p.master == bf16.master && p.moments == bf16.moments && p.logits == bf16.logits &&
                       p.router == bf16.router;
  FP_CHECK(precision_all_f32(p) || is_bf16,
           "use --precision fp32 or bf16, or precision.recipe without per-field overrides",
           "bench optimizer computes the recipes fp32 and bf16 on the cpu backend, not precision {}",
           precision_describe(p));
  return Store{is_bf16 ? "bf16" : "fp32", p, nullptr};
}

int bench_optimizer_run(const BenchOptimizerOptions& o) {
  FP_CHECK(o.repeats >= 5, "medians need at least 5 repeats", "--repeats {} is below 5", o.repeats);
  for (double l : o.link_gbps) FP_CHECK(l > 0, "--link-gbps takes GB/s (1e9 bytes/s) above 0", "--link-gbps {}", l);
  for (int64_t S : o.slots) FP_CHECK(S >= 1, "--slots takes counts of 1 or more", "--slots {}", S);
  for (const std::string& r : o.precision)
    FP_CHECK(std::count(o.precision.begin(), o.precision.end(), r) == 1, "name each recipe once",
             "--precision names {} twice", r);
  OptimConfig base;
  ModelConfig mcfg;
  Precision config_precision;  // fp32 unless the config says otherwise
  if (!o.config.empty()) {
    const RunConfig rc = config_load(o.config, o.overrides);
    mcfg = rc.model;
    base = rc.optim;
    base.sched = rc.schedules.optim;  // optim.bucket_params and the rest live with the schedules
    config_precision = rc.precision;
  } else {
    FP_CHECK(o.overrides.empty(), "--set needs --config; use --precision for the recipe",
             "--set {} without --config", o.overrides.front());
    mcfg = bench_model(count_parse(o.params));
  }
  if (o.bucket_params > 0) base.sched.bucket_params = o.bucket_params;
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);  // outlives the stores
  std::vector<Store> stores;
  if (o.precision.empty()) stores.push_back(store_checked(config_precision));
  for (const std::string& r : o.precision) stores.push_back(store_checked(precision_recipe(r)));
  const int64_t P = mcfg.param_count();
  // Weights ~ U(-0.5, 0.5), gradients ~ 1e-4 U(-0.5, 0.5), the same draws for every recipe (rounded
  // where it stores bf16); the gradients set once (every step reads the same).
  std::vector<float> w0(static_cast<size_t>(P)), g0(w0.size());
  {
    Rng rng(1);
    for (float& x : w0) x = static_cast<float>(rng.uniform() - 0.5);
    for (float& x : g0) x = static_cast<float>(1e-4 * (rng.uniform() - 0.5));
  }
  for (Store& st : stores) {
    st.ps = std::make_unique<ParamStore>(mcfg, *be, nullptr, st.precision);
    store_set(*be, *st.ps, g0, true);
  }
  std::vector<float>().swap(g0);
  std::vector<int64_t> sizes;
  for (const Param& p : stores.front().ps->all()) sizes.push_back(p.w.numel());
  const bool any_bf16 = std::any_of(stores.begin(), stores.end(), [](const Store& st) { return st.recipe == "bf16"; });
  std::string recipes;
  for (const Store& st : stores) recipes += (recipes.empty() ? "" : ", ") + st.recipe;
  const int threads = omp_get_max_threads();
  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
  log_info("bench optimizer: {:.1f} M parameters in {} tensors, bucket {} parameters, {} threads (OMP_WAIT_POLICY {}), "
           "{} warmup + {} timed steps per variant, precision {}", static_cast<double>(P) / 1e6, sizes.size(),
           base.sched.bucket_params, threads, wait_policy ? wait_policy : "unset", o.warmup, o.repeats, recipes);

  // The physical limit: memory bandwidth and the CPU AdamW kernel on P parameters.
  const uint64_t bw_bytes = std::max<uint64_t>(uint64_t{256} << 20, static_cast<uint64_t>(P) * 4);
  const Bandwidth bw = bandwidth_measure(bw_bytes, o.repeats);
  const ops::cpu::AdamwPath best = ops::cpu::adamw_path_best();
  const AdamwRates rates = adamw_rates_measure(P, o.repeats, any_bf16);
  const nlohmann::json& paths = rates.by_path;
  const std::string best_name(ops::cpu::adamw_path_name(best));
  const double adamw_rate = paths[best_name].get<double>();
  // The limit: 28 B per parameter at the best of the bandwidths measured in this run.
  const double traffic_bw = 28.0 * rates.traffic_loop;
  const double best_bw = std::max({bw.memcpy_one, bw.memcpy_threads, traffic_bw});
  const double limit = best_bw / 28.0;

  // The variants, recipe by recipe: device AdamW once (no copies), then per link mode serial and the
  // streamed ones.
  std::vector<OptimVariant> variants;
  std::vector<double> links = {0.0};
  links.insert(links.end(), o.link_gbps.begin(), o.link_gbps.end());
  for (Store& st : stores) {
    OptimVariant d;
    d.name = "device";
    d.store = &st;
    d.cfg = base;
    d.cfg.sched.kind = OptimSchedule::Kind::Kind_device;
    variants.push_back(std::move(d));
    for (double link : links) {
      OptimVariant s;
      s.name = "offload_serial";
      s.store = &st;
      s.cfg = base;
      s.cfg.sched.kind = OptimSchedule::Kind::Kind_offload_serial;
      s.link = link;
      variants.push_back(std::move(s));
      for (int64_t S : o.slots) {
        for (const char* where : {"device", "host"}) {
          OptimVariant v;
          v.name = fmt::format("offload_stream/{} S={}", where, S);
          v.store = &st;
          v.cfg = base;
          v.cfg.sched.kind = OptimSchedule::Kind::Kind_offload_stream;
          v.cfg.sched.update_on_host = std::string(where) == "host";
          v.cfg.sched.slots = S;
          v.link = link;
          variants.push_back(std::move(v));
        }
      }
    }
  }
  const auto is_device = [](const OptimVariant& v) { return v.cfg.sched.kind == OptimSchedule::Kind::Kind_device; };
  const auto is_serial = [](const OptimVariant& v) {
    return v.cfg.sched.kind == OptimSchedule::Kind::Kind_offload_serial;
  };
  // The serial variant of v's recipe and link mode.
  const auto serial_of = [&](const OptimVariant& v) -> const OptimVariant& {
    for (const OptimVariant& s : variants)
      if (is_serial(s) && s.store == v.store && s.link == v.link) return s;
    FP_ASSERT(false, "no offload_serial for {}", v.name);
    return variants.front();
  };

  // 1. Check: every offload variant against offload_serial of its recipe and mode (bits) and the
  // device AdamW of its recipe (within 1e-6), variant by variant in the order made (each recipe's
  // device first, then each mode's serial first), keeping only those two references.
  bool all_equal = true;
  std::vector<float> ref_device, ref_serial;
  for (OptimVariant& v : variants) {
    variant_check(*be, w0, v);
    if (is_device(v)) {
      ref_device = std::move(v.final_state);
      continue;
    }
    if (is_serial(v)) ref_serial = v.final_state;
    FP_ASSERT(v.final_state.size() == ref_serial.size() && v.final_state.size() == ref_device.size(),
              "{}: {} state values, offload_serial {} and device {}", v.name, v.final_state.size(), ref_serial.size(),
              ref_device.size());
    v.bits_equal_serial =
        std::memcmp(v.final_state.data(), ref_serial.data(), v.final_state.size() * sizeof(float)) == 0;
    double rel = 0;
    for (size_t i = 0; i < v.final_state.size(); ++i) {
      const double a = v.final_state[i], b = ref_device[i];
      rel = std::max(rel, b != 0 ? std::abs(a - b) / std::abs(b) : std::abs(a));
    }
    v.max_rel_vs_device = rel;
    all_equal = all_equal && v.bits_equal_serial && rel <= 1e-6;
    std::vector<float>().swap(v.final_state);
  }
  std::vector<float>().swap(ref_device);
  std::vector<float>().swap(ref_serial);
  FP_CHECK(all_equal, "this is a bug in the offload schedules: report it with the command line",
           "an offload variant differs from offload_serial (bits) or from the device AdamW (> 1e-6)");

  // 2. Time, link mode by link mode (the device AdamW with the native copies), round-robin over the
  // mode's variants of every recipe, all alive at once: load from elsewhere on the machine falls on
  // every variant alike. The weights drift from variant to variant; the times do not depend on them.
  const int total = o.warmup + o.repeats;
  for (double link : links) {
    std::vector<OptimVariant*> group;
    for (OptimVariant& v : variants)
      if (is_device(v) ? link == 0.0 : v.link == link) group.push_back(&v);
    for (OptimVariant* v : group) v->opt = optimizer_create(v->cfg, *v->store->ps, *be);
    for (int i = 0; i < total; ++i) {
      for (OptimVariant* v : group) {
        be->link_set_gbps(v->link);
        const auto t0 = Clock::now();
        v->opt->step(i + 1, total);
        be->synchronize();
        const double t = seconds_since(t0);
        be->link_set_gbps(0);
        if (i < o.warmup) continue;  // the first step also copies the master from the weights
        v->step_s.push_back(t);
        if (const auto* off = dynamic_cast<const OffloadAdamW*>(v->opt.get())) v->times.push_back(off->last_times());
      }
    }
    for (OptimVariant* v : group) {
      v->opt.reset();
      if (!v->times.empty()) v->times_median = times_median(v->times);
    }
  }
  const auto wg = [](const Store& st) {
    return std::pair<double, double>(static_cast<double>(dtype_size(st.precision.params)),
                                     static_cast<double>(dtype_size(st.precision.grads)));
  };
  for (OptimVariant& v : variants) {
    const auto [w, g] = wg(*v.store);
    if (v.cfg.sched.kind == OptimSchedule::Kind::Kind_offload_stream)
      v.model_s = model_predict(serial_of(v), v.cfg, sizes, bw.memcpy_one, w, g);
    v.floor_s = bus_bytes_per_param(v.cfg, v.store->precision) * static_cast<double>(P) / best_bw;
  }

  // Report.
  fmt::print("flatpeak bench optimizer: {:.2f} M parameters ({} tensors), bucket {} parameters, {} threads "
             "(OMP_WAIT_POLICY {}), precision {}; median of {} steps, variants interleaved\n",
             static_cast<double>(P) / 1e6, sizes.size(), base.sched.bucket_params, threads,
             wait_policy ? wait_policy : "unset", recipes, o.repeats);
  for (const Store& st : stores) fmt::print("precision {}: {}\n", st.recipe, precision_describe(st.precision));
  fmt::print("memory bandwidth (bytes read + written): memcpy of {} {:.1f} GB/s on one thread, {:.1f} GB/s on {}; "
             "AdamW-traffic loop on the kernel's arrays {:.1f} GB/s\n",
             bytes_format(bw_bytes), bw.memcpy_one / 1e9, bw.memcpy_threads / 1e9, threads, traffic_bw / 1e9);
  fmt::print("CPU AdamW ({}, {} threads): {:.1f} M params/s = {:.0f}% of the limit {:.1f} M params/s (28 B/param at "
             "{:.1f} GB/s, the best bandwidth above)",
             best_name, threads, adamw_rate / 1e6, 100 * adamw_rate / limit, limit / 1e6, best_bw / 1e9);
  for (auto& [name, rate] : paths.items()) fmt::print("; {} {:.1f}", name, rate.get<double>() / 1e6);
  fmt::print("\n");
  if (any_bf16) {
    const double r16 = rates.by_path_bf16[best_name].get<double>();
    fmt::print("CPU AdamW, bf16 gradient in and bf16 weights out ({}): {:.1f} M params/s = {:.0f}% of the limit",
               best_name, r16 / 1e6, 100 * r16 / limit);
    for (auto& [name, rate] : rates.by_path_bf16.items()) fmt::print("; {} {:.1f}", name, rate.get<double>() / 1e6);
    fmt::print("\n");
  }
  fmt::print("\n{:<26} {:<9} {:<20} {:>9} {:>10} {:>9} {:>9} {:>9} {:>12} {:>12} {:>12} {:>12} {:>6}\n", "variant",
             "precision", "copies", "step s", "vs serial", "model s", "floor s", "update s", "down B/step", "up B/step",
             "device opt", "host opt+g", "check");
  nlohmann::json jv = nlohmann::json::array();
  for (const OptimVariant& v : variants) {
    const double t = median(v.step_s);
    const bool dev = is_device(v);
    const double vs = median(serial_of(v).step_s) / t;  // the device AdamW: against the native serial
    fmt::print("{:<26} {:<9} {:<20} {:>9.4f} {:>9.2f}x {:>9} {:>9.4f} {:>9} {:>12} {:>12} {:>12} {:>12} {:>6}\n",
               v.name, v.store->recipe, dev ? "-" : link_label(v.link), t, vs,
               std::isnan(v.model_s) ? "-" : fmt::format("{:.4f}", v.model_s), v.floor_s,
               dev ? "-" : fmt::format("{:.4f}", v.times_median.update_s),
               dev ? "-" : bytes_format(v.times_median.down_bytes), dev ? "-" : bytes_format(v.times_median.up_bytes),
               bytes_format(v.device_optimizer), bytes_format(v.host_optimizer + v.host_grads),
               dev ? "-" : (v.bits_equal_serial ? "bits" : "DIFF"));
    nlohmann::json j = {{"variant", v.name},
                        {"precision", v.store->recipe},
                        {"schedule", std::string(schedule_name(v.cfg.sched.kind))},
                        {"update_on", v.cfg.sched.kind == OptimSchedule::Kind::Kind_offload_stream ? update_on_name(v.cfg.sched) : ""},
                        {"slots", v.cfg.sched.slots},
                        {"bucket_params", v.cfg.sched.bucket_params},
                        {"largest_bucket", v.largest_bucket},
                        {"link_gbps", v.link},
                        {"link", dev ? "none" : (v.link > 0 ? "emulated" : "native")},
                        {"step_seconds", v.step_s},
                        {"step_seconds_median", t},
                        {"speedup_vs_serial", dev ? nlohmann::json(nullptr) : nlohmann::json(vs)},
                        {"device_optimizer_bytes", v.device_optimizer},
                        {"host_optimizer_bytes", v.host_optimizer},
                        {"host_grads_bytes", v.host_grads}};
    if (!dev) {
      j["bits_equal_serial"] = v.bits_equal_serial;
      j["max_rel_diff_vs_device"] = v.max_rel_vs_device;
      j["norm_seconds"] = v.times_median.norm_s;
      j["update_seconds"] = v.times_median.update_s;
      j["down_bytes_per_step"] = v.times_median.down_bytes;
      j["up_bytes_per_step"] = v.times_median.up_bytes;
    }
    if (is_serial(v)) {
      j["down_seconds"] = v.times_median.down_s;
      j["up_seconds"] = v.times_median.up_s;
    }
    if (!std::isnan(v.model_s)) j["model_seconds"] = v.model_s;
    j["bus_floor_seconds"] = v.floor_s;
    j["bus_bytes_per_param"] = bus_bytes_per_param(v.cfg, v.store->precision);
    jv.push_back(j);
  }
  fmt::print("\ncheck: weights and optimizer state (moments, and the master with bf16 weights) after {} steps equal "
             "offload_serial's of the same precision bit for bit (and the device AdamW's within 1e-6). model s: the "
             "overlap model, per bucket max(in, update, out, slot occupancy / S) through the pipeline, from the serial "
             "run's stage times in the same mode. floor s: bytes through the one memory bus / the best bandwidth (Note "
             "[Bus floor]: what native copies cannot beat). update s: time inside update kernels. down / up B/step: "
             "bytes copied device to host / host to device in one step (median). "
             "Emulated-link rows are emulated figures; no GPU figure is measured here.\n", kCheckSteps);
  nlohmann::json out = {{"engine", "flatpeak"},
                        {"bench", "optimizer"},
                        {"params", P},
                        {"tensors", sizes.size()},
                        {"precision", nlohmann::json::array()},
                        {"threads", threads},
                        {"omp_wait_policy", wait_policy ? wait_policy : "unset"},
                        {"repeats", o.repeats},
                        {"warmup", o.warmup},
                        {"bandwidth_bytes", bw_bytes},
                        {"memcpy_one_thread_bytes_per_s", bw.memcpy_one},
                        {"memcpy_threads_bytes_per_s", bw.memcpy_threads},
                        {"adamw_traffic_loop_bytes_per_s", traffic_bw},
                        {"cpu_adamw_path", best_name},
                        {"cpu_adamw_params_per_s", adamw_rate},
                        {"cpu_adamw_params_per_s_by_path", paths},
                        {"cpu_adamw_limit_params_per_s", limit},
                        {"cpu_adamw_fraction_of_limit", adamw_rate / limit},
                        {"all_bits_equal", all_equal},
                        {"variants", jv}};
  for (const Store& st : stores) out["precision"].push_back(st.recipe);
  if (any_bf16) out["cpu_adamw_bf16_params_per_s_by_path"] = rates.by_path_bf16;
  machine_json(out);
  json_write(o.json, out);
  return 0;
}

}  // namespace fp::bench
