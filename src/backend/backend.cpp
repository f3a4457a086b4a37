#include "backend/backend.h"

#include <cmath>
#include <mutex>

#include "backend/host_stream.h"
#include "backend/registry.h"
#include "core/error.h"

namespace fp {

Backend::Backend(Parts parts, const ops::Kernels& k)
    : owned_allocators_(std::move(parts.owned)),
      device_(std::move(parts.device)),
      host_(std::move(parts.host)),
      compute_(std::move(parts.compute)),
      h2d_(std::move(parts.h2d)),
      d2h_(std::move(parts.d2h)),
      host_stream_(parts.host_stream
                       ? std::move(parts.host_stream)
                       : std::unique_ptr<Stream>(std::make_unique<HostStream>("host", HostStream::Mode::Mode_inline))),
      kernels_(&k),
      host_kernels_(parts.host_kernels) {
  FP_ASSERT(device_ && host_ && compute_ && h2d_ && d2h_, "a backend needs both arenas and three streams");
  FP_ASSERT(host_kernels_ != nullptr, "a backend needs a kernel table for its host memory");
}

Backend::~Backend() = default;

void Backend::link_set_gbps(double gbps) {
  FP_CHECK(gbps >= 0 && std::isfinite(gbps), "pass a link speed in GB/s, or 0 for none",
           "emulated link speed {} GB/s is not a non-negative number", gbps);
  link_gbps_ = gbps;
}

namespace {

// Registered before main by the build's list of plug-ins (Note [Backends as plug-ins]) and read after:
// the mutex only guards against a plug-in registering from a thread of its own.
struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<BackendEntry>> entries;
};
Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void backend_register(BackendEntry entry) {
  FP_ASSERT(!entry.name.empty() && entry.create != nullptr && entry.kernels != nullptr,
            "backend '{}' registers without a name, a factory or a kernel table", entry.name);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& e : r.entries) FP_ASSERT(e->name != entry.name, "backend '{}' registered twice", entry.name);
  r.entries.push_back(std::make_unique<BackendEntry>(std::move(entry)));
}

const BackendEntry* backend_find(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& e : r.entries)
    if (e->name == name) return e.get();
  return nullptr;
}

std::vector<const BackendEntry*> backends_registered() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<const BackendEntry*> out;
  for (const auto& e : r.entries) out.push_back(e.get());
  return out;
}

const BackendEntry& backend_get(std::string_view name) {
  if (const BackendEntry* e = backend_find(name)) return *e;
  std::string known;
  for (const BackendEntry* e : backends_registered())
    known += fmt::format("{}  --device {}: {}", known.empty() ? "" : "\n", e->name, e->summary);
  if (known.empty()) known = "(none: this program was linked without flatpeak_engine's list of backends)";
  throw Error(fmt::format("unknown device '{}'", name), fmt::format("this build has:\n{}", known));
}

std::unique_ptr<Backend> backend_create(std::string_view name, uint64_t device_capacity, uint64_t host_capacity) {
  return backend_get(name).create(device_capacity, host_capacity);
}

}  // namespace fp
