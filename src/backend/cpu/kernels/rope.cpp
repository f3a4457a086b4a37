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
//
// bf16 x: each head's hd numbers are widened into the thread's buffer (backend/cpu/kernels/convert.h), rotated
// by the same float loop, and rounded back: one rounding per element, the bits of the f32 kernel on
// the widened x. The buffer is the cos/sin one made hd longer: no allocation beyond the f32 path's.
#include "ops/rope.h"

#include <cmath>

#include "backend/cpu/kernels/convert.h"
#include "backend/cpu/kernels/ops.h"
#include "core/error.h"

namespace fp::ops::cpu {

namespace {

// Below this many elements (n * heads * hd) a parallel region costs more than the work.
constexpr int64_t kParallelMinElements = int64_t{1} << 14;

// One head (hd = 2 half numbers) rotated in place by cos cs (half) and sin sn (half): pair i is
// (i, i + half), or (2i, 2i + 1) when interleaved.
inline void rotate_head(float* __restrict x, const float* __restrict cs, const float* __restrict sn, int64_t half,
                        bool interleaved) {
  if (interleaved) {
    for (int64_t i = 0; i < half; ++i) {
      const float a = x[2 * i], b = x[2 * i + 1];
      x[2 * i] = a * cs[i] - b * sn[i];
      x[2 * i + 1] = b * cs[i] + a * sn[i];
    }
    return;
  }
  float* __restrict x1 = x;         // (half) first halves
  float* __restrict x2 = x + half;  // (half) second halves
  for (int64_t i = 0; i < half; ++i) {
    const float a = x1[i], b = x2[i];
    x1[i] = a * cs[i] - b * sn[i];
    x2[i] = b * cs[i] + a * sn[i];
  }
}

// sin_sign = +1: forward rotation; -1: its transpose. Head h of token t at x + (t heads + h) stride;
// pair i is (i, i + half), or (2i, 2i + 1) when interleaved.
void rope_rotate(const char* kernel, Buf x, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, int64_t stride,
                 bool interleaved, RopeFreqs f, float sin_sign) {
  FP_ASSERT(hd % 2 == 0 && hd > 0, "rope head_dim {} must be even", hd);
  FP_ASSERT(f.inv_freq != nullptr || n == 0, "rope without frequencies");
  const bool f32x = x.dtype == DType::DType_F32;
  FP_ASSERT(f32x || x.dtype == DType::DType_BF16, "{} takes an f32 or bf16 x, got {}", kernel, dtype_name(x.dtype));
  const int64_t half = hd / 2;
  const double* inv_freq = f.inv_freq;  // (half)
  const double scale = f.scale;
#pragma omp parallel if (n * heads * hd >= kParallelMinElements)
  {
    // (2, half): cos then sin of this token's angles; then, for bf16 x, (hd) one head widened.
    std::vector<float> cos_sin(f32x ? hd : 2 * hd);
    float* __restrict cs = cos_sin.data();
    float* __restrict sn = cos_sin.data() + half;
    float* widened = cos_sin.data() + hd;  // (hd) bf16 x only
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const double a = static_cast<double>(pos[t]) * inv_freq[i];
        cs[i] = static_cast<float>(scale * std::cos(a));
        sn[i] = sin_sign * static_cast<float>(scale * std::sin(a));
      }
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t off = (t * heads + h) * stride;
        if (f32x) {
          rotate_head(static_cast<float*>(x.p) + off, cs, sn, half, interleaved);
          continue;
        }
        bf16_to_f32(static_cast<const bf16*>(x.p) + off, widened, hd);
        rotate_head(widened, cs, sn, half, interleaved);
        f32_to_bf16(widened, static_cast<bf16*>(x.p) + off, hd);
      }
    }
  }
}

}  // namespace

void rope_forward(Buf x, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, RopeFreqs f) {
  rope_rotate("rope_forward", x, pos, n, heads, hd, hd, false, f, 1.0f);
}

void rope_backward(Buf dx, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, RopeFreqs f) {
  rope_rotate("rope_backward", dx, pos, n, heads, hd, hd, false, f, -1.0f);
}

void rope_strided_forward(Buf x, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, int64_t head_stride,
                          bool interleaved, RopeFreqs f) {
  FP_ASSERT(head_stride >= hd, "rope_strided: head_stride {} < hd {}", head_stride, hd);
  rope_rotate("rope_strided_forward", x, pos, n, heads, hd, head_stride, interleaved, f, 1.0f);
}

void rope_strided_backward(Buf dx, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, int64_t head_stride,
                           bool interleaved, RopeFreqs f) {
  FP_ASSERT(head_stride >= hd, "rope_strided: head_stride {} < hd {}", head_stride, hd);
  rope_rotate("rope_strided_backward", dx, pos, n, heads, hd, head_stride, interleaved, f, -1.0f);
}

}  // namespace fp::ops::cpu
