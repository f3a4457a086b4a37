// Rotary position embedding (ops/rope.h) on cuda, rotate-half or interleaved pairs, in place.
// Dimensions: n tokens, heads heads, hd head_dim (even), half = hd / 2 rotation pairs, head_stride apart.
//
// One thread per (token, pair): the angle pos * inv_freq[i] in double (Note [Why RoPE angles are taken in
// double] in backend/cpu/kernels/rope.cpp), cos and sin in double times the factor s, rounded to float, then
// the pair rotated in every head of the token with the cpu's float operations (x cos - y sin, y cos + x sin;
// the transpose has sin negated, exactly). CUDA's double cos and sin are within 2 ulps of double where glibc's
// are within 1, so a float cos or sin can round the other way in rare cases: the error model, bit for bit
// with the cpu almost everywhere. x f32 or bf16 (widened on load, rounded once on store).
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace fp::ops::cuda {

namespace {

template <class T>
__global__ void rope_kernel(T* x, const int32_t* pos, int64_t n, int64_t heads, int64_t half, int64_t stride,
                            bool interleaved, const double* inv_freq, double scale, float sin_sign) {
  FP_CUDA_GRID_STRIDE(e, n * half) {
    const int64_t t = e / half, i = e - t * half;
    const double a = static_cast<double>(pos[t]) * inv_freq[i];
    const float cs = static_cast<float>(scale * cos(a));
    const float sn = sin_sign * static_cast<float>(scale * sin(a));
    const int64_t i1 = interleaved ? 2 * i : i, i2 = interleaved ? 2 * i + 1 : i + half;
    for (int64_t h = 0; h < heads; ++h) {
      T* xh = x + (t * heads + h) * stride;  // (hd)
      const float p = ld(xh[i1]), q = ld(xh[i2]);
      xh[i1] = st<T>(p * cs - q * sn);
      xh[i2] = st<T>(q * cs + p * sn);
    }
  }
}

void rope(const ExecContext& c, const char* kernel, Buf x, const int32_t* pos, int64_t n, int64_t heads, int64_t hd,
          int64_t stride, bool interleaved, RopeFreqs f, float sin_sign) {
  if (hd <= 0 || hd % 2 != 0) cuda_refuse(kernel, "head_dim must be even and positive");
  if (stride < hd) cuda_refuse(kernel, "head_stride below head_dim");
  const int64_t half = hd / 2;
  if (n * heads * half <= 0) return;
  if (f.inv_freq == nullptr) cuda_refuse(kernel, "no frequencies");
  visit_float(x.dtype, kernel, [&]<class T>() {
    rope_kernel<<<blocks_for(n * half), kThreads, 0, stream_of(c)>>>(static_cast<T*>(x.p), pos, n, heads, half, stride,
                                                                     interleaved, f.inv_freq,
                                                                     static_cast<double>(f.scale), sin_sign);
  });
  launched(kernel);
}

}  // namespace

void rope_forward(const ExecContext& c, Buf x, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, RopeFreqs f) {
  rope(c, "rope_forward", x, pos, n, heads, hd, hd, false, f, 1.0f);
}

void rope_backward(const ExecContext& c, Buf dx, const int32_t* pos, int64_t n, int64_t heads, int64_t hd,
                   RopeFreqs f) {
  rope(c, "rope_backward", dx, pos, n, heads, hd, hd, false, f, -1.0f);
}

void rope_strided_forward(const ExecContext& c, Buf x, const int32_t* pos, int64_t n, int64_t heads, int64_t hd,
                          int64_t head_stride, bool interleaved, RopeFreqs f) {
  rope(c, "rope_strided_forward", x, pos, n, heads, hd, head_stride, interleaved, f, 1.0f);
}

void rope_strided_backward(const ExecContext& c, Buf dx, const int32_t* pos, int64_t n, int64_t heads, int64_t hd,
                           int64_t head_stride, bool interleaved, RopeFreqs f) {
  rope(c, "rope_strided_backward", dx, pos, n, heads, hd, head_stride, interleaved, f, -1.0f);
}

}  // namespace fp::ops::cuda
