#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

namespace fp {

CpuBackend::CpuBackend(uint64_t device_capacity, uint64_t host_capacity)
    : Backend(device_capacity, host_capacity, allocator_host_aligned(), allocator_host_aligned(), ops::kernels_cpu()) {}

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
