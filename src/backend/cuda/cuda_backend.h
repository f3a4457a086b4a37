// The cuda backend (built with FLATPEAK_CUDA): the proof that a GPU backend plugs into the
// backend contract (backend/backend.h) without a change under src/model or src/sched.
//
// What it has: the device arena over cudaMalloc and the host arena over pinned cudaMallocHost, each
// through a cache (memory/caching_allocator.h), its own streams and events (non-blocking cudaStream_t,
// cudaEvent_t), asynchronous copies in every direction (cudaMemcpyAsync with cudaMemcpyDefault, unified
// addressing), and a kernel table (backend/kernels.h, cuda_kernels.h) of 51 entries in the cpu table's
// dtypes (embedding_backward for f32 tables only), each launched on the stream of its execution context:
// the GEMMs through cuBLASLt (gemm_lt.cpp) and a fixed-order tiled GEMM, element-wise kernels, reductions
// and AdamW with the cpu's bits, the losses, routers, routing sorts, permutes, embedding, RMSNorm, RoPE and
// SwiGLU (the .cu files; Note [Bits as the cpu's] in common.cuh says which meet the cpu's bits and which
// the error model). The five attention entries throw an error naming them: a model step on cuda stops at
// its first missing kernel instead of computing something else. What it does not have yet: attention (the
// cuDNN frontend's SDPA), and a data channel (NCCL): a run over ranks is refused when its step makes its
// channel, and one rank's channel refuses any call by name.
// Compiled, not yet run on a GPU: tests/cuda and scripts/gpu_check are the checks for a machine with one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace fp {

// True when the CUDA runtime sees at least one device; otherwise false and *why says what it said.
bool cuda_device_available(std::string* why);

// A cuda backend on device 0. Throws fp::Error without a usable device.
std::unique_ptr<Backend> cuda_backend_create(uint64_t device_capacity, uint64_t host_capacity);

// The cuda kernel table (see above).
const ops::Kernels& kernels_cuda();

}  // namespace fp
