// SwiGLU and the clamped SwiGLU (ops/swiglu.h) on cuda. n elements.
//
// One thread per element, each operand f32 or bf16 on its own (widened on load, rounded once on store). The
// arithmetic is the cpu's scalar path (backend/cpu/kernels/swiglu.cpp) operation for operation, with its
// stable sigmoid (Note [Stable sigmoid] there: e = exp(-|g|), never an overflow), and -fmad=false keeps the
// products apart; the exponential is exp_f32 (common.cuh) where the cpu uses its Cephes polynomial (1 ulp,
// and 0 below -87): the error model, not the cpu's bits (Note [Bits as the cpu's] in common.cuh).
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace fp::ops::cuda {

namespace {

// s = sigmoid(g) and sc = 1 - s, both from e = exp(-|g|) in (0, 1].
__device__ __forceinline__ void sigmoid_pair(float g, float& s, float& sc) {
  const float e = exp_f32(-fabsf(g));
  const float inv = 1.0f / (1.0f + e);
  s = g >= 0.0f ? inv : e * inv;
  sc = g >= 0.0f ? e * inv : inv;
}

// The operand pointers of one call: each f32 or bf16 (kBf16 bit i set for operand i).
struct Ops {
  const void* g;
  const void* u;
  const void* da;
  void* out0;  // a (forward) or dg
  void* out1;  // du
  unsigned bf16;
};

template <int kIndex>
__device__ __forceinline__ float load(const Ops& o, const void* p, int64_t i) {
  return (o.bf16 >> kIndex) & 1u ? ld(static_cast<const bf16*>(p)[i]) : static_cast<const float*>(p)[i];
}
template <int kIndex>
__device__ __forceinline__ void store(const Ops& o, void* p, int64_t i, float v) {
  if ((o.bf16 >> kIndex) & 1u)
    static_cast<bf16*>(p)[i] = st<bf16>(v);
  else
    static_cast<float*>(p)[i] = v;
}

// kClamped: Note [The clamped SwiGLU] with alpha and limit; else the plain SwiGLU.
template <bool kClamped>
__global__ void swiglu_forward_kernel(Ops o, int64_t n, float alpha, float limit) {
  FP_CUDA_GRID_STRIDE(i, n) {
    const float g = load<0>(o, o.g, i), u = load<1>(o, o.u, i);
    float s, sc, a;
    if (kClamped) {
      const float gc = fminf(g, limit), uc = fminf(fmaxf(u, -limit), limit);
      sigmoid_pair(alpha * gc, s, sc);
      a = (uc + 1.0f) * (gc * s);
    } else {
      sigmoid_pair(g, s, sc);
      a = (g * s) * u;
    }
    store<3>(o, o.out0, i, a);
  }
}

template <bool kClamped>
__global__ void swiglu_backward_kernel(Ops o, int64_t n, float alpha, float limit) {
  FP_CUDA_GRID_STRIDE(i, n) {
    const float g = load<0>(o, o.g, i), u = load<1>(o, o.u, i), da = load<2>(o, o.da, i);
    float s, sc, dg, du;
    if (kClamped) {
      const float gc = fminf(g, limit), uc = fminf(fmaxf(u, -limit), limit);
      sigmoid_pair(alpha * gc, s, sc);
      const float glu = gc * s;                         // g_c sigmoid(alpha g_c)
      const float dglu = s * (1.0f + alpha * gc * sc);  // its derivative in g_c
      du = u >= -limit && u <= limit ? da * glu : 0.0f;
      dg = g <= limit ? (da * (uc + 1.0f)) * dglu : 0.0f;
    } else {
      sigmoid_pair(g, s, sc);
      du = da * (g * s);
      dg = (da * u) * (s * (1.0f + g * sc));
    }
    store<3>(o, o.out0, i, dg);
    store<4>(o, o.out1, i, du);
  }
}

unsigned bf16_bits(const char* kernel, std::initializer_list<DType> dtypes) {
  unsigned bits = 0, i = 0;
  for (const DType t : dtypes) {
    ::fp::cuda::float_check(t, kernel);
    bits |= (t == DType::DType_BF16 ? 1u : 0u) << i++;
  }
  return bits;
}

template <bool kClamped>
void forward(const ExecContext& c, const char* kernel, CBuf g, CBuf u, Buf a, int64_t n, float alpha, float limit) {
  if (n <= 0) return;
  // Operand 2 (da) is absent in the forward: its bit stays f32.
  const Ops o{g.p, u.p, nullptr, a.p, nullptr, bf16_bits(kernel, {g.dtype, u.dtype, DType::DType_F32, a.dtype})};
  swiglu_forward_kernel<kClamped><<<blocks_for(n), kThreads, 0, stream_of(c)>>>(o, n, alpha, limit);
  launched(kernel);
}

template <bool kClamped>
void backward(const ExecContext& c, const char* kernel, CBuf g, CBuf u, CBuf da, Buf dg, Buf du, int64_t n, float alpha,
              float limit) {
  if (n <= 0) return;
  const Ops o{g.p, u.p, da.p, dg.p, du.p, bf16_bits(kernel, {g.dtype, u.dtype, da.dtype, dg.dtype, du.dtype})};
  swiglu_backward_kernel<kClamped><<<blocks_for(n), kThreads, 0, stream_of(c)>>>(o, n, alpha, limit);
  launched(kernel);
}

}  // namespace

void swiglu_forward(const ExecContext& c, CBuf g, CBuf u, Buf a, int64_t n) {
  forward<false>(c, "swiglu_forward", g, u, a, n, 0.0f, 0.0f);
}

void swiglu_backward(const ExecContext& c, CBuf g, CBuf u, CBuf da, Buf dg, Buf du, int64_t n) {
  backward<false>(c, "swiglu_backward", g, u, da, dg, du, n, 0.0f, 0.0f);
}

void swiglu_clamped_forward(const ExecContext& c, CBuf g, CBuf u, Buf a, int64_t n, float alpha, float limit) {
  forward<true>(c, "swiglu_clamped_forward", g, u, a, n, alpha, limit);
}

void swiglu_clamped_backward(const ExecContext& c, CBuf g, CBuf u, CBuf da, Buf dg, Buf du, int64_t n, float alpha,
                             float limit) {
  backward<true>(c, "swiglu_clamped_backward", g, u, da, dg, du, n, alpha, limit);
}

}  // namespace fp::ops::cuda
