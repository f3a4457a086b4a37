// model_type "deepseek_v3" in the engine: the meta backend allocates exactly as cpu (the planner's promise),
// the aux-loss-free bias update follows the step's loads by the sign rule (and the offloaded optimizer's
// master follows it), and a step is bitwise repeatable. In the bf16 recipe (Note [bf16 on a computing
// backend] in model/model.cpp): the routing bias stays f32 (Note [Parameters kept in f32] in
// model/params.h) and moves exactly as in fp32, a bf16 step on one and two ranks tracks the fp32 step,
// and meta allocates as cpu through the optimizer step. Logits and gradients against the PyTorch twin:
// tests/reference (model_vs_twin_mla, model_vs_twin_mla_yarn, and their _bf16 variants).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "../common/deepseek_config.h"
#include "../common/gathered_grads.h"
#include "../common/optim_schedule.h"
#include "backend/backend.h"
#include "bench/bench_common.h"
#include "comm/thread_comm.h"
#include "core/precision.h"
#include "core/units.h"
#include "data/context_split.h"
#include "data/random_batch.h"
#include "sched/optim/offload.h"
#include "sched/optim/optimizer.h"
#include "step/step.h"

namespace fp {

namespace {
ModelConfig deepseek_config() { return deepseek_small_config(3, 12, 1); }

// t (f32 or bf16) widened to f32 on the host.
std::vector<float> host_of(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  bench::device_read_f32(be, t.cbuf(), t.numel(), v.data());
  return v;
}

Precision recipe(const char* name) { return precision_recipe(name); }
}  // namespace

TEST(DeepseekV3, MetaAllocatesAsCpu) {
  const ModelConfig m = deepseek_config();
  for (const char* prof : {"balanced", "hot:0.5:2"}) {
    std::vector<LedgerEvent> ev[2];
    int i = 0;
    for (const char* device : {"cpu", "meta"}) {
      auto be = backend_create(device, kUnlimitedBytes, kUnlimitedBytes);
      Model model(m, *be, routing_profile_parse(prof));
      model.init_weights(m.seed);
      StepOutputs out = step_forward_backward(model, batch_random(2, 37, m.vocab_size, 3));
      if (std::string(device) == "cpu") {
        EXPECT_TRUE(std::isfinite(out.loss));
      }
      ev[i++] = be->device_ledger().events();
    }
    ASSERT_GT(ev[0].size(), 100u);
    ASSERT_EQ(ev[0].size(), ev[1].size()) << prof;
    for (size_t j = 0; j < ev[0].size(); ++j) {
      ASSERT_EQ(ev[0][j].tag, ev[1][j].tag) << prof << " event " << j;
      ASSERT_EQ(ev[0][j].bytes, ev[1][j].bytes) << prof << " event " << j << " " << ev[0][j].tag;
      ASSERT_EQ(ev[0][j].total_after, ev[1][j].total_after) << prof << " event " << j;
    }
  }
}

// b_e += rate * sign(mean load - load_e) per MoE layer, from the step's own counts; the dense layer has
// no bias; a second, identical step moves it again; an optimizer step leaves it where the update put it
// (its gradient is zero), and the optimizer's master (the offloaded optimizer's host master, AdamW's
// in bf16) follows the written weights. In both recipes: in bf16 the bias is the f32 parameter among
// bf16 ones (Note [Parameters kept in f32]), with an f32 master and moments like every parameter, staged
// in f32 by every offloaded optimizer (Note [Offload with bf16 weights] in sched/optim/offload.h).
TEST(DeepseekV3, RoutingBiasFollowsTheLoads) {
  const ModelConfig m = deepseek_config();
  for (const char* rec : {"fp32", "bf16"}) {
    for (const char* sched : {"device", "offload_serial", "offload_stream", "offload_stream:host"}) {
      SCOPED_TRACE(std::string(rec) + " " + sched);
      auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
      Model model(m, *be, RoutingProfile{}, Schedules{}, recipe(rec));
      model.init_weights(m.seed);
      OptimConfig oc;
      const std::string sn = sched;
      oc.sched = sn == "offload_stream:host" ? optim_named("offload_stream", "host") : optim_named(sn);
      oc.sched.bucket_params = 500;  // several buckets, the biases sharing them with bf16 parameters
      std::unique_ptr<Optimizer> optim = optimizer_create(oc, model.params(), *be);
      const Batch batch = batch_random(2, 40, m.vocab_size, 9);
      // Exact in float (the expected values below are exact) but not in bf16: a bias rounded through a bf16
      // buffer anywhere (an optimizer's staging) loses the 2^-20.
      const double rate = 0.125 + 0x1p-20;
      std::vector<std::vector<float>> before(m.num_hidden_layers);
      for (int step = 1; step <= 2; ++step) {
        model.zero_grads();
        StepOutputs out = step_forward_backward(model, batch);
        for (int64_t l = 1; l < m.num_hidden_layers; ++l)
          before[l] = host_of(*be, model.params().layers[l].gate_bias->w);
        optim->step(step, 2);
        for (int64_t l = 1; l < m.num_hidden_layers; ++l)  // zero gradient: AdamW leaves the bias
          EXPECT_EQ(host_of(*be, model.params().layers[l].gate_bias->w), before[l]) << "layer " << l;
        const std::vector<Param*> written = model.routing_bias_update(out.expert_counts, rate);
        optim->weights_written(written);
        ASSERT_EQ(written.size(), 2u);  // layers 1 and 2 (layer 0 is dense)
        // A master the optimizer keeps (and checkpoints) is the written bias itself.
        for (const auto& [name, t] : optim->state_tensors()) {
          for (const Param* b : written) {
            if (name == b->name + ".master") {
              EXPECT_EQ(host_of(*be, *t), host_of(*be, b->w)) << name;
            }
          }
        }
        EXPECT_EQ(model.params().layers[0].gate_bias, nullptr);
        int moved = 0;
        for (int64_t l = 1; l < m.num_hidden_layers; ++l) {
          const std::vector<float> after = host_of(*be, model.params().layers[l].gate_bias->w);
          double mean = 0;
          for (int64_t e = 0; e < m.num_experts; ++e)
            mean += static_cast<double>(out.expert_counts[l * m.num_experts + e]);
          mean /= static_cast<double>(m.num_experts);
          for (int64_t e = 0; e < m.num_experts; ++e) {
            const double c = static_cast<double>(out.expert_counts[l * m.num_experts + e]);
            const double want = before[l][e] + (c < mean ? rate : c > mean ? -rate : 0.0);
            EXPECT_EQ(after[e], static_cast<float>(want)) << "layer " << l << " expert " << e << " load " << c;
            moved += after[e] != before[l][e];
          }
        }
        EXPECT_GT(moved, 0);
      }
      // The next optimizer step starts from the written bias: it is still there after it.
      model.zero_grads();
      step_forward_backward(model, batch);
      const std::vector<float> b1 = host_of(*be, model.params().layers[1].gate_bias->w);
      optim->step(3, 3);
      EXPECT_EQ(host_of(*be, model.params().layers[1].gate_bias->w), b1);
      EXPECT_EQ(model.params().layers[1].gate_bias->w.dtype(), DType::DType_F32);
      EXPECT_EQ(model.params().layers[1].gate_bias->g.dtype(), DType::DType_F32);
    }
  }
}

// Note [Offload with bf16 weights] (sched/optim/offload.h): offload_stream updating on the host stages
// each bucket segment in its parameter's own dtype, so the f32 routing bias among bf16 parameters moves
// 4 B each way. Over four bf16 training steps, each followed by the routing bias update and
// weights_written, in buckets that put the biases beside bf16 parameters (500 and 37 elements) or hold
// everything, it equals the device AdamW bit for bit: the losses, every parameter as stored (the f32
// biases included), m, v and the f32 master. (Staged in the bf16 slots of before, the bias's master
// was taken from half its bytes: {5.9e-39, -0.125, ...} for a bias {-0.125001, ...}; the model refused
// the schedule.)
TEST(DeepseekV3, Bf16OffloadStreamOnHostEqualsDeviceAdamW) {
  const ModelConfig m = deepseek_config();
  struct Run {
    std::vector<double> losses;
    std::vector<std::string> names;
    std::vector<DType> dtypes;
    std::vector<std::vector<uint8_t>> bytes;
  };
  auto train = [&](const OptimSchedule& os) {
    auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
    Schedules s;
    s.optim = os;
    Model model(m, *be, RoutingProfile{}, s, recipe("bf16"));
    model.init_weights(m.seed);
    OptimConfig oc;
    oc.sched = os;
    oc.lr = 1e-2;
    oc.weight_decay = 0.1;
    std::unique_ptr<Optimizer> optim = optimizer_create(oc, model.params(), *be);
    Run run;
    const int steps = 4;
    for (int step = 1; step <= steps; ++step) {
      model.zero_grads();
      const StepOutputs out = step_forward_backward(model, batch_random(2, 40, m.vocab_size, 20 + step));
      run.losses.push_back(out.loss);
      optim->step(step, steps);
      optim->weights_written(model.routing_bias_update(out.expert_counts, 1e-3));
    }
    be->synchronize();
    auto add = [&](const std::string& name, const Tensor& t) {
      run.names.push_back(name);
      run.dtypes.push_back(t.dtype());
      run.bytes.emplace_back(t.bytes());
      be->copy_to_host(run.bytes.back().data(), t.data(), t.bytes());
    };
    for (const Param& p : model.params().all()) add(p.name, p.local_w());
    for (const auto& [name, t] : optim->state_tensors()) add(name, *t);
    return run;
  };
  const Run want = train(optim_named("device"));
  int f32_params = 0, masters = 0, moved = 0;
  for (size_t t = 0; t < want.names.size(); ++t) {
    const bool bias = want.names[t].ends_with(".e_score_correction_bias");
    f32_params += bias && want.dtypes[t] == DType::DType_F32;
    masters += want.names[t].ends_with(".e_score_correction_bias.master");
    moved += bias && std::any_of(want.bytes[t].begin(), want.bytes[t].end(), [](uint8_t x) { return x != 0; });
  }
  ASSERT_EQ(f32_params, 2);  // layers 1 and 2
  ASSERT_EQ(masters, 2);
  ASSERT_EQ(moved, 2);  // the bias update moved both from their zero init
  for (int64_t bucket : {int64_t{500}, int64_t{37}, int64_t{1} << 20}) {
    for (int64_t slots : {int64_t{1}, int64_t{2}}) {
      SCOPED_TRACE(::testing::Message() << "bucket " << bucket << " slots " << slots);
      OptimSchedule os = optim_named("offload_stream", "host");
      os.bucket_params = bucket;
      os.slots = slots;
      const Run got = train(os);
      ASSERT_EQ(got.losses.size(), want.losses.size());
      for (size_t k = 0; k < want.losses.size(); ++k) EXPECT_EQ(got.losses[k], want.losses[k]) << "step " << k + 1;
      ASSERT_EQ(got.names, want.names);
      ASSERT_EQ(got.dtypes, want.dtypes);
      for (size_t t = 0; t < want.names.size(); ++t) EXPECT_TRUE(got.bytes[t] == want.bytes[t]) << want.names[t];
    }
  }
}

// Note [Parameters kept in f32]: in the bf16 recipe the routing bias (weight and gradient) is f32 and
// every other parameter bf16, and the bias update moves it exactly as in fp32 given the same loads: from
// b = 1 + e/64, three steps of 1e-3 (below bf16's 2^-7 spacing there, so a bf16 bias would not move).
TEST(DeepseekV3, Bf16RoutingBiasStaysF32AndMovesAsInFp32) {
  const ModelConfig m = deepseek_config();
  const int64_t L = m.num_hidden_layers, E = m.num_experts;
  std::vector<int64_t> counts(static_cast<size_t>(L * E));
  for (int64_t i = 0; i < L * E; ++i) counts[i] = (i * 7) % 5;  // loads above, at and below the mean
  std::vector<float> bias[2];
  int r = 0;
  for (const char* rec : {"fp32", "bf16"}) {
    auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
    Model model(m, *be, RoutingProfile{}, Schedules{}, recipe(rec));
    model.init_weights(m.seed);
    const DType weights = r == 0 ? DType::DType_F32 : DType::DType_BF16;
    for (const Param& p : model.params().all()) {
      const bool kept = p.name.ends_with("e_score_correction_bias");
      EXPECT_EQ(p.w.dtype(), kept ? DType::DType_F32 : weights) << rec << " " << p.name;
      EXPECT_EQ(p.g.dtype(), kept ? DType::DType_F32 : weights) << rec << " " << p.name;
    }
    std::vector<float> start(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) start[e] = 1.0f + static_cast<float>(e) / 64.0f;
    for (int64_t l = 1; l < L; ++l) {
      Tensor& w = model.params().layers[l].gate_bias->w;
      be->copy_from_host(w.data(), start.data(), w.bytes());
    }
    for (int step = 0; step < 3; ++step) ASSERT_EQ(model.routing_bias_update(counts, 1e-3).size(), 2u);
    for (int64_t l = 1; l < L; ++l) {
      const std::vector<float> b = host_of(*be, model.params().layers[l].gate_bias->w);
      bias[r].insert(bias[r].end(), b.begin(), b.end());
      double mean = 0;
      for (int64_t e = 0; e < E; ++e) mean += static_cast<double>(counts[l * E + e]) / static_cast<double>(E);
      for (int64_t e = 0; e < E; ++e) {
        const double c = static_cast<double>(counts[l * E + e]);
        float want = start[e];
        for (int step = 0; step < 3; ++step)
          want = static_cast<float>(static_cast<double>(want) + (c < mean ? 1e-3 : c > mean ? -1e-3 : 0.0));
        EXPECT_EQ(b[e], want) << rec << " layer " << l << " expert " << e;
      }
    }
    ++r;
  }
  EXPECT_EQ(bias[0], bias[1]);
}

namespace {
// One forward+backward of deepseek_config() in `rec` on W ranks (a thread world when W > 1, each rank its
// zig-zag piece of one batch) under the balanced routing profile; returns the loss and every parameter's
// gradient, whole and widened (rank 0's gather), in layout() order.
double deepseek_step(const char* rec, int W, std::vector<std::vector<float>>& grads) {
  const ModelConfig m = deepseek_config();
  const Batch global = batch_random(2, 64, m.vocab_size, 9);
  double loss = 0;
  auto body = [&](Comm* comm) {
    auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
    Model model(m, *be, routing_profile_parse("balanced"), Schedules{}, recipe(rec), comm);
    model.init_weights(m.seed);
    model.zero_grads();
    const int rank = comm ? comm->rank() : 0;
    const StepOutputs out = step_forward_backward(model, comm ? context_slice(global, rank, W) : global);
    std::vector<std::vector<float>> gathered = grads_gathered(model.params(), rank);  // collective
    if (rank == 0) grads = std::move(gathered), loss = out.loss;
  };
  if (W == 1) {
    body(nullptr);
  } else {
    ThreadWorld world(W);
    world.run([&](Comm& comm) { body(&comm); });
  }
  return loss;
}
}  // namespace

// One bf16 step against the fp32 step from the same init (the bf16 weights its rounding), on one rank and
// on two (FSDP units that gather the f32 routing bias beside bf16 weights, ring attention over MLA's
// q/k/v, bf16 gradient sums): the loss within 5e-3 relative and every gradient within 3e-2 of the fp32
// one's norm, the tolerances of Precision.Bf16StepTracksTheFp32Step. The balanced profile routes: the
// sigmoid scores of a fresh init lie within bf16's resolution of each other, so with the router choosing
// a token's top-k flips between the recipes and moves whole rows between experts (routing in bf16 is
// checked against the bf16 twin, model_vs_twin_bf16_mla, on a router far from ties). A bf16 buffer read
// as f32, or one left unwritten, is off by orders of magnitude.
TEST(DeepseekV3, Bf16StepTracksTheFp32Step) {
  for (const int W : {1, 2}) {
    SCOPED_TRACE(fmt::format("W={}", W));
    std::vector<std::vector<float>> gf, gb;
    const double lf = deepseek_step("fp32", W, gf), lb = deepseek_step("bf16", W, gb);
    EXPECT_TRUE(std::isfinite(lb));
    EXPECT_NEAR(lb, lf, 5e-3 * std::abs(lf));
    ASSERT_EQ(gf.size(), gb.size());
    int compared = 0;
    double worst = 0;
    for (size_t k = 0; k < gf.size(); ++k) {
      double diff = 0, norm = 0;
      for (size_t i = 0; i < gf[k].size(); ++i) {
        diff += (static_cast<double>(gb[k][i]) - gf[k][i]) * (static_cast<double>(gb[k][i]) - gf[k][i]);
        norm += static_cast<double>(gf[k][i]) * gf[k][i];
      }
      if (norm == 0) continue;  // the routing biases (no gradient)
      EXPECT_LE(std::sqrt(diff), 3e-2 * std::sqrt(norm)) << "parameter " << k;
      worst = std::max(worst, std::sqrt(diff / norm));
      ++compared;
    }
    EXPECT_GT(compared, 40);
    std::printf("W=%d: loss fp32 %.6f bf16 %.6f (rel %.2e), worst gradient %.2e norm-relative over %d\n", W, lf, lb,
                std::abs(lb - lf) / std::abs(lf), worst, compared);
  }
}

// The bf16 recipe's DeepSeek-V3 step, optimizer included, allocates on meta exactly as on cpu for every
// optimizer schedule (device and host ledgers); the parameters take 2 B each but the f32 routing biases
// (4 B), and multi-head latent attention's activations are bf16 but for their statistics. offload_stream
// updating on the host holds, beside the 12 B of f32 state per parameter, 2 slots of a gradient row and
// a weight row as long as the longest bucket with each segment in its parameter's dtype (2 B, the biases
// 4 B, each segment at a multiple of its element's size; Note [Offload with bf16 weights]).
TEST(DeepseekV3, Bf16MetaAllocatesAsCpuThroughTheOptimizerStep) {
  const ModelConfig m = deepseek_config();
  for (const char* sched : {"device", "offload_serial", "offload_stream", "offload_stream:host"}) {
    SCOPED_TRACE(sched);
    OptimConfig oc;
    const std::string sn = sched;
    oc.sched = sn == "offload_stream:host" ? optim_named("offload_stream", "host") : optim_named(sn);
    oc.sched.bucket_params = 500;
    std::vector<LedgerEvent> dev[2], host[2];
    uint64_t params_bytes[2] = {0, 0}, host_optimizer[2] = {0, 0}, host_row = 0;
    for (int i = 0; i < 2; ++i) {
      auto be = backend_create(i == 0 ? "cpu" : "meta", kUnlimitedBytes, kUnlimitedBytes);
      Schedules s;
      s.optim = oc.sched;
      Model model(m, *be, routing_profile_parse("hot:0.5:2"), s, recipe("bf16"));
      model.init_weights(m.seed);
      std::unique_ptr<Optimizer> optim = optimizer_create(oc, model.params(), *be);
      model.zero_grads();
      const StepOutputs out = step_forward_backward(model, batch_random(2, 37, m.vocab_size, 3));
      optim->step(1, 1);
      if (i == 0) {
        EXPECT_TRUE(std::isfinite(out.loss));
        // The longest bucket's row, walked here segment by segment.
        std::vector<int64_t> sizes;
        std::vector<uint64_t> elem;
        for (const Param& p : model.params().all()) {
          sizes.push_back(p.w.numel());
          elem.push_back(p.name.ends_with(".e_score_correction_bias") ? 4 : 2);
        }
        const OffloadPlan plan = offload_plan_make(sizes, oc.sched.bucket_params);
        for (const OffloadBucket& b : plan.buckets) {
          uint64_t end = 0;
          for (int64_t j = b.first_segment; j < b.first_segment + b.segments; ++j) {
            const OffloadSegment& sg = plan.segments[static_cast<size_t>(j)];
            const uint64_t e = elem[static_cast<size_t>(sg.param)];
            end = (end + e - 1) / e * e + static_cast<uint64_t>(sg.length) * e;
          }
          host_row = std::max(host_row, end);
        }
        ASSERT_GT(host_row, 2 * static_cast<uint64_t>(plan.largest));  // a bucket holds a bias at 4 B
      }
      params_bytes[i] = be->device_ledger().current(Category::Category_params);
      host_optimizer[i] = be->host_ledger().current(Category::Category_optimizer);
      dev[i] = be->device_ledger().events();
      host[i] = be->host_ledger().events();
    }
    for (auto* ev : {dev, host}) {
      const char* what = ev == dev ? "device" : "host";
      ASSERT_EQ(ev[0].size(), ev[1].size()) << what;
      for (size_t j = 0; j < ev[0].size(); ++j) {
        ASSERT_EQ(ev[0][j].alloc, ev[1][j].alloc) << what << " event " << j;
        ASSERT_EQ(ev[0][j].tag, ev[1][j].tag) << what << " event " << j;
        ASSERT_EQ(ev[0][j].bytes, ev[1][j].bytes) << what << " event " << j << " " << ev[0][j].tag;
        ASSERT_EQ(ev[0][j].total_after, ev[1][j].total_after) << what << " event " << j;
      }
    }
    const uint64_t P = static_cast<uint64_t>(m.param_count()), biases = 2 * static_cast<uint64_t>(m.num_experts);
    EXPECT_EQ(params_bytes[0], 2 * (P - biases) + 4 * biases);
    EXPECT_EQ(params_bytes[1], params_bytes[0]);
    if (sn == "offload_stream:host") {
      EXPECT_EQ(host_optimizer[0], 12 * P + 2 * 2 * host_row);  // 2 slots x (gradient row + weight row)
    }
    EXPECT_EQ(host_optimizer[1], host_optimizer[0]);
    int bf16_acts = 0;
    for (const LedgerEvent& e : dev[0]) {
      if (!e.alloc || e.category != Category::Category_activations || !e.tag.starts_with("attn.")) continue;
      const bool stat = e.tag.starts_with("attn.rstd") || e.tag == "attn.lse";
      EXPECT_EQ(e.dtype, stat ? DType::DType_F32 : DType::DType_BF16) << e.tag;
      bf16_acts += !stat;
    }
    EXPECT_GT(bf16_acts, 10);
  }
}

TEST(DeepseekV3, StepIsBitwiseRepeatable) {
  const ModelConfig m = deepseek_config();
  std::vector<float> logits[2];
  std::vector<float> grads[2];
  for (int run = 0; run < 2; ++run) {
    auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
    Model model(m, *be);
    model.init_weights(m.seed);
    step_forward_backward(model, batch_random(2, 70, m.vocab_size, 4), &logits[run]);
    for (Param& p : model.params().all()) {
      const std::vector<float> g = host_of(*be, p.g);
      grads[run].insert(grads[run].end(), g.begin(), g.end());
    }
  }
  EXPECT_EQ(logits[0], logits[1]);
  EXPECT_EQ(grads[0], grads[1]);
}

}  // namespace fp
