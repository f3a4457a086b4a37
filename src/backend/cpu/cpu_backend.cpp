#include "backend/cpu/cpu_backend.h"

#include <cstring>

namespace fp {

CpuBackend::CpuBackend(uint64_t device_capacity, uint64_t host_capacity)
    : Backend(device_capacity, host_capacity, /*materialize=*/true, ops::kernels_cpu()) {}

void CpuBackend::copy_async(Stream& s, void* dst, const void* src, uint64_t bytes) {
  if (bytes == 0) return;
  s.enqueue([dst, src, bytes] { std::memcpy(dst, src, bytes); });
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
