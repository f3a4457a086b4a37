// Element-wise CUDA kernels of the skeleton (cuda_kernels.cu), with the signatures of ops/elementwise.h
// after the stream they are launched on. Each returns once its kernel has been enqueued (errors of the
// launch are thrown; errors of the execution surface at the next synchronising call).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/buf.h"

namespace fp::ops::cuda {

// f32 operands (the caller refuses others by name first).
void fill(cudaStream_t stream, Buf y, float v, int64_t n);
void add_inplace(cudaStream_t stream, Buf y, CBuf x, int64_t n);
void scale_inplace(cudaStream_t stream, Buf y, float a, int64_t n);

}  // namespace fp::ops::cuda
