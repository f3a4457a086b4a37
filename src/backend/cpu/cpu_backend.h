// The cpu backend (a plug-in, Note [Backends as plug-ins] in backend/registry.h): real memory, the kernels
// of backend/cpu/kernels, copy streams on worker threads.
#pragma once

#include <chrono>

#include "backend/backend.h"

namespace fp {

class CpuBackend final : public Backend {
 public:
  CpuBackend(uint64_t device_capacity, uint64_t host_capacity);
  std::string_view name() const override { return "cpu"; }
  bool computes() const override { return true; }
  void copy_async(Stream& s, void* dst, const void* src, uint64_t bytes) override;
  void copy_to_host(void* dst, const void* src, uint64_t bytes) override;
  void copy_from_host(void* dst, const void* src, uint64_t bytes) override;
  std::unique_ptr<DataComm> data_channel(Comm& control) const override { return data_comm_host(control); }

 private:
  using Clock = std::chrono::steady_clock;
  // Note [Emulated link]: when each direction of the emulated link becomes free; each is read and
  // written only by its copy stream's worker thread.
  Clock::time_point h2d_link_free_{};
  Clock::time_point d2h_link_free_{};
};

namespace ops {
// The cpu kernel table (backend/cpu/kernels as table entries): a kernel runs on the calling thread when
// its stream runs inline (the compute stream, the host stream), else it is enqueued on the stream's
// worker. Every backend's host kernels (Note [Host kernels] in backend/backend.h) on a real host.
const Kernels& kernels_cpu();
}  // namespace ops

}  // namespace fp
