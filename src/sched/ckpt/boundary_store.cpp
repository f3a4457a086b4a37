#include "sched/ckpt/boundary_store.h"

#include "core/error.h"
#include "sched/ckpt/sco.h"

namespace fp {

std::unique_ptr<BoundaryStore> boundary_store_create(const CkptSchedule& s, Backend& be, int64_t layers) {
  switch (s.kind) {
    case CkptSchedule::Kind::Kind_device: return std::make_unique<DeviceBoundaryStore>(layers);
    case CkptSchedule::Kind::Kind_sco: return std::make_unique<ScoBoundaryStore>(be, layers, s.host_budget);
  }
  return nullptr;
}

}  // namespace fp
