// Token permutation ops: the cpu kernels against ref<float>, the ref<double> combine backward against
// central finite differences, gather and scatter-add as adjoints, the scatter as the gather's inverse,
// and bitwise determinism across
// thread counts. The permutation is built here with std::stable_sort (independently of
// moe_routing_build), from random top-k choices that leave one expert without tokens.
// bf16 rows (MoePermuteBf16): the copies bit for bit against ref<bf16>, the arithmetic kernels bit for
// bit against the f32 kernel run on the widened operands and rounded once (bf16_from_float), and
// against ref<float> within the f32 bound plus one bf16 rounding; the rounding-once property by hand.
// n tokens, k slots per token, m = n * k copies, E experts, H hidden.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/cpu/kernels/ops.h"
#include "core/buf.h"
#include "core/error.h"
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

// ---- bf16 rows (Note [Kernel operands carry their dtype], core/buf.h)

using fp::bf16;

const auto to_bf16 = fp::op_test::rounded_bf16;
const auto widen = fp::op_test::widened;
bool same_bits(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16)) == 0;
}

// One operand stored as bf16 or f32, holding the same values either way (random values rounded to
// bf16 once), so a kernel run with either dtype sees the same numbers.
struct Rows {
  std::vector<float> f;  // the values in f32 (the widened bf16)
  std::vector<bf16> h;   // the values in bf16
  bool bf;               // which one the kernel is given
  Rows(const std::vector<float>& x, bool is_bf16) : f(widen(to_bf16(x))), h(to_bf16(x)), bf(is_bf16) {}
  fp::Buf buf() { return bf ? fp::Buf(h.data()) : fp::Buf(f.data()); }
  // The operand's current values (f32).
  std::vector<float> value() const { return bf ? widen(h) : f; }
  // The f32 result `want` as the operand's dtype would hold it: rounded once when bf16.
  std::vector<float> stored(const std::vector<float>& want) const { return bf ? widen(to_bf16(want)) : want; }
};

const char* dt(bool is_bf16) { return is_bf16 ? "bf16" : "f32"; }

// A copy moves bits: bf16 -> bf16 equals ref<bf16> byte for byte (-0, infinity and a NaN payload
// included); bf16 -> f32 is the exact widening; f32 -> bf16 is bf16_from_float of each element.
TEST(MoePermuteBf16, GatherAndScatterAreBitForBitCopies) {
  fp::Rng rng(31);
  for (int64_t H : kH)
    for (int64_t n : {1, 13, 37})
      for (int64_t k : {1, 2, 4}) {
        SCOPED_TRACE(testing::Message() << "H=" << H << " n=" << n << " k=" << k);
        const int64_t E = 8, m = n * k;
        const Routing r = routing_random(rng, n, k, E, 3);
        const auto x = fp::op_test::random_vector<float>(n * H, rng);
        std::vector<bf16> xb = to_bf16(x);
        const uint16_t specials[] = {0x8000, 0x7f80, 0xff80, 0x7fc1, 0x0001};  // -0, +-inf, NaN payload, subnormal
        for (size_t i = 0; i < std::size(specials) && i < xb.size(); ++i) xb[i * 7 % xb.size()].bits = specials[i];

        // gather, bf16 -> bf16, bf16 -> f32, f32 -> bf16.
        std::vector<bf16> xs_ref(m * H), xs_cpu(m * H, bf16{0x1234});
        fp::ops::ref::moe_gather(xb.data(), r.rows.data(), xs_ref.data(), m, H);
        fp::ops::cpu::moe_gather(xb.data(), r.rows.data(), xs_cpu.data(), m, H);
        EXPECT_TRUE(same_bits(xs_cpu, xs_ref)) << "gather bf16 -> bf16";
        std::vector<float> xs_wide(m * H, NAN);
        fp::ops::cpu::moe_gather(xb.data(), r.rows.data(), xs_wide.data(), m, H);
        EXPECT_TRUE(fp::op_test::bits_equal(xs_wide, widen(xs_ref))) << "gather bf16 -> f32";
        std::vector<float> xs_f(m * H);
        fp::ops::ref::moe_gather(x.data(), r.rows.data(), xs_f.data(), m, H);
        fp::ops::cpu::moe_gather(x.data(), r.rows.data(), xs_cpu.data(), m, H);
        EXPECT_TRUE(same_bits(xs_cpu, to_bf16(xs_f))) << "gather f32 -> bf16";

        // scatter into a permutation's first mi rows; the other rows keep their bits.
        std::vector<int32_t> dest(m);
        std::iota(dest.begin(), dest.end(), 0);
        for (int64_t i = m - 1; i > 0; --i) std::swap(dest[i], dest[rng.below(i + 1)]);
        for (int64_t mi : {m, (m + 1) / 2}) {
          const auto src = fp::op_test::random_vector<float>(mi * H, rng);
          const std::vector<bf16> srcb = to_bf16(src);
          const auto fill = fp::op_test::random_vector<float>(m * H, rng);
          std::vector<bf16> dst_ref = to_bf16(fill), dst_cpu = dst_ref;
          fp::ops::ref::moe_scatter(srcb.data(), dest.data(), dst_ref.data(), mi, H);
          fp::ops::cpu::moe_scatter(srcb.data(), dest.data(), dst_cpu.data(), mi, H);
          EXPECT_TRUE(same_bits(dst_cpu, dst_ref)) << "scatter bf16 -> bf16, mi=" << mi;
          std::vector<float> dst_wide = widen(to_bf16(fill));
          fp::ops::cpu::moe_scatter(srcb.data(), dest.data(), dst_wide.data(), mi, H);
          EXPECT_TRUE(fp::op_test::bits_equal(dst_wide, widen(dst_ref))) << "scatter bf16 -> f32, mi=" << mi;
          dst_cpu = to_bf16(fill);
          fp::ops::cpu::moe_scatter(src.data(), dest.data(), dst_cpu.data(), mi, H);
          EXPECT_TRUE(same_bits(dst_cpu, dst_ref)) << "scatter f32 -> bf16, mi=" << mi;  // dst_ref: round(src)
        }
      }
}

// Every mix of f32 and bf16 rows. Bitwise: the f32 kernel run on the widened values, its result rounded
// once per element where the output is bf16 (the f32 operations per element are the same, in the same
// order, Note in backend/cpu/kernels/moe_permute.cpp). Against ref<float> on the widened values: the f32 bound of
// CombineMatchesRef plus, for a bf16 output, one rounding to bf16 (unit roundoff 2^-8 of |want|).
TEST(MoePermuteBf16, CombineIsTheF32KernelRoundedOnce) {
  fp::Rng rng(32);
  const double u_bf16 = std::ldexp(1.0, -8);
  for (int64_t H : kH)
    for (int64_t n : {1, 13, 37})
      for (int64_t k : {1, 2, 4})
        for (int mix = 1; mix < 8; ++mix) {  // bit 0: ys, bit 1: out (and dout), bit 2: dys; 0 is all-f32
          const bool ys_bf = mix & 1, out_bf = mix & 2, dys_bf = mix & 4;
          SCOPED_TRACE(testing::Message() << "H=" << H << " n=" << n << " k=" << k << " ys " << dt(ys_bf)
                                          << " out/dout " << dt(out_bf) << " dys " << dt(dys_bf));
          const int64_t E = 8, m = n * k;
          const Routing r = routing_random(rng, n, k, E, 5);
          Rows ys(fp::op_test::random_vector<float>(m * H, rng), ys_bf);
          std::vector<float> w(n * k);
          for (auto& x : w) x = static_cast<float>(0.05 + rng.uniform());

          // forward: out += sum_j w_j ys_j.
          Rows out(fp::op_test::random_vector<float>(n * H, rng), out_bf);
          std::vector<float> want = out.f;  // the f32 kernel on the same values
          fp::ops::cpu::moe_combine_forward(ys.f.data(), r.slot_pos.data(), w.data(), want.data(), n, k, H);
          std::vector<float> ref = out.f;
          fp::ops::ref::moe_combine_forward(ys.f.data(), r.slot_pos.data(), w.data(), ref.data(), n, k, H);
          std::vector<double> bound(n * H);
          for (int64_t t = 0; t < n; ++t)
            for (int64_t h = 0; h < H; ++h) {
              double mag = std::fabs(out.f[t * H + h]);
              for (int64_t j = 0; j < k; ++j) mag += std::fabs(w[t * k + j] * ys.f[r.slot_pos[t * k + j] * H + h]);
              bound[t * H + h] = 4.0 * k * FLT_EPSILON * mag + (out_bf ? u_bf16 * std::fabs(ref[t * H + h]) : 0.0);
            }
          fp::ops::cpu::moe_combine_forward(ys.buf(), r.slot_pos.data(), w.data(), out.buf(), n, k, H);
          EXPECT_TRUE(fp::op_test::bits_equal(out.value(), out.stored(want))) << "out";
          EXPECT_TRUE(fp::op_test::near("out", {n, H}, out.value(), ref, fp::op_test::tol_each(bound)));

          // backward: dys = w dout (every row written), dw = dot(dout, ys) in f32.
          Rows dout(fp::op_test::random_vector<float>(n * H, rng), out_bf);
          Rows dys(std::vector<float>(m * H, NAN), dys_bf);
          std::vector<float> want_dys(m * H, NAN), want_dw(n * k, NAN), dw(n * k, NAN);
          fp::ops::cpu::moe_combine_backward(ys.f.data(), r.slot_pos.data(), w.data(), dout.f.data(), want_dys.data(),
                                             want_dw.data(), n, k, H);
          fp::ops::cpu::moe_combine_backward(ys.buf(), r.slot_pos.data(), w.data(), dout.buf(), dys.buf(), dw.data(), n,
                                             k, H);
          EXPECT_TRUE(fp::op_test::bits_equal(dw, want_dw)) << "dw";
          EXPECT_TRUE(fp::op_test::bits_equal(dys.value(), dys.stored(want_dys))) << "dys";
          std::vector<float> ref_dys(m * H), ref_dw(n * k);
          fp::ops::ref::moe_combine_backward(ys.f.data(), r.slot_pos.data(), w.data(), dout.f.data(), ref_dys.data(),
                                             ref_dw.data(), n, k, H);
          // dys: one f32 product, then one bf16 rounding when bf16; dw: CombineMatchesRef's bound.
          std::vector<double> bound_dys(m * H), bound_dw(n * k);
          for (int64_t i = 0; i < m * H; ++i)
            bound_dys[i] = (FLT_EPSILON + (dys_bf ? u_bf16 : 0.0)) * std::fabs(ref_dys[i]);
          for (int64_t t = 0; t < n; ++t)
            for (int64_t j = 0; j < k; ++j) {
              double mag = 0;
              for (int64_t h = 0; h < H; ++h) mag += std::fabs(dout.f[t * H + h] * ys.f[r.slot_pos[t * k + j] * H + h]);
              bound_dw[t * k + j] = (H + 1) * FLT_EPSILON * mag;
            }
          EXPECT_TRUE(fp::op_test::near("dys", {m, H}, dys.value(), ref_dys, fp::op_test::tol_each(bound_dys)));
          EXPECT_TRUE(fp::op_test::near("dw", {n, k}, dw, ref_dw, fp::op_test::tol_each(bound_dw)));

          // In place (dys is ys, as moe_block's backward calls it): dw from the rows before they are
          // overwritten, the same bits as out of place.
          if (ys_bf == dys_bf) {
            Rows inplace = ys;
            std::vector<float> dw_in(n * k, NAN);
            fp::ops::cpu::moe_combine_backward(inplace.buf(), r.slot_pos.data(), w.data(), dout.buf(), inplace.buf(),
                                               dw_in.data(), n, k, H);
            EXPECT_TRUE(fp::op_test::bits_equal(dw_in, want_dw)) << "dw in place";
            EXPECT_TRUE(fp::op_test::bits_equal(inplace.value(), dys.value())) << "dys in place";
          }
        }
}

// As the combine: every mix, bitwise against the f32 kernel on the widened values rounded once, and
// against ref<float> within GatherAndScatterAddMatchRef's f32 bound plus one bf16 rounding.
TEST(MoePermuteBf16, ScatterAddIsTheF32KernelRoundedOnce) {
  fp::Rng rng(33);
  const double u_bf16 = std::ldexp(1.0, -8);
  for (int64_t H : kH)
    for (int64_t n : {1, 13, 37})
      for (int64_t k : {1, 2, 4})
        for (int mix = 1; mix < 4; ++mix) {  // bit 0: dxs, bit 1: dx
          const bool dxs_bf = mix & 1, dx_bf = mix & 2;
          SCOPED_TRACE(testing::Message()
                       << "H=" << H << " n=" << n << " k=" << k << " dxs " << dt(dxs_bf) << " dx " << dt(dx_bf));
          const int64_t E = 8, m = n * k;
          const Routing r = routing_random(rng, n, k, E, 3);
          Rows dxs(fp::op_test::random_vector<float>(m * H, rng), dxs_bf);
          Rows dx(fp::op_test::random_vector<float>(n * H, rng), dx_bf);
          std::vector<float> want = dx.f, ref = dx.f;
          fp::ops::cpu::moe_scatter_add(dxs.f.data(), r.slot_pos.data(), want.data(), n, k, H);
          fp::ops::ref::moe_scatter_add(dxs.f.data(), r.slot_pos.data(), ref.data(), n, k, H);
          std::vector<double> bound(n * H);
          for (int64_t t = 0; t < n; ++t)
            for (int64_t h = 0; h < H; ++h) {
              double mag = std::fabs(dx.f[t * H + h]);
              for (int64_t j = 0; j < k; ++j) mag += std::fabs(dxs.f[r.slot_pos[t * k + j] * H + h]);
              bound[t * H + h] = 2.0 * k * FLT_EPSILON * mag + (dx_bf ? u_bf16 * std::fabs(ref[t * H + h]) : 0.0);
            }
          fp::ops::cpu::moe_scatter_add(dxs.buf(), r.slot_pos.data(), dx.buf(), n, k, H);
          EXPECT_TRUE(fp::op_test::bits_equal(dx.value(), dx.stored(want))) << "dx";
          EXPECT_TRUE(fp::op_test::near("dx", {n, H}, dx.value(), ref, fp::op_test::tol_each(bound)));
        }
}

// Rounded once per element, by hand: 1 + 3/8 ulp + 3/8 ulp (ulp = 2^-7 at 1 in bf16). Rounded after
// each slot the sum stays 1 (3/8 ulp rounds down, twice); in f32 then rounded once it is 1 + 3/4 ulp,
// which rounds up to 1 + 2^-7. The same for the combine forward with weights 1.
TEST(MoePermuteBf16, AccumulatesInF32AndRoundsOnce) {
  const int64_t n = 1, k = 2, H = 9;  // one full 8-lane vector and a tail
  const std::vector<int32_t> slot_pos = {1, 0};
  const float small = 3.0f * std::ldexp(1.0f, -10);  // 3/8 ulp of 1, a bf16 value
  const std::vector<bf16> g(k * H, bf16{fp::bf16_from_float(small)});
  const uint16_t want = fp::bf16_from_float(1.0f + std::ldexp(1.0f, -7));
  std::vector<bf16> dx(H, bf16{fp::bf16_from_float(1.0f)});
  fp::ops::cpu::moe_scatter_add(g.data(), slot_pos.data(), dx.data(), n, k, H);
  for (int64_t h = 0; h < H; ++h) EXPECT_EQ(dx[h].bits, want) << "scatter_add h=" << h;
  std::vector<bf16> out(H, bf16{fp::bf16_from_float(1.0f)});
  const std::vector<float> w = {1.0f, 1.0f};
  fp::ops::cpu::moe_combine_forward(g.data(), slot_pos.data(), w.data(), out.data(), n, k, H);
  for (int64_t h = 0; h < H; ++h) EXPECT_EQ(out[h].bits, want) << "combine_forward h=" << h;
}

TEST(MoePermuteBf16, BitwiseDeterministicAcrossThreadCounts) {
  fp::Rng rng(34);
  const int64_t n = 301, k = 4, E = 16, H = 257, m = n * k;  // n k H above the kernels' parallel threshold
  const Routing r = routing_random(rng, n, k, E, 7);
  const auto x = to_bf16(fp::op_test::random_vector<float>(n * H, rng));
  const auto ys = to_bf16(fp::op_test::random_vector<float>(m * H, rng));
  const auto w = fp::op_test::random_vector<float>(n * k, rng);
  const auto dout = to_bf16(fp::op_test::random_vector<float>(n * H, rng));
  const auto base = to_bf16(fp::op_test::random_vector<float>(n * H, rng));
  struct Out {
    std::vector<bf16> xs, out, dys, dx, scattered;
    std::vector<float> dw;
  };
  const int saved = omp_get_max_threads();
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    Out o{std::vector<bf16>(m * H), base, std::vector<bf16>(m * H), base, std::vector<bf16>(m * H),
          std::vector<float>(n * k)};
    fp::ops::cpu::moe_gather(x.data(), r.rows.data(), o.xs.data(), m, H);
    fp::ops::cpu::moe_scatter(ys.data(), r.slot_pos.data(), o.scattered.data(), m, H);
    fp::ops::cpu::moe_combine_forward(ys.data(), r.slot_pos.data(), w.data(), o.out.data(), n, k, H);
    fp::ops::cpu::moe_combine_backward(ys.data(), r.slot_pos.data(), w.data(), dout.data(), o.dys.data(), o.dw.data(),
                                       n, k, H);
    fp::ops::cpu::moe_scatter_add(ys.data(), r.slot_pos.data(), o.dx.data(), n, k, H);
    return o;
  };
  const Out a = run(1), b = run(2);
  omp_set_num_threads(saved);
  EXPECT_TRUE(same_bits(a.xs, b.xs)) << "moe_gather";
  EXPECT_TRUE(same_bits(a.scattered, b.scattered)) << "moe_scatter";
  EXPECT_TRUE(same_bits(a.out, b.out)) << "moe_combine_forward";
  EXPECT_TRUE(same_bits(a.dys, b.dys)) << "moe_combine_backward dys";
  EXPECT_TRUE(fp::op_test::bits_equal(a.dw, b.dw)) << "moe_combine_backward dw";
  EXPECT_TRUE(same_bits(a.dx, b.dx)) << "moe_scatter_add";
}

// Only f32 and bf16 rows: any other dtype is an error naming the kernel, before anything is written.
TEST(MoePermuteBf16, OtherDtypesAreAnError) {
  std::vector<uint16_t> half(8, 0);
  std::vector<float> f(8, 1.0f), w(1, 1.0f), dw(1);
  const std::vector<int32_t> rows = {0};
  const fp::Buf f16(half.data(), fp::DType::DType_F16);
  EXPECT_THROW(fp::ops::cpu::moe_gather(f.data(), rows.data(), f16, 1, 8), fp::Error);
  EXPECT_THROW(fp::ops::cpu::moe_scatter(f16, rows.data(), f.data(), 1, 8), fp::Error);
  EXPECT_THROW(fp::ops::cpu::moe_combine_forward(f16, rows.data(), w.data(), f.data(), 1, 1, 8), fp::Error);
  EXPECT_THROW(fp::ops::cpu::moe_combine_backward(f.data(), rows.data(), w.data(), f.data(), f16, dw.data(), 1, 1, 8),
               fp::Error);
  EXPECT_THROW(fp::ops::cpu::moe_scatter_add(f.data(), rows.data(), f16, 1, 1, 8), fp::Error);
}

}  // namespace
