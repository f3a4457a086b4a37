// LLEP and PipelinedLLEP, dispatch level (run under mpirun -np W). For each routing profile and each
// variant setting, every rank takes its own block of tokens through one MoE block (forward as
// checkpointed, forward again keeping, backward) with the experts sharded, and checks against
//   - the single-rank computation of the same blocks (the local dispatch, every expert on one rank),
//     computed on every rank, and the standard expert-parallel dispatch on the same ranks:
//     the block's output x2 and input gradient dx1 (residual removed) within 1e-6 max-relative, every
//     weight gradient (router, norm, each expert's three matrices) summed over ranks within 1e-6
//     norm-relative; a rank's gradients of experts it does not own stay zero, and those experts'
//     weights are NaN here (a guest expert computed with anything but the weights its home sent
//     would poison the outputs);
//   - pipelined_llep: the expert-side chunk buffers on the ledger's timeline never exceed the launch
//     bound 2 W k c_eff H x 4 bytes (c_eff computed here from the formula);
//   - the plan was really exercised: under hot profiles LLEP is active and some rank computes a guest
//     expert (settings with a small min_tokens_per_gemm), and a high lambda falls back;
//   - for the profiles (not the router), the meta backend performs exactly the cpu run's peaks.
// Then, on the meta backend only (nothing is computed), a larger layer under hot:0.95:16 checks the
// pipelined bound on the ledger at a skew the small model cannot express.
//
//   llep_case [PROFILE ...]     default: router balanced hot:0.95:2 hot:1:2
//
// Legend: n_b tokens of block b (rank b's tokens, sizes differ per rank), H hidden, E experts, k top-k,
// W ranks, c chunk cap, K chunks, c_eff tokens per source per chunk.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "comm/comm.h"
#include "core/rng.h"
#include "core/units.h"
#include "model/blocks.h"
#include "model/layout.h"
#include "model/params.h"
#include "sched/dispatch/dispatch.h"
#include "sched/dispatch/llep.h"
#include "moe_layer_case.h"

using namespace fp;
using namespace fp::dist_test;

namespace {


struct BlockResult {
  std::vector<float> x2, dx1;  // (n_b, H) x2 - x1 and dx1 - dx2
  std::array<uint64_t, kNumCategories> peaks{};
  uint64_t chunk_side_peak = 0;  // the most bytes of pipelined_llep's expert-side buffers at once (ledger)
  LlepStats stats;
  std::vector<LedgerEvent> events;  // the device ledger's whole sequence
};

using DispatchFactory = std::function<std::unique_ptr<ExpertDispatch>(const StepContext&)>;

// The expert-side buffers of pipelined_llep (pipelined_llep.cpp): what a destination receives in a
// chunk and what it computes from it.
bool expert_side(const std::string& tag) {
  return tag == "pllep.recv" || tag == "pllep.recv_x" || tag == "pllep.y" || tag == "pllep.dy" || tag == "pllep.dx";
}

// One MoE block on `be` for n tokens of block b: forward as checkpointed, forward keeping, backward.
BlockResult block_run(Backend& be, Comm& comm, const DispatchFactory& make, const ModelConfig& cfg,
                      RoutingProfile prof, const LayerParams& lp, int b, int64_t n) {
  const int64_t H = cfg.hidden_size, E = cfg.num_experts;
  StepContext s(be, cfg, prof, comm);
  s.B = 1, s.T = n, s.n = n;
  std::unique_ptr<ExpertDispatch> dispatch = make(s);
  s.dispatch = dispatch.get();
  BlockResult r;
  be.device_ledger().peaks_reset();
  be.device_ledger().events_clear();
  const bool data = be.computes();
  Tensor x1 = data ? device_of(be, Category::Category_activations, {n, H}, random_vec(n * H, 1000 + b, 1.0), "x1")
                   : be.alloc_f32(Category::Category_activations, {n, H}, "x1");
  Tensor aux_bias = data ? device_of(be, Category::Category_workspace, {E}, random_vec(E, 3000, 0.1), "aux_bias")
                         : be.alloc_f32(Category::Category_workspace, {E}, "aux_bias");
  RouterStats stats;
  Tensor x2 = moe_block_forward(s, lp, x1, nullptr, &stats);
  if (data) {
    r.x2 = host_of(be, x2);
    const std::vector<float> x1_host = host_of(be, x1);
    for (size_t i = 0; i < r.x2.size(); ++i) r.x2[i] -= x1_host[i];
  }
  x2.reset();
  MoeActs acts;
  Tensor x2b = moe_block_forward(s, lp, x1, &acts, nullptr);
  x2b.reset();
  const std::vector<float> dx2_host = random_vec(n * H, 2000 + b, 1.0);
  Tensor dx = data ? device_of(be, Category::Category_activations, {n, H}, dx2_host, "dx")
                   : be.alloc_f32(Category::Category_activations, {n, H}, "dx");
  moe_block_backward(s, lp, x1, acts, aux_bias, dx);
  if (data) {
    r.dx1 = host_of(be, dx);
    for (size_t i = 0; i < r.dx1.size(); ++i) r.dx1[i] -= dx2_host[i];
  }
  for (int c = 0; c < kNumCategories; ++c) r.peaks[c] = be.device_ledger().peak(static_cast<Category>(c));
  uint64_t cur = 0;
  for (const LedgerEvent& ev : be.device_ledger().events()) {
    if (!expert_side(ev.tag)) continue;
    cur = ev.alloc ? cur + ev.bytes : cur - ev.bytes;
    r.chunk_side_peak = std::max(r.chunk_side_peak, cur);
  }
  if (be.device_ledger().dropped_events() > 0) r.chunk_side_peak = UINT64_MAX;  // cannot tell: fail loudly
  if (const LlepStats* st = llep_stats(*dispatch)) r.stats = *st;
  r.events = be.device_ledger().events();
  return r;
}

struct Variant {
  std::string label;
  DispatchSchedule sched;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  auto make = [](DispatchSchedule::Kind kind, double lambda, int64_t m, int64_t c, int64_t kmax, bool strided) {
    DispatchSchedule d;
    d.kind = kind;
    d.lambda = lambda;
    d.min_tokens_per_gemm = m;
    d.chunk_cap = c;
    d.max_chunks = kmax;
    d.strided = strided;
    return d;
  };
  using K = DispatchSchedule::Kind;
  v.push_back({"llep", make(K::Kind_llep, 1.3, 1024, 1024, 128, true)});             // forced remainders
  v.push_back({"llep m=4", make(K::Kind_llep, 1.3, 4, 1024, 128, true)});            // pieces on many ranks
  v.push_back({"llep lambda=50", make(K::Kind_llep, 50, 4, 1024, 128, true)});       // falls back to standard
  v.push_back({"pipelined strided c=8", make(K::Kind_pipelined_llep, 1.3, 4, 8, 128, true)});
  v.push_back({"pipelined contiguous c=8", make(K::Kind_pipelined_llep, 1.3, 4, 8, 128, false)});
  v.push_back({"pipelined strided c=5 K<=3", make(K::Kind_pipelined_llep, 1.3, 4, 5, 3, true)});
  v.push_back({"pipelined c=1000 (K=1)", make(K::Kind_pipelined_llep, 1.3, 1024, 1000, 128, true)});
  return v;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Returns the number of failed checks on this rank.
int profile_check(Comm& comm, const std::string& profile_str) {
  const ModelConfig cfg = config_make();
  const RoutingProfile prof = routing_profile_parse(profile_str);
  const bool hot = prof.kind == RoutingProfile::Kind::Kind_hot;
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
  const auto refs = reference_blocks(cfg, W, [&](Backend& be, Comm& c, const LayerParams& lp, int b) {
    return block_run(be, c, [](const StepContext&) { return dispatch_local_create(); }, cfg, prof, lp, b,
                     block_tokens(b));
  });
  const std::vector<BlockResult>& ref = refs.first;
  const auto& g_ref = refs.second;

  // One expert-parallel run: this rank's block; experts it does not own are poisoned.
  auto run = [&](Backend& be, const DispatchFactory& make, bool poison) {
    ParamStore ps(cfg, be);
    if (be.computes()) {
      ps.init(cfg.seed);
      experts_scale(be, ps.layers[0], E);
      for (int64_t e = 0; e < E; ++e) {
        if (mine.owns(e) || !poison) continue;
        for (Param* p : {ps.layers[0].gate_proj[e], ps.layers[0].up_proj[e], ps.layers[0].down_proj[e]})
          be.kernels().fill(p->w.f32(), NAN, p->w.numel());
      }
    }
    BlockResult r = block_run(be, comm, make, cfg, prof, ps.layers[0], rank, block_tokens(rank));
    std::vector<std::pair<std::string, std::vector<float>>> g;
    if (be.computes()) g = moe_grads(be, ps.layers[0], E);
    return std::make_pair(std::move(r), std::move(g));
  };

  auto be_std = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  const auto [std_res, std_g] = run(*be_std, [](const StepContext&) { return dispatch_standard_create(); }, true);

  double worst = 0;
  std::string notes;
  for (const Variant& v : variants()) {
    const DispatchSchedule sched = v.sched;
    const DispatchFactory make = [sched](const StepContext& s) {
      return sched.kind == DispatchSchedule::Kind::Kind_llep ? dispatch_llep_create(sched)
                                                              : dispatch_pipelined_llep_create(sched, s);
    };
    auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
    auto [got, g] = run(*be, make, true);
    const std::string tag = v.label + ": ";
    const double e_x2 = max_rel(got.x2, ref[rank].x2), e_dx = max_rel(got.dx1, ref[rank].dx1);
    const double s_x2 = max_rel(got.x2, std_res.x2), s_dx = max_rel(got.dx1, std_res.dx1);
    check(e_x2 <= kTol && s_x2 <= kTol, tag + fmt::format("output x2 differs: {:.3e} from one rank, {:.3e} from standard", e_x2, s_x2));
    check(e_dx <= kTol && s_dx <= kTol, tag + fmt::format("input gradient differs: {:.3e} from one rank, {:.3e} from standard", e_dx, s_dx));
    worst = std::max({worst, e_x2, e_dx, s_x2, s_dx});
    for (int64_t e = 0; e < E; ++e) {
      if (mine.owns(e)) continue;
      for (int64_t i = 2 + 3 * e; i < 5 + 3 * e; ++i) {
        double mx = 0;
        for (float x : g[i].second) mx = std::max(mx, static_cast<double>(std::fabs(x)));
        check(mx == 0, tag + fmt::format("{}: written on a rank that does not own expert {}", g[i].first, e));
      }
    }
    std::vector<std::vector<float>> g_std_sum;
    for (size_t i = 0; i < g.size(); ++i) {
      comm.all_reduce_sum(g[i].second.data(), static_cast<int64_t>(g[i].second.size()), DType::DType_F32);
      std::vector<float> gs = std_g[i].second;
      comm.all_reduce_sum(gs.data(), static_cast<int64_t>(gs.size()), DType::DType_F32);
      const double err = norm_rel(g[i].second, g_ref[i].second), err_s = norm_rel(g[i].second, gs);
      worst = std::max({worst, err, err_s});
      check(err <= kTol && err_s <= kTol,
            tag + fmt::format("gradient {} differs: {:.3e} from one rank, {:.3e} from standard", g_ref[i].first, err,
                              err_s));
    }

    // The plan was exercised as intended (the same answer on every rank: the plan is global).
    int64_t guests = got.stats.guests;
    comm.all_reduce_sum(&guests, 1, DType::DType_I64);
    if (v.sched.lambda > 10) check(!got.stats.active, tag + "a lambda of 50 must fall back to standard");
    if (hot && W > 1 && v.sched.lambda < 10) {  // one rank: nothing to balance
      check(got.stats.active, tag + fmt::format("hot profile but the plan is inactive (imbalance {:.2f})", got.stats.imbalance));
      check(got.stats.load_ratio < got.stats.imbalance,
            tag + fmt::format("the plan did not lower the load ratio ({:.2f} -> {:.2f})", got.stats.imbalance,
                              got.stats.load_ratio));
      if (v.sched.min_tokens_per_gemm < 100) check(guests > 0, tag + "no rank computed a guest expert");
    }

    // pipelined_llep: the expert-side chunk buffers against the bound computed here from docs/design.md.
    if (v.sched.kind == DispatchSchedule::Kind::Kind_pipelined_llep) {
      const int64_t n_max = block_tokens(W - 1);
      const int64_t K = std::min(ceil_div(n_max, v.sched.chunk_cap), v.sched.max_chunks), c_eff = ceil_div(n_max, K);
      const uint64_t bound = 2ull * W * k * c_eff * H * 4;
      check(got.stats.chunks == K && got.stats.c_eff == c_eff,
            tag + fmt::format("K = {}, c_eff = {}; docs/design.md gives {}, {}", got.stats.chunks, got.stats.c_eff, K, c_eff));
      check(got.stats.chunk_bound_bytes == bound, tag + fmt::format("bound {} B, expected {} B", got.stats.chunk_bound_bytes, bound));
      check(got.chunk_side_peak <= bound,
            tag + fmt::format("expert-side chunk buffers peak at {} B over the bound {} B", got.chunk_side_peak, bound));
      uint64_t any = got.chunk_side_peak;  // a rank may receive nothing (hot:1:2), but not every rank
      comm.all_reduce_max(&any, 1, DType::DType_I64);
      check(any > 0, tag + "no expert-side chunk buffer on the ledger: the check saw nothing");
    }

    // Meta: the same allocations with null data.
    if (prof.kind != RoutingProfile::Kind::Kind_router) {
      auto be_meta = backend_create("meta", kUnlimitedBytes, kUnlimitedBytes);
      auto [meta, g_meta] = run(*be_meta, make, false);
      for (int c = 0; c < kNumCategories; ++c)
        check(meta.peaks[c] == got.peaks[c],
              tag + fmt::format("meta peak of {} is {} B, the cpu run's {} B", category_name(static_cast<Category>(c)),
                                meta.peaks[c], got.peaks[c]));
      // Event for event (meta counts a profile's rows in closed form, cpu sorts the rows: Note [Meta
      // routes a profile in closed form]); every chunk's buffers carry its counts.
      check(meta.events.size() == got.events.size(),
            tag + fmt::format("meta has {} ledger events, cpu {}", meta.events.size(), got.events.size()));
      for (size_t i = 0; i < std::min(meta.events.size(), got.events.size()); ++i)
        if (meta.events[i].tag != got.events[i].tag || meta.events[i].bytes != got.events[i].bytes) {
          check(false, tag + fmt::format("ledger event {}: meta {} {} B, cpu {} {} B", i, meta.events[i].tag,
                                         meta.events[i].bytes, got.events[i].tag, got.events[i].bytes));
          break;
        }
      check(meta.stats.chunk_recv_max == got.stats.chunk_recv_max &&
                meta.stats.chunk_send_ratio == got.stats.chunk_send_ratio,
            tag + "meta and cpu disagree on the chunk statistics");
    }
    if (rank == 0)
      notes += fmt::format("\n  {:<28} active {} imbalance {:.2f} -> load ratio {:.2f}, guests {}{}", v.label,
                           got.stats.active, got.stats.imbalance, got.stats.load_ratio, guests,
                           v.sched.kind == DispatchSchedule::Kind::Kind_pipelined_llep
                               ? fmt::format(", K {}, chunk buffers {} of {} B", got.stats.chunks,
                                             got.chunk_side_peak, got.stats.chunk_bound_bytes)
                               : "");
  }
  comm.all_reduce_max(&worst, 1, DType::DType_F64);
  if (rank == 0)
    std::printf("W=%d %-11s worst relative error %.2e%s\n", W, profile_str.c_str(), worst, notes.c_str());
  return failed;
}

// Meta only, a layer the small model cannot express: 64 experts, hot:0.95:16 (the skew),
// 4096 tokens per rank, chunk cap 512 (K = 8): the expert-side chunk buffers stay within the bound
// (checked on the ledger), and the plan balances the ranks.
int meta_bound_check(Comm& comm) {
  const int W = comm.size(), rank = comm.rank();
  ModelConfig cfg = config_make(64, 64);
  const int64_t n = 4096, k = cfg.num_experts_per_tok, H = cfg.hidden_size;
  const RoutingProfile prof = routing_profile_parse("hot:0.95:16");
  int failed = 0;
  for (bool strided : {true, false}) {
    DispatchSchedule d;
    d.kind = DispatchSchedule::Kind::Kind_pipelined_llep;
    d.chunk_cap = 512;
    d.strided = strided;
    auto be = backend_create("meta", kUnlimitedBytes, kUnlimitedBytes);
    ParamStore ps(cfg, *be);
    const BlockResult r = block_run(*be, comm, [d](const StepContext& s) { return dispatch_pipelined_llep_create(d, s); },
                                    cfg, prof, ps.layers[0], rank, n);
    const uint64_t bound = 2ull * W * k * 512 * H * 4;
    const bool ok = r.stats.chunks == 8 && r.chunk_side_peak > 0 && r.chunk_side_peak <= bound;
    if (!ok) {
      std::fprintf(stderr, "FAIL [rank %d, meta hot:0.95:16 %s]: K %ld, chunk buffers %lu B, bound %lu B\n", rank,
                   strided ? "strided" : "contiguous", static_cast<long>(r.stats.chunks),
                   static_cast<unsigned long>(r.chunk_side_peak), static_cast<unsigned long>(bound));
      ++failed;
    }
    uint64_t side = r.chunk_side_peak;
    comm.all_reduce_max(&side, 1, DType::DType_I64);
    if (rank == 0)
      std::printf("W=%d meta hot:0.95:16 %-10s imbalance %.2f -> load ratio %.2f, K %ld: chunk buffers %lu B of the "
                  "bound %lu B (dispatch peak %lu B)\n",
                  W, strided ? "strided" : "contiguous", r.stats.imbalance, r.stats.load_ratio,
                  static_cast<long>(r.stats.chunks), static_cast<unsigned long>(side),
                  static_cast<unsigned long>(bound),
                  static_cast<unsigned long>(r.peaks[static_cast<int>(Category::Category_dispatch)]));
  }
  return failed;
}

}  // namespace

int main(int argc, char** argv) {
  Comm& comm = comm_world();
  try {
    std::vector<std::string> profiles;
    for (int i = 1; i < argc; ++i) profiles.push_back(argv[i]);
    if (profiles.empty()) profiles = {"router", "balanced", "hot:0.95:2", "hot:1:2"};
    int64_t failed = 0;
    for (const std::string& p : profiles) failed += profile_check(comm, p);
    failed += meta_bound_check(comm);
    comm.all_reduce_sum(&failed, 1, DType::DType_I64);
    if (comm.rank() == 0) std::printf(failed == 0 ? "llep_case: all checks passed\n" : "llep_case: %ld FAILED\n", failed);
    comm.barrier();
    return failed == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error [rank %d]: %s\n", comm.rank(), e.what());
    comm.abort(1);
  }
}
