#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "backend/cpu/kernels/ops.h"
#include "backend/host_stream.h"
#include "backend/registry.h"
#include "memory/caching_allocator.h"

namespace fp {

namespace {

// Both arenas over 64-byte aligned host memory, each through its own cache (Note [Caching allocator];
// off with FLATPEAK_NO_ALLOC_CACHE=1); an inline compute stream and two worker copy streams.
Backend::Parts cpu_parts(uint64_t device_capacity, uint64_t host_capacity) {
  Backend::Parts p;
  p.device = std::make_unique<Arena>("device", device_capacity, allocator_cached(allocator_host_aligned(), p.owned));
  p.host = std::make_unique<Arena>("host", host_capacity, allocator_cached(allocator_host_aligned(), p.owned));
  p.compute = std::make_unique<HostStream>("compute", HostStream::Mode::Mode_inline);
  p.h2d = std::make_unique<HostStream>("h2d", HostStream::Mode::Mode_worker);
  p.d2h = std::make_unique<HostStream>("d2h", HostStream::Mode::Mode_worker);
  p.host_kernels = &ops::kernels_cpu();
  return p;
}

// A cpu kernel as a table entry: run on the calling thread when the stream runs its work inline (the
// compute stream), else enqueued on the stream (its worker runs it in order with the stream's copies;
// the arguments are copied into the task, so pointers must outlive it, as on a device).
template <auto Op>
struct OnCpuStream;
template <class... A, void (*Op)(A...)>
struct OnCpuStream<Op> {
  static void fn(const ExecContext& c, A... a) {
    if (c.stream.runs_inline()) {
      Op(a...);
      return;
    }
    c.stream.enqueue([=] { Op(a...); });
  }
};

}  // namespace

const ops::Kernels& ops::kernels_cpu() {
  static const Kernels k = [] {
    Kernels t;
#define FP_KERNEL_CPU(name) t.name = &OnCpuStream<&::fp::ops::cpu::name>::fn;
    FP_KERNEL_LIST(FP_KERNEL_CPU)
#undef FP_KERNEL_CPU
    for (int i = 0; i < kKernelCount; ++i) t.dtypes[i] = kernel_contract_dtypes(static_cast<KernelId>(i));
#define FP_QUERY_CPU(name) t.name = &::fp::ops::cpu::name;
    FP_QUERY_LIST(FP_QUERY_CPU)
#undef FP_QUERY_CPU
    return t;
  }();
  return k;
}

// Note [Backends as plug-ins] (backend/registry.h).
void backend_register_cpu() {
  backend_register({"cpu", "computes (OpenBLAS / oneDNN GEMMs, OpenMP and SIMD kernels); real memory",
                    &backend_make<CpuBackend>, &ops::kernels_cpu});
}

CpuBackend::CpuBackend(uint64_t device_capacity, uint64_t host_capacity)
    : Backend(cpu_parts(device_capacity, host_capacity), ops::kernels_cpu()) {}

void CpuBackend::copy_async(Stream& s, void* dst, const void* src, uint64_t bytes) {
  if (bytes == 0) return;
  // Note [Emulated link] (backend.h): only the copy streams cross the link.
  Clock::time_point* link_free = &s == h2d_.get() ? &h2d_link_free_ : &s == d2h_.get() ? &d2h_link_free_ : nullptr;
  if (link_free == nullptr || link_gbps_ <= 0) {
    s.enqueue([dst, src, bytes] { std::memcpy(dst, src, bytes); });
    return;
  }
  const auto link_time = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(static_cast<double>(bytes) / (link_gbps_ * 1e9)));
  const Clock::time_point issued = Clock::now();
  s.enqueue([dst, src, bytes, link_time, link_free, issued] {
    // The link is a clock per direction, touched only by its stream's worker. A copy that was issued
    // while the link was still busy and that follows the previous one closely (within the sleep's
    // usual overshoot) starts when the link became free, so a train of small copies is not slowed by
    // one overshoot each. A copy issued after the link fell idle, or reached after a real gap (say,
    // waiting on an event), starts now: never before it existed.
    constexpr auto kBackToBack = std::chrono::microseconds(200);
    const Clock::time_point now = Clock::now();
    const bool queued = issued <= *link_free && now - *link_free < kBackToBack;
    const Clock::time_point start = queued ? *link_free : now;
    std::memcpy(dst, src, bytes);
    // A memcpy slower than the link holds it for as long as the memcpy took.
    const Clock::time_point end = start + std::max(link_time, Clock::now() - now);
    *link_free = end;
    std::this_thread::sleep_until(end);
  });
}

void CpuBackend::copy_to_host(void* dst, const void* src, uint64_t bytes) {
  compute_->synchronize();
  if (bytes) std::memcpy(dst, src, bytes);
}

void CpuBackend::copy_from_host(void* dst, const void* src, uint64_t bytes) {
  compute_->synchronize();
  if (bytes) std::memcpy(dst, src, bytes);
}

}  // namespace fp
