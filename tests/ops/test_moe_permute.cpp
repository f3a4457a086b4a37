// Token permutation ops: the cpu kernels against ref<float>, the ref<double> combine backward against
// central finite differences, gather and scatter-add as adjoints, the scatter as the gather's inverse,
// and bitwise determinism across
// thread counts. The permutation is built here with std::stable_sort (independently of
// moe_routing_build), from random top-k choices that leave one expert without tokens.
// n tokens, k slots per token, m = n * k copies, E experts, H hidden.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/rng.h"
#include "op_test.h"
#include "ops/moe_permute.h"
#include "ops/ref/moe_permute.h"

namespace {

struct Routing {
  std::vector<int32_t> rows;      // (m)
  std::vector<int32_t> slot_pos;  // (n, k)
};

// Distinct experts per token drawn from [0, E) without expert `empty`, copies stably sorted by expert.
Routing routing_random(fp::Rng& rng, int64_t n, int64_t k, int64_t E, int64_t empty) {
  std::vector<int32_t> idx(n * k);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> pool;
    for (int32_t e = 0; e < E; ++e)
      if (e != empty) pool.push_back(e);
    for (int64_t j = 0; j < k; ++j) {  // partial Fisher-Yates: k distinct experts in random order
      const int64_t pick = j + static_cast<int64_t>(rng.below(pool.size() - j));
      std::swap(pool[j], pool[pick]);
      idx[t * k + j] = pool[j];
    }
  }
  std::vector<int32_t> copies(n * k);  // copy c = t * k + j
  std::iota(copies.begin(), copies.end(), 0);
  std::stable_sort(copies.begin(), copies.end(), [&](int32_t a, int32_t b) { return idx[a] < idx[b]; });
  Routing r{std::vector<int32_t>(n * k), std::vector<int32_t>(n * k)};
  for (int64_t i = 0; i < n * k; ++i) {
    r.rows[i] = static_cast<int32_t>(copies[i] / k);
    r.slot_pos[copies[i]] = static_cast<int32_t>(i);
  }
  return r;
}

const int64_t kH[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 65, 127, 129};

TEST(MoePermute, GatherAndScatterAddMatchRef) {
  fp::Rng rng(21);
  for (int64_t H : kH)
    for (int64_t n : {1, 13, 37})
      for (int64_t k : {1, 2, 4}) {
        SCOPED_TRACE(testing::Message() << "H=" << H << " n=" << n << " k=" << k);
        const int64_t E = 8, m = n * k;
        const Routing r = routing_random(rng, n, k, E, 3);
        const auto x = fp::op_test::random_vector<float>(n * H, rng);
        std::vector<float> xs_ref(m * H), xs_cpu(m * H, NAN);
        fp::ops::ref::moe_gather(x.data(), r.rows.data(), xs_ref.data(), m, H);
        fp::ops::cpu::moe_gather(x.data(), r.rows.data(), xs_cpu.data(), m, H);
        // A copy: exact.
        EXPECT_TRUE(fp::op_test::near("xs", {m, H}, xs_cpu, xs_ref, fp::op_test::tol_exact()));

        const auto dxs = fp::op_test::random_vector<float>(m * H, rng);
        auto dx_ref = fp::op_test::random_vector<float>(n * H, rng);
        auto dx_cpu = dx_ref;
        // |error| <= k eps (|dx| + sum_j |dxs_j|): k float additions, each rounding once.
        std::vector<double> bound(n * H);
        for (int64_t t = 0; t < n; ++t)
          for (int64_t h = 0; h < H; ++h) {
            double mag = std::fabs(dx_ref[t * H + h]);
            for (int64_t j = 0; j < k; ++j) mag += std::fabs(dxs[r.slot_pos[t * k + j] * H + h]);
            bound[t * H + h] = 2.0 * k * FLT_EPSILON * mag;
          }
        fp::ops::ref::moe_scatter_add(dxs.data(), r.slot_pos.data(), dx_ref.data(), n, k, H);
        fp::ops::cpu::moe_scatter_add(dxs.data(), r.slot_pos.data(), dx_cpu.data(), n, k, H);
        EXPECT_TRUE(fp::op_test::near("dx", {n, H}, dx_cpu, dx_ref, fp::op_test::tol_each(bound)));
      }
}

// moe_scatter, moe_gather's inverse: a copy into the named rows (exact), the other rows untouched; the
// rows of one chunk of a plan (a subset of the destination's rows, in any order) as pipelined_llep uses it.
TEST(MoePermute, ScatterMatchesRefAndInvertsGather) {
  fp::Rng rng(26);
  for (int64_t H : kH)
    for (int64_t n : {1, 13, 37})
      for (int64_t k : {1, 2, 4}) {
        SCOPED_TRACE(testing::Message() << "H=" << H << " n=" << n << " k=" << k);
        const int64_t E = 8, m = n * k;
        const Routing r = routing_random(rng, n, k, E, 2);
        // Destination rows: a random permutation of [0, m), of which the first m_i are written.
        std::vector<int32_t> dest(m);
        std::iota(dest.begin(), dest.end(), 0);
        for (int64_t i = m - 1; i > 0; --i) std::swap(dest[i], dest[rng.below(i + 1)]);
        for (int64_t mi : {m, (m + 1) / 2}) {
          const auto src = fp::op_test::random_vector<float>(mi * H, rng);
          auto dst_ref = fp::op_test::random_vector<float>(m * H, rng);
          auto dst_cpu = dst_ref;
          fp::ops::ref::moe_scatter(src.data(), dest.data(), dst_ref.data(), mi, H);
          fp::ops::cpu::moe_scatter(src.data(), dest.data(), dst_cpu.data(), mi, H);
          EXPECT_EQ(std::memcmp(dst_cpu.data(), dst_ref.data(), dst_ref.size() * sizeof(float)), 0) << "mi=" << mi;
        }
        // scatter(gather(x)) by the routing's rows restores the rows of x that are routed (k = 1: all).
        if (k == 1) {
          const auto x = fp::op_test::random_vector<float>(n * H, rng);
          std::vector<float> xs(m * H), back(n * H, NAN);
          fp::ops::cpu::moe_gather(x.data(), r.rows.data(), xs.data(), m, H);
          fp::ops::cpu::moe_scatter(xs.data(), r.rows.data(), back.data(), m, H);
          EXPECT_TRUE(fp::op_test::near("x", {n, H}, back, x, fp::op_test::tol_exact()));
        }
      }
}

TEST(MoePermute, CombineMatchesRef) {
  fp::Rng rng(22);
  for (int64_t H : kH)
    for (int64_t n : {1, 13, 37})
      for (int64_t k : {1, 2, 4}) {
        SCOPED_TRACE(testing::Message() << "H=" << H << " n=" << n << " k=" << k);
        const int64_t E = 8, m = n * k;
        const Routing r = routing_random(rng, n, k, E, 5);
        const auto ys = fp::op_test::random_vector<float>(m * H, rng);
        std::vector<float> w(n * k);
        for (auto& x : w) x = static_cast<float>(0.05 + rng.uniform());
        auto out_ref = fp::op_test::random_vector<float>(n * H, rng);
        auto out_cpu = out_ref;
        // |error| <= 2 k eps (|out| + sum_j |w_j y_j|): a rounded product and a rounded sum per slot.
        std::vector<double> bound(n * H);
        for (int64_t t = 0; t < n; ++t)
          for (int64_t h = 0; h < H; ++h) {
            double mag = std::fabs(out_ref[t * H + h]);
            for (int64_t j = 0; j < k; ++j) mag += std::fabs(w[t * k + j] * ys[r.slot_pos[t * k + j] * H + h]);
            bound[t * H + h] = 4.0 * k * FLT_EPSILON * mag;
          }
        fp::ops::ref::moe_combine_forward(ys.data(), r.slot_pos.data(), w.data(), out_ref.data(), n, k, H);
        fp::ops::cpu::moe_combine_forward(ys.data(), r.slot_pos.data(), w.data(), out_cpu.data(), n, k, H);
        EXPECT_TRUE(fp::op_test::near("out", {n, H}, out_cpu, out_ref, fp::op_test::tol_each(bound)));

        const auto dout = fp::op_test::random_vector<float>(n * H, rng);
        std::vector<float> dys_ref(m * H), dys_cpu(m * H, NAN), dw_ref(n * k), dw_cpu(n * k, NAN);
        fp::ops::ref::moe_combine_backward(ys.data(), r.slot_pos.data(), w.data(), dout.data(), dys_ref.data(),
                                           dw_ref.data(), n, k, H);
        fp::ops::cpu::moe_combine_backward(ys.data(), r.slot_pos.data(), w.data(), dout.data(), dys_cpu.data(),
                                           dw_cpu.data(), n, k, H);
        // dys is one rounded product (the NaN fill also checks every row is written); dw is a float
        // dot, within H eps sum|dout y| of the exact value, ref<float>'s double dot within one rounding.
        std::vector<double> bound_dys(m * H), bound_dw(n * k);
        for (int64_t i = 0; i < m * H; ++i) bound_dys[i] = FLT_EPSILON * std::fabs(dys_ref[i]);
        for (int64_t t = 0; t < n; ++t)
          for (int64_t j = 0; j < k; ++j) {
            double mag = 0;
            for (int64_t h = 0; h < H; ++h) mag += std::fabs(dout[t * H + h] * ys[r.slot_pos[t * k + j] * H + h]);
            bound_dw[t * k + j] = (H + 1) * FLT_EPSILON * mag;
          }
        EXPECT_TRUE(fp::op_test::near("dys", {m, H}, dys_cpu, dys_ref, fp::op_test::tol_each(bound_dys)));
        EXPECT_TRUE(fp::op_test::near("dw", {n, k}, dw_cpu, dw_ref, fp::op_test::tol_each(bound_dw)));
      }
}

// ref<double>: L = sum r .* out; dL/dys and dL/dw from the backward with dout = r, against central
// differences (L is linear in ys and in w, so only rounding separates them).
TEST(MoePermute, CombineBackwardMatchesFiniteDifferences) {
  fp::Rng rng(23);
  for (int64_t H : {1, 7, 8, 9})
    for (int64_t k : {1, 2, 3}) {
      SCOPED_TRACE(testing::Message() << "H=" << H << " k=" << k);
      const int64_t n = 5, E = 4, m = n * k;
      const Routing r = routing_random(rng, n, k, E, 0);
      auto ys = fp::op_test::random_vector<double>(m * H, rng);
      auto w = fp::op_test::random_vector<double>(n * k, rng);
      const auto out0 = fp::op_test::random_vector<double>(n * H, rng);
      const auto rr = fp::op_test::random_vector<double>(n * H, rng);
      auto loss = [&]() {
        std::vector<double> out = out0;
        fp::ops::ref::moe_combine_forward(ys.data(), r.slot_pos.data(), w.data(), out.data(), n, k, H);
        double L = 0;
        for (int64_t i = 0; i < n * H; ++i) L += rr[i] * out[i];
        return L;
      };
      std::vector<double> dys(m * H), dw(n * k);
      fp::ops::ref::moe_combine_backward(ys.data(), r.slot_pos.data(), w.data(), rr.data(), dys.data(), dw.data(), n, k,
                                         H);
      const double eps = 1e-5;
      auto check = [&](std::vector<double>& v, const std::vector<double>& grad, const char* what) {
        for (size_t i = 0; i < v.size(); ++i) {
          const double fd = fp::op_test::central_difference(v[i], loss, eps);
          EXPECT_LE(std::fabs(fd - grad[i]), 1e-7 * std::max(1.0, std::fabs(fd)))
              << what << "[" << i << "]: finite difference " << fd << ", backward " << grad[i];
        }
      };
      check(ys, dys, "dys");
      check(w, dw, "dw");
    }
}

// <gather(x), g> = <x, scatter_add(g)>: the scatter-add is the gather's backward.
TEST(MoePermute, ScatterAddIsTheGathersAdjoint) {
  fp::Rng rng(24);
  for (int64_t H : {1, 7, 65})
    for (int64_t k : {1, 2, 4}) {
      const int64_t n = 11, E = 6, m = n * k;
      const Routing r = routing_random(rng, n, k, E, 2);
      const auto x = fp::op_test::random_vector<double>(n * H, rng);
      const auto g = fp::op_test::random_vector<double>(m * H, rng);
      std::vector<double> xs(m * H), dx(n * H, 0.0);
      fp::ops::ref::moe_gather(x.data(), r.rows.data(), xs.data(), m, H);
      fp::ops::ref::moe_scatter_add(g.data(), r.slot_pos.data(), dx.data(), n, k, H);
      double a = 0, b = 0;
      for (int64_t i = 0; i < m * H; ++i) a += xs[i] * g[i];
      for (int64_t i = 0; i < n * H; ++i) b += x[i] * dx[i];
      EXPECT_NEAR(a, b, 1e-12 * (1 + std::fabs(a))) << "H=" << H << " k=" << k;
    }
}

TEST(MoePermute, BitwiseDeterministicAcrossThreadCounts) {
  fp::Rng rng(25);
  const int64_t n = 301, k = 4, E = 16, H = 257, m = n * k;
  const Routing r = routing_random(rng, n, k, E, 7);
  const auto x = fp::op_test::random_vector<float>(n * H, rng);
  const auto ys = fp::op_test::random_vector<float>(m * H, rng);
  const auto w = fp::op_test::random_vector<float>(n * k, rng);
  const auto dout = fp::op_test::random_vector<float>(n * H, rng);
  const auto base = fp::op_test::random_vector<float>(n * H, rng);
  struct Out {
    std::vector<float> xs, out, dys, dw, dx, scattered;
  };
  const int saved = omp_get_max_threads();
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    Out o{std::vector<float>(m * H), base, std::vector<float>(m * H), std::vector<float>(n * k), base,
          std::vector<float>(m * H)};
    fp::ops::cpu::moe_gather(x.data(), r.rows.data(), o.xs.data(), m, H);
    fp::ops::cpu::moe_scatter(ys.data(), r.slot_pos.data(), o.scattered.data(), m, H);  // slot_pos: distinct rows
    fp::ops::cpu::moe_combine_forward(ys.data(), r.slot_pos.data(), w.data(), o.out.data(), n, k, H);
    fp::ops::cpu::moe_combine_backward(ys.data(), r.slot_pos.data(), w.data(), dout.data(), o.dys.data(), o.dw.data(),
                                       n, k, H);
    fp::ops::cpu::moe_scatter_add(ys.data(), r.slot_pos.data(), o.dx.data(), n, k, H);
    return o;
  };
  const Out a = run(1), b = run(2), c = run(2);
  omp_set_num_threads(saved);
  auto same = [](const std::vector<float>& u, const std::vector<float>& v) {
    return u.size() == v.size() && std::memcmp(u.data(), v.data(), u.size() * sizeof(float)) == 0;
  };
  for (const Out* o : {&b, &c}) {
    EXPECT_TRUE(same(a.xs, o->xs)) << "moe_gather";
    EXPECT_TRUE(same(a.out, o->out)) << "moe_combine_forward";
    EXPECT_TRUE(same(a.dys, o->dys)) << "moe_combine_backward dys";
    EXPECT_TRUE(same(a.dw, o->dw)) << "moe_combine_backward dw";
    EXPECT_TRUE(same(a.dx, o->dx)) << "moe_scatter_add";
    EXPECT_TRUE(same(a.scattered, o->scattered)) << "moe_scatter";
  }
}

}  // namespace
