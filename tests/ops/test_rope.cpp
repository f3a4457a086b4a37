// RoPE: forward and backward against the scalar reference at head dims around SIMD widths and large
// positions; backward(forward(x)) == x; the rotate-half convention on a hand-computed case; the
// reference backward against finite differences; a bf16 x against the f32 kernel on the widened
// values, rounded. Dimensions: n tokens, heads heads, hd head_dim.
#include <gtest/gtest.h>
#include <omp.h>

#include <cfloat>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/kernels/ops.h"
#include "core/buf.h"
#include "core/error.h"
#include "core/rng.h"
#include "op_test.h"
#include "ops/ref/rope.h"
#include "ops/rope.h"

namespace fp {

namespace {

std::vector<int32_t> random_positions(int64_t n, Rng& rng) {
  std::vector<int32_t> p(n);
  for (int64_t t = 0; t < n; ++t) p[t] = t == 0 ? 0 : static_cast<int32_t>(rng.below(40000));
  return p;
}

// Each output is x_a c -+ x_b s over the pair (a, b): tol = k eps (|x_a| + |x_b|) of the input pair
// in (rows of hd).
op_test::Tol tol_pairs(const std::vector<float>& in, int64_t hd, double k) {
  return [x = in.data(), hd, k](size_t idx, double) {
    const int64_t half = hd / 2, i = static_cast<int64_t>(idx % hd), base = static_cast<int64_t>(idx) - i;
    return k * FLT_EPSILON * (std::abs(x[base + i % half]) + std::abs(x[base + i % half + half]));
  };
}

const std::vector<int64_t> kHeadDims = {2, 4, 6, 8, 14, 16, 18, 30, 32, 34, 62, 64, 66, 126, 128, 130, 256};

// The strided, interleaved rotation of MLA against the contiguous rotate-half kernel: rows that lie
// head_stride apart rotate exactly as those rows packed together, the numbers around them untouched; and
// the interleaved pairs (2i, 2i + 1) rotate exactly as rotate-half does on the de-interleaved vector
// (x0, x2, ..., x1, x3, ...), which is how transformers' apply_rotary_pos_emb_interleave writes them.
TEST(Rope, StridedAndInterleavedMatchRotateHalf) {
  Rng rng(77);
  const int64_t n = 37, heads = 3, hd = 8, pad = 5, stride = hd + pad;
  const std::vector<double> inv = ops::rope_default_inv_freq(10000.0, hd);
  const ops::RopeFreqs f{inv.data(), 1.3f};
  const std::vector<int32_t> pos = random_positions(n, rng);
  for (bool inter : {false, true})
    for (bool backward : {false, true}) {
      SCOPED_TRACE(testing::Message() << "interleaved=" << inter << " backward=" << backward);
      std::vector<float> x = op_test::random_vector<float>(n * heads * stride, rng), got = x;
      // Packed: each row's hd numbers (de-interleaved when inter), rotated by the plain kernel.
      std::vector<float> packed(n * heads * hd);
      for (int64_t r = 0; r < n * heads; ++r)
        for (int64_t i = 0; i < hd; ++i) {
          const int64_t src = inter ? (i < hd / 2 ? 2 * i : 2 * (i - hd / 2) + 1) : i;
          packed[r * hd + i] = x[r * stride + pad + src];
        }
      if (backward) {
        ops::cpu::rope_strided_backward(got.data() + pad, pos.data(), n, heads, hd, stride, inter, f);
        ops::cpu::rope_backward(packed.data(), pos.data(), n, heads, hd, f);
      } else {
        ops::cpu::rope_strided_forward(got.data() + pad, pos.data(), n, heads, hd, stride, inter, f);
        ops::cpu::rope_forward(packed.data(), pos.data(), n, heads, hd, f);
      }
      for (int64_t r = 0; r < n * heads; ++r) {
        for (int64_t i = 0; i < pad; ++i) ASSERT_EQ(got[r * stride + i], x[r * stride + i]) << "row " << r << " pad";
        for (int64_t i = 0; i < hd; ++i) {
          const int64_t src = inter ? (i < hd / 2 ? 2 * i : 2 * (i - hd / 2) + 1) : i;
          ASSERT_EQ(got[r * stride + pad + src], packed[r * hd + i]) << "row " << r << " dim " << i;
        }
      }
    }
}

}  // namespace

// The kernel and ref<float> round the same double cos/sin to float and do the same float products;
// allow 2 eps of the pair for a difference in rounding of the final subtraction.
TEST(Rope, MatchesReference) {
  uint64_t seed = 1;
  for (const int64_t hd : kHeadDims) {
    for (const int64_t heads : {int64_t{1}, int64_t{3}}) {
      for (const float theta : {10000.0f, 1000000.0f}) {
        Rng rng(seed++);
        const int64_t n = 5 + hd % 13;
        const std::vector<int32_t> pos = random_positions(n, rng);
        const std::vector<float> x = op_test::random_vector<float>(n * heads * hd, rng);
        const std::string where = "hd=" + std::to_string(hd) + " heads=" + std::to_string(heads);
        std::vector<float> got = x, want = x;
        const std::vector<double> inv = ops::rope_default_inv_freq(theta, hd);
        const ops::RopeFreqs f{inv.data(), 1.0f};
        ops::cpu::rope_forward(got.data(), pos.data(), n, heads, hd, f);
        ops::ref::rope_forward<float>(want.data(), pos.data(), n, heads, hd, inv.data());
        EXPECT_TRUE(op_test::near("rope_forward " + where, {static_cast<int64_t>(want.size()) / hd, hd}, got, want,
                                  tol_pairs(x, hd, 2)));
        got = x;
        want = x;
        ops::cpu::rope_backward(got.data(), pos.data(), n, heads, hd, f);
        ops::ref::rope_backward<float>(want.data(), pos.data(), n, heads, hd, inv.data());
        EXPECT_TRUE(op_test::near("rope_backward " + where, {static_cast<int64_t>(want.size()) / hd, hd}, got, want,
                                  tol_pairs(x, hd, 2)));
        // The inverse: c^2 + s^2 = 1 within a few eps after rounding cos and sin to float.
        got = x;
        ops::cpu::rope_forward(got.data(), pos.data(), n, heads, hd, f);
        ops::cpu::rope_backward(got.data(), pos.data(), n, heads, hd, f);
        EXPECT_TRUE(op_test::near("rope_backward(rope_forward(x)) " + where, {static_cast<int64_t>(x.size()) / hd, hd},
                                  got, x, tol_pairs(x, hd, 6)));
        // YaRN's attention factor multiplies cos and sin (both directions).
        const ops::RopeFreqs scaled{inv.data(), 1.25f};
        for (const bool fwd : {true, false}) {
          got = x;
          want = x;
          if (fwd) {
            ops::cpu::rope_forward(got.data(), pos.data(), n, heads, hd, scaled);
            ops::ref::rope_forward<float>(want.data(), pos.data(), n, heads, hd, inv.data(), 1.25);
          } else {
            ops::cpu::rope_backward(got.data(), pos.data(), n, heads, hd, scaled);
            ops::ref::rope_backward<float>(want.data(), pos.data(), n, heads, hd, inv.data(), 1.25);
          }
          EXPECT_TRUE(op_test::near("rope scaled by 1.25 " + where, {static_cast<int64_t>(want.size()) / hd, hd}, got,
                                    want, tol_pairs(x, hd, 3)));
        }
      }
    }
  }
}

// hd = 4, theta = 100: inv_freq = (1, 0.1). Token at pos 3 with x = (1, 2, 0, 0): pair 0 is rotated
// by 3 rad, pair 1 by 0.3 rad: y = (cos 3, 2 cos 0.3, sin 3, 2 sin 0.3). Position 0 is the identity.
TEST(Rope, RotateHalfConvention) {
  std::vector<float> x = {1, 2, 0, 0, 1, 2, 3, 4};  // (2 tokens, 1 head, 4)
  const std::vector<int32_t> pos = {3, 0};
  const std::vector<double> inv = ops::rope_default_inv_freq(100.0, 4);
  ops::cpu::rope_forward(x.data(), pos.data(), 2, 1, 4, {inv.data(), 1.0f});
  const double want[8] = {std::cos(3.0), 2 * std::cos(0.3), std::sin(3.0), 2 * std::sin(0.3), 1, 2, 3, 4};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(x[i], want[i], 4e-7) << "element " << i;
}

TEST(Rope, OddHeadDimAsserts) {
  std::vector<float> x(6, 1.0f);
  const std::vector<int32_t> pos = {1, 2};
  const std::vector<double> inv = ops::rope_default_inv_freq(10000.0, 4);
  EXPECT_THROW(ops::cpu::rope_forward(x.data(), pos.data(), 2, 1, 3, {inv.data(), 1.0f}), InternalError);
}

// L = q . rope_forward(x) in double; dL/dx = rope_backward(q), against central differences (L is
// linear in x, so they agree to rounding).
TEST(Rope, ReferenceBackwardMatchesFiniteDifferences) {
  const int64_t n = 4, heads = 2, hd = 6;
  Rng rng(21);
  const std::vector<int32_t> pos = random_positions(n, rng);
  std::vector<double> x = op_test::random_vector<double>(n * heads * hd, rng);
  const std::vector<double> q = op_test::random_vector<double>(n * heads * hd, rng);
  const std::vector<double> inv = ops::rope_default_inv_freq(10000.0, hd);  // with a YaRN-like factor 1.3
  auto loss = [&] {
    std::vector<double> y = x;
    ops::ref::rope_forward<double>(y.data(), pos.data(), n, heads, hd, inv.data(), 1.3);
    double L = 0;
    for (size_t i = 0; i < y.size(); ++i) L += q[i] * y[i];
    return L;
  };
  std::vector<double> grad = q;
  ops::ref::rope_backward<double>(grad.data(), pos.data(), n, heads, hd, inv.data(), 1.3);
  for (size_t i = 0; i < x.size(); ++i) {
    const double fd = op_test::central_difference(x[i], loss);
    EXPECT_NEAR(grad[i], fd, 1e-7 * (1 + std::abs(fd))) << "dx[" << i << "]";
  }
}

namespace {

// x rounded to bf16 (nearest even), and bf16 values widened back (exact).
std::vector<bf16> to_bf16(const std::vector<float>& x) {
  std::vector<bf16> h;
  for (const float v : x) h.push_back({bf16_from_float(v)});
  return h;
}
std::vector<float> widened(const std::vector<bf16>& h) {
  std::vector<float> v;
  for (const bf16 x : h) v.push_back(bf16_to_float(x.bits));
  return v;
}

}  // namespace

// A bf16 x: each head is widened exactly, rotated by the f32 loop with the same float cos and sin, and
// rounded once, so all four kernels give the f32 kernel's result on the widened x, rounded: equal bits
// (the numbers between heads of the strided kernels untouched). Head dims around SIMD widths, a large
// one (600) and a YaRN factor; 1 and 2 threads, past the parallel threshold.
TEST(Rope, Bf16MatchesF32KernelOnWidenedValues) {
  const int saved = omp_get_max_threads();
  uint64_t seed = 900;
  std::vector<int64_t> head_dims = kHeadDims;
  head_dims.push_back(600);
  for (const int64_t hd : head_dims) {
    for (const bool strided : {false, true}) {
      for (const bool inter : {false, true}) {
        if (inter && !strided) continue;  // only the strided kernels interleave
        for (const bool backward : {false, true}) {
          Rng rng(seed++);
          const int64_t n = 37 + hd % 5, heads = 3, pad = strided ? 3 : 0, stride = hd + pad;
          const std::vector<int32_t> pos = random_positions(n, rng);
          const std::vector<double> inv = ops::rope_default_inv_freq(10000.0, hd);
          const ops::RopeFreqs f{inv.data(), 1.25f};
          const std::vector<bf16> x = to_bf16(op_test::random_vector<float>(n * heads * stride, rng));
          std::vector<float> want = widened(x);
          auto run = [&](Buf b) {
            Buf at = b.at(pad);
            if (!strided) {
              backward ? ops::cpu::rope_backward(at, pos.data(), n, heads, hd, f)
                       : ops::cpu::rope_forward(at, pos.data(), n, heads, hd, f);
            } else {
              backward ? ops::cpu::rope_strided_backward(at, pos.data(), n, heads, hd, stride, inter, f)
                       : ops::cpu::rope_strided_forward(at, pos.data(), n, heads, hd, stride, inter, f);
            }
          };
          run(want.data());
          const std::vector<float> want_bf16 = widened(to_bf16(want));
          for (const int t : {1, 2}) {
            omp_set_num_threads(t);
            std::vector<bf16> got = x;
            run(got.data());
            const std::string where = "rope bf16 hd=" + std::to_string(hd) + " strided=" + std::to_string(strided) +
                                      " interleaved=" + std::to_string(inter) +
                                      " backward=" + std::to_string(backward) + ", " + std::to_string(t) + " threads";
            EXPECT_TRUE(op_test::bits_equal(widened(got), want_bf16))
                << op_test::near(where, {n * heads, stride}, widened(got), want_bf16, op_test::tol_exact()).message();
          }
        }
      }
    }
  }
  omp_set_num_threads(saved);
}

TEST(Rope, OtherDtypesAssert) {
  std::vector<float> x(8, 1.0f);
  const std::vector<int32_t> pos = {1, 2};
  const std::vector<double> inv = ops::rope_default_inv_freq(10000.0, 4);
  EXPECT_THROW(ops::cpu::rope_forward(Buf(x.data(), DType::DType_F16), pos.data(), 2, 1, 4, {inv.data(), 1.0f}),
               InternalError);
  EXPECT_THROW(ops::cpu::rope_strided_backward(Buf(x.data(), DType::DType_F64), pos.data(), 2, 1, 4, 4, true,
                                               {inv.data(), 1.0f}),
               InternalError);
}

}  // namespace fp
