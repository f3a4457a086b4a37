#include "memory/caching_allocator.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace fp {

Allocator& allocator_cached(Allocator& raw, std::vector<std::unique_ptr<Allocator>>& owned) {
  const char* off = std::getenv("FLATPEAK_NO_ALLOC_CACHE");
  FP_CHECK(off == nullptr || std::strcmp(off, "0") == 0 || std::strcmp(off, "1") == 0,
           "set FLATPEAK_NO_ALLOC_CACHE=1 (no cache) or 0 / unset (the cache)",
           "FLATPEAK_NO_ALLOC_CACHE={} is neither 0 nor 1", off);
  if (off != nullptr && std::strcmp(off, "1") == 0) return raw;
  owned.push_back(std::make_unique<CachingAllocator>(raw));
  return *owned.back();
}

uint64_t block_size_class(uint64_t bytes) {
  const uint64_t r = (bytes + 63) / 64 * 64;
  if (r < (uint64_t{64} << 10)) return r;
  const uint64_t step = std::bit_floor(r) / 8;
  return (r + step - 1) / step * step;
}

void* CachingAllocator::allocate(uint64_t bytes) {
  const uint64_t size = block_size_class(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* p = nullptr;
  auto it = free_.find(size);
  if (it != free_.end() && !it->second.empty()) {
    const auto newest = it->second.back();
    p = newest->p;
    it->second.pop_back();
    lru_.erase(newest);
    stats_.cached_bytes -= size;
    ++stats_.hits;
  } else {
    p = base_.allocate(size);
    if (p == nullptr && stats_.cached_bytes > 0) {  // the cache may hold what the request needs
      empty_cache_locked();
      p = base_.allocate(size);
    }
    if (p == nullptr) return nullptr;
    ++stats_.misses;
  }
  stats_.live_bytes += size;
  stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, stats_.live_bytes);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.live_bytes + stats_.cached_bytes);
  return p;
}

void CachingAllocator::deallocate(void* p, uint64_t bytes) {
  const uint64_t size = block_size_class(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.live_bytes -= size;
  const uint64_t limit = limit_now();
  if (size > limit) {
    base_.deallocate(p, size);
    return;
  }
  // Room under the limit: the blocks freed longest ago go first (a size no step asks for any more,
  // or the oldest of a class, which its newer blocks serve as well).
  while (stats_.cached_bytes + size > limit) {
    const Cached old = lru_.front();
    std::deque<std::list<Cached>::iterator>& cls = free_[old.size];
    cls.pop_front();  // a class's oldest block is the oldest of all when it is lru_'s front
    if (cls.empty()) free_.erase(old.size);
    lru_.pop_front();
    base_.deallocate(old.p, old.size);
    stats_.cached_bytes -= old.size;
    ++stats_.evicted;
  }
  free_[size].push_back(lru_.insert(lru_.end(), Cached{size, p}));
  stats_.cached_bytes += size;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  empty_cache_locked();
}

void CachingAllocator::empty_cache_locked() {
  for (const Cached& c : lru_) base_.deallocate(c.p, c.size);
  lru_.clear();
  free_.clear();
  stats_.cached_bytes = 0;
}

CacheStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace fp
