// AdamW update: the fast kernel against the scalar reference, the sub-range / thread-count bit
// contract (Note [AdamW is element-wise]), the reference against a hand-computed example, the mixed
// precision operands (a bf16 gradient, the working copy of the weights: bit for bit the f32 update of
// the widened gradient, the copy the updated weights rounded once), and a timing against memory
// bandwidth. Dimensions: n elements.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/kernels/adamw_path.h"
#include "backend/cpu/kernels/cpu_features.h"
#include "backend/cpu/kernels/ops.h"
#include "core/buf.h"
#include "core/error.h"
#include "core/rng.h"
#include "op_test.h"
#include "ops/adamw.h"
#include "ops/ref/adamw.h"

namespace fp {

namespace {

struct State {
  std::vector<float> param, grad, m, v;  // (n) each
};

// Random weights ~ N(0, 1) and gradients ~ N(0, 1) scaled by 10^U(-3, 1), so the second moment spans
// several decades; no zeros.
State state_random(int64_t n, uint64_t seed) {
  Rng rng(seed);
  State s;
  s.param.resize(n);
  s.grad.resize(n);
  s.m.assign(n, 0.0f);
  s.v.assign(n, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    s.param[i] = static_cast<float>(rng.normal());
    s.grad[i] = static_cast<float>(rng.normal() * std::pow(10.0, -3.0 + 4.0 * rng.uniform()));
    if (s.grad[i] == 0.0f) s.grad[i] = 1e-3f;
  }
  return s;
}

// New gradients for the next step (the moments and weights carry over).
void grad_refresh(State& s, uint64_t seed) {
  Rng rng(seed);
  for (float& g : s.grad) g = static_cast<float>(rng.normal() * std::pow(10.0, -3.0 + 4.0 * rng.uniform()));
}

struct Hyper {
  float lr = 3e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f, grad_scale = 1.0f;
  ops::AdamWHyper at(int64_t step) const { return {lr, beta1, beta2, eps, weight_decay, grad_scale, step}; }
};

void fast_step(State& s, const Hyper& h, int64_t step) {
  ops::cpu::adamw_update(s.param.data(), s.grad.data(), s.m.data(), s.v.data(), static_cast<int64_t>(s.param.size()),
                         h.at(step), nullptr);
}
void ref_step(State& s, const Hyper& h, int64_t step) {
  ops::ref::adamw_update<float>(s.param.data(), s.grad.data(), s.m.data(), s.v.data(),
                                static_cast<int64_t>(s.param.size()), h.lr, h.beta1, h.beta2, h.eps, h.weight_decay,
                                h.grad_scale, step);
}

}  // namespace

TEST(AdamwUpdate, MatchesReferenceOnOddSizes) {
  const std::vector<int64_t> sizes = {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129, 8191, 8193, 1000003};
  for (float wd : {0.0f, 0.1f}) {
    for (float grad_scale : {1.0f, 0.37f}) {
      for (int64_t n : sizes) {
        Hyper h;
        h.weight_decay = wd;
        h.grad_scale = grad_scale;
        State fast = state_random(n, 1000 + static_cast<uint64_t>(n));
        State ref = fast;
        std::vector<double> max_abs(n);
        for (int64_t i = 0; i < n; ++i) max_abs[i] = std::abs(ref.param[i]);
        for (int64_t step = 1; step <= 4; ++step) {
          if (step > 1) {
            grad_refresh(fast, 77 * step + static_cast<uint64_t>(n));
            ref.grad = fast.grad;
          }
          fast_step(fast, h, step);
          ref_step(ref, h, step);
          SCOPED_TRACE(::testing::Message()
                       << "n " << n << " step " << step << " wd " << wd << " grad_scale " << grad_scale);
          // Element by element, |got - want| <= tol_i. m and v go through the same float operations in both
          // (1 - beta is exact in float for beta in [0.5, 1), Sterbenz), so a few ulps of |want| bound them.
          // The weights differ by the rounding of the folded scalars (1 - lr*wd, lr/bc1, sqrt(bc2), formed in
          // double then rounded in the kernel, in float in the reference): a couple of ulps per step of the
          // largest magnitude in play (the weight or the update, both below the element's running maximum
          // |weight|), and those errors carry from step to step. Hence tol_i = 4 eps * step * max_i for the
          // weights, where max_i is the largest |weight_i| seen so far.
          std::vector<double> tol_param(n);
          for (int64_t i = 0; i < n; ++i) {
            max_abs[i] = std::max(max_abs[i], static_cast<double>(std::abs(ref.param[i])));
            tol_param[i] = 4.0 * FLT_EPSILON * static_cast<double>(step) * max_abs[i];
          }
          ASSERT_TRUE(op_test::near("adamw_update m", {n}, fast.m, ref.m, op_test::tol_ulps(2)));
          ASSERT_TRUE(op_test::near("adamw_update v", {n}, fast.v, ref.v, op_test::tol_ulps(2)));
          ASSERT_TRUE(op_test::near("adamw_update param", {n}, fast.param, ref.param, op_test::tol_each(tol_param)));
        }
      }
    }
  }
}

// A first step in closed form, independent of the reference: with m = v = 0 before it, m_hat = g and
// sqrt(v_hat) = |g|, so (wd = 0) every weight moves by -lr * g / (|g| + eps). Pins the size and sign
// of the update (a kernel and reference sharing a mistake would pass the comparison above).
TEST(AdamwUpdate, FirstStepMovesEachWeightByLr) {
  const int64_t n = 1001;
  State s = state_random(n, 5);
  const State before = s;
  Hyper h;
  h.weight_decay = 0.0f;
  h.lr = 1e-2f;
  h.grad_scale = 0.5f;
  fast_step(s, h, 1);
  for (int64_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(before.grad[i]) * 0.5;
    const double want = -static_cast<double>(h.lr) * g / (std::abs(g) + static_cast<double>(h.eps));
    const double got = static_cast<double>(s.param[i]) - before.param[i];
    // Rounding of the new weight (an ulp of it) and of the float update (a few ulps of lr).
    const double tol = 2.0 * FLT_EPSILON * (std::abs(static_cast<double>(s.param[i])) + 4.0 * h.lr);
    ASSERT_NEAR(got, want, tol) << "index " << i << " grad " << before.grad[i];
  }
}

// Note [AdamW is element-wise]: any split into consecutive sub-ranges, and any thread count, gives
// the same bits as one call on [0, n).
TEST(AdamwUpdate, SubRangesAndThreadCountsGiveIdenticalBits) {
  const int64_t n = 100003;  // crosses kParallelMinElements and several kernel blocks
  Hyper h;
  h.grad_scale = 0.61f;
  State whole = state_random(n, 11);
  State split = whole;
  State one_thread = whole;
  const int saved_threads = omp_get_max_threads();
  for (int64_t step = 1; step <= 3; ++step) {
    if (step > 1) {
      grad_refresh(whole, 900 + step);
      split.grad = whole.grad;
      one_thread.grad = whole.grad;
    }
    omp_set_num_threads(2);
    fast_step(whole, h, step);
    // Edges at odd offsets, so sub-ranges start and end mid-vector and cross the kernel's blocks.
    const std::vector<int64_t> edges = {0, 1, 8, 13, 77, 4096 + 3, 8192 + 5, 40001, 40002, 99999, n};
    for (size_t k = 0; k + 1 < edges.size(); ++k) {
      const int64_t a = edges[k], len = edges[k + 1] - edges[k];
      ops::cpu::adamw_update(split.param.data() + a, split.grad.data() + a, split.m.data() + a, split.v.data() + a, len,
                             h.at(step), nullptr);
    }
    omp_set_num_threads(1);
    fast_step(one_thread, h, step);
    omp_set_num_threads(saved_threads);
    ASSERT_TRUE(op_test::bits_equal(whole.param, split.param)) << "step " << step;
    ASSERT_TRUE(op_test::bits_equal(whole.m, split.m)) << "step " << step;
    ASSERT_TRUE(op_test::bits_equal(whole.v, split.v)) << "step " << step;
    ASSERT_TRUE(op_test::bits_equal(whole.param, one_thread.param)) << "step " << step;
    ASSERT_TRUE(op_test::bits_equal(whole.m, one_thread.m)) << "step " << step;
    ASSERT_TRUE(op_test::bits_equal(whole.v, one_thread.v)) << "step " << step;
  }
}

// The instruction-set paths (backend/cpu/kernels/adamw_path.h): each against the reference element by element,
// and all of them bit for bit against the scalar path (Note [AdamW's AVX2 path has no FMA]), on odd
// sizes around the 4- and 8-wide vectors and the kernel's blocks, at odd pointer offsets (unaligned
// loads), over several steps. A path that fused a multiply-add would match the reference but fail
// the memcmp.
TEST(AdamwUpdate, EveryPathMatchesReferenceAndScalarBits) {
  using ops::cpu::AdamwPath;
  const std::vector<int64_t> sizes = {1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 23, 31, 33, 63, 65, 8191, 8193, 40009};
  const std::vector<AdamwPath> paths = {AdamwPath::AdamwPath_scalar, AdamwPath::AdamwPath_sse,
                                        AdamwPath::AdamwPath_avx2};
  int tested = 0;
  for (AdamwPath path : paths) {
    if (!ops::cpu::adamw_path_available(path)) {
      std::printf("adamw path %s: not available on this cpu, skipped\n",
                  std::string(ops::cpu::adamw_path_name(path)).c_str());
      continue;
    }
    ++tested;
    for (int64_t n : sizes) {
      for (int64_t shift : {0, 1, 3}) {  // start 4, 12 bytes past the allocation: unaligned vectors
        Hyper h;
        h.grad_scale = 0.73f;
        State base = state_random(n + shift, 4000 + static_cast<uint64_t>(n));
        State fast = base, scalar = base, ref = base;
        std::vector<double> max_abs(n + shift);
        for (int64_t i = 0; i < n + shift; ++i) max_abs[i] = std::abs(ref.param[i]);
        for (int64_t step = 1; step <= 3; ++step) {
          if (step > 1) {
            grad_refresh(fast, 31 * step + static_cast<uint64_t>(n));
            scalar.grad = ref.grad = fast.grad;
          }
          auto run = [&](State& s, AdamwPath p) {
            ops::cpu::adamw_update_path(p, s.param.data() + shift, s.grad.data() + shift, s.m.data() + shift,
                                        s.v.data() + shift, n, h.at(step), nullptr);
          };
          run(fast, path);
          run(scalar, AdamwPath::AdamwPath_scalar);
          ops::ref::adamw_update<float>(ref.param.data() + shift, ref.grad.data() + shift, ref.m.data() + shift,
                                        ref.v.data() + shift, n, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay,
                                        h.grad_scale, step);
          SCOPED_TRACE(::testing::Message() << "path " << ops::cpu::adamw_path_name(path) << " n " << n << " shift "
                                            << shift << " step " << step);
          std::vector<double> tol_param(n + shift);
          for (int64_t i = 0; i < n + shift; ++i) {
            max_abs[i] = std::max(max_abs[i], static_cast<double>(std::abs(ref.param[i])));
            tol_param[i] = 4.0 * FLT_EPSILON * static_cast<double>(step) * max_abs[i];
          }
          ASSERT_TRUE(op_test::near("adamw_update m", {n}, fast.m, ref.m, op_test::tol_ulps(2)));
          ASSERT_TRUE(op_test::near("adamw_update v", {n}, fast.v, ref.v, op_test::tol_ulps(2)));
          ASSERT_TRUE(op_test::near("adamw_update param", {n}, fast.param, ref.param, op_test::tol_each(tol_param)));
          for (const auto& [got, want, what] :
               {std::tuple{&fast.param, &scalar.param, "param"}, std::tuple{&fast.m, &scalar.m, "m"},
                std::tuple{&fast.v, &scalar.v, "v"}}) {
            for (int64_t i = 0; i < n + shift; ++i)
              ASSERT_EQ(std::memcmp(&(*got)[i], &(*want)[i], sizeof(float)), 0)
                  << what << " index " << i << ": scalar " << (*want)[i] << ", got " << (*got)[i];
          }
        }
      }
    }
  }
  EXPECT_GE(tested, 2);  // scalar and SSE exist on every x86-64
  // The kernel runs the widest available path at the engine's one SIMD level (FLATPEAK_SIMD lowers it).
  EXPECT_TRUE(ops::cpu::adamw_path_available(ops::cpu::adamw_path_best()));
  const bool avx2 = ops::cpu::simd_level() >= ops::cpu::SimdLevel::avx2;
  if (ops::cpu::adamw_path_available(AdamwPath::AdamwPath_avx2) && avx2) {
    EXPECT_EQ(ops::cpu::adamw_path_best(), AdamwPath::AdamwPath_avx2);
  } else {
    EXPECT_NE(ops::cpu::adamw_path_best(), AdamwPath::AdamwPath_avx2);
  }
}

// ---- Mixed precision: a bf16 gradient and the working copy (param_copy) of the weights.

std::vector<bf16> to_bf16(const std::vector<float>& x) {
  std::vector<bf16> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i].bits = bf16_from_float(x[i]);
  return h;
}
std::vector<float> widen(const std::vector<bf16>& h) {
  std::vector<float> x(h.size());
  for (size_t i = 0; i < h.size(); ++i) x[i] = bf16_to_float(h[i].bits);
  return x;
}

enum class Copy { none, bf16, f32 };

// Note [AdamW with bf16 operands]: with a bf16 gradient the f32 weights and moments get the bits of
// the f32 kernel fed the widened gradient, and the working copy is the updated f32 weights rounded
// once (bf16_from_float) or copied (f32). Every path, sizes around the 4- and 8-wide vectors, the
// kernel's chunk (1024) and block (8192), unaligned starts, three steps, a NaN and an infinite weight.
// Elements before the start (the shift) are never written, the copy's included.
TEST(AdamwUpdate, Bf16GradAndCopyAreTheF32UpdateOfTheWidenedGrad) {
  using ops::cpu::AdamwPath;
  const std::vector<int64_t> sizes = {1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 1023, 1024, 1025, 8191, 8193, 40009};
  const struct {
    bool grad_bf16;
    Copy copy;
  } mixes[] = {{true, Copy::none}, {true, Copy::bf16}, {false, Copy::bf16}, {true, Copy::f32}, {false, Copy::f32}};
  for (AdamwPath path : {AdamwPath::AdamwPath_scalar, AdamwPath::AdamwPath_sse, AdamwPath::AdamwPath_avx2}) {
    if (!ops::cpu::adamw_path_available(path)) continue;
    for (int64_t n : sizes)
      for (int64_t shift : {0, 1, 3})
        for (const auto& mix : mixes) {
          Hyper h;
          h.grad_scale = 0.73f;
          const int64_t len = n + shift;
          State plain = state_random(len, 6000 + static_cast<uint64_t>(n));
          plain.grad = widen(to_bf16(plain.grad));  // representable in bf16: both runs see the same numbers
          // Weights the rounding must treat apart, in the first vector: NaNs (they stay NaNs, payload
          // and all, so the copy must be bf16_from_float's quiet NaN: the upper half, where rounding the
          // low half would carry into it) and an infinity.
          if (n >= 8) {
            plain.param[shift] = std::bit_cast<float>(uint32_t{0xffc0ffff});
            plain.param[shift + 1] = -INFINITY;
            plain.param[shift + 2] = std::bit_cast<float>(uint32_t{0x7fffffff});
          }
          State mixed = plain;
          const bf16 marker{0x7fa5};  // a NaN pattern no rounding produces (it would be quiet, 0x7fe5)
          std::vector<bf16> copy_h(len, marker);
          std::vector<float> copy_f(len, -3.0f);
          for (int64_t step = 1; step <= 3; ++step) {
            if (step > 1) {
              grad_refresh(plain, 53 * step + static_cast<uint64_t>(n));
              plain.grad = widen(to_bf16(plain.grad));
              mixed.grad = plain.grad;
            }
            const std::vector<bf16> grad_h = to_bf16(mixed.grad);
            ops::cpu::adamw_update_path(path, plain.param.data() + shift, plain.grad.data() + shift,
                                        plain.m.data() + shift, plain.v.data() + shift, n, h.at(step), nullptr);
            const CBuf g = mix.grad_bf16 ? CBuf(grad_h.data() + shift) : CBuf(mixed.grad.data() + shift);
            const Buf c = mix.copy == Copy::bf16  ? Buf(copy_h.data() + shift)
                          : mix.copy == Copy::f32 ? Buf(copy_f.data() + shift)
                                                  : Buf();
            ops::cpu::adamw_update_path(path, mixed.param.data() + shift, g, mixed.m.data() + shift,
                                        mixed.v.data() + shift, n, h.at(step), c);
            SCOPED_TRACE(::testing::Message()
                         << "path " << ops::cpu::adamw_path_name(path) << " n " << n << " shift " << shift << " step "
                         << step << " grad " << (mix.grad_bf16 ? "bf16" : "f32") << " copy "
                         << static_cast<int>(mix.copy));
            ASSERT_TRUE(op_test::bits_equal(mixed.param, plain.param));
            ASSERT_TRUE(op_test::bits_equal(mixed.m, plain.m));
            ASSERT_TRUE(op_test::bits_equal(mixed.v, plain.v));
            for (int64_t i = 0; i < len; ++i) {
              if (mix.copy == Copy::bf16) {
                const uint16_t want = i < shift ? marker.bits : bf16_from_float(plain.param[i]);
                ASSERT_EQ(copy_h[i].bits, want) << "bf16 copy index " << i << ", weight " << plain.param[i];
              } else if (mix.copy == Copy::f32) {
                const float want = i < shift ? -3.0f : plain.param[i];
                ASSERT_EQ(std::memcmp(&copy_f[i], &want, sizeof(float)), 0) << "f32 copy index " << i;
              }
            }
          }
        }
  }
}

// The copy is rounded from the updated weights, not the ones before: one step by hand. With m = v = 0
// and wd = 0 a first step moves the weight by -lr g / (|g| + eps), here -2^-4 (lr 2^-4, g 1, eps tiny),
// to 0.9375 up to the rounding of the folded scalars; 0.9375 is a bf16 value, 1 (the weight before)
// another, so a copy taken before the update, or of the wrong array, is caught.
TEST(AdamwUpdate, Bf16CopyHoldsTheUpdatedWeights) {
  float param[9], m[9] = {}, v[9] = {};
  std::vector<bf16> grad(9, bf16{bf16_from_float(1.0f)}), copy(9, bf16{0});
  for (float& p : param) p = 1.0f;
  ops::cpu::adamw_update(param, grad.data(), m, v, 9, {0.0625f, 0.9f, 0.95f, 1e-30f, 0.0f, 1.0f, 1}, copy.data());
  for (int i = 0; i < 9; ++i) {
    EXPECT_NEAR(param[i], 0.9375f, 4 * FLT_EPSILON) << i;
    EXPECT_EQ(copy[i].bits, bf16_from_float(param[i])) << i;
    EXPECT_EQ(copy[i].bits, bf16_from_float(0.9375f)) << i;
  }
}

// Note [AdamW is element-wise] with a bf16 gradient and a bf16 copy: sub-ranges split anywhere (mid
// vector, mid chunk, across blocks) and any thread count give the bits of one call on [0, n).
TEST(AdamwUpdate, Bf16SubRangesAndThreadCountsGiveIdenticalBits) {
  const int64_t n = 100003;
  Hyper h;
  h.grad_scale = 0.61f;
  State whole = state_random(n, 12);
  State split = whole, one_thread = whole;
  std::vector<bf16> cw(n), cs(n), c1(n);
  const int saved_threads = omp_get_max_threads();
  for (int64_t step = 1; step <= 3; ++step) {
    if (step > 1) grad_refresh(whole, 950 + step);
    const std::vector<bf16> g = to_bf16(whole.grad);
    omp_set_num_threads(2);
    ops::cpu::adamw_update(whole.param.data(), g.data(), whole.m.data(), whole.v.data(), n, h.at(step), cw.data());
    const std::vector<int64_t> edges = {0, 1, 8, 13, 77, 1024 + 5, 4096 + 3, 8192 + 5, 40001, 40002, 99999, n};
    for (size_t k = 0; k + 1 < edges.size(); ++k) {
      const int64_t a = edges[k], len = edges[k + 1] - edges[k];
      ops::cpu::adamw_update(split.param.data() + a, g.data() + a, split.m.data() + a, split.v.data() + a, len,
                             h.at(step), cs.data() + a);
    }
    omp_set_num_threads(1);
    ops::cpu::adamw_update(one_thread.param.data(), g.data(), one_thread.m.data(), one_thread.v.data(), n, h.at(step),
                           c1.data());
    omp_set_num_threads(saved_threads);
    for (const State* o : {&split, &one_thread}) {
      ASSERT_TRUE(op_test::bits_equal(whole.param, o->param)) << "step " << step;
      ASSERT_TRUE(op_test::bits_equal(whole.m, o->m)) << "step " << step;
      ASSERT_TRUE(op_test::bits_equal(whole.v, o->v)) << "step " << step;
    }
    ASSERT_EQ(std::memcmp(cw.data(), cs.data(), n * sizeof(bf16)), 0) << "step " << step;
    ASSERT_EQ(std::memcmp(cw.data(), c1.data(), n * sizeof(bf16)), 0) << "step " << step;
  }
}

// An f32 copy that is the weights themselves writes nothing: the plain update's bits.
TEST(AdamwUpdate, F32CopyThatIsTheWeightsIsTheUpdate) {
  const int64_t n = 40009;
  Hyper h;
  State a = state_random(n, 13), b = a;
  for (int64_t step = 1; step <= 2; ++step) {
    fast_step(a, h, step);
    ops::cpu::adamw_update(b.param.data(), b.grad.data(), b.m.data(), b.v.data(), n, h.at(step), b.param.data());
    ASSERT_TRUE(op_test::bits_equal(a.param, b.param)) << "step " << step;
    ASSERT_TRUE(op_test::bits_equal(a.m, b.m)) << "step " << step;
  }
}

// Gradients and copies are f32 or bf16; any other dtype is an error, before anything is written.
TEST(AdamwUpdate, OtherDtypesAreAnError) {
  State s = state_random(16, 14);
  const State before = s;
  std::vector<uint16_t> half(16, 0x3c00);
  Hyper h;
  EXPECT_THROW(ops::cpu::adamw_update(s.param.data(), CBuf(half.data(), DType::DType_F16), s.m.data(), s.v.data(), 16,
                                      h.at(1), nullptr),
               Error);
  EXPECT_THROW(ops::cpu::adamw_update(s.param.data(), s.grad.data(), s.m.data(), s.v.data(), 16, h.at(1),
                                      Buf(half.data(), DType::DType_F16)),
               Error);
  EXPECT_TRUE(op_test::bits_equal(s.param, before.param));
  EXPECT_TRUE(op_test::bits_equal(s.m, before.m));
}

// Two steps worked by hand: lr 0.1, beta1 0.9, beta2 0.99, eps 1e-8, wd 0.01, grad_scale 2.
//   element 0: p = 1, grads 0.5 then -0.25 (g = 1, -0.5)
//     step 1: p = 0.999; m = 0.1; v = 0.01; bc1 = 0.1, bc2 = 0.01; denom = 1 + 1e-8
//             p = 0.999 - 1 * 0.1 / (1 + 1e-8) = 0.899000000999999990...
//     step 2: p = 0.899000001 * 0.999; m = 0.09 - 0.05 = 0.04; v = 0.0099 + 0.0025 = 0.0124;
//             bc1 = 0.19, bc2 = 0.0199; p -= (0.1 / 0.19) * 0.04 / (sqrt(0.0124 / 0.0199) + 1e-8)
//   element 1: p = -2, grads -0.125 then 0.375 (g = -0.25, 0.75)
//     step 1: p = -1.998; m = -0.025; v = 0.000625; denom = 0.25 + 1e-8; p = -1.998 + 0.1 / (1 + 4e-8)
//     step 2: m = -0.0225 + 0.075 = 0.0525; v = 0.00061875 + 0.005625 = 0.00624375
// Expected values evaluated with 40-digit decimal arithmetic.
TEST(AdamwReference, TwoStepsByHandInDouble) {
  double p[2] = {1.0, -2.0}, m[2] = {0, 0}, v[2] = {0, 0};
  const double g1[2] = {0.5, -0.125}, g2[2] = {-0.25, 0.375};
  ops::ref::adamw_update<double>(p, g1, m, v, 2, 0.1, 0.9, 0.99, 1e-8, 0.01, 2.0, 1);
  EXPECT_NEAR(p[0], 0.8990000009999999900000001, 1e-15);
  EXPECT_NEAR(p[1], -1.898000003999999840000006, 1e-15);
  EXPECT_NEAR(m[0], 0.1, 1e-16);
  EXPECT_NEAR(v[0], 0.01, 1e-17);
  EXPECT_NEAR(m[1], -0.025, 1e-17);
  EXPECT_NEAR(v[1], 0.000625, 1e-18);
  ops::ref::adamw_update<double>(p, g2, m, v, 2, 0.1, 0.9, 0.99, 1e-8, 0.01, 2.0, 2);
  EXPECT_NEAR(p[0], 0.8714310584290727300142194, 1e-14);
  EXPECT_NEAR(p[1], -1.945431818243479898361353, 1e-14);
  EXPECT_NEAR(m[0], 0.04, 1e-16);
  EXPECT_NEAR(v[0], 0.0124, 1e-16);
  EXPECT_NEAR(m[1], 0.0525, 1e-16);
  EXPECT_NEAR(v[1], 0.00624375, 1e-17);
}

// A benchmark, not a test (it reports and cannot fail, so it does not run with the tests): the
// kernel against the reference and against memory bandwidth (AdamW moves 28 bytes per element, 16
// read and 12 written). Medians of 7.
//   build/tests/ops_test_adamw --gtest_also_run_disabled_tests --gtest_filter='*BenchTiming'
TEST(AdamwUpdate, DISABLED_BenchTiming) {
  const int64_t n = int64_t{1} << 22;
  State s = state_random(n, 3);
  Hyper h;
  auto median_seconds = [](auto&& fn) {
    std::vector<double> t;
    for (int r = 0; r < 7; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  int64_t step = 0;
  const double fast_s = median_seconds([&] { fast_step(s, h, ++step); });
  step = 0;
  const double ref_s = median_seconds([&] { ref_step(s, h, ++step); });
  // The physical limit: a loop with AdamW's traffic (read param, grad, m, v; write param, m, v) and no
  // arithmetic to speak of, on the same threads.
  const double stream_s = median_seconds([&] {
    float* p = s.param.data();
    const float* g = s.grad.data();
    float* m = s.m.data();
    float* v = s.v.data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      p[i] += g[i];
      m[i] -= g[i];
      v[i] += p[i];
    }
  });
  for (ops::cpu::AdamwPath p : {ops::cpu::AdamwPath::AdamwPath_scalar, ops::cpu::AdamwPath::AdamwPath_sse,
                                ops::cpu::AdamwPath::AdamwPath_avx2}) {
    if (!ops::cpu::adamw_path_available(p)) continue;
    step = 0;
    const double t = median_seconds([&] {
      ops::cpu::adamw_update_path(p, s.param.data(), s.grad.data(), s.m.data(), s.v.data(), n, h.at(++step), nullptr);
    });
    std::printf("adamw_update path %s: %.3f ms (%.1f Mparams/s)\n", std::string(ops::cpu::adamw_path_name(p)).c_str(),
                t * 1e3, n / t / 1e6);
  }
  // Mixed precision (Note [AdamW with bf16 operands]): a bf16 gradient (2 bytes read instead of 4) and a
  // bf16 working copy refreshed (2 more written): 28 bytes per element again.
  {
    const std::vector<bf16> g = to_bf16(s.grad);
    std::vector<bf16> copy(static_cast<size_t>(n));
    step = 0;
    const double t = median_seconds([&] {
      ops::cpu::adamw_update(s.param.data(), g.data(), s.m.data(), s.v.data(), n, h.at(++step), copy.data());
    });
    std::printf("adamw_update bf16 grad + bf16 copy: %.3f ms (%.1f Mparams/s, %.1f GB/s)\n", t * 1e3, n / t / 1e6,
                28.0 * n / t / 1e9);
  }
  const double fast_gbs = 28.0 * n / fast_s / 1e9;
  const double stream_gbs = 28.0 * n / stream_s / 1e9;
  std::printf(
      "adamw_update n=%lld threads=%d: fast %.3f ms (%.1f Mparams/s, %.1f GB/s), ref %.3f ms "
      "(%.1f Mparams/s), fast/ref %.2fx; same-traffic stream loop %.1f GB/s, fast at %.0f%% of it\n",
      static_cast<long long>(n), omp_get_max_threads(), fast_s * 1e3, n / fast_s / 1e6, fast_gbs, ref_s * 1e3,
      n / ref_s / 1e6, ref_s / fast_s, stream_gbs, 100.0 * fast_gbs / stream_gbs);
}

}  // namespace fp
