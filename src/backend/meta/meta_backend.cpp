#include "backend/meta/meta_backend.h"

#include "backend/cpu/cpu_backend.h"
#include "backend/kernel_work.h"
#include "backend/meta/meta_comm.h"
#include "backend/meta/meta_stream.h"
#include "backend/registry.h"
#include "core/error.h"

namespace fp {

namespace {

// Null allocators (nothing exists); every stream a lane of the rank's log (backend/meta/meta_stream.h), inline:
// a copy moves nothing, so a W-rank plan does not wake 2W threads per copy.
Backend::Parts meta_parts(const std::shared_ptr<WorkLog>& log, uint64_t device_capacity, uint64_t host_capacity) {
  Backend::Parts p;
  p.device = std::make_unique<Arena>("device", device_capacity, allocator_null());
  p.host = std::make_unique<Arena>("host", host_capacity, allocator_null());
  p.compute = std::make_unique<MetaStream>("compute", log, Lane::Lane_compute);
  p.h2d = std::make_unique<MetaStream>("h2d", log, Lane::Lane_h2d);
  p.d2h = std::make_unique<MetaStream>("d2h", log, Lane::Lane_d2h);
  p.host_stream = std::make_unique<MetaStream>("host", log, Lane::Lane_host);
  p.host_kernels = &ops::kernels_meta();  // nothing exists on its host either
  return p;
}

// The meta backend's entry: computes nothing and counts the call's work (backend/kernel_work.h) on the
// log of its stream (Note [Meta counts the work]).
template <ops::KernelId Id, class Entry>
struct Count;
template <ops::KernelId Id, class... A>
struct Count<Id, void (*)(const ExecContext&, A...)> {
  template <KernelWork (*Work)(A...)>
  static void fn(const ExecContext& ctx, A... a) {
    if (const MetaStream* s = meta_stream_of(ctx.stream)) s->log().kernel(Id, s->lane(), Work(a...));
  }
};

}  // namespace

const ops::Kernels& ops::kernels_meta() {
  static const Kernels k = [] {
    Kernels t;
#define FP_KERNEL_META(name) \
  t.name = &Count<KernelId::KernelId_##name, decltype(t.name)>::template fn<&kernel_work::name>;
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
    : MetaBackend(std::make_shared<WorkLog>(nullptr, 1), device_capacity, host_capacity) {}

MetaBackend::MetaBackend(std::shared_ptr<WorkLog> log, uint64_t device_capacity, uint64_t host_capacity)
    : Backend(meta_parts(log, device_capacity, host_capacity), ops::kernels_meta()), log_(std::move(log)) {}

void MetaBackend::copy_async(Stream& s, void*, const void*, uint64_t bytes) {
  if (const MetaStream* ms = meta_stream_of(s)) ms->log().copy(ms->lane(), static_cast<double>(bytes));
}

void MetaBackend::copy_to_host(void*, const void*, uint64_t) {
  FP_ASSERT(false, "meta backend has no data to copy to the host; data-dependent sizes must come from a profile");
}

void MetaBackend::copy_from_host(void*, const void*, uint64_t) {}

std::unique_ptr<DataComm> MetaBackend::data_channel(Comm& control) const {
  return data_comm_meta_counting(control.rank(), control.size());
}

}  // namespace fp
