// Tile helpers shared by the cpu attention kernels (ops/cpu/attention.cpp: the whole causal sequence;
// ops/cpu/attention_block.cpp: one block of queries against one block of keys, by global positions).
// Private to ops/cpu: nothing outside those two files includes it (tests/ops/test_attention.cpp checks
// its two tile_gemm copies against each other).
// Dimensions: TQ x TK = kAttentionTileQ x kAttentionTileK the (query, key) tile, hd head_dim, hdp = hd
// rounded up to kNr (the padded row length of every scratch tile), nh query heads, T query tokens.
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
#include <cstdint>

#include "ops/attention.h"

namespace fp::ops::cpu::attention_tile {

constexpr int64_t TQ = kAttentionTileQ;
constexpr int64_t TK = kAttentionTileK;
constexpr int64_t kMr = 4;  // rows of one register block
constexpr int64_t kNr = 8;  // columns of one register block: two SSE or one AVX vector
static_assert(TQ % kMr == 0 && TK % kMr == 0 && TQ % kNr == 0 && TK % kNr == 0, "tiles must hold whole blocks");

inline int64_t hd_padded(int64_t hd) { return (hd + kNr - 1) / kNr * kNr; }

// Note [Attention tiles with AVX2]: the project builds for baseline x86-64 (SSE2), and these tile
// products are most of the attention kernels' time. tile_gemm runs a copy of the same loop compiled
// for AVX2 when the CPU has it (checked once at run time; FLATPEAK_SIMD=baseline forces the SSE2
// copy): 8 columns are one ymm register instead of two xmm. FMA is deliberately not enabled: every
// output element is the same sequence of separately rounded multiplies and adds in both copies, so
// they agree bit for bit (a fused multiply-add rounds once and would move results by an ulp, e.g.
// turn the exact zero gradient of a one-token sequence into 1e-8). Only this function is duplicated,
// under its own name: compiling whole files twice with other flags would let the linker mix the
// copies of shared inline code.
#define FP_ATTENTION_TILE_GEMM_BODY                                                        \
  for (int64_t i = 0; i < M; i += kMr) {                                                   \
    for (int64_t j = 0; j < N; j += kNr) {                                                 \
      float acc[kMr][kNr];                                                                 \
      for (int64_t r = 0; r < kMr; ++r)                                                    \
        for (int64_t c = 0; c < kNr; ++c) acc[r][c] = C[(i + r) * ldc + j + c];            \
      for (int64_t kk = 0; kk < K; ++kk) {                                                 \
        const float* b = B + kk * ldb + j; /* (kNr) */                                     \
        for (int64_t r = 0; r < kMr; ++r) {                                                \
          const float a = A[(i + r) * lda + kk];                                           \
          /* Without the pragma g++ vectorises across r and keeps acc in memory (3x slower) */ \
          _Pragma("omp simd") for (int64_t c = 0; c < kNr; ++c) acc[r][c] += a * b[c];     \
        }                                                                                  \
      }                                                                                    \
      for (int64_t r = 0; r < kMr; ++r)                                                    \
        for (int64_t c = 0; c < kNr; ++c) C[(i + r) * ldc + j + c] = acc[r][c];            \
    }                                                                                      \
  }

inline void tile_gemm_baseline(const float* __restrict A, int64_t lda, const float* __restrict B, int64_t ldb,
                               float* __restrict C, int64_t ldc, int64_t M, int64_t N, int64_t K) {
  FP_ATTENTION_TILE_GEMM_BODY
}

#if defined(__x86_64__) || defined(__i386__)
#define FP_ATTENTION_TILE_AVX2 1
__attribute__((target("avx2"))) inline void tile_gemm_avx2(const float* __restrict A, int64_t lda,
                                                               const float* __restrict B, int64_t ldb,
                                                               float* __restrict C, int64_t ldc, int64_t M, int64_t N,
                                                               int64_t K) {
  FP_ATTENTION_TILE_GEMM_BODY
}
#else
#define FP_ATTENTION_TILE_AVX2 0  // other architectures: the portable copy only
#endif
#undef FP_ATTENTION_TILE_GEMM_BODY

// True when this CPU has AVX2 and FLATPEAK_SIMD is not "baseline" (Note [Attention tiles with AVX2]).
bool tile_gemm_uses_avx2();
// Which copy tile_gemm runs: decided once at start-up; a benchmark may switch it between runs (never
// while a kernel runs).
inline bool tile_gemm_avx2_enabled = tile_gemm_uses_avx2();

// C (M, N) += A (M, K) B (K, N), all row-major with leading dimensions lda, ldb, ldc.
// M % kMr == 0, N % kNr == 0 (Note [Tile products as register-blocked loops]).
inline void tile_gemm(const float* __restrict A, int64_t lda, const float* __restrict B, int64_t ldb,
                      float* __restrict C, int64_t ldc, int64_t M, int64_t N, int64_t K) {
#if FP_ATTENTION_TILE_AVX2
  if (tile_gemm_avx2_enabled) return tile_gemm_avx2(A, lda, B, ldb, C, ldc, M, N, K);
#endif
  tile_gemm_baseline(A, lda, B, ldb, C, ldc, M, N, K);
}

// dst (rows, hdp) = the n rows of src (stride apart, hd each), zero in columns >= hd and rows >= n.
inline void rows_load(float* __restrict dst, const float* __restrict src, int64_t stride, int64_t n, int64_t rows,
                      int64_t hd, int64_t hdp) {
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dst + r * hdp;  // (hdp)
    const int64_t valid = r < n ? hd : 0;
    for (int64_t c = 0; c < valid; ++c) d[c] = src[r * stride + c];
    for (int64_t c = valid; c < hdp; ++c) d[c] = 0.0f;
  }
}

// dst (hdp, TK) = the transpose of n rows of src (stride apart, hd each), zero-padded.
inline void rows_load_transposed(float* __restrict dst, const float* __restrict src, int64_t stride, int64_t n,
                                 int64_t hd, int64_t hdp) {
  std::fill(dst, dst + hdp * TK, 0.0f);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t c = 0; c < hd; ++c) dst[c * TK + j] = src[j * stride + c];
}

// dst (cols, rows) = src (rows, cols)^T.
inline void tile_transpose(float* __restrict dst, const float* __restrict src, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

// Loads the query tile of (b, h, i0) of a (B, T, nh, hd) layout: qs, dos (TQ, hdp) from q and dout,
// lse_t (TQ) from lse (B, nh, T) and D (TQ) = rowsum(dO * O); rows >= nq are zero.
inline void query_tile_load(const float* q, const float* o, const float* lse, const float* dout, float* qs, float* dos,
                            float* lse_t, float* D, int64_t b, int64_t h, int64_t i0, int64_t nq, int64_t T,
                            int64_t nh, int64_t hd, int64_t hdp) {
  const int64_t off = ((b * T + i0) * nh + h) * hd, stride = nh * hd;
  rows_load(qs, q + off, stride, nq, TQ, hd, hdp);
  rows_load(dos, dout + off, stride, nq, TQ, hd, hdp);
  for (int64_t r = 0; r < TQ; ++r) {
    float sum = 0.0f;
    if (r < nq) {
      const float* orow = o + off + r * stride;  // (hd)
      for (int64_t c = 0; c < hd; ++c) sum += dos[r * hdp + c] * orow[c];
    }
    D[r] = sum;
    lse_t[r] = r < nq ? lse[(b * nh + h) * T + i0 + r] : 0.0f;
  }
}

}  // namespace fp::ops::cpu::attention_tile
