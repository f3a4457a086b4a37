// Host-offloaded AdamW (sched/optim/offload.h) and the emulated link (backend.h, Note [Emulated link]).
//
// The streamed step against the serial one, bit for bit, for both update placements and many
// bucket sizes and slot counts, also under random copy-stream delays; both against the device AdamW
// over 10 training steps of a tiny model; the bucket plan; the device and host ledgers (cpu and meta
// alike); the NaN guard; the master's sync after a checkpoint-style weight load. The bf16 recipe: every
// variant against the device AdamW bit for bit (weights, moments, master), through weights_written and
// a resume, its ledgers (cpu = meta) and the bytes each step moves.
// Dimensions: P parameters in all, B_max the largest bucket, S slots.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../common/optim_schedule.h"
#include "backend/backend.h"
#include "core/buf.h"
#include "core/precision.h"
#include "core/rng.h"
#include "core/units.h"
#include "data/random_batch.h"
#include "model/params.h"
#include "sched/optim/adamw.h"
#include "sched/optim/offload.h"
#include "sched/optim/optimizer.h"
#include "step/step.h"

namespace fp {

namespace {

ModelConfig tiny_model() {
  ModelConfig m;
  m.hidden_size = 8;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 2;
  m.num_key_value_heads = 1;
  m.head_dim = 4;
  m.num_experts = 3;
  m.num_experts_per_tok = 2;
  m.moe_intermediate_size = 6;
  m.vocab_size = 11;
  return m;
}

OptimConfig test_config() {
  OptimConfig c;
  c.lr = 1e-2;
  c.weight_decay = 0.1;
  c.grad_clip = 1.0;
  c.warmup_steps = 2;
  return c;
}

std::vector<float> tensor_read(Backend& be, const Tensor& t) {
  std::vector<float> h(static_cast<size_t>(t.numel()));
  be.copy_to_host(h.data(), t.data(), t.bytes());
  return h;
}
void tensor_write(Backend& be, const Tensor& t, const std::vector<float>& h) {
  be.copy_from_host(t.data(), h.data(), t.bytes());
}

// Weights ~ N(0, 0.5) (norm weights around 1), deterministic in seed.
void weights_random(Backend& be, ParamStore& ps, uint64_t seed) {
  Rng rng(seed);
  for (Param& p : ps.all()) {
    std::vector<float> h(static_cast<size_t>(p.w.numel()));
    for (float& x : h) x = static_cast<float>(p.w.shape().rank == 1 ? 1.0 + 0.1 * rng.normal() : 0.5 * rng.normal());
    tensor_write(be, p.w, h);
  }
}
// Gradients ~ grad_std * N(0, 1): with ~3000 of them, std 0.5 clips (norm ~27 > 1) and 5e-3 does not.
void grads_random(Backend& be, ParamStore& ps, double grad_std, uint64_t seed) {
  Rng rng(seed);
  for (Param& p : ps.all()) {
    std::vector<float> h(static_cast<size_t>(p.g.numel()));
    for (float& x : h) x = static_cast<float>(grad_std * rng.normal());
    tensor_write(be, p.g, h);
  }
}

// Everything an optimizer leaves behind: the weights, then m and v (state_tensors order).
std::vector<std::vector<float>> snapshot(Backend& be, ParamStore& ps, const Optimizer& opt) {
  std::vector<std::vector<float>> out;
  for (const Param& p : ps.all()) out.push_back(tensor_read(be, p.w));
  for (const auto& [name, t] : opt.state_tensors()) out.push_back(tensor_read(be, *t));
  return out;
}

std::vector<std::string> snapshot_names(ParamStore& ps, const Optimizer& opt) {
  std::vector<std::string> out;
  for (const Param& p : ps.all()) out.push_back(p.name);
  for (const auto& [name, t] : opt.state_tensors()) out.push_back(name);
  return out;
}

// memcmp, and on a difference the first differing element.
::testing::AssertionResult same_bits(const std::vector<std::vector<float>>& got,
                                     const std::vector<std::vector<float>>& want,
                                     const std::vector<std::string>& names) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "tensor counts differ";
  for (size_t t = 0; t < want.size(); ++t) {
    if (got[t].size() != want[t].size()) return ::testing::AssertionFailure() << names[t] << ": sizes differ";
    if (std::memcmp(got[t].data(), want[t].data(), want[t].size() * sizeof(float)) == 0) continue;
    for (size_t i = 0; i < want[t].size(); ++i)
      if (std::memcmp(&got[t][i], &want[t][i], sizeof(float)) != 0)
        return ::testing::AssertionFailure()
               << names[t] << " index " << i << ": expected " << want[t][i] << ", got " << got[t][i];
  }
  return ::testing::AssertionSuccess();
}

// A run of `steps` optimizer steps with fresh random gradients, from the same weights every time.
std::vector<std::vector<float>> run_steps(Backend& be, const OptimConfig& c, int steps, double grad_std,
                                          std::vector<std::string>* names = nullptr) {
  ParamStore ps(tiny_model(), be);
  weights_random(be, ps, 42);
  std::unique_ptr<Optimizer> opt = optimizer_create(c, ps, be);
  for (int s = 1; s <= steps; ++s) {
    grads_random(be, ps, grad_std, 100 + static_cast<uint64_t>(s));
    opt->step(s, steps);
  }
  be.synchronize();
  if (names) *names = snapshot_names(ps, *opt);
  return snapshot(be, ps, *opt);
}

OptimConfig stream_config(const std::string& update_on, int64_t bucket, int64_t slots) {
  OptimConfig c = test_config();
  c.sched = optim_named("offload_stream", update_on);
  c.sched.bucket_params = bucket;
  c.sched.slots = slots;
  return c;
}

// The three offloaded variants a training run is compared over: serial, and streamed (buckets of 100,
// 2 slots) updating on the device and on the host.
std::vector<OptimConfig> training_variants() {
  OptimConfig serial = test_config();
  serial.sched = optim_named("offload_serial");
  return {serial, stream_config("device", 100, 2), stream_config("host", 100, 2)};
}

// Random sleeps of 0..300 us before every task of a worker stream (Note [Stream delays for testing]).
void random_delays(Stream& s, unsigned seed) {
  auto rng = std::make_shared<std::mt19937>(seed);
  auto mu = std::make_shared<std::mutex>();
  s.set_delay_hook([rng, mu] {
    int us;
    {
      std::lock_guard<std::mutex> lock(*mu);
      us = static_cast<int>((*rng)() % 300);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(us));
  });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The bucket plan

TEST(OffloadPlan, CoversEveryElementOnceInOrderWithAlignedCuts) {
  const std::vector<int64_t> sizes = {8, 100, 3, 4096, 17, 1, 777, 64};
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  for (int64_t bucket : std::vector<int64_t>{1, 5, 16, 37, 100, 1000, 5000, int64_t{1} << 20}) {
    SCOPED_TRACE(::testing::Message() << "bucket_params " << bucket);
    const OffloadPlan plan = offload_plan_make(sizes, bucket);
    // Segments in order tile every parameter; buckets tile the segments.
    size_t param = 0;
    int64_t off = 0, seen = 0, largest = 0;
    int64_t next_segment = 0;
    for (const OffloadBucket& b : plan.buckets) {
      ASSERT_EQ(b.first_segment, next_segment);
      ASSERT_GT(b.segments, 0);
      next_segment += b.segments;
      ASSERT_GT(b.elements, 0);
      ASSERT_LE(b.elements, bucket);
      largest = std::max(largest, b.elements);
      int64_t slot_off = 0;
      for (int64_t j = b.first_segment; j < b.first_segment + b.segments; ++j) {
        const OffloadSegment& s = plan.segments[static_cast<size_t>(j)];
        while (param < sizes.size() && off == sizes[param]) {
          ++param;
          off = 0;
        }
        ASSERT_EQ(s.param, static_cast<int64_t>(param));
        ASSERT_EQ(s.offset, off);
        ASSERT_EQ(s.slot_offset, slot_off);
        ASSERT_GT(s.length, 0);
        // A cut inside a parameter lands on an aligned offset (buckets below the alignment excepted).
        const bool cut = s.offset + s.length < sizes[param];
        if (cut && bucket >= kOffloadAlign) {
          ASSERT_EQ((s.offset + s.length) % kOffloadAlign, 0) << "segment " << j;
        }
        off += s.length;
        slot_off += s.length;
        seen += s.length;
      }
      ASSERT_EQ(slot_off, b.elements);
    }
    EXPECT_EQ(next_segment, static_cast<int64_t>(plan.segments.size()));
    EXPECT_EQ(seen, total);
    EXPECT_EQ(plan.largest, largest);
    if (bucket >= total) {
      EXPECT_EQ(plan.buckets.size(), 1u);
    }
  }
}

// A host staging row with each segment in its parameter's dtype (Note [Offload with bf16 weights]):
// with one dtype the segments sit at slot_offset elements and a row holds B_max of them; with a 4-byte
// parameter among 2-byte ones each segment starts at a multiple of its own size (a 2-byte pad after an
// odd count of 2-byte elements) and rows never overlap within a bucket.
TEST(OffloadPlan, RowLayoutStagesEachSegmentInItsDtype) {
  const std::vector<int64_t> sizes = {8, 100, 3, 4096, 17, 1, 777, 64};
  for (int64_t bucket : std::vector<int64_t>{5, 37, 1000, int64_t{1} << 20}) {
    SCOPED_TRACE(::testing::Message() << "bucket_params " << bucket);
    const OffloadPlan plan = offload_plan_make(sizes, bucket);
    for (uint64_t e : {uint64_t{2}, uint64_t{4}}) {
      const OffloadRowLayout one = offload_row_layout(plan, std::vector<uint64_t>(sizes.size(), e));
      ASSERT_EQ(one.offsets.size(), plan.segments.size());
      for (size_t j = 0; j < plan.segments.size(); ++j) ASSERT_EQ(one.offsets[j], e * plan.segments[j].slot_offset);
      EXPECT_EQ(one.bytes, e * static_cast<uint64_t>(plan.largest));
    }
    // Parameter 3 (4096) and parameter 5 (1, after 17 2-byte elements) take 4 bytes.
    std::vector<uint64_t> mixed(sizes.size(), 2);
    mixed[3] = mixed[5] = 4;
    const OffloadRowLayout at = offload_row_layout(plan, mixed);
    ASSERT_EQ(at.offsets.size(), plan.segments.size());
    uint64_t longest = 0;
    for (const OffloadBucket& b : plan.buckets) {
      uint64_t end = 0;
      for (int64_t j = b.first_segment; j < b.first_segment + b.segments; ++j) {
        const OffloadSegment& sg = plan.segments[static_cast<size_t>(j)];
        const uint64_t e = mixed[static_cast<size_t>(sg.param)], o = at.offsets[static_cast<size_t>(j)];
        EXPECT_EQ(o % e, 0u) << "segment " << j;
        EXPECT_GE(o, end) << "segment " << j;      // after the previous one
        EXPECT_LT(o, end + e) << "segment " << j;  // padded by less than an element
        end = o + static_cast<uint64_t>(sg.length) * e;
      }
      longest = std::max(longest, end);
    }
    EXPECT_EQ(at.bytes, longest);
  }
  // By hand: {3 x 2 B, 1 x 4 B} in one bucket: the 4-byte element at byte 8 (after a 2-byte pad), 12 B.
  const OffloadRowLayout pad = offload_row_layout(offload_plan_make({3, 1}, 100), {2, 4});
  EXPECT_EQ(pad.offsets, (std::vector<uint64_t>{0, 8}));
  EXPECT_EQ(pad.bytes, 12u);
}

// ---------------------------------------------------------------------------------------------
// Bit-for-bit agreement

// The acceptance: offload_stream equals offload_serial bit for bit, for both placements, buckets that
// divide nothing (37: cuts mid-parameter; 5: below the alignment; 1000; one bucket for all), 1-3 slots.
TEST(OffloadStreamAdamW, EqualsSerialBitForBit) {
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  OptimConfig serial = test_config();
  serial.sched = optim_named("offload_serial");
  std::vector<std::string> names;
  for (double grad_std : {0.5, 5e-3}) {  // clipped and not
    const auto want = run_steps(*be, serial, 3, grad_std, &names);
    for (const std::string update_on : {"device", "host"}) {
      for (int64_t bucket : {int64_t{5}, int64_t{37}, int64_t{1000}, int64_t{1} << 20}) {
        for (int64_t slots : {1, 2, 3}) {
          SCOPED_TRACE(::testing::Message() << "update_on " << update_on << " bucket " << bucket << " slots " << slots
                                            << " grad_std " << grad_std);
          ASSERT_TRUE(same_bits(run_steps(*be, stream_config(update_on, bucket, slots), 3, grad_std), want, names));
        }
      }
    }
  }
}

// Note [OffloadStream pipeline]: results depend on the events alone, never on timing. Random sleeps
// before every copy-stream task reorder the copies against the updates; a missing wait would mix two
// buckets in a slot or read a slot before it is filled.
TEST(OffloadStreamAdamW, RandomCopyDelaysKeepTheBits) {
  auto plain = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  OptimConfig serial = test_config();
  serial.sched = optim_named("offload_serial");
  std::vector<std::string> names;
  const auto want = run_steps(*plain, serial, 3, 0.5, &names);
  unsigned seed = 1;
  for (const std::string update_on : {"device", "host"}) {
    for (int64_t slots : {1, 2, 3}) {
      auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
      random_delays(be->h2d_stream(), seed++);
      random_delays(be->d2h_stream(), seed++);
      SCOPED_TRACE(::testing::Message() << "update_on " << update_on << " slots " << slots);
      // 200-element buckets: ~16 buckets per step, so slots are refilled many times.
      ASSERT_TRUE(same_bits(run_steps(*be, stream_config(update_on, 200, slots), 3, 0.5), want, names));
    }
  }
}

// The acceptance: every offload variant equals the device AdamW within 1e-6 relative over 10 training
// steps of a tiny model (real forward/backward, random batches). On the cpu backend the same kernel
// runs with the same scalars in all of them, so the bits agree too: checked as well, since a
// schedule that changed the arithmetic (a norm summed in another order, a fused operation) would
// still pass 1e-6.
TEST(OffloadAdamW, MatchesDeviceAdamWOverTenTrainingSteps) {
  auto train = [](const OptimConfig& c, std::vector<double>* losses) {
    auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
    Model model(tiny_model(), *be);
    model.init_weights(7);
    std::unique_ptr<Optimizer> opt = optimizer_create(c, model.params(), *be);
    const int steps = 10;
    for (int s = 1; s <= steps; ++s) {
      model.zero_grads();
      const StepOutputs out = step_forward_backward(model, batch_random(2, 9, tiny_model().vocab_size, 500 + s));
      losses->push_back(out.loss);
      opt->step(s, steps);
    }
    be->synchronize();
    std::vector<std::vector<float>> w;
    for (const Param& p : model.params().all()) w.push_back(tensor_read(*be, p.w));
    for (const auto& [name, t] : opt->state_tensors()) w.push_back(tensor_read(*be, *t));
    return w;
  };
  OptimConfig device = test_config();
  device.sched = optim_named("device");
  std::vector<double> want_losses;
  const auto want = train(device, &want_losses);
  for (const OptimConfig& c : training_variants()) {
    SCOPED_TRACE(::testing::Message() << schedule_name(c.sched.kind) << " update_on " << update_on_name(c.sched));
    std::vector<double> losses;
    const auto got = train(c, &losses);
    for (size_t s = 0; s < losses.size(); ++s) EXPECT_NEAR(losses[s], want_losses[s], 1e-6 * std::abs(want_losses[s]));
    ASSERT_EQ(got.size(), want.size());
    for (size_t t = 0; t < want.size(); ++t) {
      for (size_t i = 0; i < want[t].size(); ++i) {
        const double a = got[t][i], b = want[t][i];
        ASSERT_TRUE(std::isfinite(a) && std::abs(a - b) <= 1e-6 * std::abs(b))
            << "tensor " << t << " index " << i << ": device " << b << ", offload " << a;
      }
      ASSERT_EQ(std::memcmp(got[t].data(), want[t].data(), want[t].size() * sizeof(float)), 0) << "tensor " << t;
    }
  }
}

// A resumed run writes the device weights after the optimizer exists; set_steps_taken makes the next
// step take the master from them (a stale master would silently undo the load).
TEST(OffloadAdamW, MasterFollowsWeightsLoadedBeforeTheFirstStep) {
  for (const std::string schedule : {"offload_serial", "offload_stream"}) {
    auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
    ParamStore ps(tiny_model(), *be);
    weights_random(*be, ps, 1);
    OptimConfig c = test_config();
    c.sched = optim_named(schedule);
    std::unique_ptr<Optimizer> opt = optimizer_create(c, ps, *be);
    grads_random(*be, ps, 0.5, 2);
    opt->step(1, 5);
    // A "checkpoint load": other weights, then the step counter.
    weights_random(*be, ps, 3);
    opt->set_steps_taken(1);
    grads_random(*be, ps, 0.5, 4);
    opt->step(2, 5);

    // The same two steps with the device AdamW, loading the same weights at the same point.
    auto be2 = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
    ParamStore ps2(tiny_model(), *be2);
    weights_random(*be2, ps2, 1);
    AdamW ref(ps2, *be2, test_config());
    grads_random(*be2, ps2, 0.5, 2);
    ref.step(1, 5);
    weights_random(*be2, ps2, 3);
    ref.set_steps_taken(1);
    grads_random(*be2, ps2, 0.5, 4);
    ref.step(2, 5);
    SCOPED_TRACE(schedule);
    ASSERT_TRUE(same_bits(snapshot(*be, ps, *opt), snapshot(*be2, ps2, ref), snapshot_names(ps, *opt)));
  }
}

TEST(OffloadAdamW, NonFiniteGradientThrowsAndTouchesNothing) {
  for (const std::string schedule : {"offload_serial", "offload_stream"}) {
    for (const std::string update_on : {"device", "host"}) {
      auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
      ParamStore ps(tiny_model(), *be);
      weights_random(*be, ps, 3);
      OptimConfig c = stream_config(update_on, 64, 2);
      c.sched.kind = optim_named(schedule).kind;
      std::unique_ptr<Optimizer> opt = optimizer_create(c, ps, *be);
      grads_random(*be, ps, 0.1, 4);
      opt->step(1, 3);
      grads_random(*be, ps, 0.1, 5);
      std::vector<float> g = tensor_read(*be, ps.lm_head->g);  // the last parameter: every bucket before it
      g[7] = std::numeric_limits<float>::quiet_NaN();
      tensor_write(*be, ps.lm_head->g, g);
      const auto before = snapshot(*be, ps, *opt);
      EXPECT_THROW(opt->step(2, 3), Error) << schedule << " " << update_on;
      ASSERT_TRUE(same_bits(snapshot(*be, ps, *opt), before, snapshot_names(ps, *opt))) << schedule << " " << update_on;
      EXPECT_EQ(opt->steps_taken(), 1);
    }
  }
}

TEST(OffloadAdamW, StateTensorsAreHostMomentsNamedLikeAdamW) {
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  ParamStore ps(tiny_model(), *be);
  OptimConfig c = stream_config("device", 100, 2);
  OffloadStreamAdamW opt(ps, *be, c);
  const auto st = opt.state_tensors();
  ASSERT_EQ(st.size(), 2 * ps.all().size());
  size_t k = 0;
  for (const Param& p : ps.all()) {
    EXPECT_EQ(st[2 * k].first, p.name + ".exp_avg");
    EXPECT_EQ(st[2 * k + 1].first, p.name + ".exp_avg_sq");
    EXPECT_EQ(st[2 * k].second, &opt.m()[k]);
    EXPECT_EQ(st[2 * k + 1].second, &opt.v()[k]);
    EXPECT_EQ(opt.m()[k].shape(), p.w.shape());
    for (float x : tensor_read(*be, opt.m()[k])) ASSERT_EQ(x, 0.0f);
    for (float x : tensor_read(*be, opt.v()[k])) ASSERT_EQ(x, 0.0f);
    ++k;
  }
}

TEST(OptimizerCreate, PicksTheSchedule) {
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  ParamStore ps(tiny_model(), *be);
  OptimConfig c = test_config();
  EXPECT_NE(dynamic_cast<AdamW*>(optimizer_create(c, ps, *be).get()), nullptr);
  c.sched = optim_named("offload_serial");
  EXPECT_NE(dynamic_cast<OffloadSerialAdamW*>(optimizer_create(c, ps, *be).get()), nullptr);
  c.sched = optim_named("offload_stream");
  EXPECT_NE(dynamic_cast<OffloadStreamAdamW*>(optimizer_create(c, ps, *be).get()), nullptr);
  // Names that are no schedule or placement are refused where they are read; auto never reaches it.
  EXPECT_THROW(optim_named("offload_stream", "gpu"), Error);
  EXPECT_THROW(optim_named("stream"), Error);
  c.sched = optim_named("auto");
  EXPECT_THROW(optimizer_create(c, ps, *be), Error);
}

// ---------------------------------------------------------------------------------------------
// Memory: device and host ledgers, cpu and meta alike

namespace {

struct LedgerCase {
  OptimConfig cfg;
  uint64_t device_optimizer;  // bytes in category optimizer on the device
  uint64_t host_optimizer;    // bytes in category optimizer on the host
  uint64_t host_grads;        // bytes in category grads on the host
};

// Allocation events (alloc/free, category, bytes, tag) of a ledger, for comparing backends.
std::vector<std::string> events_of(const Ledger& led) {
  std::vector<std::string> out;
  for (const LedgerEvent& e : led.events())
    out.push_back(fmt::format("{} {} {} {}", e.alloc ? "+" : "-", category_name(e.category), e.bytes, e.tag));
  return out;
}

}  // namespace

TEST(OffloadAdamW, LedgersHoldOnlyTheStagingOnTheDevice) {
  const uint64_t P = static_cast<uint64_t>(tiny_model().param_count());
  std::vector<LedgerCase> cases;
  {
    OptimConfig c = test_config();
    c.sched = optim_named("offload_serial");
    cases.push_back({c, 0, 12 * P, 4 * P});  // master + m + v; a host copy of every gradient
  }
  for (int64_t slots : {1, 2, 3}) {
    for (int64_t bucket : {int64_t{100}, int64_t{1000}, int64_t{1} << 20}) {
      std::vector<int64_t> sizes;
      {
        auto tmp = backend_create("meta", kUnlimitedBytes, kUnlimitedBytes);
        ParamStore ps(tiny_model(), *tmp);
        for (const Param& p : ps.all()) sizes.push_back(p.w.numel());
      }
      const uint64_t largest = static_cast<uint64_t>(offload_plan_make(sizes, bucket).largest);
      if (bucket >= static_cast<int64_t>(P)) {
        EXPECT_EQ(largest, P);  // one bucket: as large as the model
      }
      EXPECT_LE(largest, static_cast<uint64_t>(bucket));
      // Device placement: S x B_max x 16 B on the device, nothing extra on the host.
      cases.push_back({stream_config("device", bucket, slots), static_cast<uint64_t>(slots) * largest * 16, 12 * P, 0});
      // Host placement: nothing on the device; S x B_max x 4 B of gradient slots on the host.
      cases.push_back(
          {stream_config("host", bucket, slots), 0, 12 * P + static_cast<uint64_t>(slots) * largest * 4, 0});
    }
  }
  for (const LedgerCase& lc : cases) {
    SCOPED_TRACE(::testing::Message() << schedule_name(lc.cfg.sched.kind) << " update_on "
                                      << update_on_name(lc.cfg.sched) << " bucket " << lc.cfg.sched.bucket_params
                                      << " slots " << lc.cfg.sched.slots);
    std::vector<std::string> device_events[2], host_events[2];
    int b = 0;
    for (const char* backend : {"cpu", "meta"}) {
      auto be = backend_create(backend, kUnlimitedBytes, kUnlimitedBytes);
      ParamStore ps(tiny_model(), *be);
      if (be->computes()) weights_random(*be, ps, 1);
      const Ledger& dev = be->device_ledger();
      const Ledger& host = be->host_ledger();
      {
        std::unique_ptr<Optimizer> opt = optimizer_create(lc.cfg, ps, *be);
        for (int s = 1; s <= 2; ++s) {
          if (be->computes()) grads_random(*be, ps, 0.5, 10 + static_cast<uint64_t>(s));
          opt->step(s, 2);
          EXPECT_EQ(dev.current(Category::Category_optimizer), lc.device_optimizer) << backend;
          EXPECT_EQ(dev.peak(Category::Category_optimizer), lc.device_optimizer) << backend;
          EXPECT_EQ(dev.current(Category::Category_workspace), 4 * ps.all().size())
              << backend;  // a sum of squares per parameter
          EXPECT_EQ(host.current(Category::Category_optimizer), lc.host_optimizer) << backend;
          EXPECT_EQ(host.current(Category::Category_grads), lc.host_grads) << backend;
          EXPECT_EQ(host.peak(Category::Category_optimizer), lc.host_optimizer) << backend;
        }
      }
      EXPECT_EQ(dev.current(Category::Category_optimizer), 0u);
      EXPECT_EQ(host.total_current(), 0u);
      device_events[b] = events_of(dev);
      host_events[b] = events_of(host);
      ++b;
    }
    // meta performs the identical sequence of allocations.
    EXPECT_EQ(device_events[0], device_events[1]);
    EXPECT_EQ(host_events[0], host_events[1]);
  }
}

// ---------------------------------------------------------------------------------------------
// The bf16 recipe (Note [Offload with bf16 weights]): bf16 weights and gradients on the device, the
// f32 master, m, v on the host.

namespace {

// The bytes of a tensor, whatever its dtype.
std::vector<uint8_t> bytes_of(Backend& be, const Tensor& t) {
  std::vector<uint8_t> h(static_cast<size_t>(t.bytes()));
  be.copy_to_host(h.data(), t.data(), t.bytes());
  return h;
}

// Everything an optimizer leaves behind, as stored: the weights (bf16), then its state tensors.
struct Stored {
  std::vector<std::string> names;
  std::vector<DType> dtypes;
  std::vector<std::vector<uint8_t>> bytes;
};

Stored stored_of(Backend& be, ParamStore& ps, const Optimizer& opt) {
  Stored out;
  auto add = [&](const std::string& name, const Tensor& t) {
    out.names.push_back(name);
    out.dtypes.push_back(t.dtype());
    out.bytes.push_back(bytes_of(be, t));
  };
  for (const Param& p : ps.all()) add(p.name, p.w);
  for (const auto& [name, t] : opt.state_tensors()) add(name, *t);
  return out;
}

// The same tensors (names, dtypes) with the same bytes; else the first differing element, as values.
::testing::AssertionResult same_stored(const Stored& got, const Stored& want) {
  if (got.names != want.names) return ::testing::AssertionFailure() << "the tensors differ (names or order)";
  for (size_t t = 0; t < want.bytes.size(); ++t) {
    if (got.dtypes[t] != want.dtypes[t]) return ::testing::AssertionFailure() << want.names[t] << ": dtypes differ";
    if (got.bytes[t] == want.bytes[t]) continue;
    const size_t w = dtype_size(want.dtypes[t]);
    for (size_t i = 0; i < want.bytes[t].size(); i += w) {
      if (std::memcmp(&got.bytes[t][i], &want.bytes[t][i], w) == 0) continue;
      auto value = [&](const std::vector<uint8_t>& b) {
        if (w == 2) {
          uint16_t h;
          std::memcpy(&h, &b[i], 2);
          return bf16_to_float(h);
        }
        float f;
        std::memcpy(&f, &b[i], 4);
        return f;
      };
      return ::testing::AssertionFailure() << want.names[t] << " (" << dtype_name(want.dtypes[t]) << ") index " << i / w
                                           << ": expected " << value(want.bytes[t]) << ", got " << value(got.bytes[t]);
    }
  }
  return ::testing::AssertionSuccess();
}

// Gradients ~ grad_std * N(0, 1) rounded to bf16, deterministic in seed.
void grads_random_bf16(Backend& be, ParamStore& ps, double grad_std, uint64_t seed) {
  Rng rng(seed);
  for (Param& p : ps.all()) {
    ASSERT_EQ(p.g.dtype(), DType::DType_BF16) << p.name;
    std::vector<bf16> h(static_cast<size_t>(p.g.numel()));
    for (bf16& x : h) x = from_f32<bf16>(static_cast<float>(grad_std * rng.normal()));
    be.copy_from_host(p.g.data(), h.data(), p.g.bytes());
  }
}

// Weights written from outside the optimizer (as the routing bias update does): the first, a middle
// and the last parameter each get 0.25 added, rounded to bf16.
std::vector<Param*> weights_bump_bf16(Backend& be, ParamStore& ps) {
  std::vector<Param*> out;
  const size_t n = ps.all().size();
  for (size_t i : {size_t{0}, n / 2, n - 1}) {
    Param& p = ps.all()[i];
    std::vector<bf16> h(static_cast<size_t>(p.w.numel()));
    be.copy_to_host(h.data(), p.w.data(), p.w.bytes());
    for (bf16& x : h) x = from_f32<bf16>(to_f32(x) + 0.25f);
    be.copy_from_host(p.w.data(), h.data(), p.w.bytes());
    out.push_back(&p);
  }
  return out;
}

// `steps` steps of c's optimizer over the tiny model in the bf16 recipe (weights from init(7) rounded,
// random bf16 gradients); after step written_at (0: never) weights_written on weights_bump_bf16.
Stored run_steps_bf16(const OptimConfig& c, int steps, double grad_std, int written_at) {
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  ParamStore ps(tiny_model(), *be, nullptr, precision_recipe("bf16"));
  ps.init(7);
  std::unique_ptr<Optimizer> opt = optimizer_create(c, ps, *be);
  for (int s = 1; s <= steps; ++s) {
    grads_random_bf16(*be, ps, grad_std, 100 + static_cast<uint64_t>(s));
    opt->step(s, steps);
    if (s == written_at) opt->weights_written(weights_bump_bf16(*be, ps));
  }
  be->synchronize();
  return stored_of(*be, ps, *opt);
}

// Every offload variant of the bf16 tests: serial, and both placements with buckets that cut
// parameters (37), hold several (1000) or everything (2^20), with 1 and 2 slots.
std::vector<OptimConfig> offload_variants() {
  std::vector<OptimConfig> out;
  OptimConfig serial = test_config();
  serial.sched = optim_named("offload_serial");
  out.push_back(serial);
  for (const std::string update_on : {"device", "host"})
    for (int64_t bucket : {int64_t{37}, int64_t{1000}, int64_t{1} << 20})
      for (int64_t slots : {1, 2}) out.push_back(stream_config(update_on, bucket, slots));
  return out;
}

std::string variant_name(const OptimConfig& c) {
  if (c.sched.kind == OptimSchedule::Kind::Kind_offload_serial) return "offload_serial";
  return fmt::format("offload_stream update_on {} bucket {} slots {}", update_on_name(c.sched), c.sched.bucket_params,
                     c.sched.slots);
}

}  // namespace

// The acceptance of the bf16 recipe: every offload variant equals the device AdamW (its f32 master
// beside the bf16 weights) bit for bit over several steps, clipped and not: the bf16 weights, then
// m, v and the f32 master. The same kernel updates the same f32 operands with the same bf16
// gradient, so a widening, a rounding or a byte count done otherwise (the master copied as bytes,
// weights sent up unrounded or from the wrong slot) shows here.
TEST(OffloadAdamW, Bf16EqualsDeviceAdamWBitForBit) {
  OptimConfig device = test_config();
  device.sched = optim_named("device");
  for (double grad_std : {0.5, 5e-3}) {
    const Stored want = run_steps_bf16(device, 4, grad_std, 0);
    ASSERT_EQ(want.dtypes.front(), DType::DType_BF16);
    ASSERT_TRUE(want.names.back().ends_with(".master")) << want.names.back();
    for (const OptimConfig& c : offload_variants()) {
      SCOPED_TRACE(::testing::Message() << variant_name(c) << " grad_std " << grad_std);
      ASSERT_TRUE(same_stored(run_steps_bf16(c, 4, grad_std, 0), want));
    }
  }
}

// Note [OffloadStream pipeline] in bf16: random sleeps before every copy-stream task; the host
// placement's weight rows are refilled only after their previous bucket went up (weights_up), the
// device placement's slots as in fp32. A missing wait mixes two buckets' weights.
TEST(OffloadStreamAdamW, Bf16RandomCopyDelaysKeepTheBits) {
  OptimConfig device = test_config();
  device.sched = optim_named("device");
  const Stored want = run_steps_bf16(device, 3, 0.5, 0);
  unsigned seed = 1;
  for (const std::string update_on : {"device", "host"}) {
    for (int64_t slots : {1, 2, 3}) {
      SCOPED_TRACE(::testing::Message() << "update_on " << update_on << " slots " << slots);
      auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
      random_delays(be->h2d_stream(), seed++);
      random_delays(be->d2h_stream(), seed++);
      ParamStore ps(tiny_model(), *be, nullptr, precision_recipe("bf16"));
      ps.init(7);
      std::unique_ptr<Optimizer> opt = optimizer_create(stream_config(update_on, 200, slots), ps, *be);
      for (int s = 1; s <= 3; ++s) {
        grads_random_bf16(*be, ps, 0.5, 100 + static_cast<uint64_t>(s));
        opt->step(s, 3);
      }
      be->synchronize();
      ASSERT_TRUE(same_stored(stored_of(*be, ps, *opt), want));
    }
  }
}

// Weights written between steps (weights_written) are widened into the host master; the steps after
// it must still equal the device AdamW's, which takes its master from them the same way.
TEST(OffloadAdamW, Bf16WeightsWrittenReachTheMaster) {
  OptimConfig device = test_config();
  device.sched = optim_named("device");
  const Stored want = run_steps_bf16(device, 4, 0.5, 2);
  const Stored unwritten = run_steps_bf16(device, 4, 0.5, 0);
  ASSERT_FALSE(same_stored(unwritten, want));  // the write matters
  for (const OptimConfig& c : offload_variants()) {
    SCOPED_TRACE(variant_name(c));
    ASSERT_TRUE(same_stored(run_steps_bf16(c, 4, 0.5, 2), want));
  }
}

// A resume (train/checkpoint.cpp) loads the bf16 weights, then m, v and the f32 master into
// state_tensors(), calls master_loaded and then set_steps_taken: the next step must start from the
// loaded master, not from the rounded weights (set_steps_taken alone marks the master stale).
TEST(OffloadAdamW, Bf16ResumeKeepsTheLoadedMaster) {
  for (const OptimConfig& c : offload_variants()) {
    SCOPED_TRACE(variant_name(c));
    auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
    ParamStore pa(tiny_model(), *be, nullptr, precision_recipe("bf16"));
    ParamStore pb(tiny_model(), *be, nullptr, precision_recipe("bf16"));
    pa.init(7);
    pb.init(8);  // other weights: the load replaces them
    std::unique_ptr<Optimizer> a = optimizer_create(c, pa, *be), b = optimizer_create(c, pb, *be);
    for (int s = 1; s <= 2; ++s) {
      grads_random_bf16(*be, pa, 0.5, 10 + static_cast<uint64_t>(s));
      a->step(s, 4);
    }
    // The "checkpoint": the weights and every state tensor, by name.
    for (size_t i = 0; i < pa.all().size(); ++i)
      be->copy_from_host(pb.all()[i].w.data(), bytes_of(*be, pa.all()[i].w).data(), pa.all()[i].w.bytes());
    const auto sa = a->state_tensors(), sb = b->state_tensors();
    ASSERT_EQ(sa.size(), 3 * pa.all().size());
    ASSERT_EQ(sb.size(), sa.size());
    for (size_t k = 0; k < sa.size(); ++k) {
      ASSERT_EQ(sb[k].first, sa[k].first);
      be->copy_from_host(sb[k].second->data(), bytes_of(*be, *sa[k].second).data(), sa[k].second->bytes());
    }
    b->master_loaded();
    b->set_steps_taken(2);
    for (int s = 3; s <= 4; ++s) {
      grads_random_bf16(*be, pa, 0.5, 10 + static_cast<uint64_t>(s));
      grads_random_bf16(*be, pb, 0.5, 10 + static_cast<uint64_t>(s));
      a->step(s, 4);
      b->step(s, 4);
    }
    be->synchronize();
    ASSERT_TRUE(same_stored(stored_of(*be, pb, *b), stored_of(*be, pa, *a)));
  }
}

// Over 10 training steps of the tiny model in the bf16 recipe (real bf16 forward and backward), each
// offload variant gives the device AdamW's losses, weights and state bit for bit.
TEST(OffloadAdamW, Bf16MatchesDeviceAdamWOverTenTrainingSteps) {
  auto train = [](const OptimConfig& c, std::vector<double>* losses) {
    auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
    Model model(tiny_model(), *be, RoutingProfile{}, Schedules{}, precision_recipe("bf16"));
    model.init_weights(7);
    std::unique_ptr<Optimizer> opt = optimizer_create(c, model.params(), *be);
    const int steps = 10;
    for (int s = 1; s <= steps; ++s) {
      model.zero_grads();
      losses->push_back(step_forward_backward(model, batch_random(2, 9, tiny_model().vocab_size, 500 + s)).loss);
      opt->step(s, steps);
    }
    be->synchronize();
    return stored_of(*be, model.params(), *opt);
  };
  OptimConfig device = test_config();
  device.sched = optim_named("device");
  std::vector<double> want_losses;
  const Stored want = train(device, &want_losses);
  for (const OptimConfig& c : training_variants()) {
    SCOPED_TRACE(variant_name(c));
    std::vector<double> losses;
    const Stored got = train(c, &losses);
    ASSERT_EQ(losses.size(), want_losses.size());
    for (size_t s = 0; s < losses.size(); ++s) EXPECT_EQ(losses[s], want_losses[s]) << "step " << s + 1;
    ASSERT_TRUE(same_stored(got, want));
  }
}

// The bf16 recipe's memory and link traffic, both recipes side by side: the host holds the same
// 12 B of f32 state per parameter; serial's host gradients and the host slots follow the gradients'
// dtype (the host slots add a weight row: S x B_max x (2 + 2) B, the fp32 slots' bytes); the device
// slots stay f32. Per step the gradients and weights move in their dtype (serial and host placement:
// 2 B down and 2 B up per parameter, 4 and 4 in fp32) and the device placement moves the f32 state
// (12 and 12 in both); the first step's master sync adds the weights down (4 B in fp32; bf16: 2 B,
// or 4 B widened on the device for the device placement). cpu and meta allocate the same, event for
// event.
TEST(OffloadAdamW, Bf16LedgersAndTrafficFollowTheDtypes) {
  const uint64_t P = static_cast<uint64_t>(tiny_model().param_count());
  struct Case {
    OptimConfig cfg;
    const char* recipe;
    uint64_t device_optimizer, host_optimizer, host_grads;
    uint64_t down, up;  // bytes per step after the first
    uint64_t sync;      // the first step's extra bytes down
  };
  std::vector<int64_t> sizes;
  {
    auto tmp = backend_create("meta", kUnlimitedBytes, kUnlimitedBytes);
    ParamStore ps(tiny_model(), *tmp);
    for (const Param& p : ps.all()) sizes.push_back(p.w.numel());
  }
  std::vector<Case> cases;
  for (const char* recipe : {"fp32", "bf16"}) {
    const uint64_t w = std::string(recipe) == "bf16" ? 2 : 4;  // bytes of a weight and of a gradient
    OptimConfig serial = test_config();
    serial.sched = optim_named("offload_serial");
    cases.push_back({serial, recipe, 0, 12 * P, w * P, w * P, w * P, w * P});
    for (int64_t slots : {1, 2}) {
      for (int64_t bucket : {int64_t{37}, int64_t{1000}}) {
        const uint64_t SB =
            static_cast<uint64_t>(slots) * static_cast<uint64_t>(offload_plan_make(sizes, bucket).largest);
        cases.push_back({stream_config("device", bucket, slots), recipe, SB * 16, 12 * P, 0, 12 * P, 12 * P, 4 * P});
        cases.push_back({stream_config("host", bucket, slots), recipe, 0, 12 * P + SB * 4, 0, w * P, w * P, w * P});
      }
    }
  }
  for (const Case& k : cases) {
    SCOPED_TRACE(::testing::Message() << k.recipe << " " << variant_name(k.cfg));
    std::vector<std::string> device_events[2], host_events[2];
    int b = 0;
    for (const char* backend : {"cpu", "meta"}) {
      auto be = backend_create(backend, kUnlimitedBytes, kUnlimitedBytes);
      ParamStore ps(tiny_model(), *be, nullptr, precision_recipe(k.recipe));
      if (be->computes()) ps.init(1);
      const Ledger& dev = be->device_ledger();
      const Ledger& host = be->host_ledger();
      {
        std::unique_ptr<Optimizer> opt = optimizer_create(k.cfg, ps, *be);
        const auto* off = dynamic_cast<const OffloadAdamW*>(opt.get());
        ASSERT_NE(off, nullptr);
        for (int s = 1; s <= 2; ++s) {
          if (be->computes()) {
            if (std::string(k.recipe) == "bf16") {
              grads_random_bf16(*be, ps, 0.5, 10 + static_cast<uint64_t>(s));
            } else {
              grads_random(*be, ps, 0.5, 10 + static_cast<uint64_t>(s));
            }
          }
          opt->step(s, 2);
          EXPECT_EQ(dev.peak(Category::Category_optimizer), k.device_optimizer) << backend;
          EXPECT_EQ(host.current(Category::Category_optimizer), k.host_optimizer) << backend;
          EXPECT_EQ(host.peak(Category::Category_optimizer), k.host_optimizer) << backend;
          EXPECT_EQ(host.current(Category::Category_grads), k.host_grads) << backend;
          if (!be->computes()) continue;  // meta moves nothing
          EXPECT_EQ(off->last_times().down_bytes, k.down + (s == 1 ? k.sync : 0)) << "step " << s;
          EXPECT_EQ(off->last_times().up_bytes, k.up) << "step " << s;
        }
      }
      EXPECT_EQ(host.total_current(), 0u);
      device_events[b] = events_of(dev);
      host_events[b] = events_of(host);
      ++b;
    }
    EXPECT_EQ(device_events[0], device_events[1]);
    EXPECT_EQ(host_events[0], host_events[1]);
  }
}

// ---------------------------------------------------------------------------------------------
// The emulated link

namespace {

// Seconds to copy a into b on stream s in `pieces` equal pieces, back to back, and wait for them.
double link_copy_seconds(Backend& be, Stream& s, const std::vector<char>& a, std::vector<char>& b, int pieces) {
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t piece = a.size() / static_cast<uint64_t>(pieces);
  for (int i = 0; i < pieces; ++i) be.copy_async(s, b.data() + i * piece, a.data() + i * piece, piece);
  s.synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// What the link guarantees whatever the load: a copy on a copy stream takes at least bytes / rate (the
// emulation waits for it), arrives whole, and the rate is checked.
TEST(EmulatedLink, CopiesOnTheCopyStreamsTakeBytesOverRate) {
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  const uint64_t bytes = uint64_t{8} << 20;  // 8 MiB at 1 GB/s: 8.4 ms
  std::vector<char> a(bytes, 1), b(bytes, 0);
  const double link_s = static_cast<double>(bytes) / 1e9;
  be->link_set_gbps(1.0);
  EXPECT_EQ(be->link_gbps(), 1.0);
  for (Stream* s : {&be->h2d_stream(), &be->d2h_stream()}) {
    SCOPED_TRACE(s->name());
    EXPECT_GE(link_copy_seconds(*be, *s, a, b, 1), link_s);
    EXPECT_GE(link_copy_seconds(*be, *s, a, b, 256), link_s);
  }
  EXPECT_EQ(b, a);
  EXPECT_THROW(be->link_set_gbps(-1), Error);
}

// Upper bounds on wall-clock time (the tier "timing", run alone: Note [Test tiers]). 256 back-to-back
// pieces of 33 us each: the link clock carries over, so a sleep's overshoot (~60 us here) is not paid
// once per piece (that would be ~2.8x). The compute stream (device to device) never crosses the link,
// and with the link off again the copy streams make plain copies. Checked on the fastest of 20 tries
// spread over ~0.3 s: load only slows things down.
TEST(EmulatedLink, TimingBackToBackPiecesCarryTheLinkClock) {
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  const uint64_t bytes = uint64_t{8} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 0);
  auto fastest = [&](Stream& s, int pieces) {
    double best = link_copy_seconds(*be, s, a, b, pieces);
    for (int r = 0; r < 19; ++r) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      best = std::min(best, link_copy_seconds(*be, s, a, b, pieces));
    }
    return best;
  };
  const double link_s = static_cast<double>(bytes) / 1e9;
  be->link_set_gbps(1.0);
  for (Stream* s : {&be->h2d_stream(), &be->d2h_stream()}) {
    SCOPED_TRACE(s->name());
    EXPECT_LT(fastest(*s, 256), 1.8 * link_s);
  }
  EXPECT_LT(fastest(be->compute_stream(), 1), link_s);
  be->link_set_gbps(0);
  EXPECT_LT(fastest(be->h2d_stream(), 1), link_s);
  EXPECT_EQ(b, a);
}

}  // namespace fp
