// SCO (sched/ckpt/sco.h) against the plain device store: the same losses and parameters bit for bit
// (only data moves), the checkpoints peak bounded by two boundaries whatever the depth, results
// independent of copy timing, the host budget, and the meta backend's identical ledger sequence.
// Legend: L layers, n = B * T tokens, H hidden; a boundary is (n, H) fp32.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "../common/qwen_config.h"
#include "backend/backend.h"
#include "core/precision.h"
#include "core/units.h"
#include "data/random_batch.h"
#include "sched/ckpt/sco.h"
#include "sched/optim/adamw.h"
#include "step/step.h"

namespace fp {

namespace {

constexpr int64_t kB = 2, kT = 37;

ModelConfig tiny_config(int64_t layers) { return qwen_small_config(layers); }

uint64_t boundary_bytes(const ModelConfig& m) { return static_cast<uint64_t>(kB * kT * m.hidden_size) * 4; }

Schedules schedules(CkptSchedule::Kind kind, uint64_t host_budget = kUnlimitedBytes) {
  Schedules s;
  s.ckpt.kind = kind;
  s.ckpt.host_budget = host_budget;
  return s;
}

// A cpu tensor's values as floats (bf16 widened, exact).
std::vector<float> values(const Tensor& t) {
  if (t.dtype() == DType::DType_F32) return {t.f32(), t.f32() + t.numel()};
  const bf16* h = t.buf().as<bf16>();
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = to_f32(h[i]);
  return out;
}

struct TrainResult {
  std::vector<double> losses;              // (steps)
  std::vector<std::vector<float>> params;  // every parameter after the last step
  std::vector<std::vector<float>> grads;   // every gradient of the last step
  uint64_t ckpt_peak = 0;                  // device, category checkpoints
  uint64_t host_ckpt_peak = 0;             // host, category checkpoints
};

// steps of forward+backward and AdamW on random batches, on the cpu backend. delays: random sleeps
// before every task of the copy streams (Note [Stream delays for testing]).
TrainResult train(const ModelConfig& m, const Schedules& sched, int steps, bool delays = false,
                  const char* recipe = "fp32") {
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  std::mutex mu;
  std::mt19937 gen(1234);
  auto hook = [&] {
    int us = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      us = std::uniform_int_distribution<int>(0, 400)(gen);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(us));
  };
  if (delays) {
    be->h2d_stream().set_delay_hook(hook);
    be->d2h_stream().set_delay_hook(hook);
  }
  Model model(m, *be, RoutingProfile{}, sched, precision_recipe(recipe));
  model.init_weights(m.seed);
  OptimConfig oc;
  oc.warmup_steps = 2;
  AdamW optim(model.params(), *be, oc);
  TrainResult r;
  for (int step = 1; step <= steps; ++step) {
    model.zero_grads();
    r.losses.push_back(step_forward_backward(model, batch_random(kB, kT, m.vocab_size, 100 + step)).loss);
    if (step == steps)
      for (Param& p : model.params().all()) r.grads.push_back(values(p.g));
    optim.step(step, steps);
  }
  be->synchronize();
  for (Param& p : model.params().all()) r.params.push_back(values(p.w));
  r.ckpt_peak = be->device_ledger().peak(Category::Category_checkpoints);
  r.host_ckpt_peak = be->host_ledger().peak(Category::Category_checkpoints);
  be->h2d_stream().set_delay_hook(nullptr);
  be->d2h_stream().set_delay_hook(nullptr);
  return r;
}

// Bit-identical losses, parameters and last gradients; on failure names the first differing value.
void expect_bitwise_equal(const TrainResult& a, const TrainResult& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  for (size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_EQ(std::memcmp(&a.losses[i], &b.losses[i], sizeof(double)), 0)
        << what << ": loss of step " << i + 1 << ": " << a.losses[i] << " vs " << b.losses[i];
  for (const auto* pair : {&a.params, &a.grads}) {
    const auto& x = *pair;
    const auto& y = pair == &a.params ? b.params : b.grads;
    const char* kind = pair == &a.params ? "parameter" : "gradient";
    ASSERT_EQ(x.size(), y.size()) << what;
    for (size_t p = 0; p < x.size(); ++p) {
      ASSERT_EQ(x[p].size(), y[p].size());
      if (std::memcmp(x[p].data(), y[p].data(), x[p].size() * sizeof(float)) == 0) continue;
      for (size_t i = 0; i < x[p].size(); ++i)
        if (std::memcmp(&x[p][i], &y[p][i], sizeof(float)) != 0) {
          ADD_FAILURE() << what << ": " << kind << " " << p << " element " << i << ": " << x[p][i] << " vs " << y[p][i];
          break;
        }
    }
  }
}

// The plain run of the 4-layer model, 10 steps, shared by the tests that compare against it.
const TrainResult& device_reference() {
  static const TrainResult r = train(tiny_config(4), schedules(CkptSchedule::Kind::Kind_device), 10);
  return r;
}

}  // namespace

TEST(Sco, TenStepsBitIdenticalToDevice) {
  const ModelConfig m = tiny_config(4);
  const TrainResult& dev = device_reference();
  const TrainResult sco = train(m, schedules(CkptSchedule::Kind::Kind_sco), 10);
  ASSERT_TRUE(std::isfinite(dev.losses.back()));
  EXPECT_NE(dev.losses.front(), dev.losses.back());  // the weights did move
  expect_bitwise_equal(dev, sco, "sco vs device");
  // The boundaries really went through host memory: all but the last (sco.h).
  EXPECT_EQ(sco.host_ckpt_peak, 3 * boundary_bytes(m));
  EXPECT_EQ(dev.host_ckpt_peak, 0u);
}

// The same in the bf16 recipe: bf16 boundaries (half the bytes) through host memory, AdamW's f32
// master; SCO moves bytes only, so every loss, bf16 weight and bf16 gradient is the plain run's.
TEST(Sco, Bf16TenStepsBitIdenticalToDevice) {
  const ModelConfig m = tiny_config(4);
  const TrainResult dev = train(m, schedules(CkptSchedule::Kind::Kind_device), 10, false, "bf16");
  const TrainResult sco = train(m, schedules(CkptSchedule::Kind::Kind_sco), 10, false, "bf16");
  ASSERT_TRUE(std::isfinite(dev.losses.back()));
  EXPECT_NE(dev.losses.front(), dev.losses.back());
  expect_bitwise_equal(dev, sco, "bf16 sco vs device");
  EXPECT_EQ(sco.host_ckpt_peak, 3 * boundary_bytes(m) / 2);
  // Not the fp32 run: the recipe really changed the arithmetic.
  EXPECT_NE(dev.losses.back(), device_reference().losses.back());
}

// Also with sequence-tiled layers (tiles of 16 of the 2 x 37 tokens): a tiled layer keeps its input for every
// tile and allocates its output first, so the store settles the previous boundary before (Note
// [Sequence-tiled layers]); without that the peak was three boundaries.
TEST(Sco, CheckpointsPeakIsTwoBoundariesWhateverTheDepth) {
  for (const auto& [L, tile] : {std::pair<int64_t, int64_t>{4, 0}, {8, 0}, {16, 0}, {4, 16}, {8, 16}}) {
    const ModelConfig m = tiny_config(L);
    const uint64_t b = boundary_bytes(m);
    for (const char* dev : {"cpu", "meta"}) {
      uint64_t peak[2] = {0, 0}, host_peak[2] = {0, 0};
      for (int v = 0; v < 2; ++v) {
        auto be = backend_create(dev, kUnlimitedBytes, kUnlimitedBytes);
        Schedules sched = schedules(v ? CkptSchedule::Kind::Kind_sco : CkptSchedule::Kind::Kind_device);
        sched.ckpt.layer_tile = tile;
        Model model(m, *be, routing_profile_parse("balanced"), sched);
        if (be->computes()) model.init_weights(m.seed);
        step_forward_backward(model, batch_random(kB, kT, m.vocab_size, 3));
        peak[v] = be->device_ledger().peak(Category::Category_checkpoints);
        host_peak[v] = be->host_ledger().peak(Category::Category_checkpoints);
        EXPECT_EQ(be->device_ledger().current(Category::Category_checkpoints), 0u);
        EXPECT_EQ(be->host_ledger().total_current(), 0u) << "host buffers are released at the end of the step";
      }
      // The plain store holds one boundary per layer, so this test can tell the two apart.
      EXPECT_EQ(peak[0], static_cast<uint64_t>(L) * b) << dev << " L=" << L << " tile " << tile;
      EXPECT_LE(peak[1], 2 * b) << dev << " L=" << L << " tile " << tile;
      EXPECT_EQ(host_peak[1], static_cast<uint64_t>(L - 1) * b) << dev << " L=" << L << " tile " << tile;
    }
  }
}

TEST(Sco, RandomCopyDelaysChangeNothing) {
  const ModelConfig m = tiny_config(4);
  const TrainResult& dev = device_reference();
  for (int rep = 0; rep < 2; ++rep) {
    const TrainResult sco = train(m, schedules(CkptSchedule::Kind::Kind_sco), 10, /*delays=*/true);
    expect_bitwise_equal(dev, sco, "sco with delayed copy streams vs device");
    EXPECT_LE(sco.ckpt_peak, 2 * boundary_bytes(m));
  }
}

TEST(Sco, HostBudgetKeepsTheRestOnDevice) {
  const ModelConfig m = tiny_config(6);
  const uint64_t b = boundary_bytes(m);
  const uint64_t budget = 2 * b + b / 2;  // room for two boundaries
  const TrainResult dev = train(m, schedules(CkptSchedule::Kind::Kind_device), 3);
  const TrainResult sco = train(m, schedules(CkptSchedule::Kind::Kind_sco, budget), 3);
  expect_bitwise_equal(dev, sco, "sco with a host budget vs device");
  EXPECT_LE(sco.host_ckpt_peak, budget);
  EXPECT_EQ(sco.host_ckpt_peak, 2 * b);
  // Layers 0 and 1 offloaded; 2..5 stay on the device, all four alive at the end of forward.
  EXPECT_EQ(sco.ckpt_peak, 4 * b);
  EXPECT_LT(sco.ckpt_peak, dev.ckpt_peak);
}

TEST(Sco, MetaLedgerSequenceEqualsCpu) {
  const ModelConfig m = tiny_config(5);
  const RoutingProfile p = routing_profile_parse("hot:0.7:2");
  std::vector<LedgerEvent> ev[2][2];  // [cpu, meta][device, host]
  for (int d = 0; d < 2; ++d) {
    auto be = backend_create(d ? "meta" : "cpu", kUnlimitedBytes, kUnlimitedBytes);
    Model model(m, *be, p, schedules(CkptSchedule::Kind::Kind_sco, 3 * boundary_bytes(m)));
    if (be->computes()) model.init_weights(m.seed);
    for (int step = 0; step < 2; ++step) step_forward_backward(model, batch_random(kB, kT, m.vocab_size, 9 + step));
    ev[d][0] = be->device_ledger().events();
    ev[d][1] = be->host_ledger().events();
  }
  for (int space = 0; space < 2; ++space) {
    const auto& cpu = ev[0][space];
    const auto& meta = ev[1][space];
    ASSERT_EQ(cpu.size(), meta.size()) << (space ? "host" : "device");
    ASSERT_GT(cpu.size(), space ? 8u : 100u);
    for (size_t i = 0; i < cpu.size(); ++i) {
      ASSERT_EQ(cpu[i].alloc, meta[i].alloc) << "event " << i << " " << cpu[i].tag;
      ASSERT_EQ(cpu[i].category, meta[i].category) << "event " << i << " " << cpu[i].tag;
      ASSERT_EQ(cpu[i].bytes, meta[i].bytes) << "event " << i << " " << cpu[i].tag;
      ASSERT_EQ(cpu[i].tag, meta[i].tag) << "event " << i;
      ASSERT_EQ(cpu[i].shape, meta[i].shape) << "event " << i << " " << cpu[i].tag;
      ASSERT_EQ(cpu[i].total_after, meta[i].total_after) << "event " << i << " " << cpu[i].tag;
    }
  }
}

// The store alone: a store kept across steps reuses its host buffers; the host arena's capacity
// acts as a budget; the call order is checked.
TEST(ScoStore, PoolReusesHostBuffersAcrossSteps) {
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  const int64_t L = 5, n = 7, H = 3;
  ScoBoundaryStore store(*be, L, kUnlimitedBytes);
  for (int step = 0; step < 3; ++step) {
    for (int64_t l = 0; l < L; ++l) {
      Tensor x = be->alloc_f32(Category::Category_checkpoints, {n, H}, fmt::format("ckpt.layer{}", l));  // (n, H)
      for (int64_t i = 0; i < n * H; ++i) x.f32()[i] = static_cast<float>(step * 1000 + l * 100 + i);
      store.put(l, std::move(x));
      EXPECT_LE(be->device_ledger().current(Category::Category_checkpoints), 2u * n * H * 4);
    }
    EXPECT_EQ(store.offloaded_count(), L - 1);
    for (int64_t l = L - 1; l >= 0; --l) {
      const Tensor& x = store.get(l);
      for (int64_t i = 0; i < n * H; ++i)
        ASSERT_EQ(x.f32()[i], static_cast<float>(step * 1000 + l * 100 + i)) << "step " << step << " layer " << l;
      EXPECT_LE(be->device_ledger().current(Category::Category_checkpoints), 2u * n * H * 4);
      store.release(l);
    }
    store.clear();
    EXPECT_EQ(be->device_ledger().current(Category::Category_checkpoints), 0u);
  }
  size_t host_allocs = 0;
  for (const LedgerEvent& e : be->host_ledger().events()) host_allocs += e.alloc;
  EXPECT_EQ(host_allocs, static_cast<size_t>(L - 1)) << "the second and third steps reuse the pool";
  EXPECT_EQ(store.pool().idle(), static_cast<size_t>(L - 1));
}

TEST(ScoStore, HostCapacityActsAsBudget) {
  const int64_t L = 4, n = 8, H = 4;
  const uint64_t b = n * H * 4;
  auto be = backend_create("cpu", kUnlimitedBytes, b + 1);  // room for one boundary
  ScoBoundaryStore store(*be, L, kUnlimitedBytes);
  for (int64_t l = 0; l < L; ++l) store.put(l, be->alloc_f32(Category::Category_checkpoints, {n, H}, "x"));
  EXPECT_EQ(store.offloaded_count(), 1);
  EXPECT_EQ(store.host_bytes(), b);
  for (int64_t l = L - 1; l >= 0; --l) {
    store.get(l);
    store.release(l);
  }
  store.clear();
}

TEST(ScoStore, CallOrderIsChecked) {
  auto be = backend_create("meta", kUnlimitedBytes, kUnlimitedBytes);
  ScoBoundaryStore store(*be, 3, kUnlimitedBytes);
  EXPECT_THROW(store.put(1, be->alloc_f32(Category::Category_checkpoints, {2, 2}, "x")), InternalError);
  store.put(0, be->alloc_f32(Category::Category_checkpoints, {2, 2}, "x"));
  EXPECT_THROW(store.get(0), InternalError);  // before every boundary was put
}

}  // namespace fp
