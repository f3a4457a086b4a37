// SCO, selective checkpoint offload (docs/design.md "SCO"): the checkpoint boundaries live in host memory
// between forward and backward, so the device holds at most two of them whatever the depth.
// Legend: L layers, n tokens, H hidden; a boundary is x_l (n, H) fp32.
//
// Forward, put(l, x_l): the compute stream records "x_l is ready"; the d2h stream waits on it, copies
// x_l into a host buffer and records x_l's offload event. The device copy of x_l is freed at the next
// put, after its offload event completed (so forward holds x_l being copied plus x_{l+1} being
// produced: two boundaries). Boundaries whose host bytes would exceed ckpt.host_budget (or the host
// arena's capacity) stay on the device. The last boundary x_{L-1} always stays: backward reads it
// first, so sending it away and back would only add a round trip before the first recompute.
//
// Backward, get(l) in descending l: when x_l is on the host, its restore (started by the previous
// get as a prefetch, or now) allocates a device tensor, waits on x_l's offload event on the h2d
// stream and copies back; the compute stream waits on the restore event before returning. get(l)
// also starts the restore of x_{l-1}, which then overlaps layer l's recompute and backward.
// release(l) frees the device copy. At most two restored boundaries exist: Note [Why boundaries
// restore two at a time].
//
// clear() waits for every copy, frees every device copy and returns the host buffers to the pool;
// the pool frees them when the store is destroyed (step/step.cpp creates one store per step, so host
// memory is released at the end of the step; a store kept across steps would reuse its buffers).
//
// Allocation order depends only on the call sequence, never on when a copy finishes (frees happen
// at fixed calls, after synchronizing), so the meta backend, where copies are no-ops, produces the
// same device and host ledger events as cpu.
//
// Note [Why boundaries restore two at a time]
// Backward of layer l reads x_l for its whole recompute and backward, and the copy of x_{l-1} should
// run during that time, so it needs a second buffer: one boundary in use, one being filled (double
// buffering). A third buffer would only help if one copy took longer than one layer's compute; then
// the link is the bottleneck and a deeper prefetch moves the stall without removing it, while every
// extra buffer is another n x H on the device. Two keeps the checkpoints peak at 2 x n x H x 4 bytes
// for any L, which is what the schedule promises. The forward side is the mirror image: x_l is
// being offloaded while the layer produces x_{l+1}.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "sched/ckpt/boundary_store.h"

namespace fp {

// Host buffers (pinned memory on a GPU backend, where allocating it is slow) handed out and taken
// back whole. acquire returns an idle buffer of the same bytes when there is one (oldest first),
// otherwise allocates one in the host arena. Idle buffers stay allocated until trim() or destruction.
class HostBufferPool {
 public:
  explicit HostBufferPool(Backend& be) : be_(be) {}
  HostBufferPool(const HostBufferPool&) = delete;
  HostBufferPool& operator=(const HostBufferPool&) = delete;

  // A host tensor of this shape and dtype in category c (contents undefined). Throws
  // OutOfMemoryError over the host capacity.
  Tensor acquire(Category c, const Shape& shape, DType dtype, const std::string& name);
  // Takes the buffer back for a later acquire. The caller guarantees no copy still uses it.
  void give_back(Tensor t);
  // Frees every idle buffer.
  void trim() { idle_.clear(); }
  size_t idle() const { return idle_.size(); }

 private:
  Backend& be_;
  std::deque<Tensor> idle_;
};

class ScoBoundaryStore final : public BoundaryStore {
 public:
  // host_budget: bytes of boundaries that may go to host memory (kUnlimitedBytes: all but the last).
  ScoBoundaryStore(Backend& be, int64_t layers, uint64_t host_budget);
  // Waits for every copy still in flight before the buffers are freed (a step that threw midway).
  ~ScoBoundaryStore() override;

  void put(int64_t l, Tensor x) override;
  void settle() override { pending_offload_finish(); }
  const Tensor& get(int64_t l) override;
  void release(int64_t l) override;
  void clear() override;

  // How the boundaries of the current step were placed (tests, benchmarks).
  int64_t offloaded_count() const { return offloaded_; }
  uint64_t host_bytes() const { return host_used_; }
  const HostBufferPool& pool() const { return pool_; }

 private:
  struct Slot {
    Tensor device;      // (n, H) on the device: kept, being offloaded, or restored; else undefined
    Tensor host;        // (n, H) host copy when offloaded
    bool offloaded = false;
    Event offload_done;  // d2h copy of this boundary finished
    Event restore_done;  // h2d copy back finished
    Shape shape;
    DType dtype{};
  };

  // Waits for the offload of the boundary put last and frees its device copy.
  void pending_offload_finish();
  // Allocates l's device copy and enqueues its h2d copy after its offload.
  void restore_start(int64_t l);
  void copies_wait();

  Backend& be_;
  int64_t layers_;
  uint64_t host_budget_;
  HostBufferPool pool_;
  std::vector<Slot> slots_;
  int64_t pending_ = -1;    // boundary whose device copy waits for its offload, or -1
  int64_t next_put_ = 0;    // call-order checks (boundary_store.h)
  int64_t next_get_ = -1;
  int64_t restored_ = 0;    // restored device copies alive (at most 2)
  int64_t offloaded_ = 0;
  uint64_t host_used_ = 0;
};

}  // namespace fp
