// CRC32C (Castagnoli, the polynomial of iSCSI, ext4 and Snappy), the checksum of every checkpoint file
// (Note [Checkpoint checksums] in train/checkpoint.h).
//
// Note [CRC32C]: a checksum only has to catch damage (a torn copy, a bad sector, a file truncated or
// overwritten), not an adversary, so a CRC does, and CRC32C is the one x86 computes in hardware (SSE4.2's
// crc32 instruction, 8 bytes every 3 cycles in one dependent chain: 4.5 GB/s measured on this 2-core
// machine under load, faster than a disk reads). Where the CPU lacks it (or off x86) a table of 8 x 256
// entries takes 8 bytes a step ("slicing by 8": 1.1 GB/s there); both give the same value, checked against
// the standard's check values (crc32c("123456789") = 0xE3069283, RFC 3720's) and against each other on
// every length and alignment in tests/unit/test_crc32c.cpp. No library is linked for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fp {

// Extends crc (0 for a new checksum) over data[0, n).
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }

// The portable table version alone (the tests compare it with the hardware one).
uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n);
// Whether crc32c_extend uses the CPU's crc32 instruction.
bool crc32c_hardware();

// A whole file's CRC32C and size, read in 1 MiB blocks; throws fp::Error naming the path when it cannot
// be read.
struct FileChecksum {
  uint32_t crc32c = 0;
  uint64_t bytes = 0;
};
FileChecksum file_crc32c(const std::string& path);

}  // namespace fp
