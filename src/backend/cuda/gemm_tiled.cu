// The tiled GEMM (ops/gemm_tiled.h) on cuda. Dimensions: M rows of C, N columns of C, K the reduction.
//
// Note [The device's tiled GEMM]: Ring-DTP wants bits that do not depend on how C is cut (thread counts,
// the ring's size), which cuBLASLt does not promise: its algorithm, and so its order of the sums, follows
// the shape. Here every element of C is one thread's sum over k = 0 .. K-1 in that order in f32 (the tiles
// only stage operands in shared memory), so an element's bits depend on its row of op(A), its column of
// op(B), alpha and beta alone: any split of C into calls gives the same bits, on every device. No tensor
// cores (a sequential f32 sum per element is what fixes the order): a correctness path for the vocabulary
// strips, slower than gemm. Not the cpu's bits (the cpu's tiles sum in its own blocked order).
// bf16 operands are widened on load and a bf16 C rounded once, as the contract says.
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace fp::ops::cuda {

namespace {

constexpr int kTile = 16;

// C (M, N) = alpha op(A) op(B) + beta C, one thread per element of a kTile x kTile tile.
template <class TA, class TB, class TC>
__global__ void gemm_tiled_kernel(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const TA* A,
                                  int64_t lda, const TB* B, int64_t ldb, float beta, TC* C, int64_t ldc) {
  __shared__ float sa[kTile][kTile + 1];  // (rows of C, k)
  __shared__ float sb[kTile][kTile + 1];  // (k, columns of C)
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int64_t row = blockIdx.y * int64_t{kTile} + ty, col = blockIdx.x * int64_t{kTile} + tx;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += kTile) {
    // op(A)[row, k0 + tx] and op(B)[k0 + ty, col], zero outside (never added: see the bound below).
    const int64_t ka = k0 + tx, kb = k0 + ty;
    sa[ty][tx] = row < M && ka < K ? ld(trans_a ? A[ka * lda + row] : A[row * lda + ka]) : 0.0f;
    sb[ty][tx] = col < N && kb < K ? ld(trans_b ? B[col * ldb + kb] : B[kb * ldb + col]) : 0.0f;
    __syncthreads();
    const int kn = K - k0 < kTile ? static_cast<int>(K - k0) : kTile;
    for (int k = 0; k < kn; ++k) acc += sa[ty][k] * sb[k][tx];
    __syncthreads();
  }
  if (row < M && col < N) {
    TC& c = C[row * ldc + col];
    c = st<TC>(beta == 0.0f ? alpha * acc : alpha * acc + beta * ld(c));
  }
}

}  // namespace

void gemm_tiled(const ExecContext& c, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, CBuf A,
                int64_t lda, CBuf B, int64_t ldb, float beta, Buf C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if ((M + kTile - 1) / kTile > 65535) cuda_refuse("gemm_tiled", "more than 65535 row tiles");
  const dim3 grid(static_cast<unsigned>((N + kTile - 1) / kTile), static_cast<unsigned>((M + kTile - 1) / kTile));
  const dim3 block(kTile, kTile);
  visit_float(A.dtype, "gemm_tiled", [&]<class TA>() {
    visit_float(B.dtype, "gemm_tiled", [&]<class TB>() {
      visit_float(C.dtype, "gemm_tiled", [&]<class TC>() {
        gemm_tiled_kernel<<<grid, block, 0, stream_of(c)>>>(
            trans_a, trans_b, M, N, K, alpha, static_cast<const TA*>(A.p), lda, static_cast<const TB*>(B.p), ldb, beta,
            static_cast<TC*>(C.p), ldc);
      });
    });
  });
  launched("gemm_tiled");
}

}  // namespace fp::ops::cuda
