// The meta backend (a plug-in, Note [Backends as plug-ins] in backend/registry.h): allocations are
// accounted exactly, nothing exists and nothing is computed; the work is counted (Note [Meta counts the
// work] in backend/work_log.h).
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/work_log.h"

namespace fp {

class MetaBackend final : public Backend {
 public:
  MetaBackend(uint64_t device_capacity, uint64_t host_capacity);
  std::string_view name() const override { return "meta"; }
  bool computes() const override { return false; }
  // Ordering is kept (a task of the stream's lane); no bytes move, the copy is counted.
  void copy_async(Stream& s, void* dst, const void* src, uint64_t bytes) override;
  void copy_to_host(void* dst, const void* src, uint64_t bytes) override;
  void copy_from_host(void* dst, const void* src, uint64_t bytes) override;
  std::unique_ptr<DataComm> data_channel(Comm& control) const override;
  void repeat_begin(int64_t times) override { log_->repeat_push(static_cast<double>(times)); }
  void repeat_end() override { log_->repeat_pop(); }

  // This rank's counts (Note [Meta counts the work]); timed under `profile` (may be null: counts only) for a
  // run of `world` ranks once work_reset has set it. The profile must outlive the backend's use of it.
  WorkLog* work() override { return log_.get(); }
  void work_reset(const DeviceProfile* profile, int world) override { *log_ = WorkLog(profile, world); }

 private:
  MetaBackend(std::shared_ptr<WorkLog> log, uint64_t device_capacity, uint64_t host_capacity);
  std::shared_ptr<WorkLog> log_;  // shared with the streams and their events (backend/meta/meta_stream.h)
};

namespace ops {
// The meta kernel table: every entry computes nothing, counts its work on its stream's log and takes every
// dtype; its host queries (workspace sizes, tiles) are the cpu backend's, whose ledgers meta reproduces.
const Kernels& kernels_meta();
}  // namespace ops

}  // namespace fp
