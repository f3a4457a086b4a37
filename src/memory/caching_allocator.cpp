#include "memory/caching_allocator.h"

#include <algorithm>
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

void* CachingAllocator::allocate(uint64_t bytes) {
  const uint64_t size = rounded(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* p = nullptr;
  auto it = free_.find(size);
  if (it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
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
  const uint64_t size = rounded(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.live_bytes -= size;
  if (stats_.cached_bytes + size > limit_now()) {
    base_.deallocate(p, size);
    return;
  }
  free_[size].push_back(p);
  stats_.cached_bytes += size;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  empty_cache_locked();
}

void CachingAllocator::empty_cache_locked() {
  for (auto& [size, blocks] : free_) {
    for (void* p : blocks) base_.deallocate(p, size);
    blocks.clear();
  }
  free_.clear();
  stats_.cached_bytes = 0;
}

CacheStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace fp
