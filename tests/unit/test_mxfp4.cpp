// Note [MXFP4 in gpt-oss checkpoints] (io/mxfp4.h): every (nibble, scale) value against an independent
// double computation rounded to bf16 by hand and against hand-derived bit patterns, the nibble order
// and the transposed layout, odd sizes around the row tile; and the U8 and row-range reads of
// SafetensorsFile and SafetensorsSet on a file written here, with their errors.
//
// Dimensions: E experts, R rows, G groups of 32 values (16 bytes) per row.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>
#include <vector>

#include "../common/temp_dir.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/mxfp4.h"
#include "io/safetensors.h"
#include "io/safetensors_set.h"

namespace fp {
namespace {

namespace fs = std::filesystem;

// transformers' FP4_VALUES, written out again.
constexpr double kLut[16] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0};

// The bf16 pattern of v rounded to nearest, ties to even, computed in double without float or
// core/dtype.h: the quantum at v's binade (2^-133 below 2^-126), nearbyint, then the fields.
uint16_t bf16_of_double(double v) {
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const double a = std::fabs(v);
  if (a == 0) return sign;
  int e = 0;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  const double quantum = std::ldexp(1.0, std::max(e - 1, -126) - 7);
  const double r = std::nearbyint(a / quantum) * quantum;
  if (r >= std::ldexp(1.0, 128)) return sign | 0x7f80;                                            // +-inf
  if (r < std::ldexp(1.0, -126)) return sign | static_cast<uint16_t>(r / std::ldexp(1.0, -133));  // subnormal
  const double m = std::frexp(r, &e);  // r = m 2^e, m in [0.5, 1)
  const uint16_t field = static_cast<uint16_t>(e - 1 + 127), mant = static_cast<uint16_t>((2 * m - 1) * 128);
  return sign | static_cast<uint16_t>(field << 7) | mant;
}

// The reference value of one element: lut[nibble] * 2^(scale - 127), exact in double, rounded once.
uint16_t mxfp4_reference(int nibble, int scale) { return bf16_of_double(std::ldexp(kLut[nibble], scale - 127)); }

// The straightforward loop: out (G*32, R) from blocks (R, G, 16), scales (R, G).
std::vector<uint16_t> dequantize_reference(const std::vector<uint8_t>& blocks, const std::vector<uint8_t>& scales,
                                           int64_t R, int64_t G) {
  std::vector<uint16_t> out(static_cast<size_t>(G * 32 * R));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t b = 0; b < 16; ++b)
        for (int nib = 0; nib < 2; ++nib) {
          const int byte = blocks[static_cast<size_t>((r * G + g) * 16 + b)];
          const int nibble = nib == 0 ? byte & 15 : byte >> 4;
          out[static_cast<size_t>((g * 32 + 2 * b + nib) * R + r)] =
              mxfp4_reference(nibble, scales[static_cast<size_t>(r * G + g)]);
        }
  return out;
}

std::vector<uint8_t> bytes_random(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<uint8_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<uint8_t>(rng.below(256));
  return v;
}

float widen(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Element-by-element comparison of bit patterns, printing the first few that differ.
void expect_same_bits(const std::vector<uint16_t>& want, const uint16_t* got, const std::string& what) {
  int shown = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (want[i] != got[i] && shown++ < 8)
      ADD_FAILURE() << what << " element " << i << ": expected 0x" << std::hex << want[i] << ", got 0x" << got[i];
}

TEST(Mxfp4, EveryNibbleAndScaleMatchesTheDoubleReference) {
  for (int s = 0; s < 256; ++s)
    for (int n = 0; n < 16; ++n)
      EXPECT_EQ(mxfp4_bf16(static_cast<uint8_t>(n), static_cast<uint8_t>(s)), mxfp4_reference(n, s))
          << "nibble " << n << " scale " << s;
  // The high nibble bits of the argument are ignored.
  EXPECT_EQ(mxfp4_bf16(0xf1, 127), mxfp4_bf16(0x01, 127));
}

TEST(Mxfp4, HandDerivedPatterns) {
  struct Case {
    int nibble, scale;
    uint16_t bits;
    const char* why;
  };
  const Case cases[] = {
      {2, 127, 0x3f80, "1 * 2^0 = 1"},
      {1, 127, 0x3f00, "0.5"},
      {3, 127, 0x3fc0, "1.5"},
      {7, 127, 0x40c0, "6"},
      {15, 128, 0xc140, "-6 * 2 = -12"},
      {9, 126, 0xbe80, "-0.5 / 2 = -0.25"},
      {0, 127, 0x0000, "+0"},
      {8, 127, 0x8000, "-0 keeps its sign"},
      {1, 0, 0x0020, "0.5 * 2^-127 = 2^-128, a bf16 subnormal"},
      {3, 0, 0x0060, "1.5 * 2^-127 = 3 * 2^-128, subnormal"},
      {7, 0, 0x0140, "6 * 2^-127 = 1.5 * 2^-125, normal"},
      {4, 1, 0x0100, "2 * 2^-126 = 2^-125"},
      {2, 1, 0x0080, "2^-126, the smallest normal"},
      {8, 0, 0x8000, "-0 at the smallest scale"},
      {0, 255, 0x0000, "0 * 2^128 is 0, not NaN (a true ldexp)"},
      {8, 255, 0x8000, "-0 * 2^128 is -0"},
      {1, 255, 0x7f00, "0.5 * 2^128 = 2^127, finite"},
      {9, 255, 0xff00, "-2^127"},
      {2, 255, 0x7f80, "2^128 overflows to +inf"},
      {15, 255, 0xff80, "-6 * 2^128 is -inf"},
      {3, 254, 0x7f40, "1.5 * 2^127, finite"},
      {4, 254, 0x7f80, "2 * 2^127 overflows"},
      {12, 254, 0xff80, "-2 * 2^127 overflows to -inf"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(mxfp4_bf16(static_cast<uint8_t>(c.nibble), static_cast<uint8_t>(c.scale)), c.bits)
        << c.why << " (nibble " << c.nibble << ", scale " << c.scale << ")";
    EXPECT_EQ(mxfp4_reference(c.nibble, c.scale), c.bits) << "the test's reference: " << c.why;
  }
}

// One slab holding every (scale, byte) pair: row r = scale, group g and byte b hold byte 16 g + b, so
// every nibble appears in both halves at every scale.
TEST(Mxfp4, SlabOfEveryScaleAndByte) {
  const int64_t R = 256, G = 16;
  std::vector<uint8_t> blocks(R * G * 16), scales(R * G);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t g = 0; g < G; ++g) {
      scales[r * G + g] = static_cast<uint8_t>(r);
      for (int64_t b = 0; b < 16; ++b) blocks[(r * G + g) * 16 + b] = static_cast<uint8_t>(16 * g + b);
    }
  std::vector<uint16_t> got(G * 32 * R, 0x1234);
  mxfp4_dequantize_bf16(blocks.data(), scales.data(), R, G, got.data());
  expect_same_bits(dequantize_reference(blocks, scales, R, G), got.data(), "bf16");
  std::vector<float> f(G * 32 * R);
  mxfp4_dequantize_f32(blocks.data(), scales.data(), R, G, f.data());
  for (size_t i = 0; i < f.size(); ++i) {
    const float w = widen(got[i]);
    ASSERT_TRUE(std::memcmp(&f[i], &w, 4) == 0) << "f32 element " << i << ": " << f[i] << " vs " << w;
  }
}

// The nibble order and the transpose, by hand on R = 3, G = 2 at scale 127 (values as in the lut).
TEST(Mxfp4, NibbleOrderAndTransposedLayout) {
  const int64_t R = 3, G = 2;
  std::vector<uint8_t> blocks(R * G * 16, 0x00), scales(R * G, 127);
  blocks[(0 * G + 0) * 16 + 0] = 0x71;   // r 0, g 0, b 0: low nibble 1 (0.5), high nibble 7 (6)
  blocks[(2 * G + 1) * 16 + 15] = 0x9a;  // r 2, g 1, b 15: low 10 (-1), high 9 (-0.5)
  blocks[(1 * G + 0) * 16 + 3] = 0x42;   // r 1, g 0, b 3: low 2 (1), high 4 (2)
  scales[1 * G + 0] = 129;               // ... times 4
  std::vector<uint16_t> out(G * 32 * R, 0xffff);
  mxfp4_dequantize_bf16(blocks.data(), scales.data(), R, G, out.data());
  auto at = [&](int64_t c, int64_t r) { return out[c * R + r]; };  // out (G*32, R)
  EXPECT_EQ(at(0, 0), 0x3f00);                                     // c = 0*32 + 2*0 + 0
  EXPECT_EQ(at(1, 0), 0x40c0);                                     // c = 1: the high nibble second
  EXPECT_EQ(at(32 + 30, 2), 0xbf80);                               // c = 1*32 + 2*15 + 0 = 62: -1
  EXPECT_EQ(at(32 + 31, 2), 0xbf00);                               // c = 63: -0.5
  EXPECT_EQ(at(6, 1), 0x4080);                                     // c = 2*3 + 0: 1 * 4 = 4
  EXPECT_EQ(at(7, 1), 0x4100);                                     // c = 7: 2 * 4 = 8
  int nonzero = 0;
  for (uint16_t v : out) nonzero += v != 0;
  EXPECT_EQ(nonzero, 6) << "every other element is +0 (and every element was written)";
  expect_same_bits(dequantize_reference(blocks, scales, R, G), out.data(), "R=3 G=2");
}

// Random slabs of sizes around the row tile (64) and realistic group counts.
TEST(Mxfp4, RandomSlabsAroundTheRowTile) {
  uint64_t seed = 1;
  for (int64_t R : {1, 2, 63, 64, 65, 129, 200})
    for (int64_t G : {1, 3, 5}) {
      const auto blocks = bytes_random(R * G * 16, seed++), scales = bytes_random(R * G, seed++);
      std::vector<uint16_t> got(G * 32 * R, 0x1234);
      mxfp4_dequantize_bf16(blocks.data(), scales.data(), R, G, got.data());
      expect_same_bits(dequantize_reference(blocks, scales, R, G), got.data(),
                       "R=" + std::to_string(R) + " G=" + std::to_string(G));
    }
}

// ---------------------------------------------------------------------------------------------------
// U8 tensors and row ranges in safetensors

using test_files::expect_error;
// A fresh directory under /tmp, removed with everything in it at the end of the test.
struct TempDir : test_files::TempDir {
  TempDir() : test_files::TempDir("fp_mxfp4") {}
};

// A gpt-oss-like file: one projection's blocks (E, R, G, 16) and scales (E, R, G) in U8, its bias
// (E, R) in F32 and a BF16 (E, 2, 3) tensor, written by safetensors_write.
struct ExpertFile {
  static constexpr int64_t E = 3, R = 5, G = 2;
  std::vector<uint8_t> blocks = bytes_random(E * R * G * 16, 11), scales = bytes_random(E * R * G, 12);
  std::vector<float> bias;
  std::vector<uint16_t> bf16;
  Shape blocks_shape{E, R, G, 16}, scales_shape{E, R, G}, bias_shape{E, R}, bf16_shape{E, 2, 3};

  explicit ExpertFile(const std::string& path) {
    Rng rng(13);
    for (int64_t i = 0; i < E * R; ++i) bias.push_back(static_cast<float>(rng.normal()));
    for (int64_t i = 0; i < E * 2 * 3; ++i) bf16.push_back(static_cast<uint16_t>(0x3f00 + 41 * i));
    safetensors_write(path,
                      {{"experts.gate_up_proj_bias", DType::DType_F32, bias_shape, bias.data()},
                       {"experts.other", DType::DType_BF16, bf16_shape, bf16.data()}},
                      {{"experts.gate_up_proj_blocks", blocks_shape, blocks.data()},
                       {"experts.gate_up_proj_scales", scales_shape, scales.data()}},
                      {{"format", "pt"}});
  }
};

TEST(Mxfp4Safetensors, U8ReadsAndRowRanges) {
  TempDir tmp;
  const std::string path = tmp.file("model.safetensors");
  const ExpertFile w(path);
  const int64_t E = w.E, R = w.R, G = w.G;
  const SafetensorsFile f(path);
  EXPECT_TRUE(f.is_u8("experts.gate_up_proj_blocks"));
  EXPECT_FALSE(f.is_u8("experts.gate_up_proj_bias"));
  EXPECT_EQ(f.shape("experts.gate_up_proj_scales"), w.scales_shape);
  EXPECT_EQ(f.dtype("experts.other"), DType::DType_BF16);
  expect_error([&] { f.dtype("experts.gate_up_proj_blocks"); }, {path, "'experts.gate_up_proj_blocks'", "U8"});

  std::vector<uint8_t> all(w.blocks.size());
  f.read_u8("experts.gate_up_proj_blocks", w.blocks_shape, all.data());
  EXPECT_EQ(all, w.blocks);

  // Expert by expert, as a loader goes: each expert's slab is the slice of the whole tensor, and its
  // dequantization is the reference's.
  std::vector<uint8_t> blk(R * G * 16), sc(R * G);
  std::vector<float> bias(R), out(G * 32 * R);
  for (int64_t e = 0; e < E; ++e) {
    f.read_u8_rows("experts.gate_up_proj_blocks", w.blocks_shape, e, 1, blk.data());
    f.read_u8_rows("experts.gate_up_proj_scales", w.scales_shape, e, 1, sc.data());
    f.read_f32_rows("experts.gate_up_proj_bias", w.bias_shape, e, 1, bias.data());
    EXPECT_TRUE(std::equal(blk.begin(), blk.end(), w.blocks.begin() + e * R * G * 16)) << "expert " << e;
    EXPECT_TRUE(std::equal(sc.begin(), sc.end(), w.scales.begin() + e * R * G)) << "expert " << e;
    EXPECT_TRUE(std::equal(bias.begin(), bias.end(), w.bias.begin() + e * R)) << "expert " << e;
    mxfp4_dequantize_f32(blk.data(), sc.data(), R, G, out.data());
    const std::vector<uint16_t> want = dequantize_reference(blk, sc, R, G);
    for (size_t i = 0; i < want.size(); ++i) {
      const float x = widen(want[i]);
      ASSERT_TRUE(std::memcmp(&out[i], &x, 4) == 0) << "expert " << e << " element " << i;
    }
  }
  // Two rows from the middle, none, and a BF16 tensor converted.
  std::vector<uint8_t> two(2 * R * G);
  f.read_u8_rows("experts.gate_up_proj_scales", w.scales_shape, 1, 2, two.data());
  EXPECT_TRUE(std::equal(two.begin(), two.end(), w.scales.begin() + R * G));
  f.read_u8_rows("experts.gate_up_proj_scales", w.scales_shape, E, 0, nullptr);
  std::vector<float> other(2 * 3);
  f.read_f32_rows("experts.other", w.bf16_shape, 2, 1, other.data());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(other[i], widen(w.bf16[12 + i])) << i;

  // A range outside [0, E) is the caller's bug.
  EXPECT_THROW(f.read_u8_rows("experts.gate_up_proj_scales", w.scales_shape, 2, 2, two.data()), InternalError);
  EXPECT_THROW(f.read_f32_rows("experts.gate_up_proj_bias", w.bias_shape, -1, 1, bias.data()), InternalError);
}

TEST(Mxfp4Safetensors, SetRecordsU8AndRangeReads) {
  TempDir tmp;
  const ExpertFile w(tmp.file("model.safetensors"));
  SafetensorsSet set(tmp.dir.string(), "model");
  EXPECT_EQ(set.unread().size(), 4u);
  std::vector<uint8_t> blk(w.R * w.G * 16), sc(w.E * w.R * w.G);
  std::vector<float> bias(w.R), other(w.E * 2 * 3);
  for (int64_t e = 0; e < w.E; ++e) {
    set.read_u8_rows("experts.gate_up_proj_blocks", w.blocks_shape, e, 1, blk.data());
    EXPECT_TRUE(std::equal(blk.begin(), blk.end(), w.blocks.begin() + e * w.R * w.G * 16)) << "expert " << e;
  }
  set.read_u8("experts.gate_up_proj_scales", w.scales_shape, sc.data());
  EXPECT_EQ(sc, w.scales);
  EXPECT_TRUE(set.dtypes_read().empty()) << "U8 is no DType";
  set.read_f32_rows("experts.gate_up_proj_bias", w.bias_shape, 0, 1, bias.data());
  EXPECT_EQ(set.unread(), std::vector<std::string>{"experts.other"});
  set.read_f32("experts.other", w.bf16_shape, other.data());
  EXPECT_TRUE(set.unread().empty());
  EXPECT_EQ(set.dtypes_read(), (std::set<DType>{DType::DType_F32, DType::DType_BF16}));
  expect_error([&] { set.read_u8("experts.missing", {1}, sc.data()); }, {"'experts.missing'"});
}

TEST(Mxfp4Safetensors, WrongDtypeOrShapeIsRefused) {
  TempDir tmp;
  const std::string path = tmp.file("model.safetensors");
  const ExpertFile w(path);
  const SafetensorsFile f(path);
  std::vector<uint8_t> bytes(4096);
  std::vector<float> floats(4096);
  std::vector<int32_t> ints(4096);
  const std::string blocks = "'experts.gate_up_proj_blocks'", bias = "'experts.gate_up_proj_bias'";
  // Another dtype: the tensor, the file, what it is and what was expected.
  expect_error([&] { f.read_u8("experts.gate_up_proj_bias", w.bias_shape, bytes.data()); },
               {path, bias, "dtype F32", "expected U8"});
  expect_error([&] { f.read_u8_rows("experts.other", w.bf16_shape, 0, 1, bytes.data()); },
               {path, "'experts.other'", "dtype BF16", "expected U8"});
  expect_error([&] { f.read_f32("experts.gate_up_proj_blocks", w.blocks_shape, floats.data()); },
               {path, blocks, "dtype U8", "expected a floating-point dtype"});
  expect_error([&] { f.read_f32_rows("experts.gate_up_proj_scales", w.scales_shape, 0, 1, floats.data()); },
               {path, "'experts.gate_up_proj_scales'", "dtype U8", "expected a floating-point dtype"});
  expect_error([&] { f.read_i32("experts.gate_up_proj_scales", w.scales_shape, ints.data()); },
               {path, "dtype U8", "expected I32 or I64"});
  // Another shape: both shapes, for whole and range reads.
  expect_error(
      [&] {
        f.read_u8("experts.gate_up_proj_blocks", {3, 5, 4, 16}, bytes.data());
      },
      {path, blocks, "(3, 5, 2, 16)", "expected (3, 5, 4, 16)"});
  expect_error(
      [&] {
        f.read_u8_rows("experts.gate_up_proj_blocks", {3, 5, 2}, 0, 1, bytes.data());
      },
      {path, blocks, "(3, 5, 2, 16)", "expected (3, 5, 2)"});
  expect_error(
      [&] {
        f.read_f32_rows("experts.gate_up_proj_bias", {4, 5}, 0, 1, floats.data());
      },
      {path, bias, "(3, 5)", "expected (4, 5)"});
  // The same through a set.
  SafetensorsSet set(tmp.dir.string(), "model");
  expect_error([&] { set.read_u8_rows("experts.gate_up_proj_bias", w.bias_shape, 0, 1, bytes.data()); },
               {path, bias, "dtype F32", "expected U8"});
  expect_error([&] { set.read_f32("experts.gate_up_proj_scales", w.scales_shape, floats.data()); },
               {path, "dtype U8", "expected a floating-point dtype"});
  EXPECT_EQ(set.unread().size(), 4u) << "a refused read is not recorded";
}

// The writer puts U8 data after every wider tensor, so each tensor stays aligned to its element size,
// and names must be unique across both lists.
TEST(Mxfp4Safetensors, WriterLaysOutU8Last) {
  TempDir tmp;
  const std::string path = tmp.file("a.safetensors");
  const std::vector<uint8_t> u8 = bytes_random(5, 3);
  const std::vector<float> f32 = {1.0f, 2.0f};
  safetensors_write(path, {{"z", DType::DType_F32, {2}, f32.data()}}, {{"a", {5}, u8.data()}}, {});
  const SafetensorsFile f(path);
  EXPECT_EQ(static_cast<const unsigned char*>(f.data("a")) - static_cast<const unsigned char*>(f.data("z")), 8);
  std::vector<uint8_t> got(5);
  f.read_u8("a", {5}, got.data());
  EXPECT_EQ(got, u8);
  expect_error(
      [&] {
        safetensors_write(path, {{"a", DType::DType_F32, {2}, f32.data()}}, {{"a", {5}, u8.data()}}, {});
      },
      {"'a'", "twice"});
}

}  // namespace
}  // namespace fp
