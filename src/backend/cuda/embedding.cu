// Token embedding (ops/embedding.h) on cuda. n tokens, H hidden, V vocabulary (the table's rows).
//
// Forward: one thread per element of out, a copy (or a conversion): the cpu's bits, any dtypes.
// Backward: Note [Deterministic embedding backward] (backend/cpu/kernels/embedding.cpp) asks that each row of
// dtable receive its tokens' additions in token order. Here a thread owns a column h of every row and walks
// the tokens in order, adding dout[t, h] into dtable[id_t, h] in f32: the cpu's operations in the cpu's
// order, so its bits, without atomics; H threads in all, each n dependent steps (a millisecond or so at
// 64k tokens), the simple version. A bf16 dtable must be rounded once per row after all its tokens (Note [bf16
// embedding backward]), which needs the tokens grouped by id (a stable sort, CUB's radix sort on the device):
// not written yet, so embedding_backward is registered for f32 tables only and refuses a bf16 one by name.
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace fp::ops::cuda {

namespace {

template <class T, class O>
__global__ void embedding_forward_kernel(const int32_t* tokens, const T* table, O* out, int64_t n, int64_t H) {
  FP_CUDA_GRID_STRIDE(i, n * H) {
    const int64_t t = i / H, h = i - t * H;
    out[i] = st<O>(ld(table[int64_t{tokens[t]} * H + h]));
  }
}

template <class D>
__global__ void embedding_backward_kernel(const int32_t* tokens, const D* dout, float* dtable, int64_t n, int64_t H) {
  FP_CUDA_GRID_STRIDE(h, H) {
    for (int64_t t = 0; t < n; ++t) dtable[int64_t{tokens[t]} * H + h] += ld(dout[t * H + h]);
  }
}

}  // namespace

void embedding_forward(const ExecContext& c, const int32_t* tokens, CBuf table, Buf out, int64_t n, int64_t H) {
  if (n * H <= 0) return;
  visit_float2(table.dtype, out.dtype, "embedding_forward", [&]<class T, class O>() {
    embedding_forward_kernel<<<blocks_for(n * H), kThreads, 0, stream_of(c)>>>(tokens, static_cast<const T*>(table.p),
                                                                               static_cast<O*>(out.p), n, H);
  });
  launched("embedding_forward");
}

void embedding_backward(const ExecContext& c, const int32_t* tokens, CBuf dout, Buf dtable, int64_t n, int64_t H) {
  if (dtable.dtype != DType::DType_F32)
    cuda_refuse("embedding_backward", "a bf16 table gradient is not implemented yet on cuda (f32 only)");
  if (n * H <= 0) return;
  visit_float(dout.dtype, "embedding_backward", [&]<class D>() {
    embedding_backward_kernel<<<blocks_for(H), kThreads, 0, stream_of(c)>>>(tokens, static_cast<const D*>(dout.p),
                                                                            static_cast<float*>(dtable.p), n, H);
  });
  launched("embedding_backward");
}

}  // namespace fp::ops::cuda
