// The cuda backend's streams and events, and the per-stream context its kernels run in.
//
// Note [A cuda stream owns its context]: a kernel finds its backend's context in the stream of its
// execution context (Note [Kernel execution context] in backend/kernels.h), never in a global. Each
// CudaStream owns, made on first use and bound to that stream once, the library handles that must not be
// shared between streams without a lock: cuBLAS (and, with the model's kernels, cuBLASLt and its
// workspace, cuDNN and its plan cache). So two streams issue GEMMs concurrently with no mutex and no
// cublasSetStream per call, as PyTorch keeps one handle per (device, stream).
//
// Note [A stream's scratch]: besides the GEMM workspace (a fixed kLtWorkspaceBytes, llm.c's size for
// Hopper), a stream owns one scratch buffer for the temporaries of its kernels: the partials of the
// reductions, the widened operands of a mixed-dtype GEMM. It grows on demand (stream-ordered
// cudaMallocAsync / cudaFreeAsync, so the old buffer is freed after the kernels enqueued before on this
// stream, and no device sync is taken) and is reused by every later call on the stream. Both come from
// the driver's pool, outside the device ledger: a few MiB next to a step, and the planner counts neither
// yet (issue "The step on a GPU": a workspace query per entry, reserved through the ledger).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "backend/kernels.h"
#include "core/stream.h"

namespace fp {

// Throws fp::Error naming `what` and the runtime's message when e is not cudaSuccess.
void cuda_check(cudaError_t e, const char* what);
// Throws fp::Error "kernel <kernel> on cuda: <why>": a case a kernel does not take.
[[noreturn]] void cuda_refuse(const char* kernel, const char* why);
extern const char* const kCudaHint;

// A point of a cuda stream (cudaEvent_t without timing).
class CudaEvent final : public EventImpl {
 public:
  CudaEvent();
  ~CudaEvent() override;
  void synchronize() override;
  bool query() override;
  cudaEvent_t handle() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// A non-blocking cudaStream_t of its own (compute, h2d and d2h alike). Host tasks (enqueue) run through
// cudaLaunchHostFunc; their errors surface at synchronize().
class CudaStream final : public Stream {
 public:
  explicit CudaStream(std::string name);
  ~CudaStream() override;
  void enqueue(std::function<void()> fn) override;
  void record(Event& e) override;
  void wait(const Event& e) override;
  void synchronize() override;
  cudaStream_t handle() const { return stream_; }

  // This stream's cuBLAS handle (Note [A cuda stream owns its context]): created on first use, bound to
  // this stream, fp32 math without TF32. The library itself is opened on first use (dlopen), so a
  // process that never runs a GEMM on cuda does not load it.
  cublasHandle_t blas();
  // This stream's cuBLASLt handle and its GEMM workspace (kLtWorkspaceBytes), made on first use.
  cublasLtHandle_t blas_lt();
  void* lt_workspace();
  static constexpr uint64_t kLtWorkspaceBytes = uint64_t{32} << 20;
  // At least `bytes` of device scratch, valid for the work enqueued on this stream until the next call
  // (Note [A stream's scratch]).
  void* scratch(uint64_t bytes);

  // The CudaStream of a kernel's execution context; asserts that it is one.
  static CudaStream& of(const ExecContext& c);

 private:
  struct Task {
    CudaStream* stream;
    std::function<void()> fn;
  };
  static void CUDART_CB run_task(void* arg);

  cudaStream_t stream_ = nullptr;
  std::mutex mu_;
  std::exception_ptr error_;
  cublasHandle_t blas_ = nullptr;
  cublasLtHandle_t blas_lt_ = nullptr;
  void* lt_workspace_ = nullptr;
  void* scratch_ = nullptr;
  uint64_t scratch_bytes_ = 0;
};

// cuBLAS's entry points, opened on first use.
struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
};
const CublasApi& cublas_api();

// cuBLASLt's entry points, opened on first use as cuBLAS's are (the GEMMs, gemm_lt.cpp).
struct CublasLtApi {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
};
const CublasLtApi& cublas_lt_api();

}  // namespace fp
