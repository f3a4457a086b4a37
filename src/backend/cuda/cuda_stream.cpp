// The cuda backend's streams and events (cuda_stream.h).
#include "backend/cuda/cuda_stream.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <type_traits>

#include "core/error.h"

namespace fp {

const char* const kCudaHint = "run on a machine with an NVIDIA GPU and its driver, or use --device cpu / meta";

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(fmt::format("{}: {}", what, cudaGetErrorString(e)), kCudaHint);
}

void cuda_refuse(const char* kernel, const char* why) {
  throw Error(fmt::format("kernel {} on cuda: {}", kernel, why), "use --device cpu for this case");
}

CudaEvent::CudaEvent() { cuda_check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate"); }
CudaEvent::~CudaEvent() { (void)cudaEventDestroy(event_); }
void CudaEvent::synchronize() { cuda_check(cudaEventSynchronize(event_), "cudaEventSynchronize"); }
bool CudaEvent::query() {
  const cudaError_t e = cudaEventQuery(event_);
  if (e == cudaErrorNotReady) return false;
  cuda_check(e, "cudaEventQuery");
  return true;
}

CudaStream::CudaStream(std::string name) : Stream(std::move(name)) {
  cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
}

CudaStream::~CudaStream() {
  (void)cudaStreamSynchronize(stream_);
  if (blas_ != nullptr) (void)cublas_api().destroy(blas_);
  if (blas_lt_ != nullptr) (void)cublas_lt_api().destroy(blas_lt_);
  if (lt_workspace_ != nullptr) (void)cudaFree(lt_workspace_);
  if (scratch_ != nullptr) (void)cudaFree(scratch_);
  (void)cudaStreamDestroy(stream_);
}

void CudaStream::enqueue(std::function<void()> fn) {
  auto* task = new Task{this, std::move(fn)};
  const cudaError_t e = cudaLaunchHostFunc(stream_, &CudaStream::run_task, task);
  if (e != cudaSuccess) delete task;  // never launched: run_task will not free it
  cuda_check(e, "cudaLaunchHostFunc");
}

void CudaStream::record(Event& e) {
  auto point = std::make_shared<CudaEvent>();
  cuda_check(cudaEventRecord(point->handle(), stream_), "cudaEventRecord");
  event_set(e, point);
}

void CudaStream::wait(const Event& e) {
  const std::shared_ptr<EventImpl>& point = event_impl(e);
  if (!point) return;
  auto* ce = dynamic_cast<CudaEvent*>(point.get());
  FP_ASSERT(ce != nullptr, "stream '{}' waits on another backend's event", name());
  cuda_check(cudaStreamWaitEvent(stream_, ce->handle(), 0), "cudaStreamWaitEvent");
}

void CudaStream::synchronize() {
  cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lock(mu_);
    err = error_;
    error_ = nullptr;
  }
  if (err) std::rethrow_exception(err);
}

void CUDART_CB CudaStream::run_task(void* arg) {
  Task* task = static_cast<Task*>(arg);
  try {
    task->fn();
  } catch (...) {
    std::lock_guard<std::mutex> lock(task->stream->mu_);
    if (!task->stream->error_) task->stream->error_ = std::current_exception();
  }
  delete task;
}

cublasHandle_t CudaStream::blas() {
  if (blas_ != nullptr) return blas_;
  const CublasApi& api = cublas_api();
  cublasHandle_t h = nullptr;
  FP_CHECK(api.create(&h) == CUBLAS_STATUS_SUCCESS, kCudaHint, "cublasCreate failed");
  // fp32 GEMMs stay fp32 (no TF32): ops/gemm.h's contract.
  FP_CHECK(api.set_math_mode(h, CUBLAS_DEFAULT_MATH) == CUBLAS_STATUS_SUCCESS, kCudaHint, "cublasSetMathMode failed");
  FP_CHECK(api.set_stream(h, stream_) == CUBLAS_STATUS_SUCCESS, kCudaHint, "cublasSetStream failed");
  blas_ = h;
  return blas_;
}

cublasLtHandle_t CudaStream::blas_lt() {
  if (blas_lt_ != nullptr) return blas_lt_;
  cublasLtHandle_t h = nullptr;
  FP_CHECK(cublas_lt_api().create(&h) == CUBLAS_STATUS_SUCCESS, kCudaHint, "cublasLtCreate failed");
  blas_lt_ = h;
  return blas_lt_;
}

void* CudaStream::lt_workspace() {
  if (lt_workspace_ == nullptr)
    cuda_check(cudaMallocAsync(&lt_workspace_, kLtWorkspaceBytes, stream_), "cudaMallocAsync (GEMM workspace)");
  return lt_workspace_;
}

// Note [A stream's scratch] (cuda_stream.h): grows by at least half, so a few calls reach the step's size.
void* CudaStream::scratch(uint64_t bytes) {
  if (bytes <= scratch_bytes_) return scratch_;
  const uint64_t grown = std::max(bytes, scratch_bytes_ + scratch_bytes_ / 2);
  if (scratch_ != nullptr) cuda_check(cudaFreeAsync(scratch_, stream_), "cudaFreeAsync (scratch)");
  scratch_ = nullptr;
  scratch_bytes_ = 0;
  cuda_check(cudaMallocAsync(&scratch_, grown, stream_), "cudaMallocAsync (scratch)");
  scratch_bytes_ = grown;
  return scratch_;
}

CudaStream& CudaStream::of(const ExecContext& c) {
  auto* s = dynamic_cast<CudaStream*>(&c.stream);
  FP_ASSERT(s != nullptr, "a cuda kernel was given stream '{}' of another backend", c.stream.name());
  return *s;
}

const CublasApi& cublas_api() {
  static std::once_flag once;
  static CublasApi api;
  std::call_once(once, [] {
    constexpr const char* kLib = "libcublas.so." FP_CUBLAS_MAJOR;
    void* lib = dlopen(kLib, RTLD_NOW | RTLD_LOCAL);
    FP_CHECK(lib != nullptr, "install the CUDA toolkit's cuBLAS (or put it on LD_LIBRARY_PATH)", "cannot open {}: {}",
             kLib, dlerror());
    api.create = reinterpret_cast<decltype(api.create)>(dlsym(lib, "cublasCreate_v2"));
    api.destroy = reinterpret_cast<decltype(api.destroy)>(dlsym(lib, "cublasDestroy_v2"));
    api.set_math_mode = reinterpret_cast<decltype(api.set_math_mode)>(dlsym(lib, "cublasSetMathMode"));
    api.set_stream = reinterpret_cast<decltype(api.set_stream)>(dlsym(lib, "cublasSetStream_v2"));
    api.sgemm = reinterpret_cast<decltype(api.sgemm)>(dlsym(lib, "cublasSgemm_v2"));
    FP_CHECK(api.create && api.destroy && api.set_math_mode && api.set_stream && api.sgemm, kCudaHint,
             "{} lacks cublasCreate_v2 / cublasDestroy_v2 / cublasSetStream_v2 / cublasSgemm_v2", kLib);
  });
  return api;
}

const CublasLtApi& cublas_lt_api() {
  static std::once_flag once;
  static CublasLtApi api;
  std::call_once(once, [] {
    constexpr const char* kLib = "libcublasLt.so." FP_CUBLAS_MAJOR;
    void* lib = dlopen(kLib, RTLD_NOW | RTLD_LOCAL);
    FP_CHECK(lib != nullptr, "install the CUDA toolkit's cuBLAS (or put it on LD_LIBRARY_PATH)", "cannot open {}: {}",
             kLib, dlerror());
    auto sym = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(lib, name));
      FP_CHECK(f != nullptr, kCudaHint, "{} lacks {}", kLib, name);
    };
    sym(api.create, "cublasLtCreate");
    sym(api.destroy, "cublasLtDestroy");
    sym(api.desc_create, "cublasLtMatmulDescCreate");
    sym(api.desc_destroy, "cublasLtMatmulDescDestroy");
    sym(api.desc_set, "cublasLtMatmulDescSetAttribute");
    sym(api.layout_create, "cublasLtMatrixLayoutCreate");
    sym(api.layout_destroy, "cublasLtMatrixLayoutDestroy");
    sym(api.pref_create, "cublasLtMatmulPreferenceCreate");
    sym(api.pref_destroy, "cublasLtMatmulPreferenceDestroy");
    sym(api.pref_set, "cublasLtMatmulPreferenceSetAttribute");
    sym(api.heuristic, "cublasLtMatmulAlgoGetHeuristic");
    sym(api.matmul, "cublasLtMatmul");
  });
  return api;
}

}  // namespace fp
