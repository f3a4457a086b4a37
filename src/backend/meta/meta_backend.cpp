#include "backend/meta/meta_backend.h"

#include "backend/cpu/cpu_stream.h"
#include "core/error.h"

namespace fp {

namespace {

// Null allocators (nothing exists); every stream inline: a copy moves nothing, so a W-rank plan does
// not wake 2W threads per copy.
Backend::Parts meta_parts(uint64_t device_capacity, uint64_t host_capacity) {
  Backend::Parts p;
  p.device = std::make_unique<Arena>("device", device_capacity, allocator_null());
  p.host = std::make_unique<Arena>("host", host_capacity, allocator_null());
  p.compute = std::make_unique<CpuStream>("compute", CpuStream::Mode::Mode_inline);
  p.h2d = std::make_unique<CpuStream>("h2d", CpuStream::Mode::Mode_inline);
  p.d2h = std::make_unique<CpuStream>("d2h", CpuStream::Mode::Mode_inline);
  return p;
}

}  // namespace

MetaBackend::MetaBackend(uint64_t device_capacity, uint64_t host_capacity)
    : Backend(meta_parts(device_capacity, host_capacity), ops::kernels_meta()) {}

void MetaBackend::copy_async(Stream& s, void*, const void*, uint64_t) { s.enqueue([] {}); }

void MetaBackend::copy_to_host(void*, const void*, uint64_t) {
  FP_ASSERT(false, "meta backend has no data to copy to the host; data-dependent sizes must come from a profile");
}

void MetaBackend::copy_from_host(void*, const void*, uint64_t) {}

}  // namespace fp
