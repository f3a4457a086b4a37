// The cpu backend: real memory, ops/cpu kernels, copy streams on worker threads.
#pragma once

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
};

}  // namespace fp
