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
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bench/bench_common.h"
#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/units.h"
#include "model/params.h"
#include "ops/adamw.h"
#include "ops/cpu/adamw_path.h"
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

// AdamW's traffic without its arithmetic, split over the threads like the kernel (ops/cpu/adamw.cpp).
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

// Parameters per second of the CPU AdamW kernel over P elements on each available path, and of the
// AdamW-traffic loop on the same arrays, the passes alternating (so load from elsewhere on the
// machine falls on both alike); medians of repeats.
struct AdamwRates {
  nlohmann::json by_path = nlohmann::json::object();  // path name -> parameters per second
  double traffic_loop = 0;                              // elements per second of adamw_traffic_loop
};
AdamwRates adamw_rates_measure(int64_t P, int repeats) {
  std::vector<float> w(static_cast<size_t>(P)), g(w.size()), m(w.size(), 0.0f), v(w.size(), 0.0f);
  Rng rng(5);
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] = static_cast<float>(rng.uniform() - 0.5);
    g[i] = static_cast<float>(1e-3 * (rng.uniform() - 0.5));
  }
  std::vector<ops::cpu::AdamwPath> paths;
  for (ops::cpu::AdamwPath p : {ops::cpu::AdamwPath::AdamwPath_scalar, ops::cpu::AdamwPath::AdamwPath_sse,
                                ops::cpu::AdamwPath::AdamwPath_avx2})
    if (ops::cpu::adamw_path_available(p)) paths.push_back(p);
  std::vector<std::vector<double>> rates(paths.size());
  std::vector<double> loop;
  for (int r = 0; r < repeats + 1; ++r) {
    for (size_t k = 0; k < paths.size(); ++k) {
      const auto t0 = Clock::now();
      ops::cpu::adamw_update_path(paths[k], w.data(), g.data(), m.data(), v.data(), P, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                                  1.0f, r + 1, nullptr);
      if (r > 0) rates[k].push_back(static_cast<double>(P) / seconds_since(t0));
    }
    const auto t0 = Clock::now();
    adamw_traffic_loop(w.data(), g.data(), m.data(), v.data(), P);
    if (r > 0) loop.push_back(static_cast<double>(P) / seconds_since(t0));
  }
  AdamwRates out;
  for (size_t k = 0; k < paths.size(); ++k) out.by_path[std::string(ops::cpu::adamw_path_name(paths[k]))] = median(rates[k]);
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

struct Variant {
  std::string name;  // "device", "offload_serial", "offload_stream/device S=2", ...
  OptimConfig cfg;
  double link = 0;   // GB/s, 0 = native copies
  std::unique_ptr<Optimizer> opt;  // the timed instance
  std::vector<double> step_s;
  std::vector<OffloadTimes> times;  // offload variants: the parts of each timed step
  OffloadTimes times_median;
  uint64_t device_optimizer = 0, host_optimizer = 0, host_grads = 0;
  std::vector<float> final_state;  // check: weights, then m and v, after kCheckSteps steps
  double model_s = std::nan("");  // the overlap model (offload_stream)
  double floor_s = std::nan("");  // memory traffic / best bandwidth (Note [Bus floor])
  bool bits_equal_serial = false;
  double max_rel_vs_device = std::nan("");
  int64_t largest_bucket = 0;  // offload_stream: B_max
};

constexpr int kCheckSteps = 2;

void weights_set(Backend& be, ParamStore& ps, const std::vector<float>& w) {
  size_t off = 0;
  for (Param& p : ps.all()) {
    be.copy_from_host(p.w.data(), w.data() + off, p.w.bytes());
    off += static_cast<size_t>(p.w.numel());
  }
}

// The check, before any timing: kCheckSteps steps from the weights w0 (the gradients stay as set);
// keeps the weights and moments, and the optimizer's device and host bytes (it is alone then).
void variant_check(Backend& be, ParamStore& ps, const std::vector<float>& w0, int64_t P, Variant& v) {
  weights_set(be, ps, w0);
  be.link_set_gbps(v.link);
  std::unique_ptr<Optimizer> opt = optimizer_create(v.cfg, ps, be);
  v.device_optimizer = be.device_ledger().current(Category::Category_optimizer);
  v.host_optimizer = be.host_ledger().current(Category::Category_optimizer);
  v.host_grads = be.host_ledger().current(Category::Category_grads);
  if (const auto* st = dynamic_cast<const OffloadStreamAdamW*>(opt.get())) v.largest_bucket = st->plan().largest;
  for (int i = 1; i <= kCheckSteps; ++i) opt->step(i, kCheckSteps);
  be.synchronize();
  be.link_set_gbps(0);
  v.final_state.resize(static_cast<size_t>(3 * P));
  size_t at = 0;
  for (const Param& p : ps.all()) {
    be.copy_to_host(v.final_state.data() + at, p.w.data(), p.w.bytes());
    at += static_cast<size_t>(p.w.numel());
  }
  for (const auto& [name, t] : opt->state_tensors()) {
    be.copy_to_host(v.final_state.data() + at, t->data(), t->bytes());
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
  return m;
}

// The overlap model of a streamed variant from the serial run of the same link mode: per parameter,
// d2h and h2d seconds per 4 bytes and the update's seconds; the device-side gather and scatter (4 B
// read and 4 B written each, per parameter) at the one-thread memcpy bandwidth (the compute stream's
// copies on the cpu backend).
double model_predict(const Variant& serial, const OptimConfig& c, const std::vector<int64_t>& sizes, int64_t P,
                     double d2d_bw) {
  const OffloadTimes& t = serial.times_median;
  const double down = t.down_s / static_cast<double>(P), up = t.up_s / static_cast<double>(P);
  const double upd = t.update_s / static_cast<double>(P);
  const bool on_device = !c.sched.update_on_host;
  const OffloadPlan plan = offload_plan_make(sizes, c.sched.bucket_params);
  std::vector<Stages> st;
  for (const OffloadBucket& b : plan.buckets) {
    const double n = static_cast<double>(b.elements);
    if (on_device) {
      st.push_back({3 * up * n, upd * n + 16.0 * n / d2d_bw, 3 * down * n});  // 12 B up, 12 B down
    } else {
      st.push_back({down * n, upd * n, up * n});  // 4 B down, 4 B up
    }
  }
  return t.norm_s + pipeline_simulate(st, c.sched.slots, on_device);
}

// Note [Bus floor]: on the cpu backend the "device", the host and the copies share one memory bus,
// so a step moves at least these bytes per parameter through it (read + written): the norm reads the
// gradient (4); the update reads param, grad, m, v and writes param, m, v (28); a copy of b bytes
// reads and writes b (2b). offload_serial and the host placement copy 4 B down and 4 B up (16);
// the device placement copies 12 B up and 12 B down (48) and gathers the gradient and scatters the
// weight inside the device (16). With the copies native, no overlap can beat this floor; an emulated
// link only adds sleeps, so the overlap model governs there.
double bus_bytes_per_param(const OptimConfig& c) {
  if (c.sched.kind == OptimSchedule::Kind::Kind_device) return 4 + 28;
  if (c.sched.kind == OptimSchedule::Kind::Kind_offload_stream && !c.sched.update_on_host) return 4 + 28 + 48 + 16;
  return 4 + 28 + 16;
}

std::string link_label(double gbps) { return gbps > 0 ? fmt::format("emulated {:g} GB/s", gbps) : "native memcpy"; }

}  // namespace

int bench_optimizer_run(const BenchOptimizerOptions& o) {
  FP_CHECK(o.repeats >= 5, "medians need at least 5 repeats", "--repeats {} is below 5", o.repeats);
  for (double l : o.link_gbps) FP_CHECK(l > 0, "--link-gbps takes GB/s (1e9 bytes/s) above 0", "--link-gbps {}", l);
  for (int64_t S : o.slots) FP_CHECK(S >= 1, "--slots takes counts of 1 or more", "--slots {}", S);
  OptimConfig base;
  ModelConfig mcfg;
  if (!o.config.empty()) {
    const RunConfig rc = config_load(o.config, o.overrides);
    mcfg = rc.model;
    base = rc.optim;
  } else {
    mcfg = bench_model(count_parse(o.params));
  }
  if (o.bucket_params > 0) base.sched.bucket_params = o.bucket_params;
  const int64_t P = mcfg.param_count();
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  ParamStore ps(mcfg, *be);
  std::vector<int64_t> sizes;
  for (const Param& p : ps.all()) sizes.push_back(p.w.numel());
  // Weights ~ U(-0.5, 0.5), gradients ~ 1e-4 U(-0.5, 0.5), set once (every step reads the same).
  std::vector<float> w0(static_cast<size_t>(P));
  {
    Rng rng(1);
    for (float& x : w0) x = static_cast<float>(rng.uniform() - 0.5);
    std::vector<float> g(w0.size());
    for (float& x : g) x = static_cast<float>(1e-4 * (rng.uniform() - 0.5));
    size_t off = 0;
    for (Param& p : ps.all()) {
      be->copy_from_host(p.g.data(), g.data() + off, p.g.bytes());
      off += static_cast<size_t>(p.g.numel());
    }
  }
  const int threads = omp_get_max_threads();
  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
  log_info("bench optimizer: {:.1f} M parameters in {} tensors, bucket {} parameters, {} threads (OMP_WAIT_POLICY {}), "
           "{} warmup + {} timed steps per variant", static_cast<double>(P) / 1e6, sizes.size(), base.sched.bucket_params,
           threads, wait_policy ? wait_policy : "unset", o.warmup, o.repeats);

  // The physical limit: memory bandwidth and the CPU AdamW kernel on P parameters.
  const uint64_t bw_bytes = std::max<uint64_t>(uint64_t{256} << 20, static_cast<uint64_t>(P) * 4);
  const Bandwidth bw = bandwidth_measure(bw_bytes, o.repeats);
  const ops::cpu::AdamwPath best = ops::cpu::adamw_path_best();
  const AdamwRates rates = adamw_rates_measure(P, o.repeats);
  const nlohmann::json& paths = rates.by_path;
  const double adamw_rate = paths[std::string(ops::cpu::adamw_path_name(best))].get<double>();
  // The limit: 28 B per parameter at the best of the bandwidths measured in this run.
  const double traffic_bw = 28.0 * rates.traffic_loop;
  const double best_bw = std::max({bw.memcpy_one, bw.memcpy_threads, traffic_bw});
  const double limit = best_bw / 28.0;

  // The variants: device AdamW once (no copies), then per link mode serial and the streamed ones.
  std::vector<Variant> variants;
  std::vector<double> links = {0.0};
  links.insert(links.end(), o.link_gbps.begin(), o.link_gbps.end());
  {
    Variant d;
    d.name = "device";
    d.cfg = base;
    d.cfg.sched.kind = OptimSchedule::Kind::Kind_device;
    variants.push_back(std::move(d));
  }
  for (double link : links) {
    Variant s;
    s.name = "offload_serial";
    s.cfg = base;
    s.cfg.sched.kind = OptimSchedule::Kind::Kind_offload_serial;
    s.link = link;
    variants.push_back(std::move(s));
    for (int64_t S : o.slots) {
      for (const char* where : {"device", "host"}) {
        Variant v;
        v.name = fmt::format("offload_stream/{} S={}", where, S);
        v.cfg = base;
        v.cfg.sched.kind = OptimSchedule::Kind::Kind_offload_stream;
        v.cfg.sched.update_on_host = std::string(where) == "host";
        v.cfg.sched.slots = S;
        v.link = link;
        variants.push_back(std::move(v));
      }
    }
  }

  // 1. Check: every offload variant against offload_serial of its mode (bits) and the device AdamW.
  for (Variant& v : variants) variant_check(*be, ps, w0, P, v);
  const Variant& device = variants.front();
  bool all_equal = true;
  const Variant* serial = nullptr;
  for (Variant& v : variants) {
    if (v.cfg.sched.kind == OptimSchedule::Kind::Kind_device) continue;
    if (v.cfg.sched.kind == OptimSchedule::Kind::Kind_offload_serial) serial = &v;
    v.bits_equal_serial =
        std::memcmp(v.final_state.data(), serial->final_state.data(), v.final_state.size() * sizeof(float)) == 0;
    double rel = 0;
    for (size_t i = 0; i < v.final_state.size(); ++i) {
      const double a = v.final_state[i], b = device.final_state[i];
      rel = std::max(rel, b != 0 ? std::abs(a - b) / std::abs(b) : std::abs(a));
    }
    v.max_rel_vs_device = rel;
    all_equal = all_equal && v.bits_equal_serial && rel <= 1e-6;
  }
  for (Variant& v : variants) std::vector<float>().swap(v.final_state);
  FP_CHECK(all_equal, "this is a bug in the offload schedules: report it with the command line",
           "an offload variant differs from offload_serial (bits) or from the device AdamW (> 1e-6)");

  // 2. Time, link mode by link mode (the device AdamW with the native copies), round-robin over the
  // mode's variants, all alive at once: load from elsewhere on the machine falls on every variant
  // alike. The weights drift from variant to variant; the times do not depend on them.
  const int total = o.warmup + o.repeats;
  for (double link : links) {
    std::vector<Variant*> group;
    for (Variant& v : variants)
      if (v.cfg.sched.kind == OptimSchedule::Kind::Kind_device ? link == 0.0 : v.link == link) group.push_back(&v);
    for (Variant* v : group) v->opt = optimizer_create(v->cfg, ps, *be);
    for (int i = 0; i < total; ++i) {
      for (Variant* v : group) {
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
    for (Variant* v : group) {
      v->opt.reset();
      if (!v->times.empty()) v->times_median = times_median(v->times);
    }
  }
  for (Variant& v : variants) {
    if (v.cfg.sched.kind == OptimSchedule::Kind::Kind_offload_serial) serial = &v;
    if (v.cfg.sched.kind == OptimSchedule::Kind::Kind_offload_stream) v.model_s = model_predict(*serial, v.cfg, sizes, P, bw.memcpy_one);
    v.floor_s = bus_bytes_per_param(v.cfg) * static_cast<double>(P) / best_bw;
  }

  // Report.
  fmt::print("flatpeak bench optimizer: {:.2f} M parameters ({} tensors), bucket {} parameters, {} threads "
             "(OMP_WAIT_POLICY {}); median of {} steps, variants interleaved\n",
             static_cast<double>(P) / 1e6, sizes.size(), base.sched.bucket_params, threads,
             wait_policy ? wait_policy : "unset", o.repeats);
  fmt::print("memory bandwidth (bytes read + written): memcpy of {} {:.1f} GB/s on one thread, {:.1f} GB/s on {}; "
             "AdamW-traffic loop on the kernel's arrays {:.1f} GB/s\n",
             bytes_format(bw_bytes), bw.memcpy_one / 1e9, bw.memcpy_threads / 1e9, threads, traffic_bw / 1e9);
  fmt::print("CPU AdamW ({}, {} threads): {:.1f} M params/s = {:.0f}% of the limit {:.1f} M params/s (28 B/param at "
             "{:.1f} GB/s, the best bandwidth above)",
             ops::cpu::adamw_path_name(best), threads, adamw_rate / 1e6, 100 * adamw_rate / limit, limit / 1e6,
             best_bw / 1e9);
  for (auto& [name, rate] : paths.items()) fmt::print("; {} {:.1f}", name, rate.get<double>() / 1e6);
  fmt::print("\n\n{:<26} {:<20} {:>9} {:>10} {:>9} {:>9} {:>9} {:>12} {:>12} {:>6}\n", "variant", "copies", "step s",
             "vs serial", "model s", "floor s", "update s", "device opt", "host opt+g", "check");
  nlohmann::json jv = nlohmann::json::array();
  for (const Variant& v : variants) {
    const double t = median(v.step_s);
    double vs = std::nan("");
    for (const Variant& s : variants)
      if (s.cfg.sched.kind == OptimSchedule::Kind::Kind_offload_serial && s.link == v.link) vs = median(s.step_s) / t;
    const bool is_device = v.cfg.sched.kind == OptimSchedule::Kind::Kind_device;
    fmt::print("{:<26} {:<20} {:>9.4f} {:>9.2f}x {:>9} {:>9.4f} {:>9} {:>12} {:>12} {:>6}\n", v.name,
               is_device ? "-" : link_label(v.link), t, vs,
               std::isnan(v.model_s) ? "-" : fmt::format("{:.4f}", v.model_s), v.floor_s,
               is_device ? "-" : fmt::format("{:.4f}", v.times_median.update_s), bytes_format(v.device_optimizer),
               bytes_format(v.host_optimizer + v.host_grads), is_device ? "-" : (v.bits_equal_serial ? "bits" : "DIFF"));
    nlohmann::json j = {{"variant", v.name},
                        {"schedule", std::string(schedule_name(v.cfg.sched.kind))},
                        {"update_on", v.cfg.sched.kind == OptimSchedule::Kind::Kind_offload_stream ? update_on_name(v.cfg.sched) : ""},
                        {"slots", v.cfg.sched.slots},
                        {"bucket_params", v.cfg.sched.bucket_params},
                        {"largest_bucket", v.largest_bucket},
                        {"link_gbps", v.link},
                        {"link", is_device ? "none" : (v.link > 0 ? "emulated" : "native")},
                        {"step_seconds", v.step_s},
                        {"step_seconds_median", t},
                        {"speedup_vs_serial", is_device ? nlohmann::json(nullptr) : nlohmann::json(vs)},
                        {"device_optimizer_bytes", v.device_optimizer},
                        {"host_optimizer_bytes", v.host_optimizer},
                        {"host_grads_bytes", v.host_grads}};
    if (!is_device) {
      j["bits_equal_serial"] = v.bits_equal_serial;
      j["max_rel_diff_vs_device"] = v.max_rel_vs_device;
      j["norm_seconds"] = v.times_median.norm_s;
      j["update_seconds"] = v.times_median.update_s;
    }
    if (v.cfg.sched.kind == OptimSchedule::Kind::Kind_offload_serial) {
      j["down_seconds"] = v.times_median.down_s;
      j["up_seconds"] = v.times_median.up_s;
    }
    if (!std::isnan(v.model_s)) j["model_seconds"] = v.model_s;
    j["bus_floor_seconds"] = v.floor_s;
    j["bus_bytes_per_param"] = bus_bytes_per_param(v.cfg);
    jv.push_back(j);
  }
  fmt::print("\ncheck: weights and moments after {} steps equal offload_serial's bit for bit (and the device AdamW's "
             "within 1e-6). model s: the overlap model, per bucket max(in, update, out, slot occupancy / S) through the "
             "pipeline, from the serial run's stage times in the same mode. floor s: bytes through the one memory bus / "
             "the best bandwidth (Note [Bus floor]: what native copies cannot beat). update s: time inside update "
             "kernels. "
             "Emulated-link rows are emulated figures; no GPU figure is measured here.\n", kCheckSteps);
  nlohmann::json out = {{"engine", "flatpeak"},
                        {"bench", "optimizer"},
                        {"params", P},
                        {"tensors", sizes.size()},
                        {"threads", threads},
                        {"omp_wait_policy", wait_policy ? wait_policy : "unset"},
                        {"repeats", o.repeats},
                        {"warmup", o.warmup},
                        {"bandwidth_bytes", bw_bytes},
                        {"memcpy_one_thread_bytes_per_s", bw.memcpy_one},
                        {"memcpy_threads_bytes_per_s", bw.memcpy_threads},
                        {"adamw_traffic_loop_bytes_per_s", traffic_bw},
                        {"cpu_adamw_path", std::string(ops::cpu::adamw_path_name(best))},
                        {"cpu_adamw_params_per_s", adamw_rate},
                        {"cpu_adamw_params_per_s_by_path", paths},
                        {"cpu_adamw_limit_params_per_s", limit},
                        {"cpu_adamw_fraction_of_limit", adamw_rate / limit},
                        {"all_bits_equal", all_equal},
                        {"variants", jv}};
  json_write(o.json, out);
  return 0;
}

}  // namespace fp::bench
