// Ring-DTP (sched/vocab/ring_dtp.cpp) against the full vocabulary head on the same inputs, through the
// public head functions: loss, d x_L, d model.norm, d lm_head and the logits within the error model's
// bound (tests/common/head_bound.h) of the head in double, and of each other, on
// odd token counts, vocabularies not divisible by the block sizes (and spanning several vocabulary
// sub-blocks), ignored targets; bitwise equal across runs and thread counts; its vocab peak the fixed
// working set whatever n; meta allocating as cpu; and whole-model training, ring vs full, 10 AdamW steps.
// Legend: n tokens, H hidden, V vocabulary.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../common/error_bound.h"
#include "../common/head_bound.h"
#include "../common/vocab_head_case.h"
#include "backend/backend.h"
#include "core/precision.h"
#include "core/rng.h"
#include "core/units.h"
#include "data/random_batch.h"
#include "sched/optim/adamw.h"
#include "sched/vocab/ring_dtp.h"
#include "sched/vocab/vocab_head.h"
#include "step/step.h"

namespace fp {

namespace {

using head_test::head_config;
using head_test::same_bits;

void host_to(Backend& be, Tensor& t, const std::vector<float>& v) {
  ASSERT_EQ(static_cast<int64_t>(v.size()), t.numel());
  be.copy_from_host(t.data(), v.data(), t.bytes());
}
std::vector<float> to_host(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::DType_BF16) {  // widened (exact)
    std::vector<uint16_t> h(v.size());
    be.copy_to_host(h.data(), t.data(), t.bytes());
    for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_float(h[i]);
    return v;
  }
  be.copy_to_host(v.data(), t.data(), t.bytes());
  return v;
}

struct HeadCase {
  int64_t n, H, V, block_tokens;
};

struct HeadOut {
  double loss_sum = 0;
  std::vector<float> dx, dnorm, dW, logits;
  uint64_t vocab_peak = 0;
};

// Fixed random inputs: xL ~ N(0, 1), norm weight ~ 1 + N(0, 0.1), lm_head ~ N(0, 0.5) (logits of a few
// units, so the softmax is far from uniform), targets uniform with every fourth one and the first
// ignored. The gradients start from a nonzero value to check they are accumulated.
struct HeadInputs {
  std::vector<float> x, w, W, g0, gn0;
  std::vector<int32_t> targets;
  int64_t count = 0;  // targets not ignored
};

HeadInputs head_inputs(const HeadCase& c) {
  HeadInputs in;
  Rng rng(11);
  in.x.resize(c.n * c.H);
  in.w.resize(c.H);
  in.W.resize(c.V * c.H);
  in.g0.resize(c.V * c.H);
  in.gn0.resize(c.H);
  for (float& v : in.x) v = static_cast<float>(rng.normal());
  for (float& v : in.w) v = static_cast<float>(1.0 + 0.1 * rng.normal());
  for (float& v : in.W) v = static_cast<float>(0.5 * rng.normal());
  for (float& v : in.g0) v = static_cast<float>(0.01 * rng.normal());
  for (float& v : in.gn0) v = static_cast<float>(0.01 * rng.normal());
  in.targets.resize(c.n);
  for (int64_t t = 0; t < c.n; ++t) {
    in.targets[t] = (t % 4 == 0) ? -100 : static_cast<int32_t>(rng.below(c.V));
    in.count += in.targets[t] != -100;
  }
  if (in.count == 0) {
    in.targets[c.n - 1] = static_cast<int32_t>(c.V - 1);
    in.count = 1;
  }
  return in;
}

// One head call on head_inputs(c).
HeadOut head_run(const HeadCase& c, VocabSchedule::Kind kind, bool want_logits = true) {
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  const ModelConfig cfg = head_config(c.H, c.V);
  ParamStore ps(cfg, *be);
  const HeadInputs in = head_inputs(c);
  const std::vector<float>&x = in.x, &w = in.w, &W = in.W, &g0 = in.g0, &gn0 = in.gn0;
  const std::vector<int32_t>& tg = in.targets;
  const int64_t count = in.count;
  host_to(*be, ps.norm->w, w);
  host_to(*be, ps.lm_head->w, W);
  host_to(*be, ps.lm_head->g, g0);
  host_to(*be, ps.norm->g, gn0);

  std::unique_ptr<Comm> comm = comm_single();
  StepContext s(*be, cfg, RoutingProfile{}, *comm);
  s.B = 1;
  s.T = c.n;
  s.n = c.n;
  Tensor xL = be->alloc_f32(Category::Category_activations, {c.n, c.H}, "xL");
  host_to(*be, xL, x);
  Tensor targets = be->alloc(Category::Category_activations, {c.n}, DType::DType_I32, "targets");
  be->copy_from_host(targets.data(), tg.data(), targets.bytes());
  Tensor dx = be->alloc_f32(Category::Category_activations, {c.n, c.H}, "dx");

  VocabSchedule v;
  v.kind = kind;
  v.block_tokens = c.block_tokens;
  HeadOut o;
  be->device_ledger().peaks_reset();
  const HeadResult r = head_forward_backward(s, v, ps, xL, targets, 1.0f / static_cast<float>(count), dx,
                                             want_logits ? &o.logits : nullptr, true);
  o.loss_sum = head_loss_sum(*be, r);
  o.dx = to_host(*be, dx);
  o.dnorm = to_host(*be, ps.norm->g);
  o.dW = to_host(*be, ps.lm_head->g);
  o.vocab_peak = be->device_ledger().peak(Category::Category_vocab);
  return o;
}

// Element by element: |got_i - want_i| <= rel max_j |want_j|, relative to the tensor's magnitude. The
// gradients are sums whose terms cancel (softmax - onehot sums to 0 over a row), so their rounding
// scales with the terms, not with an element that may have cancelled to almost nothing; two exact
// evaluations in a different order differ by a few ulps of the largest terms. rel = 1e-6 is ~8 ulps.
::testing::AssertionResult near_rel(const std::vector<float>& got, const std::vector<float>& want, double rel,
                                    const std::string& what) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs " << want.size();
  double mag = 0;
  for (const float v : want) mag = std::max(mag, std::abs(static_cast<double>(v)));
  const double tol = rel * mag;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], w = want[i];
    if (!std::isfinite(g) || !std::isfinite(w) || !(std::abs(g - w) <= tol))
      return ::testing::AssertionFailure() << what << " at " << i << ": expected " << w << ", got " << g
                                           << " (tolerance " << tol << " = " << rel << " x max |expected|)";
  }
  return ::testing::AssertionSuccess();
}

// got against want element by element within k x bound (error_bound.h's within_bounds).
template <class W>
::testing::AssertionResult within_bound(const std::vector<float>& got, const std::vector<W>& want,
                                        const std::vector<double>& bound, double k, const std::string& what,
                                        double* worst) {
  if (got.size() != want.size() || got.size() != bound.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs " << want.size();
  std::vector<double> kb(bound.size());
  for (size_t i = 0; i < bound.size(); ++i) kb[i] = k * bound[i];
  std::string why;
  if (!test_bound::within_bounds(got.data(), want.data(), kb.data(), static_cast<int64_t>(got.size()), worst, &why))
    return ::testing::AssertionFailure() << what << " " << why;
  return ::testing::AssertionSuccess();
}

const std::vector<HeadCase> kCases = {
    {37, 24, 1001, 8},    // odd n, blocks of 8 (last one 5 rows), V < one sub-block
    {37, 16, 16389, 16},  // V = 2 sub-blocks + 5 columns
    {21, 20, 257, 64},    // block_tokens > n: one strip of n rows
    {1, 8, 9, 1},         // one token
    {64, 32, 8192, 32},   // exact multiples
};

}  // namespace

// Each of the full head and the ring within the error model's bound of the head in double
// (tests/common/head_bound.h), and within twice it of each other: a bound derived from the sums, so it
// holds whichever BLAS kernels ordered them (Note [Tolerances from an error model]).
TEST(RingDtp, MatchesFullHead) {
  for (const HeadCase& c : kCases) {
    const std::string where = "n=" + std::to_string(c.n) + " H=" + std::to_string(c.H) + " V=" + std::to_string(c.V) +
                              " block=" + std::to_string(c.block_tokens);
    const HeadInputs in = head_inputs(c);
    const head_test::HeadReference exact =
        head_test::head_reference(in.x, in.w, in.W, in.targets, 1.0 / static_cast<double>(in.count), in.gn0, in.g0,
                                  head_config(c.H, c.V).rms_norm_eps, 1, true);
    const HeadOut full = head_run(c, VocabSchedule::Kind::Kind_full);
    const HeadOut ring = head_run(c, VocabSchedule::Kind::Kind_ring);
    ASSERT_TRUE(std::isfinite(ring.loss_sum)) << where;
    double worst = 0;
    for (const HeadOut* o : std::initializer_list<const HeadOut*>{&full, &ring}) {
      const std::string what = (o == &full ? "full head, " : "ring, ") + where;
      EXPECT_NEAR(o->loss_sum, exact.loss_sum, exact.loss_bound) << what;
      EXPECT_TRUE(within_bound(o->logits, exact.logits, exact.logits_bound, 1, "logits " + what, &worst));
      EXPECT_TRUE(within_bound(o->dx, exact.dx, exact.dx_bound, 1, "dxL " + what, &worst));
      EXPECT_TRUE(within_bound(o->dnorm, exact.dnorm, exact.dnorm_bound, 1, "d model.norm " + what, &worst));
      EXPECT_TRUE(within_bound(o->dW, exact.dW, exact.dW_bound, 1, "d lm_head " + what, &worst));
    }
    EXPECT_NEAR(ring.loss_sum, full.loss_sum, 2 * exact.loss_bound) << where;
    EXPECT_TRUE(
        within_bound(ring.logits, full.logits, exact.logits_bound, 2, "logits, ring vs full, " + where, &worst));
    EXPECT_TRUE(within_bound(ring.dx, full.dx, exact.dx_bound, 2, "dxL, ring vs full, " + where, &worst));
    EXPECT_TRUE(
        within_bound(ring.dnorm, full.dnorm, exact.dnorm_bound, 2, "d model.norm, ring vs full, " + where, &worst));
    EXPECT_TRUE(within_bound(ring.dW, full.dW, exact.dW_bound, 2, "d lm_head, ring vs full, " + where, &worst));
    std::printf("[ info ] %s: largest error %.3f of the error model's bound\n", where.c_str(), worst);
  }
}

// Forward only (evaluation): the same loss, no gradient touched.
TEST(RingDtp, ForwardOnlyLoss) {
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  ModelConfig m = head_config(16, 333);
  m.num_hidden_layers = 1;
  m.num_attention_heads = 2;
  m.num_key_value_heads = 1;
  m.num_experts = 3;
  m.num_experts_per_tok = 2;
  m.router_aux_loss_coef = 0.01;
  const Batch b = batch_random(3, 13, m.vocab_size, 5);
  double loss[2];
  for (int k = 0; k < 2; ++k) {
    Schedules sched;
    sched.vocab.kind = k ? VocabSchedule::Kind::Kind_ring : VocabSchedule::Kind::Kind_full;
    sched.vocab.block_tokens = 7;
    Model model(m, *be, RoutingProfile{}, sched);
    model.init_weights(2);
    loss[k] = step_forward(model, b).ce_loss;
    for (const Param& p : model.params().all()) {
      const std::vector<float> g = to_host(*be, p.g);
      for (const float v : g) ASSERT_EQ(v, 0.0f) << p.name;
    }
  }
  EXPECT_NEAR(loss[1], loss[0], 1e-6 * loss[0]);
}

// Fixed reduction orders: two runs, and 1 vs 2 threads (BLAS and our kernels), give the same bits.
TEST(RingDtp, BitwiseAcrossRunsAndThreadCounts) {
  const HeadCase c = {203, 64, 16389, 64};
  const int saved = omp_get_max_threads();
  HeadOut out[3];
  for (int k = 0; k < 3; ++k) {
    omp_set_num_threads(k == 0 ? 1 : 2);
    out[k] = head_run(c, VocabSchedule::Kind::Kind_ring, false);
  }
  omp_set_num_threads(saved);
  for (int k = 1; k < 3; ++k) {
    const std::string what = k == 1 ? "1 vs 2 threads" : "two runs";
    EXPECT_EQ(std::memcmp(&out[k].loss_sum, &out[k - 1].loss_sum, sizeof(double)), 0) << what;
    EXPECT_TRUE(same_bits(out[k].dx, out[k - 1].dx)) << "dxL " << what;
    EXPECT_TRUE(same_bits(out[k].dnorm, out[k - 1].dnorm)) << "d model.norm " << what;
    EXPECT_TRUE(same_bits(out[k].dW, out[k - 1].dW)) << "d lm_head " << what;
  }
}

// The vocab category holds one strip and 16 B of state per token: doubling n adds only state.
TEST(RingDtp, VocabPeakIsTheFixedWorkingSet) {
  for (const int64_t n : {int64_t{37}, int64_t{74}, int64_t{300}}) {
    const HeadCase c = {n, 8, 1001, 16};
    VocabSchedule v;
    v.block_tokens = c.block_tokens;
    const HeadOut ring = head_run(c, VocabSchedule::Kind::Kind_ring, false);
    EXPECT_EQ(ring.vocab_peak, ring_dtp_vocab_bytes(v, n, c.V)) << "n=" << n;
    EXPECT_EQ(ring.vocab_peak, 16ull * 1001 * 4 + static_cast<uint64_t>(n) * 16) << "n=" << n;
  }
}

// Meta performs the identical allocations (so meta peaks are exact); at long context the ring's vocab
// peak stays one strip while the full head's is 3 x n x V fp32.
TEST(RingDtp, MetaAllocatesAsCpuAndFlattensTheVocabPeak) {
  ModelConfig m = head_config(24, 50);
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.num_experts = 6;
  m.num_experts_per_tok = 2;
  m.moe_intermediate_size = 20;
  m.router_aux_loss_coef = 0.01;
  Schedules sched;
  sched.vocab.kind = VocabSchedule::Kind::Kind_ring;
  sched.vocab.block_tokens = 16;
  const RoutingProfile p = routing_profile_parse("balanced");
  std::vector<LedgerEvent> ev[2];
  for (int k = 0; k < 2; ++k) {
    auto be = backend_create(k ? "meta" : "cpu", kUnlimitedBytes, kUnlimitedBytes);
    Model model(m, *be, p, sched);
    model.init_weights(1);
    step_forward_backward(model, batch_random(2, 37, m.vocab_size, 3));
    ev[k] = be->device_ledger().events();
  }
  ASSERT_EQ(ev[0].size(), ev[1].size());
  for (size_t i = 0; i < ev[0].size(); ++i) {
    ASSERT_EQ(ev[0][i].alloc, ev[1][i].alloc) << i;
    ASSERT_EQ(ev[0][i].tag, ev[1][i].tag) << i;
    ASSERT_EQ(ev[0][i].bytes, ev[1][i].bytes) << i << " " << ev[0][i].tag;
    ASSERT_EQ(ev[0][i].total_after, ev[1][i].total_after) << i;
  }

  m.vocab_size = 32000;
  const int64_t n = 131072;
  auto be = backend_create("meta", kUnlimitedBytes, kUnlimitedBytes);
  sched.vocab.block_tokens = 1024;
  Model model(m, *be, p, sched);
  step_forward_backward(model, batch_random(1, n, m.vocab_size, 1));
  const uint64_t ring = be->device_ledger().peak(Category::Category_vocab);
  EXPECT_EQ(ring, ring_dtp_vocab_bytes(sched.vocab, n, m.vocab_size));
  EXPECT_LT(ring, 3ull * n * 32000 * 4 / 100);  // over 99% below the full head's peak
}

// Whole-model training: 10 AdamW steps on one batch with the ring head follow the full head's losses
// within 1e-5 relative. The weights are compared too, within 1e-4 of their magnitude: AdamW divides
// each gradient by its own running rms, so an element whose gradient is nearly 0 moves by up to lr
// whatever its rounding, and the last-ulp differences of the two heads show there.
// Ten AdamW steps with the full head and with Ring-DTP, in each recipe. fp32: losses within 1e-5 and
// weights within 1e-4 (the logits differ by f32 rounding only). bf16: the same logits feed bf16
// gradients (dX, dW rounded once each), where an f32 difference of one ulp can move a rounding by one
// bf16 ulp (2^-8), and AdamW's m / sqrt(v) turns a small gradient's flip into a whole lr-sized step of
// that element: losses within 1e-3, each weight tensor within 1e-2 of its norm (element-wise 1e-2 of
// the largest fails on such elements).
TEST(RingDtp, TrainingMatchesFullHead) {
  ModelConfig m = head_config(24, 97);
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.num_experts = 4;
  m.num_experts_per_tok = 2;
  m.moe_intermediate_size = 16;
  m.router_aux_loss_coef = 0.01;
  const int64_t steps = 10;
  OptimConfig oc;
  oc.warmup_steps = 2;
  const Batch batch = batch_random(2, 23, m.vocab_size, 100);
  for (const char* recipe : {"fp32", "bf16"}) {
    const bool bf = std::string(recipe) == "bf16";
    std::vector<double> losses[2];
    std::vector<std::vector<float>> weights[2];
    for (int k = 0; k < 2; ++k) {
      auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
      Schedules sched;
      sched.vocab.kind = k ? VocabSchedule::Kind::Kind_ring : VocabSchedule::Kind::Kind_full;
      sched.vocab.block_tokens = 9;
      // bf16: the balanced routing profile, since a rounding flip in a hidden state flips a router's
      // top-k and moves a whole row between experts (Precision.Bf16StepTracksTheFp32Step).
      Model model(m, *be, bf ? routing_profile_parse("balanced") : RoutingProfile{}, sched, precision_recipe(recipe));
      model.init_weights(4);
      AdamW opt(model.params(), *be, oc);
      for (int64_t s = 1; s <= steps; ++s) {
        model.zero_grads();
        losses[k].push_back(step_forward_backward(model, batch).loss);
        opt.step(s, steps);
      }
      for (const Param& p : model.params().all()) weights[k].push_back(to_host(*be, p.w));
    }
    for (int64_t s = 0; s < steps; ++s)
      EXPECT_NEAR(losses[1][s], losses[0][s], (bf ? 1e-3 : 1e-5) * std::abs(losses[0][s]))
          << recipe << " step " << s + 1;
    EXPECT_LT(losses[0].back(), losses[0].front() - 0.1);  // it trains
    for (size_t i = 0; i < weights[0].size(); ++i) {
      if (!bf) {
        EXPECT_TRUE(near_rel(weights[1][i], weights[0][i], 1e-4, "weights of parameter " + std::to_string(i)));
        continue;
      }
      double diff = 0, norm = 0;
      for (size_t j = 0; j < weights[0][i].size(); ++j) {
        const double d = static_cast<double>(weights[1][i][j]) - weights[0][i][j];
        diff += d * d;
        norm += static_cast<double>(weights[0][i][j]) * weights[0][i][j];
      }
      EXPECT_LE(std::sqrt(diff), 1e-2 * std::sqrt(norm)) << "bf16 weights of parameter " << i;
    }
  }
}

}  // namespace fp
