// Standard expert parallelism, dispatch level (run under mpirun -np W; W = 1 runs the standard
// dispatch sending rows to itself). For each routing profile, every rank takes its own block of
// tokens through one MoE block (forward as checkpointed, forward again keeping, backward) with the
// experts sharded (sched/dispatch/standard.cpp), and checks against the single-rank computation of
// the same blocks (the local dispatch, every expert on one rank), computed on every rank:
//   - the block's output x2 and input gradient dx1, residual path removed, within 1e-6 (max-relative);
//   - every weight gradient (router, post_attention_layernorm, each expert's three matrices), summed
//     over ranks, within 1e-6 (norm-relative: see norm_rel); a rank's gradients of experts it does not
//     own stay exactly zero, and those experts' weights are NaN on the expert-parallel side (reading
//     one would poison every output);
//   - the dispatch-category peak equals the bytes its receive count R implies (Note [Standard
//     dispatch peak]), with R counted from the reference routing of all blocks;
//   - for the profiles (not the router), the meta backend performs exactly the cpu run's peaks.
//
//   ep_case [PROFILE ...]     default: router balanced hot:0.95:2 hot:1:2
//   ep_case bench [--tokens N] [--hidden H] [--experts E] [--top-k k] [--ffn I] [--profiles P,P]
//                 [--device cpu|meta] [--repeats 5] [--json FILE]      (docs/benchmarks.md)
//
// Legend: n_b tokens of block b (rank b's tokens, sizes differ per rank), H hidden, E experts, k top-k,
// m = n k, I expert width, W ranks, R rows a rank computes.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "comm/comm.h"
#include "core/rng.h"
#include "core/units.h"
#include "model/blocks.h"
#include "model/layout.h"
#include "model/params.h"
#include "sched/dispatch/dispatch.h"
#include "moe_layer_case.h"

using namespace fp;
using namespace fp::dist_test;

namespace {

struct BlockResult {
  std::vector<float> x2, dx1;  // (n_b, H) x2 - x1 and dx1 - dx2: the block's part, residual removed
  std::vector<int64_t> counts; // (E) routed copies per expert
  uint64_t dispatch_peak = 0;
  std::array<uint64_t, kNumCategories> peaks{};
};

// One MoE block on `be` for block b's tokens: forward as checkpointed (no keep), forward keeping,
// backward with a fixed upstream gradient. Gradients accumulate into lp's .g.
BlockResult block_run(Backend& be, Comm& comm, ExpertDispatch* dispatch, const ModelConfig& cfg, RoutingProfile prof,
                      const LayerParams& lp, int b, int64_t n) {
  const int64_t H = cfg.hidden_size, E = cfg.num_experts;
  StepContext s(be, cfg, prof, comm);
  s.B = 1, s.T = n, s.n = n;
  s.dispatch = dispatch;
  BlockResult r;
  be.device_ledger().peaks_reset();
  // Inputs: random on cpu; nothing to draw on meta (it holds no data).
  const bool data = be.computes();
  const std::vector<float> x1_host = data ? random_vec(n * H, 1000 + b, 1.0) : std::vector<float>{};
  const std::vector<float> dx2_host = data ? random_vec(n * H, 2000 + b, 1.0) : std::vector<float>{};
  Tensor x1 = device_of(be, Category::Category_activations, {n, H}, x1_host, "x1");
  Tensor aux_bias = device_of(be, Category::Category_workspace, {E}, random_vec(E, 3000, 0.1), "aux_bias");
  RouterStats stats;
  Tensor x2 = moe_block_forward(s, lp, x1, nullptr, &stats);
  r.counts = stats.counts;
  // The block's own part, without the residual (which would hide an error in the experts' part).
  if (be.computes()) r.x2 = host_of(be, x2);
  for (size_t i = 0; i < r.x2.size(); ++i) r.x2[i] -= x1_host[i];
  x2.reset();
  MoeActs acts;
  Tensor x2b = moe_block_forward(s, lp, x1, &acts, nullptr);
  x2b.reset();
  Tensor dx = device_of(be, Category::Category_activations, {n, H}, dx2_host, "dx");
  moe_block_backward(s, lp, x1, acts, aux_bias, dx);
  if (be.computes()) r.dx1 = host_of(be, dx);
  for (size_t i = 0; i < r.dx1.size(); ++i) r.dx1[i] -= dx2_host[i];
  r.dispatch_peak = be.device_ledger().peak(kDispatch);
  for (int c = 0; c < kNumCategories; ++c) r.peaks[c] = be.device_ledger().peak(static_cast<Category>(c));
  return r;
}

// Note [Standard dispatch peak]: with m = n k rows sent and R received, the dispatch category holds
// only what the rank receives (the token side, m rows of xs, ys, dys, dxs and their ids, is category
// activations), so one MoE block (checkpointed forward, forward keeping, backward) peaks at
//   8R (perm, unperm: i32) + 4H 3R
// 3R: the grouped input kept for backward plus the grouped output and its source-major copy (forward),
// or plus the received output gradient and its grouped copy (backward); the received rows and their
// grouped copy of the checkpointed forward are only 2R. perm and unperm live through both 3R moments.
uint64_t standard_peak(int64_t R, int64_t H) { return static_cast<uint64_t>(8 * R + 4 * H * 3 * R); }

// Returns the number of failed checks on this rank.
int profile_check(Comm& comm, const std::string& profile_str) {
  const ModelConfig cfg = config_make();
  const RoutingProfile prof = routing_profile_parse(profile_str);
  const int W = comm.size(), rank = comm.rank();
  const int64_t E = cfg.num_experts, H = cfg.hidden_size, k = cfg.num_experts_per_tok;
  const ExpertLayout mine = expert_layout(rank, W, E);
  int failed = 0;
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) {
      std::fprintf(stderr, "FAIL [rank %d, %s]: %s\n", rank, profile_str.c_str(), what.c_str());
      ++failed;
    }
  };

  // Reference: the single-rank computation (local dispatch) of every block, on every rank.
  std::unique_ptr<ExpertDispatch> local = dispatch_local_create();
  const auto refs = reference_blocks(cfg, W, [&](Backend& be, Comm& c, const LayerParams& lp, int b) {
    return block_run(be, c, local.get(), cfg, prof, lp, b, block_tokens(b));
  });
  const std::vector<BlockResult>& ref = refs.first;
  const auto& g_ref = refs.second;

  // Expert parallel: this rank's block; experts it does not own are poisoned (never to be read).
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  ParamStore ps(cfg, *be);
  ps.init(cfg.seed);
  const LayerParams& lp = ps.layers[0];
  experts_scale(*be, lp, E);
  for (int64_t e = 0; e < E; ++e) {
    if (mine.owns(e)) continue;
    for (Param* p : {lp.gate_proj[e], lp.up_proj[e], lp.down_proj[e]})
      be->kernels().fill(p->w.f32(), NAN, p->w.numel());
  }
  std::unique_ptr<ExpertDispatch> standard = dispatch_standard_create();
  BlockResult got = block_run(*be, comm, standard.get(), cfg, prof, lp, rank, block_tokens(rank));

  const double e_x2 = max_rel(got.x2, ref[rank].x2), e_dx = max_rel(got.dx1, ref[rank].dx1);
  check(e_x2 <= kTol, fmt::format("output x2 differs: max-relative {:.3e}", e_x2));
  check(e_dx <= kTol, fmt::format("input gradient differs: max-relative {:.3e}", e_dx));
  double worst = std::max(e_x2, e_dx);

  auto g_ep = moe_grads(*be, lp, E);
  for (int64_t e = 0; e < E; ++e) {
    if (mine.owns(e)) continue;
    for (size_t i = static_cast<size_t>(2 + 3 * e); i < static_cast<size_t>(5 + 3 * e); ++i) {
      double mx = 0;
      for (float v : g_ep[i].second) mx = std::max(mx, static_cast<double>(std::fabs(v)));
      check(mx == 0, fmt::format("{}: a rank that does not own expert {} wrote its gradient", g_ep[i].first, e));
    }
  }
  for (size_t i = 0; i < g_ep.size(); ++i) {
    comm.all_reduce_sum(g_ep[i].second.data(), static_cast<int64_t>(g_ep[i].second.size()), DType::DType_F32);
    const double err = norm_rel(g_ep[i].second, g_ref[i].second);
    worst = std::max(worst, err);
    check(err <= kTol, fmt::format("gradient {} differs: norm-relative {:.3e}", g_ref[i].first, err));
  }

  // The receive count from the reference routing: every block's routes to this rank's experts.
  int64_t R = 0;
  for (int b = 0; b < W; ++b)
    for (int64_t e = mine.first; e < mine.first + mine.count; ++e) R += ref[b].counts[e];
  const int64_t m = block_tokens(rank) * k;
  check(standard->last().rows_received == R,
        fmt::format("the dispatch computed {} rows, the routing sends it {}", standard->last().rows_received, R));
  // The local dispatch receives nothing: its routed copies are all token side (activations).
  check(ref[rank].dispatch_peak == 0,
        fmt::format("local dispatch peak {} B, want 0 (nothing is received)", ref[rank].dispatch_peak));
  const uint64_t want = standard_peak(R, H);
  check(got.dispatch_peak == want,
        fmt::format("dispatch peak {} B, the receive count R = {} (m = {}) implies {} B", got.dispatch_peak, R, m,
                    want));

  // Meta: the same allocations with null data (the profiles give the routing; the router needs data).
  std::string meta_note;
  if (prof.kind != RoutingProfile::Kind::Kind_router) {
    auto be_meta = backend_create("meta", kUnlimitedBytes, kUnlimitedBytes);
    ParamStore ps_meta(cfg, *be_meta);
    std::unique_ptr<ExpertDispatch> standard_meta = dispatch_standard_create();
    BlockResult meta =
        block_run(*be_meta, comm, standard_meta.get(), cfg, prof, ps_meta.layers[0], rank, block_tokens(rank));
    for (int c = 0; c < kNumCategories; ++c)
      check(meta.peaks[c] == got.peaks[c], fmt::format("meta peak of {} is {} B, the cpu run's {} B",
                                                       category_name(static_cast<Category>(c)), meta.peaks[c],
                                                       got.peaks[c]));
    meta_note = ", meta peaks equal";
  }

  // Per-rank receive counts and peaks, printed by rank 0 (the skew of the plain variant).
  std::vector<int64_t> rs(static_cast<size_t>(W)), peaks(static_cast<size_t>(W));
  const int64_t peak_mine = static_cast<int64_t>(got.dispatch_peak);
  comm.all_gather(&R, rs.data(), 1, DType::DType_I64);
  comm.all_gather(&peak_mine, peaks.data(), 1, DType::DType_I64);
  comm.all_reduce_max(&worst, 1, DType::DType_F64);
  if (rank == 0) {
    std::string per;
    for (int r = 0; r < W; ++r) per += fmt::format(" [rank {}: R {}, dispatch peak {} B]", r, rs[r], peaks[r]);
    std::printf("W=%d %-11s worst relative error %.2e%s;%s\n", W, profile_str.c_str(), worst, meta_note.c_str(),
                per.c_str());
  }
  return failed;
}

// ---- bench: the same tokens through one MoE block with the experts replicated on every rank (the
// local dispatch: the layout before expert parallelism, no comm) and with standard expert
// parallelism, in one run. Per rank: the dispatch-category peak and R; per variant: the median over
// repeats of the slowest rank's forward (checkpointed) + forward (keeping) + backward seconds.
struct BenchArgs {
  int64_t tokens = 2048, hidden = 128, experts = 16, top_k = 2, ffn = 128;
  std::vector<std::string> profiles = {"balanced", "hot:0.95:2"};
  std::string device = "cpu", json;
  int repeats = 5;
};

BenchArgs bench_args_parse(int argc, char** argv) {
  BenchArgs a;
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    FP_CHECK(i + 1 < argc, "every bench option takes a value", "{} has no value", k);
    const std::string v = argv[++i];
    if (k == "--tokens") a.tokens = std::stoll(v);
    else if (k == "--hidden") a.hidden = std::stoll(v);
    else if (k == "--experts") a.experts = std::stoll(v);
    else if (k == "--top-k") a.top_k = std::stoll(v);
    else if (k == "--ffn") a.ffn = std::stoll(v);
    else if (k == "--device") a.device = v;
    else if (k == "--repeats") a.repeats = std::stoi(v);
    else if (k == "--json") a.json = v;
    else if (k == "--profiles") {
      a.profiles.clear();
      for (size_t p = 0, q; p <= v.size(); p = q + 1) {
        q = v.find(',', p);
        if (q == std::string::npos) q = v.size();
        a.profiles.push_back(v.substr(p, q - p));
      }
    } else {
      FP_CHECK(false, "options: --tokens --hidden --experts --top-k --ffn --profiles --device --repeats --json",
               "unknown bench option {}", k);
    }
  }
  return a;
}

int bench_run(Comm& comm, const BenchArgs& a) {
  ModelConfig cfg = config_make();
  cfg.hidden_size = a.hidden, cfg.num_experts = a.experts, cfg.num_experts_per_tok = a.top_k;
  cfg.moe_intermediate_size = a.ffn;
  const int W = comm.size(), rank = comm.rank();
  const bool meta = a.device == "meta";
  const int repeats = meta ? 1 : a.repeats;
  std::unique_ptr<Comm> single = comm_single();
  nlohmann::json out = {{"ranks", W}, {"tokens_per_rank", a.tokens}, {"hidden", a.hidden}, {"experts", a.experts},
                        {"top_k", a.top_k}, {"ffn", a.ffn}, {"device", a.device}, {"repeats", repeats},
                        {"runs", nlohmann::json::array()}};
  if (rank == 0)
    std::printf("W=%d, %ld tokens per rank, H %ld, E %ld, top-%ld, I %ld, %s; dispatch peak per rank in bytes\n", W,
                a.tokens, a.hidden, a.experts, a.top_k, a.ffn, a.device.c_str());
  for (const std::string& profile : a.profiles) {
    const RoutingProfile prof = routing_profile_parse(profile);
    double base_sec = 0;
    for (const char* variant : {"replicated", "standard"}) {
      const bool ep = std::string(variant) == "standard";
      auto be = backend_create(a.device, kUnlimitedBytes, kUnlimitedBytes);
      ParamStore ps(cfg, *be);
      if (!meta) ps.init(cfg.seed);
      std::unique_ptr<ExpertDispatch> d = ep ? dispatch_standard_create() : dispatch_local_create();
      std::vector<double> secs;
      int64_t peak = 0;
      for (int r = 0; r < repeats; ++r) {
        comm.barrier();
        const auto t0 = std::chrono::steady_clock::now();
        BlockResult res = block_run(*be, ep ? comm : *single, d.get(), cfg, prof, ps.layers[0], rank, a.tokens);
        double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        comm.all_reduce_max(&sec, 1, DType::DType_F64);
        secs.push_back(sec);
        peak = static_cast<int64_t>(res.dispatch_peak);
      }
      std::sort(secs.begin(), secs.end());
      const double sec = secs[secs.size() / 2];
      const int64_t R = d->last().rows_received;
      std::vector<int64_t> peaks(static_cast<size_t>(W)), rs(static_cast<size_t>(W));
      comm.all_gather(&peak, peaks.data(), 1, DType::DType_I64);
      comm.all_gather(&R, rs.data(), 1, DType::DType_I64);
      const double pmax = static_cast<double>(*std::max_element(peaks.begin(), peaks.end()));
      double pmean = 0, rmean = 0;
      for (int r = 0; r < W; ++r) pmean += static_cast<double>(peaks[r]) / W, rmean += static_cast<double>(rs[r]) / W;
      const double rmax = static_cast<double>(*std::max_element(rs.begin(), rs.end()));
      if (!ep) base_sec = sec;
      if (rank == 0) {
        std::string per;
        for (int r = 0; r < W; ++r) per += fmt::format(" {}", peaks[r]);
        // The replicated layout receives nothing (its dispatch peak is 0): the skew shows as the
        // standard peak's max over mean across ranks.
        std::printf("  %-11s %-10s max %11.0f (max/mean %.2f)  R max/mean %.2f  %s  per rank:%s\n",
                    profile.c_str(), variant, pmax, pmean > 0 ? pmax / pmean : 0.0, rmean > 0 ? rmax / rmean : 0.0,
                    meta ? "" : fmt::format("{:.4f} s (x{:.2f})", sec, sec / base_sec).c_str(), per.c_str());
        out["runs"].push_back({{"profile", profile}, {"variant", variant}, {"dispatch_peak_bytes", peaks},
                               {"rows_received", rs}, {"dispatch_peak_max", pmax}, {"dispatch_peak_mean", pmean},
                               {"peak_max_over_mean", pmean > 0 ? pmax / pmean : 0.0},
                               {"load_max_over_mean", rmean > 0 ? rmax / rmean : 0.0},
                               {"seconds_median", meta ? nlohmann::json(nullptr) : nlohmann::json(sec)},
                               {"time_ratio_vs_replicated",
                                meta ? nlohmann::json(nullptr) : nlohmann::json(sec / base_sec)}});
      }
    }
  }
  if (rank == 0 && !a.json.empty()) {
    std::FILE* f = std::fopen(a.json.c_str(), "w");
    FP_CHECK(f != nullptr, "give a writable --json path", "cannot write {}", a.json);
    std::fputs(out.dump(2).c_str(), f);
    std::fclose(f);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Comm& comm = comm_world();
  try {
    if (argc > 1 && std::string(argv[1]) == "bench") {
      const int rc = bench_run(comm, bench_args_parse(argc, argv));
      comm.barrier();
      return rc;
    }
    std::vector<std::string> profiles;
    for (int i = 1; i < argc; ++i) profiles.push_back(argv[i]);
    if (profiles.empty()) profiles = {"router", "balanced", "hot:0.95:2", "hot:1:2"};
    int64_t failed = 0;
    for (const std::string& p : profiles) failed += profile_check(comm, p);
    comm.all_reduce_sum(&failed, 1, DType::DType_I64);
    if (comm.rank() == 0) std::printf(failed == 0 ? "ep_case: all checks passed\n" : "ep_case: %ld FAILED\n", failed);
    comm.barrier();
    return failed == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error [rank %d]: %s\n", comm.rank(), e.what());
    comm.abort(1);
  }
}
