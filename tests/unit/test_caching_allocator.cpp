// The caching allocator (Note [Caching allocator]) and stream-ordered frees (Note [Stream-ordered
// frees]) against a raw allocator that counts what it holds.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_stream.h"
#include "core/error.h"
#include "memory/arena.h"
#include "memory/caching_allocator.h"

namespace fp {

namespace {

// Raw memory that knows its blocks; refuses requests that would take it over refuse_over bytes.
class CountingAllocator final : public Allocator {
 public:
  void* allocate(uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu);
    if (refuse_over > 0 && live_bytes + bytes > refuse_over) return nullptr;
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    blocks.insert(p);
    live_bytes += bytes;
    ++calls;
    return p;
  }
  void deallocate(void* p, uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(blocks.erase(p), 1u) << "a block given back twice or never handed out";
    live_bytes -= bytes;
    std::free(p);
  }
  std::string_view name() const override { return "counting"; }
  std::mutex mu;
  std::set<void*> blocks;
  uint64_t live_bytes = 0;
  uint64_t refuse_over = 0;  // 0: never
  int calls = 0;
};

// A task that blocks its stream until open() is called.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool is_open = false;
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return is_open; });
  }
  void open() {
    {
      std::lock_guard<std::mutex> lock(mu);
      is_open = true;
    }
    cv.notify_all();
  }
};

}  // namespace

TEST(CachingAllocator, ReusesAFreedBlockOfTheSameRoundedSize) {
  CountingAllocator raw;
  {
    CachingAllocator cache(raw);
    void* a = cache.allocate(1000);
    void* b = cache.allocate(5000);
    EXPECT_EQ(raw.calls, 2);
    cache.deallocate(a, 1000);
    EXPECT_EQ(raw.blocks.count(a), 1u);        // kept, not given back
    EXPECT_EQ(cache.allocate(1020), a);        // 1000 and 1020 both round to 1024
    EXPECT_EQ(raw.calls, 2);
    void* c = cache.allocate(1000);            // the cached block is taken: a new one
    EXPECT_NE(c, a);
    EXPECT_EQ(raw.calls, 3);
    const CacheStats st = cache.stats();
    EXPECT_EQ(st.hits, 1u);
    EXPECT_EQ(st.misses, 3u);
    EXPECT_EQ(st.live_bytes, 1024u + 5056u + 1024u);
    cache.deallocate(a, 1000);
    cache.deallocate(b, 5000);
    cache.deallocate(c, 1000);
    EXPECT_EQ(cache.stats().live_bytes, 0u);
    EXPECT_EQ(raw.blocks.size(), 3u);
    cache.empty_cache();
    EXPECT_TRUE(raw.blocks.empty());
  }
  EXPECT_TRUE(raw.blocks.empty());
}

TEST(CachingAllocator, CachesAtMostTheLimit) {
  CountingAllocator raw;
  CachingAllocator cache(raw, /*limit=*/2048);
  void* a = cache.allocate(1024);
  void* b = cache.allocate(1024);
  void* c = cache.allocate(1024);
  cache.deallocate(a, 1024);
  cache.deallocate(b, 1024);
  cache.deallocate(c, 1024);  // past the limit: straight back
  EXPECT_EQ(cache.stats().cached_bytes, 2048u);
  EXPECT_EQ(raw.blocks.size(), 2u);
  EXPECT_EQ(raw.blocks.count(c), 0u);
}

TEST(CachingAllocator, DefaultLimitIsThePeakOfLiveBytes) {
  CountingAllocator raw;
  CachingAllocator cache(raw);
  void* a = cache.allocate(4096);  // peak live 4096
  cache.deallocate(a, 4096);
  void* small[3];
  for (void*& p : small) p = cache.allocate(2048);  // another size: peak live 6144
  for (void* p : small) cache.deallocate(p, 2048);
  const CacheStats st = cache.stats();
  EXPECT_EQ(st.peak_live_bytes, 6144u);
  EXPECT_LE(st.cached_bytes, st.peak_live_bytes);
  EXPECT_EQ(st.cached_bytes, 4096u + 2048u);  // the third 2048 block went back
  EXPECT_EQ(raw.live_bytes, st.cached_bytes);
}

TEST(CachingAllocator, ARefusedRequestEmptiesTheCacheAndRetries) {
  CountingAllocator raw;
  raw.refuse_over = 8192;
  CachingAllocator cache(raw);
  void* a = cache.allocate(4096);
  void* b = cache.allocate(4096);
  cache.deallocate(a, 4096);
  cache.deallocate(b, 4096);
  void* big = cache.allocate(8192);  // only fits once the two cached blocks are gone
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(cache.stats().cached_bytes, 0u);
  EXPECT_EQ(cache.allocate(64), nullptr);  // really full: null, as the raw allocator says
  cache.deallocate(big, 8192);
}

TEST(CachingAllocator, EnvironmentTurnsTheCacheOffOrIsRefused) {
  CountingAllocator raw;
  std::vector<std::unique_ptr<Allocator>> owned;
  ::unsetenv("FLATPEAK_NO_ALLOC_CACHE");
  EXPECT_NE(&allocator_cached(raw, owned), &raw);
  ::setenv("FLATPEAK_NO_ALLOC_CACHE", "0", 1);
  EXPECT_NE(&allocator_cached(raw, owned), &raw);
  ::setenv("FLATPEAK_NO_ALLOC_CACHE", "1", 1);
  EXPECT_EQ(&allocator_cached(raw, owned), &raw);
  ::setenv("FLATPEAK_NO_ALLOC_CACHE", "yes", 1);
  try {
    allocator_cached(raw, owned);
    ADD_FAILURE() << "FLATPEAK_NO_ALLOC_CACHE=yes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("FLATPEAK_NO_ALLOC_CACHE=yes"), std::string::npos) << e.what();
  }
  ::unsetenv("FLATPEAK_NO_ALLOC_CACHE");
  EXPECT_EQ(owned.size(), 2u);
}

// Note [Stream-ordered frees]: the ledger frees at once, the block waits for the copy stream.
TEST(StreamOrderedFree, BlockWaitsForTheStreamThatUsedIt) {
  CountingAllocator raw;
  Gate gate;
  {
    Arena arena("device", kUnlimitedBytes, raw);
    CpuStream copy("h2d", CpuStream::Mode::Mode_worker);
    Tensor t(arena, Category::Category_workspace, Shape({256}), DType::DType_F32, "staged");
    void* block = t.data();
    copy.enqueue([&] { gate.wait(); });  // the stream is still "using" t
    t.record_stream(copy);
    t.reset();
    EXPECT_EQ(arena.ledger().total_current(), 0u);  // the ledger: free now
    EXPECT_EQ(arena.pending_bytes(), 1024u);
    EXPECT_EQ(raw.blocks.count(block), 1u);          // the memory: not yet
    Tensor u(arena, Category::Category_workspace, Shape({8}), DType::DType_F32, "other");
    EXPECT_EQ(raw.blocks.count(block), 1u);          // an allocation collects only finished frees
    gate.open();
    copy.synchronize();
    Tensor v(arena, Category::Category_workspace, Shape({8}), DType::DType_F32, "next");
    // Collected at the next allocation (counted in bytes: the raw allocator may hand v the same address).
    EXPECT_EQ(raw.live_bytes, u.bytes() + v.bytes());
    EXPECT_EQ(arena.pending_bytes(), 0u);
    EXPECT_EQ(arena.pending_peak_bytes(), 1024u);
  }
  EXPECT_TRUE(raw.blocks.empty());
}

TEST(StreamOrderedFree, ArenaWaitsForPendingFreesWhenItGoes) {
  CountingAllocator raw;
  Gate gate;
  CpuStream copy("d2h", CpuStream::Mode::Mode_worker);
  {
    Arena arena("host", kUnlimitedBytes, raw);
    Tensor t(arena, Category::Category_optimizer, Shape({64}), DType::DType_F32, "moments");
    copy.enqueue([&] { gate.wait(); });
    t.record_stream(copy);
    t.record_stream(copy);  // twice on one stream: one use
    t.reset();
    EXPECT_EQ(raw.blocks.size(), 1u);
    gate.open();  // the arena's destructor waits for the stream's event
  }
  EXPECT_TRUE(raw.blocks.empty());
}

TEST(StreamOrderedFree, WithoutRecordedStreamsTheBlockGoesAtOnce) {
  CountingAllocator raw;
  Arena arena("device", kUnlimitedBytes, raw);
  Tensor t(arena, Category::Category_workspace, Shape({16}), DType::DType_F32, "t");
  t.reset();
  EXPECT_TRUE(raw.blocks.empty());
  EXPECT_EQ(arena.pending_bytes(), 0u);
}

}  // namespace fp
