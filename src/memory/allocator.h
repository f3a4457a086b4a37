// Where an Arena's bytes come from (PyTorch's c10::Allocator is the model): the arena keeps the
// ledger (categories, peaks, capacity), the allocator only hands out and takes back raw memory. A
// backend injects one per memory space: 64-byte aligned host memory (cpu), nothing at all (meta:
// the ledger still sees every allocation, data pointers are null), device and pinned host memory
// (cuda, src/backend/cuda).
#pragma once

#include <cstdint>
#include <string_view>

namespace fp {

class Allocator {
 public:
  virtual ~Allocator() = default;
  // bytes > 0. Null when the memory is not there (the arena turns that into an error naming the
  // tensor); never called on an allocator that does not materialize.
  virtual void* allocate(uint64_t bytes) = 0;
  // p from allocate (never null), with the same bytes.
  virtual void deallocate(void* p, uint64_t bytes) = 0;
  // False for the meta allocator: allocations are accounted only.
  virtual bool materializes() const { return true; }
  virtual std::string_view name() const = 0;
};

// 64-byte aligned host memory (std::aligned_alloc; a mapping of its own from 256 KiB, Note [Large host
// blocks are mapped] in memory/arena.cpp); one instance for the process.
Allocator& allocator_host_aligned();
// No memory: every allocation is accounted and its data pointer is null (the meta backend).
Allocator& allocator_null();

}  // namespace fp
