// Where the checkpoint boundaries live between forward and backward (Note [Per-layer checkpointing]
// in step/step.h). Legend: L layers, n tokens, H hidden; a boundary is x_l (n, H).
//
// The model calls, for one step:
//   forward   put(0, x_0), put(1, x_1), ..., put(L-1, x_{L-1})      (l ascending)
//   backward  get(L-1) ... release(L-1), get(L-2) ... release(L-2), ... (l descending)
//   end       clear()
// get(l) returns a device tensor holding exactly what put(l) received, valid until release(l).
#pragma once

#include <cstdint>
#include <memory>

#include "backend/backend.h"
#include "model/schedules.h"

namespace fp {

class BoundaryStore {
 public:
  virtual ~BoundaryStore() = default;
  // Takes ownership of layer l's boundary (a device tensor, category checkpoints), right after the
  // compute stream produced it.
  virtual void put(int64_t l, Tensor x) = 0;
  // The boundary of layer l on the device, ready for the compute stream to read.
  virtual const Tensor& get(int64_t l) = 0;
  // Layer l's backward is done with its boundary.
  virtual void release(int64_t l) = 0;
  // Forward: the boundary put last leaves the device once its offload completed (SCO), before the next put
  // would free it; a store that keeps its boundaries on the device has nothing to do. A sequence-tiled layer
  // calls it before it allocates its output (Note [Sequence-tiled layers] in model/layer_tiles.cpp).
  virtual void settle() {}
  // End of step: everything still held is freed (host buffers go back to their pool).
  virtual void clear() = 0;
};

// The plain variant: all boundaries stay on the device (L x n x H in category checkpoints).
class DeviceBoundaryStore final : public BoundaryStore {
 public:
  explicit DeviceBoundaryStore(int64_t layers) : held_(static_cast<size_t>(layers)) {}
  void put(int64_t l, Tensor x) override { held_[l] = std::move(x); }
  const Tensor& get(int64_t l) override { return held_[l]; }
  void release(int64_t l) override { held_[l].reset(); }
  void clear() override {
    for (Tensor& t : held_) t.reset();
  }

 private:
  std::vector<Tensor> held_;
};

// The store of a schedule: DeviceBoundaryStore, or SCO (sched/ckpt/sco.h).
std::unique_ptr<BoundaryStore> boundary_store_create(const CkptSchedule& s, Backend& be, int64_t layers);

}  // namespace fp
