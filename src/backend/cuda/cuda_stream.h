// The cuda backend's streams and events, and the per-stream context its kernels run in.
//
// Note [A cuda stream owns its context]: a kernel finds its backend's context in the stream of its
// execution context (Note [Kernel execution context] in backend/kernels.h), never in a global. Each
// CudaStream owns, made on first use and bound to that stream once, the library handles that must not be
// shared between streams without a lock: cuBLAS (and, with the model's kernels, cuBLASLt and its
// workspace, cuDNN and its plan cache). So two streams issue GEMMs concurrently with no mutex and no
// cublasSetStream per call, as PyTorch keeps one handle per (device, stream).
#pragma once

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

}  // namespace fp
