#include "backend/meta/meta_backend.h"

#include "backend/cpu/cpu_backend.h"
#include "backend/host_stream.h"
#include "backend/registry.h"
#include "core/error.h"

namespace fp {

namespace {

// Null allocators (nothing exists); every stream inline: a copy moves nothing, so a W-rank plan does
// not wake 2W threads per copy.
Backend::Parts meta_parts(uint64_t device_capacity, uint64_t host_capacity) {
  Backend::Parts p;
  p.device = std::make_unique<Arena>("device", device_capacity, allocator_null());
  p.host = std::make_unique<Arena>("host", host_capacity, allocator_null());
  p.compute = std::make_unique<HostStream>("compute", HostStream::Mode::Mode_inline);
  p.h2d = std::make_unique<HostStream>("h2d", HostStream::Mode::Mode_inline);
  p.d2h = std::make_unique<HostStream>("d2h", HostStream::Mode::Mode_inline);
  p.host_kernels = &ops::kernels_meta();  // nothing exists on its host either
  return p;
}

// The meta backend's entry: nothing to compute (Note [Kernel execution context] needs no stream here).
template <class Entry>
struct Noop;
template <class... A>
struct Noop<void (*)(const ExecContext&, A...)> {
  static void fn(const ExecContext&, A...) {}
};

}  // namespace

const ops::Kernels& ops::kernels_meta() {
  static const Kernels k = [] {
    Kernels t;
#define FP_KERNEL_META(name) t.name = &Noop<decltype(t.name)>::fn;
    FP_KERNEL_LIST(FP_KERNEL_META)
#undef FP_KERNEL_META
    t.dtypes.fill(~0u);                                   // computes nothing: every kernel, every dtype
#define FP_QUERY_META(name) t.name = kernels_cpu().name;  // the ledgers (and tiles) of the cpu backend
    FP_QUERY_LIST(FP_QUERY_META)
#undef FP_QUERY_META
    return t;
  }();
  return k;
}

// Note [Backends as plug-ins] (backend/registry.h).
void backend_register_meta() {
  backend_register({"meta", "computes nothing, allocates exactly as cpu: exact peaks at any scale in seconds",
                    &backend_make<MetaBackend>, &ops::kernels_meta});
}

MetaBackend::MetaBackend(uint64_t device_capacity, uint64_t host_capacity)
    : Backend(meta_parts(device_capacity, host_capacity), ops::kernels_meta()) {}

void MetaBackend::copy_async(Stream& s, void*, const void*, uint64_t) {
  s.enqueue([] {});
}

void MetaBackend::copy_to_host(void*, const void*, uint64_t) {
  FP_ASSERT(false, "meta backend has no data to copy to the host; data-dependent sizes must come from a profile");
}

void MetaBackend::copy_from_host(void*, const void*, uint64_t) {}

}  // namespace fp
