// Rotary position embedding (ops/rope.h), rotate-half layout.
// Dimensions: n tokens, heads heads, hd head_dim (even), half = hd / 2 rotation pairs.
//
// Threads split the tokens. Each token's cos and sin (half each) are computed once, in double from
// the angle pos * inv_freq (Note [Why RoPE angles are taken in double]) and times the factor s, into a
// per-thread buffer
// allocated once per call, and shared by all heads of the token; the rotation itself is a float loop
// over i that g++ vectorises.
//
// Note [Why RoPE angles are taken in double]: at position 32k the angle of the fastest pair is 32768
// radians; in float its rounding error alone is ~2e-3 rad, so cos/sin would be off in the third
// digit. In double the angle is exact to ~1e-12 and only the final cos/sin roundings to float remain.
// (Hugging Face computes the angle in float32; a PyTorch twin must use float64 to match this.)
//
// Backward is the transpose rotation, the same loop with sin negated (negation is exact).
#include "ops/rope.h"

#include <cmath>

#include "core/error.h"

namespace fp::ops::cpu {

namespace {

// Below this many elements (n * heads * hd) a parallel region costs more than the work.
constexpr int64_t kParallelMinElements = int64_t{1} << 14;

// sin_sign = +1: forward rotation; -1: its transpose. Head h of token t at x + (t heads + h) stride;
// pair i is (i, i + half), or (2i, 2i + 1) when interleaved.
void rope_rotate(float* x, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, int64_t stride, bool interleaved,
                 RopeFreqs f, float sin_sign) {
  FP_ASSERT(hd % 2 == 0 && hd > 0, "rope head_dim {} must be even", hd);
  FP_ASSERT(f.inv_freq != nullptr || n == 0, "rope without frequencies");
  const int64_t half = hd / 2;
  const double* inv_freq = f.inv_freq;  // (half)
  const double scale = f.scale;
#pragma omp parallel if (n * heads * hd >= kParallelMinElements)
  {
    std::vector<float> cos_sin(hd);  // (2, half): cos then sin of this token's angles
    float* __restrict cs = cos_sin.data();
    float* __restrict sn = cos_sin.data() + half;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const double a = static_cast<double>(pos[t]) * inv_freq[i];
        cs[i] = static_cast<float>(scale * std::cos(a));
        sn[i] = sin_sign * static_cast<float>(scale * std::sin(a));
      }
      for (int64_t h = 0; h < heads; ++h) {
        if (interleaved) {
          float* __restrict xp = x + (t * heads + h) * stride;  // (half, 2) pairs
          for (int64_t i = 0; i < half; ++i) {
            const float a = xp[2 * i], b = xp[2 * i + 1];
            xp[2 * i] = a * cs[i] - b * sn[i];
            xp[2 * i + 1] = b * cs[i] + a * sn[i];
          }
          continue;
        }
        float* __restrict x1 = x + (t * heads + h) * stride;  // (half) first halves
        float* __restrict x2 = x1 + half;                     // (half) second halves
        for (int64_t i = 0; i < half; ++i) {
          const float a = x1[i], b = x2[i];
          x1[i] = a * cs[i] - b * sn[i];
          x2[i] = b * cs[i] + a * sn[i];
        }
      }
    }
  }
}

}  // namespace

void rope_forward(float* x, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, RopeFreqs f) {
  rope_rotate(x, pos, n, heads, hd, hd, false, f, 1.0f);
}

void rope_backward(float* dx, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, RopeFreqs f) {
  rope_rotate(dx, pos, n, heads, hd, hd, false, f, -1.0f);
}

void rope_strided_forward(float* x, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, int64_t head_stride,
                          bool interleaved, RopeFreqs f) {
  FP_ASSERT(head_stride >= hd, "rope_strided: head_stride {} < hd {}", head_stride, hd);
  rope_rotate(x, pos, n, heads, hd, head_stride, interleaved, f, 1.0f);
}

void rope_strided_backward(float* dx, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, int64_t head_stride,
                           bool interleaved, RopeFreqs f) {
  FP_ASSERT(head_stride >= hd, "rope_strided: head_stride {} < hd {}", head_stride, hd);
  rope_rotate(dx, pos, n, heads, hd, head_stride, interleaved, f, -1.0f);
}

}  // namespace fp::ops::cpu
