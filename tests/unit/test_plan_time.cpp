// Time in the planner: meta's counts of work against independent formulas (Note [Meta counts the work] in
// backend/work_log.h), the critical path of hand-built stream/event graphs (Note [The step's critical path]),
// the messages' bytes, a plan's predicted time and plan --choose (Note [Choosing the fastest plan that fits]).
#include <gtest/gtest.h>

#include <cmath>

#include "backend/backend.h"
#include "backend/device_profile.h"
#include "backend/work_log.h"
#include "comm/thread_comm.h"
#include "plan/choose.h"
#include "plan/plan.h"

namespace fp {

namespace {

const KernelCount& count_of(const WorkLog& w, ops::KernelId id) { return w.kernels()[static_cast<size_t>(id)]; }

// A device with round numbers: 1 GB/s of memory and host link, no latency or launch, 1 TFLOP/s flat.
DeviceProfile round_profile(int shared_cores) {
  DeviceProfile p;
  p.name = "round";
  p.gemm_f32 = p.gemm_bf16 = 1e12;
  p.mem_bytes_per_s = 1e9;
  p.host_link = {1e9, 0};
  p.intra_node = {1e9, 0};
  p.inter_node = {1e8, 0};
  p.ranks_per_node = 2;
  p.shared_cores = shared_cores;
  return p;
}

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

plan::Input small_input(int64_t T, std::initializer_list<const char*> items = {}) {
  plan::Input in;
  in.model = small_model();
  in.context = T;
  for (const char* it : items) plan::settings_apply(in.settings, it);
  return in;
}

}  // namespace

TEST(MetaWork, GemmCountsTwoMNKAndItsOperands) {
  auto be = backend_create("meta", kUnlimitedBytes, kUnlimitedBytes);
  be->work_reset(nullptr, 1);
  Buf C(nullptr, DType::DType_BF16);
  be->kernels().gemm(false, true, 7, 11, 13, 1.0f, CBuf(nullptr, DType::DType_BF16), 13,
                     CBuf(nullptr, DType::DType_F32), 13, 1.0f, C, 11);
  const KernelCount& k = count_of(*be->work(), ops::KernelId::KernelId_gemm);
  EXPECT_EQ(k.calls, 1u);
  EXPECT_EQ(k.flops, 2.0 * 7 * 11 * 13);
  EXPECT_EQ(k.bytes, 7.0 * 13 * 2 + 13.0 * 11 * 4 + 2 * 7.0 * 11 * 2);  // C read and written (beta 1)
  // Grouped: the rows of the non-empty groups, each group's weight once.
  const int64_t offsets[] = {0, 5, 5, 12};
  const CBuf B[] = {CBuf(nullptr, DType::DType_F32), CBuf(nullptr, DType::DType_F32), CBuf(nullptr, DType::DType_F32)};
  be->kernels().gemm_grouped(true, 3, offsets, 8, 4, 1.0f, CBuf(nullptr, DType::DType_F32), B, nullptr, 0.0f,
                             Buf(nullptr, DType::DType_F32));
  const KernelCount& g = count_of(*be->work(), ops::KernelId::KernelId_gemm_grouped);
  EXPECT_EQ(g.flops, 2.0 * 12 * 8 * 4);
  EXPECT_EQ(g.bytes, (12.0 * 4 + 2 * 8.0 * 4 + 12.0 * 8) * 4);
}

// A step's GEMM FLOPs are 6 per matmul parameter a token touches (2 forward, 4 backward), counted here from the
// model's dimensions alone, independently of the engine; recompute adds one forward of every layer.
TEST(MetaWork, StepGemmFlopsAreSixPerParameterPerToken) {
  const ModelConfig m = small_model();
  const double H = 64, hd = 16, nh = 4, nkv = 2, E = 8, k = 2, I = 48, V = 1000, L = 3, T = 256;
  const double layer = H * hd * (nh + 2 * nkv) + nh * hd * H + H * E + 3 * H * I * k;  // per token
  const double head = H * V;
  for (const bool recompute : {false, true}) {
    plan::Input in = small_input(256, {recompute ? "ckpt.recompute=true" : "ckpt.recompute=false"});
    const plan::Result r = plan::plan_step(in);
    const double expect = 6 * T * (L * layer + head) + (recompute ? 2 * T * L * layer : 0);
    EXPECT_NEAR(r.time.gemm_flops, expect, 1e-9 * expect) << "recompute " << recompute;
    // Causal attention: forward 2 (hd + hdv) per visible pair, backward 2 (3 hd + 2 hdv), T (T + 1) / 2 pairs.
    const double pairs = nh * T * (T + 1) / 2, fwd = 2 * pairs * 2 * hd, bwd = 2 * pairs * 5 * hd;
    const double attn = L * ((recompute ? 2 : 1) * fwd + bwd);
    EXPECT_NEAR(r.time.attention_flops, attn, 1e-9 * attn);
    // The classic estimate (6 N P + attention) bounds the count from below, recompute and elementwise work above.
    EXPECT_GE(r.time.flops, 0.99 * r.time.model_flops);
    EXPECT_LE(r.time.flops, 1.6 * r.time.model_flops);
    (void)m;
  }
}

// Note [The step's critical path] on a hand-built graph: a copy beside a kernel, joined by an event.
TEST(MetaWork, CriticalPathOfStreamsAndEvents) {
  const DeviceProfile p = round_profile(0);
  auto be = backend_create("meta", kUnlimitedBytes, kUnlimitedBytes);
  be->work_reset(&p, 1);
  Stream& compute = be->compute_stream();
  be->copy_async(be->h2d_stream(), nullptr, nullptr, 3'000'000'000);      // h2d: 0 .. 3 s
  be->kernels().fill(Buf(nullptr, DType::DType_F32), 0.0f, 500'000'000);  // compute: 0 .. 2 s (2 GB written)
  Event e;
  be->h2d_stream().record(e);
  compute.wait(e);                                                        // compute waits until 3 s
  be->kernels().fill(Buf(nullptr, DType::DType_F32), 0.0f, 250'000'000);  // 3 .. 4 s
  EXPECT_DOUBLE_EQ(be->work()->step_seconds(), 4.0);                      // not the sum, 6 s
  EXPECT_DOUBLE_EQ(be->work()->busy()[static_cast<int>(TimeClass::TimeClass_compute)], 3.0);
  EXPECT_DOUBLE_EQ(be->work()->busy()[static_cast<int>(TimeClass::TimeClass_host_link)], 3.0);
  // Without the wait the two overlap: 3 s.
  be->work_reset(&p, 1);
  be->copy_async(be->h2d_stream(), nullptr, nullptr, 3'000'000'000);
  be->kernels().fill(Buf(nullptr, DType::DType_F32), 0.0f, 750'000'000);
  EXPECT_DOUBLE_EQ(be->work()->step_seconds(), 3.0);
  // A cpu runs its compute stream on the host: a copy issued after a kernel starts after it (2 + 3 s).
  const DeviceProfile cpu = round_profile(4);
  be->work_reset(&cpu, 1);
  be->kernels().fill(Buf(nullptr, DType::DType_F32), 0.0f, 500'000'000);
  be->copy_async(be->h2d_stream(), nullptr, nullptr, 3'000'000'000);
  EXPECT_DOUBLE_EQ(be->work()->step_seconds(), 5.0);
}

// The launch overhead: the host issues kernels one after another and runs ahead of a device's stream.
TEST(MetaWork, LaunchOverheadHidesUnderLongKernels) {
  Timeline t;
  for (int i = 0; i < 10; ++i) t.run(Lane::Lane_compute, 1.0, 0.1);  // long kernels: the launches hide
  EXPECT_DOUBLE_EQ(t.end(), 10.1);
  Timeline s;
  for (int i = 0; i < 10; ++i) s.run(Lane::Lane_compute, 0.01, 0.1);  // short ones: launch bound
  EXPECT_NEAR(s.end(), 1.01, 1e-12);
}

// The data channel's messages: bytes this rank sends per collective (backend/meta/meta_comm.cpp), the link
// from the group's size, and a ring transfer overlapping the stream until its wait.
TEST(MetaWork, MessagesOfTwoRanks) {
  const DeviceProfile p = round_profile(0);
  ThreadWorld world(2);
  world.run([&](Comm& comm) {
    auto be = backend_create("meta", kUnlimitedBytes, kUnlimitedBytes);
    be->work_reset(&p, 2);
    std::unique_ptr<DataComm> dc = be->data_channel(comm);
    Stream& s = be->compute_stream();
    dc->all_gather(s, nullptr, nullptr, 1000, DType::DType_F32);  // sends its 4000 B to the other
    dc->all_reduce_sum(s, nullptr, 1000, DType::DType_BF16);      // 2 (g-1)/g x 2000 B
    const int64_t counts[2] = {10, 20};
    dc->all_to_all_v(s, nullptr, counts, nullptr, counts, DType::DType_F32);  // to the other rank only
    const WorkLog& w = *be->work();
    double sent = 0;
    for (const MessageCount& m : w.messages()) {
      EXPECT_EQ(m.group, 2);
      EXPECT_EQ(m.link, Link::Link_intra_node);
      sent += m.bytes;
    }
    const double a2a = 4.0 * (comm.rank() == 0 ? 20 : 10);
    EXPECT_DOUBLE_EQ(sent, 4000 + 2000 + a2a);
    EXPECT_DOUBLE_EQ(w.links()[static_cast<int>(Link::Link_intra_node)].bytes, sent);
    EXPECT_DOUBLE_EQ(w.step_seconds(), sent / 1e9);
    // A ring hop of 1 GB in flight under a 0.5 s kernel: the wait ends at 1 s past the hop's start.
    be->work_reset(&p, 2);
    CommRequest r = dc->send_recv_start(s, nullptr, 250'000'000, 1 - comm.rank(), nullptr, 250'000'000, 1 - comm.rank(),
                                        DType::DType_F32);
    be->kernels().fill(Buf(nullptr, DType::DType_F32), 0.0f, 125'000'000);
    EXPECT_DOUBLE_EQ(be->work()->timeline().at(Lane::Lane_compute), 0.5);
    dc->wait(r);
    EXPECT_DOUBLE_EQ(be->work()->timeline().at(Lane::Lane_compute), 1.0);
  });
}

TEST(PlanTime, PredictedFiguresOnAPublishedProfile) {
  plan::Input in = small_input(1024);
  in.profile = std::make_shared<const DeviceProfile>(device_profile_load("h100-sxm"));
  const plan::Result r = plan::plan_step(in);
  EXPECT_TRUE(r.time.predicted);
  EXPECT_EQ(r.time.profile, "h100-sxm");
  EXPECT_GT(r.time.seconds, 0);
  EXPECT_NEAR(r.time.tokens_per_s, 1024 / r.time.seconds, 1e-6 * r.time.tokens_per_s);
  EXPECT_GT(r.time.mfu, 0);
  EXPECT_LT(r.time.mfu, 1);
  // A tiny model on a GPU is bound by launches.
  EXPECT_EQ(r.time.binding, TimeClass::TimeClass_launch);
  // The step is at least the busiest resource and at most their sum.
  double sum = 0, top = 0;
  for (double b : r.time.busy) sum += b, top = std::max(top, b);
  EXPECT_GE(r.time.seconds, top * (1 - 1e-9));
  EXPECT_LE(r.time.seconds, sum * (1 + 1e-9));
  // Without a profile the counts stay, the time is not predicted.
  in.profile = nullptr;
  const plan::Result c = plan::plan_step(in);
  EXPECT_FALSE(c.time.predicted);
  EXPECT_EQ(c.time.flops, r.time.flops);
}

TEST(PlanTime, ProfilesRoundTripThroughTheirFile) {
  const DeviceProfile h = *device_profile_builtin("h200-sxm");
  const DeviceProfile back = device_profile_parse(device_profile_json(h), "test");
  EXPECT_EQ(back.name, "h200-sxm");
  EXPECT_EQ(back.mem_bytes_per_s, 4.8e12);
  EXPECT_EQ(back.gemm_curve, h.gemm_curve);
  EXPECT_DOUBLE_EQ(device_profile_gemm_fraction(h, 256, 256, 256), 0.5);
  EXPECT_THROW(device_profile_load("/nonexistent/profile.json"), Error);
}

// Note [Choosing the fastest plan that fits]: the choice fits, and no plan tried that fits is faster.
TEST(PlanTime, ChooseTakesTheFastestPlanThatFits) {
  plan::Input in = small_input(2048, {"optim.schedule=device"});  // not auto: that would fall back to the host
  in.settings.layout.ranks = 2;
  in.profile = std::make_shared<const DeviceProfile>(device_profile_load("h100-sxm"));
  const plan::Result asked = plan::plan_step(in);
  in.device_mem = asked.step_peak - 1;  // the plan asked for does not fit
  const plan::Choice c = plan::plan_choose(in);
  ASSERT_GE(c.best, 0);
  const plan::Result& best = c.tried[static_cast<size_t>(c.best)].result;
  EXPECT_TRUE(best.fits());
  EXPECT_FALSE(c.tried.front().result.fits());
  for (const plan::Candidate& x : c.tried) {
    if (x.result.fits()) {
      EXPECT_GE(x.result.time.seconds, best.time.seconds) << x.describe;
    }
  }
  if (c.runner_up >= 0) {
    EXPECT_TRUE(c.tried[static_cast<size_t>(c.runner_up)].result.fits());
  }
}

}  // namespace fp
