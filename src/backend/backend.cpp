#include "backend/backend.h"

#include <cmath>

#include "backend/cpu/cpu_backend.h"
#ifdef FLATPEAK_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "backend/meta/meta_backend.h"
#include "core/error.h"

namespace fp {

Backend::Backend(Parts parts, const ops::Kernels& k)
    : owned_allocators_(std::move(parts.owned)),
      device_(std::move(parts.device)),
      host_(std::move(parts.host)),
      compute_(std::move(parts.compute)),
      h2d_(std::move(parts.h2d)),
      d2h_(std::move(parts.d2h)),
      kernels_(&k) {
  FP_ASSERT(device_ && host_ && compute_ && h2d_ && d2h_, "a backend needs both arenas and three streams");
}

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
