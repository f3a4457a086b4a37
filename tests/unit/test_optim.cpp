// AdamW (sched/optim/adamw.h) and the learning-rate schedule (sched/optim/lr_schedule.h).
//
// The optimizer on the cpu backend against an independent double-precision AdamW written here
// (torch.nn.utils.clip_grad_norm_ followed by torch.optim.AdamW, decay only on rank >= 2), element by
// element over every parameter of a tiny model; the NaN/Inf guard; the meta backend's accounting.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/backend.h"
#include "core/rng.h"
#include "core/units.h"
#include "model/params.h"
#include "sched/optim/adamw.h"
#include "sched/optim/lr_schedule.h"

namespace fp {

namespace {

// ---------------------------------------------------------------------------------------------
// Learning-rate schedule

OptimConfig schedule_config(int64_t warmup) {
  OptimConfig c;
  c.lr = 2e-3;
  c.warmup_steps = warmup;
  c.min_lr_ratio = 0.1;
  return c;
}

}  // namespace

TEST(LrSchedule, WarmupIsLinearUpToThePeak) {
  const OptimConfig c = schedule_config(10);
  EXPECT_DOUBLE_EQ(lr_at(c, 1, 100), 2e-4);
  EXPECT_DOUBLE_EQ(lr_at(c, 5, 100), 1e-3);
  EXPECT_DOUBLE_EQ(lr_at(c, 10, 100), 2e-3);
}

TEST(LrSchedule, CosineEndsAtTheFloorAndStaysThere) {
  const OptimConfig c = schedule_config(10);
  const double lr_min = 2e-4;
  EXPECT_DOUBLE_EQ(lr_at(c, 100, 100), lr_min);
  EXPECT_DOUBLE_EQ(lr_at(c, 150, 100), lr_min);  // past the end: clamped
  // Halfway through the cosine (step 55 of 10..100): the mean of peak and floor.
  EXPECT_NEAR(lr_at(c, 55, 100), 0.5 * (2e-3 + lr_min), 1e-15);
  // One step after warmup: just below the peak, 0.5 (1 + cos(pi / 90)) of the way.
  EXPECT_NEAR(lr_at(c, 11, 100), lr_min + 0.5 * (2e-3 - lr_min) * (1 + std::cos(M_PI / 90)), 1e-15);
}

TEST(LrSchedule, RisesThenFallsMonotonically) {
  for (int64_t warmup : {0, 1, 7}) {
    const OptimConfig c = schedule_config(warmup);
    double prev = 0;
    for (int64_t s = 1; s <= 60; ++s) {
      const double lr = lr_at(c, s, 50);
      ASSERT_TRUE(std::isfinite(lr) && lr > 0) << "warmup " << warmup << " step " << s;
      if (s <= warmup) {
        ASSERT_GT(lr, prev) << "warmup " << warmup << " step " << s;
      } else if (s > 1) {
        ASSERT_LE(lr, prev) << "warmup " << warmup << " step " << s;
      }
      ASSERT_LE(lr, c.lr);
      ASSERT_GE(lr, c.lr * c.min_lr_ratio);
      prev = lr;
    }
  }
}

TEST(LrSchedule, NoWarmupStartsAtThePeak) {
  const OptimConfig c = schedule_config(0);
  EXPECT_NEAR(lr_at(c, 1, 1000), 2e-3, 2e-3 * 1e-5);  // progress 1/1000 into the cosine
  EXPECT_DOUBLE_EQ(lr_at(c, 1000, 1000), 2e-4);
  EXPECT_DOUBLE_EQ(lr_at(c, 1, 1), 2e-4);  // a one-step run is all decay
}

TEST(LrSchedule, RunShorterThanWarmup) {
  const OptimConfig c = schedule_config(10);
  EXPECT_DOUBLE_EQ(lr_at(c, 3, 5), 6e-4);  // still warming up; total - warmup < 1 never divides by 0
  EXPECT_DOUBLE_EQ(lr_at(c, 11, 5), 2e-4);
}

// ---------------------------------------------------------------------------------------------
// AdamW

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

std::vector<float> tensor_read(Backend& be, const Tensor& t) {
  std::vector<float> h(static_cast<size_t>(t.numel()));
  be.copy_to_host(h.data(), t.data(), t.bytes());
  return h;
}
void tensor_write(Backend& be, const Tensor& t, const std::vector<float>& h) {
  be.copy_from_host(t.data(), h.data(), t.bytes());
}

// The independent oracle: every parameter's weights, gradient and moments in double.
struct RefParam {
  std::vector<double> w, g, m, v;
  // Running maxima of the magnitudes of the terms summed into w and m (Note in all_near's callers):
  // where the terms cancel, float rounding is relative to them, not to the result.
  std::vector<double> w_scale, m_scale;
  int rank = 0;
};

struct RefStep {
  double norm, clip, lr;
};

// clip_grad_norm_ then AdamW, in double, one parameter after another.
RefStep ref_adamw_step(std::vector<RefParam>& ps, const OptimConfig& c, int64_t step, int64_t total) {
  double sumsq = 0;
  for (const RefParam& p : ps)
    for (double g : p.g) sumsq += g * g;
  RefStep r;
  r.norm = std::sqrt(sumsq);
  r.clip = 1.0;
  if (c.grad_clip > 0) r.clip = std::min(1.0, c.grad_clip / (r.norm + 1e-6));
  r.lr = lr_at(c, step, total);
  const double bc1 = 1 - std::pow(c.beta1, static_cast<double>(step));
  const double bc2 = 1 - std::pow(c.beta2, static_cast<double>(step));
  for (RefParam& p : ps) {
    const double wd = p.rank >= 2 ? c.weight_decay : 0.0;
    for (size_t i = 0; i < p.w.size(); ++i) {
      const double g = p.g[i] * r.clip;
      p.w[i] *= 1 - r.lr * wd;
      p.m_scale[i] = std::max(p.m_scale[i], std::abs(c.beta1 * p.m[i]) + std::abs((1 - c.beta1) * g));
      p.m[i] = c.beta1 * p.m[i] + (1 - c.beta1) * g;
      p.v[i] = c.beta2 * p.v[i] + (1 - c.beta2) * g * g;
      const double update = r.lr / bc1 * p.m[i] / (std::sqrt(p.v[i]) / std::sqrt(bc2) + c.eps);
      p.w_scale[i] = std::max(p.w_scale[i], std::abs(p.w[i]) + std::abs(update));
      p.w[i] -= update;
    }
  }
  return r;
}

// Weights ~ N(0, 0.5) (norm weights around 1), gradients ~ grad_std * N(0, 1): no zeros.
void weights_random(Backend& be, ParamStore& ps, std::vector<RefParam>& ref, uint64_t seed) {
  Rng rng(seed);
  ref.clear();
  for (Param& p : ps.all()) {
    RefParam& r = ref.emplace_back();
    r.rank = p.w.shape().rank;
    std::vector<float> h(static_cast<size_t>(p.w.numel()));
    for (float& x : h) x = static_cast<float>(r.rank == 1 ? 1.0 + 0.1 * rng.normal() : 0.5 * rng.normal());
    tensor_write(be, p.w, h);
    r.w.assign(h.begin(), h.end());
    r.m.assign(h.size(), 0.0);
    r.v.assign(h.size(), 0.0);
    r.w_scale.assign(h.size(), 0.0);
    r.m_scale.assign(h.size(), 0.0);
  }
}
void grads_random(Backend& be, ParamStore& ps, std::vector<RefParam>& ref, double grad_std, uint64_t seed) {
  Rng rng(seed);
  size_t k = 0;
  for (Param& p : ps.all()) {
    std::vector<float> h(static_cast<size_t>(p.g.numel()));
    for (float& x : h) x = static_cast<float>(grad_std * rng.normal());
    tensor_write(be, p.g, h);
    ref[k++].g.assign(h.begin(), h.end());
  }
}

// |got - want| <= rtol * scale_i (scale = |want| when none is given), finite, with the index printed.
::testing::AssertionResult all_near(const std::vector<float>& got, const std::vector<double>& want, double rtol,
                                    const std::vector<double>* scale, const std::string& what) {
  for (size_t i = 0; i < want.size(); ++i) {
    const double a = got[i], b = want[i];
    const double tol = rtol * (scale ? (*scale)[i] : std::abs(b));
    if (!std::isfinite(a) || !(std::abs(a - b) <= tol))
      return ::testing::AssertionFailure() << what << " index " << i << ": expected " << b << ", got " << a
                                           << " (|diff| " << std::abs(a - b) << ", tolerance " << tol << ")";
  }
  return ::testing::AssertionSuccess();
}

// Three steps with fresh gradients each time, every element of w, m and v compared with the oracle.
void run_against_reference(OptimConfig c, double grad_std, bool expect_clipping) {
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  ParamStore ps(tiny_model(), *be);
  std::vector<RefParam> ref;
  weights_random(*be, ps, ref, 42);
  AdamW opt(ps, *be, c);
  const int64_t total = 3;
  for (int64_t step = 1; step <= total; ++step) {
    grads_random(*be, ps, ref, grad_std, 100 + static_cast<uint64_t>(step));
    const AdamW::StepStats st = opt.step(step, total);
    const RefStep r = ref_adamw_step(ref, c, step, total);
    SCOPED_TRACE(::testing::Message() << "step " << step);
    // The norm: per-parameter float sums of squares (accumulated in double), summed in double.
    EXPECT_NEAR(st.grad_norm, r.norm, 1e-6 * r.norm);
    EXPECT_DOUBLE_EQ(st.lr, r.lr);
    if (expect_clipping) {
      EXPECT_LT(st.clip_scale, 1.0);
      EXPECT_DOUBLE_EQ(st.clip_scale, c.grad_clip / (st.grad_norm + 1e-6));  // clip_grad_norm_'s coefficient
    } else {
      EXPECT_EQ(st.clip_scale, 1.0);
    }
    EXPECT_NEAR(st.clip_scale, r.clip, 1e-6 * r.clip);
    EXPECT_EQ(opt.steps_taken(), step);
    size_t k = 0;
    for (const Param& p : ps.all()) {
      // Float against double, 1e-6 relative (about 8 float ulps): of the value for v (a sum of
      // positive terms), of the largest term so far for w and m, whose terms may cancel. The kernel
      // also takes beta as float: 1 - 0.9f is 0.1 (1 + 2.4e-7), inside the bound.
      ASSERT_TRUE(all_near(tensor_read(*be, p.w), ref[k].w, 1e-6, &ref[k].w_scale, p.name));
      ASSERT_TRUE(all_near(tensor_read(*be, opt.m()[k]), ref[k].m, 1e-6, &ref[k].m_scale, p.name + ".exp_avg"));
      ASSERT_TRUE(all_near(tensor_read(*be, opt.v()[k]), ref[k].v, 1e-6, nullptr, p.name + ".exp_avg_sq"));
      ++k;
    }
  }
}

OptimConfig test_config() {
  OptimConfig c;
  c.lr = 1e-2;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.eps = 1e-8;
  c.weight_decay = 0.1;
  c.grad_clip = 1.0;
  c.warmup_steps = 2;  // step 1 warming up, step 2 at the peak, step 3 at the floor
  c.min_lr_ratio = 0.1;
  return c;
}

}  // namespace

TEST(AdamW, MatchesDoubleReferenceWithClipping) {
  // ~3000 gradients of std 0.5: the norm is ~27, far above grad_clip = 1.
  run_against_reference(test_config(), 0.5, /*expect_clipping=*/true);
}

TEST(AdamW, MatchesDoubleReferenceWithoutClipping) {
  OptimConfig c = test_config();
  c.grad_clip = 100.0;  // the norm is ~0.3: the coefficient is above 1, so nothing is scaled
  run_against_reference(c, 5e-3, /*expect_clipping=*/false);
}

TEST(AdamW, ClippingOff) {
  OptimConfig c = test_config();
  c.grad_clip = 0.0;
  run_against_reference(c, 0.5, /*expect_clipping=*/false);
}

TEST(AdamW, GradNormIsTheGlobalL2Norm) {
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  ParamStore ps(tiny_model(), *be);
  ps.init(1);
  // Every gradient element is 0.5 except one 3 in the final norm weight: sum = 0.25 (N - 1) + 9.
  int64_t n = 0;
  for (Param& p : ps.all()) {
    tensor_write(*be, p.g, std::vector<float>(static_cast<size_t>(p.g.numel()), 0.5f));
    n += p.g.numel();
  }
  std::vector<float> g(static_cast<size_t>(ps.norm->g.numel()), 0.5f);
  g[3] = 3.0f;
  tensor_write(*be, ps.norm->g, g);
  EXPECT_EQ(n, tiny_model().param_count());
  AdamW opt(ps, *be, test_config());
  const AdamW::StepStats st = opt.step(1, 10);
  EXPECT_DOUBLE_EQ(st.grad_norm, std::sqrt(0.25 * static_cast<double>(n - 1) + 9.0));
}

// With zero gradients the Adam term is exactly 0 (m = v = 0, 0 / (0 + eps)), leaving only the decay:
// matrices and embeddings are multiplied by 1 - lr * wd, 1-D norm weights are untouched.
TEST(AdamW, WeightDecayOnlyOnMatrices) {
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  ParamStore ps(tiny_model(), *be);
  std::vector<RefParam> ref;
  weights_random(*be, ps, ref, 9);
  ps.zero_grads();
  OptimConfig c = test_config();
  AdamW opt(ps, *be, c);
  const AdamW::StepStats st = opt.step(1, 3);
  EXPECT_EQ(st.grad_norm, 0.0);
  const float decay = static_cast<float>(1.0 - static_cast<double>(static_cast<float>(st.lr)) * c.weight_decay);
  int decayed = 0, kept = 0;
  size_t k = 0;
  for (const Param& p : ps.all()) {
    const std::vector<float> w = tensor_read(*be, p.w);
    for (size_t i = 0; i < w.size(); ++i) {
      const float before = static_cast<float>(ref[k].w[i]);
      const float want = p.w.shape().rank >= 2 ? before * decay : before;
      ASSERT_EQ(w[i], want) << p.name << " index " << i;
    }
    // Decayed or kept by rank, which must be the norms by their Hugging Face names (input_layernorm,
    // post_attention_layernorm, q_norm, k_norm, model.norm) and nothing else.
    const bool norm = p.name.find("norm") != std::string::npos;
    EXPECT_EQ(p.w.shape().rank < 2, norm) << p.name << " rank " << p.w.shape().rank;
    (p.w.shape().rank >= 2 ? decayed : kept) += 1;
    ++k;
  }
  // 2 layers x 4 norms (input, post-attention, q, k) + the final norm; the rest are matrices (decayed +
  // kept is the parameter count by construction, so only kept is asserted).
  EXPECT_EQ(kept, 9);
  EXPECT_GT(decayed, 0);
}

TEST(AdamW, NonFiniteGradientThrowsAndTouchesNothing) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
    ParamStore ps(tiny_model(), *be);
    std::vector<RefParam> ref;
    weights_random(*be, ps, ref, 3);
    AdamW opt(ps, *be, test_config());
    grads_random(*be, ps, ref, 0.1, 4);
    opt.step(1, 3);  // moments non-zero before the failing step
    grads_random(*be, ps, ref, 0.1, 5);
    // The bad value sits in the last parameter: every earlier one would be updated by a guard that
    // checked parameter by parameter.
    std::vector<float> g = tensor_read(*be, ps.lm_head->g);
    g[7] = bad;
    tensor_write(*be, ps.lm_head->g, g);
    std::vector<std::vector<float>> before;
    for (const auto& [name, t] : opt.state_tensors()) before.push_back(tensor_read(*be, *t));
    for (const Param& p : ps.all()) before.push_back(tensor_read(*be, p.w));
    try {
      opt.step(2, 3);
      FAIL() << "no error for a gradient holding " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("non-finite gradient norm at step 2"), std::string::npos) << e.what();
      EXPECT_NE(e.hint().find("optim.lr"), std::string::npos) << e.hint();
    }
    size_t k = 0;
    for (const auto& [name, t] : opt.state_tensors()) {
      const std::vector<float> now = tensor_read(*be, *t);
      ASSERT_EQ(std::memcmp(now.data(), before[k].data(), now.size() * sizeof(float)), 0) << name;
      ++k;
    }
    for (const Param& p : ps.all()) {
      const std::vector<float> now = tensor_read(*be, p.w);
      ASSERT_EQ(std::memcmp(now.data(), before[k].data(), now.size() * sizeof(float)), 0) << p.name;
      ++k;
    }
    EXPECT_EQ(opt.steps_taken(), 1);
  }
}

TEST(AdamW, StateTensorsNameEveryMoment) {
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  ParamStore ps(tiny_model(), *be);
  AdamW opt(ps, *be, test_config());
  const auto st = opt.state_tensors();
  ASSERT_EQ(st.size(), 2 * ps.all().size());
  size_t k = 0;
  for (const Param& p : ps.all()) {
    EXPECT_EQ(st[2 * k].first, p.name + ".exp_avg");
    EXPECT_EQ(st[2 * k + 1].first, p.name + ".exp_avg_sq");
    EXPECT_EQ(st[2 * k].second, &opt.m()[k]);
    EXPECT_EQ(st[2 * k + 1].second, &opt.v()[k]);
    EXPECT_EQ(opt.m()[k].shape(), p.w.shape());
    EXPECT_EQ(opt.m()[k].category(), Category::Category_optimizer);
    // Zero-filled before step 1.
    for (float x : tensor_read(*be, opt.v()[k])) ASSERT_EQ(x, 0.0f) << p.name;
    for (float x : tensor_read(*be, opt.m()[k])) ASSERT_EQ(x, 0.0f) << p.name;
    ++k;
  }
}

TEST(AdamW, StepsMustFollowEachOther) {
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  ParamStore ps(tiny_model(), *be);
  ps.init(1);
  AdamW opt(ps, *be, test_config());
  EXPECT_THROW(opt.step(2, 3), InternalError);
  opt.set_steps_taken(1);  // as a resume does after loading the moments
  EXPECT_NO_THROW(opt.step(2, 3));
  EXPECT_EQ(opt.steps_taken(), 2);
}

TEST(AdamW, MetaBackendAccountsStateAndReadsNothing) {
  auto be = backend_create("meta", kUnlimitedBytes, kUnlimitedBytes);
  ParamStore ps(tiny_model(), *be);
  const Ledger& led = be->device_ledger();
  const uint64_t params_bytes = led.current(Category::Category_params);
  EXPECT_EQ(params_bytes, static_cast<uint64_t>(tiny_model().param_count()) * 4);
  EXPECT_EQ(led.current(Category::Category_optimizer), 0u);
  {
    AdamW opt(ps, *be, test_config());
    EXPECT_EQ(led.current(Category::Category_optimizer), 2 * params_bytes);
    EXPECT_EQ(led.current(Category::Category_workspace), 4 * ps.all().size());  // a sum of squares per parameter
    // copy_to_host asserts on meta: a step that read any data would throw.
    for (int64_t s = 1; s <= 3; ++s) {
      const AdamW::StepStats st = opt.step(s, 3);
      EXPECT_TRUE(std::isnan(st.grad_norm));
      EXPECT_EQ(st.clip_scale, 1.0);
      EXPECT_DOUBLE_EQ(st.lr, lr_at(test_config(), s, 3));
    }
    EXPECT_EQ(opt.steps_taken(), 3);
  }
  EXPECT_EQ(led.current(Category::Category_optimizer), 0u);
  EXPECT_EQ(led.current(Category::Category_workspace), 0u);
}

}  // namespace fp

namespace fp {

namespace {

std::vector<bf16> bf16_read(Backend& be, const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::DType_BF16) << t.name();
  std::vector<bf16> h(static_cast<size_t>(t.numel()));
  be.copy_to_host(h.data(), t.data(), t.bytes());
  return h;
}

}  // namespace

// The bf16 recipe's parameters (Note [When AdamW keeps a master copy]): ParamStore rounds the f32
// init into bf16 weights; AdamW keeps an f32 master taken from them widened, updates it from bf16
// gradients and rounds the new weights back. Against an f32 run started from the widened bf16 weights
// and fed the widened bf16 gradients, every step must give bit for bit: the f32 run's weights as the
// master (so the bf16 weights are their rounding), the same moments, the same gradient norm.
TEST(AdamW, Bf16ParametersUpdateAnF32MasterAndRoundIntoTheWeights) {
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  ParamStore pf(tiny_model(), *be), pb(tiny_model(), *be, nullptr, precision_recipe("bf16"));
  pf.init(7);
  pb.init(7);
  auto same_rounding = [&](const std::string& what) {
    for (size_t i = 0; i < pf.all().size(); ++i) {
      const std::vector<float> f = tensor_read(*be, pf.all()[i].w);
      const std::vector<bf16> h = bf16_read(*be, pb.all()[i].w);
      for (size_t j = 0; j < f.size(); ++j)
        ASSERT_EQ(h[j].bits, bf16_from_float(f[j])) << what << " " << pf.all()[i].name << "[" << j << "]";
    }
  };
  same_rounding("init");
  // The f32 run starts from the bf16 weights widened: the master AdamW takes at its first step.
  for (size_t i = 0; i < pf.all().size(); ++i) {
    const std::vector<bf16> h = bf16_read(*be, pb.all()[i].w);
    std::vector<float> f(h.size());
    for (size_t j = 0; j < h.size(); ++j) f[j] = to_f32(h[j]);
    be->copy_from_host(pf.all()[i].w.data(), f.data(), pf.all()[i].w.bytes());
  }
  const OptimConfig c = test_config();
  AdamW of(pf, *be, c), ob(pb, *be, c);
  auto run_step = [&](int64_t step) {
    Rng rng(500 + static_cast<uint64_t>(step));
    for (size_t i = 0; i < pf.all().size(); ++i) {
      const int64_t n = pf.all()[i].g.numel();
      std::vector<bf16> gh(static_cast<size_t>(n));
      std::vector<float> gf(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) {
        gh[j] = from_f32<bf16>(static_cast<float>(0.3 * rng.normal()));
        gf[j] = to_f32(gh[j]);
      }
      be->copy_from_host(pb.all()[i].g.data(), gh.data(), pb.all()[i].g.bytes());
      be->copy_from_host(pf.all()[i].g.data(), gf.data(), pf.all()[i].g.bytes());
    }
    const AdamW::StepStats sf = of.step(step, 4), sb = ob.step(step, 4);
    SCOPED_TRACE(::testing::Message() << "step " << step);
    EXPECT_EQ(sb.grad_norm, sf.grad_norm);
    EXPECT_EQ(sb.clip_scale, sf.clip_scale);
    same_rounding("after the update");
    for (size_t k = 0; k < pf.all().size(); ++k) {
      const std::vector<float> mf = tensor_read(*be, of.m()[k]), mb = tensor_read(*be, ob.m()[k]);
      const std::vector<float> vf = tensor_read(*be, of.v()[k]), vb = tensor_read(*be, ob.v()[k]);
      ASSERT_EQ(0, std::memcmp(mf.data(), mb.data(), mf.size() * sizeof(float))) << pf.all()[k].name;
      ASSERT_EQ(0, std::memcmp(vf.data(), vb.data(), vf.size() * sizeof(float))) << pf.all()[k].name;
    }
  };
  for (int64_t step = 1; step <= 3; ++step) run_step(step);
  // Weights written from outside (the routing bias update) are taken again into the master: both runs
  // get the same new weights, the bf16 one through weights_written, and the next step must agree.
  std::vector<bf16> h = bf16_read(*be, pb.all()[0].w);
  std::vector<float> f(h.size());
  for (size_t j = 0; j < h.size(); ++j) {
    h[j] = from_f32<bf16>(to_f32(h[j]) + 1.0f);
    f[j] = to_f32(h[j]);
  }
  be->copy_from_host(pb.all()[0].w.data(), h.data(), pb.all()[0].w.bytes());
  be->copy_from_host(pf.all()[0].w.data(), f.data(), pf.all()[0].w.bytes());
  ob.weights_written({&pb.all()[0]});
  of.weights_written({&pf.all()[0]});
  run_step(4);
}

}  // namespace fp
