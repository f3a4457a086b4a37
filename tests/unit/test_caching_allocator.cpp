// The caching allocator (Note [Caching allocator]) and stream-ordered frees (Note [Stream-ordered
// frees]) against a raw allocator that counts what it holds.
#include <gtest/gtest.h>

#include <condition_variable>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/host_stream.h"
#include "core/error.h"
#include "core/process.h"
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

TEST(CachingAllocator, CachesAtMostTheLimitGivingBackTheOldestFirst) {
  CountingAllocator raw;
  CachingAllocator cache(raw, /*limit=*/2048);
  void* a = cache.allocate(1024);
  void* b = cache.allocate(1024);
  void* c = cache.allocate(1024);
  cache.deallocate(a, 1024);
  cache.deallocate(b, 1024);
  cache.deallocate(c, 1024);  // past the limit: a, freed longest ago, makes room
  EXPECT_EQ(cache.stats().cached_bytes, 2048u);
  EXPECT_EQ(cache.stats().evicted, 1u);
  EXPECT_EQ(raw.blocks.size(), 2u);
  EXPECT_EQ(raw.blocks.count(a), 0u);
  EXPECT_EQ(cache.allocate(1024), c);  // a class's newest block first
  void* big = cache.allocate(4096);
  cache.deallocate(big, 4096);  // larger than the limit itself: straight back, the cache untouched
  EXPECT_EQ(raw.blocks.count(big), 0u);
  EXPECT_EQ(cache.stats().cached_bytes, 1024u);
  cache.deallocate(c, 1024);
}

TEST(CachingAllocator, AStaleSizeMakesRoomForTheSizesInUse) {
  // A step that once asked for 3000-byte blocks and now asks for 2000-byte ones: the old blocks leave
  // the cache as the new ones come back, so the new size hits from then on.
  CountingAllocator raw;
  CachingAllocator cache(raw, /*limit=*/6144);
  std::vector<void*> old;
  for (int i = 0; i < 2; ++i) old.push_back(cache.allocate(3000));
  for (void* p : old) cache.deallocate(p, 3000);  // 2 x 3008 cached
  for (int round = 0; round < 3; ++round) {
    std::vector<void*> now;
    for (int i = 0; i < 3; ++i) now.push_back(cache.allocate(2000));
    for (void* p : now) cache.deallocate(p, 2000);
  }
  const CacheStats st = cache.stats();
  EXPECT_EQ(st.misses, 2u + 3u);  // the 3000s once, the 2000s in the first round only
  EXPECT_EQ(st.hits, 6u);
  EXPECT_EQ(st.evicted, 2u);
  EXPECT_EQ(st.cached_bytes, 3u * 2048u);
  for (void* p : old) EXPECT_EQ(raw.blocks.count(p), 0u);
}

TEST(CachingAllocator, SizeClassesFromSixtyFourKiB) {
  EXPECT_EQ(block_size_class(1), 64u);
  EXPECT_EQ(block_size_class(65535), 65536u);  // below 64 KiB: 64-byte multiples
  EXPECT_EQ(block_size_class(65536), 65536u);
  EXPECT_EQ(block_size_class(65537), 65536u + 8192u);  // eighths of 64 KiB
  EXPECT_EQ(block_size_class(102400), 106496u);
  EXPECT_EQ(block_size_class((1u << 20) + 1), (1u << 20) + (1u << 17));
  for (uint64_t b = 1; b < (uint64_t{1} << 30); b = b * 3 / 2 + 7) {
    const uint64_t c = block_size_class(b);
    EXPECT_GE(c, b);
    EXPECT_LE(c, std::max<uint64_t>(b + 63, b + b / 8 + 64)) << b;
    EXPECT_EQ(block_size_class(c), c) << b;  // a class is its own class
  }
  // Two requests of one class share a block: a dispatch buffer a little larger this step than the last.
  CountingAllocator raw;
  CachingAllocator cache(raw);
  void* a = cache.allocate(1000000);
  cache.deallocate(a, 1000000);
  EXPECT_EQ(cache.allocate(1040000), a);  // both in the class of 1 MiB
  EXPECT_EQ(raw.calls, 1);
  cache.deallocate(a, 1040000);
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
  EXPECT_EQ(st.cached_bytes, 3u * 2048u);  // the second 2048 block made room by giving back the 4096 one
  EXPECT_EQ(raw.blocks.count(a), 0u);
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
TEST(HostAllocator, ALargeBlockFreedLeavesTheResidentSet) {
  // Note [Large host blocks are mapped]: glibc's own threshold would have risen past 8 MiB after the
  // 16 MiB block below, and the 8 MiB block's pages would then stay resident once freed.
  Allocator& host = allocator_host_aligned();
  const uint64_t big = uint64_t{16} << 20, block = uint64_t{8} << 20;
  void* warm = host.allocate(big);
  ASSERT_NE(warm, nullptr);
  std::memset(warm, 1, big);
  host.deallocate(warm, big);
  const uint64_t before = resident_bytes();
  if (before == 0) GTEST_SKIP() << "no resident set to read here";
  void* p = host.allocate(block);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  std::memset(p, 1, block);
  EXPECT_GE(resident_bytes(), before + block * 3 / 4);
  host.deallocate(p, block);
  EXPECT_LE(resident_bytes(), before + block / 4) << "the freed block's pages are still resident";
  void* q = host.allocate(1000);  // small blocks: malloc's
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(q) % 64, 0u);
  host.deallocate(q, 1000);
}

TEST(StreamOrderedFree, BlockWaitsForTheStreamThatUsedIt) {
  CountingAllocator raw;
  Gate gate;
  {
    Arena arena("device", kUnlimitedBytes, raw);
    HostStream copy("h2d", HostStream::Mode::Mode_worker);
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
  HostStream copy("d2h", HostStream::Mode::Mode_worker);
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
