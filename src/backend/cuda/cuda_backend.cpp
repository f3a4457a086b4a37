// The cuda backend skeleton (cuda_backend.h).
#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <exception>
#include <functional>
#include <mutex>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_stream.h"
#include "backend/registry.h"
#include "core/error.h"
#include "memory/caching_allocator.h"

namespace fp {

namespace {

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

// Row-major C (M, N) = alpha op(A) op(B) + beta C is column-major C^T (N, M) = alpha op(B)^T op(A)^T +
// beta C^T: the same memory, cuBLAS called with the operands swapped.
// The handle is the stream's own (Note [A cuda stream owns its context] in cuda_stream.h).
// bf16 operands are not in the skeleton yet (cublasGemmEx with CUDA_R_16BF would take them): an error.
void gemm_cublas(const ExecContext& c, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, CBuf a,
                 int64_t lda, CBuf b, int64_t ldb, float beta, Buf cb, int64_t ldc) {
  FP_CHECK(a.dtype == DType::DType_F32 && b.dtype == DType::DType_F32 && cb.dtype == DType::DType_F32, kCudaHint,
           "the cuda backend's gemm takes f32 operands only (got {} x {} -> {})", dtype_name(a.dtype),
           dtype_name(b.dtype), dtype_name(cb.dtype));
  const float* A = static_cast<const float*>(a.p);
  const float* B = static_cast<const float*>(b.p);
  float* C = static_cast<float*>(cb.p);
  if (M == 0 || N == 0) return;
  const cublasStatus_t s = cublas_api().sgemm(
      CudaStream::of(c).blas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, B, static_cast<int>(ldb), A,
      static_cast<int>(lda), &beta, C, static_cast<int>(ldc));
  FP_CHECK(s == CUBLAS_STATUS_SUCCESS, kCudaHint, "cublasSgemm M={} N={} K={} failed (status {})", M, N, K,
           static_cast<int>(s));
}

// The grouped GEMMs (Note [The experts in one call] in ops/gemm_grouped.h): one cuBLAS GEMM per group on
// the stream, from the host offsets, as the cpu backend loops. cuBLAS's grouped GEMM or cuBLASLt per
// group from device pointer arrays is issue "The step on a GPU"'s to measure. The bias epilogues are not
// in the skeleton (no bias kernels yet): an error.
void gemm_grouped_cublas(const ExecContext& c, bool trans_b, int64_t G, const int64_t* offsets, int64_t N, int64_t K,
                         float alpha, CBuf a, const CBuf* b, const CBuf* bias, float beta, Buf cb) {
  for (int64_t g = 0; g < G; ++g) {
    const int64_t r0 = offsets[g], n = offsets[g + 1] - r0;
    if (n == 0) continue;
    FP_CHECK(bias == nullptr || b[g].null() || bias[g].null(), kCudaHint,
             "the cuda backend's gemm_grouped bias epilogue is not implemented yet");
    gemm_cublas(c, false, trans_b, n, N, K, alpha, a.at(r0 * K), K, b[g], trans_b ? K : N, beta, cb.at(r0 * N), N);
  }
}
// Note [Support by shape and options] (backend/kernels.h): the skeleton's grouped GEMMs have no bias epilogues.
std::string cuda_refuses(const ops::KernelUse& u) {
  const bool grouped =
      u.id == ops::KernelId::KernelId_gemm_grouped || u.id == ops::KernelId::KernelId_gemm_grouped_weight;
  return grouped && u.bias ? "bias epilogues are not implemented yet in the cuda skeleton" : "";
}
void gemm_grouped_weight_cublas(const ExecContext& c, int64_t G, const int64_t* offsets, int64_t M, int64_t N,
                                float alpha, CBuf a, CBuf b, float beta, const Buf* cb, const Buf* db) {
  for (int64_t g = 0; g < G; ++g) {
    const int64_t r0 = offsets[g], n = offsets[g + 1] - r0;
    if (n == 0) continue;
    FP_CHECK(db == nullptr || db[g].null(), kCudaHint,
             "the cuda backend's gemm_grouped_weight bias gradient is not implemented yet");
    gemm_cublas(c, true, false, M, N, n, alpha, a.at(r0 * M), M, b.at(r0 * N), N, beta, cb[g], N);
  }
}

// bf16 operands (a converting copy, bf16 element-wise kernels) are not in the skeleton yet: an error.
void copy_device(const ExecContext& c, Buf dst, CBuf src, int64_t n) {
  FP_CHECK(dst.dtype == DType::DType_F32 && src.dtype == DType::DType_F32, kCudaHint,
           "the cuda backend's copy takes f32 operands only (got {} -> {})", dtype_name(src.dtype),
           dtype_name(dst.dtype));
  if (n > 0)
    cuda_check(cudaMemcpyAsync(dst.p, src.p, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDefault,
                               CudaStream::of(c).handle()),
               "copy");
}

// The element-wise kernels of cuda_kernels.cu as table entries.
void fill_device(const ExecContext& c, Buf y, float v, int64_t n) {
  FP_CHECK(y.dtype == DType::DType_F32, kCudaHint, "the cuda backend's fill takes f32 operands only (got {})",
           dtype_name(y.dtype));
  ops::cuda::fill(CudaStream::of(c).handle(), y, v, n);
}
void add_device(const ExecContext& c, Buf y, CBuf x, int64_t n) {
  FP_CHECK(y.dtype == DType::DType_F32 && x.dtype == DType::DType_F32, kCudaHint,
           "the cuda backend's add_inplace takes f32 operands only (got {} += {})", dtype_name(y.dtype),
           dtype_name(x.dtype));
  ops::cuda::add_inplace(CudaStream::of(c).handle(), y, x, n);
}
void scale_device(const ExecContext& c, Buf y, float a, int64_t n) {
  FP_CHECK(y.dtype == DType::DType_F32, kCudaHint, "the cuda backend's scale_inplace takes f32 operands only (got {})",
           dtype_name(y.dtype));
  ops::cuda::scale_inplace(CudaStream::of(c).handle(), y, a, n);
}

// Every kernel of the table the skeleton lacks: an error naming it.
#define FP_CUDA_KERNEL_NAME(name) constexpr char kCudaKernelName_##name[] = #name;
FP_KERNEL_LIST(FP_CUDA_KERNEL_NAME)
#undef FP_CUDA_KERNEL_NAME
#define FP_CUDA_QUERY_NAME(name) constexpr char kCudaQueryName_##name[] = #name;
FP_QUERY_LIST(FP_CUDA_QUERY_NAME)
#undef FP_CUDA_QUERY_NAME
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
  p.host_kernels = &ops::kernels_cpu();  // Note [Host kernels]: pinned host memory is the cpu's
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
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<CudaStream&>(s).handle()), "copy_async");
  }
  // NCCL comes with the model's kernels. Until then a run over ranks is refused here, and one rank
  // (which moves no device buffer between ranks) gets a channel that refuses any call by name.
  std::unique_ptr<DataComm> data_channel(Comm& control) const override {
    FP_CHECK(control.size() == 1, "run multi-rank work on --device cpu or meta",
             "the cuda backend has no data channel yet (NCCL): {} ranks", control.size());
    return std::make_unique<CudaNoDataComm>();
  }
  // On the compute stream, after the kernels enqueued there, and waited for.
  void copy_to_host(void* dst, const void* src, uint64_t bytes) override {
    copy_blocking(dst, src, bytes, "copy_to_host");
  }
  void copy_from_host(void* dst, const void* src, uint64_t bytes) override {
    copy_blocking(dst, src, bytes, "copy_from_host");
  }

 private:
  void copy_blocking(void* dst, const void* src, uint64_t bytes, const char* what) {
    if (bytes)
      cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<CudaStream&>(*compute_).handle()),
                 what);
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
    // Host queries are each backend's own: those of kernels the skeleton lacks are errors naming them too.
#define FP_CUDA_QUERY_MISSING(name) t.name = &Missing<decltype(t.name), kCudaQueryName_##name>::fn;
    FP_QUERY_LIST(FP_CUDA_QUERY_MISSING)
#undef FP_CUDA_QUERY_MISSING
    t.gemm = &gemm_cublas;
    t.gemm_grouped = &gemm_grouped_cublas;
    t.gemm_grouped_weight = &gemm_grouped_weight_cublas;
    t.refuses = &cuda_refuses;
    t.fill = &fill_device;
    t.copy = &copy_device;
    t.add_inplace = &add_device;
    t.scale_inplace = &scale_device;
    // Note [Kernel coverage]: those seven, f32 only.
    for (const ops::KernelId k :
         {ops::KernelId::KernelId_gemm, ops::KernelId::KernelId_gemm_grouped,
          ops::KernelId::KernelId_gemm_grouped_weight, ops::KernelId::KernelId_fill, ops::KernelId::KernelId_copy,
          ops::KernelId::KernelId_add_inplace, ops::KernelId::KernelId_scale_inplace})
      t.dtypes[static_cast<int>(k)] = ops::dtype_bit(DType::DType_F32);
    return t;
  }();
  return k;
}

// Note [Backends as plug-ins] (backend/registry.h).
void backend_register_cuda() {
  backend_register({"cuda", "an NVIDIA GPU (skeleton: arenas, streams, copies, 7 f32 kernels; runs no model yet)",
                    &cuda_backend_create, &kernels_cuda});
}

}  // namespace fp
