#include "backend/backend.h"

#include <cmath>

#include "backend/cpu/cpu_backend.h"
#ifdef FLATPEAK_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "backend/meta/meta_backend.h"
#include "core/error.h"

namespace fp {

Backend::Backend(uint64_t device_capacity, uint64_t host_capacity, Allocator& device_allocator,
                 Allocator& host_allocator, const ops::Kernels& k, Stream::Mode copy_mode)
    : device_(std::make_unique<Arena>("device", device_capacity, device_allocator)),
      host_(std::make_unique<Arena>("host", host_capacity, host_allocator)),
      compute_(std::make_unique<Stream>("compute", Stream::Mode::Mode_inline)),
      h2d_(std::make_unique<Stream>("h2d", copy_mode)),
      d2h_(std::make_unique<Stream>("d2h", copy_mode)),
      kernels_(&k) {}

void Backend::link_set_gbps(double gbps) {
  FP_CHECK(gbps >= 0 && std::isfinite(gbps), "pass a link speed in GB/s, or 0 for none",
           "emulated link speed {} GB/s is not a non-negative number", gbps);
  link_gbps_ = gbps;
}

std::unique_ptr<Backend> backend_create(std::string_view name, uint64_t device_capacity, uint64_t host_capacity) {
  if (name == "cpu") return std::make_unique<CpuBackend>(device_capacity, host_capacity);
  if (name == "meta") return std::make_unique<MetaBackend>(device_capacity, host_capacity);
#ifdef FLATPEAK_HAVE_CUDA
  if (name == "cuda") return cuda_backend_create(device_capacity, host_capacity);
#endif
  throw Error(fmt::format("unknown device '{}'", name),
              "use --device cpu (computes) or --device meta (allocations only: exact peaks at any scale)");
}

}  // namespace fp
