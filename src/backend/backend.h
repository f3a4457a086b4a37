// The backend interface: device memory (an Arena with its ledger), host memory (a second Arena),
// streams and events, copies, and the kernel table. Model and schedule code are written once
// against it.
//
//   cpu   computes: kernels are backend/cpu/kernels, memory is real, copy streams are worker threads.
//   meta  computes nothing: the same allocations and frees reach the same ledger in the same order,
//         data pointers are null and kernels do nothing, so peaks at any scale take seconds.
//   cuda  (FLATPEAK_CUDA, src/backend/cuda) a skeleton: arenas over cudaMalloc / cudaMallocHost, its
//         own streams and events (cudaStream_t, cudaEvent_t), asynchronous copies, a few kernels (fill,
//         copy, add, GEMM through cuBLAS); the rest of its kernel table is empty, so it runs no model yet.
//
// Each is a plug-in that registers itself (Note [Backends as plug-ins] in backend/registry.h); this base
// names none of them. Each backend builds its own arenas (over its allocators, memory/allocator.h) and
// streams (core/stream.h) and hands them to this base, which owns them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/kernels.h"
#include "backend/work_log.h"
#include "comm/data_comm.h"
#include "core/stream.h"
#include "memory/arena.h"

namespace fp {

class Backend {
 public:
  // The backend's pieces, built by the derived backend: the device and host arenas over their
  // allocators (owned: allocators the backend made for itself, such as its caches; others must
  // outlive it), the compute stream (the one kernels run on), the two copy streams, and the kernel
  // table of its host memory (host_kernels below).
  struct Parts {
    std::vector<std::unique_ptr<Allocator>> owned;
    std::unique_ptr<Arena> device, host;
    std::unique_ptr<Stream> compute, h2d, d2h;
    std::unique_ptr<Stream> host_stream;  // the host kernels' (null: an inline HostStream)
    const ops::Kernels* host_kernels = nullptr;
  };
  virtual ~Backend();

  virtual std::string_view name() const = 0;
  // False on meta: nothing is computed, data-dependent sizes come from a routing profile.
  virtual bool computes() const = 0;
  // The kernel table bound to the compute stream (K.gemm(...)), or to another stream of this backend
  // (Note [Kernel execution context] in backend/kernels.h).
  ops::KernelLauncher kernels() const { return ops::KernelLauncher(*kernels_, *compute_); }
  ops::KernelLauncher kernels_on(Stream& s) const { return ops::KernelLauncher(*kernels_, s); }
  // Replaces the kernel table (benchmarks: ops::kernels_cpu_gemm_profiled). Same backend semantics.
  void kernels_set(const ops::Kernels& k) { kernels_ = &k; }
  // Note [Host kernels]: the kernels of this backend's host memory (alloc_host) and of plain host
  // memory, run on the calling thread: the offloaded optimizers' AdamW over host state, the host-side
  // dtype conversions of checkpoints and initial weights. Whatever the device, the host is a cpu, so
  // cpu and cuda give the cpu table here; meta gives its do-nothing table (nothing exists on its host
  // either), so a caller needs no branch for it.
  ops::KernelLauncher host_kernels() const { return ops::KernelLauncher(*host_kernels_, *host_stream_); }

  Arena& device() { return *device_; }
  Arena& host() { return *host_; }
  Ledger& device_ledger() { return device_->ledger(); }
  Ledger& host_ledger() { return host_->ledger(); }

  // A device tensor in category c. Throws OutOfMemoryError over the device capacity.
  Tensor alloc(Category c, const Shape& shape, DType dtype, std::string name) {
    return Tensor(*device_, c, shape, dtype, std::move(name));
  }
  Tensor alloc_f32(Category c, const Shape& shape, std::string name) {
    return alloc(c, shape, DType::DType_F32, std::move(name));
  }
  // A host buffer, accounted in the host ledger (pinned memory on a GPU backend).
  Tensor alloc_host(Category c, const Shape& shape, DType dtype, std::string name) {
    return Tensor(*host_, c, shape, dtype, std::move(name));
  }

  Stream& compute_stream() { return *compute_; }
  Stream& h2d_stream() { return *h2d_; }
  Stream& d2h_stream() { return *d2h_; }

  // Copies of `bytes` bytes enqueued on a stream (ordered with the stream's other work). dst and src
  // are data pointers of tensors of this backend (device or host arena) or plain host memory.
  // Nothing is moved on meta.
  virtual void copy_async(Stream& s, void* dst, const void* src, uint64_t bytes) = 0;
  // Blocking copy from a device tensor to plain host memory (sizes that depend on data, scalars).
  // On meta it must not be called for data (there is none): asserts.
  virtual void copy_to_host(void* dst, const void* src, uint64_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* src, uint64_t bytes) = 0;

  // The data channel of this backend's device buffers over the run's control channel (comm/data_comm.h):
  // cpu moves them through the control engine (its device memory is host memory), meta moves nothing.
  // `control` must outlive the channel.
  virtual std::unique_ptr<DataComm> data_channel(Comm& control) const = 0;

  // Note [Emulated link]: for schedule studies on a machine without a device, the copy streams can
  // emulate a host-device link of gbps GB/s (1e9 bytes per second, each direction on its own: PCIe
  // is full duplex): a copy_async of b bytes on h2d_stream() or d2h_stream() then takes at least
  // b / (gbps * 1e9) seconds (the cpu backend copies, then sleeps out the rest). 0 turns it off (the
  // default); copies on the compute stream (device to device) and the blocking copies are never
  // slowed. Figures measured with it are emulated, and reported as such. Applies to copies enqueued
  // after the call.
  void link_set_gbps(double gbps);
  double link_gbps() const { return link_gbps_; }

  // Note [Meta counts the work] (backend/work_log.h): the work between repeat_begin(times) and repeat_end()
  // stands for `times` repeats of it (repeat_same in model/blocks.h); a backend that counts multiplies it.
  virtual void repeat_begin(int64_t times) { (void)times; }
  virtual void repeat_end() {}
  // The counts of work of a backend that counts (meta), else null; work_reset starts them afresh, timed under
  // `profile` (null: counts only) for a run of `world` ranks. The profile must outlive the counting.
  virtual WorkLog* work() { return nullptr; }
  virtual void work_reset(const DeviceProfile* profile, int world) { (void)profile, (void)world; }

  // Waits for every stream.
  void synchronize() {
    h2d_->synchronize();
    d2h_->synchronize();
    compute_->synchronize();
  }

 protected:
  Backend(Parts parts, const ops::Kernels& k);

  // Destroyed in reverse: the streams drain first, then the arenas give their blocks back, then the
  // allocators go.
  std::vector<std::unique_ptr<Allocator>> owned_allocators_;
  std::unique_ptr<Arena> device_;
  std::unique_ptr<Arena> host_;
  std::unique_ptr<Stream> compute_;
  std::unique_ptr<Stream> h2d_;
  std::unique_ptr<Stream> d2h_;
  std::unique_ptr<Stream> host_stream_;  // inline: host kernels run on the calling thread
  const ops::Kernels* kernels_;
  const ops::Kernels* host_kernels_;
  double link_gbps_ = 0.0;  // Note [Emulated link]; 0 = off
};

// The registered backend `name` (backend/registry.h: "cpu", "meta", and "cuda" in a build with
// FLATPEAK_CUDA); fp::Error for a name no plug-in registered (listing those that did), and for cuda
// without a usable GPU. Capacities in bytes (kUnlimitedBytes for none).
std::unique_ptr<Backend> backend_create(std::string_view name, uint64_t device_capacity, uint64_t host_capacity);

}  // namespace fp
