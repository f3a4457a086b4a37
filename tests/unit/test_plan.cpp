// The planner: settings, model files, the engine's peaks (a plan is the engine on meta) against the
// closed forms docs/design.md and the Notes state, multi-rank shards and bounds, the reach search and the
// SVG. Its agreement with a real multi-process run is tests/dist/plan_case.cpp (mpirun).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "../common/deepseek_config.h"
#include "backend/backend.h"
#include "core/error.h"
#include "core/units.h"
#include "model/hf_config.h"
#include "model/params.h"
#include "model/routing.h"
#include "plan/model_file.h"
#include "plan/plan.h"
#include "plan/plan_json.h"
#include "plan/plot_svg.h"
#include "plan/ring_balance.h"
#include "sched/dispatch/chunk_plan.h"

namespace fp::plan {

namespace {

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
  EXPECT_EQ(s.sched.vocab.kind, VocabSchedule::Kind::Kind_full);
  EXPECT_EQ(s.sched.optim.kind, OptimSchedule::Kind::Kind_auto);
  EXPECT_EQ(s.precision.params, DType::DType_BF16);
  EXPECT_EQ(s.precision.master, DType::DType_F32);
  settings_apply(s, "flatpeak");
  EXPECT_EQ(s.sched.dispatch.kind, DispatchSchedule::Kind::Kind_pipelined_llep);
  EXPECT_EQ(s.sched.vocab.kind, VocabSchedule::Kind::Kind_ring);
  EXPECT_EQ(s.sched.ckpt.kind, CkptSchedule::Kind::Kind_sco);
  EXPECT_EQ(s.sched.optim.kind, OptimSchedule::Kind::Kind_offload_stream);
  settings_apply(s, "vocab=full");
  EXPECT_EQ(s.sched.vocab.kind, VocabSchedule::Kind::Kind_full);
  settings_apply(s, "baseline");
  EXPECT_EQ(s.sched.dispatch.kind, DispatchSchedule::Kind::Kind_standard);
  settings_apply(s, "dtype=f32");
  EXPECT_EQ(s.precision.params, DType::DType_F32);
  EXPECT_EQ(s.precision.activations, DType::DType_F32);
  settings_apply(s, "dtype.activations=bf16");
  EXPECT_EQ(s.precision.activations, DType::DType_BF16);
  EXPECT_EQ(s.precision.grads, DType::DType_F32);
  settings_apply(s, "precision.recipe=bf16");
  EXPECT_EQ(s.precision.grads, DType::DType_BF16);
  EXPECT_EQ(s.precision.moments, DType::DType_F32);
  settings_apply(s, "precision.logits=bf16");
  EXPECT_EQ(s.precision.logits, DType::DType_BF16);
  settings_apply(s, "routing=hot:0.9:16");
  EXPECT_EQ(s.routing.kind, RoutingProfile::Kind::Kind_hot);
  settings_apply(s, "ckpt_host_budget=1GiB");
  EXPECT_EQ(s.sched.ckpt.host_budget, uint64_t{1} << 30);
  settings_apply(s, "update_on=host");
  EXPECT_TRUE(s.sched.optim.update_on_host);
  for (const char* bad : {"vocab=rings", "nokey", "=3", "frobnicate=1", "slots=0", "slots=two", "routing=router",
                          "routing=hot:2:3", "dtype=f8", "ring_mode=sideways", "keep_strips=yes", "cp=4", "ep=2",
                          "vocab_strips=2", "precision.recipe=fp8", "precision.params=int3"}) {
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

// --schedule takes the run config's names (model/schedules.h); the older short names are aliases of
// the same fields.
TEST(PlanSettings, RunConfigNames) {
  Settings a, b;
  for (const char* it : {"moe.dispatch=llep", "vocab.schedule=ring", "ckpt.schedule=sco", "optim.schedule=device",
                         "pipelined.chunk_cap=77", "ckpt.host_budget=2GiB", "optim.update_on=host",
                         "moe.token_chunk=128", "llep.lambda=2.5", "precision.params=f32"})
    settings_apply(a, it);
  for (const char* it :
       {"dispatch=llep", "vocab=ring", "ckpt=sco", "optim=device", "chunk_tokens=77", "ckpt_host_budget=2GiB",
        "update_on=host", "token_chunk=128", "lambda=2.5", "dtype.weights=f32"})
    settings_apply(b, it);
  for (const Settings* s : {&a, &b}) {
    EXPECT_EQ(s->sched.dispatch.kind, DispatchSchedule::Kind::Kind_llep);
    EXPECT_EQ(s->sched.vocab.kind, VocabSchedule::Kind::Kind_ring);
    EXPECT_EQ(s->sched.ckpt.kind, CkptSchedule::Kind::Kind_sco);
    EXPECT_EQ(s->sched.optim.kind, OptimSchedule::Kind::Kind_device);
    EXPECT_EQ(s->sched.dispatch.chunk_cap, 77);
    EXPECT_EQ(s->sched.ckpt.host_budget, uint64_t{2} << 30);
    EXPECT_TRUE(s->sched.optim.update_on_host);
    EXPECT_EQ(s->sched.dispatch.token_chunk, 128);
    EXPECT_EQ(s->sched.dispatch.lambda, 2.5);
    EXPECT_EQ(s->precision.params, DType::DType_F32);
  }
  // The one validation's messages, with the planner's list of keys as the hint.
  for (const char* bad : {"pipelined.chunk_cap=0", "optim.slots=0", "moe.token_chunk=-1", "llep.alpha=0"}) {
    Settings t;
    try {
      settings_apply(t, bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("must be"), std::string::npos) << e.what();
      EXPECT_NE(e.hint().find("pipelined.chunk_cap="), std::string::npos) << e.hint();
    }
  }
  // ckpt.recompute under both spellings (Note [No recompute] in step/step.h).
  for (const char* it : {"ckpt.recompute=false", "recompute=false"}) {
    Settings t;
    settings_apply(t, it);
    EXPECT_FALSE(t.sched.ckpt.recompute) << it;
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
// One rank, plain schedules: the closed forms docs/design.md and the Notes state.
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
  EXPECT_EQ(at(r.peak, kDispatch), 0u);
  // The gradient norm's sums of squares, one float per parameter tensor (embed, norm, lm_head, and per
  // layer 9 dense tensors and 3 per expert), the aux-loss bias, the rmsnorm partials, the loss sum and the
  // router probability sums (L, E) f64 held to the step's end (Note [One read at the step's end]).
  const uint64_t tensors = 3 + static_cast<uint64_t>(L * (9 + 3 * E));
  EXPECT_EQ(at(r.peak, kWs), 4 * tensors + 4 * static_cast<uint64_t>(E) + 4 * static_cast<uint64_t>(N) + 4 +
                                 8 * static_cast<uint64_t>(L * E));
  EXPECT_EQ(at(r.peak, Category::Category_comm), 0u);
  EXPECT_TRUE(r.exact());
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
  // OffloadStream: S x B_max x 16 on the device (here every parameter fits one bucket of 2^20); the
  // state (12 B per parameter) on the host.
  ASSERT_LT(m.param_count(), 1 << 20);
  EXPECT_EQ(at(flat.peak, kOpt), 2 * static_cast<uint64_t>(m.param_count()) * 16);
  EXPECT_EQ(at(flat.host_peak, kOpt),
            static_cast<uint64_t>(m.param_count()) * 12 + 0 /* update on the device: no host slots */);
  EXPECT_EQ(at(flat.host_peak, kCkpt), static_cast<uint64_t>((m.num_hidden_layers - 1) * T * H) * 2);
  EXPECT_LT(flat.step_peak, base.step_peak);
  EXPECT_TRUE(flat.exact());
}

// params_per_rank counts elements, each tensor in its own dtype: bf16 DeepSeek-V3 keeps its routing
// biases f32 (Note [Parameters kept in f32] in model/params.h), 4 B among 2 B ones, which the params
// bytes over 2 would count twice. One rank stores every element; each of two stores every dense
// tensor's ceil(R / 2) rows and E / 2 experts whole (Note [FSDP layout]).
TEST(PlanOneRank, ParamsPerRankCountsElementsWhateverTheirDtype) {
  const ModelConfig m = deepseek_small_config(3, 12, 1);
  const int64_t P = m.param_count(), biases = 2 * m.num_experts;  // layers 1 and 2 route
  const Result r = plan_step(input(m, 64, {"optim=device"}));
  ASSERT_EQ(r.precision.params, DType::DType_BF16);
  EXPECT_EQ(r.sizes.params_per_rank, P);
  EXPECT_EQ(at(r.peak, kParams), static_cast<uint64_t>(2 * (P - biases) + 4 * biases));
  Input in = input(m, 64, {"optim=device"});
  in.settings.layout.ranks = 2;
  auto be = backend_create("meta", kUnlimitedBytes, kUnlimitedBytes);
  ParamStore whole(m, *be);  // one rank: the full tensors, by name
  int64_t local = 0;
  for (const Param& p : whole.all()) {
    const int64_t R = p.shape[0], row = p.shape.numel() / R;
    local += p.name.find(".mlp.experts.") != std::string::npos ? p.shape.numel() / 2 : (R + 1) / 2 * row;
  }
  EXPECT_EQ(plan_step(in).sizes.params_per_rank, local);
}

TEST(PlanOneRank, AutoOptimizerOffloadsWhenTheDeviceOneDoesNotFit) {
  const ModelConfig m = small_model();
  Input in = input(m, 64);
  const Result dev = plan_step(input(m, 64, {"optim=device"}));
  const Result off = plan_step(input(m, 64, {"optim=offload_serial"}));
  ASSERT_LT(off.step_peak, dev.step_peak);
  in.device_mem = dev.step_peak;
  EXPECT_EQ(plan_step(in).sched.optim.kind, OptimSchedule::Kind::Kind_device);
  in.device_mem = dev.step_peak - 1;
  const Result r = plan_step(in);
  EXPECT_EQ(r.sched.optim.kind, OptimSchedule::Kind::Kind_offload_serial);
  EXPECT_TRUE(r.fits());
  EXPECT_EQ(r.host_needed, static_cast<uint64_t>(m.param_count()) * (12 + 2));  // state + bf16 gradient copy
}

// Note [A step that cannot fit is not run] (plan.cpp): auto's first try, the optimizer on the device, is not run
// where what it holds before the step is over the device already; the plan is the serial offload's, the same in
// every figure as that schedule planned by name, on one rank and on 4 (the rank with the largest peak, or the
// rank given).
TEST(PlanMultiRank, AutoOptimizerSkipsAStepThatCannotFit) {
  const ModelConfig m = small_model();
  for (int64_t W : {1, 4})
    for (int64_t rank : {int64_t{-1}, W - 1}) {
      Input in = input(m, 4096), off_in = input(m, 4096, {"optim=offload_serial"}),
            dev_in = input(m, 4096, {"optim=device"});
      for (Input* x : {&in, &off_in, &dev_in}) {
        x->settings.layout.ranks = W;
        x->settings.layout.rank = rank;
      }
      const Result dev = plan_step(dev_in);
      const Result off = plan_step(off_in);
      ASSERT_GT(at(dev.peak, kOpt), 0u);
      // The device's optimizer state alone does not fit (skipped), then the whole step with it (run), then nothing.
      for (uint64_t mem : {dev.peak[static_cast<int>(kOpt)], dev.step_peak - 1, uint64_t{1}}) {
        const std::string what = fmt::format("W {} rank {} device {}", W, rank, mem);
        in.device_mem = off_in.device_mem = mem;
        const Result a = plan_step(in), b = plan_step(off_in);
        EXPECT_EQ(a.sched.optim.kind, OptimSchedule::Kind::Kind_offload_serial) << what;
        EXPECT_EQ(a.peak, b.peak) << what;
        EXPECT_EQ(a.at_peak, b.at_peak) << what;
        EXPECT_EQ(a.step_peak, b.step_peak) << what;
        EXPECT_EQ(a.peak_tag, b.peak_tag) << what;
        EXPECT_EQ(a.host_peak, b.host_peak) << what;
        EXPECT_EQ(a.host_needed, b.host_needed) << what;
        EXPECT_EQ(a.binding, b.binding) << what;
        EXPECT_EQ(a.sizes.rank, b.sizes.rank) << what;
        EXPECT_EQ(a.fits(), b.fits()) << what;
        EXPECT_EQ(a.fits_device, b.fits_device) << what;
      }
      in.device_mem = dev.step_peak;  // the device's fits: its plan, run
      EXPECT_EQ(plan_step(in).sched.optim.kind, OptimSchedule::Kind::Kind_device);
      EXPECT_EQ(plan_step(in).step_peak, dev.step_peak);
    }
}

TEST(PlanMultiRank, ShardsAndBounds) {
  const ModelConfig m = small_model();
  const int64_t W = 4, T = 4096;
  const Result r = plan_step(input(m, T, {"optim=device"}));
  Input in = input(m, T, {"optim=device"});
  in.settings.layout.ranks = W;
  const Result mr = plan_step(in);
  EXPECT_EQ(mr.sizes.tokens, T / W);
  // Every dense tensor's ceil(R / W) rows, and E / W experts whole (Note [FSDP layout]).
  const int64_t H = m.hidden_size, I = m.moe_intermediate_size, V = m.vocab_size, hd = m.head_dim;
  const int64_t Q = m.num_attention_heads * hd, Kv = m.num_key_value_heads * hd;
  auto rows = [&](int64_t R, int64_t C) { return (R + W - 1) / W * C; };
  int64_t local = 2 * rows(V, H) + rows(H, 1);
  for (int64_t l = 0; l < m.num_hidden_layers; ++l)
    local += 2 * rows(H, 1) + rows(Q, H) + 2 * rows(Kv, H) + rows(H, Q) + 2 * rows(hd, 1) + rows(m.num_experts, H) +
             m.num_experts / W * 3 * I * H;
  EXPECT_EQ(mr.sizes.params_per_rank, local);
  // params: the shard plus the largest gathered unit (here the LM head, V x H (padded) + H, in the head).
  EXPECT_EQ(at(mr.peak, kParams),
            static_cast<uint64_t>(local) * 2 + static_cast<uint64_t>(W * rows(V, H) + W * rows(H, 1)) * 2);
  EXPECT_LT(mr.step_peak, r.step_peak);
  EXPECT_TRUE(mr.exact());
  EXPECT_GT(at(mr.peak, Category::Category_comm), 0u);  // ring attention's K/V blocks
  // a hot profile sends more routes to the hottest rank than the balanced one
  settings_apply(in.settings, "routing=hot:0.9:2");
  const Result hot = plan_step(in);
  EXPECT_GT(at(hot.peak, kDispatch), at(mr.peak, kDispatch));
  EXPECT_EQ(hot.sizes.rank, 0);  // experts 0 and 1 live on rank 0
  // PipelinedLLEP bounds what a rank holds of the dispatch at once, whatever the skew: the two (m) id
  // vectors, a chunk's sends (<= k c_eff rows) and two of its received buffers (r_i <= W k c_eff).
  const Result standard_hot = hot;
  settings_apply(in.settings, "dispatch=pipelined_llep");
  settings_apply(in.settings, "chunk_tokens=128");
  const Result llep = plan_step(in);
  const uint64_t k = 2, c = 128, ids = 2 * static_cast<uint64_t>(T / W) * k * 4;
  EXPECT_EQ(llep.sizes.chunk_tokens, 128);
  EXPECT_EQ(llep.sizes.chunks, T / W / 128);
  EXPECT_LE(at(llep.peak, kDispatch), ids + (k * c + 2 * W * k * c) * H * 2);
  EXPECT_LT(at(llep.peak, kDispatch), at(standard_hot.peak, kDispatch) / 4);
  // balanced routing, contiguous chunks: every rank receives what it sends, a quarter of the bound per
  // chunk: recv_x, dy and send_dy of one chunk.
  settings_apply(in.settings, "routing=balanced");
  settings_apply(in.settings, "membership=contiguous");
  EXPECT_EQ(at(plan_step(in).peak, kDispatch), ids + 3 * k * c * H * 2);
  // The rank to describe can be named; the engine refuses what it cannot run.
  Input named = in;
  named.settings.layout.rank = 3;
  EXPECT_EQ(plan_step(named).sizes.rank, 3);
  Input bad = input(m, T, {});
  bad.settings.layout.ranks = 3;  // 8 experts over 3 ranks
  EXPECT_THROW(plan_step(bad), Error);
  bad.settings.layout.ranks = 4;
  bad.context = 4100;  // not a multiple of 2W
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
  EXPECT_TRUE(q.approximate.empty());
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
  // Paper: about 120 / 241 / 667 B (its models also in Kimi-K2's shape, -mla). gpt-oss-20b and -120b: transformers'
  // count (GptOssForCausalLM from the published config.json on the meta device, the MXFP4 quantization_config
  // dropped; sum of numel) is 20,914,757,184 and 116,829,156,672, within 0.1% for the config.json and the run-config
  // preset alike (the engine's count is exact). Qwen3-235B 235 B, Mixtral-8x22B 141 B; DeepSeek-V3 671 B (without
  // its multi-token prediction module), now the engine's own layer (MLA, shared experts, dense first layers): within
  // 0.5%. Kimi-K2: the Hub counts 1.03T parameters in its files (the model card rounds to 1T).
  for (const Want& w :
       {Want{"configs/models/paper-7l.toml", 120, 0.03}, Want{"configs/models/paper-14l.toml", 241, 0.02},
        Want{"configs/models/paper-39l.toml", 667, 0.02}, Want{"configs/models/paper-7l-mla.toml", 120, 0.03},
        Want{"configs/models/paper-14l-mla.toml", 241, 0.02}, Want{"configs/models/paper-39l-mla.toml", 667, 0.02},
        Want{"configs/models/gpt-oss-20b.json", 20.914757184, 0.001},
        Want{"configs/models/gpt-oss-20b.toml", 20.914757184, 0.001},
        Want{"configs/models/gpt-oss-120b.json", 116.829156672, 0.001},
        Want{"configs/models/gpt-oss-120b.toml", 116.829156672, 0.001},
        Want{"configs/models/qwen3-235b-a22b.json", 235, 0.02}, Want{"configs/models/mixtral-8x22b.json", 141, 0.02},
        Want{"configs/models/deepseek-v3.json", 671, 0.005}, Want{"configs/models/kimi-k2.json", 1030, 0.005}}) {
    const Model m = model_load(source_path(w.file));
    const double p = static_cast<double>(m.cfg.param_count()) / 1e9;
    EXPECT_NEAR(p / w.params_b, 1.0, w.tol) << w.file << ": " << p << " B";
  }
  EXPECT_EQ(model_load(source_path("configs/models/paper-39l.toml")).default_ranks, 64);
  for (const char* f :
       {"configs/models/deepseek-v3.json", "configs/models/kimi-k2.json", "configs/models/paper-7l-mla.toml"}) {
    const Model ds = model_load(source_path(f));
    EXPECT_TRUE(ds.cfg.is_deepseek()) << f;
    EXPECT_TRUE(ds.approximate.empty()) << f << ": " << (ds.approximate.empty() ? "" : ds.approximate[0]);
    EXPECT_EQ(ds.cfg.qk_head_dim(), 192) << f;
    EXPECT_EQ(ds.cfg.value_head_dim(), 128) << f;
  }
  EXPECT_EQ(model_load(source_path("configs/models/deepseek-v3.json")).cfg.sparse_layer_count(), 58);
  // gpt-oss: the published config.json is read strictly (the engine's own gpt_oss layer, nothing approximated),
  // and the run-config preset beside it is the same model.
  for (const char* n : {"gpt-oss-20b", "gpt-oss-120b"}) {
    const Model j = model_load(source_path(std::string("configs/models/") + n + ".json"));
    const Model t = model_load(source_path(std::string("configs/models/") + n + ".toml"));
    EXPECT_TRUE(j.cfg.is_gpt_oss()) << n;
    EXPECT_TRUE(j.approximate.empty()) << n << ": " << (j.approximate.empty() ? "" : j.approximate[0]);
    EXPECT_TRUE(t.approximate.empty()) << n;
    const std::vector<std::string> d = model_config_differences(j.cfg, t.cfg);
    EXPECT_TRUE(d.empty()) << n << ": " << (d.empty() ? "" : d[0]);
    EXPECT_EQ(j.cfg.layer_types, t.cfg.layer_types) << n;
    EXPECT_EQ(j.cfg.param_count(), t.cfg.param_count()) << n;
    EXPECT_EQ(t.default_ranks, 8) << n;
    ASSERT_EQ(j.cfg.layer_types.size(), static_cast<size_t>(j.cfg.num_hidden_layers)) << n;
    EXPECT_EQ(j.cfg.layer_window(0), 128) << n;  // sliding first, then full
    EXPECT_EQ(j.cfg.layer_window(1), 0) << n;
  }
  EXPECT_EQ(model_load(source_path("configs/models/gpt-oss-20b.json")).cfg.param_count(), 20914757184);
  EXPECT_EQ(model_load(source_path("configs/models/gpt-oss-120b.json")).cfg.param_count(), 116829156672);
  // a run config's [model] table works too
  EXPECT_EQ(model_load(source_path("configs/tiny.toml")).cfg.hidden_size, 64);
  EXPECT_THROW(model_from_toml("[model]\nhidden_size = 8\n", "partial.toml"), Error);
}

namespace {

// Note [Repeats replayed once] (memory/ledger.h): a plan that counts the repeats of its alike blocks (ring hops,
// ring chunks, MLA's chunks of keys, tiles) is the plan of the full replay on every rank, every counter of both
// ledgers the same, the count of events included; in layouts that take each path on W = 4 ranks: the ring
// (cp = 4: 2048 keys per rank in 8 ring chunks of 256, MLA's chunks of 200 in them, tiles of 10 x 200 + 48), cp = 1
// with pieces of sequences (2 sequences in tiles of 6 x 300 + 124) and with groups of sequences (5 sequences of
// 256 in tiles of 2, 2 and 1).
void expect_repeats_as_full_replay(const ModelConfig& m, const std::string& name) {
  struct Case {
    const char* name;
    int64_t T, batch, cp, tile;
  };
  const Case cases[] = {{"ring", 8192, 1, 4, 200}, {"cp1", 1924, 2, 1, 300}, {"groups", 256, 5, 1, 512}};
  for (const Case& c : cases) {
    const std::string what = name + " " + c.name;
    Input in = input(m, c.T, {"flatpeak"});
    settings_apply(in.settings, "ckpt.layer_tile=" + std::to_string(c.tile));
    settings_apply(in.settings, "batch=" + std::to_string(c.batch));
    in.settings.layout.ranks = 4;
    in.settings.layout.cp = c.cp;
    std::vector<RankPlan> fast, full;
    PlanOptions fo, so;
    fo.ranks = &fast;
    so.ranks = &full;
    so.full_replay = true;
    const Result a = plan_step(in, fo), b = plan_step(in, so);
    EXPECT_EQ(a.peak, b.peak) << what;
    EXPECT_EQ(a.at_peak, b.at_peak) << what;
    EXPECT_EQ(a.step_peak, b.step_peak) << what;
    EXPECT_EQ(a.binding, b.binding) << what;
    EXPECT_EQ(a.peak_tag, b.peak_tag) << what;
    EXPECT_EQ(a.host_peak, b.host_peak) << what;
    EXPECT_EQ(a.host_needed, b.host_needed) << what;
    EXPECT_EQ(a.sizes.rank, b.sizes.rank) << what;
    ASSERT_EQ(fast.size(), full.size()) << what;
    uint64_t repeated = 0;
    for (size_t r = 0; r < fast.size(); ++r) {
      const RankPlan &x = fast[r], &y = full[r];
      EXPECT_EQ(x.peak, y.peak) << what << " rank " << r;
      EXPECT_EQ(x.at_peak, y.at_peak) << what << " rank " << r;
      EXPECT_EQ(x.host_peak, y.host_peak) << what << " rank " << r;
      EXPECT_EQ(x.step_peak, y.step_peak) << what << " rank " << r;
      EXPECT_EQ(x.host_needed, y.host_needed) << what << " rank " << r;
      EXPECT_EQ(x.peak_tag, y.peak_tag) << what << " rank " << r;
      EXPECT_EQ(x.boundaries_offloaded, y.boundaries_offloaded) << what << " rank " << r;
      EXPECT_EQ(x.events_seen, y.events_seen) << what << " rank " << r;
      EXPECT_EQ(x.host_events_seen, y.host_events_seen) << what << " rank " << r;
      EXPECT_EQ(y.events_repeated, 0u) << what << " rank " << r;
      repeated += x.events_repeated;
    }
    EXPECT_GT(repeated, 0u) << what;  // every layout here repeats some block: the fast path ran
  }
}

}  // namespace

namespace {

// Every preset of configs/models (by file name), cut to its first layers: the dense ones it starts with and two
// more (gpt-oss: a sliding and a full one).
std::vector<std::pair<std::string, ModelConfig>> preset_first_layers() {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(source_path("configs/models"))) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::vector<std::pair<std::string, ModelConfig>> out;
  for (const std::filesystem::path& f : files) {
    ModelConfig m = model_load(f.string()).cfg;
    const int64_t L = std::min(m.num_hidden_layers, std::max<int64_t>(m.first_k_dense_replace, 0) + 2);
    m.num_hidden_layers = L;
    if (!m.layer_types.empty()) m.layer_types.resize(static_cast<size_t>(L));
    std::erase_if(m.mlp_only_layers, [&](int64_t l) { return l >= L; });
    out.emplace_back(f.filename().string(), std::move(m));
  }
  return out;
}

}  // namespace

TEST(PlanRepeats, SmallModelsAsTheFullReplay) {
  expect_repeats_as_full_replay(small_model(), "small");
  expect_repeats_as_full_replay(deepseek_small_config(3, 0, 1), "deepseek small");
}

// Every preset, its first layers (preset_first_layers).
TEST(PlanRepeats, EveryPresetAsTheFullReplay) {
  const std::vector<std::pair<std::string, ModelConfig>> presets = preset_first_layers();
  ASSERT_GE(presets.size(), 10u);
  for (const auto& [name, m] : presets) expect_repeats_as_full_replay(m, name);
}

namespace {

// Note [One routing per token count] (model/moe_block.cpp): a step that keeps each token count's routing and
// pipelined_llep layouts gives, on every rank, the ledger timelines of one that routes afresh at every change of
// the count, event for event (device and host: every allocation and free, its category, bytes, tag, shape, dtype
// and the total after it), and the same plan. Layouts on W = 4 ranks whose tiles end in a shorter one: the ring
// (cp = 4: 2048 keys per rank in tiles of 10 x 200 + 48) with token chunks of 64 (slots of 64, 64, 64, 8; the
// last tile's 48), cp = 1 with pieces of sequences (2 sequences of 1924 in tiles of 6 x 300 + 124) under a hot
// profile (LLEP's plan moves experts), and groups of sequences (5 of 256 in tiles of 2, 2 and 1). Counters with repeats
// counted are compared too, against the full replay that routes afresh (the engine before either shortcut).
void expect_kept_routing_as_rerouted(const ModelConfig& m, const std::string& name) {
  struct Case {
    const char* name;
    int64_t T, batch, cp, tile, token_chunk;
    bool hot;
  };
  const Case cases[] = {{"ring", 8192, 1, 4, 200, 64, false},
                        {"cp1 hot", 1924, 2, 1, 300, 0, true},
                        {"groups", 256, 5, 1, 512, 0, false}};
  // 90% of the routes to 2k experts (the profile needs at least k hot ones).
  const std::string hot = "routing=hot:0.9:" + std::to_string(std::min(m.num_experts, 2 * m.num_experts_per_tok));
  const auto same_events = [](const std::vector<LedgerEvent>& x, const std::vector<LedgerEvent>& y,
                              const std::string& what) {
    ASSERT_EQ(x.size(), y.size()) << what;
    for (size_t i = 0; i < x.size(); ++i) {
      const LedgerEvent &a = x[i], &b = y[i];
      const bool same = a.seq == b.seq && a.alloc == b.alloc && a.category == b.category && a.bytes == b.bytes &&
                        a.total_after == b.total_after && a.tag == b.tag && a.shape == b.shape && a.dtype == b.dtype;
      ASSERT_TRUE(same) << what << " event " << i << ": " << a.tag << " " << a.bytes << " vs " << b.tag << " "
                        << b.bytes;
    }
  };
  for (const Case& c : cases) {
    const std::string what = name + " " + c.name;
    Input in = input(m, c.T, {"flatpeak"});
    settings_apply(in.settings, "ckpt.layer_tile=" + std::to_string(c.tile));
    if (c.token_chunk > 0) settings_apply(in.settings, "moe.token_chunk=" + std::to_string(c.token_chunk));
    settings_apply(in.settings, "batch=" + std::to_string(c.batch));
    settings_apply(in.settings, c.hot ? hot : std::string("routing=balanced"));
    in.settings.layout.ranks = 4;
    in.settings.layout.cp = c.cp;
    std::vector<RankPlan> kept, fresh;
    PlanOptions ko, fo;
    ko.events = fo.events = true;
    ko.ranks = &kept;
    fo.ranks = &fresh;
    fo.reroute_each_n = true;
    const Result a = plan_step(in, ko), b = plan_step(in, fo);
    EXPECT_EQ(a.peak, b.peak) << what;
    EXPECT_EQ(a.at_peak, b.at_peak) << what;
    EXPECT_EQ(a.peak_tag, b.peak_tag) << what;
    EXPECT_EQ(a.host_needed, b.host_needed) << what;
    ASSERT_EQ(kept.size(), fresh.size()) << what;
    for (size_t r = 0; r < kept.size(); ++r) {
      EXPECT_GT(kept[r].events.size(), 0u) << what;
      EXPECT_EQ(kept[r].events_seen, kept[r].events.size()) << what;  // the whole timeline was kept
      same_events(kept[r].events, fresh[r].events, what + " rank " + std::to_string(r) + " device");
      same_events(kept[r].host_events, fresh[r].host_events, what + " rank " + std::to_string(r) + " host");
    }
    // Repeats counted and routings kept (the planner's default) against neither.
    std::vector<RankPlan> fast, full;
    PlanOptions qo, so;
    qo.ranks = &fast;
    so.ranks = &full;
    so.full_replay = true;
    so.reroute_each_n = true;
    const Result q = plan_step(in, qo), z = plan_step(in, so);
    EXPECT_EQ(q.peak, z.peak) << what;
    EXPECT_EQ(q.at_peak, z.at_peak) << what;
    EXPECT_EQ(q.step_peak, z.step_peak) << what;
    EXPECT_EQ(q.peak_tag, z.peak_tag) << what;
    EXPECT_EQ(q.host_peak, z.host_peak) << what;
    EXPECT_EQ(q.host_needed, z.host_needed) << what;
    ASSERT_EQ(fast.size(), full.size()) << what;
    for (size_t r = 0; r < fast.size(); ++r) {
      EXPECT_EQ(fast[r].events_seen, full[r].events_seen) << what << " rank " << r;
      EXPECT_EQ(fast[r].host_events_seen, full[r].host_events_seen) << what << " rank " << r;
      EXPECT_EQ(fast[r].events_seen, kept[r].events_seen) << what << " rank " << r;
      EXPECT_EQ(fast[r].peak, full[r].peak) << what << " rank " << r;
      EXPECT_EQ(fast[r].at_peak, full[r].at_peak) << what << " rank " << r;
    }
  }
}

}  // namespace

TEST(PlanReuse, SmallModelsAsRerouted) {
  expect_kept_routing_as_rerouted(small_model(), "small");
  expect_kept_routing_as_rerouted(deepseek_small_config(3, 0, 1), "deepseek small");
}

// Every preset, its first layers (as PlanRepeats.EveryPresetAsTheFullReplay).
TEST(PlanReuse, EveryPresetAsRerouted) {
  const std::vector<std::pair<std::string, ModelConfig>> presets = preset_first_layers();
  ASSERT_GE(presets.size(), 10u);
  for (const auto& [name, m] : presets) expect_kept_routing_as_rerouted(m, name);
}

TEST(PlanReport, JsonAndTable) {
  Model m;
  m.name = "small";
  m.cfg = small_model();
  Input in = input(m.cfg, 4096, {"flatpeak"});
  in.settings.layout.ranks = 2;
  const Result r = plan_step(in);
  const nlohmann::ordered_json j = plan_json(m, in, r);
  EXPECT_EQ(j["peaks"]["dispatch"]["status"], "exact (the engine ran it on meta)");
  EXPECT_EQ(j["step_peak"].get<uint64_t>(), r.step_peak);
  EXPECT_EQ(j["layout"]["tokens_per_rank"], 2048);
  EXPECT_EQ(j["precision"]["params"], "bf16");
  EXPECT_TRUE(j["device_mem"].is_null());
  EXPECT_TRUE(j["exact"].get<bool>());
  // A model the engine only approximates makes every figure approximate, and says why.
  m.approximate = {"MLA approximated by GQA"};
  in.approximate = m.approximate;
  const Result approx = plan_step(in);
  EXPECT_FALSE(approx.exact());
  const nlohmann::ordered_json ja = plan_json(m, in, approx);
  EXPECT_EQ(ja["peaks"]["vocab"]["status"], "approximate: the model is approximated (see approximate)");
  EXPECT_FALSE(ja["exact"].get<bool>());
  const std::string t = plan_table(m, in, approx);
  EXPECT_NE(t.find("step peak"), std::string::npos);
  EXPECT_NE(t.find("APPROXIMATE: MLA approximated by GQA"), std::string::npos);
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

namespace fp {

// A rank that fails ends every rank of the thread world (the others throw from their next meeting,
// nobody hangs) and run() reports that rank's own error, not the others' "world broken".
TEST(ThreadWorld, FirstRealErrorIsReported) {
  ThreadWorld world(4);
  try {
    world.run([](Comm& comm) {
      if (comm.rank() == 2) throw Error("rank 2 failed on its own", "");
      for (int i = 0; i < 3; ++i) comm.barrier();
    });
    ADD_FAILURE() << "run() returned";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rank 2 failed on its own");
  }
}

// Note [Balanced rings]: on windows of long-tailed documents zig-zag leaves a rank with far more of the
// ring's attention tiles than the mean; the balanced split brings every window's most loaded rank within
// 1.10 of the mean, computing the same tile pairs in all. The mix parses with its units and refuses by name.
TEST(RingBalance, BalancedSplitEvensEachWindow) {
  const plan::DocMix mix = plan::doc_mix_parse("mean=2K,tail=1.0,seed=3");
  EXPECT_EQ(mix.mean, 2048);
  const plan::RingBalance r = plan::ring_balance(mix, 16384, 8, 4);
  EXPECT_GT(r.zigzag.mean_max_over_mean(), 1.2);
  EXPECT_LE(r.balanced.worst_max_over_mean(), 1.10);
  int64_t zz = 0, bal = 0;
  for (size_t w = 0; w < 4; ++w)
    for (int rank = 0; rank < 8; ++rank) zz += r.zigzag.tile_pairs[w][rank], bal += r.balanced.tile_pairs[w][rank];
  EXPECT_EQ(zz, bal);
  EXPECT_THROW(plan::doc_mix_parse("mean=16K,tial=1"), Error);
  EXPECT_THROW(plan::doc_mix_parse("mean=0"), Error);
}

}  // namespace fp
