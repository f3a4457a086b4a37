// AdamW update (ops/adamw.h). Dimensions: n elements.
//
// Nearly memory bound: 16 bytes read (param, grad, m, v) and 12 written per element, a dozen flops
// of which two divides and a sqrt. One pass, 8-wide AVX2 where the cpu has it, else 4-wide SSE
// (Note [Why AdamW uses SSE intrinsics], Note [AdamW's AVX2 path has no FMA]), and threads take fixed
// contiguous blocks (schedule(static)). A bf16 gradient and a working copy of the weights join the
// AVX2 pass, and the other paths in chunks (Note [AdamW with bf16 operands]).
#include "ops/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "backend/cpu/kernels/ops.h"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "backend/cpu/kernels/adamw_path.h"
#include "backend/cpu/kernels/convert.h"
#include "backend/cpu/kernels/cpu_features.h"
#include "core/error.h"
#if defined(__x86_64__) && defined(__GNUC__)
#include "backend/cpu/kernels/convert_avx2.h"
#endif

namespace fp::ops::cpu {

namespace {

// Below this many elements a parallel region costs more than the update (norm weights, the router).
constexpr int64_t kParallelMinElements = int64_t{1} << 15;
// Each thread's share is cut into blocks of this many elements; a multiple of every SIMD width.
constexpr int64_t kBlockElements = int64_t{1} << 13;
// A block's chunk under Note [AdamW with bf16 operands]: the widened gradient (4 KiB) and the chunk's
// weights stay in L1 between the widening, the update and the rounding into the copy.
constexpr int64_t kChunkElements = int64_t{1} << 10;
static_assert(kBlockElements % kChunkElements == 0);

struct AdamwScalars {
  float decay;  // 1 - lr * weight_decay
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float step_size;  // lr / bc1
  float bc2_sqrt;   // sqrt(bc2)
  float eps;
  float grad_scale;
};

// Note [AdamW is element-wise] (ops/adamw.h): every element goes through the same sequence of float
// operations, in the 8- and 4-wide bodies and in the scalar tail alike. Add, multiply, divide and sqrt are
// correctly rounded in both (addps/addss, sqrtps/sqrtss, ...), so an element gets the same bits
// wherever a range starts or ends. The order follows torch.optim.AdamW (single-tensor path):
// v + ((1 - beta2) * g) * g as addcmul does, denom = sqrt(v) / sqrt(bc2) + eps, then
// param * decay - (step_size * m) / denom as addcdiv does.
//
// Note [Why AdamW uses SSE intrinsics]: g++ 12 does not vectorise a loop calling std::sqrt unless
// -fno-math-errno is given (sqrt of a negative must set errno, so the call stays behind a branch),
// and neither the optimize attribute nor the pragma lifts it. The body is written once with SSE
// (part of x86-64, no -march needed) and again with AVX2 for cpus that have it (chosen at run time,
// backend/cpu/kernels/adamw_path.h); the scalar loop is both the tail and the path elsewhere. No FMA exists in
// the baseline target, so all paths round identically; a build with -march=<FMA cpu> must compile
// this file with -ffp-contract=off (test_adamw's sub-range and path memcmp tests catch it).
// AVX-512 would be the same body at 16 wide; it is not written because no machine here has it to
// test it, and the pass is memory bound (the paths' rates differ by ~10-20%, docs/benchmarks.md).
inline void adamw_element(float& param, float grad, float& m, float& v, const AdamwScalars& s) {
  const float g = grad * s.grad_scale;
  const float mi = s.beta1 * m + s.one_minus_beta1 * g;
  const float vi = s.beta2 * v + s.one_minus_beta2 * g * g;
  const float denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
  m = mi;
  v = vi;
  param = param * s.decay - s.step_size * mi / denom;
}

void adamw_range_scalar(float* __restrict param, const float* __restrict grad, float* __restrict m, float* __restrict v,
                        int64_t n, const AdamwScalars& s) {
  for (int64_t i = 0; i < n; ++i) adamw_element(param[i], grad[i], m[i], v[i], s);
}

void adamw_range_sse(float* __restrict param, const float* __restrict grad, float* __restrict m, float* __restrict v,
                     int64_t n, const AdamwScalars& s) {
  int64_t i = 0;
#if defined(__SSE2__)
  const __m128 decay = _mm_set1_ps(s.decay), b1 = _mm_set1_ps(s.beta1), omb1 = _mm_set1_ps(s.one_minus_beta1);
  const __m128 b2 = _mm_set1_ps(s.beta2), omb2 = _mm_set1_ps(s.one_minus_beta2);
  const __m128 step_size = _mm_set1_ps(s.step_size), bc2_sqrt = _mm_set1_ps(s.bc2_sqrt);
  const __m128 eps = _mm_set1_ps(s.eps), grad_scale = _mm_set1_ps(s.grad_scale);
  for (; i + 4 <= n; i += 4) {
    const __m128 g = _mm_mul_ps(_mm_loadu_ps(grad + i), grad_scale);
    const __m128 mi = _mm_add_ps(_mm_mul_ps(b1, _mm_loadu_ps(m + i)), _mm_mul_ps(omb1, g));
    const __m128 vi = _mm_add_ps(_mm_mul_ps(b2, _mm_loadu_ps(v + i)), _mm_mul_ps(_mm_mul_ps(omb2, g), g));
    const __m128 denom = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(vi), bc2_sqrt), eps);
    const __m128 upd = _mm_div_ps(_mm_mul_ps(step_size, mi), denom);
    _mm_storeu_ps(m + i, mi);
    _mm_storeu_ps(v + i, vi);
    _mm_storeu_ps(param + i, _mm_sub_ps(_mm_mul_ps(_mm_loadu_ps(param + i), decay), upd));
  }
#endif
  for (; i < n; ++i) adamw_element(param[i], grad[i], m[i], v[i], s);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define FP_ADAMW_HAVE_AVX2 1
// Note [AdamW's AVX2 path has no FMA]: the body is the SSE body at twice the width, operation for
// operation. The target is "avx2" alone, not "avx2,fma": with FMA enabled g++ contracts b1 * m +
// omb1 * g into one fused multiply-add (one rounding instead of two), and the AVX2 bits would then
// differ from the SSE path, the scalar tail and the device update they must equal bit for bit.
// test_adamw compares the paths with memcmp, so a contraction (or an added "fma") fails it.
//
// G is the gradient's element type (float, or bf16 widened on load: a 16-bit shift, exact); C the
// working copy's (void: none, float, or bf16 rounded by bf16_narrow8_avx2), stored from the new
// weights in the same pass. G = float, C = void is the f32 update (adamw_range_avx2).
template <class G, class C>
__attribute__((target("avx2"))) void adamw_body_avx2(float* __restrict param, const G* __restrict grad,
                                                     float* __restrict m, float* __restrict v, C* __restrict copy,
                                                     int64_t n, const AdamwScalars& s) {
  int64_t i = 0;
  const __m256 decay = _mm256_set1_ps(s.decay), b1 = _mm256_set1_ps(s.beta1);
  const __m256 omb1 = _mm256_set1_ps(s.one_minus_beta1);
  const __m256 b2 = _mm256_set1_ps(s.beta2), omb2 = _mm256_set1_ps(s.one_minus_beta2);
  const __m256 step_size = _mm256_set1_ps(s.step_size), bc2_sqrt = _mm256_set1_ps(s.bc2_sqrt);
  const __m256 eps = _mm256_set1_ps(s.eps), grad_scale = _mm256_set1_ps(s.grad_scale);
  for (; i + 8 <= n; i += 8) {
    __m256 grad_i;
    if constexpr (std::is_same_v<G, float>) {
      grad_i = _mm256_loadu_ps(grad + i);
    } else {
      grad_i = bf16_widen8_avx2(grad + i);
    }
    const __m256 g = _mm256_mul_ps(grad_i, grad_scale);
    const __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(omb1, g));
    const __m256 vi =
        _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)), _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2_sqrt), eps);
    const __m256 upd = _mm256_div_ps(_mm256_mul_ps(step_size, mi), denom);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    const __m256 p = _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(param + i), decay), upd);
    _mm256_storeu_ps(param + i, p);
    if constexpr (std::is_same_v<C, float>) _mm256_storeu_ps(copy + i, p);
    if constexpr (std::is_same_v<C, bf16>) _mm_storeu_si128(reinterpret_cast<__m128i*>(copy + i), bf16_narrow8_avx2(p));
  }
  for (; i < n; ++i) {
    adamw_element(param[i], to_f32(grad[i]), m[i], v[i], s);
    if constexpr (!std::is_void_v<C>) copy[i] = from_f32<C>(param[i]);
  }
}

__attribute__((target("avx2"))) void adamw_range_avx2(float* __restrict param, const float* __restrict grad,
                                                      float* __restrict m, float* __restrict v, int64_t n,
                                                      const AdamwScalars& s) {
  adamw_body_avx2<float, void>(param, grad, m, v, nullptr, n, s);
}

// The AVX2 body on any gradient and copy (Note [AdamW with bf16 operands]); copy null or not param.
void adamw_mixed_avx2(float* param, CBuf grad, float* m, float* v, int64_t n, const AdamwScalars& s, Buf copy) {
  visit_float(grad.dtype, "adamw_update", [&]<class G>() {
    const G* g = static_cast<const G*>(grad.p);
    if (copy.null()) return adamw_body_avx2<G, void>(param, g, m, v, nullptr, n, s);
    visit_float(copy.dtype, "adamw_update",
                [&]<class C>() { adamw_body_avx2<G, C>(param, g, m, v, static_cast<C*>(copy.p), n, s); });
  });
}
#endif

using AdamwRangeFn = void (*)(float* __restrict, const float* __restrict, float* __restrict, float* __restrict, int64_t,
                              const AdamwScalars&);

AdamwRangeFn adamw_range_fn(AdamwPath p) {
  switch (p) {
    case AdamwPath::AdamwPath_scalar:
      return &adamw_range_scalar;
    case AdamwPath::AdamwPath_sse:
      return &adamw_range_sse;
    case AdamwPath::AdamwPath_avx2:
#if defined(FP_ADAMW_HAVE_AVX2)
      return &adamw_range_avx2;
#else
      break;
#endif
  }
  FP_ASSERT(false, "adamw: path {} is not built in", adamw_path_name(p));
  return nullptr;
}

// Note [AdamW with bf16 operands]: a bf16 gradient is widened (exact) and fed to the same f32
// operations, and a working copy of the weights (param_copy) is stored from the new f32 weights,
// rounded once (bf16_from_float) or copied, so the update is bit for bit the f32 update of the
// widened gradient and the copy is the updated master rounded. Both conversions are element-wise, so
// Note [AdamW is element-wise] holds for every dtype. The AVX2 path does it in its one pass
// (adamw_body_avx2: the gradient widened on load, the copy stored with the weights), so the pass
// moves 2 bytes less per element for a bf16 gradient and 2 (4) more for a bf16 (f32) copy and
// nothing else. The SSE and scalar paths (cpus without AVX2, and the path tests) run their f32
// body unchanged on chunks of kChunkElements: the chunk's gradient widened into an f32 buffer, the
// body, then the chunk's new weights rounded into the copy (backend/cpu/kernels/convert.h); the buffer and the
// chunk's weights stay in L1 between the steps. The f32 case (f32 gradient, no copy) comes to
// neither and runs the path's f32 body on the caller's arrays, as before.
void adamw_range_mixed(AdamwRangeFn range, float* param, CBuf grad, float* m, float* v, int64_t n,
                       const AdamwScalars& s, Buf copy) {
  alignas(32) float gbuf[kChunkElements];
  const bool grad_f32 = grad.dtype == DType::DType_F32;
  for (int64_t c = 0; c < n; c += kChunkElements) {
    const int64_t len = std::min(kChunkElements, n - c);
    const float* g = gbuf;
    if (grad_f32) {
      g = static_cast<const float*>(grad.p) + c;
    } else {
      bf16_to_f32(static_cast<const bf16*>(grad.p) + c, gbuf, len);
    }
    range(param + c, g, m + c, v + c, len, s);
    if (copy.null()) continue;
    if (copy.dtype == DType::DType_BF16) {
      f32_to_bf16(param + c, static_cast<bf16*>(copy.p) + c, len);
    } else {
      std::memcpy(static_cast<float*>(copy.p) + c, param + c, static_cast<size_t>(len) * sizeof(float));
    }
  }
}

}  // namespace

std::string_view adamw_path_name(AdamwPath p) {
  switch (p) {
    case AdamwPath::AdamwPath_scalar:
      return "scalar";
    case AdamwPath::AdamwPath_sse:
      return "sse";
    case AdamwPath::AdamwPath_avx2:
      return "avx2";
  }
  return "?";
}

bool adamw_path_available(AdamwPath p) {
  switch (p) {
    case AdamwPath::AdamwPath_scalar:
      return true;
    case AdamwPath::AdamwPath_sse:
#if defined(__SSE2__)
      return true;
#else
      return false;
#endif
    case AdamwPath::AdamwPath_avx2:
#if defined(FP_ADAMW_HAVE_AVX2)
      return cpu_features().avx2;
#else
      return false;
#endif
  }
  return false;
}

AdamwPath adamw_path_best() {  // Note [One instruction-set dispatch] (backend/cpu/kernels/cpu_features.h)
  static const AdamwPath best = [] {
    if (simd_level() >= SimdLevel::avx2 && adamw_path_available(AdamwPath::AdamwPath_avx2))
      return AdamwPath::AdamwPath_avx2;
    return adamw_path_available(AdamwPath::AdamwPath_sse) ? AdamwPath::AdamwPath_sse : AdamwPath::AdamwPath_scalar;
  }();
  return best;
}

void adamw_update(float* param, CBuf grad, float* m, float* v, int64_t n, AdamWHyper h, Buf param_copy) {
  adamw_update_path(adamw_path_best(), param, grad, m, v, n, h, param_copy);
}

// Note [The optimizer in buckets] (ops/adamw.h): each tensor is one adamw_update, threaded inside; a bucket
// of many small tensors could share the threads across tensors instead (every split has the same bits).
void adamw_update_multi(const AdamWTensor* t, int64_t count, AdamWHyper h) {
  FP_ASSERT(count >= 0 && (count == 0 || t != nullptr), "adamw_update_multi: {} tensors", count);
  for (int64_t i = 0; i < count; ++i) {
    AdamWHyper hi = h;
    hi.weight_decay = t[i].weight_decay;
    adamw_update(t[i].param, t[i].grad, t[i].m, t[i].v, t[i].n, hi, t[i].param_copy);
  }
}

void adamw_update_path(AdamwPath path, float* param, CBuf grad, float* m, float* v, int64_t n, AdamWHyper h,
                       Buf param_copy) {
  FP_ASSERT(adamw_path_available(path), "adamw: path {} is not available on this cpu", adamw_path_name(path));
  const AdamwRangeFn range = adamw_range_fn(path);
  FP_ASSERT(h.step >= 1, "adamw_update: step {} must count from 1", h.step);
  FP_ASSERT(n >= 0);
  visit_float(grad.dtype, "adamw_update (grad)", []<class T>() {});
  if (!param_copy.null()) visit_float(param_copy.dtype, "adamw_update (param_copy)", []<class T>() {});
  if (n == 0) return;
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(h.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(h.step));
  AdamwScalars s;
  s.decay = static_cast<float>(1.0 - static_cast<double>(h.lr) * static_cast<double>(h.weight_decay));
  s.beta1 = h.beta1;
  s.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(h.beta1));
  s.beta2 = h.beta2;
  s.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(h.beta2));
  s.step_size = static_cast<float>(static_cast<double>(h.lr) / bc1);
  s.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  s.eps = h.eps;
  s.grad_scale = h.grad_scale;

  // The f32 case (f32 gradient, no copy) runs the body on the caller's arrays; any other goes through
  // Note [AdamW with bf16 operands]. Blocks only decide which thread touches which elements; no
  // result depends on them.
  // An f32 copy that is the weights themselves is already written.
  if (param_copy.dtype == DType::DType_F32 && param_copy.p == param) param_copy = Buf();
  const bool plain = grad.dtype == DType::DType_F32 && param_copy.null();
  const int64_t blocks = (n + kBlockElements - 1) / kBlockElements;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kBlockElements;
    const int64_t len = (n - begin < kBlockElements) ? n - begin : kBlockElements;
    if (plain) {
      range(param + begin, static_cast<const float*>(grad.p) + begin, m + begin, v + begin, len, s);
    } else if (path == AdamwPath::AdamwPath_avx2) {
#if defined(FP_ADAMW_HAVE_AVX2)
      adamw_mixed_avx2(param + begin, grad.at(begin), m + begin, v + begin, len, s, param_copy.at(begin));
#endif
    } else {
      adamw_range_mixed(range, param + begin, grad.at(begin), m + begin, v + begin, len, s, param_copy.at(begin));
    }
  }
}

}  // namespace fp::ops::cpu
