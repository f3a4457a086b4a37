// MXFP4 dequantization (Note [MXFP4 in gpt-oss checkpoints] in io/mxfp4.h).
#include "io/mxfp4.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"

namespace fp {

namespace {

// FP4 e2m1 values by nibble, transformers' FP4_VALUES (bit 3 is the sign: nibble 8 is -0).
constexpr float kFp4Values[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// Every value a (nibble, scale) pair can take, made once: the inner loop is two table loads per byte.
struct Mxfp4Tables {
  uint16_t bf16[256][16];  // (scale, nibble)
  float f32[256][16];      // the same, widened
  Mxfp4Tables() {
    for (int s = 0; s < 256; ++s)
      for (int n = 0; n < 16; ++n) {
        bf16[s][n] = mxfp4_bf16(static_cast<uint8_t>(n), static_cast<uint8_t>(s));
        f32[s][n] = bf16_to_float(bf16[s][n]);
      }
  }
};

const Mxfp4Tables& mxfp4_tables() {
  static const Mxfp4Tables tables;
  return tables;
}

// Rows of the stored matrix per tile. The output is the slab transposed: block (r, g) fills 32 output
// rows at column r. A tile's blocks (kRowTile cache lines) stay in L1 while the loop writes, for each
// of the 32 output rows in turn, a run of kRowTile contiguous elements.
constexpr int64_t kRowTile = 64;

template <class T>
void mxfp4_dequantize_with(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t groups,
                           const T (*table)[16], T* out) {
  for (int64_t r0 = 0; r0 < rows; r0 += kRowTile) {
    const int64_t r1 = std::min(rows, r0 + kRowTile);
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t b = 0; b < kMxfp4BlockBytes; ++b) {
        T* lo = out + (g * kMxfp4GroupSize + 2 * b) * rows;  // output row g*32 + 2b: the low nibbles
        T* hi = lo + rows;                                   // output row g*32 + 2b + 1: the high ones
        for (int64_t r = r0; r < r1; ++r) {
          const uint8_t byte = blocks[(r * groups + g) * kMxfp4BlockBytes + b];
          const T* value = table[scales[r * groups + g]];
          lo[r] = value[byte & 0x0f];
          hi[r] = value[byte >> 4];
        }
      }
    }
  }
}

}  // namespace

uint16_t mxfp4_bf16(uint8_t nibble, uint8_t scale) {
  // std::ldexp in float is exact for these values (a true ldexp, as torch's; Note [MXFP4 in gpt-oss
  // checkpoints]); overflow gives +-inf, which bf16_from_float keeps.
  return bf16_from_float(std::ldexp(kFp4Values[nibble & 0x0f], static_cast<int>(scale) - 127));
}

void mxfp4_dequantize_bf16(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t groups, uint16_t* out) {
  mxfp4_dequantize_with(blocks, scales, rows, groups, mxfp4_tables().bf16, out);
}

void mxfp4_dequantize_f32(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t groups, float* out) {
  mxfp4_dequantize_with(blocks, scales, rows, groups, mxfp4_tables().f32, out);
}

}  // namespace fp
