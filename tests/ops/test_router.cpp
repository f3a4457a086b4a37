// MoE router: the cpu kernels against ref<float>, the top-k contract (the k largest, descending,
// ties to the lower id), the ref<double> backward against central finite differences, and bitwise
// determinism across thread counts.
// n tokens, E experts, k experts per token.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/cpu/kernels/ops.h"
#include "core/rng.h"
#include "op_test.h"
#include "ops/ref/router.h"
#include "ops/router.h"

namespace {

// Element by element; NaN/Inf never pass. Every value compared here is O(1) (probs <= 1, weights
// <= 1, d_topk_w and the bias ~N(0, 1), so each dlogit is p times a difference of O(1) terms) and
// each kernel value is a handful of float roundings away from the reference, so an absolute-plus-
// relative 1e-5 is ~100 float ulps of slack and still catches any wrong term.
fp::op_test::Tol router_tol() { return fp::op_test::tol_abs_rel(1e-5); }

std::vector<int64_t> k_values(int64_t E) {
  std::vector<int64_t> ks = {1, 2, E};
  ks.erase(std::remove_if(ks.begin(), ks.end(), [&](int64_t k) { return k > E; }), ks.end());
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
  return ks;
}

// The top-k contract on one output: distinct ids in range, descending probability with ties to the
// lower id, and no unchosen expert ahead of the last chosen one in that order.
void expect_topk_contract(const float* probs, const int32_t* idx, int64_t n, int64_t E, int64_t k) {
  auto before = [](float pa, int32_t a, float pb, int32_t b) { return pa > pb || (pa == pb && a < b); };
  for (int64_t t = 0; t < n; ++t) {
    const float* p = probs + t * E;
    const int32_t* id = idx + t * k;
    std::vector<char> chosen(static_cast<size_t>(E), 0);
    for (int64_t j = 0; j < k; ++j) {
      ASSERT_TRUE(id[j] >= 0 && id[j] < E) << "token " << t << " slot " << j << ": id " << id[j];
      ASSERT_FALSE(chosen[id[j]]) << "token " << t << ": expert " << id[j] << " chosen twice";
      chosen[id[j]] = 1;
      if (j > 0) {
        EXPECT_TRUE(before(p[id[j - 1]], id[j - 1], p[id[j]], id[j]))
            << "token " << t << " slots " << j - 1 << "," << j << ": (" << p[id[j - 1]] << ", " << id[j - 1]
            << ") then (" << p[id[j]] << ", " << id[j] << ")";
      }
    }
    for (int64_t e = 0; e < E; ++e) {
      if (chosen[e]) continue;
      EXPECT_TRUE(before(p[id[k - 1]], id[k - 1], p[e], static_cast<int32_t>(e)))
          << "token " << t << ": unchosen expert " << e << " (p " << p[e] << ") beats chosen " << id[k - 1] << " (p "
          << p[id[k - 1]] << ")";
    }
  }
}

TEST(Router, ForwardBackwardMatchRef) {
  fp::Rng rng(11);
  for (int64_t E : {1, 2, 7, 8, 16, 17, 64, 65, 128})
    for (int64_t k : k_values(E))
      for (int64_t n : {1, 3, 33, 129})
        for (bool norm : {false, true})
          for (bool bias : {false, true}) {
            SCOPED_TRACE(testing::Message()
                         << "E=" << E << " k=" << k << " n=" << n << " norm=" << norm << " bias=" << bias);
            const auto logits = fp::op_test::random_vector(n * E, rng, 2.0);
            std::vector<float> p_ref(n * E), p_cpu(n * E), w_ref(n * k), w_cpu(n * k);
            std::vector<int32_t> i_ref(n * k), i_cpu(n * k);
            fp::ops::ref::router_forward(logits.data(), p_ref.data(), i_ref.data(), w_ref.data(), {n, E, k, norm});
            fp::ops::cpu::router_forward(logits.data(), p_cpu.data(), i_cpu.data(), w_cpu.data(), {n, E, k, norm});
            EXPECT_TRUE(fp::op_test::near("router probs", {n, E}, p_cpu.data(), p_ref.data(), n * E, router_tol()));
            // The same arithmetic gives the same choice (Note [Router sums in double]).
            for (int64_t i = 0; i < n * k; ++i)
              ASSERT_EQ(i_cpu[i], i_ref[i]) << "topk_idx[" << i << "] (token " << i / k << ")";
            EXPECT_TRUE(fp::op_test::near("router topk_w", {n, k}, w_cpu.data(), w_ref.data(), n * k, router_tol()));
            expect_topk_contract(p_cpu.data(), i_cpu.data(), n, E, k);
            for (int64_t t = 0; t < n; ++t) {
              double s = 0;
              for (int64_t e = 0; e < E; ++e) s += p_cpu[t * E + e];
              EXPECT_NEAR(s, 1.0, 1e-6) << "token " << t << ": probs sum";
            }

            const auto dw = fp::op_test::random_vector(n * k, rng, 1.0);
            const auto db = fp::op_test::random_vector(E, rng, 1.0);
            std::vector<float> dl_ref(n * E), dl_cpu(n * E, NAN);  // NaN: every element must be overwritten
            fp::ops::ref::router_backward(p_ref.data(), i_ref.data(), dw.data(), bias ? db.data() : nullptr,
                                          dl_ref.data(), {n, E, k, norm});
            fp::ops::cpu::router_backward(p_cpu.data(), i_cpu.data(), dw.data(), bias ? db.data() : nullptr,
                                          dl_cpu.data(), {n, E, k, norm});
            EXPECT_TRUE(fp::op_test::near("router dlogits", {n, E}, dl_cpu.data(), dl_ref.data(), n * E, router_tol()));
          }
}

// A routing profile's choice, with repeated experts in a token (hot(r, h) with h < k does that).
TEST(Router, GatherAndBackwardWithGivenChoiceMatchRef) {
  fp::Rng rng(12);
  for (int64_t E : {1, 3, 8, 17})
    for (int64_t k : {1, 2, 4, 9})
      for (bool norm : {false, true}) {
        SCOPED_TRACE(testing::Message() << "E=" << E << " k=" << k << " norm=" << norm);
        const int64_t n = 31;
        const auto logits = fp::op_test::random_vector(n * E, rng, 1.5);
        std::vector<float> probs(n * E), w0(n);
        std::vector<int32_t> i0(n);
        fp::ops::ref::router_forward(logits.data(), probs.data(), i0.data(), w0.data(), {n, E, 1, false});
        std::vector<int32_t> idx(n * k);
        for (auto& x : idx) x = static_cast<int32_t>(rng.below(E));
        std::vector<float> w_ref(n * k), w_cpu(n * k, NAN);
        fp::ops::ref::router_gather(probs.data(), idx.data(), w_ref.data(), {n, E, k, norm});
        fp::ops::cpu::router_gather(probs.data(), idx.data(), w_cpu.data(), {n, E, k, norm});
        EXPECT_TRUE(fp::op_test::near("router topk_w", {n, k}, w_cpu.data(), w_ref.data(), n * k, router_tol()));
        const auto dw = fp::op_test::random_vector(n * k, rng, 1.0);
        const auto db = fp::op_test::random_vector(E, rng, 1.0);
        std::vector<float> dl_ref(n * E), dl_cpu(n * E, NAN);
        fp::ops::ref::router_backward(probs.data(), idx.data(), dw.data(), db.data(), dl_ref.data(), {n, E, k, norm});
        fp::ops::cpu::router_backward(probs.data(), idx.data(), dw.data(), db.data(), dl_cpu.data(), {n, E, k, norm});
        EXPECT_TRUE(fp::op_test::near("router dlogits", {n, E}, dl_cpu.data(), dl_ref.data(), n * E, router_tol()));
      }
}

TEST(Router, TiesGoToTheLowerExpertId) {
  // Equal logits give bitwise equal probabilities, so these are exact ties.
  const int64_t E = 6, k = 3, n = 4;
  const std::vector<float> logits = {
      0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f,   // all equal: 0, 1, 2
      1.0f, 3.0f, 3.0f, 2.0f, 3.0f, 2.0f,   // three-way tie on top: 1, 2, 4
      -1.f, 2.0f, 0.0f, 2.0f, 0.0f, 0.0f,   // tie on top, then a three-way tie for the last slot: 1, 3, 2
      4.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};  // a clear winner, then ties: 0, 1, 2
  const std::vector<int32_t> want = {0, 1, 2, 1, 2, 4, 1, 3, 2, 0, 1, 2};
  for (int impl = 0; impl < 2; ++impl) {
    std::vector<float> probs(n * E), w(n * k);
    std::vector<int32_t> idx(n * k);
    if (impl == 0)
      fp::ops::ref::router_forward(logits.data(), probs.data(), idx.data(), w.data(), {n, E, k, true});
    else
      fp::ops::cpu::router_forward(logits.data(), probs.data(), idx.data(), w.data(), {n, E, k, true});
    for (int64_t i = 0; i < n * k; ++i)
      EXPECT_EQ(idx[i], want[i]) << (impl ? "cpu" : "ref") << " token " << i / k << " slot " << i % k;
    // Renormalised weights of tied experts are equal and sum to 1.
    EXPECT_EQ(w[0], w[1]);
    EXPECT_NEAR(w[0] + w[1] + w[2], 1.0f, 1e-6f);
  }
}

TEST(Router, ChosenExpertsAreTheKLargest) {
  fp::Rng rng(13);
  for (int64_t E : {2, 7, 8, 17, 64, 128})
    for (int64_t k : {int64_t{1}, int64_t{2}, std::min<int64_t>(E, 6), std::min<int64_t>(E, 8), E}) {
      SCOPED_TRACE(testing::Message() << "E=" << E << " k=" << k);
      const int64_t n = 65;
      auto logits = fp::op_test::random_vector(n * E, rng, 1.0);
      // Quantised logits make ties common, so the tie order is exercised too.
      for (int64_t i = 0; i < n * E / 2; ++i) logits[i] = std::round(logits[i] * 2.0f) * 0.5f;
      std::vector<float> probs(n * E), w(n * k);
      std::vector<int32_t> idx(n * k);
      fp::ops::cpu::router_forward(logits.data(), probs.data(), idx.data(), w.data(), {n, E, k, false});
      expect_topk_contract(probs.data(), idx.data(), n, E, k);
      // Independently: the chosen set is the first k of a stable sort by descending probability.
      for (int64_t t = 0; t < n; ++t) {
        std::vector<int32_t> order(E);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int32_t a, int32_t b) { return probs[t * E + a] > probs[t * E + b]; });
        for (int64_t j = 0; j < k; ++j) EXPECT_EQ(idx[t * k + j], order[j]) << "token " << t << " slot " << j;
      }
    }
}

// L = sum_{t,j} r[t,j] topk_w[t,j] + sum_{t,e} b[e] probs[t,e], in double.
double router_loss(const std::vector<double>& logits, const std::vector<double>& r, const std::vector<double>& b,
                   const int32_t* fixed_idx, std::vector<int32_t>* idx_out, int64_t n, int64_t E, int64_t k, bool norm,
                   bool use_bias) {
  std::vector<double> probs(n * E), w(n * k);
  std::vector<int32_t> idx(n * k);
  if (fixed_idx) {
    std::vector<double> w1(n);
    std::vector<int32_t> i1(n);
    fp::ops::ref::router_forward(logits.data(), probs.data(), i1.data(), w1.data(), {n, E, 1, false});
    fp::ops::ref::router_gather(probs.data(), fixed_idx, w.data(), {n, E, k, norm});
  } else {
    fp::ops::ref::router_forward(logits.data(), probs.data(), idx.data(), w.data(), {n, E, k, norm});
    if (idx_out) *idx_out = idx;
  }
  double L = 0;
  for (int64_t i = 0; i < n * k; ++i) L += r[i] * w[i];
  if (use_bias)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t e = 0; e < E; ++e) L += b[e] * probs[t * E + e];
  return L;
}

// dlogits of ref<double> against central differences. The logits of each row are a shuffled ladder
// (steps of 0.25 +- 0.05, squeezed by 8/E for E > 8 so the softmax keeps every expert well above
// underflow), so a 1e-5 perturbation cannot change the top-k choice (checked anyway);
// with fixed_choice the experts are given (random, with repeats), as with a routing profile.
void check_router_fd(int64_t E, int64_t k, bool norm, bool use_bias, bool fixed_choice, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "E=" << E << " k=" << k << " norm=" << norm << " bias=" << use_bias
                                  << " fixed=" << fixed_choice);
  fp::Rng rng(seed);
  const int64_t n = 3;
  std::vector<double> logits(n * E), r(n * k), b(E);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int64_t> perm(E);
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t e = E - 1; e > 0; --e) std::swap(perm[e], perm[rng.below(e + 1)]);
    for (int64_t e = 0; e < E; ++e) logits[t * E + e] = 0.25 * (perm[e] - E / 2.0) + 0.05 * rng.uniform();
    if (E > 8)
      for (int64_t e = 0; e < E; ++e) logits[t * E + e] *= 8.0 / E;
  }
  for (auto& x : r) x = rng.normal();
  for (auto& x : b) x = rng.normal();
  std::vector<int32_t> given(n * k);
  for (auto& x : given) x = static_cast<int32_t>(rng.below(E));
  const int32_t* fixed = fixed_choice ? given.data() : nullptr;

  std::vector<double> probs(n * E), w(n * k), dl(n * E);
  std::vector<int32_t> idx(n * k);
  if (fixed) {
    std::vector<double> w1(n);
    std::vector<int32_t> i1(n);
    fp::ops::ref::router_forward(logits.data(), probs.data(), i1.data(), w1.data(), {n, E, 1, false});
    idx = given;
  } else {
    fp::ops::ref::router_forward(logits.data(), probs.data(), idx.data(), w.data(), {n, E, k, norm});
  }
  fp::ops::ref::router_backward(probs.data(), idx.data(), r.data(), use_bias ? b.data() : nullptr, dl.data(),
                                {n, E, k, norm});
  const double eps = 1e-5;
  for (int64_t i = 0; i < n * E; ++i) {
    std::vector<double> lp = logits, lm = logits;
    lp[i] += eps;
    lm[i] -= eps;
    std::vector<int32_t> ip, im;
    const double fd = (router_loss(lp, r, b, fixed, &ip, n, E, k, norm, use_bias) -
                       router_loss(lm, r, b, fixed, &im, n, E, k, norm, use_bias)) /
                      (2 * eps);
    if (!fixed) {
      ASSERT_EQ(ip, idx) << "perturbing logit " << i << " changed the choice";
      ASSERT_EQ(im, idx) << "perturbing logit " << i << " changed the choice";
    }
    EXPECT_TRUE(std::isfinite(dl[i]));
    EXPECT_LE(std::fabs(fd - dl[i]), 1e-7 * std::max(1.0, std::fabs(fd)))
        << "dlogits[" << i << "]: finite difference " << fd << ", backward " << dl[i];
  }
}

TEST(Router, BackwardMatchesFiniteDifferences) {
  uint64_t seed = 100;
  for (int64_t E : {1, 2, 7, 8, 16, 17, 64})
    for (int64_t k : k_values(E))
      for (bool norm : {false, true})
        for (bool bias : {false, true}) check_router_fd(E, k, norm, bias, false, seed++);
}

TEST(Router, BackwardThroughGivenChoiceMatchesFiniteDifferences) {
  uint64_t seed = 200;
  for (int64_t E : {1, 3, 8})
    for (int64_t k : {1, 2, 5})
      for (bool norm : {false, true})
        for (bool bias : {false, true}) check_router_fd(E, k, norm, bias, true, seed++);
}

TEST(Router, BitwiseDeterministicAcrossThreadCounts) {
  fp::Rng rng(14);
  const int64_t n = 1001, E = 64, k = 8;
  const auto logits = fp::op_test::random_vector(n * E, rng, 2.0);
  const auto dw = fp::op_test::random_vector(n * k, rng, 1.0);
  const auto db = fp::op_test::random_vector(E, rng, 1.0);
  const int saved = omp_get_max_threads();
  struct Out {
    std::vector<float> p, w, wg, dl;
    std::vector<int32_t> idx;
  };
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    Out o{std::vector<float>(n * E), std::vector<float>(n * k), std::vector<float>(n * k), std::vector<float>(n * E),
          std::vector<int32_t>(n * k)};
    fp::ops::cpu::router_forward(logits.data(), o.p.data(), o.idx.data(), o.w.data(), {n, E, k, true});
    fp::ops::cpu::router_gather(o.p.data(), o.idx.data(), o.wg.data(), {n, E, k, true});
    fp::ops::cpu::router_backward(o.p.data(), o.idx.data(), dw.data(), db.data(), o.dl.data(), {n, E, k, true});
    return o;
  };
  const Out a = run(1), b = run(2), c = run(2);
  omp_set_num_threads(saved);
  for (const Out* o : {&b, &c}) {
    EXPECT_EQ(0, std::memcmp(a.p.data(), o->p.data(), a.p.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(a.idx.data(), o->idx.data(), a.idx.size() * sizeof(int32_t)));
    EXPECT_EQ(0, std::memcmp(a.w.data(), o->w.data(), a.w.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(a.wg.data(), o->wg.data(), a.wg.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(a.dl.data(), o->dl.data(), a.dl.size() * sizeof(float)));
  }
  // The gather of the chosen experts reproduces the forward's weights exactly.
  EXPECT_EQ(0, std::memcmp(a.w.data(), a.wg.data(), a.w.size() * sizeof(float)));
}

// ---- DeepSeek-V3's sigmoid router (Note [Sigmoid routing] in ops/router.h)

struct GroupCase {
  int64_t E, k, n_group, topk_group;
};
const GroupCase kGroupCases[] = {{2, 1, 1, 1},  {8, 2, 1, 1},  {8, 2, 4, 2},  {16, 4, 4, 1},
                                 {16, 8, 4, 2}, {64, 8, 8, 4}, {24, 6, 3, 3}, {256, 8, 8, 4}};

TEST(RouterSigmoid, ForwardBackwardMatchRef) {
  fp::Rng rng(31);
  for (const GroupCase& g : kGroupCases)
    for (int64_t n : {1, 5, 130})
      for (bool norm : {false, true})
        for (float scaling : {1.0f, 2.5f}) {
          SCOPED_TRACE(testing::Message() << "E=" << g.E << " k=" << g.k << " groups=" << g.n_group << "/"
                                          << g.topk_group << " n=" << n << " norm=" << norm << " r=" << scaling);
          const fp::ops::RouterSpec rs{n, g.E, g.k, norm, g.n_group, g.topk_group, scaling};
          const auto logits = fp::op_test::random_vector(n * g.E, rng, 2.0);
          const auto bias = fp::op_test::random_vector(g.E, rng, 0.3);
          std::vector<float> s_ref(n * g.E), s_cpu(n * g.E), w_ref(n * g.k), w_cpu(n * g.k);
          std::vector<int32_t> i_ref(n * g.k), i_cpu(n * g.k);
          fp::ops::ref::router_sigmoid_forward(logits.data(), bias.data(), s_ref.data(), i_ref.data(), w_ref.data(),
                                               rs);
          fp::ops::cpu::router_sigmoid_forward(logits.data(), bias.data(), s_cpu.data(), i_cpu.data(), w_cpu.data(),
                                               rs);
          EXPECT_TRUE(fp::op_test::near("router scores", {n, g.E}, s_cpu.data(), s_ref.data(), n * g.E, router_tol()));
          for (int64_t i = 0; i < n * g.k; ++i) ASSERT_EQ(i_cpu[i], i_ref[i]) << "topk_idx[" << i << "]";
          EXPECT_TRUE(fp::op_test::near("router topk_w", {n, g.k}, w_cpu.data(), w_ref.data(), n * g.k, router_tol()));
          // The weights are r s at the chosen experts, summing to r with norm.
          for (int64_t t = 0; t < n && norm; ++t) {
            double sum = 0;
            for (int64_t j = 0; j < g.k; ++j) sum += w_cpu[t * g.k + j];
            EXPECT_NEAR(sum, scaling, 1e-5 * scaling) << "token " << t;
          }
          const auto dw = fp::op_test::random_vector(n * g.k, rng, 1.0);
          std::vector<float> dl_ref(n * g.E), dl_cpu(n * g.E, NAN);
          fp::ops::ref::router_sigmoid_backward(s_ref.data(), i_ref.data(), dw.data(), dl_ref.data(), rs);
          fp::ops::cpu::router_sigmoid_backward(s_cpu.data(), i_cpu.data(), dw.data(), dl_cpu.data(), rs);
          EXPECT_TRUE(
              fp::op_test::near("router dlogits", {n, g.E}, dl_cpu.data(), dl_ref.data(), n * g.E, router_tol()));
          std::vector<float> wg(n * g.k, NAN);
          fp::ops::cpu::router_sigmoid_gather(s_cpu.data(), i_cpu.data(), wg.data(), rs);
          EXPECT_EQ(0, std::memcmp(wg.data(), w_cpu.data(), wg.size() * sizeof(float)))
              << "the gather of the chosen experts reproduces the forward's weights";
        }
}

// The contract on hand-made rows: the bias moves the choice but not the weights; a group with one strong
// expert loses to a group whose two best are stronger together; ties go to the lower index.
TEST(RouterSigmoid, GroupsAndBiasChooseAsDeepSeekDoes) {
  const int64_t E = 8, k = 2, n_group = 4, topk_group = 1;  // groups {0,1} {2,3} {4,5} {6,7}
  auto logit = [](double p) { return static_cast<float>(std::log(p / (1 - p))); };
  // Expert 0 scores 0.9 but its partner 0.1 (group sum 1.0); group {4,5} scores 0.6 + 0.6 = 1.2.
  std::vector<float> x = {logit(0.9), logit(0.1), logit(0.2), logit(0.2),
                          logit(0.6), logit(0.6), logit(0.3), logit(0.3)};
  std::vector<float> bias(E, 0.0f), s(E), w(k);
  std::vector<int32_t> idx(k);
  fp::ops::cpu::router_sigmoid_forward(x.data(), bias.data(), s.data(), idx.data(), w.data(),
                                       {1, E, k, false, n_group, topk_group, 1.0f});
  EXPECT_EQ(idx, (std::vector<int32_t>{4, 5})) << "the group of the two best together, not of the best one";
  EXPECT_NEAR(w[0], 0.6, 1e-6);
  // A bias on expert 1 lifts group {0,1} to 0.9 + 0.1 + 0.5 = 1.5: it wins, and the weights stay the scores.
  bias[1] = 0.5f;
  fp::ops::cpu::router_sigmoid_forward(x.data(), bias.data(), s.data(), idx.data(), w.data(),
                                       {1, E, k, false, n_group, topk_group, 1.0f});
  EXPECT_EQ(idx, (std::vector<int32_t>{0, 1}));
  EXPECT_NEAR(w[0], 0.9, 1e-6);
  EXPECT_NEAR(w[1], 0.1, 1e-6) << "the bias chooses; the weight is the unbiased score";
  // Equal logits everywhere: groups 0 and then experts 0, 1 (lower indices on ties).
  std::vector<float> flat(E, 0.25f), b0(E, 0.0f);
  fp::ops::cpu::router_sigmoid_forward(flat.data(), b0.data(), s.data(), idx.data(), w.data(),
                                       {1, E, k, true, n_group, 2, 2.5f});
  EXPECT_EQ(idx, (std::vector<int32_t>{0, 1}));
  EXPECT_FLOAT_EQ(w[0], 1.25f) << "renormalised, times routed_scaling_factor";
}

// ref<double>'s backward against central differences of L = sum r_j w_j, with the choice held (the
// logits are a ladder, so a 1e-6 step cannot reorder them; checked).
TEST(RouterSigmoid, BackwardMatchesFiniteDifferences) {
  fp::Rng rng(32);
  for (const GroupCase& g : kGroupCases)
    for (bool norm : {false, true}) {
      if (g.E > 64) continue;
      SCOPED_TRACE(testing::Message() << "E=" << g.E << " k=" << g.k << " norm=" << norm);
      const int64_t n = 2, E = g.E, k = g.k;
      const fp::ops::RouterSpec rs{n, E, k, norm, g.n_group, g.topk_group, 2.5f};
      std::vector<double> logits(n * E), bias(E), r(n * k);
      for (int64_t t = 0; t < n; ++t) {
        std::vector<int64_t> perm(E);
        std::iota(perm.begin(), perm.end(), 0);
        for (int64_t e = E - 1; e > 0; --e) std::swap(perm[e], perm[rng.below(e + 1)]);
        for (int64_t e = 0; e < E; ++e) logits[t * E + e] = 4.0 * (perm[e] - E / 2.0) / E + 0.01 * rng.uniform();
      }
      for (auto& b : bias) b = 0.01 * rng.normal();
      for (auto& v : r) v = rng.normal();
      auto loss = [&](const std::vector<double>& x, std::vector<int32_t>* idx_out) {
        std::vector<double> s(n * E), w(n * k);
        std::vector<int32_t> idx(n * k);
        fp::ops::ref::router_sigmoid_forward(x.data(), bias.data(), s.data(), idx.data(), w.data(), rs);
        if (idx_out) *idx_out = idx;
        double L = 0;
        for (int64_t i = 0; i < n * k; ++i) L += r[i] * w[i];
        return L;
      };
      std::vector<double> s(n * E), w(n * k), dl(n * E);
      std::vector<int32_t> idx(n * k);
      fp::ops::ref::router_sigmoid_forward(logits.data(), bias.data(), s.data(), idx.data(), w.data(), rs);
      fp::ops::ref::router_sigmoid_backward(s.data(), idx.data(), r.data(), dl.data(), rs);
      const double eps = 1e-6;
      for (int64_t i = 0; i < n * E; ++i) {
        std::vector<double> lp = logits, lm = logits;
        lp[i] += eps;
        lm[i] -= eps;
        std::vector<int32_t> ip, im;
        const double fd = (loss(lp, &ip) - loss(lm, &im)) / (2 * eps);
        ASSERT_EQ(ip, idx) << "perturbing logit " << i << " changed the choice";
        ASSERT_EQ(im, idx);
        EXPECT_LE(std::fabs(fd - dl[i]), 1e-7 * std::max(1.0, std::fabs(fd))) << "dlogits[" << i << "]";
      }
    }
}

TEST(RouterSigmoid, BitwiseDeterministicAcrossThreadCounts) {
  fp::Rng rng(33);
  const int64_t n = 1001, E = 64, k = 8;
  const auto logits = fp::op_test::random_vector(n * E, rng, 2.0);
  const auto bias = fp::op_test::random_vector(E, rng, 0.1);
  const auto dw = fp::op_test::random_vector(n * k, rng, 1.0);
  const fp::ops::RouterSpec rs{n, E, k, true, 8, 4, 2.5f};
  const int saved = omp_get_max_threads();
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    std::vector<float> s(n * E), w(n * k), dl(n * E);
    std::vector<int32_t> idx(n * k);
    fp::ops::cpu::router_sigmoid_forward(logits.data(), bias.data(), s.data(), idx.data(), w.data(), rs);
    fp::ops::cpu::router_sigmoid_backward(s.data(), idx.data(), dw.data(), dl.data(), rs);
    std::vector<float> all = s;
    all.insert(all.end(), w.begin(), w.end());
    all.insert(all.end(), dl.begin(), dl.end());
    for (int32_t i : idx) all.push_back(static_cast<float>(i));
    return all;
  };
  const auto a = run(1), b = run(2);
  omp_set_num_threads(saved);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

}  // namespace
