// SCO: checkpoint boundaries offloaded to host memory (sco.h). Legend: L layers, n tokens, H hidden.
#include "sched/ckpt/sco.h"

#include <fmt/format.h>
#include <algorithm>

#include "core/error.h"

namespace fp {

Tensor HostBufferPool::acquire(Category c, const Shape& shape, DType dtype, const std::string& name) {
  for (auto it = idle_.begin(); it != idle_.end(); ++it) {
    if (it->category() == c && it->shape() == shape && it->dtype() == dtype) {
      Tensor t = std::move(*it);
      idle_.erase(it);
      return t;
    }
  }
  return be_.alloc_host(c, shape, dtype, name);
}

void HostBufferPool::give_back(Tensor t) {
  if (t.defined()) idle_.push_back(std::move(t));
}

ScoBoundaryStore::ScoBoundaryStore(Backend& be, int64_t layers, uint64_t host_budget)
    : be_(be), layers_(layers), host_budget_(host_budget), pool_(be), slots_(static_cast<size_t>(layers)) {
  FP_ASSERT(layers >= 1);
}

ScoBoundaryStore::~ScoBoundaryStore() { copies_wait(); }

void ScoBoundaryStore::copies_wait() {
  // Event::synchronize never throws; a copy's own error would surface at the stream's synchronize.
  for (Slot& s : slots_) {
    s.offload_done.synchronize();
    s.restore_done.synchronize();
  }
}

void ScoBoundaryStore::pending_offload_finish() {
  if (pending_ < 0) return;
  Slot& s = slots_[pending_];
  // The d2h copy reads the device copy: it may be freed only once the copy finished. A stream-ordered
  // free (Note [Stream-ordered frees] in memory/arena.h) would spare the host this wait, but when the
  // link is slower than a layer the blocks of copies still running would pile up beyond the ledger's
  // two boundaries; waiting here keeps what the device holds equal to what the ledger says.
  s.offload_done.synchronize();
  s.device.reset();
  pending_ = -1;
}

void ScoBoundaryStore::put(int64_t l, Tensor x) {
  FP_ASSERT(l == next_put_, "put({}) out of order (expected put({}))", l, next_put_);
  FP_ASSERT(x.defined());
  ++next_put_;
  // The previous boundary's copy ran while the compute stream produced this one; finish it first so
  // the device holds at most two boundaries in forward too.
  pending_offload_finish();
  Slot& s = slots_[l];
  s.shape = x.shape();
  s.dtype = x.dtype();
  const uint64_t bytes = x.bytes();
  const Ledger& hl = be_.host_ledger();
  const bool fits_budget = bytes <= host_budget_ - std::min(host_budget_, host_used_);
  const bool fits_host = hl.capacity() == kUnlimitedBytes || hl.total_current() + bytes <= hl.capacity();
  // The last boundary is read first in backward: offloading it would only add a round trip.
  if (l + 1 == layers_ || !fits_budget || !fits_host) {
    s.device = std::move(x);
    return;
  }
  s.host = pool_.acquire(Category::Category_checkpoints, s.shape, s.dtype, fmt::format("sco.host.layer{}", l));  // (n, H)
  host_used_ += bytes;
  s.offloaded = true;
  ++offloaded_;
  // The copy may start only once the compute stream produced x_l (an inline stream has, but a
  // device stream may still be running the kernel that writes it).
  Event ready;
  be_.compute_stream().record(ready);
  Stream& d2h = be_.d2h_stream();
  d2h.wait(ready);
  be_.copy_async(d2h, s.host.data(), x.data(), bytes);
  d2h.record(s.offload_done);
  s.device = std::move(x);
  pending_ = l;
}

void ScoBoundaryStore::restore_start(int64_t l) {
  Slot& s = slots_[l];
  FP_ASSERT(s.offloaded && !s.device.defined());
  FP_ASSERT(restored_ < 2, "Note [Why boundaries restore two at a time]: a third restore of layer {}", l);
  s.device = be_.alloc(Category::Category_checkpoints, s.shape, s.dtype, fmt::format("ckpt.layer{}.restored", l));  // (n, H)
  ++restored_;
  Stream& h2d = be_.h2d_stream();
  // Memory just freed may still be read by work already enqueued on the compute stream (on a device:
  // the previous layer's backward); the copy must not overwrite it before that work is done.
  Event freed;
  be_.compute_stream().record(freed);
  h2d.wait(freed);
  // Without this edge the copy could read the host buffer before the offload wrote it: stale data,
  // silently wrong gradients (docs/design.md "SCO").
  h2d.wait(s.offload_done);
  be_.copy_async(h2d, s.device.data(), s.host.data(), s.device.bytes());
  h2d.record(s.restore_done);
}

const Tensor& ScoBoundaryStore::get(int64_t l) {
  if (next_get_ < 0) {
    FP_ASSERT(next_put_ == layers_, "get({}) before every boundary was put ({} of {})", l, next_put_, layers_);
    next_get_ = layers_ - 1;
    pending_offload_finish();
  }
  FP_ASSERT(l == next_get_, "get({}) out of order (expected get({}))", l, next_get_);
  Slot& s = slots_[l];
  if (s.offloaded && !s.device.defined()) restore_start(l);
  // Prefetch: x_{l-1} comes back while layer l recomputes.
  if (l > 0) {
    Slot& prev = slots_[l - 1];
    if (prev.offloaded && !prev.device.defined()) restore_start(l - 1);
  }
  // Kernels the caller enqueues next read x_l: they start after its restore (on cpu, where compute
  // is inline, this blocks the host until the copy is done).
  if (s.offloaded) be_.compute_stream().wait(s.restore_done);
  FP_ASSERT(s.device.defined());
  return s.device;
}

void ScoBoundaryStore::release(int64_t l) {
  FP_ASSERT(l == next_get_, "release({}) does not follow get({})", l, next_get_);
  Slot& s = slots_[l];
  if (s.offloaded && s.device.defined()) --restored_;
  s.device.reset();
  --next_get_;
}

void ScoBoundaryStore::clear() {
  copies_wait();
  for (Slot& s : slots_) {
    s.device.reset();
    pool_.give_back(std::move(s.host));
    s = Slot{};
  }
  pending_ = -1;
  next_put_ = 0;
  next_get_ = -1;
  restored_ = 0;
  offloaded_ = 0;
  host_used_ = 0;
}

}  // namespace fp
