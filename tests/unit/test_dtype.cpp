// Note [Half-width floats] (core/dtype.h): widening is exact and narrowing rounds to nearest even.
// Checked exhaustively over the 65536 patterns of each format, and against an independent rule: for
// every pair of adjacent finite values a < b, the float midpoint (exact: a float has 13 more mantissa
// bits than either format) goes to the one with an even last bit, and the floats just inside it go to
// the nearer neighbour.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/dtype.h"

namespace fp {
namespace {

template <class ToFloat, class FromFloat>
void check_format(ToFloat to_float, FromFloat from_float, uint16_t max_finite, int expected_nans) {
  int nans = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float x = to_float(static_cast<uint16_t>(h));
    if (std::isnan(x)) {
      ++nans;
      EXPECT_TRUE(std::isnan(to_float(from_float(x)))) << std::hex << h;
      EXPECT_EQ(from_float(x) & 0x8000u, h & 0x8000u) << "NaN keeps its sign " << std::hex << h;
      continue;
    }
    EXPECT_EQ(from_float(x), h) << "round trip of pattern 0x" << std::hex << h;  // exact both ways
  }
  EXPECT_EQ(nans, expected_nans);
  // Ties and near-ties between adjacent positive finite values (negatives mirror them by the sign bit).
  for (uint32_t a = 0; a < max_finite; ++a) {
    const uint16_t b = static_cast<uint16_t>(a + 1);
    const float fa = to_float(static_cast<uint16_t>(a)), fb = to_float(b);
    const float mid = fa + (fb - fa) / 2;  // exact
    ASSERT_TRUE(mid > fa && mid < fb) << a;
    const uint16_t even = (a & 1u) == 0 ? static_cast<uint16_t>(a) : b;
    EXPECT_EQ(from_float(mid), even) << "tie between 0x" << std::hex << a << " and 0x" << b;
    EXPECT_EQ(from_float(std::nextafter(mid, fa)), a) << std::hex << a;
    EXPECT_EQ(from_float(std::nextafter(mid, fb)), b) << std::hex << a;
    EXPECT_EQ(from_float(-mid), even | 0x8000u) << std::hex << a;
  }
}

TEST(HalfFloats, Bf16RoundTripAndNearestEven) {
  check_format(bf16_to_float, bf16_from_float, 0x7f7fu, 2 * 127);
  EXPECT_EQ(bf16_from_float(std::numeric_limits<float>::infinity()), 0x7f80u);
  // Above the largest finite bf16, from its midpoint with infinity on, rounds to infinity.
  EXPECT_EQ(bf16_from_float(std::numeric_limits<float>::max()), 0x7f80u);
}

TEST(HalfFloats, F16RoundTripAndNearestEven) {
  check_format(f16_to_float, f16_from_float, 0x7bffu, 2 * 1023);
  EXPECT_EQ(f16_from_float(65504.0f), 0x7bffu);
  EXPECT_EQ(f16_from_float(std::nextafter(65520.0f, 0.0f)), 0x7bffu);  // just below the midpoint to infinity
  EXPECT_EQ(f16_from_float(65520.0f), 0x7c00u);                         // the midpoint: the even side is infinity
  EXPECT_EQ(f16_from_float(1e10f), 0x7c00u);
  EXPECT_EQ(f16_from_float(-1e10f), 0xfc00u);
  EXPECT_EQ(f16_from_float(std::ldexp(1.0f, -25)), 0x0000u);  // half the smallest subnormal: ties to 0
  EXPECT_EQ(f16_from_float(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001u);
  EXPECT_EQ(f16_from_float(1e-30f), 0x0000u);
}

}  // namespace
}  // namespace fp
