// f32 <-> bf16 bulk conversion (backend/cpu/kernels/convert.h) against the scalar conversions of core/dtype.h,
// which tests/unit/test_dtype.cpp checks against PyTorch's rounding rules: widening every one of the
// 65536 bf16 patterns; narrowing every float whose upper half is any of the 65536 patterns and whose
// lower half is one of the values where rounding turns (0, 1, the tie 0x8000 and its neighbours,
// 0xffff, and random ones), so every exponent, sign, NaN payload, infinity and tie is met; lengths
// around the vector widths; the block helpers with leading dimensions.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/cpu/kernels/convert.h"
#include "backend/cpu/kernels/cpu_features.h"
#include "backend/cpu/kernels/ops.h"
#include "core/buf.h"
#include "core/rng.h"

namespace fp {

TEST(Convert, WidensEveryBf16Pattern) {
  std::printf("%s\n", ops::cpu::cpu_features().str().c_str());
  std::vector<bf16> h(65536);
  for (uint32_t i = 0; i < 65536; ++i) h[i].bits = static_cast<uint16_t>(i);
  std::vector<float> f(65536);
  ops::cpu::bf16_to_f32(h.data(), f.data(), 65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    const float want = bf16_to_float(static_cast<uint16_t>(i));
    ASSERT_EQ(std::memcmp(&f[i], &want, 4), 0) << "bf16 0x" << std::hex << i;
  }
}

TEST(Convert, NarrowsLikeTheScalarRounding) {
  Rng rng(11);
  std::vector<uint32_t> lows = {0x0000, 0x0001, 0x3fff, 0x7ffe, 0x7fff, 0x8000, 0x8001, 0xbfff, 0xfffe, 0xffff};
  for (int r = 0; r < 22; ++r) lows.push_back(static_cast<uint32_t>(rng.below(65536)));
  std::vector<float> f(65536);
  std::vector<bf16> h(65536);
  for (const uint32_t low : lows) {
    for (uint32_t hi = 0; hi < 65536; ++hi) {
      const uint32_t u = (hi << 16) | low;
      std::memcpy(&f[hi], &u, 4);
    }
    ops::cpu::f32_to_bf16(f.data(), h.data(), 65536);
    for (uint32_t hi = 0; hi < 65536; ++hi) {
      const uint16_t want = bf16_from_float(f[hi]);
      ASSERT_EQ(h[hi].bits, want) << "float 0x" << std::hex << ((hi << 16) | low);
    }
  }
}

TEST(Convert, EveryLengthAndBothDirections) {
  Rng rng(12);
  for (int64_t n = 0; n <= 70; ++n) {
    std::vector<float> x(n + 1), back(n + 1, -7.0f);
    for (float& v : x) v = static_cast<float>(rng.normal());
    std::vector<bf16> h(n + 1, bf16{0x1234});
    ops::cpu::convert(Buf(h.data()), CBuf(x.data()), n);
    ops::cpu::convert(Buf(back.data()), CBuf(h.data()), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(h[i].bits, bf16_from_float(x[i])) << "n=" << n << " i=" << i;
      ASSERT_EQ(back[i], bf16_to_float(h[i].bits)) << "n=" << n << " i=" << i;
    }
    EXPECT_EQ(h[n].bits, 0x1234) << "n=" << n << ": wrote past the end";
    EXPECT_EQ(back[n], -7.0f) << "n=" << n << ": wrote past the end";
    // Same dtype: a copy.
    std::vector<float> y(n + 1, 3.0f);
    ops::cpu::convert(Buf(y.data()), CBuf(x.data()), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], x[i]);
    EXPECT_EQ(y[n], 3.0f);
  }
}

TEST(Convert, BlocksWithLeadingDimensions) {
  Rng rng(13);
  const int64_t rows = 5, cols = 19, ld = 23;
  std::vector<float> x(rows * ld);
  for (float& v : x) v = static_cast<float>(rng.normal());
  std::vector<bf16> h(rows * ld, bf16{0x4242});
  std::vector<float> dense(rows * cols);
  // f32 block -> bf16 strided block -> dense f32.
  std::vector<float> src(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) src[r * cols + c] = x[r * ld + c];
  ops::cpu::store_block(src.data(), rows, cols, Buf(h.data()), ld);
  ops::cpu::widen_block(CBuf(h.data()), ld, rows, cols, dense.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < ld; ++c) {
      if (c >= cols) {
        ASSERT_EQ(h[r * ld + c].bits, 0x4242) << "padding written at " << r << "," << c;
        continue;
      }
      ASSERT_EQ(h[r * ld + c].bits, bf16_from_float(x[r * ld + c]));
      ASSERT_EQ(dense[r * cols + c], bf16_to_float(h[r * ld + c].bits));
    }
  }
}

}  // namespace fp
