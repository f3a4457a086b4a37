// Host-offloaded AdamW (sched/optim/offload.h) and the emulated link (backend.h, Note [Emulated link]).
//
// The streamed step against the serial one, bit for bit, for both update placements and many
// bucket sizes and slot counts, also under random copy-stream delays; both against the device AdamW
// over 10 training steps of a tiny model; the bucket plan; the device and host ledgers (cpu and meta
// alike); the NaN guard; the master's sync after a checkpoint-style weight load.
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
        return ::testing::AssertionFailure() << names[t] << " index " << i << ": expected " << want[t][i] << ", got "
                                             << got[t][i];
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
  std::vector<OptimConfig> variants;
  OptimConfig serial = test_config();
  serial.sched = optim_named("offload_serial");
  variants.push_back(serial);
  variants.push_back(stream_config("device", 100, 2));
  variants.push_back(stream_config("host", 100, 2));
  for (const OptimConfig& c : variants) {
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
      cases.push_back({stream_config("host", bucket, slots), 0, 12 * P + static_cast<uint64_t>(slots) * largest * 4, 0});
    }
  }
  for (const LedgerCase& lc : cases) {
    SCOPED_TRACE(::testing::Message() << schedule_name(lc.cfg.sched.kind) << " update_on " << update_on_name(lc.cfg.sched)
                                      << " bucket " << lc.cfg.sched.bucket_params << " slots " << lc.cfg.sched.slots);
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
          EXPECT_EQ(dev.current(Category::Category_workspace), 4 * ps.all().size()) << backend;  // a sum of squares per parameter
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
// The emulated link

TEST(EmulatedLink, CopiesOnTheCopyStreamsTakeBytesOverRate) {
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  const uint64_t bytes = uint64_t{8} << 20;  // 8 MiB at 1 GB/s: 8.4 ms
  std::vector<char> a(bytes, 1), b(bytes, 0);
  auto timed_once = [&](Stream& s, int pieces) {
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t piece = bytes / static_cast<uint64_t>(pieces);
    for (int i = 0; i < pieces; ++i) be->copy_async(s, b.data() + i * piece, a.data() + i * piece, piece);
    s.synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Upper bounds are checked on the fastest of a few tries: a loaded machine only slows things down.
  auto timed = [&](Stream& s, int pieces) {
    double best = timed_once(s, pieces);
    // Spread over ~0.3 s: a burst of load from other tests (ctest -j) rarely covers every try.
    for (int r = 0; r < 19; ++r) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      best = std::min(best, timed_once(s, pieces));
    }
    return best;
  };
  const double link_s = static_cast<double>(bytes) / 1e9;
  be->link_set_gbps(1.0);
  EXPECT_EQ(be->link_gbps(), 1.0);
  for (Stream* s : {&be->h2d_stream(), &be->d2h_stream()}) {
    SCOPED_TRACE(s->name());
    EXPECT_GE(timed_once(*s, 1), link_s);
    // 256 back-to-back pieces of 33 us each: the link clock carries over, so a sleep's overshoot
    // (~60 us here) is not paid once per piece (that would be ~2.8x).
    EXPECT_GE(timed_once(*s, 256), link_s);
    EXPECT_LT(timed(*s, 256), 1.8 * link_s);
  }
  EXPECT_EQ(b, a);
  // The compute stream (device to device) never crosses the link; off again means plain copies.
  EXPECT_LT(timed(be->compute_stream(), 1), link_s);
  be->link_set_gbps(0);
  EXPECT_LT(timed(be->h2d_stream(), 1), link_s);
  EXPECT_THROW(be->link_set_gbps(-1), Error);
}

}  // namespace fp
