// Note [Caching allocator]: a training step allocates the same tensors, of the same sizes, in the
// same order, every step. Handing each one back to the system allocator and asking again the next
// step costs a call and fresh pages per tensor on the cpu backend, and on a GPU cudaMalloc / cudaFree
// synchronize the device. So a backend puts this cache between its arenas and its raw allocator
// (PyTorch's CUDACachingAllocator and CachingHostAllocator are the model): a freed block is kept in a
// free list of its size class (block_size_class) and the next request of that class takes it back;
// from the second step on, a step whose sizes repeat asks the system for nothing.
//
// Size classes: below 64 KiB a block's size is the request rounded up to 64 bytes; from 64 KiB up, to
// the next multiple of an eighth of the power of two below it (at most 12.5% more than asked, as
// PyTorch's roundup_power2_divisions).
//
// What it costs, and the bound: the cache holds blocks no tensor uses, never more than the limit; the
// cpu backend sets it to the arena's peak of live bytes so far, so memory reserved stays within twice
// the ledger's peak (what it costs and saves: docs/benchmarks.md, "Host memory over a long run"). A block
// freed past the limit makes room by giving back the cached blocks freed longest ago. A request the raw
// allocator refuses empties the cache and is tried once more.
//
// Why classes and the oldest out: with experts on several ranks the dispatch buffers change size every
// step, as the router's loads move. With exact sizes and a full cache keeping whatever it held first,
// 5 in 6 requests of a `mpirun -np 2` step missed the cache (60K misses in 300 steps), and the system
// allocator, fed and drained in ever new sizes, grew the resident set by 26 MiB per 1000 steps after
// step 200 while the bytes in use stayed flat. With both, 6 in 7 hit; with large blocks mapped (Note
// [Large host blocks are mapped] in memory/arena.cpp) the resident set is flat (docs/benchmarks.md,
// "Runs that stay flat").
//
// The ledger does not see the cache: its figures are the bytes tensors hold (what a plan reads); the
// cache's own figures are stats().
//
// FLATPEAK_NO_ALLOC_CACHE=1 in the environment turns the cache off (every block straight to the raw
// allocator, as PYTORCH_NO_CUDA_MEMORY_CACHING does): for memory checkers such as valgrind, and to
// measure what the cache saves.
//
// Thread-safe (a stream-ordered free may reach it from any thread).
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "memory/allocator.h"

namespace fp {

struct CacheStats {
  uint64_t live_bytes = 0;       // blocks handed out and not given back
  uint64_t cached_bytes = 0;     // blocks kept for reuse
  uint64_t peak_live_bytes = 0;  // peak of live_bytes
  uint64_t peak_reserved_bytes = 0;  // peak of live + cached: what the raw allocator held at most
  uint64_t hits = 0;             // requests served from the cache
  uint64_t misses = 0;           // requests that reached the raw allocator
  uint64_t evicted = 0;          // cached blocks given back to make room under the limit
};

// raw through a new cache appended to owned (the backend keeps it), or raw itself when
// FLATPEAK_NO_ALLOC_CACHE=1 (any value but 0 or 1 is refused). What every backend puts under its arenas.
Allocator& allocator_cached(Allocator& raw, std::vector<std::unique_ptr<Allocator>>& owned);

// The size of the block a request of `bytes` takes (Note [Caching allocator], size classes).
uint64_t block_size_class(uint64_t bytes);

class CachingAllocator final : public Allocator {
 public:
  // base must outlive the cache. limit: the most bytes cached at once (kLimitPeakLive: the peak of
  // live bytes so far).
  static constexpr uint64_t kLimitPeakLive = ~uint64_t{0};
  explicit CachingAllocator(Allocator& base, uint64_t limit = kLimitPeakLive) : base_(base), limit_(limit) {}
  ~CachingAllocator() override { empty_cache(); }

  void* allocate(uint64_t bytes) override;
  void deallocate(void* p, uint64_t bytes) override;
  bool materializes() const override { return base_.materializes(); }
  std::string_view name() const override { return base_.name(); }

  // Gives every cached block back to the raw allocator.
  void empty_cache();
  CacheStats stats() const;

 private:
  uint64_t limit_now() const { return limit_ == kLimitPeakLive ? stats_.peak_live_bytes : limit_; }
  void empty_cache_locked();

  Allocator& base_;
  const uint64_t limit_;
  mutable std::mutex mu_;
  struct Cached {
    uint64_t size;
    void* p;
  };
  // The cached blocks, least recently freed first, and each class's blocks in the same order (a request
  // takes its class's newest, the limit gives back the oldest of all).
  std::list<Cached> lru_;
  std::unordered_map<uint64_t, std::deque<std::list<Cached>::iterator>> free_;  // size class -> its blocks
  CacheStats stats_;
};

}  // namespace fp
