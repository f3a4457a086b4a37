// SwiGLU activation (ops/swiglu.h): a = silu(g) * u, silu(g) = g sigmoid(g). Dimensions: n elements.
//
// Note [Stable sigmoid]: sigmoid and 1 - sigmoid are both formed from e = exp(-|g|) in (0, 1]:
// for g >= 0, s = 1 / (1 + e) and 1 - s = e / (1 + e); for g < 0 the two swap. exp never overflows
// (g = -100 would give exp(100) = inf in float with the textbook 1 / (1 + exp(-g))), and 1 - s is
// never a cancelling subtraction, so silu'(g) = s (1 + g (1 - s)) stays accurate for large |g|.
//
// Note [Why SwiGLU has its own exp]: the activation runs on every routed token times the expert
// width, and glibc's scalar expf (~6 ns) made it cost ~10% of the expert GEMMs. g++ vectorises no
// libm call (without -ffast-math) and no float select (without -fno-trapping-math), so the body is
// written with SSE2 intrinsics (part of x86-64, as in adamw.cpp): a Cody-Waite reduction and the
// degree-5 Cephes polynomial, within 1 ulp of expf on (-87, 0] (measured: max relative error 8e-8),
// and exactly 0 below -87 where expf would be subnormal. The tail runs the same 4-wide code on a
// padded copy, so every element gets the same bits wherever a thread's range starts or ends; threads
// take fixed contiguous ranges. Elsewhere (no SSE2) a scalar loop with std::exp does the same math.
//
// Note [bf16 SwiGLU by f32 chunks]: with any bf16 operand each work block goes by chunks of kChunk
// elements: a bf16 input chunk is widened into a stack buffer (backend/cpu/kernels/convert.h), the f32 range
// code runs on it, and a bf16 output chunk is rounded back from the stack. An element's bits do not
// depend on where its range starts (above), so each output is the f32 kernel's on the widened inputs,
// rounded once; no allocation. The all-f32 case runs on the operands in place as before bf16 existed.
#include "ops/swiglu.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>

#include "backend/cpu/kernels/convert.h"
#include "backend/cpu/kernels/ops.h"
#include "core/error.h"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace fp::ops::cpu {

namespace {

using namespace chunked;  // kChunk, load, stage, store (Note [bf16 kernels by f32 chunks])

// Below this many elements a parallel region costs more than the work.
constexpr int64_t kParallelMinElements = int64_t{1} << 13;
// Elements per parallel work item: a multiple of 4, large enough to amortise the loop overhead.
constexpr int64_t kBlock = 4096;
#if defined(__SSE2__)

// exp(x) for x <= 0 (4 lanes); 0 below -87 (Note [Why SwiGLU has its own exp]).
inline __m128 exp_nonpositive(__m128 x) {
  const __m128 lo = _mm_set1_ps(-87.0f);
  const __m128 xc = _mm_max_ps(x, lo);
  const __m128i ni = _mm_cvtps_epi32(_mm_mul_ps(xc, _mm_set1_ps(1.44269504088896341f)));  // round to nearest
  const __m128 n = _mm_cvtepi32_ps(ni);
  // r = x - n ln2, with ln2 split in a part exact in float and a correction.
  __m128 r = _mm_sub_ps(xc, _mm_mul_ps(n, _mm_set1_ps(0.693359375f)));
  r = _mm_sub_ps(r, _mm_mul_ps(n, _mm_set1_ps(-2.12194440e-4f)));
  __m128 p = _mm_set1_ps(1.9875691500e-4f);
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.3981999507e-3f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(8.3334519073e-3f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(4.1665795894e-2f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.6666665459e-1f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(5.0000001201e-1f));
  p = _mm_add_ps(_mm_add_ps(_mm_mul_ps(_mm_mul_ps(p, r), r), r), _mm_set1_ps(1.0f));
  const __m128 scale = _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(ni, _mm_set1_epi32(127)), 23));  // 2^n
  return _mm_andnot_ps(_mm_cmplt_ps(x, lo), _mm_mul_ps(p, scale));
}

inline __m128 select(__m128 mask, __m128 a, __m128 b) { return _mm_or_ps(_mm_and_ps(mask, a), _mm_andnot_ps(mask, b)); }

// s = sigmoid(g), sc = 1 - s, silu = g s (Note [Stable sigmoid]).
inline void sigmoid4(__m128 g, __m128& s, __m128& sc) {
  const __m128 neg_abs = _mm_or_ps(g, _mm_set1_ps(-0.0f));  // -|g|
  const __m128 e = exp_nonpositive(neg_abs);
  const __m128 inv = _mm_div_ps(_mm_set1_ps(1.0f), _mm_add_ps(_mm_set1_ps(1.0f), e));
  const __m128 e_inv = _mm_mul_ps(e, inv);
  const __m128 nonneg = _mm_cmpge_ps(g, _mm_setzero_ps());
  s = select(nonneg, inv, e_inv);
  sc = select(nonneg, e_inv, inv);
}

inline void forward4(const float* g, const float* u, float* a) {
  const __m128 gv = _mm_loadu_ps(g);
  __m128 s, sc;
  sigmoid4(gv, s, sc);
  _mm_storeu_ps(a, _mm_mul_ps(_mm_mul_ps(gv, s), _mm_loadu_ps(u)));
}

inline void backward4(const float* g, const float* u, const float* da, float* dg, float* du) {
  const __m128 gv = _mm_loadu_ps(g), dav = _mm_loadu_ps(da);
  __m128 s, sc;
  sigmoid4(gv, s, sc);
  _mm_storeu_ps(du, _mm_mul_ps(dav, _mm_mul_ps(gv, s)));
  const __m128 dsilu = _mm_mul_ps(s, _mm_add_ps(_mm_set1_ps(1.0f), _mm_mul_ps(gv, sc)));
  _mm_storeu_ps(dg, _mm_mul_ps(_mm_mul_ps(dav, _mm_loadu_ps(u)), dsilu));
}

void forward_range(const float* g, const float* u, float* a, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) forward4(g + i, u + i, a + i);
  if (i < n) {
    float gp[4] = {}, up[4] = {}, ap[4];  // the tail, padded to 4 lanes
    std::copy(g + i, g + n, gp);
    std::copy(u + i, u + n, up);
    forward4(gp, up, ap);
    std::copy(ap, ap + (n - i), a + i);
  }
}

void backward_range(const float* g, const float* u, const float* da, float* dg, float* du, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) backward4(g + i, u + i, da + i, dg + i, du + i);
  if (i < n) {
    float gp[4] = {}, up[4] = {}, dap[4] = {}, dgp[4], dup[4];  // the tail, padded to 4 lanes
    std::copy(g + i, g + n, gp);
    std::copy(u + i, u + n, up);
    std::copy(da + i, da + n, dap);
    backward4(gp, up, dap, dgp, dup);
    std::copy(dgp, dgp + (n - i), dg + i);
    std::copy(dup, dup + (n - i), du + i);
  }
}

#else  // no SSE2: the same math with std::exp

inline void sigmoid_pair(float g, float& s, float& sc) {
  const float e = std::exp(-std::abs(g));
  const float inv = 1.0f / (1.0f + e);
  s = g >= 0.0f ? inv : e * inv;
  sc = g >= 0.0f ? e * inv : inv;
}

void forward_range(const float* g, const float* u, float* a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float s, sc;
    sigmoid_pair(g[i], s, sc);
    a[i] = (g[i] * s) * u[i];
  }
}

void backward_range(const float* g, const float* u, const float* da, float* dg, float* du, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float s, sc;
    sigmoid_pair(g[i], s, sc);
    du[i] = da[i] * (g[i] * s);
    dg[i] = (da[i] * u[i]) * (s * (1.0f + g[i] * sc));
  }
}

#endif

// Note [The clamped SwiGLU] (ops/swiglu.h) in f32 with the stable sigmoid (Note [Stable sigmoid]) of alpha g_c;
// the clamps' gradient passes where torch.clamp's does (bounds included). With SSE2, 4 lanes at a time with
// the same exp as the plain SwiGLU (Note [Why SwiGLU has its own exp]), the tail padded; else one element at
// a time with std::exp.
#if defined(__SSE2__)
inline void clamped_forward4(const float* g, const float* u, float* a, __m128 alpha, __m128 lim) {
  const __m128 gc = _mm_min_ps(_mm_loadu_ps(g), lim);
  const __m128 uc = _mm_max_ps(_mm_min_ps(_mm_loadu_ps(u), lim), _mm_sub_ps(_mm_setzero_ps(), lim));
  __m128 s, sc;
  sigmoid4(_mm_mul_ps(alpha, gc), s, sc);
  _mm_storeu_ps(a, _mm_mul_ps(_mm_add_ps(uc, _mm_set1_ps(1.0f)), _mm_mul_ps(gc, s)));
}

inline void clamped_backward4(const float* g, const float* u, const float* da, float* dg, float* du, __m128 alpha,
                              __m128 lim) {
  const __m128 gv = _mm_loadu_ps(g), uv = _mm_loadu_ps(u), dav = _mm_loadu_ps(da);
  const __m128 neg = _mm_sub_ps(_mm_setzero_ps(), lim);
  const __m128 gc = _mm_min_ps(gv, lim), uc = _mm_max_ps(_mm_min_ps(uv, lim), neg);
  __m128 s, sc;
  sigmoid4(_mm_mul_ps(alpha, gc), s, sc);
  const __m128 glu = _mm_mul_ps(gc, s);                                                                     // g_c s
  const __m128 dglu = _mm_mul_ps(s, _mm_add_ps(_mm_set1_ps(1.0f), _mm_mul_ps(_mm_mul_ps(alpha, gc), sc)));  // d/dg_c
  const __m128 u_in = _mm_and_ps(_mm_cmpge_ps(uv, neg), _mm_cmple_ps(uv, lim));
  _mm_storeu_ps(du, _mm_and_ps(u_in, _mm_mul_ps(dav, glu)));
  const __m128 dgv = _mm_mul_ps(_mm_mul_ps(dav, _mm_add_ps(uc, _mm_set1_ps(1.0f))), dglu);
  _mm_storeu_ps(dg, _mm_and_ps(_mm_cmple_ps(gv, lim), dgv));
}

void clamped_forward_range(const float* g, const float* u, float* a, int64_t n, float alpha, float limit) {
  const __m128 al = _mm_set1_ps(alpha), lim = _mm_set1_ps(limit);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) clamped_forward4(g + i, u + i, a + i, al, lim);
  if (i < n) {
    float gp[4] = {}, up[4] = {}, ap[4];  // the tail, padded to 4 lanes
    std::copy(g + i, g + n, gp);
    std::copy(u + i, u + n, up);
    clamped_forward4(gp, up, ap, al, lim);
    std::copy(ap, ap + (n - i), a + i);
  }
}

void clamped_backward_range(const float* g, const float* u, const float* da, float* dg, float* du, int64_t n,
                            float alpha, float limit) {
  const __m128 al = _mm_set1_ps(alpha), lim = _mm_set1_ps(limit);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) clamped_backward4(g + i, u + i, da + i, dg + i, du + i, al, lim);
  if (i < n) {
    float gp[4] = {}, up[4] = {}, dap[4] = {}, dgp[4], dup[4];  // the tail, padded to 4 lanes
    std::copy(g + i, g + n, gp);
    std::copy(u + i, u + n, up);
    std::copy(da + i, da + n, dap);
    clamped_backward4(gp, up, dap, dgp, dup, al, lim);
    std::copy(dgp, dgp + (n - i), dg + i);
    std::copy(dup, dup + (n - i), du + i);
  }
}
#else
void clamped_forward_range(const float* g, const float* u, float* a, int64_t n, float alpha, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    const float gc = std::min(g[i], limit), uc = std::clamp(u[i], -limit, limit);
    float s, sc;
    sigmoid_pair(alpha * gc, s, sc);
    a[i] = (uc + 1.0f) * (gc * s);
  }
}

void clamped_backward_range(const float* g, const float* u, const float* da, float* dg, float* du, int64_t n,
                            float alpha, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    const float gc = std::min(g[i], limit), uc = std::clamp(u[i], -limit, limit);
    float s, sc;
    sigmoid_pair(alpha * gc, s, sc);
    const float glu = gc * s;                         // g_c sigmoid(alpha g_c)
    const float dglu = s * (1.0f + alpha * gc * sc);  // its derivative in g_c
    du[i] = u[i] >= -limit && u[i] <= limit ? da[i] * glu : 0.0f;
    dg[i] = g[i] <= limit ? (da[i] * (uc + 1.0f)) * dglu : 0.0f;
  }
}
#endif

// Runs range(g, u, a, len) over the n elements in blocks across threads: on the operands in place when all
// are f32, else by f32 chunks (Note [bf16 SwiGLU by f32 chunks]). An element's bits do not depend on where
// its range starts, so both ways give the same bits.
template <class Range>
void forward_blocks(const char* kernel, CBuf g, CBuf u, Buf a, int64_t n, Range range) {
  const bool all_f32 = f32(g.dtype) && f32(u.dtype) && f32(a.dtype);
  if (!all_f32) chunked::dtypes_check(kernel, {{"g", g.dtype}, {"u", u.dtype}, {"a", a.dtype}});
  const int64_t nblocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t i = b * kBlock, len = std::min(kBlock, n - i);
    if (all_f32) {
      range(static_cast<const float*>(g.p) + i, static_cast<const float*>(u.p) + i, static_cast<float*>(a.p) + i,
            len);
      continue;
    }
    for (int64_t c = i; c < i + len; c += kChunk) {
      const int64_t m = std::min(kChunk, i + len - c);
      float gt[kChunk], ut[kChunk], at[kChunk];
      float* af = stage(a.at(c), at);
      range(load(g.at(c), gt, m), load(u.at(c), ut, m), af, m);
      store(a.at(c), af, m);
    }
  }
}

// The same for the backward's range(g, u, da, dg, du, len).
template <class Range>
void backward_blocks(const char* kernel, CBuf g, CBuf u, CBuf da, Buf dg, Buf du, int64_t n, Range range) {
  const bool all_f32 = f32(g.dtype) && f32(u.dtype) && f32(da.dtype) && f32(dg.dtype) && f32(du.dtype);
  if (!all_f32)
    chunked::dtypes_check(kernel, {{"g", g.dtype}, {"u", u.dtype}, {"da", da.dtype}, {"dg", dg.dtype}, {"du", du.dtype}});
  const int64_t nblocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t i = b * kBlock, len = std::min(kBlock, n - i);
    if (all_f32) {
      range(static_cast<const float*>(g.p) + i, static_cast<const float*>(u.p) + i, static_cast<const float*>(da.p) + i,
            static_cast<float*>(dg.p) + i, static_cast<float*>(du.p) + i, len);
      continue;
    }
    for (int64_t c = i; c < i + len; c += kChunk) {
      const int64_t m = std::min(kChunk, i + len - c);
      float gt[kChunk], ut[kChunk], dat[kChunk], dgt[kChunk], dut[kChunk];
      float* dgf = stage(dg.at(c), dgt);
      float* duf = stage(du.at(c), dut);
      range(load(g.at(c), gt, m), load(u.at(c), ut, m), load(da.at(c), dat, m), dgf, duf, m);
      store(dg.at(c), dgf, m);
      store(du.at(c), duf, m);
    }
  }
}

}  // namespace

void swiglu_forward(CBuf g, CBuf u, Buf a, int64_t n) { forward_blocks("swiglu_forward", g, u, a, n, forward_range); }

void swiglu_backward(CBuf g, CBuf u, CBuf da, Buf dg, Buf du, int64_t n) {
  backward_blocks("swiglu_backward", g, u, da, dg, du, n, backward_range);
}

void swiglu_clamped_forward(CBuf g, CBuf u, Buf a, int64_t n, float alpha, float limit) {
  forward_blocks("swiglu_clamped_forward", g, u, a, n, [=](const float* gp, const float* up, float* ap, int64_t m) {
    clamped_forward_range(gp, up, ap, m, alpha, limit);
  });
}

void swiglu_clamped_backward(CBuf g, CBuf u, CBuf da, Buf dg, Buf du, int64_t n, float alpha, float limit) {
  backward_blocks("swiglu_clamped_backward", g, u, da, dg, du, n,
                  [=](const float* gp, const float* up, const float* dap, float* dgp, float* dup, int64_t m) {
                    clamped_backward_range(gp, up, dap, dgp, dup, m, alpha, limit);
                  });
}

}  // namespace fp::ops::cpu
