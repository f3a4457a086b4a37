#include "core/process.h"

#include <malloc.h>
#include <unistd.h>

#include <cstdio>

namespace fp {

uint64_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long long size = 0, resident = 0;
  const int got = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  const long page = sysconf(_SC_PAGESIZE);
  return got == 2 && page > 0 ? static_cast<uint64_t>(resident) * static_cast<uint64_t>(page) : 0;
}

uint64_t heap_in_use_bytes() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 m = mallinfo2();
  return static_cast<uint64_t>(m.uordblks) + static_cast<uint64_t>(m.hblkhd);
#else
  return 0;
#endif
}

}  // namespace fp
