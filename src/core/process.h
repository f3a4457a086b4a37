// What the operating system says of this process.
#pragma once

#include <cstdint>

namespace fp {

// The resident set size now (Linux: /proc/self/statm), in bytes; 0 where it cannot be read. A long run
// records it every step (metrics.jsonl host_rss_bytes) so that growth shows (scripts/soak).
uint64_t resident_bytes();

// The bytes malloc holds in use now (glibc's mallinfo2: allocated and not freed), 0 where unknown. Unlike the
// resident set it does not move when the allocator trims or keeps freed pages, so a leak on the heap shows
// as growth here within a few hundred steps (metrics.jsonl host_heap_bytes).
uint64_t heap_in_use_bytes();

}  // namespace fp
