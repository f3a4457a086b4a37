// flatpeak bench dispatch (bench/dispatch.h): the block's parameters, the variants on their own
// backends, the runs, the checks against standard and the report.
//
// The block's parameters are built here, as expert parallelism lays them out: the router and the
// norm on every rank, the experts only on their owner (the others are never read).
#include "bench/dispatch.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "bench/bench_common.h"
#include "comm/comm.h"
#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/units.h"
#include "model/blocks.h"
#include "model/layout.h"
#include "model/routing.h"
#include "sched/dispatch/dispatch.h"
#include "sched/dispatch/llep.h"

namespace fp::bench {

namespace {

ModelConfig block_config(const BenchDispatchOptions& o) {
  ModelConfig m;
  m.hidden_size = o.hidden;
  m.num_hidden_layers = 1;
  m.num_attention_heads = 1;
  m.num_key_value_heads = 1;
  m.head_dim = 1;
  m.num_experts = o.experts;
  m.num_experts_per_tok = o.top_k;
  m.moe_intermediate_size = o.intermediate;
  m.vocab_size = 2;
  m.rope_theta = 10000;
  m.rms_norm_eps = 1e-6;
  m.norm_topk_prob = true;
  m.router_aux_loss_coef = 0;  // no aux bias: the block's gradient is the dispatch's
  m.seed = 1;
  return m;
}

// The tensors the MoE block reads: post_attention_layernorm (H), the router gate (E, H), and this
// rank's experts gate_proj / up_proj (I, H), down_proj (H, I); other experts null.
struct BlockParams {
  std::deque<Param> store;
  LayerParams lp{};
};

Param* param_add(BlockParams& p, Backend& be, const std::string& name, const Shape& shape, double scale, Rng* rng,
                 double fill) {
  Param& q = p.store.emplace_back();
  q.name = name;
  q.shape = shape;
  q.w = be.alloc_f32(Category::Category_params, shape, name);
  q.g = be.alloc_f32(Category::Category_grads, shape, name + ".grad");
  if (be.computes()) {
    std::vector<float> h(static_cast<size_t>(shape.numel()));
    for (float& v : h) v = rng ? static_cast<float>(scale * rng->normal()) : static_cast<float>(fill);
    be.copy_from_host(q.w.data(), h.data(), q.w.bytes());
    be.kernels().fill(q.g.f32(), 0.0f, q.g.numel());
  }
  return &q;
}

// Same numbers on every rank and for every variant: the router and expert e drawn from seeds of their own.
void block_params_make(BlockParams& p, Backend& be, const ModelConfig& c, const ExpertLayout& mine) {
  const int64_t H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
  p.lp.post_attention_layernorm = param_add(p, be, "post_attention_layernorm.weight", {H}, 0, nullptr, 1.0);
  Rng router(11);
  p.lp.gate = param_add(p, be, "mlp.gate.weight", {E, H}, 0.02, &router, 0);
  p.lp.gate_proj.assign(static_cast<size_t>(E), nullptr);
  p.lp.up_proj.assign(static_cast<size_t>(E), nullptr);
  p.lp.down_proj.assign(static_cast<size_t>(E), nullptr);
  for (int64_t e = mine.first; e < mine.first + mine.count; ++e) {
    Rng r(1000 + static_cast<uint64_t>(e));
    const std::string base = fmt::format("mlp.experts.{}.", e);
    p.lp.gate_proj[e] = param_add(p, be, base + "gate_proj.weight", {I, H}, 1.0 / std::sqrt(H), &r, 0);
    p.lp.up_proj[e] = param_add(p, be, base + "up_proj.weight", {I, H}, 1.0 / std::sqrt(H), &r, 0);
    p.lp.down_proj[e] = param_add(p, be, base + "down_proj.weight", {H, I}, 1.0 / std::sqrt(I), &r, 0);
  }
}

// The buffers that hold rows a rank computes (the receive side of each variant's dispatch).
bool receive_side(const std::string& t) {
  static const char* kTags[] = {"ep.recv",     "ep.x",         "ep.y",     "ep.y_send",  "ep.dy_recv", "ep.dy",
                                "ep.dx",       "ep.dx_send",   "llep.recv", "llep.x",    "llep.y",     "llep.y_send",
                                "llep.dy_recv", "llep.dy",     "llep.dx",  "llep.dx_send", "pllep.recv", "pllep.recv_x",
                                "pllep.y",     "pllep.dy",     "pllep.dx"};
  for (const char* k : kTags)
    if (t == k) return true;
  return false;
}

struct DispatchVariant {
  std::string name;  // standard, llep, pipelined_llep_strided, pipelined_llep_contiguous
  DispatchSchedule sched;
  std::unique_ptr<Backend> be;
  BlockParams params;
  Tensor x1, dx2;  // (N, H) inputs of every run
  // Results (this rank; reduced over the ranks for the report).
  uint64_t dispatch_peak = 0, peak = 0, receive_peak = 0, activations_peak = 0, comm_peak = 0;
  std::vector<double> seconds;  // per timed run, the slowest rank's
  int64_t rows_computed = 0;    // DispatchStats::rows_received of the last run
  LlepStats stats;
  std::vector<float> x2_host, dx1_host, grads_host;  // first run (cpu): the checks
};

std::unique_ptr<ExpertDispatch> dispatch_make(const DispatchSchedule& d, const StepContext& s) {
  switch (d.kind) {
    case DispatchSchedule::Kind::Kind_llep: return dispatch_llep_create(d);
    case DispatchSchedule::Kind::Kind_pipelined_llep: return dispatch_pipelined_llep_create(d, s);
    case DispatchSchedule::Kind::Kind_standard: break;
  }
  return dispatch_standard_create();
}

std::vector<float> host_of(Backend& be, const Tensor& t) {
  std::vector<float> h(static_cast<size_t>(t.numel()));
  be.copy_to_host(h.data(), t.data(), t.bytes());
  return h;
}

// One forward (keeping) + backward of the block. Returns this rank's seconds.
double variant_run_once(DispatchVariant& v, const ModelConfig& cfg, const RoutingProfile& prof, Comm& comm,
                        bool first) {
  Backend& be = *v.be;
  const int64_t n = v.x1.dim(0), H = cfg.hidden_size;
  StepContext s(be, cfg, prof, comm);
  s.B = 1, s.T = n, s.n = n;
  s.moe_token_chunk = v.sched.token_chunk;  // the MoE block's chunks (the dispatch bounds its windows by v.sched)
  std::unique_ptr<ExpertDispatch> dispatch = dispatch_make(v.sched, s);
  s.dispatch = dispatch.get();
  Tensor dx = be.alloc_f32(Category::Category_activations, {n, H}, "dx");  // (N, H) d x2 in, d x1 out
  be.kernels().copy(dx.f32(), v.dx2.f32(), n * H);
  be.device_ledger().peaks_reset();
  be.device_ledger().events_clear();
  comm.barrier();
  const auto t0 = Clock::now();
  if (v.sched.token_chunk > 0) {
    // The token side in chunks (Note [The MoE token side in chunks]): the checkpointed forward's x2 for
    // the checks, then the chunked recompute and backward, as a training step runs them.
    if (first && be.computes()) v.x2_host = host_of(be, moe_block_forward(s, v.params.lp, v.x1, nullptr, nullptr));
    moe_block_recompute_backward(s, v.params.lp, v.x1, Tensor(), dx);
  } else {
    MoeActs acts;
    Tensor x2 = moe_block_forward(s, v.params.lp, v.x1, &acts, nullptr);
    if (first && be.computes()) v.x2_host = host_of(be, x2);
    x2.reset();
    moe_block_backward(s, v.params.lp, v.x1, acts, Tensor(), dx);
  }
  be.synchronize();
  const double sec = seconds_since(t0);
  const Ledger& led = be.device_ledger();
  v.dispatch_peak = std::max(v.dispatch_peak, led.peak(Category::Category_dispatch));
  v.activations_peak = std::max(v.activations_peak, led.peak(Category::Category_activations));
  v.comm_peak = std::max(v.comm_peak, led.peak(Category::Category_comm));
  v.peak = std::max(v.peak, led.total_peak());
  uint64_t cur = 0;
  for (const LedgerEvent& ev : led.events()) {
    if (!receive_side(ev.tag)) continue;
    cur = ev.alloc ? cur + ev.bytes : cur - ev.bytes;
    v.receive_peak = std::max(v.receive_peak, cur);
  }
  v.rows_computed = dispatch->last().rows_received;
  if (const LlepStats* st = llep_stats(*dispatch)) v.stats = *st;
  if (first && be.computes()) {
    v.dx1_host = host_of(be, dx);
    v.grads_host.clear();
    for (const Param& p : v.params.store) {
      const std::vector<float> g = host_of(be, p.g);
      v.grads_host.insert(v.grads_host.end(), g.begin(), g.end());
    }
  }
  return sec;
}

}  // namespace

int bench_dispatch_run(const BenchDispatchOptions& o) {
  FP_CHECK(o.tokens >= 1 && o.experts >= 1 && o.top_k >= 1 && o.top_k <= o.experts && o.hidden >= 1 &&
               o.intermediate >= 1,
           "e.g. --tokens 2048 --experts 16 --top-k 2 --hidden 256 --intermediate 512",
           "--tokens {} --experts {} --top-k {} --hidden {} --intermediate {}: need positive sizes and k <= E",
           o.tokens, o.experts, o.top_k, o.hidden, o.intermediate);
  FP_CHECK(o.chunk_cap >= 1 && o.max_chunks >= 1, "e.g. --chunk-cap 1024 --max-chunks 128",
           "--chunk-cap {} --max-chunks {} must be >= 1", o.chunk_cap, o.max_chunks);
  FP_CHECK(o.repeats >= 1 && o.warmup >= 0, "e.g. --repeats 5 --warmup 1", "--repeats {} --warmup {}", o.repeats,
           o.warmup);
  FP_CHECK(o.device == "cpu" || o.device == "meta", "--device cpu or --device meta", "--device {}", o.device);
  const RoutingProfile prof = routing_profile_parse(o.profile, "--profile");
  FP_CHECK(prof.kind != RoutingProfile::Kind::Kind_router, "--profile balanced or --profile hot:R:H",
           "--profile router: the benchmark sets the routing (and meta computes no router)");
  routing_profile_check(prof, o.top_k, o.experts, "--profile");
  FP_CHECK(o.token_chunk >= 0, "e.g. --token-chunk 8192 (0: no chunked variant)", "--token-chunk {} must be >= 0",
           o.token_chunk);
  Comm& comm = comm_world();
  const int W = comm.size(), rank = comm.rank();
  const bool lead = rank == 0, timed = o.device == "cpu";
  const ModelConfig cfg = block_config(o);
  const ExpertLayout mine = expert_layout(rank, W, o.experts);
  if (lead)
    log_info("bench dispatch: N {} per rank, E {}, k {}, H {}, I {}, profile {}, {} rank(s) on {}", o.tokens,
             o.experts, o.top_k, o.hidden, o.intermediate, o.profile, W, o.device);

  std::vector<DispatchVariant> vs;
  auto add = [&](const std::string& name, DispatchSchedule::Kind kind, bool strided) {
    DispatchVariant& v = vs.emplace_back();
    v.name = name;
    v.sched.kind = kind;
    v.sched.lambda = o.lambda;
    v.sched.alpha = o.alpha;
    v.sched.min_tokens_per_gemm = o.min_tokens_per_gemm;
    v.sched.chunk_cap = o.chunk_cap;
    v.sched.max_chunks = o.max_chunks;
    v.sched.strided = strided;
  };
  add("standard", DispatchSchedule::Kind::Kind_standard, true);
  add("llep", DispatchSchedule::Kind::Kind_llep, true);
  add("pipelined_llep_strided", DispatchSchedule::Kind::Kind_pipelined_llep, true);
  add("pipelined_llep_contiguous", DispatchSchedule::Kind::Kind_pipelined_llep, false);
  if (o.token_chunk > 0) {
    add("pipelined_llep_token_chunks", DispatchSchedule::Kind::Kind_pipelined_llep, true);
    vs.back().sched.token_chunk = o.token_chunk;
  }
  for (DispatchVariant& v : vs) {
    v.be = backend_create(o.device, kUnlimitedBytes, kUnlimitedBytes);
    block_params_make(v.params, *v.be, cfg, mine);
    v.x1 = v.be->alloc_f32(Category::Category_activations, {o.tokens, o.hidden}, "x1");
    v.dx2 = v.be->alloc_f32(Category::Category_activations, {o.tokens, o.hidden}, "dx2");
    if (timed) {
      Rng r(100 + static_cast<uint64_t>(rank));
      std::vector<float> h(static_cast<size_t>(o.tokens * o.hidden));
      for (float& x : h) x = static_cast<float>(r.normal());
      v.be->copy_from_host(v.x1.data(), h.data(), v.x1.bytes());
      for (float& x : h) x = static_cast<float>(r.normal());
      v.be->copy_from_host(v.dx2.data(), h.data(), v.dx2.bytes());
    }
  }
  // Interleaved (standard, llep, ..., standard, llep, ...) so a change in the machine's load hits all alike.
  const int runs = timed ? o.warmup + o.repeats : 1;
  for (int i = 0; i < runs; ++i)
    for (DispatchVariant& v : vs) {
      const double sec = max_over_ranks(comm, variant_run_once(v, cfg, prof, comm, i == 0));
      if (timed && i >= o.warmup) v.seconds.push_back(sec);
    }

  // Check first: every variant computes what standard computes (on this rank's tokens and experts).
  nlohmann::json j;
  if (timed) {
    const DispatchVariant& ref = vs.front();
    for (size_t i = 1; i < vs.size(); ++i) {
      const DispatchVariant& v = vs[i];
      const double e_x2 = max_over_ranks(comm, max_rel_diff(v.x2_host, ref.x2_host));
      const double e_dx = max_over_ranks(comm, max_rel_diff(v.dx1_host, ref.dx1_host));
      const double e_g = max_over_ranks(comm, max_rel_diff(v.grads_host, ref.grads_host));
      j["check"][v.name] = {{"x2_max_rel_diff", e_x2}, {"dx1_max_rel_diff", e_dx}, {"grads_max_rel_diff", e_g}};
      if (lead)
        fmt::print("check {} vs standard, max diff / max |standard|: x2 {:.1e}, dx1 {:.1e}, weight gradients {:.1e}\n",
                   v.name, e_x2, e_dx, e_g);
      FP_CHECK(e_x2 <= 1e-5 && e_dx <= 1e-5 && e_g <= 1e-5, "this is a bug in the dispatch: please report it",
               "{} disagrees with standard", v.name);
    }
  }

  j["tokens"] = o.tokens;
  j["experts"] = o.experts;
  j["top_k"] = o.top_k;
  j["hidden"] = o.hidden;
  j["intermediate"] = o.intermediate;
  j["profile"] = o.profile;
  j["chunk_cap"] = o.chunk_cap;
  j["max_chunks"] = o.max_chunks;
  j["lambda"] = o.lambda;
  j["alpha"] = o.alpha;
  j["min_tokens_per_gemm"] = o.min_tokens_per_gemm;
  j["token_chunk"] = o.token_chunk;
  j["device"] = o.device;
  machine_json(j);
  j["ranks"] = W;
  j["repeats"] = timed ? o.repeats : 0;
  for (DispatchVariant& v : vs) {
    nlohmann::json& r = j[v.name];
    std::vector<int64_t> rows(static_cast<size_t>(W));
    comm.all_gather(&v.rows_computed, rows.data(), 1, DType::DType_I64);
    int64_t mx = 0, sum = 0;
    for (int64_t x : rows) {
      mx = std::max(mx, x);
      sum += x;
    }
    r["dispatch_peak_bytes"] = max_over_ranks(comm, v.dispatch_peak);
    r["peak_bytes"] = max_over_ranks(comm, v.peak);
    r["receive_side_peak_bytes"] = max_over_ranks(comm, v.receive_peak);
    r["activations_peak_bytes"] = max_over_ranks(comm, v.activations_peak);
    r["comm_peak_bytes"] = max_over_ranks(comm, v.comm_peak);
    r["rows_computed_max"] = mx;
    r["rank_load_max_over_mean"] = sum > 0 ? static_cast<double>(mx) * W / static_cast<double>(sum) : 1.0;
    if (timed) {
      r["seconds"] = median(v.seconds);
      r["seconds_all"] = v.seconds;
    }
    if (v.sched.kind != DispatchSchedule::Kind::Kind_standard) {
      r["plan_active"] = v.stats.active;
      r["native_imbalance"] = v.stats.imbalance;
      r["guest_experts_max"] = max_over_ranks(comm, v.stats.guests);
    }
    if (v.sched.kind == DispatchSchedule::Kind::Kind_pipelined_llep) {
      r["chunks"] = v.stats.chunks;
      r["c_eff"] = v.stats.c_eff;
      r["chunk_send_ratio"] = max_over_ranks(comm, v.stats.chunk_send_ratio);
      r["recv_frac_of_bound"] = max_over_ranks(
          comm, static_cast<double>(v.stats.chunk_recv_max) / static_cast<double>(v.stats.chunk_recv_bound));
      r["chunk_bound_bytes"] = v.stats.chunk_bound_bytes;
      r["chunk_bound_exceeded"] = r["receive_side_peak_bytes"].get<uint64_t>() > v.stats.chunk_bound_bytes;
    }
  }
  for (const DispatchVariant& v : vs) {
    if (v.name == "standard") continue;
    for (const char* base : {"standard", "llep"}) {
      if (v.name == base) continue;
      nlohmann::json& r = j["ratios"][v.name + "_over_" + base];
      const nlohmann::json& b = j[base];
      const auto ratio = [&](const char* key) {
        return j[v.name][key].get<double>() / std::max(b[key].get<double>(), 1e-300);
      };
      r["dispatch_peak"] = ratio("dispatch_peak_bytes");
      r["dispatch_peak_reduction"] = 1.0 - r["dispatch_peak"].get<double>();
      r["receive_side_peak"] = ratio("receive_side_peak_bytes");
      r["peak"] = ratio("peak_bytes");
      if (timed) r["seconds"] = ratio("seconds");
    }
  }
  if (lead) {
    fmt::print("bench dispatch: N = {} per rank, E = {}, k = {}, H = {}, I = {}, profile {}, c = {}, K_max = {}, {} "
               "rank(s), device {}\n",
               o.tokens, o.experts, o.top_k, o.hidden, o.intermediate, o.profile, o.chunk_cap, o.max_chunks, W,
               o.device);
    machine_print();
    fmt::print("| variant | dispatch peak | receive-side peak | device peak | rank load max/mean | fwd+bwd s {} | K | "
               "chunk send ratio | recv / bound |\n|---|---|---|---|---|---|---|---|---|\n",
               timed ? fmt::format("(median of {})", o.repeats) : std::string("(meta: not computed)"));
    for (const DispatchVariant& v : vs) {
      const nlohmann::json& r = j[v.name];
      const bool chunked = v.sched.kind == DispatchSchedule::Kind::Kind_pipelined_llep;
      fmt::print("| {} | {} | {} | {} | {:.3f} | {} | {} | {} | {} |\n", v.name,
                 bytes_format(r["dispatch_peak_bytes"].get<uint64_t>()),
                 bytes_format(r["receive_side_peak_bytes"].get<uint64_t>()), bytes_format(r["peak_bytes"].get<uint64_t>()),
                 r["rank_load_max_over_mean"].get<double>(),
                 timed ? fmt::format("{:.3f}", r["seconds"].get<double>()) : std::string("-"),
                 chunked ? std::to_string(r["chunks"].get<int64_t>()) : std::string("-"),
                 chunked ? fmt::format("{:.2f}", r["chunk_send_ratio"].get<double>()) : std::string("-"),
                 chunked ? fmt::format("{:.3f}", r["recv_frac_of_bound"].get<double>()) : std::string("-"));
    }
    for (const DispatchVariant& v : vs) {
      if (v.sched.kind != DispatchSchedule::Kind::Kind_pipelined_llep) continue;
      const nlohmann::json& r = j["ratios"][v.name + "_over_llep"];
      fmt::print("{} / llep: dispatch peak {:.4f} ({:.1f}% below), receive side {:.4f}, device peak {:.4f}", v.name,
                 r["dispatch_peak"].get<double>(), 100 * r["dispatch_peak_reduction"].get<double>(),
                 r["receive_side_peak"].get<double>(), r["peak"].get<double>());
      if (timed) fmt::print(", time {:.3f}x", r["seconds"].get<double>());
      fmt::print("; chunk buffers within the launch bound {}: {}\n",
                 bytes_format(j[v.name]["chunk_bound_bytes"].get<uint64_t>()),
                 j[v.name]["chunk_bound_exceeded"].get<bool>() ? "NO" : "yes");
    }
    json_write(o.json, j);
  }
  return 0;
}

}  // namespace fp::bench
