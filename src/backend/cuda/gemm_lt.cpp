// The GEMMs on cuda through cuBLASLt (ops/gemm.h, ops/gemm_grouped.h), llm.c's llmc/matmul.cuh way.
// Dimensions: M rows of C, N columns of C, K the reduction; G groups of rows for the grouped entries.
//
// Note [Row-major GEMMs through cuBLASLt]: a row-major C (M, N) with leading dimension ldc is the
// column-major C^T (N, M) in the same memory, and C^T = op(B)^T op(A)^T: cuBLASLt is called with the
// operands swapped (B first) and the transposes kept, as the cuBLAS skeleton did. Operands:
//   A and B both bf16, C bf16 or f32: one cuBLASLt matmul on the tensor cores, CUBLAS_COMPUTE_32F (products
//     and sums in f32), a bf16 C rounded once in the epilogue;
//   A, B, C all f32: one matmul with CUBLAS_COMPUTE_32F, which is true fp32 (TF32 would be
//     CUBLAS_COMPUTE_32F_FAST_TF32, never chosen here): ops/gemm.h forbids narrowed multiplies, so f32 stays
//     the exact reference;
//   anything else (one input f32 and one bf16, or f32 inputs into a bf16 C), which cuBLASLt does not
//     take: the bf16 operands are widened (exact) into the stream's scratch, the f32 matmul runs, and a bf16
//     C is rounded back once. Correct, not fast; no caller of the model mixes them on a hot path.
// The workspace is the stream's (CudaStream::lt_workspace, 32 MiB); cuBLASLt's heuristic picks the
// algorithm per call (a cache keyed by shape is left for when a GPU can measure what it saves), told the
// true alignment of each pointer, because the grouped entries pass rows in the middle of a buffer.
// The error model is ops/gemm.h's: the order of the sums is cuBLASLt's, not bit for bit the cpu's.
//
// Note [Why the grouped entries keep their bias kernels]: cuBLASLt's CUBLASLT_EPILOGUE_BIAS would fold a
// group's bias into its matmul, but ops/gemm_grouped.h promises the bits of gemm then bias_add (and of gemm
// then bias_backward for the weight gradient), and an epilogue adds the bias before the single rounding of
// D, so a bf16 C would differ from the loop's, and an f32 one by the epilogue's undocumented order. So each
// group is one matmul, then the bias kernels of elementwise.cu: the contract's bits, two launches per
// group. cuBLAS's grouped GEMM (cublasGemmGroupedBatchedEx, device pointer arrays) would make the experts
// one launch; measuring it against this loop is issue "The step on a GPU"'s.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_stream.h"
#include "core/error.h"

namespace fp::ops::cuda {

namespace {

void lt_check(cublasStatus_t s, const char* what, int64_t M, int64_t N, int64_t K) {
  FP_CHECK(s == CUBLAS_STATUS_SUCCESS, kCudaHint, "{} failed for M={} N={} K={} (cuBLAS status {})", what, M, N, K,
           static_cast<int>(s));
}

cudaDataType_t lt_type(DType t) { return t == DType::DType_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

// The largest power of two dividing the address, up to 256 (cuBLASLt's preference attributes).
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

// The handles of one call, destroyed on every path out.
struct LtDescriptors {
  const CublasLtApi& api = cublas_lt_api();
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t x = nullptr, y = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescriptors() {
    if (pref) api.pref_destroy(pref);
    if (c) api.layout_destroy(c);
    if (y) api.layout_destroy(y);
    if (x) api.layout_destroy(x);
    if (op) api.desc_destroy(op);
  }
};

// Column-major D = C (rows, cols; ldc) = alpha op(X) op(Y) + beta C on the stream: op(X) (rows, k), op(Y) (k, cols).
void matmul_lt(CudaStream& s, bool trans_x, bool trans_y, int64_t rows, int64_t cols, int64_t k, float alpha, CBuf X,
               int64_t ldx, CBuf Y, int64_t ldy, float beta, Buf C, int64_t ldc) {
  LtDescriptors d;
  const CublasLtApi& api = d.api;
  const cublasOperation_t tx = trans_x ? CUBLAS_OP_T : CUBLAS_OP_N, ty = trans_y ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int64_t M = cols, N = rows, K = k;  // the row-major names, for the messages
  lt_check(api.desc_create(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate", M, N, K);
  lt_check(api.desc_set(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &tx, sizeof(tx)), "cublasLtMatmulDescSetAttribute", M, N, K);
  lt_check(api.desc_set(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &ty, sizeof(ty)), "cublasLtMatmulDescSetAttribute", M, N, K);
  lt_check(api.layout_create(&d.x, lt_type(X.dtype), trans_x ? k : rows, trans_x ? rows : k, ldx),
           "cublasLtMatrixLayoutCreate", M, N, K);
  lt_check(api.layout_create(&d.y, lt_type(Y.dtype), trans_y ? cols : k, trans_y ? k : cols, ldy),
           "cublasLtMatrixLayoutCreate", M, N, K);
  lt_check(api.layout_create(&d.c, lt_type(C.dtype), rows, cols, ldc), "cublasLtMatrixLayoutCreate", M, N, K);
  lt_check(api.pref_create(&d.pref), "cublasLtMatmulPreferenceCreate", M, N, K);
  const uint64_t ws = CudaStream::kLtWorkspaceBytes;
  lt_check(api.pref_set(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
           "cublasLtMatmulPreferenceSetAttribute", M, N, K);
  const uint32_t ax = alignment_of(X.p), ay = alignment_of(Y.p), ac = alignment_of(C.p);
  lt_check(api.pref_set(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &ax, sizeof(ax)),
           "cublasLtMatmulPreferenceSetAttribute", M, N, K);
  lt_check(api.pref_set(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ay, sizeof(ay)),
           "cublasLtMatmulPreferenceSetAttribute", M, N, K);
  lt_check(api.pref_set(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof(ac)),
           "cublasLtMatmulPreferenceSetAttribute", M, N, K);
  lt_check(api.pref_set(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof(ac)),
           "cublasLtMatmulPreferenceSetAttribute", M, N, K);
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  lt_check(api.heuristic(s.blas_lt(), d.op, d.x, d.y, d.c, d.c, d.pref, 1, &heur, &found),
           "cublasLtMatmulAlgoGetHeuristic", M, N, K);
  FP_CHECK(found > 0, kCudaHint, "cuBLASLt has no algorithm for a {} x {} -> {} GEMM M={} N={} K={}",
           dtype_name(Y.dtype), dtype_name(X.dtype), dtype_name(C.dtype), M, N, K);
  lt_check(api.matmul(s.blas_lt(), d.op, &alpha, X.p, d.x, Y.p, d.y, &beta, C.p, d.c, C.p, d.c, &heur.algo,
                      s.lt_workspace(), ws, s.handle()),
           "cublasLtMatmul", M, N, K);
}

// Bytes rounded up to 256: the scratch regions of the widened operands.
uint64_t region(int64_t floats) { return (static_cast<uint64_t>(floats) * 4 + 255) / 256 * 256; }

}  // namespace

void gemm(const ExecContext& c, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, CBuf A,
          int64_t lda, CBuf B, int64_t ldb, float beta, Buf C, int64_t ldc) {
  for (const DType t : {A.dtype, B.dtype, C.dtype}) visit_float(t, "gemm", []<class T>() {});
  if (M == 0 || N == 0) return;
  if (K == 0) {  // C = beta C, row by row (ldc may exceed N); beta == 0 does not read C
    for (int64_t r = 0; r < M; ++r) {
      if (beta == 0.0f)
        fill(c, C.at(r * ldc), 0.0f, N);
      else
        scale_inplace(c, C.at(r * ldc), beta, N);
    }
    return;
  }
  CudaStream& s = CudaStream::of(c);
  const bool bf16_ab = A.dtype == DType::DType_BF16 && B.dtype == DType::DType_BF16;
  const bool f32_all = A.dtype == DType::DType_F32 && B.dtype == DType::DType_F32 && C.dtype == DType::DType_F32;
  if (bf16_ab || f32_all) {
    matmul_lt(s, trans_b, trans_a, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc);
    return;
  }
  // Note [Row-major GEMMs through cuBLASLt]: the mixed cases, widened into the scratch.
  const int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K, b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  const bool wa = A.dtype == DType::DType_BF16, wb = B.dtype == DType::DType_BF16, wc = C.dtype == DType::DType_BF16;
  const uint64_t ra = wa ? region(a_rows * a_cols) : 0, rb = wb ? region(b_rows * b_cols) : 0,
                 rc = wc ? region(M * N) : 0;
  char* base = static_cast<char*>(s.scratch(std::max<uint64_t>(ra + rb + rc, 256)));
  float* fa = reinterpret_cast<float*>(base);
  float* fb = reinterpret_cast<float*>(base + ra);
  float* fc = reinterpret_cast<float*>(base + ra + rb);
  if (wa) copy_2d(c, fa, a_cols, A, lda, a_rows, a_cols);
  if (wb) copy_2d(c, fb, b_cols, B, ldb, b_rows, b_cols);
  if (wc && beta != 0.0f) copy_2d(c, fc, N, C, ldc, M, N);
  const CBuf a32 = wa ? CBuf(fa) : A, b32 = wb ? CBuf(fb) : B;
  const Buf c32 = wc ? Buf(fc) : C;
  matmul_lt(s, trans_b, trans_a, N, M, K, alpha, b32, wb ? b_cols : ldb, a32, wa ? a_cols : lda, beta, c32,
            wc ? N : ldc);
  if (wc) copy_2d(c, C, ldc, fc, N, M, N);
}

// Note [Why the grouped entries keep their bias kernels]: each group as the cpu's loop (backend/cpu/kernels/
// gemm_grouped.cpp), gemm then bias_add.
void gemm_grouped(const ExecContext& c, bool trans_b, int64_t G, const int64_t* offsets, int64_t N, int64_t K,
                  float alpha, CBuf A, const CBuf* B, const CBuf* bias, float beta, Buf C) {
  FP_ASSERT(G >= 0 && (G == 0 || (offsets != nullptr && offsets[0] == 0)), "gemm_grouped: G={}", G);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t r0 = offsets[g], n = offsets[g + 1] - r0;
    FP_ASSERT(n >= 0, "gemm_grouped: offsets[{}] < offsets[{}]", g + 1, g);
    if (n == 0) continue;
    const Buf cg = C.at(r0 * N);
    gemm(c, false, trans_b, n, N, K, alpha, A.at(r0 * K), K, B[g], trans_b ? K : N, beta, cg, N);
    if (bias != nullptr && !bias[g].null()) bias_add(c, cg, bias[g], n, N);
  }
}

// gemm (trans_a) then bias_backward on each group's rows, as the cpu.
void gemm_grouped_weight(const ExecContext& c, int64_t G, const int64_t* offsets, int64_t M, int64_t N, float alpha,
                         CBuf A, CBuf B, float beta, const Buf* C, const Buf* db) {
  FP_ASSERT(G >= 0 && (G == 0 || (offsets != nullptr && offsets[0] == 0)), "gemm_grouped_weight: G={}", G);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t r0 = offsets[g], n = offsets[g + 1] - r0;
    FP_ASSERT(n >= 0, "gemm_grouped_weight: offsets[{}] < offsets[{}]", g + 1, g);
    if (n == 0) continue;
    const CBuf a = A.at(r0 * M);
    gemm(c, true, false, M, N, n, alpha, a, M, B.at(r0 * N), N, beta, C[g], N);
    if (db != nullptr && !db[g].null()) bias_backward(c, a, db[g], n, M);
  }
}

}  // namespace fp::ops::cuda
