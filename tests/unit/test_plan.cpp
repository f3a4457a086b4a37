// The planner alone (no backend): settings, model files, routing counts, the closed forms of the
// plain schedules, the multi-rank and flattened predictions, the reach search and the SVG.
// Its agreement with meta runs is tests/model/test_plan_vs_meta.cpp.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "model/routing.h"
#include "plan/model_file.h"
#include "plan/plan.h"
#include "plan/plan_json.h"
#include "plan/plot_svg.h"
#include "plan/dispatch_counts.h"
#include "plan/routing_counts.h"
#include "sched/dispatch/chunk_plan.h"

namespace fp::plan {

namespace {

constexpr Category kParams = Category::Category_params;
constexpr Category kGrads = Category::Category_grads;
constexpr Category kOpt = Category::Category_optimizer;
constexpr Category kCkpt = Category::Category_checkpoints;
constexpr Category kDisp = Category::Category_dispatch;
constexpr Category kVocab = Category::Category_vocab;
constexpr Category kWs = Category::Category_workspace;

uint64_t at(const CategoryBytes& b, Category c) { return b[static_cast<int>(c)]; }

ModelConfig small_model() {
  ModelConfig m;
  m.hidden_size = 64;
  m.num_hidden_layers = 3;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 16;
  m.num_experts = 8;
  m.num_experts_per_tok = 2;
  m.moe_intermediate_size = 48;
  m.vocab_size = 1000;
  m.router_aux_loss_coef = 0.01;
  return m;
}

Input input(const ModelConfig& m, int64_t T, std::initializer_list<const char*> items = {}) {
  Input in;
  in.model = m;
  in.context = T;
  for (const char* it : items) settings_apply(in.settings, it);
  return in;
}

std::string source_path(const std::string& rel) { return std::string(FLATPEAK_SOURCE_DIR) + "/" + rel; }

}  // namespace

TEST(PlanSettings, PresetsAndKeys) {
  Settings s;
  EXPECT_EQ(s.sched.vocab, Vocab::Vocab_full);
  EXPECT_EQ(s.sched.optim, Optim::Optim_auto);
  EXPECT_EQ(s.dtypes.weights, DType::DType_BF16);
  EXPECT_EQ(s.dtypes.master, DType::DType_F32);
  settings_apply(s, "flatpeak");
  EXPECT_EQ(s.sched.dispatch, Dispatch::Dispatch_pipelined_llep);
  EXPECT_EQ(s.sched.vocab, Vocab::Vocab_ring);
  EXPECT_EQ(s.sched.ckpt, Ckpt::Ckpt_sco);
  EXPECT_EQ(s.sched.optim, Optim::Optim_offload_stream);
  settings_apply(s, "vocab=full");
  EXPECT_EQ(s.sched.vocab, Vocab::Vocab_full);
  settings_apply(s, "baseline");
  EXPECT_EQ(s.sched.dispatch, Dispatch::Dispatch_standard);
  settings_apply(s, "dtype=f32");
  EXPECT_EQ(s.dtypes.weights, DType::DType_F32);
  EXPECT_EQ(s.dtypes.activations, DType::DType_F32);
  settings_apply(s, "dtype.activations=bf16");
  EXPECT_EQ(s.dtypes.activations, DType::DType_BF16);
  EXPECT_EQ(s.dtypes.grads, DType::DType_F32);
  settings_apply(s, "routing=hot:0.9:16");
  EXPECT_EQ(s.routing.kind, RoutingProfile::Kind::Kind_hot);
  settings_apply(s, "cp=4");
  settings_apply(s, "ckpt_host_budget=1GiB");
  EXPECT_EQ(s.layout.cp, 4);
  EXPECT_EQ(s.sched.ckpt_host_budget, uint64_t{1} << 30);
  settings_apply(s, "update_on=host");
  EXPECT_TRUE(s.sched.update_on_host);
  for (const char* bad : {"vocab=rings", "nokey", "=3", "frobnicate=1", "slots=0", "slots=two", "routing=router",
                          "routing=hot:2:3", "dtype=f8", "ring_mode=sideways", "keep_strips=yes"}) {
    Settings t;
    EXPECT_THROW(settings_apply(t, bad), Error) << bad;
  }
  try {
    settings_apply(s, "vocab=rings");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("full|ring"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("dispatch="), std::string::npos);
  }
}

TEST(PlanSettings, ContextLengths) {
  EXPECT_EQ(context_parse("1M"), 1 << 20);
  EXPECT_EQ(context_parse("128K"), 1 << 17);
  EXPECT_EQ(context_parse("1000"), 1000);
  for (const char* bad : {"", "M", "1.5M", "-3", "0", "12Q"}) EXPECT_THROW(context_parse(bad), Error) << bad;
  EXPECT_EQ(context_format(1 << 20), "1M");
  EXPECT_EQ(context_format(3 << 17), "384K");
  EXPECT_EQ(context_format(1000), "1000");
}

// The closed-form counts equal the profile's own assignment, token by token.
TEST(PlanRouting, CountsEqualTheProfileAssignment) {
  for (const char* prof : {"balanced", "hot:0.9:4", "hot:0.5:3", "hot:1:2", "hot:0:5", "hot:0.37:6"})
    for (int64_t N : {1, 7, 64, 1000})
      for (auto [k, E] : {std::pair<int64_t, int64_t>{2, 8}, {1, 5}, {3, 12}, {2, 7}}) {
        const RoutingProfile p = routing_profile_parse(prof);
        if (p.kind == RoutingProfile::Kind::Kind_hot && (p.hot_experts < k || E - p.hot_experts < k)) continue;
        std::vector<int32_t> idx(static_cast<size_t>(N * k));
        routing_profile_assign(p, N, k, E, idx.data());
        std::vector<int64_t> want(static_cast<size_t>(E), 0);
        for (int32_t e : idx) ++want[e];
        EXPECT_EQ(routing_counts(p, N, k, E), want) << prof << " N " << N << " k " << k << " E " << E;
      }
}

TEST(PlanRouting, HottestRankReceives) {
  // The most rows any of the ep ranks computes under standard EP (dispatch_counts).
  auto most = [](const char* prof, int64_t N, int64_t k, int64_t E, int64_t ep) {
    int64_t best = 0;
    for (const DispatchCounts& d :
         dispatch_counts(routing_profile_parse(prof), N, k, E, ep, DispatchKind::DispatchKind_standard, {}, {}))
      best = std::max(best, d.rows);
    return best;
  };
  // balanced: every rank receives about N k; with E a multiple of ep exactly N k when E | N.
  EXPECT_EQ(most("balanced", 64, 2, 8, 4), 64 * 2);
  // hot:1:2 with k = 2: every token sends slot 0 to expert 0 and slot 1 to expert 1, both on rank 0
  // (4 experts per rank): rank 0 receives every route of every rank.
  EXPECT_EQ(most("hot:1:2", 100, 2, 16, 4), 4 * 100 * 2);
  EXPECT_THROW(routing_counts(RoutingProfile{}, 10, 2, 8), Error);
}

// dispatch_counts against a world routed token by token: every source assigns its tokens by the
// profile, sends each copy where llep_route_dest puts it (the engine's per-copy mapping, not the
// pieces dispatch_counts walks), in its token's chunk (chunk_send_counts); the receives are summed.
TEST(PlanDispatchCounts, MatchAWorldRoutedTokenByToken) {
  struct C {
    const char* profile;
    int64_t N, k, E, W, cap, kmax;
    bool strided;
    double lambda;
  };
  for (const C& c : {C{"hot:0.9:2", 300, 2, 8, 4, 32, 128, true, 1.3}, C{"hot:0.9:2", 300, 2, 8, 4, 32, 128, false, 1.3},
                     C{"hot:0.6:3", 257, 3, 12, 3, 50, 4, true, 1.0}, C{"balanced", 100, 2, 8, 2, 7, 128, false, 1.3},
                     C{"hot:1:2", 64, 2, 16, 8, 1000, 128, true, 1.3}}) {
    SCOPED_TRACE(fmt::format("{} N {} k {} E {} W {} cap {}", c.profile, c.N, c.k, c.E, c.W, c.cap));
    const RoutingProfile prof = routing_profile_parse(c.profile);
    const LlepParams lp{c.lambda, 1.0, 16};
    const std::vector<DispatchCounts> got = dispatch_counts(prof, c.N, c.k, c.E, c.W,
                                                            DispatchKind::DispatchKind_pipelined_llep, lp,
                                                            {c.cap, c.kmax, c.strided});
    // the world: W sources with the same routing
    std::vector<int32_t> topk(static_cast<size_t>(c.N * c.k));
    routing_profile_assign(prof, c.N, c.k, c.E, topk.data());
    std::vector<int64_t> counts(static_cast<size_t>(c.W * c.E), 0), load(static_cast<size_t>(c.E), 0);
    for (int64_t s = 0; s < c.W; ++s)
      for (int32_t e : topk) ++counts[s * c.E + e];
    for (int64_t s = 0; s < c.W; ++s)
      for (int64_t e = 0; e < c.E; ++e) load[e] += counts[s * c.E + e];
    const LlepPlan plan = llep_plan_build(load.data(), c.E, c.W, lp);
    const ChunkPlan cp = chunk_plan_build(c.N, c.cap, c.kmax,
                                          c.strided ? ChunkMembership::ChunkMembership_strided
                                                    : ChunkMembership::ChunkMembership_contiguous);
    std::vector<int64_t> recv(static_cast<size_t>(c.W * cp.K), 0), send;
    std::vector<int32_t> dest(topk.size());
    for (int32_t s = 0; s < c.W; ++s) {
      llep_route_dest(plan, counts.data(), s, topk.data(), c.N, c.k, dest.data());
      chunk_send_counts(cp, dest.data(), c.k, c.W, send);  // (K, W)
      for (int64_t i = 0; i < cp.K; ++i)
        for (int64_t d = 0; d < c.W; ++d) recv[d * cp.K + i] += send[i * c.W + d];
    }
    ASSERT_EQ(static_cast<int64_t>(got.size()), c.W);
    int64_t total = 0;
    for (int64_t d = 0; d < c.W; ++d) {
      const DispatchCounts& g = got[d];
      EXPECT_EQ(g.K, cp.K);
      EXPECT_EQ(g.llep_active, plan.active);
      int64_t rows = 0;
      for (int64_t i = 0; i < cp.K; ++i) {
        EXPECT_EQ(g.chunk_recv[i], recv[d * cp.K + i]) << "rank " << d << " chunk " << i;
        EXPECT_EQ(g.chunk_send[i], c.k * cp.tokens_in(i));
        rows += recv[d * cp.K + i];
      }
      EXPECT_EQ(g.rows, rows);
      EXPECT_EQ(g.rows, plan.rank_load[d]);
      EXPECT_LE(g.chunk_recv_max(), chunk_recv_bound(c.W, c.k, cp.c_eff));
      // guests: experts with an interval on d and another home; weights_out: their (expert, rank) pairs
      int64_t guests = 0;
      for (int64_t e = 0; e < c.E; ++e)
        if (plan.home(e) != d)
          for (int32_t r : plan.guests(e)) guests += r == d;
      EXPECT_EQ(g.guests, guests);
      int64_t out = 0;
      for (int64_t e = 0; e < c.E; ++e)
        if (plan.home(e) == d) out += static_cast<int64_t>(plan.guests(e).size());
      EXPECT_EQ(g.weights_out, out);
      total += g.rows;
    }
    EXPECT_EQ(total, c.W * c.N * c.k);
  }
  EXPECT_THROW(dispatch_counts(routing_profile_parse("balanced"), 10, 2, 6, 4, DispatchKind::DispatchKind_llep, {},
                               {}),
               Error);  // 4 ranks do not divide 6 experts
}

// One rank, plain schedules: the closed forms DESIGN.md and the Notes state.
TEST(PlanOneRank, ClosedFormsOfThePlainSchedules) {
  const ModelConfig m = small_model();
  const int64_t T = 512, B = 2, N = T * B, H = m.hidden_size, L = m.num_hidden_layers, V = m.vocab_size,
                E = m.num_experts, P = m.param_count();
  const Result r = plan_step(input(m, T, {"batch=2", "optim=device"}));  // bf16 weights, grads, activations
  EXPECT_EQ(r.sizes.tokens, N);
  EXPECT_EQ(at(r.peak, kParams), static_cast<uint64_t>(P) * 2);
  EXPECT_EQ(at(r.peak, kGrads), static_cast<uint64_t>(P) * 2);
  EXPECT_EQ(at(r.peak, kOpt), static_cast<uint64_t>(P) * 12);  // fp32 master + m + v
  EXPECT_EQ(at(r.peak, kCkpt), static_cast<uint64_t>(L * N * H) * 2);
  EXPECT_EQ(at(r.peak, kVocab), static_cast<uint64_t>(3 * N * V) * 4);  // fp32 logits, log-softmax, grad
  // One rank receives nothing: its own routed copies (xs, ys, dys, dxs, ids) are activations.
  EXPECT_EQ(at(r.peak, kDisp), 0u);
  EXPECT_EQ(at(r.peak, kWs), 4 + 4 * static_cast<uint64_t>(E) + 4 * static_cast<uint64_t>(N) + 4);
  EXPECT_EQ(at(r.peak, Category::Category_comm), 0u);
  for (bool v : r.validated) EXPECT_TRUE(v);
  EXPECT_TRUE(r.predicted.empty());
  // The step peak is a simultaneous maximum: at least every persistent category plus the largest
  // transient one, at most the sum of all peaks.
  uint64_t sum = 0;
  for (uint64_t b : r.peak) sum += b;
  EXPECT_LE(r.step_peak, sum);
  EXPECT_GE(r.step_peak, at(r.peak, kParams) + at(r.peak, kGrads) + at(r.peak, kOpt) + at(r.peak, kVocab));
  uint64_t at_sum = 0;
  for (uint64_t b : r.at_peak) at_sum += b;
  EXPECT_EQ(at_sum, r.step_peak);
  EXPECT_EQ(r.binding, kVocab);  // 3 x N x V fp32 dominates this small model
  EXPECT_EQ(r.peak_tag, "head.dlogits");
  // f32 weights: no separate master copy.
  EXPECT_EQ(at(plan_step(input(m, T, {"dtype=f32", "optim=device"})).peak, kOpt), static_cast<uint64_t>(P) * 8);
}

TEST(PlanOneRank, PeaksGrowWithTheContext) {
  const ModelConfig m = small_model();
  for (const char* sched : {"baseline", "flatpeak"}) {
    uint64_t prev = 0;
    for (int64_t T = 16; T <= (1 << 16); T *= 2) {
      const Result r = plan_step(input(m, T, {sched}));
      EXPECT_GE(r.step_peak, prev) << sched << " T " << T;
      prev = r.step_peak;
    }
  }
}

TEST(PlanOneRank, FlattenedSchedulesBoundTheirCategories) {
  const ModelConfig m = small_model();
  const int64_t T = 1 << 15, H = m.hidden_size;
  const Result base = plan_step(input(m, T, {"baseline", "optim=device"}));
  const Result flat = plan_step(input(m, T, {"vocab=ring", "ckpt=sco", "optim=offload_stream"}));
  // SCO: the last boundary stays and one more is in flight or restored: 2 x N x H.
  EXPECT_EQ(at(flat.peak, kCkpt), static_cast<uint64_t>(2 * T * H) * 2);
  EXPECT_EQ(flat.sizes.boundaries_offloaded, m.num_hidden_layers - 1);
  // Ring-DTP on one rank: one (n_blk, V) strip plus 16 B of online state per token.
  EXPECT_EQ(at(flat.peak, kVocab), static_cast<uint64_t>(1024 * m.vocab_size) * 4 + 16 * static_cast<uint64_t>(T));
  // OffloadStream: S x B_max x 16 on the device; the state (12 B per parameter) on the host.
  EXPECT_EQ(at(flat.peak, kOpt), 2 * static_cast<uint64_t>(flat.sizes.bucket_largest) * 16);
  EXPECT_EQ(at(flat.host_peak, kOpt), static_cast<uint64_t>(m.param_count()) * 12 +
                                          0 /* update on the device: no host slots */);
  EXPECT_EQ(at(flat.host_peak, kCkpt), static_cast<uint64_t>((m.num_hidden_layers - 1) * T * H) * 2);
  EXPECT_LT(flat.step_peak, base.step_peak);
  EXPECT_TRUE(flat.predicted.empty());  // all three are validated on one rank
}

TEST(PlanOneRank, AutoOptimizerOffloadsWhenTheDeviceOneDoesNotFit) {
  const ModelConfig m = small_model();
  Input in = input(m, 64);
  const Result dev = plan_step(input(m, 64, {"optim=device"}));
  const Result off = plan_step(input(m, 64, {"optim=offload_serial"}));
  ASSERT_LT(off.step_peak, dev.step_peak);
  in.device_mem = dev.step_peak;
  EXPECT_EQ(plan_step(in).sched.optim, Optim::Optim_device);
  in.device_mem = dev.step_peak - 1;
  const Result r = plan_step(in);
  EXPECT_EQ(r.sched.optim, Optim::Optim_offload_serial);
  EXPECT_TRUE(r.fits());
  EXPECT_EQ(r.host_needed, static_cast<uint64_t>(m.param_count()) * (12 + 2));  // state + bf16 gradient copy
}

TEST(PlanMultiRank, ShardsAndPredictions) {
  const ModelConfig m = small_model();
  const int64_t W = 4, T = 4096;
  const Result r = plan_step(input(m, T, {"optim=device"}), nullptr, nullptr);
  Input in = input(m, T, {"optim=device"});
  in.settings.layout.ranks = W;
  const Result mr = plan_step(in);
  EXPECT_EQ(mr.sizes.tokens, T / W);
  EXPECT_EQ(mr.sizes.ep, 4);
  EXPECT_EQ(mr.sizes.params_per_rank, (m.param_count() + W - 1) / W);
  // params: the shard plus the largest gathered unit (here the LM head, V x H + H, in the head).
  EXPECT_EQ(at(mr.peak, kParams),
            static_cast<uint64_t>(mr.sizes.params_per_rank) * 2 + static_cast<uint64_t>(m.vocab_size * 64 + 64) * 2);
  EXPECT_LT(mr.step_peak, r.step_peak);
  // The engine's layout (cp = ep = fsdp = W) is validated against meta in every category
  // (tests/model/test_plan_vs_meta.cpp), Ring-DTP over the W shards too.
  for (bool v : mr.validated) EXPECT_TRUE(v);
  EXPECT_TRUE(mr.predicted.empty());
  Input ring = in;
  settings_apply(ring.settings, "vocab=ring");
  EXPECT_TRUE(plan_step(ring).predicted.empty());
  settings_apply(ring.settings, "vocab_strips=2");  // the engine keeps one strip
  ASSERT_EQ(plan_step(ring).predicted.size(), 1u);
  EXPECT_FALSE(plan_step(ring).validated[static_cast<int>(kVocab)]);
  // Another layout is a prediction, and says which categories it touches.
  Input other = in;
  settings_apply(other.settings, "ep=2");
  const Result half_ep = plan_step(other);
  ASSERT_FALSE(half_ep.predicted.empty());
  EXPECT_NE(half_ep.predicted[0].find("layout cp = 4, ep = 2, fsdp = 4"), std::string::npos);
  for (Category c : {kParams, kGrads, kOpt, kDisp, Category::Category_activations})
    EXPECT_FALSE(half_ep.validated[static_cast<int>(c)]) << category_name(c);
  for (Category c : {kCkpt, kWs}) EXPECT_TRUE(half_ep.validated[static_cast<int>(c)]) << category_name(c);
  // experts spread over 2 ranks, sharded over the 2 that share them: the same parameters per rank
  EXPECT_EQ(half_ep.sizes.params_per_rank, mr.sizes.params_per_rank);
  EXPECT_GT(at(mr.peak, Category::Category_comm), 0u);  // ring attention's K/V blocks
  // a hot profile sends more routes to the hottest rank than the balanced one
  settings_apply(in.settings, "routing=hot:0.9:2");
  const Result hot = plan_step(in);
  EXPECT_GT(hot.sizes.routes_received, mr.sizes.routes_received);
  EXPECT_GT(at(hot.peak, kDisp), at(mr.peak, kDisp));
  // PipelinedLLEP bounds what a rank holds of the dispatch at once, whatever the skew: the two (m) id
  // vectors, a chunk's sends (<= k c_eff rows) and two of its received buffers (r_i <= W k c_eff).
  const Result standard_hot = hot;
  settings_apply(in.settings, "dispatch=pipelined_llep");
  settings_apply(in.settings, "chunk_tokens=128");
  const Result llep = plan_step(in);
  const uint64_t k = 2, c = 128, H = 64, ids = 2 * static_cast<uint64_t>(T / W) * k * 4;
  EXPECT_EQ(llep.sizes.chunk_tokens, 128);
  EXPECT_EQ(llep.sizes.chunks, T / W / 128);
  EXPECT_TRUE(llep.sizes.llep_active);  // hot:0.9:2 puts 90% of the load on rank 0's experts
  EXPECT_LE(llep.sizes.chunk_recv_max, static_cast<int64_t>(W * k * c));
  EXPECT_LE(at(llep.peak, kDisp), ids + (k * c + 2 * W * k * c) * H * 2);
  EXPECT_LT(at(llep.peak, kDisp), at(standard_hot.peak, kDisp) / 4);
  // balanced routing, contiguous chunks: every rank receives what it sends, a quarter of the bound per
  // chunk. Strided chunks alias with the balanced profile when K = E (8 here): chunk i holds the
  // tokens t = i mod 8, which all go to experts i and i + 1, so one rank receives the whole bound.
  settings_apply(in.settings, "routing=balanced");
  EXPECT_EQ(plan_step(in).sizes.chunk_recv_max, static_cast<int64_t>(W * k * c));
  settings_apply(in.settings, "membership=contiguous");
  const Result bal = plan_step(in);
  EXPECT_FALSE(bal.sizes.llep_active);
  EXPECT_EQ(bal.sizes.chunk_recv_max, static_cast<int64_t>(k * c));
  EXPECT_EQ(at(bal.peak, kDisp), ids + 3 * k * c * H * 2);  // recv_x, dy and send_dy of one chunk
  // Errors: ep must divide E and W, cp must divide W.
  Input bad = input(m, T, {"ep=3"});
  bad.settings.layout.ranks = 6;
  EXPECT_THROW(plan_step(bad), Error);
  bad = input(m, T, {"cp=3"});
  bad.settings.layout.ranks = 4;
  EXPECT_THROW(plan_step(bad), Error);
}

TEST(PlanReach, LargestContextThatFits) {
  const ModelConfig m = small_model();
  for (const char* sched : {"baseline", "flatpeak"}) {
    Input in = input(m, 1, {sched});
    in.device_mem = 256ull << 20;
    const Reach r = plan_reach(in);
    ASSERT_GT(r.max_context, 0) << sched;
    EXPECT_FALSE(r.capped);
    in.context = r.max_context;
    EXPECT_TRUE(plan_step(in).fits()) << sched;
    in.context = r.max_context + 1;
    EXPECT_FALSE(plan_step(in).fits()) << sched;
    in.context = r.max_pow2;
    EXPECT_TRUE(plan_step(in).fits());
    EXPECT_GT(2 * r.max_pow2, r.max_context);
  }
  Input in = input(m, 1, {"baseline"});
  in.device_mem = 1000;  // not even the parameters
  EXPECT_EQ(plan_reach(in).max_context, 0);
  in.device_mem = kUnlimitedBytes;
  EXPECT_TRUE(plan_reach(in, 1 << 14).capped);
  // flatpeak reaches further than the baseline
  Input b = input(m, 1, {"baseline"}), f = input(m, 1, {"flatpeak"});
  b.device_mem = f.device_mem = 64ull << 20;
  EXPECT_GT(plan_reach(f).max_context, 2 * plan_reach(b).max_context);
}

TEST(PlanModelFile, HuggingFaceConfigs) {
  const Model q = model_from_hf_json(
      R"({"hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
          "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
          "intermediate_size": 6144, "vocab_size": 151936, "model_type": "qwen3_moe"})",
      "qwen3-30b.json");
  EXPECT_EQ(q.cfg.moe_intermediate_size, 768);  // the expert width, not the dense one
  EXPECT_EQ(q.cfg.head_dim, 128);
  EXPECT_NEAR(static_cast<double>(q.cfg.param_count()) / 1e9, 30.5, 0.5);
  EXPECT_TRUE(q.notes.empty());
  const Model mx = model_from_hf_json(
      R"({"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
          "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 14336, "vocab_size": 32000,
          "model_type": "mixtral", "sliding_window": null})",
      "mixtral.json");
  EXPECT_EQ(mx.cfg.head_dim, 128);  // hidden / heads
  EXPECT_EQ(mx.cfg.moe_intermediate_size, 14336);
  EXPECT_NEAR(static_cast<double>(mx.cfg.param_count()) / 1e9, 46.7, 0.2);
  try {
    model_from_hf_json(R"({"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 10,
                           "num_experts_per_tok": 1, "intermediate_size": 4})",
                       "x.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_local_experts"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model_from_hf_json("{not json", "y.json"), Error);
}

TEST(PlanModelFile, PresetsLoad) {
  struct Want {
    const char* file;
    double params_b;  // published total, billions
    double tol;       // relative
  };
  // Paper: about 120 / 241 / 667 B. gpt-oss-120b 116.8 B, Qwen3-235B 235 B, Mixtral-8x22B 141 B; DeepSeek-V3
  // 671 B, planned with its 3 dense layers as MoE layers and MLA as GQA (said in its notes): +4%.
  for (const Want& w : {Want{"configs/models/paper-7l.toml", 120, 0.03}, Want{"configs/models/paper-14l.toml", 241, 0.02},
                        Want{"configs/models/paper-39l.toml", 667, 0.02}, Want{"configs/models/gpt-oss-120b.json", 116.8, 0.02},
                        Want{"configs/models/qwen3-235b-a22b.json", 235, 0.02},
                        Want{"configs/models/mixtral-8x22b.json", 141, 0.02},
                        Want{"configs/models/deepseek-v3.json", 671, 0.06}}) {
    const Model m = model_load(source_path(w.file));
    const double p = static_cast<double>(m.cfg.param_count()) / 1e9;
    EXPECT_NEAR(p / w.params_b, 1.0, w.tol) << w.file << ": " << p << " B";
  }
  EXPECT_EQ(model_load(source_path("configs/models/paper-39l.toml")).default_ranks, 64);
  const Model ds = model_load(source_path("configs/models/deepseek-v3.json"));
  // MLA: k + v of 576 numbers per token and layer, like its compressed cache.
  EXPECT_EQ(2 * ds.cfg.num_key_value_heads * ds.cfg.head_dim, 512 + 64);
  EXPECT_EQ(ds.cfg.num_experts, 256);
  ASSERT_FALSE(ds.notes.empty());
  EXPECT_NE(ds.notes[0].find("MLA approximated by GQA"), std::string::npos);
  // a run config's [model] table works too
  EXPECT_EQ(model_load(source_path("configs/tiny.toml")).cfg.hidden_size, 64);
  EXPECT_THROW(model_from_toml("[model]\nhidden_size = 8\n", "partial.toml"), Error);
}

TEST(PlanReport, JsonAndTable) {
  Model m;
  m.name = "small";
  m.cfg = small_model();
  Input in = input(m.cfg, 4096, {"flatpeak"});
  in.settings.layout.ranks = 2;
  const Result r = plan_step(in);
  const nlohmann::ordered_json j = plan_json(m, in, r);
  // flatpeak on 2 ranks: PipelinedLLEP and Ring-DTP over the 2 shards are validated
  EXPECT_EQ(j["peaks"]["dispatch"]["status"], "exact (validated against meta)");
  EXPECT_EQ(j["peaks"]["vocab"]["status"], "exact (validated against meta)");
  EXPECT_EQ(j["step_peak"].get<uint64_t>(), r.step_peak);
  EXPECT_EQ(j["layout"]["tokens_per_rank"], 2048);
  EXPECT_TRUE(j["device_mem"].is_null());
  EXPECT_TRUE(j["predicted"].empty());
  // several live strips are a proposal: predicted, and said so in the JSON and the table
  settings_apply(in.settings, "vocab_strips=2");
  const Result strips = plan_step(in);
  EXPECT_EQ(plan_json(m, in, strips)["peaks"]["vocab"]["status"], "predicted, not yet validated against meta");
  EXPECT_FALSE(plan_json(m, in, strips)["predicted"].empty());
  const Result one = plan_step(input(m.cfg, 512, {"optim=device"}));
  EXPECT_EQ(plan_json(m, input(m.cfg, 512, {"optim=device"}), one)["peaks"]["params"]["status"],
            "exact (validated against meta)");
  const std::string t = plan_table(m, in, strips);
  EXPECT_NE(t.find("step peak"), std::string::npos);
  EXPECT_NE(t.find("predicted"), std::string::npos);
}

TEST(PlanPlot, SvgHasBothPanelsAndEveryCategory) {
  Input in = input(small_model(), 1);
  in.device_mem = 1ull << 30;
  const std::vector<PlotPanel> panels = peaks_plot_panels(in, 10, 16);
  ASSERT_EQ(panels.size(), 2u);
  EXPECT_EQ(panels[0].contexts.size(), 7u);
  const std::string svg = peaks_plot_svg("small <model> & co", panels, in.device_mem);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("small &lt;model&gt; &amp; co"), std::string::npos);
  EXPECT_EQ(svg.find("<model>"), std::string::npos);
  for (Category c : kAllCategories) EXPECT_NE(svg.find(">" + std::string(category_name(c)) + "<"), std::string::npos);
  EXPECT_NE(svg.find("stroke-dasharray"), std::string::npos);  // the device-memory line
  // every open tag closes (a cheap well-formedness check)
  EXPECT_EQ(std::count(svg.begin(), svg.end(), '<'), std::count(svg.begin(), svg.end(), '>'));
  EXPECT_GE(static_cast<int>(std::count(svg.begin(), svg.end(), '\n')), 40);
}

}  // namespace fp::plan
