// The meta backend (a plug-in, Note [Backends as plug-ins] in backend/registry.h): allocations are
// accounted exactly, nothing exists and nothing is computed.
#pragma once

#include "backend/backend.h"

namespace fp {

class MetaBackend final : public Backend {
 public:
  MetaBackend(uint64_t device_capacity, uint64_t host_capacity);
  std::string_view name() const override { return "meta"; }
  bool computes() const override { return false; }
  // Ordering is kept (an empty task on the stream); no bytes move.
  void copy_async(Stream& s, void* dst, const void* src, uint64_t bytes) override;
  void copy_to_host(void* dst, const void* src, uint64_t bytes) override;
  void copy_from_host(void* dst, const void* src, uint64_t bytes) override;
  std::unique_ptr<DataComm> data_channel(Comm& control) const override {
    return data_comm_meta(control.rank(), control.size());
  }
};

namespace ops {
// The meta kernel table: every entry does nothing and takes every dtype; its host queries (workspace
// sizes, tiles) are the cpu backend's, whose ledgers meta reproduces.
const Kernels& kernels_meta();
}  // namespace ops

}  // namespace fp
