// Tile helpers of the cpu attention kernels (backend/cpu/kernels/attention_block.cpp: one block of queries against
// one block of keys, by global positions; backend/cpu/kernels/attention.cpp runs those over the whole sequence).
// Private to the cpu kernels: nothing outside attention_block.cpp includes it (tests/ops/test_attention.cpp checks
// the SSE2 and AVX2 copies of tile_gemm and exp_inplace against each other, and exp_inplace against exp;
// both attention tests read tile_pairs_computed).
// Dimensions: TQ x TK = kAttentionTileQ x kAttentionTileK the (query, key) tile, hd the query/key head
// width, hdv the value/output head width (Note [Value heads of their own width], ops/attention.h), hdp
// and hdvp = hd and hdv rounded up to kNr (the padded row lengths of the scratch tiles: hdp for q, k and
// their gradients, hdvp for v, o, dO and dV), nh query heads, T query tokens.
//
// Note [Tile products as register-blocked loops]: every product is C (M, N) += A (M, K) B (K, N) on
// zero-padded scratch tiles (row lengths multiples of kNr, row counts the full tile), computed kMr x kNr
// outputs at a time in a local accumulator that g++ -O3 keeps in vector registers; the innermost loop
// runs over kNr contiguous columns of B (~17 GFLOP/s a core with the baseline SSE2 target). Padding keeps
// every loop bound a multiple of the block, so there is no remainder code, and the zero rows / columns
// add nothing. BLAS is not called inside the parallel regions: OpenBLAS's own pthread pool would
// oversubscribe the OpenMP threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cpu/kernels/cpu_features.h"
#include "core/buf.h"
#include "backend/cpu/kernels/ops.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace fp::ops::cpu::attention_tile {

constexpr int64_t TQ = kAttentionTileQ;
constexpr int64_t TK = kAttentionTileK;
constexpr int64_t kMr = 4;  // rows of one register block
constexpr int64_t kNr = 8;  // columns of one register block: two SSE or one AVX vector
static_assert(TQ % kMr == 0 && TK % kMr == 0 && TQ % kNr == 0 && TK % kNr == 0, "tiles must hold whole blocks");

inline int64_t hd_padded(int64_t hd) { return (hd + kNr - 1) / kNr * kNr; }

// Note [Attention tiles with AVX2]: the project builds for baseline x86-64 (SSE2), and these tile
// products and the exponentials of the scores (Note [Exponentials in vector registers]) are most of the
// attention kernels' time. Each runs a copy of the same loop compiled for AVX2 when the CPU has it
// (checked once at run time; FLATPEAK_SIMD=baseline forces the SSE2 copies): 8 columns are one ymm
// register instead of two xmm. This copy does not fuse: every output element is the same sequence of
// separately rounded multiplies and adds in both copies, so they agree bit for bit. Where the CPU also
// has FMA, a third copy of the tile product fuses them (Note [Tile products with FMA]); it is the
// default there, and FLATPEAK_SIMD=avx2 selects this one. Only these functions are duplicated, under
// their own names: compiling whole files twice with other flags would let the linker mix the copies of
// shared inline code.
#define FP_ATTENTION_TILE_GEMM_BODY(A_AT)                                                      \
  for (int64_t i = 0; i < M; i += kMr) {                                                       \
    for (int64_t j = 0; j < N; j += kNr) {                                                     \
      float acc[kMr][kNr];                                                                     \
      for (int64_t r = 0; r < kMr; ++r)                                                        \
        for (int64_t c = 0; c < kNr; ++c) acc[r][c] = C[(i + r) * ldc + j + c];                \
      for (int64_t kk = 0; kk < K; ++kk) {                                                     \
        const float* b = B + kk * ldb + j; /* (kNr) */                                         \
        for (int64_t r = 0; r < kMr; ++r) {                                                    \
          const float a = A_AT(i + r, kk);                                                     \
          /* Without the pragma g++ vectorises across r and keeps acc in memory (3x slower) */ \
          _Pragma("omp simd") for (int64_t c = 0; c < kNr; ++c) acc[r][c] += a * b[c];         \
        }                                                                                      \
      }                                                                                        \
      for (int64_t r = 0; r < kMr; ++r)                                                        \
        for (int64_t c = 0; c < kNr; ++c) C[(i + r) * ldc + j + c] = acc[r][c];                \
    }                                                                                          \
  }

// Note [Exponentials in vector registers]: libm's expf is one scalar call per score (about 30% of a
// training step's time at 1024 tokens before this), so the attention kernels exponentiate a row at a
// time with a loop the compiler vectorises: x = t ln2 + r with t = round(x log2 e) (rounded by adding
// and subtracting 1.5 * 2^23) and |r| <= ln2 / 2 (ln2 split into a short high part and a low part, so
// t ln2_hi is exact), exp(r) by Cephes' degree-7 polynomial 1 + r + r^2 p(r), times 2^t built from the
// exponent bits. Measured against exp in double (tests/ops/test_attention.cpp): relative error at most
// 8e-8 (about one ulp) on [-87.3, 88]. Below -87.33 (where expf goes subnormal) it gives 0, above 88 +inf
// (the true value overflows from 88.72), NaN stays NaN. The attention kernels only pass x <= 0 (a score
// minus its row's running maximum or log-sum-exp), so no softmax ever meets either cut.
inline constexpr float kExpMin = -87.33654f, kExpMax = 88.0f;
// The cut-offs are tested on the float's bits and applied with bit masks: g++ will not if-convert a
// float comparison (it might raise an FP exception flag), and a branch would stop the vectorisation.
// MADD(a, b, c) is a * b + c: two roundings in the baseline and AVX2 copies, one (a fused multiply-add)
// in the FMA copy (Note [Tile products with FMA]).
#define FP_ATTENTION_EXP_BODY(MADD)                                                                            \
  _Pragma("omp simd") for (int64_t j = 0; j < n; ++j) {                                                        \
    const int32_t bits = std::bit_cast<int32_t>(x[j]), mag = bits & 0x7fffffff;                                \
    const int32_t nan = -static_cast<int32_t>(mag > 0x7f800000); /* all ones where true */                     \
    const int32_t lo = -static_cast<int32_t>((bits < 0) & (mag > std::bit_cast<int32_t>(-kExpMin)));           \
    const int32_t hi = -static_cast<int32_t>((bits >= 0) & (mag > std::bit_cast<int32_t>(kExpMax)));           \
    const int32_t keep = ~(nan | lo | hi);                                                                     \
    const float c = std::bit_cast<float>((bits & keep) | (std::bit_cast<int32_t>(kExpMin) & ~keep));           \
    const float t = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;                                    \
    const float r = MADD(t, 2.12194440e-4f, c - t * 0.693359375f); /* t ln2_hi is exact */                     \
    float p = 1.9875691500e-4f;                                                                                \
    p = MADD(p, r, 1.3981999507e-3f);                                                                          \
    p = MADD(p, r, 8.3334519073e-3f);                                                                          \
    p = MADD(p, r, 4.1665795894e-2f);                                                                          \
    p = MADD(p, r, 1.6666665459e-1f);                                                                          \
    p = MADD(p, r, 5.0000001201e-1f);                                                                          \
    const float y = MADD(p * r, r, r) + 1.0f;                                                                  \
    const int32_t e = std::bit_cast<int32_t>(y * std::bit_cast<float>((static_cast<int32_t>(t) + 127) << 23)); \
    x[j] = std::bit_cast<float>((e & keep) | (bits & nan) | (0x7f800000 & hi)); /* lo: 0 */                    \
  }
#define FP_ATTENTION_MUL_ADD(a, b, c) ((a) * (b) + (c))
#define FP_ATTENTION_FMA(a, b, c) __builtin_fmaf((a), (b), (c))

// op(A) (M, K): A stored (M, K), or (K, M) for the transposed products (dV += P^T dO, dK += dS^T Q).
#define FP_ATTENTION_A_ROWS(row, k) A[(row)*lda + (k)]
#define FP_ATTENTION_A_COLS(row, k) A[(k)*lda + (row)]

inline void tile_gemm_baseline(const float* __restrict A, int64_t lda, const float* __restrict B, int64_t ldb,
                               float* __restrict C, int64_t ldc, int64_t M, int64_t N, int64_t K) {
  FP_ATTENTION_TILE_GEMM_BODY(FP_ATTENTION_A_ROWS)
}
inline void tile_gemm_at_baseline(const float* __restrict A, int64_t lda, const float* __restrict B, int64_t ldb,
                                  float* __restrict C, int64_t ldc, int64_t M, int64_t N, int64_t K) {
  FP_ATTENTION_TILE_GEMM_BODY(FP_ATTENTION_A_COLS)
}

// x[0..n) = exp(x[0..n)) in place (Note [Exponentials in vector registers]).
inline void exp_inplace_baseline(float* __restrict x, int64_t n) { FP_ATTENTION_EXP_BODY(FP_ATTENTION_MUL_ADD) }

#if defined(__x86_64__) || defined(__i386__)
#define FP_ATTENTION_TILE_AVX2 1
__attribute__((target("avx2"))) inline void tile_gemm_avx2(const float* __restrict A, int64_t lda,
                                                           const float* __restrict B, int64_t ldb, float* __restrict C,
                                                           int64_t ldc, int64_t M, int64_t N, int64_t K) {
  FP_ATTENTION_TILE_GEMM_BODY(FP_ATTENTION_A_ROWS)
}
__attribute__((target("avx2"))) inline void tile_gemm_at_avx2(const float* __restrict A, int64_t lda,
                                                              const float* __restrict B, int64_t ldb,
                                                              float* __restrict C, int64_t ldc, int64_t M, int64_t N,
                                                              int64_t K) {
  FP_ATTENTION_TILE_GEMM_BODY(FP_ATTENTION_A_COLS)
}
__attribute__((target("avx2"))) inline void exp_inplace_avx2(float* __restrict x, int64_t n) {
  FP_ATTENTION_EXP_BODY(FP_ATTENTION_MUL_ADD)
}

// Note [Tile products with FMA]: where the CPU has AVX2 and FMA, the tile product runs this copy:
// explicit 4 x 16 register blocks (eight ymm accumulators, two B vectors, one broadcast A value; a 4 x 8
// block for the last 8 columns when N % 16 == 8), each step c = fma(a, b, c). Measured on the AMD EPYC
// of docs/benchmarks.md, one core, a 64 x 64 x 64 tile: 35 GFLOP/s against 22-25 for the unfused
// copies, where OpenBLAS's sgemm runs 36; the attention kernels forward + backward 1.45-1.56x the AVX2
// copy.
// Every output element is still C + a_0 b_0 + a_1 b_1 + ... in the order of k, one rounding per step:
// the bits of the scalar loop c = std::fma(a, b, c), which is how it is tested, and not those of the
// unfused copies (an ulp apart per step; the attention tests' tolerances hold for every copy). The
// backward's D = rowsum(dO * O) is summed the same way under this copy (rows_dot_fma), so a query that
// sees one key still gets the exact zero score gradient. Each copy is deterministic: a schedule and its
// plain variant on one machine agree bit for bit. FLATPEAK_SIMD=avx2 (or baseline) selects the unfused
// copies.
//
// C (M, N) += op(A) (M, K) B (K, N); TransA: A stored (K, M), op(A) = A^T.
template <bool TransA = false>
__attribute__((target("avx2,fma"))) inline void tile_gemm_fma(const float* __restrict A, int64_t lda,
                                                              const float* __restrict B, int64_t ldb,
                                                              float* __restrict C, int64_t ldc, int64_t M, int64_t N,
                                                              int64_t K) {
  // Row r of the block, step kk: a0[r * rs + kk * ks].
  const int64_t rs = TransA ? 1 : lda, ks = TransA ? lda : 1;
  for (int64_t i = 0; i < M; i += kMr) {
    const float* a0 = A + i * rs;  // rows i.. of op(A)
    float* c0 = C + i * ldc;       // (kMr, N) rows i.. of C
    int64_t j = 0;
    for (; j + 16 <= N; j += 16) {
      __m256 c00 = _mm256_loadu_ps(c0 + j), c01 = _mm256_loadu_ps(c0 + j + 8);
      __m256 c10 = _mm256_loadu_ps(c0 + ldc + j), c11 = _mm256_loadu_ps(c0 + ldc + j + 8);
      __m256 c20 = _mm256_loadu_ps(c0 + 2 * ldc + j), c21 = _mm256_loadu_ps(c0 + 2 * ldc + j + 8);
      __m256 c30 = _mm256_loadu_ps(c0 + 3 * ldc + j), c31 = _mm256_loadu_ps(c0 + 3 * ldc + j + 8);
      for (int64_t kk = 0; kk < K; ++kk) {
        const float* b = B + kk * ldb + j;  // (16)
        const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
        __m256 a = _mm256_broadcast_ss(a0 + kk * ks);
        c00 = _mm256_fmadd_ps(a, b0, c00), c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(a0 + rs + kk * ks);
        c10 = _mm256_fmadd_ps(a, b0, c10), c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(a0 + 2 * rs + kk * ks);
        c20 = _mm256_fmadd_ps(a, b0, c20), c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(a0 + 3 * rs + kk * ks);
        c30 = _mm256_fmadd_ps(a, b0, c30), c31 = _mm256_fmadd_ps(a, b1, c31);
      }
      _mm256_storeu_ps(c0 + j, c00), _mm256_storeu_ps(c0 + j + 8, c01);
      _mm256_storeu_ps(c0 + ldc + j, c10), _mm256_storeu_ps(c0 + ldc + j + 8, c11);
      _mm256_storeu_ps(c0 + 2 * ldc + j, c20), _mm256_storeu_ps(c0 + 2 * ldc + j + 8, c21);
      _mm256_storeu_ps(c0 + 3 * ldc + j, c30), _mm256_storeu_ps(c0 + 3 * ldc + j + 8, c31);
    }
    if (j < N) {  // N % 16 == 8: one 8-column block
      __m256 c00 = _mm256_loadu_ps(c0 + j), c10 = _mm256_loadu_ps(c0 + ldc + j);
      __m256 c20 = _mm256_loadu_ps(c0 + 2 * ldc + j), c30 = _mm256_loadu_ps(c0 + 3 * ldc + j);
      for (int64_t kk = 0; kk < K; ++kk) {
        const __m256 b0 = _mm256_loadu_ps(B + kk * ldb + j);
        c00 = _mm256_fmadd_ps(_mm256_broadcast_ss(a0 + kk * ks), b0, c00);
        c10 = _mm256_fmadd_ps(_mm256_broadcast_ss(a0 + rs + kk * ks), b0, c10);
        c20 = _mm256_fmadd_ps(_mm256_broadcast_ss(a0 + 2 * rs + kk * ks), b0, c20);
        c30 = _mm256_fmadd_ps(_mm256_broadcast_ss(a0 + 3 * rs + kk * ks), b0, c30);
      }
      _mm256_storeu_ps(c0 + j, c00), _mm256_storeu_ps(c0 + ldc + j, c10);
      _mm256_storeu_ps(c0 + 2 * ldc + j, c20), _mm256_storeu_ps(c0 + 3 * ldc + j, c30);
    }
  }
}
// The exponentials with the polynomial's multiply-adds fused (Note [Exponentials in vector registers]:
// the same reduction and polynomial, rounded once per step).
__attribute__((target("avx2,fma"))) inline void exp_inplace_fma(float* __restrict x, int64_t n) {
  FP_ATTENTION_EXP_BODY(FP_ATTENTION_FMA)
}

// Note [Tile products with AVX-512]: where the CPU has AVX-512 (F, BW, DQ, VL), the tile product runs
// this copy: 4 x 32 register blocks (eight zmm accumulators, two B vectors, one broadcast A value), a
// 4 x 16 block and then the FMA copy's 4 x 8 block for the remaining columns. Every output element is
// the same chain c = fma(a_k, b_k, c) over k in order as in the FMA copy (Note [Tile products with
// FMA]), so the two agree bit for bit (tests/ops/test_attention.cpp checks both against the scalar
// loop): the level changes the speed of the attention kernels, never their results. The exponentials
// are the FMA copy's loop compiled for 16 lanes, the same operations on each lane, so the same bits.
#define FP_ATTENTION_TARGET_AVX512 "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,prefer-vector-width=512"
template <bool TransA = false>
__attribute__((target(FP_ATTENTION_TARGET_AVX512))) inline void tile_gemm_avx512(
    const float* __restrict A, int64_t lda, const float* __restrict B, int64_t ldb, float* __restrict C, int64_t ldc,
    int64_t M, int64_t N, int64_t K) {
  const int64_t rs = TransA ? 1 : lda, ks = TransA ? lda : 1;
  for (int64_t i = 0; i < M; i += kMr) {
    const float* a0 = A + i * rs;  // rows i.. of op(A)
    float* c0 = C + i * ldc;       // (kMr, N) rows i.. of C
    int64_t j = 0;
    for (; j + 32 <= N; j += 32) {
      __m512 c00 = _mm512_loadu_ps(c0 + j), c01 = _mm512_loadu_ps(c0 + j + 16);
      __m512 c10 = _mm512_loadu_ps(c0 + ldc + j), c11 = _mm512_loadu_ps(c0 + ldc + j + 16);
      __m512 c20 = _mm512_loadu_ps(c0 + 2 * ldc + j), c21 = _mm512_loadu_ps(c0 + 2 * ldc + j + 16);
      __m512 c30 = _mm512_loadu_ps(c0 + 3 * ldc + j), c31 = _mm512_loadu_ps(c0 + 3 * ldc + j + 16);
      for (int64_t kk = 0; kk < K; ++kk) {
        const float* b = B + kk * ldb + j;  // (32)
        const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
        __m512 a = _mm512_set1_ps(a0[kk * ks]);
        c00 = _mm512_fmadd_ps(a, b0, c00), c01 = _mm512_fmadd_ps(a, b1, c01);
        a = _mm512_set1_ps(a0[rs + kk * ks]);
        c10 = _mm512_fmadd_ps(a, b0, c10), c11 = _mm512_fmadd_ps(a, b1, c11);
        a = _mm512_set1_ps(a0[2 * rs + kk * ks]);
        c20 = _mm512_fmadd_ps(a, b0, c20), c21 = _mm512_fmadd_ps(a, b1, c21);
        a = _mm512_set1_ps(a0[3 * rs + kk * ks]);
        c30 = _mm512_fmadd_ps(a, b0, c30), c31 = _mm512_fmadd_ps(a, b1, c31);
      }
      _mm512_storeu_ps(c0 + j, c00), _mm512_storeu_ps(c0 + j + 16, c01);
      _mm512_storeu_ps(c0 + ldc + j, c10), _mm512_storeu_ps(c0 + ldc + j + 16, c11);
      _mm512_storeu_ps(c0 + 2 * ldc + j, c20), _mm512_storeu_ps(c0 + 2 * ldc + j + 16, c21);
      _mm512_storeu_ps(c0 + 3 * ldc + j, c30), _mm512_storeu_ps(c0 + 3 * ldc + j + 16, c31);
    }
    if (j + 16 <= N) {  // one 16-column block
      __m512 c00 = _mm512_loadu_ps(c0 + j), c10 = _mm512_loadu_ps(c0 + ldc + j);
      __m512 c20 = _mm512_loadu_ps(c0 + 2 * ldc + j), c30 = _mm512_loadu_ps(c0 + 3 * ldc + j);
      for (int64_t kk = 0; kk < K; ++kk) {
        const __m512 b0 = _mm512_loadu_ps(B + kk * ldb + j);
        c00 = _mm512_fmadd_ps(_mm512_set1_ps(a0[kk * ks]), b0, c00);
        c10 = _mm512_fmadd_ps(_mm512_set1_ps(a0[rs + kk * ks]), b0, c10);
        c20 = _mm512_fmadd_ps(_mm512_set1_ps(a0[2 * rs + kk * ks]), b0, c20);
        c30 = _mm512_fmadd_ps(_mm512_set1_ps(a0[3 * rs + kk * ks]), b0, c30);
      }
      _mm512_storeu_ps(c0 + j, c00), _mm512_storeu_ps(c0 + ldc + j, c10);
      _mm512_storeu_ps(c0 + 2 * ldc + j, c20), _mm512_storeu_ps(c0 + 3 * ldc + j, c30);
      j += 16;
    }
    if (j < N)  // N % 16 == 8: the FMA copy's 8-column block on the last columns
      tile_gemm_fma<TransA>(a0, lda, B + j, ldb, c0 + j, ldc, kMr, N - j, K);
  }
}
__attribute__((target(FP_ATTENTION_TARGET_AVX512))) inline void exp_inplace_avx512(float* __restrict x, int64_t n) {
  FP_ATTENTION_EXP_BODY(FP_ATTENTION_FMA)
}
#undef FP_ATTENTION_TARGET_AVX512
#else
#define FP_ATTENTION_TILE_AVX2 0  // other architectures: the portable copies only
#endif
#undef FP_ATTENTION_TILE_GEMM_BODY
#undef FP_ATTENTION_A_ROWS
#undef FP_ATTENTION_A_COLS
#undef FP_ATTENTION_EXP_BODY
#undef FP_ATTENTION_MUL_ADD
#undef FP_ATTENTION_FMA

// The copies the tile helpers run: sse2 (baseline), avx2 (the same unfused loop in ymm registers), fma
// (tile products and exponentials with fused multiply-adds, Note [Tile products with FMA]) or avx512
// (the fma copy's bits in zmm registers, Note [Tile products with AVX-512]):
// simd_level() (Note [One instruction-set dispatch], backend/cpu/kernels/cpu_features.h), sse2 where this file
// was built without the AVX2 copies.
SimdLevel tile_simd_detect();
// Decided once at start-up; a benchmark may switch it between runs (never while a kernel runs).
inline SimdLevel tile_simd = tile_simd_detect();

// C (M, N) += A (M, K) B (K, N), all row-major with leading dimensions lda, ldb, ldc.
// M % kMr == 0, N % kNr == 0 (Note [Tile products as register-blocked loops]).
inline void tile_gemm(const float* __restrict A, int64_t lda, const float* __restrict B, int64_t ldb,
                      float* __restrict C, int64_t ldc, int64_t M, int64_t N, int64_t K) {
#if FP_ATTENTION_TILE_AVX2
  if (tile_simd == SimdLevel::avx512) return tile_gemm_avx512(A, lda, B, ldb, C, ldc, M, N, K);
  if (tile_simd == SimdLevel::fma) return tile_gemm_fma(A, lda, B, ldb, C, ldc, M, N, K);
  if (tile_simd == SimdLevel::avx2) return tile_gemm_avx2(A, lda, B, ldb, C, ldc, M, N, K);
#endif
  tile_gemm_baseline(A, lda, B, ldb, C, ldc, M, N, K);
}

// C (M, N) += A^T B (K, N), A stored (K, M) with leading dimension lda: the product of the transposed
// tile without transposing it; each element is summed as tile_gemm sums it.
inline void tile_gemm_at(const float* __restrict A, int64_t lda, const float* __restrict B, int64_t ldb,
                         float* __restrict C, int64_t ldc, int64_t M, int64_t N, int64_t K) {
#if FP_ATTENTION_TILE_AVX2
  if (tile_simd == SimdLevel::avx512) return tile_gemm_avx512<true>(A, lda, B, ldb, C, ldc, M, N, K);
  if (tile_simd == SimdLevel::fma) return tile_gemm_fma<true>(A, lda, B, ldb, C, ldc, M, N, K);
  if (tile_simd == SimdLevel::avx2) return tile_gemm_at_avx2(A, lda, B, ldb, C, ldc, M, N, K);
#endif
  tile_gemm_at_baseline(A, lda, B, ldb, C, ldc, M, N, K);
}

// x[0..n) = exp(x[0..n)) in place (Note [Exponentials in vector registers]).
inline void exp_inplace(float* __restrict x, int64_t n) {
#if FP_ATTENTION_TILE_AVX2
  if (tile_simd == SimdLevel::avx512) return exp_inplace_avx512(x, n);
  if (tile_simd == SimdLevel::fma) return exp_inplace_fma(x, n);
  if (tile_simd == SimdLevel::avx2) return exp_inplace_avx2(x, n);
#endif
  exp_inplace_baseline(x, n);
}

// Note [Sliding-window bands]: with a window w > 0 a query at position p sees the keys at positions in
// (p - w, p] (Hugging Face's sliding window), so each row of a tile sees a contiguous run [jbeg, jend)
// of the tile's keys rather than a prefix, and both ends ascend with the row. The row helpers below take
// both ends; the kernels compute only the tile pairs where some row's run is non-empty (the band between
// the causal diagonal and the window's lower edge, Tq / TQ times about w / TK + 2 pairs), so the work
// is about T * w instead of T^2 / 2. A window that reaches past every key (w >= T in attention.cpp,
// w >= 2^32 in attention_block.cpp) is run as w = 0: jbeg = 0 everywhere, the causal code with the same
// tiles, loops and bits.

// Counts (query tile, key tile) products visited by the attention kernels since the program started,
// one per pair in the forward and one per pair in each backward pass, summed over b and heads. Only
// tests and benchmarks read it (a deterministic check that tiles outside the mask are skipped); each
// work item adds its count once, so the cost is one relaxed atomic add per item.
inline std::atomic<int64_t> tile_pairs_computed{0};

// Which backward block_backward runs (Note [One backward sweep where the dQ sums fit] in
// backend/cpu/kernels/attention_block.cpp): automatic chooses by the shape and the thread count; both give the
// same bits, and tests force each to check that.
// FLATPEAK_ATTENTION_BACKWARD=two_pass|one forces one at start-up (benchmarks compare them; an unknown
// value is reported and ignored).
enum class BackwardSweep { automatic, two_pass, one };
BackwardSweep backward_sweep_detect();
inline BackwardSweep backward_sweep = backward_sweep_detect();

// Forward, one query row of a score tile (the online softmax): sr (TK) holds the row's q.k against the
// tile's keys, of which [jbeg, jend) are visible (jbeg <= jend). Scales them, raises the running
// maximum m, turns them into exp(scale q.k - m) (zero outside [jbeg, jend)), adds their sum to the
// running sum l and rescales the row's unnormalised output acc (hdvp) by exp(m_old - m_new). An empty run
// leaves m, l and acc alone.
inline void row_online_softmax(float* __restrict sr, int64_t jbeg, int64_t jend, float scale, float& m, float& l,
                               float* __restrict acc, int64_t hdvp) {
  float mx = m;
  for (int64_t j = jbeg; j < jend; ++j) {
    sr[j] *= scale;
    mx = std::max(mx, sr[j]);
  }
  for (int64_t j = jbeg; j < jend; ++j) sr[j] -= mx;
  exp_inplace(sr + jbeg, jend - jbeg);
  float sum = 0.0f;
  for (int64_t j = jbeg; j < jend; ++j) sum += sr[j];
  std::fill(sr, sr + jbeg, 0.0f);
  std::fill(sr + jend, sr + TK, 0.0f);
  if (jend == jbeg) return;
  // The running max grew from m to mx: earlier terms shrink by exp(m - mx) (0 on the first tile).
  const float corr = std::exp(m - mx);
  l = l * corr + sum;
  m = mx;
  if (corr != 1.0f)
    for (int64_t c = 0; c < hdvp; ++c) acc[c] *= corr;
}

// Backward, one query row of a tile: on entry sr (TK) holds q.k and dpr (TK) holds dO.v against the
// tile's keys, [jbeg, jend) visible (jbeg <= jend); on exit sr holds P = exp(scale q.k - lse) and dpr
// holds dS = P (dP - D), both zero outside [jbeg, jend). lse, D: the row's log-sum-exp and rowsum(dO * O).
inline void row_probs_and_score_grads(float* __restrict sr, float* __restrict dpr, int64_t jbeg, int64_t jend,
                                      float scale, float lse, float D) {
  for (int64_t j = jbeg; j < jend; ++j) sr[j] = scale * sr[j] - lse;
  exp_inplace(sr + jbeg, jend - jbeg);
  for (int64_t j = jbeg; j < jend; ++j) dpr[j] = sr[j] * (dpr[j] - D);
  std::fill(sr, sr + jbeg, 0.0f);
  std::fill(dpr, dpr + jbeg, 0.0f);
  std::fill(sr + jend, sr + TK, 0.0f);
  std::fill(dpr + jend, dpr + TK, 0.0f);
}

// dst (rows, wp) = the n rows of src (stride apart, width w each), zero in columns >= w and rows >= n.
// (w, wp) is (hd, hdp) for q and k rows, (hdv, hdvp) for v and dO rows.
// E is the storage type of src (float or bf16, widened exactly: Note [Kernel operands carry their dtype]
// in core/buf.h); the tiles are f32 whatever it is.
template <class E>
inline void rows_load(float* __restrict dst, const E* __restrict src, int64_t stride, int64_t n, int64_t rows,
                      int64_t w, int64_t wp) {
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dst + r * wp;  // (wp)
    const int64_t valid = r < n ? w : 0;
    for (int64_t c = 0; c < valid; ++c) d[c] = to_f32(src[r * stride + c]);
    for (int64_t c = valid; c < wp; ++c) d[c] = 0.0f;
  }
}

// dst (wp, TK) = the transpose of n rows of src (stride apart, width w each), zero-padded.
template <class E>
inline void rows_load_transposed_scalar(float* __restrict dst, const E* __restrict src, int64_t stride, int64_t n,
                                        int64_t w, int64_t wp) {
  std::fill(dst, dst + wp * TK, 0.0f);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t c = 0; c < w; ++c) dst[c * TK + j] = to_f32(src[j * stride + c]);
}

#if FP_ATTENTION_TILE_AVX2
// 8 elements of storage type E from p, as f32 (bf16 widened exactly: its bits in the high half).
template <class E>
__attribute__((target("avx2"))) inline __m256 load8_f32(const E* p) {
  if constexpr (std::is_same_v<E, float>) {
    return _mm256_loadu_ps(p);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// Note [Transposed tile loads in 8 x 8 blocks]: the key and value tiles are loaded transposed (kt, vt:
// (wp, TK)), one element at a time a strided store: at AVX-512 the tile products had become faster than
// these loads. This copy moves 8 x 8 blocks through registers (the classic unpack / shuffle / permute
// transpose); it only moves values, so its tiles are the scalar loop's bit for bit
// (tests/ops/test_attention.cpp), and the remainder rows and columns take the scalar loop.
template <class E>
__attribute__((target("avx2"))) inline void rows_load_transposed_avx2(float* __restrict dst, const E* __restrict src,
                                                                      int64_t stride, int64_t n, int64_t w,
                                                                      int64_t wp) {
  std::fill(dst, dst + wp * TK, 0.0f);
  const int64_t n8 = n / 8 * 8, w8 = w / 8 * 8;
  for (int64_t j = 0; j < n8; j += 8) {
    const E* s0 = src + j * stride;  // rows j..j+8
    for (int64_t c = 0; c < w8; c += 8) {
      const __m256 r0 = load8_f32(s0 + c), r1 = load8_f32(s0 + stride + c);
      const __m256 r2 = load8_f32(s0 + 2 * stride + c), r3 = load8_f32(s0 + 3 * stride + c);
      const __m256 r4 = load8_f32(s0 + 4 * stride + c), r5 = load8_f32(s0 + 5 * stride + c);
      const __m256 r6 = load8_f32(s0 + 6 * stride + c), r7 = load8_f32(s0 + 7 * stride + c);
      const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
      const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
      const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
      const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
      const __m256 q0 = _mm256_shuffle_ps(t0, t2, 0x44), q1 = _mm256_shuffle_ps(t0, t2, 0xEE);
      const __m256 q2 = _mm256_shuffle_ps(t1, t3, 0x44), q3 = _mm256_shuffle_ps(t1, t3, 0xEE);
      const __m256 q4 = _mm256_shuffle_ps(t4, t6, 0x44), q5 = _mm256_shuffle_ps(t4, t6, 0xEE);
      const __m256 q6 = _mm256_shuffle_ps(t5, t7, 0x44), q7 = _mm256_shuffle_ps(t5, t7, 0xEE);
      float* d = dst + c * TK + j;  // column c of the 8 rows, then c + 1, ...
      _mm256_storeu_ps(d, _mm256_permute2f128_ps(q0, q4, 0x20));
      _mm256_storeu_ps(d + TK, _mm256_permute2f128_ps(q1, q5, 0x20));
      _mm256_storeu_ps(d + 2 * TK, _mm256_permute2f128_ps(q2, q6, 0x20));
      _mm256_storeu_ps(d + 3 * TK, _mm256_permute2f128_ps(q3, q7, 0x20));
      _mm256_storeu_ps(d + 4 * TK, _mm256_permute2f128_ps(q0, q4, 0x31));
      _mm256_storeu_ps(d + 5 * TK, _mm256_permute2f128_ps(q1, q5, 0x31));
      _mm256_storeu_ps(d + 6 * TK, _mm256_permute2f128_ps(q2, q6, 0x31));
      _mm256_storeu_ps(d + 7 * TK, _mm256_permute2f128_ps(q3, q7, 0x31));
    }
    for (int64_t r = j; r < j + 8; ++r)
      for (int64_t c = w8; c < w; ++c) dst[c * TK + r] = to_f32(src[r * stride + c]);
  }
  for (int64_t r = n8; r < n; ++r)
    for (int64_t c = 0; c < w; ++c) dst[c * TK + r] = to_f32(src[r * stride + c]);
}
#endif

// dst (wp, TK) = the transpose of n rows of src (stride apart, width w each), zero-padded: the 8 x 8
// block copy where the CPU has AVX2 (Note [Transposed tile loads in 8 x 8 blocks]), the same values.
template <class E>
inline void rows_load_transposed(float* __restrict dst, const E* __restrict src, int64_t stride, int64_t n, int64_t w,
                                 int64_t wp) {
#if FP_ATTENTION_TILE_AVX2
  if (tile_simd >= SimdLevel::avx2) return rows_load_transposed_avx2(dst, src, stride, n, w, wp);
#endif
  rows_load_transposed_scalar(dst, src, stride, n, w, wp);
}

#if FP_ATTENTION_TILE_AVX2
// D[r] = rowsum(dO * O) of rows r < n, summed as the FMA tile product sums dP = dO V^T: d = fma(dO_c, o_c,
// d) for c in order from 0. Where a query sees a single key, o is that key's v exactly, so dP == D to
// the bit and dS = P (dP - D) is the exact zero the true gradient is (Note [Tile products with FMA]).
// The rows are independent chains, interleaved so their latencies overlap. dos (n, ldd) f32; o rows
// ldo apart, of storage type E.
template <class E>
__attribute__((target("avx2,fma"))) inline void rows_dot_fma(const float* __restrict dos, int64_t ldd,
                                                             const E* __restrict o, int64_t ldo, int64_t n, int64_t w,
                                                             float* __restrict D) {
  for (int64_t r = 0; r < n; ++r) D[r] = 0.0f;
  for (int64_t c = 0; c < w; ++c)
    for (int64_t r = 0; r < n; ++r) D[r] = __builtin_fmaf(dos[r * ldd + c], to_f32(o[r * ldo + c]), D[r]);
}
#endif

// Loads the query tile of (b, h, i0): qs (TQ, hdp) from q (B, T, nh, hd), dos (TQ, hdvp) from dout
// (B, T, nh, hdv), lse_t (TQ) from lse (B, nh, T) and D (TQ) = rowsum(dO * O) over hdv (o (B, T, nh,
// hdv)); rows >= nq are zero.
template <class E>
inline void query_tile_load(const E* q, const E* o, const float* lse, const E* dout, float* qs, float* dos,
                            float* lse_t, float* D, int64_t b, int64_t h, int64_t i0, int64_t nq, int64_t T, int64_t nh,
                            int64_t hd, int64_t hdp, int64_t hdv, int64_t hdvp) {
  const int64_t row = (b * T + i0) * nh + h;  // the first query's row of the (B, T, nh) rows
  const int64_t qoff = row * hd, voff = row * hdv;
  rows_load(qs, q + qoff, nh * hd, nq, TQ, hd, hdp);
  rows_load(dos, dout + voff, nh * hdv, nq, TQ, hdv, hdvp);
#if FP_ATTENTION_TILE_AVX2
  if (tile_simd >= SimdLevel::fma) {  // the FMA and AVX-512 tile products sum dP alike
    rows_dot_fma(dos, hdvp, o + voff, nh * hdv, nq, hdv, D);
  } else
#endif
  {
    for (int64_t r = 0; r < nq; ++r) {
      const E* orow = o + voff + r * nh * hdv;  // (hdv)
      float sum = 0.0f;
      for (int64_t c = 0; c < hdv; ++c) sum += dos[r * hdvp + c] * to_f32(orow[c]);
      D[r] = sum;
    }
  }
  for (int64_t r = 0; r < TQ; ++r) {
    if (r >= nq) D[r] = 0.0f;
    lse_t[r] = r < nq ? lse[(b * nh + h) * T + i0 + r] : 0.0f;
  }
}

}  // namespace fp::ops::cpu::attention_tile
