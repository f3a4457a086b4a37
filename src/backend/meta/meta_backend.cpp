#include "backend/meta/meta_backend.h"

#include "core/error.h"

namespace fp {

MetaBackend::MetaBackend(uint64_t device_capacity, uint64_t host_capacity)
    : Backend(device_capacity, host_capacity, allocator_null(), allocator_null(), ops::kernels_meta(),
              Stream::Mode::Mode_inline) {}

void MetaBackend::copy_async(Stream& s, void*, const void*, uint64_t) { s.enqueue([] {}); }

void MetaBackend::copy_to_host(void*, const void*, uint64_t) {
  FP_ASSERT(false, "meta backend has no data to copy to the host; data-dependent sizes must come from a profile");
}

void MetaBackend::copy_from_host(void*, const void*, uint64_t) {}

}  // namespace fp
