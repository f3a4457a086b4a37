// The cuda backend skeleton (cuda_backend.h).
#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <exception>
#include <functional>
#include <mutex>

#include "backend/cuda/cuda_kernels.h"
#include "core/error.h"
#include "memory/caching_allocator.h"

namespace fp {

namespace {

constexpr const char* kCudaHint = "run on a machine with an NVIDIA GPU and its driver, or use --device cpu / meta";

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(fmt::format("{}: {}", what, cudaGetErrorString(e)), kCudaHint);
}

// Device memory. A failed cudaMalloc returns null: the arena names the tensor and category.
class CudaDeviceAllocator final : public Allocator {
 public:
  void* allocate(uint64_t bytes) override {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky-free error state of a failed allocation
      return nullptr;
    }
    return p;
  }
  void deallocate(void* p, uint64_t) override { cuda_check(cudaFree(p), "cudaFree"); }
  std::string_view name() const override { return "cuda device"; }
};

// Pinned host memory: what host-device copies run at full link speed from.
class CudaPinnedAllocator final : public Allocator {
 public:
  void* allocate(uint64_t bytes) override {
    void* p = nullptr;
    if (cudaMallocHost(&p, bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return p;
  }
  void deallocate(void* p, uint64_t) override { cuda_check(cudaFreeHost(p), "cudaFreeHost"); }
  std::string_view name() const override { return "cuda pinned host"; }
};

// A point of a cuda stream (cudaEvent_t without timing).
class CudaEvent final : public EventImpl {
 public:
  CudaEvent() { cuda_check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate"); }
  ~CudaEvent() override { (void)cudaEventDestroy(event_); }
  void synchronize() override { cuda_check(cudaEventSynchronize(event_), "cudaEventSynchronize"); }
  bool query() override {
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) return false;
    cuda_check(e, "cudaEventQuery");
    return true;
  }
  cudaEvent_t handle() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// A cuda stream: a non-blocking stream of its own (compute, h2d and d2h alike; kernels are launched on
// the stream of their execution context, Note [Kernel execution context] in backend/kernels.h).
// Host tasks (enqueue) run through cudaLaunchHostFunc; their errors surface at synchronize().
class CudaStream final : public Stream {
 public:
  explicit CudaStream(std::string name) : Stream(std::move(name)) {
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~CudaStream() override {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
  void enqueue(std::function<void()> fn) override {
    auto* task = new Task{this, std::move(fn)};
    const cudaError_t e = cudaLaunchHostFunc(stream_, &CudaStream::run_task, task);
    if (e != cudaSuccess) delete task;  // never launched: run_task will not free it
    cuda_check(e, "cudaLaunchHostFunc");
  }
  void record(Event& e) override {
    auto point = std::make_shared<CudaEvent>();
    cuda_check(cudaEventRecord(point->handle(), stream_), "cudaEventRecord");
    event_set(e, point);
  }
  void wait(const Event& e) override {
    const std::shared_ptr<EventImpl>& point = event_impl(e);
    if (!point) return;
    auto* ce = dynamic_cast<CudaEvent*>(point.get());
    FP_ASSERT(ce != nullptr, "stream '{}' waits on another backend's event", name());
    cuda_check(cudaStreamWaitEvent(stream_, ce->handle(), 0), "cudaStreamWaitEvent");
  }
  void synchronize() override {
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    std::exception_ptr err;
    {
      std::lock_guard<std::mutex> lock(mu_);
      err = error_;
      error_ = nullptr;
    }
    if (err) std::rethrow_exception(err);
  }
  cudaStream_t handle() const { return stream_; }

 private:
  struct Task {
    CudaStream* stream;
    std::function<void()> fn;
  };
  static void CUDART_CB run_task(void* arg) {
    Task* task = static_cast<Task*>(arg);
    try {
      task->fn();
    } catch (...) {
      std::lock_guard<std::mutex> lock(task->stream->mu_);
      if (!task->stream->error_) task->stream->error_ = std::current_exception();
    }
    delete task;
  }

  cudaStream_t stream_ = nullptr;
  std::mutex mu_;
  std::exception_ptr error_;
};

// The cudaStream_t of a kernel's execution context (a stream of this backend).
cudaStream_t cuda_stream(const ExecContext& c) {
  auto* s = dynamic_cast<CudaStream*>(&c.stream);
  FP_ASSERT(s != nullptr, "a cuda kernel was given stream '{}' of another backend", c.stream.name());
  return s->handle();
}

// cuBLAS, opened on first use (dlopen): a process that never runs a GEMM on cuda does not load it.
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
  cublasHandle_t handle = nullptr;
};

const Cublas& cublas() {
  static std::once_flag once;
  static Cublas api;
  std::call_once(once, [] {
    constexpr const char* kLib = "libcublas.so." FP_CUBLAS_MAJOR;
    void* lib = dlopen(kLib, RTLD_NOW | RTLD_LOCAL);
    FP_CHECK(lib != nullptr, "install the CUDA toolkit's cuBLAS (or put it on LD_LIBRARY_PATH)", "cannot open {}: {}",
             kLib, dlerror());
    api.create = reinterpret_cast<decltype(api.create)>(dlsym(lib, "cublasCreate_v2"));
    api.set_math_mode = reinterpret_cast<decltype(api.set_math_mode)>(dlsym(lib, "cublasSetMathMode"));
    api.set_stream = reinterpret_cast<decltype(api.set_stream)>(dlsym(lib, "cublasSetStream_v2"));
    api.sgemm = reinterpret_cast<decltype(api.sgemm)>(dlsym(lib, "cublasSgemm_v2"));
    FP_CHECK(api.create && api.set_math_mode && api.set_stream && api.sgemm, kCudaHint,
             "{} lacks cublasCreate_v2 / cublasSetStream_v2 / cublasSgemm_v2", kLib);
    FP_CHECK(api.create(&api.handle) == CUBLAS_STATUS_SUCCESS, kCudaHint, "cublasCreate failed");
    // fp32 GEMMs stay fp32 (no TF32): the kernels' contract is the cpu kernels' results to rounding.
    api.set_math_mode(api.handle, CUBLAS_DEFAULT_MATH);
  });
  return api;
}

// Row-major C (M, N) = alpha op(A) op(B) + beta C is column-major C^T (N, M) = alpha op(B)^T op(A)^T +
// beta C^T: the same memory, cuBLAS called with the operands swapped.
// The handle is shared: its stream is set per call under a lock (one GEMM is enqueued at a time).
// bf16 operands are not in the skeleton yet (cublasGemmEx with CUDA_R_16BF would take them): an error.
void gemm_cublas(const ExecContext& c, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 CBuf a, int64_t lda, CBuf b, int64_t ldb, float beta, Buf cb, int64_t ldc) {
  FP_CHECK(a.dtype == DType::DType_F32 && b.dtype == DType::DType_F32 && cb.dtype == DType::DType_F32, kCudaHint,
           "the cuda backend's gemm takes f32 operands only (got {} x {} -> {})", dtype_name(a.dtype),
           dtype_name(b.dtype), dtype_name(cb.dtype));
  const float* A = static_cast<const float*>(a.p);
  const float* B = static_cast<const float*>(b.p);
  float* C = static_cast<float*>(cb.p);
  if (M == 0 || N == 0) return;
  const Cublas& blas = cublas();
  static std::mutex handle_mu;
  std::lock_guard<std::mutex> lock(handle_mu);
  FP_CHECK(blas.set_stream(blas.handle, cuda_stream(c)) == CUBLAS_STATUS_SUCCESS, kCudaHint, "cublasSetStream failed");
  const cublasStatus_t s =
      blas.sgemm(blas.handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                  static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, B, static_cast<int>(ldb), A,
                  static_cast<int>(lda), &beta, C, static_cast<int>(ldc));
  FP_CHECK(s == CUBLAS_STATUS_SUCCESS, kCudaHint, "cublasSgemm M={} N={} K={} failed (status {})", M, N, K,
           static_cast<int>(s));
}

// bf16 operands (a converting copy, bf16 element-wise kernels) are not in the skeleton yet: an error.
void copy_device(const ExecContext& c, Buf dst, CBuf src, int64_t n) {
  FP_CHECK(dst.dtype == DType::DType_F32 && src.dtype == DType::DType_F32, kCudaHint,
           "the cuda backend's copy takes f32 operands only (got {} -> {})", dtype_name(src.dtype),
           dtype_name(dst.dtype));
  if (n > 0)
    cuda_check(cudaMemcpyAsync(dst.p, src.p, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDefault, cuda_stream(c)),
               "copy");
}

// The element-wise kernels of cuda_kernels.cu as table entries.
void fill_device(const ExecContext& c, Buf y, float v, int64_t n) {
  FP_CHECK(y.dtype == DType::DType_F32, kCudaHint, "the cuda backend's fill takes f32 operands only (got {})",
           dtype_name(y.dtype));
  ops::cuda::fill(cuda_stream(c), static_cast<float*>(y.p), v, n);
}
void add_device(const ExecContext& c, Buf y, CBuf x, int64_t n) {
  FP_CHECK(y.dtype == DType::DType_F32 && x.dtype == DType::DType_F32, kCudaHint,
           "the cuda backend's add_inplace takes f32 operands only (got {} += {})", dtype_name(y.dtype),
           dtype_name(x.dtype));
  ops::cuda::add_inplace(cuda_stream(c), static_cast<float*>(y.p), static_cast<const float*>(x.p), n);
}
void scale_device(const ExecContext& c, Buf y, float a, int64_t n) {
  FP_CHECK(y.dtype == DType::DType_F32, kCudaHint, "the cuda backend's scale_inplace takes f32 operands only (got {})",
           dtype_name(y.dtype));
  ops::cuda::scale_inplace(cuda_stream(c), static_cast<float*>(y.p), a, n);
}

// Every kernel of the table the skeleton lacks: an error naming it.
#define FP_CUDA_KERNEL_NAME(name) constexpr char kCudaKernelName_##name[] = #name;
FP_KERNEL_LIST(FP_CUDA_KERNEL_NAME)
#undef FP_CUDA_KERNEL_NAME
template <class F, const char* Name>
struct Missing;
template <class R, class... A, const char* Name>
struct Missing<R (*)(A...), Name> {
  static R fn(A...) {
    throw Error(fmt::format("kernel {} is not implemented on the cuda backend yet", Name),
                "the cuda backend is a skeleton (src/backend/cuda/cuda_backend.h); use --device cpu");
  }
};

// The data channel of one rank until NCCL: every call is an error naming it (the host channel would
// hand device pointers to memmove).
class CudaNoDataComm final : public DataComm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(Stream&, void*, int64_t, DType) override { refuse("all_reduce_sum"); }
  void all_gather(Stream&, const void*, void*, int64_t, DType) override { refuse("all_gather"); }
  void reduce_scatter_sum(Stream&, const void*, void*, int64_t, DType) override { refuse("reduce_scatter_sum"); }
  void all_to_all_v(Stream&, const void*, const int64_t*, void*, const int64_t*, DType) override {
    refuse("all_to_all_v");
  }
  void send_recv(Stream&, const void*, int64_t, int, void*, int64_t, int, DType) override { refuse("send_recv"); }
  CommRequest send_recv_start(Stream&, const void*, int64_t, int, void*, int64_t, int, DType) override {
    refuse("send_recv_start");
  }
  bool test(CommRequest& r) override { return !r.active(); }
  void wait(CommRequest&) override {}

 private:
  [[noreturn]] static void refuse(const char* call) {
    throw Error(fmt::format("the cuda backend has no data channel yet (NCCL): {}", call),
                "the cuda backend is a skeleton (src/backend/cuda/cuda_backend.h); use --device cpu");
  }
};

// Device and pinned memory through caches (Note [Caching allocator]: cudaMalloc and cudaFree
// synchronize the device, so a step must not call them per tensor); the streams above.
Backend::Parts cuda_parts(uint64_t device_capacity, uint64_t host_capacity) {
  static CudaDeviceAllocator device_raw;
  static CudaPinnedAllocator pinned_raw;
  Backend::Parts p;
  p.device = std::make_unique<Arena>("device", device_capacity, allocator_cached(device_raw, p.owned));
  p.host = std::make_unique<Arena>("host", host_capacity, allocator_cached(pinned_raw, p.owned));
  p.compute = std::make_unique<CudaStream>("compute");
  p.h2d = std::make_unique<CudaStream>("h2d");
  p.d2h = std::make_unique<CudaStream>("d2h");
  return p;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(uint64_t device_capacity, uint64_t host_capacity)
      : Backend(cuda_parts(device_capacity, host_capacity), kernels_cuda()) {}
  std::string_view name() const override { return "cuda"; }
  bool computes() const override { return true; }
  // Asynchronous on the stream (full speed from pinned host memory, the host arena's).
  void copy_async(Stream& s, void* dst, const void* src, uint64_t bytes) override {
    if (bytes == 0) return;
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<CudaStream&>(s).handle()),
               "copy_async");
  }
  // NCCL comes with the model's kernels. Until then a run over ranks is refused here, and one rank
  // (which moves no device buffer between ranks) gets a channel that refuses any call by name.
  std::unique_ptr<DataComm> data_channel(Comm& control) const override {
    FP_CHECK(control.size() == 1, "run multi-rank work on --device cpu or meta",
             "the cuda backend has no data channel yet (NCCL): {} ranks", control.size());
    return std::make_unique<CudaNoDataComm>();
  }
  // On the compute stream, after the kernels enqueued there, and waited for.
  void copy_to_host(void* dst, const void* src, uint64_t bytes) override { copy_blocking(dst, src, bytes, "copy_to_host"); }
  void copy_from_host(void* dst, const void* src, uint64_t bytes) override {
    copy_blocking(dst, src, bytes, "copy_from_host");
  }

 private:
  void copy_blocking(void* dst, const void* src, uint64_t bytes, const char* what) {
    if (bytes) cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<CudaStream&>(*compute_).handle()), what);
    compute_->synchronize();
  }
};

}  // namespace

bool cuda_device_available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why != nullptr) *why = e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device";
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

std::unique_ptr<Backend> cuda_backend_create(uint64_t device_capacity, uint64_t host_capacity) {
  std::string why;
  FP_CHECK(cuda_device_available(&why), kCudaHint, "--device cuda: no usable GPU ({})", why);
  cuda_check(cudaSetDevice(0), "cudaSetDevice(0)");
  return std::make_unique<CudaBackend>(device_capacity, host_capacity);
}

const ops::Kernels& kernels_cuda() {
  static const ops::Kernels k = [] {
    ops::Kernels t;
#define FP_CUDA_MISSING(name) t.name = &Missing<decltype(t.name), kCudaKernelName_##name>::fn;
    FP_KERNEL_LIST(FP_CUDA_MISSING)
#undef FP_CUDA_MISSING
    // The cpu kernels' sizes until the cuda kernels that need workspace exist.
#define FP_CUDA_WORKSPACE(name) t.name = &ops::cpu::name;
    FP_WORKSPACE_LIST(FP_CUDA_WORKSPACE)
#undef FP_CUDA_WORKSPACE
    t.gemm = &gemm_cublas;
    t.fill = &fill_device;
    t.copy = &copy_device;
    t.add_inplace = &add_device;
    t.scale_inplace = &scale_device;
    // Note [Kernel coverage]: those five, f32 only.
    for (const ops::KernelId k :
         {ops::KernelId::KernelId_gemm, ops::KernelId::KernelId_fill, ops::KernelId::KernelId_copy,
          ops::KernelId::KernelId_add_inplace, ops::KernelId::KernelId_scale_inplace})
      t.dtypes[static_cast<int>(k)] = ops::dtype_bit(DType::DType_F32);
    return t;
  }();
  return k;
}

}  // namespace fp
