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
    // Note [Kernel coverage]: each entry below in the dtypes the cpu table takes (kernel_contract_dtypes),
    // so the coverage test counts exactly what is registered here.
#define FP_CUDA_KERNEL(name)                                   \
  t.name = &ops::cuda::name;                                   \
  t.dtypes[static_cast<int>(ops::KernelId::KernelId_##name)] = \
      ops::kernel_contract_dtypes(ops::KernelId::KernelId_##name);
    FP_CUDA_KERNEL(gemm)
    FP_CUDA_KERNEL(gemm_tiled)
    FP_CUDA_KERNEL(gemm_grouped)
    FP_CUDA_KERNEL(gemm_grouped_weight)
    FP_CUDA_KERNEL(add_inplace)
    FP_CUDA_KERNEL(scale_inplace)
    FP_CUDA_KERNEL(fill)
    FP_CUDA_KERNEL(copy)
    FP_CUDA_KERNEL(copy_2d)
    FP_CUDA_KERNEL(add_2d)
    FP_CUDA_KERNEL(bias_add)
    FP_CUDA_KERNEL(bias_backward)
    FP_CUDA_KERNEL(column_sums_f64)
    FP_CUDA_KERNEL(reduce_sum)
    FP_CUDA_KERNEL(reduce_sumsq)
    FP_CUDA_KERNEL(reduce_sumsq_multi)
    FP_CUDA_KERNEL(adamw_update)
    FP_CUDA_KERNEL(adamw_update_multi)
    FP_CUDA_KERNEL(log_softmax_forward)
    FP_CUDA_KERNEL(nll_forward)
    FP_CUDA_KERNEL(cross_entropy_backward)
    FP_CUDA_KERNEL(online_lse_init)
    FP_CUDA_KERNEL(online_lse_fold)
    FP_CUDA_KERNEL(online_lse_loss)
    FP_CUDA_KERNEL(online_lse_backward)
    FP_CUDA_KERNEL(moe_gather)
    FP_CUDA_KERNEL(moe_scatter)
    FP_CUDA_KERNEL(moe_combine_forward)
    FP_CUDA_KERNEL(moe_combine_backward)
    FP_CUDA_KERNEL(moe_scatter_add)
    FP_CUDA_KERNEL(router_forward)
    FP_CUDA_KERNEL(router_gather)
    FP_CUDA_KERNEL(router_backward)
    FP_CUDA_KERNEL(router_sigmoid_forward)
    FP_CUDA_KERNEL(router_sigmoid_gather)
    FP_CUDA_KERNEL(router_sigmoid_backward)
    FP_CUDA_KERNEL(routing_bias_update)
    FP_CUDA_KERNEL(moe_routing_build)
    FP_CUDA_KERNEL(moe_chunk_order)
    FP_CUDA_KERNEL(embedding_forward)
    FP_CUDA_KERNEL(embedding_backward)
    // embedding.cu: a bf16 table gradient is not written yet.
    t.dtypes[static_cast<int>(ops::KernelId::KernelId_embedding_backward)] = ops::dtype_bit(DType::DType_F32);
    FP_CUDA_KERNEL(rmsnorm_forward)
    FP_CUDA_KERNEL(rmsnorm_backward)
    t.rmsnorm_backward_workspace = &ops::cuda::rmsnorm_backward_workspace;
    FP_CUDA_KERNEL(rope_forward)
    FP_CUDA_KERNEL(rope_backward)
    FP_CUDA_KERNEL(rope_strided_forward)
    FP_CUDA_KERNEL(rope_strided_backward)
    FP_CUDA_KERNEL(swiglu_forward)
    FP_CUDA_KERNEL(swiglu_backward)
    FP_CUDA_KERNEL(swiglu_clamped_forward)
    FP_CUDA_KERNEL(swiglu_clamped_backward)
#undef FP_CUDA_KERNEL
    return t;
  }();
  return k;
}

// Note [Backends as plug-ins] (backend/registry.h).
void backend_register_cuda() {
  backend_register({"cuda", "an NVIDIA GPU (51 of the table's kernels, no attention yet; runs no model yet)",
                    &cuda_backend_create, &kernels_cuda});
}

}  // namespace fp
